"""The error paths of an image update, each driven to its end: what the Node, the journal and
the host show while the fault holds, and that the update then finishes with exactly the reboots
it needs (or, where nothing can heal it, stays put without a reboot loop).

- a drain the drain controller never acknowledges (`--drain-timeout`),
- a reboot request the host refuses,
- a `bootc rollback` that fails after the new image failed its required check,
- a required health check that times out or is not executable, and a wanted one that is not.

The first three run the real agent process against the loopback API server (what the Node
shows); the health checks run the engine in-process on the simulated host (tests/simhost.py),
where the check timeout can be short."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent.app.cli import main as cli_main
from agent.update.engine import DEGRADED, DONE
from agent.update.journal import Journal, Phase, Record
from standins.demo.loopback import IMAGE, Cluster, P
from standins.host.simulated import SimulatedHost
from tests.scenarios.fake import annotation_tracker, start_logged
from tests.scenarios.harness import exits, until
from tests.simhost import World

CHECKS = "etc/image-mode-agent/check"
NOT_EXECUTABLE = "not executable (mode 0644): chmod +x it or remove it"


@pytest.fixture
async def cluster(tmp_path: Path):
    c = await Cluster.create(tmp_path)
    yield c
    await c.close()


# -- what the tests read -------------------------------------------------------------------------
def journal(sim: SimulatedHost) -> Record:
    return Journal(sim.root / "var/lib/image-mode-agent/journal.json").load()


def host_state(sim: SimulatedHost) -> dict[str, Any]:
    return json.loads((sim.base / "host.json").read_text())


def actions(sim: SimulatedHost, kind: str) -> list[str]:
    return [a["detail"] for a in sim.actions() if a["kind"] == kind]


def events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.kube.list("events", "default") if e["reason"] == reason]


def node_spec(cluster: Cluster) -> dict[str, Any]:
    return cluster.kube.get("Node", cluster.node).get("spec") or {}


def track_states(cluster: Cluster) -> list[str]:
    """Every value the Node's `state` annotation takes from now on: a retry that fails the
    same way must add nothing (no Working, Degraded, Working...)."""
    states: list[str] = []
    cluster.kube.add_hook(annotation_tracker(P + "state", states))
    return states


async def degraded(cluster: Cluster, proc: asyncio.subprocess.Process) -> dict[str, str]:
    """The Node's annotations once it is Degraded; fails at once if the agent exits first (a
    simulated reboot ends it) rather than waiting out the deadline."""
    node = asyncio.ensure_future(
        cluster.wait_annotations(lambda a: a.get(P + "state") == "Degraded", timeout=30)
    )
    ended = asyncio.ensure_future(proc.wait())
    await asyncio.wait({node, ended}, return_when=asyncio.FIRST_COMPLETED)
    if not node.done():
        node.cancel()
        raise AssertionError(f"the agent exited {proc.returncode} before the Node was Degraded")
    ended.cancel()
    return node.result()


# -- drain -----------------------------------------------------------------------------------------
async def test_a_drain_never_acknowledged_degrades_and_retries_until_it_is(
    cluster: Cluster,
) -> None:
    """No drain controller answers: after --drain-timeout the Node is Degraded with the timeout
    and a FailedToDrain warning Event; nothing rebooted, the journal stays at `staging` (the
    update resumes from there) and the staged image stays locked, so an unplanned reboot would
    discard it rather than boot it undrained. Retries that time out the same way write nothing;
    once the controller answers, the update finishes with one reboot."""
    agent = await start_logged(cluster, "--drain-timeout", "2", level="info")
    proc = agent.proc
    await cluster.wait_done("rendered-worker-1")
    states = track_states(cluster)
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")

    annotations = await degraded(cluster, proc)
    reason = "failed to drain node: no acknowledgement of drain-rendered-worker-2 after 2s"
    assert annotations[P + "reason"] == reason
    assert annotations[P + "desiredDrain"] == "drain-rendered-worker-2"
    assert P + "lastAppliedDrain" not in annotations
    # Posted right after the Degraded state is written.
    await until(lambda: events(cluster, "FailedToDrain"), what="a FailedToDrain Event")
    failed = events(cluster, "FailedToDrain")
    assert [(e["type"], e["message"]) for e in failed] == [("Warning", reason)]
    assert (cluster.reboots(), proc.returncode) == (0, None)
    rec = journal(cluster.sim)
    assert (rec.phase, rec.boot_id, rec.reboots) == (Phase.STAGING, None, 0)
    assert rec.target == cluster.images["v2"]
    staged = host_state(cluster.sim)["staged"]
    assert (staged["digest"], staged["locked"]) == (cluster.images["v2"].split("@")[1], True)
    assert cluster.booted() == cluster.images["v1"].split("@")[1]

    # A retry pass begins; a change to the Node brings the next one as soon as it ends (not
    # at the backoff's 5 s), so the second one beginning shows the first timed out again, and
    # wrote nothing to the Node.
    await agent.wait_logged("resuming", "staging")  # a retry pass
    cluster.kube.patch_annotations("Node", cluster.node, {"example.com/touched": "yes"})
    await agent.wait_logged("resuming", "staging", count=2)  # and the next
    assert states == ["Working", "Degraded"]
    assert node_spec(cluster).get("unschedulable") is None  # nobody drained it

    cluster.kube.enable_drain_controller()
    assert await exits(proc) == 3
    await cluster.start_agent("--drain-timeout", "2")
    annotations = await cluster.wait_done("rendered-worker-2")
    assert cluster.reboots() == 1
    assert cluster.booted() == cluster.images["v2"].split("@")[1]
    assert annotations[P + "lastAppliedDrain"] == "uncordon-rendered-worker-2"
    assert len(events(cluster, "FailedToDrain")) == 1
    assert states == ["Working", "Degraded", "Working", "Done"]


async def test_a_self_drain_the_budget_never_allows_degrades_cordoned_and_never_reboots(
    cluster: Cluster,
) -> None:
    """`--drain self` with a PodDisruptionBudget that never allows the eviction and a 2-s
    `--drain-timeout`: Degraded with the deadline and the pod that blocks, a FailedToDrain
    warning Event, the node still cordoned, no reboot and no bootc call after the stage (the
    staged image stays locked). Once the budget allows, it drains and reboots once."""
    kube = cluster.kube
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}})
    kube.put({"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "db-0", "namespace": "apps", "labels": {"app": "db"}},
              "spec": {"nodeName": cluster.node, "containers": [{"name": "c", "image": "x"}]},
              "status": {"phase": "Running"}})  # fmt: skip
    kube.put({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": "db", "namespace": "apps"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})  # fmt: skip
    proc = await cluster.start_agent("--drain", "self", "--drain-timeout", "2")
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")

    annotations = await degraded(cluster, proc)
    reason = "failed to drain node after 2s: blocked by PodDisruptionBudget: apps/db-0"
    assert annotations[P + "reason"] == reason
    await until(lambda: events(cluster, "FailedToDrain"), what="a FailedToDrain Event")
    assert [(e["type"], e["message"]) for e in events(cluster, "FailedToDrain")] == [
        ("Warning", reason)
    ]
    assert node_spec(cluster).get("unschedulable") is True  # still cordoned
    assert kube.try_get("pods", "db-0", "apps") is not None
    assert (cluster.reboots(), proc.returncode) == (0, None)
    bootc = [a["detail"] for a in cluster.sim.actions() if a["kind"] in ("bootc", "reboot")]
    assert bootc[-1].startswith("switch --transport registry --download-only ")  # the stage
    staged = host_state(cluster.sim)["staged"]
    assert (staged["digest"], staged["locked"]) == (cluster.images["v2"].split("@")[1], True)
    assert journal(cluster.sim).phase == Phase.STAGING  # resumed from there on the next pass

    kube.delete("poddisruptionbudgets", "db", "apps")  # the budget allows it now
    assert await exits(proc) == 3
    evicted = kube.try_get("pods", "db-0", "apps")  # gone, or Terminating with no kubelet
    assert evicted is None or evicted["metadata"].get("deletionTimestamp")
    await cluster.start_agent("--drain", "self", "--drain-timeout", "2")
    await cluster.wait_done("rendered-worker-2")
    assert (cluster.reboots(), cluster.booted()) == (1, cluster.images["v2"].split("@")[1])
    assert not node_spec(cluster).get("unschedulable")


# -- reboot ----------------------------------------------------------------------------------------
async def test_a_refused_reboot_degrades_and_reboots_once_when_allowed(cluster: Cluster) -> None:
    """The host refuses the reboot request: the Node is Degraded with `host error (systemd)`,
    the journal records the request with this boot's ID (so the next pass sees no boot and asks
    again, never verifies), the host logged no reboot, and the drained node keeps its reason.
    Retries refused the same way write nothing; when the host allows it, exactly one reboot,
    then Done and uncordoned."""
    cluster.kube.enable_drain_controller()
    cluster.sim.set_reboot_fails()
    proc = await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    boot_id = host_state(cluster.sim)["boot_id"]
    states = track_states(cluster)
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")

    annotations = await degraded(cluster, proc)
    assert annotations[P + "reason"] == (
        "host error (systemd): org.freedesktop.DBus.Error.InteractiveAuthorizationRequired: "
        "Interactive authentication required."
    )
    assert annotations[P + "lastAppliedDrain"] == "drain-rendered-worker-2"
    assert node_spec(cluster).get("unschedulable") is True
    rec = journal(cluster.sim)
    assert (rec.phase, rec.boot_id) == (Phase.REBOOTING, boot_id)
    assert host_state(cluster.sim)["boot_id"] == boot_id
    assert cluster.reboots() == 0
    assert host_state(cluster.sim)["reboot_pending"] is None
    assert len(actions(cluster.sim, "boot")) == 1  # the host's first boot only

    # The retry (at once: its own writes woke it) is refused too, and writes nothing.
    await until(lambda: len(actions(cluster.sim, "reboot-refused")) >= 2, what="a retried reboot")
    assert proc.returncode is None
    assert states == ["Working", "Degraded"]

    assert cli_main(["sim", "reboot-fails", str(cluster.sim.base), "--off"]) == 0
    # Any change to the Node brings the next retry at once, not after the backoff (5 or 15 s).
    cluster.kube.patch_annotations("Node", cluster.node, {"example.com/touched": "yes"})
    assert await exits(proc) == 3
    assert cluster.reboots() == 1
    await cluster.start_agent()
    annotations = await cluster.wait_done("rendered-worker-2")
    assert cluster.reboots() == 1
    assert cluster.booted() == cluster.images["v2"].split("@")[1]
    assert annotations[P + "reason"] == ""
    assert annotations[P + "lastAppliedDrain"] == "uncordon-rendered-worker-2"
    assert not node_spec(cluster).get("unschedulable")
    assert journal(cluster.sim).phase == Phase.IDLE
    assert states == ["Working", "Degraded", "Working", "Done"]


# -- rollback --------------------------------------------------------------------------------------
async def test_a_failed_rollback_degrades_on_the_bad_image_without_a_reboot_loop(
    cluster: Cluster,
) -> None:
    """The new image fails its required check and `bootc rollback` fails: the Node is
    Degraded with the check's cause and the rollback's error, the journal is `degraded` with the
    digest marked failed, the host stays booted on the bad image with nothing queued, and the
    node stays cordoned (it does not run its last good config). A new process life (a restart)
    reports the same and reboots nothing: one reboot in all. Rolled back by hand, the node is
    uncordoned."""
    cluster.kube.enable_drain_controller()
    assert cli_main(["sim", "rollback-fails", str(cluster.sim.base)]) == 0
    proc = await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    bad = cluster.images["bad"].split("@")[1]
    cluster.add_config("rendered-worker-3", "bad")
    cluster.set_desired("rendered-worker-3")
    assert await exits(proc) == 3  # into the bad image
    proc = await cluster.start_agent()

    annotations = await degraded(cluster, proc)
    reason = (
        f"required health check failed on {bad}: 50-app: exit 1: app unhealthy (no); "
        "rollback failed: error: Rollback: Writing bootloader entries: Read-only file system "
        "(os error 30)"
    )
    assert annotations[P + "reason"] == reason
    assert annotations[P + "currentConfig"] == "rendered-worker-1"
    assert [e["message"] for e in events(cluster, "FailedToReconcile")] == [reason]
    rec = journal(cluster.sim)
    assert (rec.phase, rec.cause) == (Phase.DEGRADED, reason)
    assert rec.failed == {bad: rec.update_key}
    status = cluster.sim.status_document()["status"]
    assert (cluster.booted(), status["rollbackQueued"]) == (bad, False)
    assert cluster.reboots() == 1
    # Still drained: workloads do not come back to the image that failed its check.
    assert annotations[P + "desiredDrain"] == "drain-rendered-worker-3"
    assert node_spec(cluster).get("unschedulable") is True

    # A restart runs a whole pass (its FailedToReconcile is posted again: 409) and stays put.
    posted = cluster.kube.count_requests(verb="create", resource="events")
    proc.terminate()
    assert await exits(proc) == 0
    proc = await cluster.start_agent()
    await until(
        lambda: cluster.kube.count_requests(verb="create", resource="events") > posted,
        what="a pass of the restarted agent",
    )
    assert proc.returncode is None
    assert cluster.reboots() == 1
    assert cluster.booted() == bad
    assert journal(cluster.sim).phase == Phase.DEGRADED
    assert cluster.annotations()[P + "reason"] == reason
    assert cluster.annotations()[P + "desiredDrain"] == "drain-rendered-worker-3"

    # Rolled back by hand (`bootc rollback`, reboot), as the reason says: back on its last good
    # image, the node is given back at the agent's first pass.
    proc.terminate()
    assert await exits(proc) == 0
    cluster.sim.set_rollback_fails(False)
    admin = cluster.sim.host(lambda path: False)
    await admin.bootc.rollback()
    await admin.system.reboot()
    await cluster.start_agent()
    annotations = await cluster.wait_annotations(
        lambda a: a.get(P + "lastAppliedDrain") == "uncordon-rendered-worker-1"
    )
    assert (cluster.booted(), cluster.reboots()) == (cluster.images["v1"].split("@")[1], 2)
    assert not node_spec(cluster).get("unschedulable")


# -- health checks ---------------------------------------------------------------------------------
def _admin_check(world: World, kind: str, name: str, mode: int) -> None:
    """A check the admin put on the host (in /etc: it stays across deployments)."""
    path = world.sim.root / CHECKS / f"{kind}.d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)


def _exits_1(world: World) -> tuple[str, str]:
    return "bad-check", "50-app: exit 1: app unhealthy (no)"


def _times_out(world: World) -> tuple[str, str]:
    world.check_timeout = 0.5
    slow = {f"{CHECKS}/required.d/60-slow": "#!/bin/sh\nexec sleep 30\n"}
    world.images["slow-check"] = world.sim.add_image(
        f"{IMAGE}:v5", {"usr/lib/app/healthy": "yes", **slow}
    )
    return "slow-check", "60-slow: timed out after 0.5s"


def _not_executable(world: World) -> tuple[str, str]:
    _admin_check(world, "required", "70-forgotten", 0o644)
    return "v2", f"70-forgotten: {NOT_EXECUTABLE}"


@pytest.mark.parametrize("failing", [_exits_1, _times_out, _not_executable],
                         ids=["exits-1", "times-out", "not-executable"])  # fmt: skip
async def test_a_required_check_that_cannot_pass_rolls_back(tmp_path: Path, failing) -> None:
    """A required check that times out, or that is not executable, fails the boot's
    verification naming the check, and the image is rolled back exactly as for a check that
    exits 1: two reboots (into it, back), the old image booted, the digest marked failed, and
    the same desired state is not tried again."""
    world = World.create(tmp_path)
    image, detail = failing(world)
    digest = world.digest(image)
    desired = world.desired("rendered-2", image)
    outcome = await world.converge(desired)
    assert outcome.state == DEGRADED
    assert outcome.reason.startswith("rolled back to ")
    assert outcome.reason.endswith(f": required health check failed on {digest}: {detail}")
    assert world.reboots() == 2
    assert world.booted() == world.digest("v1")
    rec = journal(world.sim)
    assert rec.phase == Phase.DEGRADED and digest in rec.failed
    again = await world.engine().reconcile(desired)
    assert (again.state, world.reboots()) == (DEGRADED, 2)


async def test_a_wanted_check_that_is_not_executable_only_warns(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    _admin_check(world, "wanted", "80-forgotten", 0o644)
    _admin_check(world, "required", ".80-notes.swp", 0o644)  # a dotfile is no check
    outcome = await world.converge(world.desired("rendered-2", "v2"))
    assert outcome.state == DONE
    assert (world.reboots(), world.booted()) == (1, world.digest("v2"))
    assert f"wanted check 80-forgotten failed: {NOT_EXECUTABLE}" in world.events
