"""What the host's bootc can do, read from its `--help` (never from its version number), and
what that means for the agent: which pre-stage path, which tag check, whether a soft reboot.

What each release has, with bootc's source cited, is in docs/bootc-releases.md; the paths,
best first:
- `switch --download-only` (bootc >= 1.16.10): the image is staged locked, so an ordinary reboot
  discards it instead of booting it; the turn only unlocks it (`upgrade --from-downloaded`).
- pre-pull (every bootc from 1.6): the image `NAME@DIGEST` is pulled into the booted sysroot's
  ostree repository with the hidden `bootc internals ostree-container image pull`, and nothing
  is staged, so no reboot of any kind can boot it. At the turn, `bootc switch NAME@DIGEST`
  finds that exact ref in the repository and contacts no registry (docs/bootc-releases.md §7).
  Any staging prunes undeployed images (docs/bootc-releases.md §8), so a pre-pull is checked
  again and re-pulled after one."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

# Where the pre-pull writes: the booted sysroot's repository, which bootc stages from.
SYSROOT = "/sysroot"
REPO = f"{SYSROOT}/ostree/repo"
# The pull path calls neither bootc's nor libostree's remount, and /sysroot is read-only on a
# bootc host: remount it read-write in a private mount namespace only (docs/bootc-releases.md §6).
_REMOUNT = f'mount -o remount,rw {SYSROOT} && exec "$@"'

_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)*)\b")


@dataclass(frozen=True)
class Capabilities:
    """Each field is one thing the installed bootc (or its ostree) accepts."""

    switch_download_only: bool = False  # `switch --download-only` (>= 1.16.10)
    upgrade_download_only: bool = False  # `upgrade --download-only` (>= 1.12)
    switch_from_downloaded: bool = False  # `switch --from-downloaded` (>= 1.16.10)
    upgrade_from_downloaded: bool = False  # `upgrade --from-downloaded` (>= 1.12)
    upgrade_tag: bool = False  # `upgrade --tag` (>= 1.15): check another tag of the spec
    soft_reboot: bool = False  # `--soft-reboot=auto` on upgrade (>= 1.7)
    sigpolicy: bool = False  # `switch --enforce-container-sigpolicy`
    image_pull: bool = False  # hidden `internals ostree-container image pull` (>= 1.6)
    lock_finalization: bool = False  # `ostree admin lock-finalization` (ostree >= 2023.8)
    progress_fd: bool = False  # hidden `switch --progress-fd`
    version: str = ""  # what `bootc --version` printed: for people, never for decisions

    def named(self) -> dict[str, bool]:
        """Every capability by its metric and /status name (`switch-download-only`, ...)."""
        return {
            f.name.replace("_", "-"): getattr(self, f.name)
            for f in fields(self)
            if f.name != "version"
        }

    @property
    def locked_staging(self) -> bool:
        """A stage an ordinary reboot discards, and an unlock at the turn."""
        return self.switch_download_only and self.upgrade_from_downloaded

    @property
    def soft_reboot_at_turn(self) -> bool:
        """bootc prepares a soft reboot of the staged deployment at the turn with `upgrade
        --from-downloaded --soft-reboot auto` (>= 1.12); never while pre-staging
        (docs/bootc-releases.md §10: a prepared nextroot of a locked deployment would run at the
        next ordinary reboot)."""
        return self.soft_reboot and self.upgrade_from_downloaded

    @property
    def who(self) -> str:
        return f"bootc {self.version}" if self.version else "this bootc"

    def summary(self) -> str:
        """One line for the startup log: what this bootc has and lacks."""
        named = self.named()
        has = " ".join(name for name, ok in named.items() if ok) or "none"
        lacks = " ".join(name for name, ok in named.items() if not ok) or "none"
        return f"{self.who}: has {has}; lacks {lacks}"


def parse_version(text: str) -> str:
    """`bootc 1.16.9` (what `bootc --version` prints) -> `1.16.9`; "" when none is there."""
    match = _VERSION.search(text)
    return match.group(1) if match else ""


# Each capability that a `--help` lists: the verb and its flag.
LISTED: dict[str, tuple[str, str]] = {
    "switch_download_only": ("switch", "--download-only"),
    "upgrade_download_only": ("upgrade", "--download-only"),
    "switch_from_downloaded": ("switch", "--from-downloaded"),
    "upgrade_from_downloaded": ("upgrade", "--from-downloaded"),
    "upgrade_tag": ("upgrade", "--tag"),
    "soft_reboot": ("upgrade", "--soft-reboot"),
    "sigpolicy": ("switch", "--enforce-container-sigpolicy"),
}


def from_help(
    switch_help: str,
    upgrade_help: str,
    *,
    progress_fd: bool,
    image_pull: bool,
    lock_finalization: bool,
    version: str = "",
) -> Capabilities:
    """Capabilities from the flags `bootc switch --help` and `bootc upgrade --help` list (hidden
    flags are probed separately: `progress_fd`, `image_pull`)."""
    flags = {"switch": set(_FLAG.findall(switch_help)), "upgrade": set(_FLAG.findall(upgrade_help))}
    return Capabilities(
        **{name: flag in flags[verb] for name, (verb, flag) in LISTED.items()},
        image_pull=image_pull,
        lock_finalization=lock_finalization,
        progress_fd=progress_fd or "--progress-fd" in flags["switch"],
        version=version,
    )


@dataclass(frozen=True)
class PrestagePath:
    kind: str  # "download-only" | "pre-pull" | "none"
    note: str = ""  # why not the best path: named in the reason it causes


def prestage_path(caps: Capabilities) -> PrestagePath:
    """The best way this bootc can take an image's pull out of the node's turn."""
    if caps.locked_staging:
        return PrestagePath("download-only")
    lacking = (
        "switch --download-only"
        if caps.upgrade_from_downloaded
        else ("switch --download-only or upgrade --from-downloaded")
    )
    if caps.image_pull:
        return PrestagePath(
            "pre-pull",
            f"pre-staging unavailable: {caps.who} has no {lacking}; pulling into the "
            "repository instead",
        )
    return PrestagePath(
        "none",
        f"pre-staging unavailable: {caps.who} has no {lacking} and no "
        "`internals ostree-container image pull`; the image is pulled at this node's turn",
    )


def pull_imgref(ref: str, *, signed: bool) -> str:
    """The ostree-ext image reference a pre-pull uses. `ref` must be the exact `NAME@DIGEST` the
    turn's `bootc switch` stages: the repository keys images by that string
    (docs/bootc-releases.md §7). Signed when the stage enforces a policy: a switch that finds the
    image present verifies nothing (the policy is enforced only while fetching)."""
    return f"ostree-image-signed:docker://{ref}" if signed else f"ostree-unverified-registry:{ref}"


def pull_argv(bootc: str, ref: str, *, signed: bool) -> list[str]:
    """The pre-pull command (docs/bootc-releases.md §6): a private mount namespace, /sysroot
    read-write in it only, then the hidden ostree-ext pull into the sysroot's repository."""
    return [
        "unshare", "-m", "--", "sh", "-c", _REMOUNT, "image-mode-agent-pull",
        bootc, "internals", "ostree-container", "image", "pull", "--quiet", REPO,
        pull_imgref(ref, signed=signed),
    ]  # fmt: skip


LIST_ARGS = ("internals", "ostree-container", "image", "list", "--repo", REPO)
PULL_PROBE_ARGS = ("internals", "ostree-container", "image", "pull", "--help")


def listed(output: str, ref: str) -> bool:
    """Whether `image list` output names `ref` (`NAME@DIGEST`) as a stored image, under any
    transport prefix (`docker://`, `ostree-unverified-registry:`, ...)."""
    for line in output.splitlines():
        entry = line.strip()
        if entry == ref or entry.endswith(f"docker://{ref}") or entry.endswith(f":{ref}"):
            return True
    return False
