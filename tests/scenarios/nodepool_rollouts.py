"""A hosted cluster's InPlace NodePool driving real agent processes (`run --source hypershift`),
one simulated host per Node, written once for two backends (tests/scenarios/hostedpool.py): the
stand-ins of HyperShift's in-place upgrader and drainer on the loopback API server
(tests/test_hypershift_scenarios.py, in the default run) and the kit's real `hypershift-inplace`
(tests/conformance/test_hypershift.py, when its binaries are supplied). The NodePool's own
record, the MachineSet's current config version and its InProgress annotations, says when a
rollout completed or halted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.demo.objects import machine_config
from tests.builders import ign_file
from tests.scenarios.hostedpool import HostedBackend, HostedPool

P = "machineconfiguration.openshift.io/"
KEY = "ssh-ed25519 AAAA-hypershift-scenario"
# Fast checks for the scenarios: no jitter, a refusal lifted after 1 s.
ARGS = ["--prestage-jitter", "0", "--refused-retry", "1"]


@contextlib.asynccontextmanager
async def nodepool(backend: HostedBackend, base: Path, nodes: int = 3,
                   max_unavailable: int = 1) -> AsyncIterator[HostedPool]:  # fmt: skip
    """The NodePool with its agents running; everything stopped at the end."""
    pool = await HostedPool.create(base, nodes=nodes, max_unavailable=max_unavailable,
                                   agent_args=ARGS, backend=backend)  # fmt: skip
    try:
        pool.start_agents()
        yield pool
    finally:
        await pool.close()


def payload(pool: HostedPool, image: str, *, keys: list[str] | None = None,
            files: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    return machine_config("np", image=pool.images[image], keys=keys, files=files,
                          version="3.5.0")  # fmt: skip


def keys_on(pool: HostedPool) -> set[str]:
    """The SSH keys file of every host, as text (missing: "")."""
    found = set()
    for node in pool.nodes.values():
        path = node.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
        found.add(path.read_text() if path.exists() else "")
    return found


def fetched_at_turn(pool: HostedPool, node: str) -> list[int]:
    """Bytes each turn of `node` fetched (the last stage of each digest; any before it were
    pre-stages), in the order of the turns."""
    sim = pool.nodes[node].sim
    turns: dict[str, None] = {}  # each digest where its last stage came
    for action in sim.actions():
        if action["kind"] == "fetched":
            digest = action["detail"].split()[0]
            turns.pop(digest, None)
            turns[digest] = None
    return [sim.stages(digest)[-1][0] for digest in turns]


async def live_only(backend: HostedBackend, base: Path) -> None:
    """An SSH key: every Node live, no cordon, no reboot."""
    async with nodepool(backend, base) as pool:
        target = await pool.set_target(payload(pool, "v1", keys=[KEY]))
        await pool.wait_complete(target, timeout=60)
        assert set(pool.reboots().values()) == {0}
        assert pool.most_cordoned() == 0 and pool.most_selected(target) == 1
        assert keys_on(pool) == {KEY + "\n"}
        assert all(a["state"] == "Done" and a["currentConfig"] == target
                   for a in pool.latest().values())  # fmt: skip


async def image_update(backend: HostedBackend, base: Path) -> None:
    """A new image: one reboot per Node, one Node at a time, each uncordoned with its Done."""
    async with nodepool(backend, base) as pool:
        target = await pool.set_target(payload(pool, "v2", keys=[KEY]))
        await pool.wait_complete(target, timeout=90)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
        assert pool.most_selected(target) == 1 and pool.most_cordoned() <= 1
        v2 = pool.images["v2"].split("@")[1]
        assert {node.booted() for node in pool.nodes.values()} == {v2}
        assert all(a["desiredDrain"] == a["lastAppliedDrain"] == f"uncordon-{target}"
                   for a in pool.latest().values())  # fmt: skip
        assert pool.states() == {name: ["Working", "Done"] for name in pool.nodes}


async def max_unavailable_two(backend: HostedBackend, base: Path) -> None:
    """4 Nodes, maxUnavailable 2 (an even count: the upgrader's slicing bug needs an odd
    remainder, tests/scenarios/hypershift_standin.py): never more than two at once."""
    async with nodepool(backend, base, nodes=4, max_unavailable=2) as pool:
        target = await pool.set_target(payload(pool, "v2", keys=[KEY]))
        await pool.wait_complete(target, timeout=90)
        assert pool.most_selected(target) == 2 and pool.most_cordoned() <= 2
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)


async def refused_then_healed(backend: HostedBackend, base: Path) -> None:
    """Image content with no new image: Degraded with the reason, the NodePool halted, nothing
    disrupted; the fix (a prebuilt image that carries the file) heals it."""
    async with nodepool(backend, base) as pool:
        chrony = [ign_file("/etc/chrony.conf", "pool ntp.example iburst")]
        refused = await pool.set_target(payload(pool, "v1", keys=[KEY], files=chrony))
        message = await pool.wait_degraded("cannot be applied in place", timeout=60)
        assert message.startswith("Node np-")
        assert "in nodepool degraded: NodePool config " in message
        assert "/etc/chrony.conf" in message and "NodePool's spec.config" in message
        assert pool.most_selected(refused) == 1 and pool.most_cordoned() == 0
        assert set(pool.reboots().values()) == {0}
        assert "Unreconcilable" not in {s for seq in pool.states().values() for s in seq}
        fixed = await pool.set_target(payload(pool, "v2", keys=[KEY], files=chrony))
        await pool.wait_complete(fixed, timeout=90)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
        assert not any("InProgressFalse" in key for key in await pool.machineset())


async def target_moved_mid_rollout(backend: HostedBackend, base: Path) -> None:
    """A new image, then (once the first Node is Done on it) a key: every Node ends on the
    newest, with the image booted once and the key written live."""
    async with nodepool(backend, base) as pool:
        first = await pool.set_target(payload(pool, "v2"))
        async with asyncio.timeout(60):
            while not any(s.annotations.get(P + "currentConfig") == first for s in pool.samples):
                await asyncio.sleep(0.05)
        newest = await pool.set_target(payload(pool, "v2", keys=[KEY]))
        await pool.wait_complete(newest, timeout=90)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
        assert pool.most_selected() <= 1
        assert keys_on(pool) == {KEY + "\n"}


async def prestaged(backend: HostedBackend, base: Path) -> None:
    """Every Node stages the published target before its turn (4-s pulls): the turns after the
    first fetch nothing."""
    async with nodepool(backend, base) as pool:
        target = await pool.set_target(payload(pool, "slow", keys=[KEY]))
        await pool.wait_complete(target, timeout=90)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
        turns = {name: fetched_at_turn(pool, name) for name in pool.nodes}
        # The first Node's turn comes at once (it fetches part or all at its turn); the later
        # ones found the image pre-staged.
        assert sum(1 for t in turns.values() if t and all(b == 0 for b in t)) >= 2, turns


SCENARIOS = [live_only, image_update, max_unavailable_two, refused_then_healed,
             target_moved_mid_rollout, prestaged]  # fmt: skip
