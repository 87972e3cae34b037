"""What each released bootc has, as read from its source at the release tag (file:line per
feature below; docs/bootc-releases.md tells what each one means for the agent).

The sources are https://github.com/bootc-dev/bootc at the tag named (v1.6.0, v1.7.0, v1.12.0,
v1.15.0, v1.16.9), where `cli.rs` is crates/lib/src/cli.rs, `spec.rs` crates/lib/src/spec.rs,
`status.rs` crates/lib/src/status.rs and `ext-cli.rs` crates/ostree-ext/src/cli.rs; v1.16.10's
two flags come from its release notes (https://github.com/bootc-dev/bootc/releases/tag/v1.16.10,
pull request #2342).

Pure data and standard library only: the test stand-ins of bootc (`standins/bin/bootc`, the
system tier's and the ostree tier's guest bootc) load this file by path to speak a release
("persona"), and the simulated host reads it through `features_of`. The agent itself never
decides anything from a version number: it probes `--help` (agent/model/bootc_caps.py)."""

from __future__ import annotations

# feature -> (first release that has it, where its source says so)
FEATURES: dict[str, tuple[str, str]] = {
    "switch-sigpolicy": ("1.6.0", "switch --enforce-container-sigpolicy: cli.rs v1.6.0:116"),
    "internals-image-pull": (
        "1.6.0",
        "hidden `internals ostree-container image pull`: cli.rs v1.6.0:467, ext-cli.rs:231-257",
    ),
    "soft-reboot": ("1.7.0", "--soft-reboot=required|auto on upgrade/switch/rollback (v1.7.0)"),
    "status-soft-reboot-capable": ("1.7.0", "status softRebootCapable (v1.7.0; status.rs:95)"),
    "reboot-required-file": ("1.9.0", "/run/reboot-required written by every stage (v1.9.0)"),
    "upgrade-download-only": ("1.12.0", "upgrade --download-only: cli.rs v1.12.0:109"),
    "upgrade-from-downloaded": ("1.12.0", "upgrade --from-downloaded: cli.rs v1.12.0:117"),
    "status-download-only": ("1.12.0", "status downloadOnly: spec.rs v1.12.0:252"),
    "podman-for-stage-pull": (
        "1.12.0",
        "podman before the pull of upgrade/switch: cli.rs v1.12.0:1030",
    ),
    "upgrade-tag": ("1.15.0", "upgrade --tag: cli.rs v1.15.0:131, spec.rs:160"),
    "podman-for-check": ("1.15.1", "podman for upgrade --check: cli.rs v1.16.9:1264"),
    "switch-download-only": ("1.16.10", "switch --download-only: PR #2342, release v1.16.10"),
    "switch-from-downloaded": ("1.16.10", "switch --from-downloaded: PR #2342, release v1.16.10"),
}

# The releases the stand-ins speak; the newest is the default persona. 1.11.0 speaks for 1.7 to
# 1.11: `--soft-reboot` without `upgrade --from-downloaded`, so no soft reboot at the turn.
PERSONAS: tuple[str, ...] = ("1.6.0", "1.11.0", "1.12.0", "1.15.0", "1.16.9", "1.16.10")
DEFAULT_PERSONA = PERSONAS[-1]


def version_key(version: str) -> tuple[int, ...]:
    """`1.16.10` -> (1, 16, 10); ValueError for anything that is not dotted numbers."""
    parts = version.strip().split(".")
    if not parts or not all(part.isdigit() for part in parts):
        raise ValueError(f"not a bootc release version: {version!r}")
    return tuple(int(part) for part in parts)


def features_of(version: str) -> frozenset[str]:
    """The features of release `version` (every release from 1.6.0 on)."""
    key = version_key(version)
    if key < version_key(PERSONAS[0]):
        raise ValueError(f"bootc {version} is older than {PERSONAS[0]}, the oldest supported")
    return frozenset(name for name, (since, _) in FEATURES.items() if key >= version_key(since))
