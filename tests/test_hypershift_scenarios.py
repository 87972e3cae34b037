"""A hosted cluster's InPlace NodePool driving real agent processes (`run --source hypershift`),
one simulated host per Node, on the stand-ins of HyperShift's in-place upgrader and drainer
(tests/scenarios/hypershift_standin.py, which mirror inplaceupgrader.go and drainer.go as
../shared/reference/hypershift-inplace.md cites them): the NodePool's own record (the MachineSet's
current config version and its InProgress annotations) says when a rollout completed or halted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.demo.objects import machine_config
from tests.builders import ign_file
from tests.scenarios.hostedpool import HostedPool

pytestmark = pytest.mark.asyncio

P = "machineconfiguration.openshift.io/"
KEY = "ssh-ed25519 AAAA-hypershift-scenario"
# Fast checks for the scenarios: no jitter, a refusal lifted after 1 s.
ARGS = ["--prestage-jitter", "0", "--refused-retry", "1"]


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[HostedPool]:
    hosted = await HostedPool.create(tmp_path, nodes=3, agent_args=ARGS)
    try:
        yield hosted
    finally:
        await hosted.close()


def payload(pool: HostedPool, image: str, *, keys: list[str] | None = None,
            files: list[dict] | None = None) -> dict:  # fmt: skip
    return machine_config("np", image=pool.images[image], keys=keys, files=files,
                          version="3.5.0")  # fmt: skip


def fetched_at_turn(pool: HostedPool, node: str) -> list[int]:
    """Bytes each stage of `node` fetched at its turn (not in a pre-stage)."""
    lines = [a["detail"].split() for a in pool.nodes[node].sim.actions() if a["kind"] == "fetched"]
    return [int(parts[1]) for parts in lines if parts[-1] != "pre-stage"]


async def test_live_only_payload_updates_every_node_with_no_drain_and_no_reboot(
    pool: HostedPool,
) -> None:
    pool.start_agents()
    target = await pool.set_target(payload(pool, "v1", keys=[KEY]))
    await pool.wait_complete(target, timeout=60)
    assert set(pool.reboots().values()) == {0}
    assert pool.most_cordoned() == 0 and pool.most_selected(target) == 1
    for node in pool.nodes.values():
        keys = node.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
        assert keys.read_text() == KEY + "\n"
    assert all(a["state"] == "Done" and a["currentConfig"] == target
               for a in pool.latest().values())  # fmt: skip


async def test_image_payload_one_reboot_per_node_never_more_than_max_unavailable(
    pool: HostedPool,
) -> None:
    pool.start_agents()
    target = await pool.set_target(payload(pool, "v2", keys=[KEY]))
    await pool.wait_complete(target, timeout=90)
    assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
    assert pool.most_selected(target) == 1 and pool.most_cordoned() <= 1
    v2 = pool.images["v2"].split("@")[1]
    assert {node.booted() for node in pool.nodes.values()} == {v2}
    # Every Node asked for its drain, and for its uncordon with Done: none is left cordoned.
    assert all(a["desiredDrain"] == a["lastAppliedDrain"] == f"uncordon-{target}"
               for a in pool.latest().values())  # fmt: skip
    assert pool.states() == {name: ["Working", "Done"] for name in pool.nodes}


async def test_with_max_unavailable_two_never_more_than_two_nodes_at_once(
    tmp_path: Path,
) -> None:
    pool = await HostedPool.create(tmp_path, nodes=4, max_unavailable=2, agent_args=ARGS)
    try:
        pool.start_agents()
        target = await pool.set_target(payload(pool, "v2", keys=[KEY]))
        await pool.wait_complete(target, timeout=90)
        assert pool.most_selected(target) == 2 and pool.most_cordoned() <= 2
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
    finally:
        await pool.close()


async def test_refused_payload_halts_the_nodepool_and_the_next_target_heals_it(
    pool: HostedPool,
) -> None:
    pool.start_agents()
    chrony = [ign_file("/etc/chrony.conf", "pool ntp.example iburst")]
    refused = await pool.set_target(payload(pool, "v1", keys=[KEY], files=chrony))
    message = await pool.wait_degraded("cannot be applied in place", timeout=60)
    assert message.startswith("Node np-") and "in nodepool degraded: NodePool config " in message
    assert "/etc/chrony.conf" in message and "NodePool's spec.config" in message
    # Halted: the one Node the upgrader picked refused before any stage or drain, no other
    # Node was picked, and nothing was rebooted.
    assert pool.most_selected(refused) == 1 and pool.most_cordoned() == 0
    assert set(pool.reboots().values()) == {0}
    assert "Unreconcilable" not in {s for seq in pool.states().values() for s in seq}
    # The fix: a prebuilt image that carries the file, named in the NodePool's config.
    fixed = await pool.set_target(payload(pool, "v2", keys=[KEY], files=chrony))
    await pool.wait_complete(fixed, timeout=90)
    assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
    assert "InProgressFalse" not in str(await pool.machineset())


async def test_a_target_changed_mid_rollout_moves_every_node_to_the_newest(
    pool: HostedPool,
) -> None:
    pool.start_agents()
    first = await pool.set_target(payload(pool, "v2"))
    # Once the first Node is Done on it, the NodePool's config changes again (live only).
    async with asyncio.timeout(60):
        while not any(s.annotations.get(P + "currentConfig") == first for s in pool.samples):
            await asyncio.sleep(0.05)
    newest = await pool.set_target(payload(pool, "v2", keys=[KEY]))
    await pool.wait_complete(newest, timeout=90)
    assert pool.reboots() == dict.fromkeys(pool.nodes, 1)  # the image once, the key live
    assert pool.most_selected() <= 1
    for node in pool.nodes.values():
        keys = node.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
        assert keys.read_text() == KEY + "\n"


async def test_every_node_prestages_the_published_target_and_its_turn_pulls_nothing(
    tmp_path: Path,
) -> None:
    pool = await HostedPool.create(tmp_path, nodes=3, agent_args=ARGS)
    try:
        pool.start_agents()
        target = await pool.set_target(payload(pool, "slow", keys=[KEY]))  # 4-s pulls
        await pool.wait_complete(target, timeout=90)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
        turns = {name: fetched_at_turn(pool, name) for name in pool.nodes}
        # The first Node's turn comes at once (it pulls part or all of it at its turn); every
        # later one found the image pre-staged, and fetched nothing.
        assert sum(1 for t in turns.values() if t and all(b == 0 for b in t)) >= 2, turns
    finally:
        await pool.close()
