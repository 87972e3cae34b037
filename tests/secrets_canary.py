"""Canary secrets, defined once for every tier that checks that no secret's contents ever show in
a log, an Event or a reason: the cluster scenarios (tests/scenarios/harness.py)
and the system tier (tests/system/secrets.py) put these into every desired state, collect
everything the agent emitted, and scan it here.

The secrets:
- registry credentials: user `puller`, a password holding REGISTRY_PASSWORD_MARKER (the system
  tier's auth registry really uses it, so pulls with the pull secret still work);
- a pull secret (`/var/lib/kubelet/config.json`, mirrored by the agent to
  `/run/ostree/auth.json`) whose `auth` token is base64("puller:<password>");
- core's password hash, a `$6$` crypt string whose salt is PASSWORD_HASH_MARKER.

What counts as shown (`needles()`): the markers (any case), the raw password, the auth token
(with or without its `=` padding), the whole hash; and the base64 forms of the markers and of
the auth token at each of the three byte alignments (standard and URL-safe alphabet), so a
secret is caught inside any base64 blob too: the data URL of the pull secret, a
base64-encoded config, a double-encoded token.

Files that must hold a secret (the pull secret files, /etc/shadow, the desired state the
harness wrote, the agent's own records of its input: `current-config` and `pending-config` in
its state dir, as the MCD keeps the rendered config on disk) are never scanned; what the agent
emits is: logs, Node annotations (reasons), Events, MachineConfigNode status, `/status`,
`/metrics`, `journal.json` and `status.json`."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

REGISTRY_USER = "puller"
REGISTRY_PASSWORD_MARKER = "CanaryRegPw4Xq"
REGISTRY_PASSWORD = f"s3cret-{REGISTRY_PASSWORD_MARKER}"
PASSWORD_HASH_MARKER = "CanaryHash9Zt"
PASSWORD_HASH = (
    f"$6${PASSWORD_HASH_MARKER}$"
    "k1MePVtgFwQEC4ecDh1PhCR0JuAkhWsoJNJuP0T9/wIQY5vP74Dhq1JFHoJRcNG6Q7AgoW7TSv7y5POSMvtlDg"
)
AUTH_TOKEN = base64.b64encode(f"{REGISTRY_USER}:{REGISTRY_PASSWORD}".encode()).decode()
PULL_SECRET_PATH = "/var/lib/kubelet/config.json"
# The registry of the cluster tier's simulated images (`IMAGE` in standins/demo/loopback.py).
CLUSTER_REGISTRY = "quay.example"
# The agent's records of its input in its state dir (agent/update/configstore.py): the
# MachineConfig documents verbatim, so they hold the secrets on purpose (mode 0600).
INPUT_RECORDS = frozenset({"current-config", "pending-config"})


def pull_secret(*registries: str) -> str:
    """A pull secret (containers-auth.json shape) with the canary credentials for each
    registry (default: the cluster tier's)."""
    auths = {r: {"auth": AUTH_TOKEN, "email": "puller@example.com"}
             for r in registries or (CLUSTER_REGISTRY,)}  # fmt: skip
    return json.dumps({"auths": auths})


def pull_secret_file(*registries: str) -> dict[str, Any]:
    """The pull secret as the MCO renders it: an Ignition file with a base64 data URL."""
    source = "data:;base64," + base64.b64encode(pull_secret(*registries).encode()).decode()
    return {"path": PULL_SECRET_PATH, "mode": 0o600, "overwrite": True,
            "contents": {"source": source}}  # fmt: skip


def with_canary_secrets(doc: dict[str, Any], *registries: str) -> dict[str, Any]:
    """A copy of MachineConfig `doc` carrying the canaries: the pull secret file (unless the
    document has its own at that path) and core's password hash wherever the document manages
    users (a document without `passwd.users` leaves them alone, as the MCD, so it stays so)."""
    doc = copy.deepcopy(doc)
    config = doc.setdefault("spec", {}).setdefault("config", {})
    files = config.setdefault("storage", {}).setdefault("files", [])
    if not any(f.get("path") == PULL_SECRET_PATH for f in files):
        files.append(pull_secret_file(*registries))
    users = (config.get("passwd") or {}).get("users")
    if users is not None:
        core = next((u for u in users if u.get("name") == "core"), None)
        if core is None:
            users.append({"name": "core", "passwordHash": PASSWORD_HASH})
        else:
            core.setdefault("passwordHash", PASSWORD_HASH)
    return doc


def is_input_record(name: str) -> bool:
    """`current-config`, `pending-config` and their temp files (`.current-config.tmp`)."""
    return name.removeprefix(".").removesuffix(".tmp") in INPUT_RECORDS


# ---- what counts as shown ----------------------------------------------------------------------


@dataclass(frozen=True)
class Needle:
    name: str
    text: str
    fold_case: bool = False


def base64_forms(text: str) -> set[str]:
    """The substrings every base64 encoding of a blob containing `text` contains: one per
    alignment of `text` to 3-byte groups, without the characters that depend on neighbours;
    each in the standard and the URL-safe alphabet."""
    raw = text.encode()
    forms = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start = -(-offset * 8 // 6)  # the first character made of `text`'s bits only
        end = (offset + len(raw)) * 8 // 6
        core = encoded[start:end]
        forms |= {core, core.translate(str.maketrans("+/", "-_"))}
    return forms


def needles() -> tuple[Needle, ...]:
    raw = (
        Needle("registry password marker", REGISTRY_PASSWORD_MARKER, fold_case=True),
        Needle("password hash marker", PASSWORD_HASH_MARKER, fold_case=True),
        Needle("registry password", REGISTRY_PASSWORD, fold_case=True),
        Needle("pull secret auth token", AUTH_TOKEN.rstrip("=")),
        Needle("password hash", PASSWORD_HASH),
    )
    encoded = (
        ("registry password marker", REGISTRY_PASSWORD_MARKER),
        ("password hash marker", PASSWORD_HASH_MARKER),
        ("pull secret auth token", AUTH_TOKEN.rstrip("=")),
    )
    forms = tuple(
        Needle(f"base64 of the {what}", form)
        for what, text in encoded
        for form in sorted(base64_forms(text))
    )
    return raw + forms


NEEDLES = needles()


@dataclass(frozen=True)
class Finding:
    where: str
    what: str  # the needle's name
    context: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what} in …{self.context}…"


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def find(where: str, value: str | bytes) -> list[Finding]:
    """Every canary in `value` (one finding per needle: the first place it occurs)."""
    text = _text(value)
    lowered = text.lower()
    found = []
    for needle in NEEDLES:
        at = lowered.find(needle.text.lower()) if needle.fold_case else text.find(needle.text)
        if at >= 0:
            context = text[max(0, at - 60) : at + len(needle.text) + 60]
            found.append(Finding(where, needle.name, repr(context)[1:-1]))
    return found


Sources = Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]  # where -> what


def scan(sources: Sources) -> list[Finding]:
    """Findings in every (where, text) pair."""
    items = sources.items() if isinstance(sources, Mapping) else sources
    return [finding for where, value in items for finding in find(where, value)]


def report(findings: Iterable[Finding]) -> str:
    """Every place, then each (place, form) once with its first context and its count."""
    first: dict[tuple[str, str], Finding] = {}
    counts: dict[tuple[str, str], int] = {}
    for f in findings:
        first.setdefault((f.where, f.what), f)
        counts[f.where, f.what] = counts.get((f.where, f.what), 0) + 1
    places = sorted({where for where, _ in first})
    lines = [f"a canary secret was shown in {len(places)} place(s): {', '.join(places)}"]
    for key, f in first.items():
        more = f" (and {counts[key] - 1} more)" if counts[key] > 1 else ""
        lines.append(f"  - {f}{more}")
    return "\n".join(lines)


def assert_no_canaries(sources: Sources) -> None:
    """Fail, naming every place and form, when any source shows a canary secret."""
    findings = scan(sources)
    if findings:
        raise AssertionError(report(findings))
