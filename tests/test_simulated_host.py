"""The simulated host's bootc: download-only (locked) staging as real bootc does it, a layer
cache that survives a cancelled pull, an injectable full disk, and an already-staged image that
is not staged again."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.app.cli import main as cli_main
from agent.errors import HostError
from agent.host import bootc_errors
from agent.host.ports import Progress
from agent.model.imageref import ImageRef, parse_image_ref
from standins.host.simulated import LAYERS, SimulatedBootc, SimulatedHost

IMAGE = "quay.example/os/node"


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedHost:
    return SimulatedHost.create(tmp_path / "host", f"{IMAGE}:v1", {"usr/lib/v": "1"})


def add(sim: SimulatedHost, tag: str, pull_seconds: float = 0.0) -> ImageRef:
    pinned = sim.add_image(f"{IMAGE}:{tag}", {"usr/lib/v": tag}, pull_seconds=pull_seconds)
    return parse_image_ref(pinned)


def pulls(sim: SimulatedHost, image: ImageRef) -> list[str]:
    return [
        a["detail"] for a in sim.actions() if a["kind"] == "pull" and image.digest in a["detail"]
    ]


def switches(sim: SimulatedHost) -> list[str]:
    return [a["detail"] for a in sim.actions() if a["kind"] == "bootc" and "switch" in a["detail"]]


def slots(sim: SimulatedHost) -> dict[str, dict | None]:
    status = sim.status_document()["status"]
    return {slot: status[slot] for slot in ("booted", "staged", "rollback")}


def digest_of(entry: dict | None) -> str | None:
    return entry["image"]["imageDigest"] if entry else None


async def reboot(sim: SimulatedHost) -> None:
    await sim.host(lambda _path: True).system.reboot()
    assert sim.boot()


async def test_a_locked_stage_is_discarded_by_an_ordinary_reboot(sim: SimulatedHost) -> None:
    v1 = slots(sim)["booted"]
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    boot_id = await sim.host(lambda _path: True).system.boot_id()
    await bootc.stage(v2, locked=True)
    staged = slots(sim)["staged"]
    assert digest_of(staged) == v2.digest and staged is not None and staged["downloadOnly"]
    assert (await bootc.status()).staged_locked(v2.digest or "")
    assert switches(sim) == [f"switch --transport registry --download-only {v2}"]
    await reboot(sim)
    after = slots(sim)
    assert after["booted"] == v1 and after["staged"] is None and after["rollback"] is None
    assert await sim.host(lambda _path: True).system.boot_id() != boot_id
    assert "discarded (download-only)" in sim.actions()[-1]["detail"]
    assert (sim.root / "usr/lib/v").read_text() == "1"  # still the old image's files


async def test_an_unlocked_stage_is_booted_by_an_ordinary_reboot(sim: SimulatedHost) -> None:
    """As bootc does with a plain `switch`: what an unlocked pre-stage would do to a node."""
    v1 = slots(sim)["booted"]
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2)
    assert switches(sim) == [f"switch --transport registry {v2}"]
    assert slots(sim)["staged"]["downloadOnly"] is False  # type: ignore[index]
    await reboot(sim)
    after = slots(sim)
    assert (digest_of(after["booted"]), after["rollback"]) == (v2.digest, v1)
    assert (sim.root / "usr/lib/v").read_text() == "v2"


async def test_unlock_then_reboot_boots_the_staged_image(sim: SimulatedHost) -> None:
    v1_digest = digest_of(slots(sim)["booted"])
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    with pytest.raises(HostError) as err:
        await bootc.unlock_staged()
    assert err.value.kind == "no-staged"
    await bootc.stage(v2, locked=True)
    assert await bootc.unlock_staged() is True
    assert await bootc.unlock_staged() is False  # armed already: nothing to do
    assert slots(sim)["staged"]["downloadOnly"] is False  # type: ignore[index]
    await reboot(sim)
    after = slots(sim)
    assert (digest_of(after["booted"]), digest_of(after["rollback"])) == (v2.digest, v1_digest)
    assert after["staged"] is None
    assert (sim.root / "usr/lib/v").read_text() == "v2"


async def test_a_cancelled_pull_resumes_with_only_the_missing_layers(sim: SimulatedHost) -> None:
    v2 = add(sim, "v2", pull_seconds=0.6)  # 0.2 s per layer
    bootc = SimulatedBootc(sim)
    staging = asyncio.create_task(bootc.stage(v2))
    async with asyncio.timeout(10):
        while not pulls(sim, v2):
            await asyncio.sleep(0.01)
    staging.cancel()
    await bootc.cancel_stage()  # nothing runs in the background here: a no-op
    with pytest.raises(asyncio.CancelledError):
        await staging
    before = pulls(sim, v2)
    assert 1 <= len(before) < LAYERS and slots(sim)["staged"] is None
    seen: list[Progress] = []
    await bootc.stage(v2, seen.append)
    after = pulls(sim, v2)
    assert after[: len(before)] == before
    assert after == [f"{v2.digest}  layer {n}/{LAYERS}" for n in range(1, LAYERS + 1)]
    assert seen[-1].done_bytes == seen[-1].total_bytes > 0
    assert digest_of(slots(sim)["staged"]) == v2.digest


async def test_an_image_fetched_once_is_not_fetched_again(sim: SimulatedHost) -> None:
    v2 = add(sim, "v2", pull_seconds=0.6)
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2, locked=True)
    assert len(pulls(sim, v2)) == LAYERS
    await reboot(sim)  # discards the locked deployment; its layers stay cached
    assert slots(sim)["staged"] is None
    seen: list[Progress] = []
    started = time.monotonic()
    fetched = await bootc.stage(v2, seen.append)
    assert time.monotonic() - started < 0.3  # no pull time
    assert len(pulls(sim, v2)) == LAYERS and len(switches(sim)) == 2
    assert digest_of(slots(sim)["staged"]) == v2.digest
    total = seen[0].total_bytes
    assert seen == [Progress(total, total, "pulling", cached_bytes=total)] and fetched == 0


async def test_an_image_already_staged_returns_at_once(sim: SimulatedHost) -> None:
    v2 = add(sim, "v2", pull_seconds=0.6)
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2, locked=True)
    actions = len(sim.actions())
    started = time.monotonic()
    assert await bootc.stage(v2) == 0  # a locked one does for an unlocked stage
    assert await bootc.stage(v2, locked=True) == 0
    assert time.monotonic() - started < 0.3
    after = [a["kind"] for a in sim.actions()[actions:]]
    assert after == ["fetched", "fetched"]  # nothing fetched, no pull, no second switch
    assert slots(sim)["staged"]["downloadOnly"] is True  # type: ignore[index]


async def test_a_locked_stage_locks_an_image_staged_unlocked(sim: SimulatedHost) -> None:
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2)
    assert await bootc.stage(v2, locked=True) == 0  # every layer is cached
    assert slots(sim)["staged"]["downloadOnly"] is True  # type: ignore[index]
    await reboot(sim)
    assert digest_of(slots(sim)["booted"]) != v2.digest


async def test_a_full_disk_fails_the_stage_with_kind_disk_space(sim: SimulatedHost) -> None:
    v2, v3 = add(sim, "v2"), add(sim, "v3")
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2, locked=True)
    await reboot(sim)  # v2's layers are cached, nothing staged
    sim.set_disk_full()
    with pytest.raises(HostError) as err:
        await bootc.stage(v3)
    message = str(err.value)
    assert err.value.kind == "disk-space" == bootc_errors.classify(message)
    assert message.startswith("error: Switching: Pulling: ")
    assert "No space left on device (os error 28)" in message
    assert pulls(sim, v3) == [] and slots(sim)["staged"] is None
    await bootc.stage(v2)  # nothing left to fetch: a full disk does not matter
    assert digest_of(slots(sim)["staged"]) == v2.digest
    sim.set_disk_full(False)
    await bootc.stage(v3)
    assert digest_of(slots(sim)["staged"]) == v3.digest and len(pulls(sim, v3)) == LAYERS


async def test_disk_full_mid_pull_stops_at_the_next_layer(sim: SimulatedHost) -> None:
    """Another process (the test, `sim disk-full`) fills the disk while the agent pulls."""
    v2 = add(sim, "v2", pull_seconds=0.6)
    bootc = SimulatedBootc(sim)
    staging = asyncio.create_task(bootc.stage(v2))
    async with asyncio.timeout(10):
        while not pulls(sim, v2):
            await asyncio.sleep(0.01)
    assert cli_main(["sim", "disk-full", str(sim.base)]) == 0
    with pytest.raises(HostError) as err:
        await staging
    assert err.value.kind == "disk-space"
    fetched = len(pulls(sim, v2))
    assert 1 <= fetched < LAYERS
    assert cli_main(["sim", "disk-full", str(sim.base), "--off"]) == 0
    await bootc.stage(v2)
    assert len(pulls(sim, v2)) == LAYERS  # resumed: the fetched layers were kept


async def test_staging_the_booted_image_pulls_nothing_and_drops_a_staged_one(
    sim: SimulatedHost,
) -> None:
    booted = parse_image_ref(f"{IMAGE}@{digest_of(slots(sim)['booted'])}")
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2)
    await bootc.stage(booted)
    assert slots(sim)["staged"] is None and pulls(sim, booted) == []


@pytest.mark.parametrize("euid", [0, 1001])
def test_an_unprivileged_user_runs_a_simulated_host_without_owners(
    sim: SimulatedHost, monkeypatch: pytest.MonkeyPatch, euid: int
) -> None:
    """The demo from a plain install, or in the DaemonSet image as its non-root default user:
    the files are written with their modes, owners are only set by root (a chown to `core`
    would be refused), and an unknown owner still fails as on a real host."""
    from agent.core.policy import Allowlist
    from agent.model.ignition import Owner

    monkeypatch.setattr("standins.host.simulated.os.geteuid", lambda: euid)
    files = sim.host(Allowlist().allows).files
    path = "/home/core/.ssh/authorized_keys.d/ignition"
    chowns: list[tuple[int, int]] = []
    monkeypatch.setattr("agent.host.files.os.fchown", lambda fd, u, g: chowns.append((u, g)))
    files.write(path, b"ssh-ed25519 AAAA\n", mode=0o600, user=Owner(name="core"),
                group=Owner(name="core"))  # fmt: skip
    written = sim.root / path.lstrip("/")
    assert written.read_bytes() == b"ssh-ed25519 AAAA\n" and written.stat().st_mode & 0o777 == 0o600
    assert chowns == ([(1000, 1000)] if euid == 0 else [])  # core in the simulated passwd
    with pytest.raises(HostError) as err:
        files.write(path, b"x", mode=0o600, user=Owner(name="nobody-here"), group=Owner())
    assert err.value.kind == "owner"


# -- the host as ostree lays it out (differences the real ostree VM tier showed) ---------------
async def boot_image(sim: SimulatedHost, tag: str, files: dict[str, str]) -> None:
    image = parse_image_ref(sim.add_image(f"{IMAGE}:{tag}", files))
    bootc = SimulatedBootc(sim)
    await bootc.stage(image)
    await bootc.unlock_staged()
    await reboot(sim)


def test_homes_live_in_var_behind_ostree_links(sim: SimulatedHost) -> None:
    assert (sim.root / "home").is_symlink() and str((sim.root / "home").readlink()) == "var/home"
    assert (sim.root / "root").is_symlink()
    assert (sim.root / "var/home/core").is_dir()


async def test_image_etc_is_merged_three_ways_at_boot(tmp_path: Path) -> None:
    v1 = {"etc/kept": "v1\n", "etc/edited": "v1\n", "etc/dropped": "v1\n",
          "etc/dropped-edited": "v1\n", "usr/lib/v": "1"}  # fmt: skip
    sim = SimulatedHost.create(tmp_path / "host", f"{IMAGE}:v1", v1)
    assert (sim.root / "usr/etc/kept").read_text() == "v1\n"  # the image's default lives in /usr
    (sim.root / "etc/edited").write_text("local\n")
    (sim.root / "etc/dropped-edited").write_text("local\n")
    (sim.root / "etc/local-only").write_text("local\n")
    await boot_image(sim, "v2", {"etc/kept": "v2\n", "etc/edited": "v2\n", "etc/new": "v2\n",
                                 "usr/lib/v": "2"})  # fmt: skip
    etc = {p.name: p.read_text() for p in (sim.root / "etc").iterdir() if p.is_file()}
    assert etc["kept"] == "v2\n"  # unchanged on the host: the new default comes in
    assert etc["edited"] == "local\n"  # changed on the host: the host's version wins
    assert etc["new"] == "v2\n"
    assert "dropped" not in etc  # unchanged and no longer shipped: gone
    assert etc["dropped-edited"] == "local\n"  # changed on the host: kept
    assert etc["local-only"] == "local\n"
    assert (sim.root / "usr/etc/edited").read_text() == "v2\n"
    assert not (sim.root / "usr/etc/dropped").exists()
    assert (sim.root / "usr/lib/v").read_text() == "2"


async def test_an_etc_write_after_staging_reaches_the_new_deployment(sim: SimulatedHost) -> None:
    """ostree merges /etc when it finalizes the staged deployment at shutdown, not when it
    stages it (real ostree VM tier: agent-killed-ostree)."""
    v2 = add(sim, "v2")
    bootc = SimulatedBootc(sim)
    await bootc.stage(v2)
    (sim.root / "etc/after-staging").write_text("written while v2 waited\n")
    await bootc.unlock_staged()
    await reboot(sim)
    assert digest_of(slots(sim)["booted"]) == v2.digest
    assert (sim.root / "etc/after-staging").read_text() == "written while v2 waited\n"


# -- soft reboots: only into what bootc prepared --------------------------------------------------
def capable(sim: SimulatedHost, tag: str) -> ImageRef:
    pinned = sim.add_image(f"{IMAGE}:{tag}", {"usr/lib/v": tag}, soft_reboot_capable=True)
    return parse_image_ref(pinned)


async def soft_reboot(sim: SimulatedHost) -> None:
    await sim.host(lambda _path: True).system.reboot(soft=True)
    assert sim.boot()


def soft_count(sim: SimulatedHost) -> int:
    return int(json.loads((sim.base / "host.json").read_text()).get("soft_reboots", 0))


@pytest.mark.parametrize("locked", [False, True], ids=["unlocked", "download-only"])
async def test_a_soft_reboot_with_nothing_prepared_stays_in_the_same_deployment(
    sim: SimulatedHost, locked: bool
) -> None:
    """systemd's soft reboot with no /run/nextroot re-executes the same root: same boot ID,
    SoftRebootsCount + 1, the staged deployment still staged (still locked if it was). Only a
    full reboot then boots it (or, locked, discards it)."""
    before = slots(sim)
    v2 = capable(sim, "v2")
    system = sim.host(lambda _path: True).system
    boot_id = await system.boot_id()
    await SimulatedBootc(sim).stage(v2, locked=locked)
    assert sim.soft_reboot_prepared() is None  # a plain stage prepares nothing
    await soft_reboot(sim)
    after = slots(sim)
    assert after["booted"] == before["booted"] and after["rollback"] is None
    assert digest_of(after["staged"]) == v2.digest
    assert after["staged"]["downloadOnly"] is locked  # type: ignore[index]
    assert (await system.boot_id(), await system.soft_reboots_count()) == (boot_id, 1)
    assert (sim.root / "usr/lib/v").read_text() == "1"
    assert sim.actions()[-1]["detail"].startswith("soft reboot with nothing prepared")
    await reboot(sim)  # the second, full reboot the node then needs
    assert digest_of(slots(sim)["booted"]) == (before["booted"]["image"]["imageDigest"]
                                               if locked else v2.digest)  # fmt: skip


@pytest.mark.parametrize("version", ["1.11.0", "1.12.0", "1.16.10"])
async def test_a_soft_reboot_enters_the_deployment_bootc_prepared(
    tmp_path: Path, version: str
) -> None:
    """`upgrade --from-downloaded --soft-reboot auto` (>= 1.12) prepares /run/nextroot for a
    softRebootCapable staged deployment, locked or not; before 1.12 nothing is asked."""
    sim = SimulatedHost.create(tmp_path / "host", f"{IMAGE}:v1", {"usr/lib/v": "1"},
                               bootc_version=version)  # fmt: skip
    v1, v2 = digest_of(slots(sim)["booted"]), capable(sim, "v2")
    bootc = SimulatedBootc(sim)
    caps = await bootc.capabilities()
    await bootc.stage(v2, locked=caps.locked_staging)
    assert await bootc.unlock_staged(soft=True) is caps.soft_reboot_at_turn
    assert sim.soft_reboot_prepared() == ("staged" if caps.soft_reboot_at_turn else None)
    await soft_reboot(sim)
    after = slots(sim)
    assert soft_count(sim) == 1 and sim.soft_reboot_prepared() is None  # consumed, if any
    if caps.soft_reboot_at_turn:
        assert bootc_calls(sim)[-1] == "upgrade --from-downloaded --soft-reboot auto"
        assert digest_of(after["booted"]) == v2.digest and after["staged"] is None
        assert (sim.root / "usr/lib/v").read_text() == "v2"
    else:  # 1.7-1.11: `--soft-reboot` exists, but nothing at the turn prepares it
        assert (digest_of(after["booted"]), digest_of(after["staged"])) == (v1, v2.digest)


def bootc_calls(sim: SimulatedHost) -> list[str]:
    return [a["detail"] for a in sim.actions() if a["kind"] == "bootc"]


async def test_a_prepared_soft_reboot_is_cleared_by_a_stage_a_rollback_a_reset_and_a_full_reboot(
    sim: SimulatedHost,
) -> None:
    v2, v3 = capable(sim, "v2"), capable(sim, "v3")
    bootc = SimulatedBootc(sim)

    async def prepared_staged(image: ImageRef) -> None:
        await bootc.stage(image, locked=True)
        assert await bootc.unlock_staged(soft=True) is True
        assert sim.soft_reboot_prepared() == "staged"

    await prepared_staged(v2)
    await bootc.stage(v3)  # every stage resets it (ostree)
    assert sim.soft_reboot_prepared() is None
    await prepared_staged(v3)
    sim.reset_soft_reboot()  # ostree admin prepare-soft-reboot --reset
    assert sim.soft_reboot_prepared() is None
    await soft_reboot(sim)
    assert digest_of(slots(sim)["staged"]) == v3.digest  # nothing prepared: same root
    # Unlocked now, it is prepared all the same when asked (`--from-downloaded` unlocks
    # nothing then, and `--soft-reboot auto` prepares it), and entered.
    assert await bootc.unlock_staged(soft=True) is True
    await soft_reboot(sim)
    assert digest_of(slots(sim)["booted"]) == v3.digest and soft_count(sim) == 2
    await prepared_staged(v2)
    await bootc.rollback()  # drops the staged deployment, and what was prepared for it
    assert sim.soft_reboot_prepared() is None
    await bootc.rollback()  # (a toggle: the rollback is no longer queued)
    # A full reboot (the agent's goes through logind's Reboot) loses /run/nextroot.
    await prepared_staged(v2)
    await reboot(sim)
    assert digest_of(slots(sim)["booted"]) == v2.digest and sim.soft_reboot_prepared() is None
    assert soft_count(sim) == 2  # the full reboot counts no soft one


async def test_the_download_only_soft_reboot_hazard_runs_the_locked_image(
    sim: SimulatedHost,
) -> None:
    """`bootc upgrade --download-only --soft-reboot=auto` prepares /run/nextroot for the locked
    deployment (ostree's `deployment_set_soft_reboot` checks no lock): a soft reboot, or a
    `systemctl reboot` (which soft-reboots into a prepared nextroot), runs its userspace,
    undrained. The agent never asks for it; an `ostree admin prepare-soft-reboot --reset`
    disarms it. See
    https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/cli.rs#L1386-L1393
    """
    v2 = capable(sim, "v2")
    await SimulatedBootc(sim).stage(v2, locked=True)
    assert sim.prepare_soft_reboot() is True
    sim.reset_soft_reboot()
    sim.systemctl_reboot()
    assert sim.boot() and digest_of(slots(sim)["booted"]) != v2.digest  # discarded, as locked
    await SimulatedBootc(sim).stage(v2, locked=True)
    assert sim.prepare_soft_reboot() is True
    sim.systemctl_reboot()
    assert sim.actions()[-1]["detail"] == "soft-reboot"
    assert sim.boot() and digest_of(slots(sim)["booted"]) == v2.digest
    assert "locked (download-only)" in sim.actions()[-1]["detail"]
