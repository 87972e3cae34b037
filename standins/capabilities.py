"""What a bootc release's `--help` lists, as the agent's `Capabilities`: the simulated host and
the stand-in personas speak a release from the release table (bootc_releases.py); the agent
itself always probes `--help` (agent/model/bootc_caps.py)."""

from __future__ import annotations

from agent.model.bootc_caps import LISTED, Capabilities
from standins.bootc_releases import features_of

# The release-table feature behind each capability a `--help` lists.
FEATURE_OF: dict[str, str] = {
    "switch_download_only": "switch-download-only",
    "upgrade_download_only": "upgrade-download-only",
    "switch_from_downloaded": "switch-from-downloaded",
    "upgrade_from_downloaded": "upgrade-from-downloaded",
    "upgrade_tag": "upgrade-tag",
    "soft_reboot": "soft-reboot",
    "sigpolicy": "switch-sigpolicy",
}
assert FEATURE_OF.keys() == LISTED.keys()


def release_capabilities(version: str) -> Capabilities:
    """What the `--help` of release `version` lists, from the release table (the simulated host
    speaks it; the agent itself always probes). The hidden `--progress-fd` is in every release
    (cli.rs v1.6.0:45), and every bootc >= 1.6 needs an ostree (>= 2025.2) that has
    `admin lock-finalization` (>= 2023.8). ValueError for a version outside the table."""
    has = features_of(version)
    return Capabilities(
        **{name: FEATURE_OF[name] in has for name in LISTED},
        image_pull="internals-image-pull" in has,
        lock_finalization=True,
        progress_fd=True,
        version=version,
    )
