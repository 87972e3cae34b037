"""A hosted cluster's InPlace NodePool driving real agent processes (`run --source hypershift`),
one simulated host per Node, written once for two backends (tests/scenarios/hostedpool.py): the
stand-ins of HyperShift's in-place upgrader and drainer on the loopback API server
(tests/test_hypershift_scenarios.py, in the default run) and the kit's real `hypershift-inplace`
(tests/conformance/test_hypershift.py, when its binaries are supplied). The NodePool's own
record, the MachineSet's current config version and its InProgress annotations, says when a
rollout completed or halted.

BOUNDED (below SCENARIOS) are the bounded pre-pulls: they need deploy/hypershift/rbac.yaml
applied (its pre-pull Role and Node-list ClusterRole), which the stand-ins apply when given it
(`StandInHosted(rbac=HYPERSHIFT_RBAC)`) and the kit's `hcp-up` does not (it grants the ConfigMap
only: there the agents fall back to the jitter, which `prestage_unbounded_without_the_role`
checks on the stand-ins)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.demo.objects import machine_config
from agent.host.shared_registry import PullRecord, pull_records
from tests.builders import ign_file
from tests.scenarios.hostedpool import HostedBackend, HostedPool, StandInHosted
from tests.scenarios.pool_rollouts import LANE_FILES, LANE_IMAGE_BYTES, merged_pulls

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


# -- bounded pre-pulls (stand-ins with deploy/hypershift/rbac.yaml) ----------------------------
LANE = "image-mode-prepull-np-0"  # the NodePool's one lane (auto: 1), in np-upgrade


def shared_image(pool: HostedPool, base: Path, pull_seconds: float) -> tuple[str, Path]:
    """One new image on every host, pulled through one shared registry (each pull
    `pull_seconds` alone, ten at once before they slow each other); the registry's folder
    keeps every pull's start and end (pulls.log)."""
    shared = base / "registry"
    image = ""
    for name, node in pool.nodes.items():
        image = node.sim.add_image("quay.io/example/os:lanes", LANE_FILES)  # one digest on all
        link = LANE_IMAGE_BYTES / pull_seconds
        node.sim.set_shared_link(shared, registry_bps=10 * link, link_bps=link, host=name)
    return image, shared


async def picks_held_until_the_first_prepull(pool: HostedPool, image: str, shared: Path) -> str:
    """The target published with the upgrader held back (maxUnavailable 0: a stand-in device,
    the NodePool controller writes at least 1) until the first pre-pull runs, then let go
    (maxUnavailable 1): the first pick comes while rank 0 pre-pulls, so the lane's order does
    not depend on which of the first turn and the first pre-pull reaches the lane first (with
    the real upgrader they come together: the ConfigMap and the first desiredConfig are
    written in one reconcile)."""
    digest = image.split("@")[1]
    pool.upgrader.set_max_unavailable(0)
    target = await pool.set_target(machine_config("np", image=image, keys=[KEY], version="3.5.0"))
    async with asyncio.timeout(30):
        while not pull_records(shared, digest):
            await asyncio.sleep(0.05)
    pool.upgrader.set_max_unavailable(1)
    return target


def pulls_of(shared: Path, image: str) -> list[PullRecord]:
    """Each host's pull of the image, by its start (pool_rollouts.merged_pulls)."""
    return merged_pulls(shared, image.split("@")[1])


async def lane_through(pool: HostedPool) -> dict[str, Any]:
    """The lane's Lease: given back, with every rank through."""
    lease = pool.kube.get("Lease", LANE, namespace="np-upgrade")
    assert not lease["spec"].get("holderIdentity"), lease
    assert lease["metadata"]["annotations"]["image-mode.openshift.io/passed"] == \
        f"0-{len(pool.nodes) - 1}", lease  # fmt: skip
    return lease


def unbounded_events(pool: HostedPool) -> list[dict[str, Any]]:
    return [e for e in pool.kube.list("events") if e.get("reason") == "PrestageUnbounded"]


async def bounded_prepulls_in_the_upgraders_order(backend: StandInHosted, base: Path) -> None:
    """The default bound (one lane: the upgrader's maxUnavailable when none is set): the
    pre-pulls run one at a time, in the order the upgrader picks the Nodes, each done before
    its Node's turn (the first Node is picked during its pre-pull and adopts it)."""
    pool = await HostedPool.create(base, nodes=3, agent_args=["--refused-retry", "1"],
                                   backend=backend, logs=True, reboot_seconds=3.0)  # fmt: skip
    try:
        image, shared = shared_image(pool, base, pull_seconds=2.0)
        pool.start_agents()
        await pool.kube.wait_for_watches(3, "configmaps", timeout=30)
        t = time.monotonic()
        target = await picks_held_until_the_first_prepull(pool, image, shared)
        await pool.wait_complete(target, timeout=120)
        picks = {n: pool.first(n, lambda a: a.get(P + "desiredConfig") == target, t) or 0.0
                 for n in pool.nodes}  # fmt: skip
        order = sorted(pool.nodes, key=lambda n: picks[n])
        assert order == ["np-0", "np-1", "np-2"], picks  # the Machines' order
        records = pulls_of(shared, image)
        assert [r.host for r in records] == order, records  # one pull each, in pick order
        for before, after in itertools.pairwise(records):
            assert before.end is not None and before.end <= after.start + 0.1  # one at a time
        for r in records[1:]:
            assert r.end is not None and r.end <= picks[r.host], (r, picks)  # there in time
        await lane_through(pool)
        assert not unbounded_events(pool)
        assert pool.most_selected(target) == 1
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
    finally:
        await pool.close()


async def a_node_picked_out_of_order_leaves_the_queue(backend: StandInHosted, base: Path) -> None:
    """The upgrader lists the Machines in an order the agents cannot know (here np-0, np-2,
    np-1, np-3; the agents guess the Machines' names): np-2 is picked while np-1 pre-pulls
    through the lane and np-3 waits. np-2 leaves the queue at its turn and pulls without the
    lane, so the lane goes to np-3 as soon as np-1 is through, while np-2 still pulls: np-3
    does not wait for np-2's turn. Then np-1 and np-3 find their image pulled at their turn."""
    cache = ["np-machine-0", "np-machine-2", "np-machine-1", "np-machine-3"]
    backend.listing = lambda machines: sorted(machines, key=lambda m: cache.index(m.name))
    # Pulls (5 s) longer than a turn's drain and reboot (2 s and what the agents take), so that
    # np-2's turn comes while np-1 still pre-pulls; and shorter than three of them, so that
    # np-3's pre-pull is over by its turn.
    pool = await HostedPool.create(base, nodes=4, agent_args=["--refused-retry", "1"],
                                   backend=backend, logs=True, reboot_seconds=2.0)  # fmt: skip
    try:
        image, shared = shared_image(pool, base, pull_seconds=5.0)
        pool.start_agents()
        await pool.kube.wait_for_watches(4, "configmaps", timeout=30)
        t = time.monotonic()
        target = await picks_held_until_the_first_prepull(pool, image, shared)
        await pool.wait_complete(target, timeout=120)
        picks = {n: pool.first(n, lambda a: a.get(P + "desiredConfig") == target, t) or 0.0
                 for n in pool.nodes}  # fmt: skip
        assert sorted(pool.nodes, key=lambda n: picks[n]) == ["np-0", "np-2", "np-1", "np-3"]
        records = {r.host: r for r in pulls_of(shared, image)}
        assert len(records) == 4, records
        ends = {name: r.end or 0.0 for name, r in records.items()}
        # np-2 pulled at its turn: its pull began after its pick, while np-1 pre-pulled.
        turn, holder, after = records["np-2"], records["np-1"], records["np-3"]
        assert turn.start >= picks["np-2"] and holder.start < picks["np-2"] < ends["np-1"]
        # ... and np-3's pre-pull began while np-2 was still pulling (it waited for np-1 only).
        assert ends["np-1"] - 0.2 <= after.start < ends["np-2"] - 0.3, records
        for name in ("np-1", "np-3"):
            assert ends[name] <= picks[name], (name, records, picks)  # pulled before the turn
        log = pool.log_path("np-2").read_text()
        assert "turn pulls without its lane (another node holds it); out of its queue" in log
        await lane_through(pool)
        assert pool.reboots() == dict.fromkeys(pool.nodes, 1)
    finally:
        await pool.close()


async def prestage_unbounded_without_the_role(backend: StandInHosted, base: Path) -> None:
    """Without deploy/hypershift/rbac.yaml's pre-pull grants (the kit's ConfigMap Role only)
    the Node list is refused: every node says so in a PrestageUnbounded Warning Event naming
    the missing Roles, pre-stages after the jitter (0 here) as before the bound, and the
    rollout completes."""
    pool = await HostedPool.create(base, nodes=3, agent_args=ARGS, backend=backend)
    try:
        pool.start_agents()
        target = await pool.set_target(payload(pool, "slow", keys=[KEY]))
        await pool.wait_complete(target, timeout=90)
        events = unbounded_events(pool)
        # Every node that pre-staged (the first one's turn may come before it tries).
        named = {e["involvedObject"]["name"] for e in events}
        assert named <= set(pool.nodes) and len(named) >= len(pool.nodes) - 1, events
        for event in events:
            assert event["type"] == "Warning", event
            for words in ("403", "cannot list resource", "image-mode-agent-prepull",
                          "image-mode-agent-nodepool-order", "deploy/hypershift/rbac.yaml",
                          "pre-pulling after a random delay up to 0 s"):  # fmt: skip
                assert words in event["message"], (words, event["message"])
        assert pool.kube.list("leases", namespace="np-upgrade") == []
        turns = {name: fetched_at_turn(pool, name) for name in pool.nodes}
        assert sum(1 for t in turns.values() if t and all(b == 0 for b in t)) >= 2, turns
    finally:
        await pool.close()


BOUNDED = [bounded_prepulls_in_the_upgraders_order, a_node_picked_out_of_order_leaves_the_queue]
