"""deploy/ as an operator applies it, on the real kube-apiserver from the kit: every object of
every deploy/*.yaml is accepted by the server (server-side apply, dry run: admission and
validation run, nothing is stored), and the MachineConfigNode guard of deploy/admission.yaml,
created for real, lets a token bound to a pod on node A write MachineConfigNode A only. Then
deploy/hypershift/*.yaml for NodePool `np`, created for real: the kubelet's identity reads the
upgrade ConfigMap by name and by a list and a watch narrowed to it (resourceNames), nothing
else there; the MCD pod is refused in np-upgrade only."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.conformance.kit import MCO_NS, Kit, KitCluster
from tests.conformance.real import put_object

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HCP = DEPLOY / "hypershift"
MCN = "/apis/machineconfiguration.openshift.io/v1/machineconfignodes"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def _objects(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


async def test_deploy_manifests_on_real_apiserver(
    kit: Kit, tmp_path: Path, figures: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Privileged pods, as every OpenShift (and kubeadm) API server allows; the kit's does not
    # by default.
    monkeypatch.setenv("KIT_APISERVER_FLAGS", "--allow-privileged=true")
    cluster = KitCluster(kit, tmp_path / "run")
    started = time.monotonic()
    await cluster.up()
    try:
        await _accepted_by_dry_run(cluster)
        dry = time.monotonic() - started
        effective = await _guard_enforced(cluster)
        figures.append(f"deploy manifests: cluster up + dry run of every object {dry:.1f} s; "
                       f"MachineConfigNode guard effective {effective:.1f} s after "
                       "its creation")  # fmt: skip
        await _hypershift_enforced(cluster)
    finally:
        await cluster.down()


async def _kubectl(cluster: KitCluster, *args: str) -> str:
    return await asyncio.to_thread(cluster.kubectl, *args)


async def _accepted_by_dry_run(cluster: KitCluster) -> None:
    """Only the namespace is created for real (the cluster's installer made it); the rest of
    deploy/ goes through admission and validation with dryRun=All and is not stored."""
    await put_object(cluster, {"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": MCO_NS}})  # fmt: skip
    files = sorted(DEPLOY.glob("*.yaml"))
    assert {f.name for f in files} >= {"rbac.yaml", "daemonset.yaml", "metrics.yaml",
                                       "admission.yaml"}  # fmt: skip
    for path in files:
        out = await _kubectl(cluster, "apply", "--server-side", "--dry-run=server",
                             "--field-manager=image-mode-agent-test", "-o", "json",
                             "-f", str(path))  # fmt: skip
        answer = json.loads(out)
        returned = answer["items"] if answer.get("kind") == "List" else [answer]
        sent = _objects(path)
        assert [(o["kind"], o["metadata"]["name"]) for o in returned] == [
            (o["kind"], o["metadata"]["name"]) for o in sent], path.name  # fmt: skip
        for obj in returned:
            # What the server sent back is what it would store: defaulted and validated.
            assert obj["metadata"].get("uid"), (path.name, obj["metadata"]["name"])
    # The DaemonSet came back from the server as it would run: probes and ports intact.
    ds = json.loads(await _kubectl(cluster, "apply", "--server-side", "--dry-run=server", "-o",
                                   "json", "-f", str(DEPLOY / "daemonset.yaml")))  # fmt: skip
    agent = ds["spec"]["template"]["spec"]["containers"][0]
    assert agent["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"
    port = agent["ports"][0]
    assert (port["containerPort"], port["hostIP"]) == (8797, "127.0.0.1")
    # Nothing was stored.
    assert await cluster.get(f"/apis/apps/v1/namespaces/{MCO_NS}/daemonsets/image-mode-agent") \
        is None  # fmt: skip
    assert await cluster.get("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
                             "image-mode-agent-mcn-guards") is None  # fmt: skip


class _Client:
    """Requests with one bearer token (the agent's, as its pod would hold it)."""

    def __init__(self, cluster: KitCluster, token: str) -> None:
        self.cluster, self.token = cluster, token

    async def request(self, method: str, path: str, body: Any,
                      content_type: str = "application/json") -> tuple[int, Any]:  # fmt: skip
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": content_type}
        connector = aiohttp.TCPConnector(ssl=self.cluster._ssl())
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.request(method, self.cluster.url + path, json=body, headers=headers) as resp,
        ):
            return resp.status, await resp.json(content_type=None)

    async def patch_status(self, node: str) -> tuple[int, Any]:
        body = {"status": {"configVersion": {"desired": "rendered-worker-2"}}}
        return await self.request("PATCH", f"{MCN}/{node}/status", body,
                                  "application/merge-patch+json")  # fmt: skip

    async def create(self, node: str) -> tuple[int, Any]:
        return await self.request("POST", MCN, _mcn(node))

    async def extra(self) -> dict[str, list[str]]:
        status, review = await self.request("POST", "/apis/authentication.k8s.io/v1/"
                                            "selfsubjectreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})  # fmt: skip
        assert status == 201, review
        return review["status"]["userInfo"].get("extra") or {}


def _mcn(node: str) -> dict[str, Any]:
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigNode",
            "metadata": {"name": node},
            "spec": {"node": {"name": node}, "pool": {"name": "worker"},
                     "configVersion": {"desired": "rendered-worker-1"}}}  # fmt: skip


async def _guard_enforced(cluster: KitCluster) -> float:
    """deploy/rbac.yaml and deploy/admission.yaml for real, two Nodes with a MachineConfigNode
    each, the agent's pod on node-a (no kubelet runs it: the pod is only what the token is
    bound to, as the DaemonSet's projected token is). Returns the seconds from the policy's
    creation to its first denial."""
    crd = cluster.kit.path / "crds" / "machineconfiguration_v1_machineconfignodes.crd.yaml"
    await _kubectl(cluster, "apply", "--server-side", "-f", str(crd))
    await _kubectl(cluster, "wait", "--for", "condition=established", "--timeout=60s",
                   "crd/machineconfignodes.machineconfiguration.openshift.io")  # fmt: skip
    await _kubectl(cluster, "apply", "-f", str(DEPLOY / "rbac.yaml"))
    for node in ("node-a", "node-b"):
        await put_object(cluster, {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": node, "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach":
                                          "true"}}})  # fmt: skip
        await cluster.call("POST", MCN, _mcn(node))
    pod = await cluster.call("POST", f"/api/v1/namespaces/{MCO_NS}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "image-mode-agent-a"},
        "spec": {"nodeName": "node-a", "serviceAccountName": "image-mode-agent",
                 "containers": [{"name": "agent", "image": "quay.example/agent:t"}]}})  # fmt: skip
    sa = f"/api/v1/namespaces/{MCO_NS}/serviceaccounts/image-mode-agent/token"
    bound = await cluster.call("POST", sa, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"]}}})  # fmt: skip
    on_a = _Client(cluster, bound["status"]["token"])
    unbound = _Client(cluster, await cluster.token_for("image-mode-agent"))
    # The API server puts the pod's node into a pod-bound token (ServiceAccountTokenPodNodeInfo).
    assert (await on_a.extra()).get(NODE_CLAIM) == ["node-a"]
    assert NODE_CLAIM not in await unbound.extra()
    # Before the guard, RBAC alone lets the agent's account write any MachineConfigNode.
    assert (await on_a.patch_status("node-b"))[0] == 200

    await _kubectl(cluster, "apply", "-f", str(DEPLOY / "admission.yaml"))
    created = time.monotonic()
    while True:  # the policy plugin picks new policies up within seconds
        status, answer = await on_a.patch_status("node-b")
        if status != 200:
            break
        assert time.monotonic() - created < 60, "the policy never took effect"
        await asyncio.sleep(0.2)
    effective = time.monotonic() - created
    assert status == 403, answer
    assert "ValidatingAdmissionPolicy 'image-mode-agent-mcn-guards'" in answer["message"]
    assert "may not write MachineConfigNode node-b" in answer["message"]

    # Its own node's MachineConfigNode: allowed; another's, also to create: denied.
    status, answer = await on_a.patch_status("node-a")
    assert status == 200, answer
    assert answer["status"]["configVersion"]["desired"] == "rendered-worker-2"
    status, answer = await on_a.create("node-c")
    assert status == 403 and "image-mode-agent-mcn-guards" in answer["message"], answer
    await cluster.call("DELETE", f"{MCN}/node-a")
    status, answer = await on_a.create("node-a")
    assert status == 201, answer
    # A token with no node claim (not bound to a pod): denied even for "its" node.
    for node in ("node-a", "node-b"):
        status, answer = await unbound.patch_status(node)
        assert status == 403, answer
        assert "needs a token bound to a node" in answer["message"]
    # Every other user is not matched: the admin writes either.
    for node in ("node-a", "node-b"):
        body = {"status": {"configVersion": {"desired": "rendered-worker-3"}}}
        await cluster.merge_patch(f"{MCN}/{node}/status", body)
    # The policy type-checked cleanly against the MachineConfigNode schema.
    vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    policy = await cluster.get(f"{vap}/image-mode-agent-mcn-guards")
    assert policy is not None
    warnings = (policy.get("status", {}).get("typeChecking") or {}).get("expressionWarnings")
    assert not warnings, warnings
    return effective


async def _hypershift_enforced(cluster: KitCluster) -> None:
    """deploy/hypershift/ with NODEPOOL replaced by `np`, as its headers tell the operator."""
    for ns in ("np-upgrade", "other-upgrade"):
        await put_object(cluster, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": ns}})  # fmt: skip
        # Pods need it, and no controller makes it here.
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        await cluster.call("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", sa)
    for name in ("np-upgrade", "other"):
        meta = {"name": name, "namespace": "np-upgrade"}
        await put_object(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                                   "data": {"hash": "1"}})  # fmt: skip
    for name in ("rbac.yaml", "admission.yaml"):
        text = (HCP / name).read_text().replace("NODEPOOL", "np")
        await asyncio.to_thread(cluster.kubectl, "apply", "-f", "-", stdin=text)

    def as_node(path: str) -> str:
        return cluster.kubectl("get", "--raw", path,
                               kubeconfig=cluster.node_kubeconfig("worker-0"))  # fmt: skip

    cms = "/api/v1/namespaces/np-upgrade/configmaps"
    named = f"{cms}?fieldSelector=metadata.name%3Dnp-upgrade"
    deadline = time.monotonic() + 30
    while True:  # RBAC and the policy plugin pick new objects up from informers
        try:
            await asyncio.to_thread(as_node, f"{cms}/np-upgrade")
            break
        except RuntimeError:
            assert time.monotonic() < deadline, "the Role never took effect"
            await asyncio.sleep(0.2)
    assert len(json.loads(await asyncio.to_thread(as_node, named))["items"]) == 1
    watched = await asyncio.to_thread(as_node, named + "&watch=1&timeoutSeconds=1")
    assert '"ADDED"' in watched and '"np-upgrade"' in watched, watched
    for path in (cms, f"{cms}/other", f"{cms}?fieldSelector=metadata.name%3Dother",
                 "/api/v1/namespaces/other-upgrade/configmaps"):  # fmt: skip
        with pytest.raises(RuntimeError, match="Forbidden"):
            await asyncio.to_thread(as_node, path)

    def pod(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "quay.example/mco:t"}]}}  # fmt: skip

    mcd = "machine-config-daemon-worker-0"
    while True:
        status, answer = await cluster.request("POST", "/api/v1/namespaces/np-upgrade/pods",
                                               pod(mcd))  # fmt: skip
        if status != 201:
            break
        await cluster.call("DELETE", f"/api/v1/namespaces/np-upgrade/pods/{mcd}"
                           "?gracePeriodSeconds=0")  # fmt: skip
        assert time.monotonic() < deadline, "the policy never took effect"
        await asyncio.sleep(0.2)
    assert status == 403, answer
    assert "ValidatingAdmissionPolicy 'image-mode-agent-no-mcd-pod'" in answer["message"]
    assert f"no pod {mcd} in np-upgrade;" in answer["message"], answer
    for ns, name in (("np-upgrade", "debug"), ("other-upgrade", mcd)):
        status, answer = await cluster.request("POST", f"/api/v1/namespaces/{ns}/pods", pod(name))
        assert status == 201, (ns, name, answer)
    vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    policy = await cluster.get(f"{vap}/image-mode-agent-no-mcd-pod")
    assert policy is not None
    warnings = (policy.get("status", {}).get("typeChecking") or {}).get("expressionWarnings")
    assert not warnings, warnings
