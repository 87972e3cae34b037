"""Engine scenarios on the simulated host, including a kill at every journaled step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.update.engine import DEGRADED, DONE, REBOOTING, UNRECONCILABLE
from agent.update.journal import Journal, Phase
from tests.builders import ign_file
from tests.simhost import Killed, World

SSH = "/home/core/.ssh/authorized_keys.d/ignition"
PULL = "/var/lib/kubelet/config.json"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World.create(tmp_path)


async def settle(world: World, name: str, image: str, **kwargs):
    return await world.converge(world.desired(name, image, **kwargs))


async def test_live_update_no_reboot(world: World) -> None:
    assert (await settle(world, "rendered-1", "v1", keys=["k1"])).state == DONE
    outcome = await settle(world, "rendered-2", "v1", keys=["k2"],
                           files=[ign_file(PULL, '{"auths":{}}')])  # fmt: skip
    assert (outcome.state, outcome.current_config) == (DONE, "rendered-2")
    assert world.read(SSH) == b"k2\n"
    assert world.read("/run/ostree/auth.json") == b'{"auths":{}}'
    assert world.reboots() == 0


async def test_image_update_one_reboot_then_commit(world: World) -> None:
    await settle(world, "rendered-1", "v1", keys=["k1"])
    outcome = await settle(world, "rendered-2", "v2", keys=["k2"])
    assert (outcome.state, outcome.current_image) == (DONE, world.images["v2"])
    assert world.booted() == world.digest("v2")
    assert world.reboots() == 1
    assert world.read(SSH) == b"k2\n"
    assert (
        Journal(world.sim.root / "var/lib/image-mode-agent/journal.json").load().phase == Phase.IDLE
    )


async def test_failed_check_rolls_back_and_stays_degraded(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await settle(world, "rendered-2", "bad-check")
    assert outcome.state == DEGRADED
    assert "rolled back to" in outcome.reason
    assert (
        "required health check failed" in outcome.reason and "app unhealthy (no)" in outcome.reason
    )
    assert world.booted() == world.digest("v1")
    assert world.reboots() == 2  # into the bad image, and back
    again = await settle(world, "rendered-2", "bad-check")
    assert again.state == DEGRADED and world.reboots() == 2  # not staged again
    fixed = await settle(world, "rendered-3", "v2")
    assert fixed.state == DONE and world.booted() == world.digest("v2")


async def test_failed_digest_may_be_retried_when_desired_state_changes(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    await settle(world, "rendered-2", "bad-check")
    before = world.reboots()
    outcome = await settle(world, "rendered-3", "bad-check", keys=["new"])
    assert outcome.state == DEGRADED and world.reboots() == before + 2


async def test_boot_attempts_bound_the_loop(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await world.converge(world.desired("rendered-2", "bad-check"), max_boot_attempts=3)
    assert outcome.state == DEGRADED
    assert world.reboots() == 4  # 1 into the image, 2 retries, 1 rollback


async def test_bootloader_fallback_is_degraded_without_rollback(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await settle(world, "rendered-2", "no-boot")
    assert outcome.state == DEGRADED
    assert "did not boot" in outcome.reason
    assert world.reboots() == 1
    assert not any(a["detail"] == "rollback" for a in world.sim.actions())


async def test_bootloader_fallback_blocks_that_digest_for_that_config(world: World) -> None:
    """The same desired state offered again, by the same process life or a new one, never
    stages the image that did not boot: one stage, one reboot, still Degraded."""
    await settle(world, "rendered-1", "v1")
    desired = world.desired("rendered-2", "no-boot")
    first = await world.converge(desired)
    assert first.state == DEGRADED and "did not boot" in first.reason
    engine = world.engine()
    again = [await engine.reconcile(desired) for _ in range(2)]  # the same process life
    again.append(await world.engine().reconcile(desired))  # the agent restarted
    assert [o.state for o in again] == [DEGRADED] * 3
    assert all(o.reason == first.reason for o in again)
    switches = [a for a in world.sim.actions() if a["detail"].startswith("switch ")]
    assert len(switches) == 1 and world.digest("no-boot") in switches[0]["detail"]
    assert world.reboots() == 1
    assert world.sim.status_document()["status"]["staged"] is None
    assert world.booted() == world.digest("v1")


async def test_missing_image_degrades_without_disruption(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await settle(world, "rendered-2", "missing")
    assert outcome.state == DEGRADED and outcome.retryable
    assert "(image-missing)" in outcome.reason and "manifest unknown" in outcome.reason
    assert world.reboots() == 0
    assert world.sim.status_document()["status"]["staged"] is None


async def test_refused_change_is_unreconcilable(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await settle(world, "rendered-2", "v1", files=[ign_file("/etc/motd", "hi")])
    assert outcome.state == UNRECONCILABLE
    assert "need an image build" in outcome.reason
    assert world.read("/etc/motd") is None


async def test_first_start_applies_live_part_only(world: World) -> None:
    outcome = await settle(world, "rendered-1", "v1", keys=["k"], files=[ign_file("/etc/motd")])
    assert outcome.state == DONE and world.read(SSH) == b"k\n" and world.read("/etc/motd") is None


async def test_dry_run_changes_nothing(world: World) -> None:
    before = sorted(p.relative_to(world.base) for p in world.base.rglob("*"))
    outcome = await world.engine().reconcile(world.desired("r", "v2", keys=["k"]), dry_run=True)
    assert outcome.plan.verdict == "image"
    assert sorted(p.relative_to(world.base) for p in world.base.rglob("*")) == before


async def test_two_agents_in_one_process(tmp_path: Path) -> None:
    one, two = World.create(tmp_path / "a"), World.create(tmp_path / "b")
    results = await asyncio.gather(
        one.converge(one.desired("r", "v2", keys=["one"])),
        two.converge(two.desired("r", "v1", keys=["two"])),
    )
    assert [r.state for r in results] == [DONE, DONE]
    assert (one.read(SSH), two.read(SSH)) == (b"one\n", b"two\n")
    assert (one.reboots(), two.reboots()) == (1, 0)


async def test_new_desired_while_rebooting_finishes_inflight_first(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    outcome = await world.engine().reconcile(world.desired("rendered-2", "v2"))
    assert outcome.state == REBOOTING
    newer = world.desired("rendered-3", "v2", keys=["later"])
    first = await world.engine().reconcile(newer)
    assert (first.state, first.current_config) == (DONE, "rendered-2")
    second = await world.engine().reconcile(newer)
    assert (second.state, second.current_config) == (DONE, "rendered-3")
    assert world.reboots() == 1


# -- a kill at every journaled step -----------------------------------------------------------
async def _labels(world: World, steps) -> list[str]:
    seen: list[str] = []
    for desired in steps:
        await world.converge(desired, checkpoint=seen.append)
    return seen


SCENARIOS = {
    "live": (lambda w: [w.desired("r1", "v1", keys=["old"]), w.desired("r2", "v1", keys=["new"])],
             DONE, 0, "v1", b"new\n"),
    "image": (lambda w: [w.desired("r1", "v1", keys=["old"]), w.desired("r2", "v2", keys=["new"])],
              DONE, 1, "v2", b"new\n"),
    "rollback": (lambda w: [w.desired("r1", "v1", keys=["old"]),
                            w.desired("r2", "bad-check", keys=["new"])], DEGRADED, 2, "v1",
                 b"old\n"),
}  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_killed_at_every_step_converges(tmp_path: Path, scenario: str) -> None:
    make_steps, final_state, reboots, final_image, final_keys = SCENARIOS[scenario]
    reference = World.create(tmp_path / "reference")
    labels = await _labels(reference, make_steps(reference))
    assert len(labels) >= 5
    for index, label in enumerate(labels):
        world = World.create(tmp_path / f"kill-{index}")
        steps = make_steps(world)
        count = 0

        def checkpoint(seen: str, index=index, world=world) -> None:
            nonlocal count
            count += 1
            # Files are old or new, never partial, at every instant.
            assert world.read(SSH) in (None, b"old\n", b"new\n")
            if count - 1 == index:
                raise Killed(seen)

        for desired in steps[:-1]:
            await world.converge(desired, checkpoint=checkpoint)
        outcome = await world.converge(steps[-1], checkpoint=checkpoint)
        where = f"killed at {label} (#{index})"
        assert outcome.state == final_state, where
        assert world.booted() == world.digest(final_image), where
        assert world.reboots() == reboots, where
        assert world.read(SSH) == final_keys, where
        journal = json.loads((world.sim.root / "var/lib/image-mode-agent/journal.json").read_text())
        assert journal["phase"] in ("idle", "degraded"), where


async def test_live_path_shadowing_an_image_file_is_reported(world: World) -> None:
    (world.sim.root / "usr/etc/kubernetes").mkdir(parents=True)
    (world.sim.root / "usr/etc/kubernetes/kubelet-ca.crt").write_text("from the image")
    engine = world.engine()
    desired = world.desired("r1", "v1", files=[ign_file("/etc/kubernetes/kubelet-ca.crt", "ca")])
    assert (await engine.reconcile(desired)).state == DONE
    assert any("/usr/etc/kubernetes/kubelet-ca.crt" in e for e in engine.hooks.events)


async def test_live_file_survives_an_image_that_ships_it_in_etc(world: World) -> None:
    """ostree's 3-way merge (the real ostree VM tier): the live version, changed on the host,
    wins over the new image's /etc default, which stays visible in /usr/etc and is reported."""
    cert = "/etc/kubernetes/kubelet-ca.crt"
    await settle(world, "rendered-1", "v1", files=[ign_file(cert, "live ca")])
    name = world.images["v1"].split("@")[0]
    world.images["ships-ca"] = world.sim.add_image(
        f"{name}:ships-ca",
        {"etc/kubernetes/kubelet-ca.crt": "image ca", "usr/lib/app/healthy": "yes"},
    )
    outcome = await settle(world, "rendered-2", "ships-ca", files=[ign_file(cert, "live ca")])
    assert (outcome.state, world.booted()) == (DONE, world.digest("ships-ca"))
    assert world.read(cert) == b"live ca"
    assert (world.sim.root / "usr/etc/kubernetes/kubelet-ca.crt").read_text() == "image ca"
    engine = world.engine()
    assert (await engine.reconcile(world.desired("rendered-2", "ships-ca", files=[
        ign_file(cert, "live ca 2")]))).state == DONE  # fmt: skip
    assert any("/usr/etc/kubernetes/kubelet-ca.crt" in e for e in engine.hooks.events)


async def test_ssh_keys_land_in_var_home_through_the_layout_link(world: World) -> None:
    await settle(world, "rendered-1", "v1", keys=["k1"])
    assert (world.sim.root / "home").is_symlink()
    keys = world.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
    assert keys.read_bytes() == b"k1\n"


@pytest.mark.parametrize("allowed", [True, False])
async def test_soft_reboot_only_where_bootc_allows_and_policy_says(world: World, allowed) -> None:
    name = world.images["v1"].split("@")[0]
    soft = world.sim.add_image(f"{name}:soft", {"usr/lib/app/healthy": "yes"},
                               soft_reboot_capable=True)  # fmt: skip
    await settle(world, "rendered-1", "v1")
    boot_id = json.loads((world.sim.base / "host.json").read_text())
    outcome = await world.converge(world.desired("rendered-2", soft), soft_reboot=allowed)
    assert outcome.state == DONE and world.booted() == soft.split("@")[1]
    state = json.loads((world.sim.base / "host.json").read_text())
    reboots = [a["detail"] for a in world.sim.actions() if a["kind"] == "reboot"]
    if allowed:  # same kernel: same boot ID; the verifier saw SoftRebootsCount grow
        assert reboots == ["soft-reboot"] and state["boot_id"] == boot_id["boot_id"]
    else:
        assert reboots == ["reboot"] and state["boot_id"] != boot_id["boot_id"]


async def test_hard_reboot_for_an_image_that_cannot_soft_reboot(world: World) -> None:
    await settle(world, "rendered-1", "v1")
    assert (await world.converge(world.desired("r2", "v2"), soft_reboot=True)).state == DONE
    assert [a["detail"] for a in world.sim.actions() if a["kind"] == "reboot"] == ["reboot"]


async def test_rollback_reverts_the_live_part(world: World) -> None:
    await settle(world, "rendered-1", "v1", keys=["old"],
                 files=[ign_file(PULL, "old-secret")])  # fmt: skip
    outcome = await settle(world, "rendered-2", "bad-check", keys=["new"],
                           files=[ign_file(PULL, "new-secret")])  # fmt: skip
    assert outcome.state == DEGRADED
    assert world.read(SSH) == b"old\n"
    assert world.read(PULL) == world.read("/run/ostree/auth.json") == b"old-secret"


# -- writes per update: only what changes ----------------------------------------------------
async def test_each_update_writes_only_what_changes(world: World) -> None:
    from agent.core.policy import USER_CA_BUNDLE
    from tests.scenarios.mcd_node import changed, snapshot

    live = [ign_file(PULL, '{"auths":{}}', mode=0o600), ign_file(USER_CA_BUNDLE, "CA\n")]
    await settle(world, "rendered-1", "v1", keys=["k1"], files=live)
    before, actions = snapshot(world.sim.root), len(world.sim.actions())

    # Forced (every live file rewritten, as after adopting a config): only the key changed.
    outcome = await world.engine().reconcile(
        world.desired("rendered-2", "v1", keys=["k2"], files=live), force=True
    )
    assert outcome.state == DONE
    assert changed(before, snapshot(world.sim.root)) == [
        "var/home/core/.ssh/authorized_keys.d/ignition"
    ]
    # The unchanged CA bundle asks for no update-ca-trust and no crio restart.
    assert world.sim.actions()[actions:] == []
    assert list(world.events)[-2:] == [
        f"applied 1 live change(s): write {SSH}; 3 already as desired; no reboot",
        "update to rendered-2 committed",
    ]

    # An image update whose live files are all as desired writes none, and says what is next
    # (forced again, so that every live file is planned).
    before = snapshot(world.sim.root)
    desired = world.desired("rendered-3", "v2", keys=["k2"], files=live)
    assert (await world.engine().reconcile(desired, force=True)).state == REBOOTING
    assert (await world.converge(desired)).state == DONE
    assert world.booted() == world.digest("v2") and world.reboots() == 1
    etc = [p for p in changed(before, snapshot(world.sim.root)) if p.startswith("etc/")]
    assert etc == []
    summary = next(e for e in world.events if e.startswith("live files already as desired"))
    assert summary == (
        "live files already as desired (4): nothing written; "
        f"next: stage {world.images['v2']}, then reboot into it"
    )


async def test_a_resumed_live_update_runs_its_follow_ups(world: World) -> None:
    from agent.core.policy import USER_CA_BUNDLE

    await settle(world, "rendered-1", "v1")
    desired = world.desired("rendered-2", "v1", files=[ign_file(USER_CA_BUNDLE, "CA\n")])

    def killed_after_the_write(label: str) -> None:
        if label == "did:live:0":
            raise Killed(label)

    with pytest.raises(Killed):
        await world.engine(killed_after_the_write).reconcile(desired)
    assert not any(a["kind"] == "unit" for a in world.sim.actions())
    # The file is as wanted now, but the cut-off run never restarted anything.
    assert (await world.converge(desired)).state == DONE
    units = [a["detail"] for a in world.sim.actions() if a["kind"] == "unit"]
    assert units == ["update-ca-trust", "restart crio.service"]
