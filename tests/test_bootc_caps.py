"""The capabilities model (pure): what `--help` says, which pre-stage path it gives, the
pre-pull command, and how the agent shows them (startup line, /status, metric)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.app.runtime import announce_bootc
from agent.core.policy import Allowlist
from agent.errors import HostError
from agent.model.bootc_caps import (
    REPO,
    Capabilities,
    from_help,
    listed,
    parse_version,
    prestage_path,
    pull_argv,
    pull_imgref,
)
from agent.observe.http import StatusBoard
from standins.bootc_releases import FEATURES, PERSONAS, features_of, version_key
from standins.host.simulated import SimulatedHost

REF = "quay.io/example/os@sha256:" + "d" * 64
SWITCH_1169 = """Target a new container image reference to boot

Usage: bootc switch [OPTIONS] <TARGET>

Options:
      --quiet                     Don't display progress
      --apply                     Restart or reboot into the new target image
      --soft-reboot <SOFT_REBOOT> Configure soft reboot behavior [possible values: required, auto]
      --transport <TRANSPORT>     The transport; e.g. oci, containers-storage [default: registry]
      --enforce-container-sigpolicy  Enable verification via an ostree remote
      --retain                    Retain reference to currently booted image
  -h, --help                      Print help
"""
UPGRADE_1169 = """Usage: bootc upgrade [OPTIONS]

Options:
      --quiet              Don't display progress
      --check              Check if an update is available without applying it
      --apply              Restart or reboot into the new target image
      --soft-reboot <SOFT_REBOOT>
      --download-only      Download and stage the update without applying it
      --from-downloaded    Apply a staged deployment from --download-only
      --tag <TAG>          Upgrade to a different tag of the currently booted image
  -h, --help               Print help
"""


def caps_of(switch: str, upgrade: str, **hidden: bool) -> Capabilities:
    probes = {"progress_fd": False, "image_pull": True, "lock_finalization": True, **hidden}
    return from_help(switch, upgrade, version="1.16.9", **probes)


def test_help_of_1_16_9_has_everything_but_switch_download_only() -> None:
    caps = caps_of(SWITCH_1169, UPGRADE_1169)
    assert not caps.switch_download_only and not caps.switch_from_downloaded
    assert caps.upgrade_download_only and caps.upgrade_from_downloaded and caps.upgrade_tag
    assert caps.soft_reboot and caps.sigpolicy and caps.image_pull
    assert not caps.locked_staging
    path = prestage_path(caps)
    assert path.kind == "pre-pull"
    assert path.note == ("pre-staging unavailable: bootc 1.16.9 has no switch --download-only; "
                         "pulling into the repository instead")  # fmt: skip


def test_switch_download_only_is_the_best_path() -> None:
    switch = SWITCH_1169 + "      --download-only  Download and stage without applying it\n"
    caps = caps_of(switch, UPGRADE_1169)
    assert caps.locked_staging and prestage_path(caps).kind == "download-only"
    assert prestage_path(caps).note == ""


def test_a_flag_named_only_in_a_description_does_not_count() -> None:
    """clap lists each flag at the start of its line; the stand-ins' and bootc's help never
    mention another flag in a description, but a word like `--apply` in text must not become
    a capability that is not there: only listed flags count, and `--tag` is not listed."""
    upgrade = UPGRADE_1169.replace("      --tag <TAG>          Upgrade to a different tag of "
                                   "the currently booted image\n", "")  # fmt: skip
    assert not caps_of(SWITCH_1169, upgrade).upgrade_tag


def test_no_pre_stage_path_names_both_missing_verbs() -> None:
    caps = Capabilities(version="1.5.0")
    path = prestage_path(caps)
    assert path.kind == "none"
    assert "no switch --download-only or upgrade --from-downloaded" in path.note
    assert "`internals ostree-container image pull`" in path.note


def test_the_summary_names_what_is_there_and_what_is_not() -> None:
    caps = caps_of(SWITCH_1169, UPGRADE_1169)
    assert caps.summary() == (
        "bootc 1.16.9: has upgrade-download-only upgrade-from-downloaded upgrade-tag "
        "soft-reboot sigpolicy image-pull lock-finalization; lacks switch-download-only "
        "switch-from-downloaded progress-fd"
    )
    assert set(caps.named()) == {
        "switch-download-only", "upgrade-download-only", "switch-from-downloaded",
        "upgrade-from-downloaded", "upgrade-tag", "soft-reboot", "sigpolicy", "image-pull",
        "lock-finalization", "progress-fd",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "version"),
    [("bootc 1.16.9\n", "1.16.9"), ("bootc 1.6.0", "1.6.0"), ("", ""), ("bootc dev", "")],
)
def test_version_line(text: str, version: str) -> None:
    assert parse_version(text) == version


def test_the_pre_pull_command_remounts_only_in_its_own_namespace() -> None:
    argv = pull_argv("bootc", REF, signed=False)
    assert argv[:3] == ["unshare", "-m", "--"]
    assert argv[3:6] == ["sh", "-c", 'mount -o remount,rw /sysroot && exec "$@"']
    assert argv[7:] == ["bootc", "internals", "ostree-container", "image", "pull", "--quiet",
                        REPO, f"ostree-unverified-registry:{REF}"]  # fmt: skip
    assert pull_argv("bootc", REF, signed=True)[-1] == f"ostree-image-signed:docker://{REF}"
    assert pull_imgref(REF, signed=False) == f"ostree-unverified-registry:{REF}"


@pytest.mark.parametrize(
    ("output", "present"),
    [
        (f"docker://{REF}\n", True),
        (f"ostree-unverified-registry:{REF}\n", True),
        (f"{REF}\n", True),
        (f"docker://{REF.replace('d' * 64, 'e' * 64)}\n", False),
        (f"docker://other.io/{REF}\n", False),
        ("", False),
    ],
)
def test_the_image_list_names_the_exact_reference(output: str, present: bool) -> None:
    assert listed(output, REF) is present


def test_the_release_table_is_ordered_and_each_persona_is_a_release() -> None:
    assert [version_key(v) for v in PERSONAS] == sorted(version_key(v) for v in PERSONAS)
    assert features_of("1.16.10") - features_of("1.16.9") == {
        "switch-download-only",
        "switch-from-downloaded",
    }
    assert "upgrade-tag" in features_of("1.15.0") and "upgrade-tag" not in features_of("1.12.0")
    assert features_of("1.6.0") == {"switch-sigpolicy", "internals-image-pull"}
    assert all(source for _, source in FEATURES.values())
    with pytest.raises(ValueError, match=r"older than 1\.6\.0"):
        features_of("1.5.9")
    with pytest.raises(ValueError, match="not a bootc release"):
        features_of("1.x")


@pytest.mark.parametrize("version", PERSONAS)
def test_the_agent_announces_its_bootc_once_at_start(
    tmp_path: Path, version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = SimulatedHost.create(tmp_path / "h", "quay.example/os/node:v1", bootc_version=version)
    board = StatusBoard()
    asyncio.run(announce_bootc(sim.host(Allowlist().allows), board))
    assert board.bootc is not None
    assert board.bootc["version"] == version
    prepull = "switch-download-only" not in features_of(version)
    assert board.bootc["prestage"] == ("pre-pull" if prepull else "download-only")
    assert board.document()["bootc"]["capabilities"]["upgrade-tag"] == (
        "upgrade-tag" in features_of(version)
    )
    metrics = board.metrics.render().decode()
    wanted = 0.0 if prepull else 1.0
    assert f'image_mode_agent_bootc_capability{{name="switch-download-only"}} {wanted}' in metrics
    line = [row for row in capsys.readouterr().out.splitlines() if "bootc capabilities" in row]
    assert len(line) == 1 and f"bootc {version}: has" in line[0]


def test_a_probe_that_fails_is_logged_and_reported_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Broken:
        async def capabilities(self) -> Capabilities:
            raise HostError("bootc --version timed out", kind="timeout")

    sim = SimulatedHost.create(tmp_path / "h", "quay.example/os/node:v1")
    host = sim.host(Allowlist().allows)
    host.bootc = Broken()  # type: ignore[assignment]
    board = StatusBoard()
    asyncio.run(announce_bootc(host, board))
    assert board.bootc is None and "bootc" not in board.document()
    assert "bootc capabilities unknown" in capsys.readouterr().out


def test_status_json_carries_the_bootc_part(tmp_path: Path) -> None:
    from agent.app.runtime import write_status
    from agent.update.engine import DONE, Outcome

    sim = SimulatedHost.create(tmp_path / "h", "quay.example/os/node:v1", bootc_version="1.12.0")
    host = sim.host(Allowlist().allows)
    board = StatusBoard()
    asyncio.run(announce_bootc(host, board))
    write_status(host, Outcome(DONE), "idle", board)
    written = json.loads((host.state_dir / "status.json").read_text())
    assert written["bootc"]["note"].startswith("pre-staging unavailable: bootc 1.12.0 has no")
