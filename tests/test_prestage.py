"""Pool-wide pre-staging: the pure decision, the engine's locked pre-stage, and the real agent
process following its pool on the loopback API server with a simulated host (the real
machine-config-controller rollout is in tests/conformance/test_mcc.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from agent.cluster.annotations import NodeView
from agent.cluster.lane_lease import micro_time
from agent.cluster.prestage import Act, decide, pool_target
from agent.model.imageref import parse_image_ref
from agent.update.engine import DONE
from agent.update.journal import Journal
from standins.bootc_releases import PERSONAS, features_of
from standins.demo.loopback import SA_RULES, SCOPED_SA_RULES, Cluster, P
from standins.host.simulated import SimulatedBootc
from tests.scenarios.harness import free_port, metric, until, wait_metric
from tests.simhost import Killed, World

WORKER = {"node-role.kubernetes.io/worker": ""}
KEYS = ["ssh-ed25519 AAAA-one"]  # rendered-worker-1's keys: an image-only change


# -- the decision (pure) ---------------------------------------------------------------------
def view(current: str | None, desired: str | None, state: str = "Done") -> NodeView:
    annotations = {P + "currentConfig": current, P + "desiredConfig": desired, P + "state": state}
    return NodeView("n", {k: v for k, v in annotations.items() if v is not None})


layered = NodeView("n", {**view("r1", "r1").annotations, P + "currentImage": "q/os@sha256:1",
                         P + "desiredImage": "q/os@sha256:1"})  # fmt: skip


@pytest.mark.parametrize(
    ("node", "target", "idle", "act"),
    [
        (view("r1", "r1"), "r2", True, Act.STAGE),
        (view("r1", "r1"), None, True, Act.DROP),  # the pool names nothing
        (view("r1", "r1"), "r1", True, Act.DROP),  # nothing ahead of the node
        (view("r1", "r2", "Working"), "r2", True, Act.HANDOVER),  # its turn came
        (view("r1", "r2"), "r2", True, Act.HANDOVER),  # its turn, before Working is written
        (view("r1", "r2", "Degraded"), "r3", True, Act.WAIT),  # failing: start nothing
        (view("r1", "r1", "Degraded"), "r2", True, Act.WAIT),
        (view("r1", "r1"), "r2", False, Act.WAIT),  # the journal is mid-update
        (view(None, None), "r2", True, Act.WAIT),  # not bootstrapped yet
        (layered, "r2", True, Act.DROP),  # on-cluster layering: the image is not osImageURL
    ],
)
def test_decide(node: NodeView, target: str | None, idle: bool, act: Act) -> None:
    decision = decide(node, target, journal_idle=idle)
    assert decision.act == act, decision.reason
    assert (decision.target == target) if act == Act.STAGE else decision.target is None


def test_pool_target() -> None:
    assert pool_target({"spec": {"configuration": {"name": "rendered-worker-9"}}}) == (
        "rendered-worker-9"
    )
    assert pool_target({"spec": {}}) is None
    assert pool_target(None) is None


# -- the engine ------------------------------------------------------------------------------
def pulls(sim, digest: str) -> int:
    return sum(1 for a in sim.actions() if a["kind"] == "pull" and digest in a["detail"])


async def test_engine_prestages_locked_and_the_update_pulls_nothing_more(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    assert (await world.converge(world.desired("r1", "v1"))).state == DONE
    ahead = world.desired("r2", "v2")
    engine = world.engine()
    assert str(await engine.prestage(ahead)) == "staged"
    staged = world.sim.status_document()["status"]["staged"]
    assert staged["image"]["imageDigest"] == world.digest("v2") and staged["downloadOnly"]
    assert engine.prestaged() == world.images["v2"]
    assert str(await engine.prestage(ahead)) == "already-staged"
    assert pulls(world.sim, world.digest("v2")) == 3  # three layers, once
    outcome = await world.converge(ahead)
    assert (outcome.state, world.booted()) == (DONE, world.digest("v2"))
    assert pulls(world.sim, world.digest("v2")) == 3  # the turn found it staged
    assert world.reboots() == 1
    assert world.engine().prestaged() is None  # the update consumed the pre-stage


@pytest.mark.parametrize("version", PERSONAS)
async def test_a_prestage_is_locked_or_nothing_is_staged_on_every_bootc(
    tmp_path: Path, version: str
) -> None:
    """Whatever this bootc can do, a pre-stage never leaves a deployment an ordinary reboot
    boots: staged locked where bootc can lock, else pre-pulled or skipped with nothing staged;
    the reboot before the node's turn boots the running image."""
    world = World.create(tmp_path)
    world.sim.set_bootc_version(version)
    await world.converge(world.desired("r1", "v1"))
    engine = world.engine()
    result = await engine.prestage(world.desired("r2", "v2"))
    staged = world.sim.status_document()["status"]["staged"]
    if "switch-download-only" in features_of(version):
        assert str(result) == "staged"
        [(fetched, locked)] = world.sim.stages(world.digest("v2"))
        assert fetched > 0 and locked
        assert staged["downloadOnly"] is True
    else:
        assert result.outcome in ("pulled", "skipped"), result
        assert staged is None and world.sim.stages(world.digest("v2")) == []
    await world.sim.host(lambda path: True).system.reboot()  # an admin's, before the turn
    assert world.sim.boot() and world.booted() == world.digest("v1")
    outcome = await world.converge(world.desired("r2", "v2"))  # the turn: one more reboot
    assert (outcome.state, world.booted(), world.reboots()) == (DONE, world.digest("v2"), 2)


async def test_engine_prestage_killed_at_every_step(tmp_path: Path) -> None:
    labels: list[str] = []
    world = World.create(tmp_path / "probe")
    await world.converge(world.desired("r1", "v1"))
    await world.engine(checkpoint=labels.append).prestage(world.desired("r2", "v2"))
    assert labels == ["journal:idle", "did:prestage"]
    for k, label in enumerate(labels):
        world = World.create(tmp_path / str(k))
        await world.converge(world.desired("r1", "v1"))

        def die(seen: str, at: str = label) -> None:
            if seen == at:
                raise Killed(at)

        with pytest.raises(Killed):
            await world.engine(checkpoint=die).prestage(world.desired("r2", "v2"))
        assert world.engine().prestaged() == world.images["v2"]  # the intent came first
        assert str(await world.engine().prestage(world.desired("r2", "v2"))) in (
            "staged",
            "already-staged",
        )
        outcome = await world.converge(world.desired("r2", "v2"))
        assert (outcome.state, world.booted(), world.reboots()) == (DONE, world.digest("v2"), 1)
        assert pulls(world.sim, world.digest("v2")) == 3, label


async def test_engine_prestage_skips_what_is_no_image_update(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    await world.converge(world.desired("r1", "v1", keys=["k1"]))
    engine = world.engine()
    result = await engine.prestage(world.desired("r2", "v1", keys=["k2"]))
    assert result.skipped and "live" in result.note
    assert world.sim.status_document()["status"]["staged"] is None
    assert engine.prestaged() is None


async def test_engine_prestage_never_runs_beside_an_update(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    await world.converge(world.desired("r1", "v1"))
    engine = world.engine()
    assert (await engine.reconcile(world.desired("r2", "v2"))).state == "Rebooting"
    result = await world.engine().prestage(world.desired("r3", "bad-check"))
    assert str(result) == "skipped: an update is in flight (phase rebooting)"


async def test_engine_drops_a_prestage_no_longer_wanted(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    await world.converge(world.desired("r1", "v1"))
    engine = world.engine()
    await engine.prestage(world.desired("r2", "v2"))
    assert await engine.drop_prestage() is True
    assert engine.prestaged() is None
    assert await engine.drop_prestage() is False
    # The locked deployment left behind is never booted by an ordinary reboot.
    await world.sim.host(lambda path: True).system.reboot()
    assert world.sim.boot()
    assert world.booted() == world.digest("v1")
    assert world.sim.status_document()["status"]["staged"] is None


# -- the agent process -------------------------------------------------------------------------


def pool(name: str, target: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfigPool",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": selector},
                 "configuration": {"name": target}, "maxUnavailable": 1},
    }  # fmt: skip


class Pools:
    """The cluster plus the pool objects and the agent's metrics."""

    def __init__(self, cluster: Cluster, labels: dict[str, str]) -> None:
        self.c = cluster
        node = cluster.kube.get("Node", cluster.node)
        node["metadata"]["labels"] = labels
        cluster.kube.put(node)
        self.port = free_port()

    def set_pool(self, name: str, target: str, selector: dict[str, str] = WORKER) -> None:
        self.c.kube.put(pool(name, target, selector))

    async def start(self, *extra: str) -> asyncio.subprocess.Process:
        return await self.c.start_agent("--listen", f"127.0.0.1:{self.port}",
                                        "--prestage-jitter", "0", "--prestage-retry", "0.3",
                                        *extra)  # fmt: skip

    async def running(self) -> asyncio.subprocess.Process:
        """The agent started, its Node Done at rendered-worker-1, the pool there too, and the
        agent's first pass over (its one start-up write made)."""
        self.set_pool("worker", "rendered-worker-1")
        proc = await self.start()
        await self.c.wait_done("rendered-worker-1")
        await self.wait_metric('image_mode_agent_phase{phase="idle"}', 1)
        return proc

    async def metric(self, line_prefix: str) -> float:
        return await metric(self.port, line_prefix)

    async def wait_metric(self, line_prefix: str, at_least: float, timeout: float = 20) -> None:
        await wait_metric(self.port, line_prefix, at_least, timeout)

    def staged(self) -> dict[str, Any] | None:
        return self.c.sim.status_document()["status"]["staged"]

    def staged_digest(self) -> str | None:
        return ((self.staged() or {}).get("image") or {}).get("imageDigest")

    async def wait_staged(self, image: str, timeout: float = 20) -> None:
        digest = self.c.images[image].split("@")[1]
        await until(lambda: self.staged_digest() == digest, timeout)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.c.kube.list("Event", namespace="default")
                if e.get("reason") == reason]  # fmt: skip

    async def wait_events(self, reason: str, timeout: float = 10) -> list[dict[str, Any]]:
        """The Events with this reason, once there is one: the agent posts an Event after it
        sets the metric a test waits for."""
        await until(lambda: self.events(reason), timeout, f"an Event {reason}")
        return self.events(reason)

    def journal_prestage(self) -> str | None:
        return Journal(self.c.sim.root / "var/lib/image-mode-agent/journal.json").load().prestage

    def watched_pools(self) -> set[str]:
        return {r.query.get("fieldSelector", "").removeprefix("metadata.name=")
                for r in self.c.kube.requests
                if r.verb == "watch" and r.resource == "machineconfigpools"}  # fmt: skip

    def pool_lists(self, status: int | None = None) -> int:
        return self.c.kube.count_requests(verb="list", resource="machineconfigpools",
                                          status=status)  # fmt: skip

    def pulls(self, image: str) -> int:
        return pulls(self.c.sim, self.c.images[image].split("@")[1])


@pytest.fixture
async def pools(tmp_path: Path):
    cluster = await Cluster.create(tmp_path)
    yield Pools(cluster, dict(WORKER))
    await cluster.close()


def untouched(annotations: dict[str, str], node: dict[str, Any]) -> None:
    """What the controller reads to count the node unavailable did not change."""
    assert annotations[P + "state"] == "Done"
    assert annotations[P + "currentConfig"] == annotations[P + "desiredConfig"]
    assert P + "desiredDrain" not in annotations
    assert not node.get("spec", {}).get("unschedulable")


async def test_pool_target_prestaged_then_the_turn_pulls_nothing(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    await pools.running()
    writes = c.node_writes()
    pools.set_pool("worker", "rendered-worker-2")  # the pool moves; this node's turn is later
    await pools.wait_staged("slow")
    assert pools.staged()["downloadOnly"] is True  # an ordinary reboot would not apply it
    await pools.wait_metric('image_mode_agent_prestage_state{state="staged"}', 1)
    untouched(c.annotations(), c.kube.get("Node", c.node))
    assert c.node_writes() == writes  # the Node was not written at all
    assert [e["type"] for e in await pools.wait_events("OSImagePrestaged")] == ["Normal"]
    assert pools.journal_prestage() == c.images["slow"]
    c.kube.enable_drain_controller()
    c.set_desired("rendered-worker-2")
    assert await asyncio.wait_for(c.procs[-1].wait(), 20) == 3  # drained, rebooting
    await pools.start()
    await c.wait_done("rendered-worker-2")
    assert c.booted() == c.images["slow"].split("@")[1]
    assert pools.pulls("slow") == 3 and c.reboots() == 1  # one pull, before the turn


async def test_a_reboot_between_the_prestage_and_the_turn_boots_the_current_image(
    pools: Pools,
) -> None:
    """An administrator reboots the node after its pool's target was pre-staged, before the
    controller picks it: the pre-stage was locked, so the node comes back on its current
    image, Done and schedulable, with nothing written; its turn then reboots it once more,
    into the target, fetching nothing (the layers stayed cached)."""
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    await pools.running()
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_staged("v2")
    v2 = c.images["v2"].split("@")[1]
    assert [locked for _, locked in c.sim.stages(v2)] == [True]  # asked for locked
    proc = c.procs[-1]
    proc.send_signal(signal.SIGTERM)  # the shutdown stops the agent, then the host reboots
    await asyncio.wait_for(proc.wait(), 20)
    await c.sim.host(lambda path: True).system.reboot()
    writes = c.node_writes()
    await pools.start()  # the next boot
    await pools.wait_metric('image_mode_agent_phase{phase="idle"}', 1)
    assert c.booted() == c.images["v1"].split("@")[1]  # the pre-stage was not booted
    assert c.reboots() == 1  # the administrator's
    untouched(c.annotations(), c.kube.get("Node", c.node))
    assert c.node_writes() == writes
    c.kube.enable_drain_controller()
    c.set_desired("rendered-worker-2")
    assert await asyncio.wait_for(c.procs[-1].wait(), 30) == 3
    await pools.start()
    await c.wait_done("rendered-worker-2")
    assert (c.booted(), c.reboots()) == (v2, 2)
    assert c.sim.stages(v2)[-1] == (0, True)  # the turn fetched nothing, staged locked


async def test_on_a_bootc_without_download_only_the_target_is_pre_pulled(pools: Pools) -> None:
    """bootc 1.12.0 cannot stage locked: the pool's target is pulled into the repository with
    nothing staged (any reboot boots the running image), pulled again after an admin's stage
    pruned it, and the node's turn fetches nothing."""
    c = pools.c
    c.sim.set_bootc_version("1.12.0")
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    await pools.running()
    writes = c.node_writes()
    pools.set_pool("worker", "rendered-worker-2")
    await until(lambda: pools.pulls("slow") == 3, 20)
    await pools.wait_metric('image_mode_agent_prestage_state{state="staged"}', 1)
    assert pools.staged() is None  # nothing staged: no reboot of any kind boots it
    untouched(c.annotations(), c.kube.get("Node", c.node))
    assert c.node_writes() == writes
    [event] = await pools.wait_events("OSImagePrepulled")
    assert "bootc 1.12.0 has no switch --download-only" in event["message"]
    assert pools.events("OSImagePrestaged") == []
    # An admin stages something else: bootc's prune drops the pre-pulled image; the next
    # wake-up (here: the pool object touched) finds it gone and pulls it again.
    admin = SimulatedBootc(c.sim)
    await admin.stage(parse_image_ref(c.images["v2"]))
    await admin.stage(parse_image_ref(c.images["v1"]))  # and back: nothing staged
    assert not await admin.pulled(parse_image_ref(c.images["slow"]))
    pools.set_pool("worker", "rendered-worker-2", {**WORKER, "touched": ""})
    await until(lambda: pools.pulls("slow") == 6, 20)
    c.kube.enable_drain_controller()
    c.set_desired("rendered-worker-2")
    assert await asyncio.wait_for(c.procs[-1].wait(), 20) == 3  # drained, rebooting
    await pools.start()
    await c.wait_done("rendered-worker-2")
    assert c.booted() == c.images["slow"].split("@")[1]
    assert pools.pulls("slow") == 6 and c.reboots() == 1  # nothing fetched at the turn
    # One stage of it, the turn's: unlocked, as this bootc can stage nothing else.
    assert c.sim.stages(c.images["slow"].split("@")[1]) == [(0, False)]


async def test_a_new_pool_target_replaces_the_prestage(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    c.add_config("rendered-worker-3", "v2", keys=KEYS)
    await pools.running()
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_metric('image_mode_agent_prestage_state{state="staging"}', 1)
    pools.set_pool("worker", "rendered-worker-3")  # a newer target while the first pulls
    await pools.wait_staged("v2")
    # The slow stage was cancelled before v2's began: none of its layers lands any more. A
    # window longer than one layer of it (4 s / 3): a pull left running would show.
    fetched = pools.pulls("slow")
    await asyncio.sleep(2.0)
    assert pools.pulls("slow") == fetched < 3
    assert pools.staged_digest() == c.images["v2"].split("@")[1]
    assert pools.journal_prestage() == c.images["v2"]
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_killed_while_prestaging_resumes_without_refetching(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    proc = await pools.running()
    pools.set_pool("worker", "rendered-worker-2")
    await until(lambda: pools.pulls("slow") >= 1)  # one layer fetched, two to go
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    assert pools.journal_prestage() == c.images["slow"]  # the intent was written first
    # A huge jitter: a restart resumes its pre-stage at once instead of waiting again.
    await c.start_agent("--prestage-slots", "unbounded", "--prestage-jitter", "100000")
    await pools.wait_staged("slow")
    assert pools.pulls("slow") == 3  # the layer fetched before the kill was kept


async def test_killed_while_prestaging_then_target_withdrawn_is_cleaned(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    proc = await pools.running()
    pools.set_pool("worker", "rendered-worker-2")
    await until(lambda: pools.journal_prestage() is not None)
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    pools.set_pool("worker", "rendered-worker-1")  # the rollout was withdrawn meanwhile
    await pools.start()
    await until(lambda: pools.journal_prestage() is None)
    assert pools.staged() is None
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_failed_prestage_retries_and_never_makes_the_node_unavailable(
    pools: Pools,
) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "missing", keys=KEYS)
    await pools.running()
    writes = c.node_writes()
    pools.set_pool("worker", "rendered-worker-2")
    failures = 'image_mode_agent_prestage_failures_total{kind="image-missing"}'
    await pools.wait_metric(failures, 3)  # retried with backoff
    (event,) = await pools.wait_events("OSImagePrestageFailed")
    assert event["type"] == "Warning" and "image-missing" in event["message"]
    assert "retrying" in event["message"]
    untouched(c.annotations(), c.kube.get("Node", c.node))
    assert c.node_writes() == writes
    assert pools.staged() is None


async def test_out_of_space_stops_the_prestage_with_a_clear_event(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    await pools.running()
    c.sim.set_disk_full(True)
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_metric('image_mode_agent_prestage_state{state="stopped"}', 1)
    await pools.wait_events("OSImagePrestageFailed")  # its report, then nothing
    # A timer's test: a retry (after 0.3 s, plus up to 1 s of jitter) would have failed again.
    await asyncio.sleep(1.5)
    assert await pools.metric('image_mode_agent_prestage_failures_total{kind="disk-space"}') == 1
    (event,) = pools.events("OSImagePrestageFailed")
    assert "out of disk space" in event["message"] and event["type"] == "Warning"
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_jitter_never_delays_the_nodes_turn(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    pools.set_pool("worker", "rendered-worker-1")
    await c.start_agent(
        "--listen",
        f"127.0.0.1:{pools.port}",
        "--prestage-slots",
        "unbounded",
        "--prestage-jitter",
        "100000",
    )
    await c.wait_done("rendered-worker-1")
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_metric('image_mode_agent_prestage_state{state="waiting"}', 1)
    c.kube.enable_drain_controller()
    c.set_desired("rendered-worker-2")  # the turn comes while the pre-stage waits
    assert await asyncio.wait_for(c.procs[-1].wait(), 20) == 3
    await c.start_agent()
    await c.wait_done("rendered-worker-2")


# -- the bounded pre-pull: one lane held by another node ------------------------------------
LANE = "image-mode-prepull-worker-0"


def lane_held_by_the_older_node(c: Cluster, target: str) -> None:
    """A second worker, first in the controller's order (its zone sorts first), still at the
    old config, holding the pool's one lane for `target` (its lease outlasts the test)."""
    mine = c.kube.get("Node", c.node)
    mine["metadata"]["labels"] = {**WORKER, "topology.kubernetes.io/zone": "b"}
    c.kube.put(mine)
    c.kube.put({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "older", "labels": {**WORKER,
                                                          "topology.kubernetes.io/zone": "a"},
                             "annotations": {P + "currentConfig": "rendered-worker-1",
                                             P + "desiredConfig": "rendered-worker-1",
                                             P + "state": "Done"}}})  # fmt: skip
    c.kube.put({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": LANE, "namespace": "openshift-machine-config-operator",
                             "labels": {"image-mode.openshift.io/prepull-pool": "worker"},
                             "annotations": {"image-mode.openshift.io/target": target,
                                             "image-mode.openshift.io/holder-rank": "0",
                                             "image-mode.openshift.io/passed": ""}},
                "spec": {"holderIdentity": "older", "leaseDurationSeconds": 3600,
                         "renewTime": micro_time()}})  # fmt: skip


def lane(c: Cluster) -> dict[str, Any]:
    return c.kube.get("Lease", LANE, namespace="openshift-machine-config-operator")


async def test_a_bounded_prepull_waits_for_its_predecessor_then_passes_the_lane_on(
    pools: Pools,
) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    lane_held_by_the_older_node(c, "rendered-worker-2")
    pools.set_pool("worker", "rendered-worker-1")
    await pools.start("--prestage-slots", "auto")
    await c.wait_done("rendered-worker-1")
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_metric('image_mode_agent_prestage_state{state="queued"}', 1)
    await asyncio.sleep(1.0)
    assert pools.staged() is None and pools.pulls("v2") == 0  # the older node pulls first
    held = lane(c)
    held["spec"].pop("holderIdentity")
    held["metadata"]["annotations"]["image-mode.openshift.io/passed"] = "0"  # its pull is over
    c.kube.put(held)
    await pools.wait_staged("v2")
    # Ranks 0 (the older node) and 1 (this one) through.
    await until(lambda: lane(c)["metadata"]["annotations"]["image-mode.openshift.io/passed"]
                == "0-1", 10)  # fmt: skip
    assert not lane(c)["spec"].get("holderIdentity")  # given back once staged
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_the_turn_never_waits_for_a_lane_another_node_holds(
    pools: Pools, tmp_path: Path
) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    lane_held_by_the_older_node(c, "rendered-worker-2")
    pools.set_pool("worker", "rendered-worker-1")
    log = tmp_path / "agent.log"
    with log.open("w") as stderr:
        await c.start_agent("--listen", f"127.0.0.1:{pools.port}", "--prestage-slots", "auto",
                            log_level="info", stderr=stderr)  # fmt: skip
    await c.wait_done("rendered-worker-1")
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_metric('image_mode_agent_prestage_state{state="queued"}', 1)
    c.kube.enable_drain_controller()
    c.set_desired("rendered-worker-2")  # the turn, while the older node still holds the lane
    assert await asyncio.wait_for(c.procs[-1].wait(), 20) == 3  # staged, drained, rebooting
    assert "turn pulls without its lane (another node holds it); out of its queue" in \
        log.read_text()  # fmt: skip
    assert lane(c)["spec"]["holderIdentity"] == "older"  # not taken from it
    # Out of the queue at its turn (rank 1 through while rank 0 still holds the lane): a node
    # after it would wait for the older node only, not for this turn's pull.
    assert lane(c)["metadata"]["annotations"]["image-mode.openshift.io/passed"] == "1"
    await c.start_agent()
    await c.wait_done("rendered-worker-2")
    assert pools.pulls("v2") == 3 and c.reboots() == 1


async def test_without_the_lease_role_prepulls_go_on_unbounded_and_say_so(
    pools: Pools,
) -> None:
    """An agent upgraded before its RBAC: the Lease is refused (403), so it pre-stages as
    before the bound, after the jitter, with a Warning Event naming the missing Role."""
    c = pools.c
    sa = c.kube.service_account("openshift-machine-config-operator", "machine-config-daemon",
                                [*SA_RULES, *(r for r in SCOPED_SA_RULES
                                              if r.resource != "leases")])  # fmt: skip
    c.kube.write_kubeconfig(c.base / "sa.kubeconfig", sa)
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    await pools.running()
    pools.set_pool("worker", "rendered-worker-2")
    await pools.wait_staged("v2")
    (event,) = pools.events("PrestageUnbounded")
    assert event["type"] == "Warning" and "image-mode-agent-prepull" in event["message"]
    assert "403" in event["message"]
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_custom_pool_is_followed_not_worker(pools: Pools) -> None:
    c = pools.c
    node = c.kube.get("Node", c.node)
    node["metadata"]["labels"] = {**WORKER, "node-role.kubernetes.io/infra": ""}
    c.kube.put(node)
    c.add_config("rendered-worker-2", "slow", keys=KEYS)
    c.add_config("rendered-infra-2", "v2", keys=KEYS)
    pools.set_pool("worker", "rendered-worker-2")
    pools.set_pool("infra", "rendered-infra-2", {"node-role.kubernetes.io/infra": ""})
    await pools.start()
    await c.wait_done("rendered-worker-1")
    await pools.wait_staged("v2")
    assert pools.watched_pools() == {"infra"}
    assert pools.pulls("slow") == 0


async def test_two_custom_pools_mean_no_prestage_and_a_warning(pools: Pools) -> None:
    c = pools.c
    node = c.kube.get("Node", c.node)
    node["metadata"]["labels"] = {**WORKER, "a": "", "b": ""}
    c.kube.put(node)
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    for name in ("a", "b"):
        pools.set_pool(name, "rendered-worker-2", {name: ""})
    await pools.start()
    await c.wait_done("rendered-worker-1")
    (event,) = await pools.wait_events("PrestageSkipped")
    assert "2 custom pools (a, b)" in event["message"]
    # The event is sent as the pool is found unusable, before the step ends: a pre-stage
    # started in spite of it would be staged (v2 pulls at once) within this second.
    await asyncio.sleep(1.0)
    assert pools.staged() is None
    untouched(c.annotations(), c.kube.get("Node", c.node))


async def test_no_pool_no_prestage(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    pools.set_pool("master", "rendered-worker-2", {"node-role.kubernetes.io/master": ""})
    await pools.start()
    await c.wait_done("rendered-worker-1")
    await until(lambda: pools.pool_lists(200), what="the agent's list of the pools")
    # A pool picked from that answer would be listed and watched right after it, and v2
    # staged within the half second.
    await asyncio.sleep(0.5)
    assert pools.staged() is None
    assert pools.watched_pools() == set()
    assert c.procs[-1].returncode is None


async def test_prestage_off_follows_no_pool(pools: Pools) -> None:
    c = pools.c
    c.add_config("rendered-worker-2", "v2", keys=KEYS)
    pools.set_pool("worker", "rendered-worker-2")
    await pools.start("--prestage", "off")
    # Its first pass is over: a pre-stager (started before it) would have asked for the
    # pools during it.
    await pools.wait_metric('image_mode_agent_phase{phase="idle"}', 1)
    assert pools.pool_lists() == 0
    assert pools.staged() is None
    assert pools.watched_pools() == set()
