"""On-disk validation (pure): what the host must hold for its current config, and what differs.

The checks and their wording follow the MCD's (docs/mco-protocol.md §10, MCO
`pkg/daemon/on_disk_validation.go`), for what this agent owns on the host:
- every file the live part of the config writes (SSH keys of `core`, the pull secret and its
  bootc copy, the user CA bundle, NodeDisruptionPolicy paths): type and mode exactly, contents
  byte for byte, and owner (the MCD does not look at owners; this agent writes them);
- every unit the config enables, disables or masks, as systemd reports its unit file;
- the booted image against the recorded one, by digest;
- the image's own files under /etc (`ostree admin config-diff`, model/etc_drift.py): reported,
  never rewritten, since only a new image owns them.
The MCD's exceptions stand: the certificate writer's files are not validated (it rewrites them
from the ControllerConfig), nor is the password hash. No file content reaches a finding."""

from __future__ import annotations

import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent.core.plan import live_changes
from agent.core.policy import CLOUD_CA, INTERNAL_PULL_SECRET, KUBELET_CA, LivePolicy
from agent.model.etc_drift import DEFAULT_ETC_IGNORE, EtcChange, describe, image_drift
from agent.model.ignition import Owner
from agent.model.machineconfig import MachineConfig, empty_machine_config

# Written by the certificate writer, not by the config: the MCD skips them too
# (on_disk_validation.go getFilesToIgnore).
CERT_WRITER_FILES = frozenset({KUBELET_CA, CLOUD_CA, INTERNAL_PULL_SECRET})
# systemctl is-enabled answers that the MCD's checkUnitEnabled refuses, by expectation.
_NOT_ENABLED = frozenset({"disabled", "masked", "masked-runtime", "not-found"})
_ENABLED = frozenset({"enabled", "enabled-runtime"})
_MASKED = frozenset({"masked", "masked-runtime"})
_SHOWN_FINDINGS = 3
DRIFT_REASON_PREFIX = "unexpected on-disk state validating against "


@dataclass(frozen=True)
class ExpectedFile:
    path: str
    contents: bytes = field(repr=False)
    mode: int
    user: Owner
    group: Owner


@dataclass(frozen=True)
class ExpectedUnit:
    name: str
    enabled: bool | None
    masked: bool


@dataclass(frozen=True)
class Expectations:
    config_name: str
    files: tuple[ExpectedFile, ...]
    units: tuple[ExpectedUnit, ...]
    image_digest: str | None  # None: no image recorded, nothing to compare
    image: str | None = None  # the recorded reference, as findings name it

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(f.path for f in self.files)


@dataclass(frozen=True)
class FileFacts:
    """A path as lstat sees it (the owner as numeric ids), and a regular file's bytes."""

    st_mode: int
    uid: int
    gid: int
    contents: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class HostFacts:
    files: Mapping[str, FileFacts | None]
    file_errors: Mapping[str, str]  # path -> why it could not be inspected
    owners: Mapping[str, tuple[int, int] | None]  # path -> expected (uid, gid); None: unchecked
    units: Mapping[str, str]  # unit -> unit file state (`systemctl is-enabled`'s words)
    booted_digest: str | None
    booted_image: str | None
    etc_changes: tuple[EtcChange, ...] | None  # None: no ostree to ask (not an image host)


@dataclass(frozen=True)
class Finding:
    kind: str  # "file" | "unit" | "image" | "etc"
    path: str  # the file, the unit, or the image
    text: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "text": self.text}


def expectations(
    config: MachineConfig, policy: LivePolicy, image: str | None, image_digest: str | None
) -> Expectations:
    """What the host must hold while it runs `config` (booted into `image`)."""
    files = tuple(
        ExpectedFile(step.path, step.contents, step.mode, step.user, step.group)
        for step in live_changes(empty_machine_config(), config, policy)
        if step.action == "write"
        and step.kind != "password"
        and step.path not in CERT_WRITER_FILES
        and not step.path.startswith("/run/")  # a tmpfs: gone at every boot, by design
    )
    units = tuple(
        ExpectedUnit(unit.name, unit.enabled, bool(unit.mask))
        for unit in config.ignition.units.values()
        if unit.enabled is not None or unit.mask
    )
    return Expectations(config.name, files, units, image_digest, image)


def _mode_text(st_mode: int) -> str:
    # Go's %v/%d/%#o of an os.FileMode, for the regular files it compares
    perm = stat.S_IMODE(st_mode)
    return f"{stat.filemode(st_mode)}/{perm}/{perm:#o}".replace("0o", "0")


def _file_findings(expected: ExpectedFile, facts: FileFacts | None,
                   owner: tuple[int, int] | None) -> list[Finding]:  # fmt: skip
    path = expected.path
    if facts is None:
        text = f'could not stat file "{path}": lstat {path}: no such file or directory'
        return [Finding("file", path, text)]
    wanted = stat.S_IFREG | expected.mode
    if facts.st_mode != wanted:
        text = (f'mode mismatch for file: "{path}"; expected: {_mode_text(wanted)}; '
                f"received: {_mode_text(facts.st_mode)}")  # fmt: skip
        return [Finding("file", path, text)]
    found = []
    if facts.contents != expected.contents:
        found.append(Finding("file", path, f'content mismatch for file "{path}"'))
    if owner is not None and (facts.uid, facts.gid) != owner:
        text = (f'owner mismatch for file "{path}"; expected: {owner[0]}:{owner[1]}; '
                f"received: {facts.uid}:{facts.gid}")  # fmt: skip
        found.append(Finding("file", path, text))
    return found


def _unit_finding(unit: ExpectedUnit, state: str) -> Finding | None:
    if unit.masked:
        if state in _MASKED:
            return None
        path = f"/etc/systemd/system/{unit.name}"
        return Finding("unit", unit.name, "state validation: invalid unit masked setting. "
                       f'path: "{path}"; expected: /dev/null; received: {state}')  # fmt: skip
    wrong = (unit.enabled is True and state in _NOT_ENABLED) or (
        unit.enabled is False and state in _ENABLED
    )
    if not wrong:
        return None
    expected = "true" if unit.enabled else "false"
    text = f'unit "{unit.name}" expected enabled={expected}, but systemd reports "{state}"'
    return Finding("unit", unit.name, text)


def findings(
    expected: Expectations, facts: HostFacts, etc_ignore: Iterable[str] = DEFAULT_ETC_IGNORE
) -> tuple[Finding, ...]:
    """Everything on the host that differs from `expected`, in a stable order: the image,
    then files, units and the image's /etc files."""
    found: list[Finding] = []
    if expected.image_digest is not None and facts.booted_digest != expected.image_digest:
        want = expected.image or expected.image_digest
        text = f'expected target osImageURL "{want}", have "{facts.booted_image or "unknown"}"'
        found.append(Finding("image", want, text))
    for file in expected.files:
        if file.path in facts.file_errors:
            text = f'could not stat file "{file.path}": {facts.file_errors[file.path]}'
            found.append(Finding("file", file.path, text))
            continue
        found.extend(_file_findings(file, facts.files.get(file.path), facts.owners.get(file.path)))
    for unit in expected.units:
        finding = _unit_finding(unit, facts.units.get(unit.name, "not-found"))
        if finding is not None:
            found.append(finding)
    if facts.etc_changes is not None:
        skipped = expected.paths | CERT_WRITER_FILES
        for change in image_drift(facts.etc_changes, etc_ignore, also_ignored=skipped):
            found.append(Finding("etc", change.path, describe(change)))
    return tuple(found)


def drift_reason(config_name: str, found: Iterable[Finding]) -> str:
    """The Node's reason for `found`, worded as the MCD's ("unexpected on-disk state
    validating against <config>: ..."), the first few findings and how many more."""
    items = list(found)
    shown = "; ".join(f.text for f in items[:_SHOWN_FINDINGS])
    more = len(items) - _SHOWN_FINDINGS
    tail = f" (and {more} more)" if more > 0 else ""
    return f"{DRIFT_REASON_PREFIX}{config_name}: {shown}{tail}"
