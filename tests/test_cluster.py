"""The real agent process against the loopback API server, with a simulated host: the faults
and counts only the loopback server gives on demand. The scenarios that also run on the real
kube-apiserver are in tests/scenarios/cluster.py."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
from pathlib import Path

import pytest

from standins.demo.loopback import Cluster, P
from standins.kube import RequestRecord
from tests.builders import ign_file
from tests.fixtures_paths import CONTROLLER_CONFIG
from tests.scenarios.fake import annotation_tracker, start_logged
from tests.scenarios.harness import exits, until

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def cluster(tmp_path: Path):
    c = await Cluster.create(tmp_path)
    yield c
    await c.close()


def track(cluster: Cluster) -> list[str]:
    """Every value `desiredDrain` takes from now on, in order."""
    values: list[str] = []
    cluster.kube.add_hook(annotation_tracker(P + "desiredDrain", values))
    return values


async def test_desired_changed_while_api_server_down(cluster: Cluster) -> None:
    agent = await start_logged(cluster)
    await cluster.wait_done("rendered-worker-1")
    await cluster.kube.wait_for_watches(1, "nodes")
    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    failed = agent.logged("watch failed", "/api/v1/nodes")
    await cluster.kube.stop()
    cluster.set_desired("rendered-worker-2")  # changes while the server is down
    # Up again only once the agent found it gone: it must list again to see the change.
    await agent.wait_logged("watch failed", "/api/v1/nodes", count=failed + 1)
    await cluster.kube.start()
    await cluster.wait_done("rendered-worker-2", timeout=40)
    assert cluster.procs[-1].returncode is None  # never exits on API faults


async def test_watch_ending_with_504_relists(cluster: Cluster) -> None:
    # The real server's WatchList answer when etcd lacks RequestWatchProgress (the 410 case
    # is a shared scenario, run on the real server too).
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    await cluster.kube.wait_for_watches(1, "nodes")
    assert cluster.kube.inject_watch_error(504, resource="nodes") >= 1
    cluster.add_config("rendered-worker-3", "v1", keys=["ssh-ed25519 AAAA-three"])
    cluster.set_desired("rendered-worker-3")
    await cluster.wait_done("rendered-worker-3")


def drain_requests(cluster: Cluster) -> list[str]:
    """The value of every patch of the Node that sets `desiredDrain`, as the server received
    them: a value written again unchanged too (the store and its watchers never see that)."""
    values = []
    for r in cluster.kube.requests:
        if (r.verb, r.resource, r.name, r.subresource) != ("patch", "nodes", cluster.node, None):
            continue
        body = r.json()
        meta = body.get("metadata") if isinstance(body, dict) else None
        annotations = (meta or {}).get("annotations") or {}
        if P + "desiredDrain" in annotations:
            values.append(annotations[P + "desiredDrain"])
    return values


def event_posts(cluster: Cluster, reason: str) -> list[RequestRecord]:
    """The agent's requests to record an Event with `reason` (a repeated one answers 409)."""
    return [r for r in cluster.kube.requests
            if (r.verb, r.resource) == ("create", "events")
            and (r.json() or {}).get("reason") == reason]  # fmt: skip


async def test_killed_during_drain_wait_no_second_drain(cluster: Cluster) -> None:
    proc = await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    await cluster.wait_annotations(lambda a: a.get(P + "desiredDrain") == "drain-rendered-worker-2")
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    proc = await cluster.start_agent()
    # The restarted agent records its Drain event again (409: it exists), and as soon as
    # that is answered, with no request between, decides on the drain request standing.
    await until(lambda: [r.status for r in event_posts(cluster, "Drain")] == [201, 409],
                what="the restarted agent's Drain event")  # fmt: skip
    # Answered after a while, as the real controller does (~5 s): a second request, had the
    # agent written one, would come first and not find the drain acknowledged already.
    cluster.kube.enable_drain_controller(delay=0.5)
    assert await exits(proc) == 3
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-2")
    requests = drain_requests(cluster)  # one each: the restart wrote no second drain request
    assert requests == ["drain-rendered-worker-2", "uncordon-rendered-worker-2"], requests
    assert cluster.reboots() == 1


async def test_single_replica_never_drains(tmp_path: Path) -> None:
    cluster = await Cluster.create(tmp_path, annotations={
        P + "currentConfig": "rendered-worker-1", P + "desiredConfig": "rendered-worker-1",
        P + "state": "Done", P + "controlPlaneTopology": "SingleReplica",
    })  # fmt: skip
    try:
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-1")
        cluster.add_config("rendered-worker-2", "v2")
        cluster.set_desired("rendered-worker-2")
        assert await exits(cluster.procs[-1]) == 3
        await cluster.start_agent()
        annotations = await cluster.wait_done("rendered-worker-2")
        assert P + "desiredDrain" not in annotations
        assert cluster.reboots() == 1
    finally:
        await cluster.close()


def _pod(name: str, labels: dict, **meta) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps", "labels": labels, **meta},
        "spec": {"nodeName": "worker-0", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


async def test_self_drain_blocked_by_pdb_then_unblocked(cluster: Cluster) -> None:
    kube = cluster.kube
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}})
    kube.put(_pod("db-0", {"app": "db"}))
    kube.put(_pod("agent-x", {"app": "ds"}, ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "1"}]))  # fmt: skip
    kube.put(_pod("static-x", {"app": "static"},
                  annotations={"kubernetes.io/config.mirror": "abc"}))  # fmt: skip
    kube.put({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
              "metadata": {"name": "db", "namespace": "apps"},
              "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})  # fmt: skip
    await cluster.start_agent("--drain", "self")
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    annotations = await cluster.wait_annotations(lambda a: "apps/db-0" in a.get(P + "reason", ""))
    assert "PodDisruptionBudget" in annotations[P + "reason"]
    assert kube.get("Node", cluster.node)["spec"]["unschedulable"] is True
    assert cluster.reboots() == 0
    kube.delete("poddisruptionbudgets", "db", "apps")
    assert await exits(cluster.procs[-1]) == 3
    assert kube.try_get("pods", "db-0", "apps") is None
    assert kube.try_get("pods", "agent-x", "apps") is not None  # DaemonSet pods stay
    assert kube.try_get("pods", "static-x", "apps") is not None  # mirror pods stay
    await cluster.start_agent("--drain", "self")
    await cluster.wait_done("rendered-worker-2")
    assert not kube.get("Node", cluster.node)["spec"].get("unschedulable")


async def test_self_drain_keeps_an_admin_cordon(cluster: Cluster) -> None:
    cluster.kube.mutate("Node", cluster.node, lambda n: n["spec"].update(unschedulable=True))
    await cluster.start_agent("--drain", "self")
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    assert await exits(cluster.procs[-1]) == 3
    await cluster.start_agent("--drain", "self")
    await cluster.wait_done("rendered-worker-2")
    node = cluster.kube.get("Node", cluster.node)
    assert node["spec"]["unschedulable"] is True
    assert "image-mode-agent.openshift.io/admin-cordoned" not in node["metadata"]["annotations"]


async def test_live_update_does_not_uncordon_an_admin_cordon(cluster: Cluster) -> None:
    cluster.kube.mutate("Node", cluster.node, lambda n: n["spec"].update(unschedulable=True))
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    cluster.set_desired("rendered-worker-2")
    await cluster.wait_done("rendered-worker-2")
    assert cluster.kube.get("Node", cluster.node)["spec"]["unschedulable"] is True


async def test_certificates_written_live_and_skipped_when_unchanged(cluster: Cluster) -> None:
    import yaml

    cc = yaml.safe_load(CONTROLLER_CONFIG.read_text())
    cc["spec"]["imageRegistryBundleData"] = [
        {"file": "registry.example..5000", "data": base64.b64encode(b"REGISTRY CA\n").decode()}
    ]
    stale = cluster.sim.root / "etc/docker/certs.d/old.example"
    stale.mkdir(parents=True)
    (stale / "ca.crt").write_text("old")
    cluster.kube.put(cc)
    await cluster.start_agent()
    version = cluster.kube.get("controllerconfigs", "machine-config-controller")["metadata"][
        "resourceVersion"
    ]
    await cluster.wait_annotations(
        lambda a: a.get(P + "lastSyncedControllerConfigResourceVersion") == version
    )
    root = cluster.sim.root
    assert (root / "etc/kubernetes/kubelet-ca.crt").read_text().startswith("-----BEGIN CERT")
    assert (root / "etc/docker/certs.d/registry.example:5000/ca.crt").read_text() == "REGISTRY CA\n"
    assert not stale.exists()
    assert cluster.reboots() == 0


async def test_node_disruption_policy_extends_the_live_set(cluster: Cluster) -> None:
    reload = {"type": "Reload", "reload": {"serviceName": "crio.service"}}
    policies = {"files": [{"path": "/etc/containers/policy.json", "actions": [reload]}]}
    cluster.kube.put({
        "apiVersion": "operator.openshift.io/v1", "kind": "MachineConfiguration",
        "metadata": {"name": "cluster"},
        "status": {"observedGeneration": 1,
                   "nodeDisruptionPolicyStatus": {"clusterPolicies": policies}},
    })  # fmt: skip
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    policy = ign_file("/etc/containers/policy.json", '{"default":[]}')
    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-one"], files=[policy])
    cluster.set_desired("rendered-worker-2")
    await cluster.wait_done("rendered-worker-2")
    assert (cluster.sim.root / "etc/containers/policy.json").read_text() == '{"default":[]}'
    assert {"kind": "unit", "detail": "reload crio.service"}.items() <= cluster.sim.actions()[
        -1
    ].items()
    assert cluster.reboots() == 0


async def test_dry_run_writes_nothing(cluster: Cluster) -> None:
    def planned(image: str) -> tuple[str, str]:
        return "dry run", f'"target_image": "{cluster.images[image]}"'

    agent = await start_logged(cluster, "--dry-run", level="info")
    await agent.wait_logged(*planned("v1"))  # its first pass
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    # The pass that took the new config in, to its end: planned (a reboot into v2), not done.
    await agent.wait_logged(*planned("v2"))
    assert [(r.method, r.path) for r in cluster.kube.requests if r.body is not None] == []
    assert cluster.reboots() == 0
    assert agent.proc.returncode is None


async def test_staging_progress_reaches_the_reason(cluster: Cluster) -> None:
    cluster.kube.enable_drain_controller()
    slow = cluster.sim.add_image(f"{cluster.images['v1'].split('@')[0]}:slow", {},
                                 pull_seconds=3)  # fmt: skip
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", slow)
    cluster.set_desired("rendered-worker-2")
    annotations = await cluster.wait_annotations(
        lambda a: a.get(P + "reason", "").startswith("Staging image: ")
    )
    assert annotations[P + "state"] == "Working"
    assert " MiB" in annotations[P + "reason"]
    assert await exits(cluster.procs[-1]) == 3


async def test_refused_certificate_path_degrades_without_crashing(cluster: Cluster) -> None:
    import yaml

    outside = cluster.base / "outside"
    outside.mkdir()
    (cluster.sim.root / "etc/docker").mkdir(parents=True)
    (cluster.sim.root / "etc/docker/certs.d").symlink_to(outside)
    cc = yaml.safe_load(CONTROLLER_CONFIG.read_text())
    cc["spec"]["imageRegistryBundleData"] = [
        {"file": "registry.example", "data": base64.b64encode(b"CA\n").decode()}
    ]
    cluster.kube.put(cc)
    await cluster.start_agent()
    annotations = await cluster.wait_annotations(
        lambda a: "symlink" in a.get(P + "reason", "") and a.get(P + "state") == "Degraded"
    )
    assert "/etc/docker/certs.d" in annotations[P + "reason"]
    assert list(outside.iterdir()) == []  # nothing written through the symlink
    assert cluster.procs[-1].returncode is None  # still running, will retry


async def test_a_lost_progress_report_is_logged_not_raised(cluster: Cluster) -> None:
    cluster.kube.enable_drain_controller()
    slow = cluster.sim.add_image(f"{cluster.images['v1'].split('@')[0]}:slow", {},
                                 pull_seconds=2)  # fmt: skip
    proc = await cluster.start_agent(stderr=asyncio.subprocess.PIPE)
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", slow)
    cluster.set_desired("rendered-worker-2")
    await cluster.wait_annotations(lambda a: a.get(P + "state") == "Working")
    # Every retry of the first "Staging image: ..." report fails; the update goes on.
    cluster.kube.fail_requests(500, verb="patch", resource="nodes", times=8)
    assert await exits(proc) == 3
    stderr = (await proc.stderr.read()).decode()
    assert "staging progress not reported" in stderr
    assert "Task exception was never retrieved" not in stderr


async def test_an_image_the_signature_policy_refuses_is_never_drained_for(
    cluster: Cluster,
) -> None:
    """The host's policy requires a signature for the OS repository: an unsigned image is
    refused at staging (Degraded naming the image and the scope, no drain, no reboot, and the
    pre-stage refused as well); a signed one then updates with one drain and one reboot."""
    key = "/etc/pki/containers/os.gpg"
    policy = {"default": [{"type": "reject"}], "transports": {"docker": {"quay.example/os": [
        {"type": "signedBy", "keyType": "GPGKeys", "keyPath": key}]}}}  # fmt: skip
    (cluster.sim.root / "etc/containers").mkdir(parents=True, exist_ok=True)
    (cluster.sim.root / "etc/containers/policy.json").write_text(json.dumps(policy))
    drains = track(cluster)
    cluster.kube.enable_drain_controller()
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    annotations = await cluster.wait_annotations(
        lambda a: "refused by the signature policy" in a.get(P + "reason", "")
    )
    assert annotations[P + "state"] == "Degraded"
    assert annotations[P + "reason"].startswith(f"staging {cluster.images['v2']} refused")
    assert 'transports.docker["quay.example/os"]: signedBy GPGKeys' in annotations[P + "reason"]
    assert "A signature was required, but no signature exists" in annotations[P + "reason"]
    assert (drains, cluster.reboots()) == ([], 0)
    signed = cluster.sim.add_image(
        "quay.example/os/node:signed", {"usr/lib/app/healthy": "yes"}, signed_by=(key,)
    )
    cluster.add_config("rendered-worker-3", signed)
    cluster.set_desired("rendered-worker-3")
    assert await exits(cluster.procs[-1], 60) == 3
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-3")
    assert drains == ["drain-rendered-worker-3", "uncordon-rendered-worker-3"]
    assert cluster.reboots() == 1
