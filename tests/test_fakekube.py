"""The fake API server, exercised through the real kubernetes_asyncio client.

"The real server" below is what a real kube-apiserver v1.32 (built just after v1.32.0-beta.0,
etcd 3.5.16, `--authorization-mode=Node,RBAC` with the NodeRestriction admission plugin)
answered when the project tried it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client import ApiClient, ApiException

from standins.kube import DESIRED_DRAIN, LAST_APPLIED_DRAIN, FakeKube, Identity
from standins.kube.patch import json_patch, merge_patch, strategic_merge_patch

pytestmark = pytest.mark.asyncio

MC_GROUP, MC_V = "machineconfiguration.openshift.io", "v1"
OP_GROUP = "operator.openshift.io"
MERGE = "application/merge-patch+json"


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(name: str, node_name: str = "worker-0", ns: str = "apps", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


def body(err: ApiException) -> dict[str, Any]:
    return json.loads(err.body)


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = FakeKube(bookmark_interval=0.2)
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture
async def admin(kube: FakeKube) -> AsyncIterator[ApiClient]:
    async with ApiClient(kube.client_configuration()) as api:
        yield api


async def collect(stream: watch.Watch, func: Any, n: int, **kwargs: Any) -> list[dict]:
    """The first `n` events (fewer if the stream ends). Closes `stream`: each Watch owns an
    ApiClient of its own."""
    events = []
    async with stream:
        async for ev in stream.stream(func, **kwargs):
            events.append(ev)
            if len(events) == n:
                break
    return events


async def test_crud_core_and_custom(kube: FakeKube, admin: ApiClient) -> None:
    v1 = client.CoreV1Api(admin)
    created = await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="worker-0")))
    assert created.metadata.uid and int(created.metadata.resource_version) > 0
    with pytest.raises(ApiException) as exc:
        await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="worker-0")))
    assert exc.value.status == 409 and body(exc.value)["reason"] == "AlreadyExists"
    await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="w1", labels={"r": "x"})))
    assert [n.metadata.name for n in (await v1.list_node(label_selector="r=x")).items] == ["w1"]
    assert len((await v1.list_node(field_selector="metadata.name=worker-0")).items) == 1

    got = await v1.read_node("worker-0")
    got.metadata.labels = {"role": "worker"}
    replaced = await v1.replace_node("worker-0", got)
    assert int(replaced.metadata.resource_version) > int(got.metadata.resource_version)
    await v1.delete_node("w1")
    with pytest.raises(ApiException) as exc:
        await v1.read_node("w1")
    status = body(exc.value)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "NotFound", 404)
    assert status["message"] == 'nodes "w1" not found'

    co = client.CustomObjectsApi(admin)
    mc = {"apiVersion": f"{MC_GROUP}/{MC_V}", "kind": "MachineConfig",
          "metadata": {"name": "00-worker"}, "spec": {"osImageURL": "a"}}  # fmt: skip
    await co.create_cluster_custom_object(MC_GROUP, MC_V, "machineconfigs", mc)
    mcs = await co.list_cluster_custom_object(MC_GROUP, MC_V, "machineconfigs")
    assert [i["metadata"]["name"] for i in mcs["items"]] == ["00-worker"]
    with pytest.raises(ApiException) as exc:  # CRs reject strategic merge patch, like for real
        await co.patch_cluster_custom_object(
            MC_GROUP, MC_V, "machineconfigs", "00-worker", {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
    assert exc.value.status == 415
    await co.delete_cluster_custom_object(MC_GROUP, MC_V, "machineconfigs", "00-worker")

    # generation: bumped by spec changes, not by /status writes.
    kube.put({"apiVersion": f"{OP_GROUP}/v1", "kind": "MachineConfiguration",
              "metadata": {"name": "cluster"}, "spec": {"logLevel": "Normal"}})  # fmt: skip
    args = (OP_GROUP, "v1", "machineconfigurations", "cluster")
    obj = await co.patch_cluster_custom_object(
        *args, {"spec": {"logLevel": "Debug"}}, _content_type=MERGE
    )
    assert obj["metadata"]["generation"] == 2
    obj = await co.patch_cluster_custom_object_status(
        *args, {"status": {"observedGeneration": 2}, "spec": {"logLevel": "x"}}, _content_type=MERGE
    )
    assert obj["metadata"]["generation"] == 2
    assert obj["status"] == {"observedGeneration": 2} and obj["spec"]["logLevel"] == "Debug"


async def test_merge_and_strategic_patch(kube: FakeKube, admin: ApiClient) -> None:
    """The real server: a merge patch of annotations (a `null` removes one) by the admin or
    the node identity is 200; a strategic-merge patch of /status by the node is 200."""
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))
    conditions = [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]
    kube.patch_status("Node", "worker-0", {"conditions": conditions})
    # Strategic merge (the client's default for dict bodies): conditions merge by `type`.
    patched = await v1.patch_node_status(
        "worker-0", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert {c.type: c.status for c in patched.status.conditions} == {
        "Ready": "False",
        "DiskPressure": "False",
    }
    # Merge patch replaces the list wholesale and null deletes a key.
    kube.patch_annotations("Node", "worker-0", {"keep": "1", "drop": "2"})
    patched = await v1.patch_node_status(
        "worker-0",
        {"metadata": {"annotations": {"drop": None}},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        _content_type=MERGE,
    )  # fmt: skip
    assert [c.type for c in patched.status.conditions] == ["Ready"]
    assert patched.metadata.annotations == {"keep": "1"}
    # Containers merge by name; `$patch: delete` removes one.
    kube.put(pod("p") | {"spec": {"containers": [
        {"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}})  # fmt: skip
    p = await v1.patch_namespaced_pod(
        "p", "apps", {"spec": {"containers": [{"name": "a", "image": "2"},
                                              {"name": "b", "$patch": "delete"}]}}
    )  # fmt: skip
    assert [(c.name, c.image) for c in p.spec.containers] == [("a", "2")]
    # JSON patch (list body).
    p = await v1.patch_namespaced_pod(
        "p", "apps", [{"op": "add", "path": "/metadata/labels", "value": {"j": "p"}}]
    )
    assert p.metadata.labels == {"j": "p"}


async def test_stale_resource_version_is_conflict(kube: FakeKube, admin: ApiClient) -> None:
    """The real server: a body with a stale metadata.resourceVersion is 409 Conflict."""
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))
    old = await v1.read_node("worker-0")
    kube.patch_annotations("Node", "worker-0", {"bump": "1"})
    with pytest.raises(ApiException) as exc:
        await v1.replace_node("worker-0", old)
    assert exc.value.status == 409 and body(exc.value)["reason"] == "Conflict"
    assert "the object has been modified" in body(exc.value)["message"]
    stale = {"metadata": {"resourceVersion": old.metadata.resource_version, "labels": {"a": "b"}}}
    with pytest.raises(ApiException) as exc:
        await v1.patch_node("worker-0", stale, _content_type=MERGE)
    assert exc.value.status == 409
    current = kube.get("Node", "worker-0")["metadata"]["resourceVersion"]
    fresh = {"metadata": {"resourceVersion": current, "labels": {"a": "b"}}}
    assert (await v1.patch_node("worker-0", fresh, _content_type=MERGE)).metadata.labels == {
        "a": "b"
    }
    # A no-op patch keeps the resourceVersion, as on the real server.
    again = await v1.patch_node("worker-0", {"metadata": {"labels": {"a": "b"}}})
    assert (
        again.metadata.resource_version
        == kube.get("Node", "worker-0")["metadata"]["resourceVersion"]
    )


async def test_field_selected_watch_delivers_added_then_modified(kube: FakeKube) -> None:
    """The real server: a watch with fieldSelector=metadata.name=<node> opened before the
    object exists delivers ADDED then one MODIFIED per patch, with increasing
    resourceVersions."""
    me = kube.node_identity("worker-0")
    async with ApiClient(kube.client_configuration(me)) as api:
        v1 = client.CoreV1Api(api)
        stream = watch.Watch()
        task = asyncio.create_task(
            collect(stream, v1.list_node, 3, field_selector="metadata.name=worker-0",
                    timeout_seconds=5)
        )  # fmt: skip
        await kube.wait_for_watches(1, "nodes")  # watch opened before the node exists
        kube.put(node("worker-1"))
        kube.put(node("worker-0"))
        kube.patch_annotations("Node", "worker-1", {"ignored": "yes"})
        kube.patch_annotations("Node", "worker-0", {"a": "1"})
        kube.patch_annotations("Node", "worker-0", {"a": "2"})
        events = await asyncio.wait_for(task, 5)
        assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "MODIFIED"]
        assert {e["object"].metadata.name for e in events} == {"worker-0"}
        rvs = [int(e["object"].metadata.resource_version) for e in events]
        assert rvs == sorted(rvs) and len(set(rvs)) == 3
        assert events[-1]["object"].metadata.annotations == {"a": "2"}

        # Opened afterwards: starts with an ADDED of the current object.
        first = await collect(
            watch.Watch(), v1.list_node, 1, field_selector="metadata.name=worker-0",
            timeout_seconds=2,
        )  # fmt: skip
        assert first[0]["type"] == "ADDED" and first[0]["object"].metadata.resource_version == str(
            rvs[-1]
        )


async def test_label_selected_watch_sees_objects_enter_and_leave(
    kube: FakeKube, admin: ApiClient
) -> None:
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))
    task = asyncio.create_task(
        collect(watch.Watch(), v1.list_node, 2, label_selector="pool=infra", timeout_seconds=5)
    )
    await kube.wait_for_watches()
    kube.patch_labels("Node", "worker-0", {"pool": "infra"})
    kube.patch_labels("Node", "worker-0", {"pool": "worker"})
    events = await asyncio.wait_for(task, 5)
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]


async def test_too_new_resource_version_is_504() -> None:
    """The real server ended a watch with a 504 Status, reason Timeout, cause
    ResourceVersionTooLarge (a watch started without a resourceVersion, with the WatchList
    feature on and an etcd that lacks RequestWatchProgress)."""
    kube = FakeKube(too_large_rv_wait=0.2)
    async with kube, ApiClient(kube.client_configuration()) as api:
        future = str(kube.store.resource_version + 100)
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(api).list_node(
                resource_version=future, resource_version_match="NotOlderThan"
            )
        assert exc.value.status == 504
        assert body(exc.value)["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


async def test_bookmarks(kube: FakeKube, admin: ApiClient) -> None:
    """allowWatchBookmarks: BOOKMARK events carry only a resourceVersion, as the real watch
    cache sends them; the conformance watchers (tests/scenarios/rest.py) ask for them on the
    real server and resume from their resourceVersions."""
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))
    seen: list[dict] = []
    async with watch.Watch() as stream:
        async for ev in stream.stream(
            v1.list_node, allow_watch_bookmarks=True, timeout_seconds=3,
            field_selector="metadata.name=worker-0",
        ):  # fmt: skip
            seen.append(ev)
            if ev["type"] == "ADDED":
                kube.put(node("other"))  # unrelated write advances the bookmark RV
            if ev["type"] == "BOOKMARK":
                break
    bookmark = seen[-1]["raw_object"]
    assert bookmark["kind"] == "Node" and set(bookmark["metadata"]) == {"resourceVersion"}
    assert int(bookmark["metadata"]["resourceVersion"]) == kube.store.resource_version
    assert stream.resource_version == bookmark["metadata"]["resourceVersion"]


async def test_injected_watch_error_ends_watch(kube: FakeKube, admin: ApiClient) -> None:
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))

    async def consume() -> None:
        async with watch.Watch() as stream:
            async for ev in stream.stream(v1.list_node, timeout_seconds=5):
                if ev["type"] == "ADDED":
                    assert kube.inject_watch_error(504) == 1

    with pytest.raises(ApiException) as exc:
        await asyncio.wait_for(consume(), 5)
    assert exc.value.status == 504 and "Timeout" in exc.value.reason

    # On the wire: one ERROR event carrying a Status, then the stream ends.
    headers = {"Authorization": f"Bearer {kube.token_for()}"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{kube.url}/api/v1/nodes?watch=1") as resp,
    ):
        await resp.content.readline()  # ADDED worker-0
        kube.inject_watch_error(410, reason="Gone", message="gone away")
        err = json.loads(await resp.content.readline())
        assert await resp.content.readline() == b""
    assert err["type"] == "ERROR"
    assert err["object"] | {} == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": "gone away", "reason": "Gone",
                                  "code": 410}  # fmt: skip


async def test_expired_resource_version_is_410(kube: FakeKube, admin: ApiClient) -> None:
    """The real server: resuming from an expired resourceVersion answers one ERROR event with a
    410 Status, reason Expired, "too old resource version" (the form as the conformance
    watch-expiry scenario met it, fakekube docstring)."""
    v1 = client.CoreV1Api(admin)
    kube.put(node("worker-0"))
    old_rv = (await v1.list_node()).metadata.resource_version
    kube.patch_annotations("Node", "worker-0", {"a": "1"})
    # Within the retained history a resume replays what happened since.
    replay = await collect(watch.Watch(), v1.list_node, 1, resource_version=old_rv,
                           timeout_seconds=2)  # fmt: skip
    assert replay[0]["type"] == "MODIFIED"
    kube.expire_history()
    with pytest.raises(ApiException) as exc:
        await collect(watch.Watch(), v1.list_node, 1, resource_version=old_rv, timeout_seconds=2)
    assert exc.value.status == 410 and "too old resource version" in exc.value.reason
    # Resuming from the current RV still works after compaction.
    current = (await v1.list_node()).metadata.resource_version
    task = asyncio.create_task(
        collect(watch.Watch(), v1.list_node, 1, resource_version=current, timeout_seconds=3)
    )
    await kube.wait_for_watches()
    kube.patch_annotations("Node", "worker-0", {"a": "2"})
    assert (await asyncio.wait_for(task, 3))[0]["type"] == "MODIFIED"


async def test_bounded_history_compacts() -> None:
    small = FakeKube(history_size=3)
    async with small:
        small.put(node("n"))
        rv = small.get("Node", "n")["metadata"]["resourceVersion"]
        for i in range(5):
            small.patch_annotations("Node", "n", {"i": str(i)})
        async with ApiClient(small.client_configuration()) as api:
            with pytest.raises(ApiException) as exc:
                await collect(watch.Watch(), client.CoreV1Api(api).list_node, 1,
                              resource_version=rv, timeout_seconds=1)  # fmt: skip
        assert exc.value.status == 410


async def test_node_authorizer(kube: FakeKube) -> None:
    """The real server, Node authorizer and NodeRestriction: a node gets, lists and watches only
    its own Node (a list without the field selector is 403 "cannot read all nodes, only its own
    Node object"), patches only its own."""
    kube.put(node("worker-0"))
    kube.put(node("worker-1"))
    me = kube.node_identity("worker-0")
    async with ApiClient(kube.client_configuration(me)) as api:
        v1 = client.CoreV1Api(api)
        assert (await v1.read_node("worker-0")).metadata.name == "worker-0"
        await v1.patch_node("worker-0", {"metadata": {"annotations": {"x": "y"}}},
                            _content_type=MERGE)  # fmt: skip
        await v1.patch_node_status(
            "worker-0", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        )
        own = await v1.list_node(field_selector="metadata.name=worker-0")
        assert [n.metadata.name for n in own.items] == ["worker-0"]
        with pytest.raises(ApiException) as exc:
            await v1.read_node("worker-1")
        assert exc.value.status == 403 and body(exc.value)["reason"] == "Forbidden"
        with pytest.raises(ApiException) as exc:
            await v1.patch_node("worker-1", {"metadata": {"labels": {"x": "y"}}})
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            await v1.list_node()
        assert exc.value.status == 403
        assert body(exc.value)["message"] == (
            'nodes is forbidden: User "system:node:worker-0" cannot list resource "nodes" in API '
            "group \"\" at the cluster scope: node 'worker-0' cannot read all nodes, only its own "
            "Node object"
        )
        with pytest.raises(ApiException) as exc:  # watch without the selector: 403 too
            await collect(watch.Watch(), v1.list_node, 1, timeout_seconds=1)
        assert exc.value.status == 403
        with pytest.raises(ApiException) as exc:
            await client.CustomObjectsApi(api).list_cluster_custom_object(
                MC_GROUP, MC_V, "machineconfigs"
            )
        assert exc.value.status == 403
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="worker-0."),
            involved_object=client.V1ObjectReference(kind="Node", name="worker-0"),
            reason="Drain",
            message="draining",
            type="Normal",
        )
        await v1.create_namespaced_event("default", event)
    assert [e["reason"] for e in kube.list("events", "default")] == ["Drain"]

    # RBAC grants apply; other identities; no token.
    reader = kube.node_identity("worker-0", rules=[("list", MC_GROUP, "machineconfigs")])
    sa = kube.add_identity(Identity.service_account("ns", "sa", [("get", "", "nodes")]))
    async with ApiClient(kube.client_configuration(reader)) as api:
        await client.CustomObjectsApi(api).list_cluster_custom_object(
            MC_GROUP, MC_V, "machineconfigs"
        )
    async with ApiClient(kube.client_configuration(sa)) as api:
        await client.CoreV1Api(api).read_node("worker-1")
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(api).list_node()
        assert exc.value.status == 403
    async with aiohttp.ClientSession() as http, http.get(f"{kube.url}/api/v1/nodes") as resp:
        assert resp.status == 401
        assert (await resp.json())["reason"] == "Unauthorized"


async def test_eviction_respects_pdb(kube: FakeKube, admin: ApiClient) -> None:
    v1, policy = client.CoreV1Api(admin), client.PolicyV1Api(admin)
    kube.put(pod("web-1", app="web"))
    kube.put(pod("web-2", app="web"))
    pdb = client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=2, selector=client.V1LabelSelector(match_labels={"app": "web"})
        ),
    )
    await policy.create_namespaced_pod_disruption_budget("apps", pdb)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="web-1", namespace="apps"))
    with pytest.raises(ApiException) as exc:
        await v1.create_namespaced_pod_eviction("web-1", "apps", eviction)
    assert exc.value.status == 429
    assert body(exc.value)["reason"] == "TooManyRequests"
    assert body(exc.value)["message"] == (
        "Cannot evict pod as it would violate the pod's disruption budget."
    )
    status = (await policy.read_namespaced_pod_disruption_budget("web", "apps")).status
    assert (status.disruptions_allowed, status.current_healthy) == (0, 2)

    await policy.patch_namespaced_pod_disruption_budget(
        "web", "apps", {"spec": {"minAvailable": 1}}
    )
    await v1.create_namespaced_pod_eviction("web-1", "apps", eviction)
    assert kube.try_get("Pod", "web-1", "apps") is None
    with pytest.raises(ApiException) as exc:  # the last one is protected again
        await v1.create_namespaced_pod_eviction(
            "web-2", "apps", client.V1Eviction(metadata=client.V1ObjectMeta(name="web-2"))
        )
    assert exc.value.status == 429


async def test_evicted_pod_stays_terminating_without_kubelet() -> None:
    async with FakeKube(evicted_pods_vanish=False) as kube:
        kube.put(pod("p"))
        async with ApiClient(kube.client_configuration()) as api:
            v1 = client.CoreV1Api(api)
            await v1.create_namespaced_pod_eviction(
                "p", "apps", client.V1Eviction(metadata=client.V1ObjectMeta(name="p"))
            )
            assert (await v1.read_namespaced_pod("p", "apps")).metadata.deletion_timestamp
            await v1.delete_namespaced_pod("p", "apps", grace_period_seconds=0)
        assert kube.try_get("Pod", "p", "apps") is None


async def test_restart_on_same_port_keeps_state(kube: FakeKube, tmp_path: Path) -> None:
    kube.put(node("worker-0"))
    rv = kube.get("Node", "worker-0")["metadata"]["resourceVersion"]
    port = kube.port
    path = kube.write_kubeconfig(tmp_path / "kubeconfig", kube.node_identity("worker-0"))
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    async with ApiClient(cfg) as api:
        v1 = client.CoreV1Api(api)
        assert (await v1.read_node("worker-0")).metadata.resource_version == rv
        watch_task = asyncio.create_task(
            collect(watch.Watch(), v1.list_node, 5, field_selector="metadata.name=worker-0",
                    timeout_seconds=10)
        )  # fmt: skip
        await kube.wait_for_watches()
        await kube.stop()
        # The watch ends (no ERROR event) when the server goes away.
        assert len(await asyncio.wait_for(watch_task, 3)) == 1
        with pytest.raises((aiohttp.ClientError, OSError)):
            await v1.read_node("worker-0")
        kube.patch_annotations("Node", "worker-0", {"while": "down"})
        await kube.start()
        assert kube.port == port
        got = await v1.read_node("worker-0")
        assert got.metadata.annotations == {"while": "down"}
        assert int(got.metadata.resource_version) > int(rv)


async def test_request_log_counts(kube: FakeKube) -> None:
    kube.put(node("worker-0"))
    me = kube.node_identity("worker-0")
    kube.clear_requests()
    async with ApiClient(kube.client_configuration(me)) as api:
        v1 = client.CoreV1Api(api)
        for _ in range(3):
            await v1.read_node("worker-0")
        await v1.patch_node("worker-0", {"metadata": {"labels": {"a": "b"}}})
        with pytest.raises(ApiException):
            await v1.read_node("worker-1")
    user = "system:node:worker-0"
    assert kube.count_requests(verb="get", resource="nodes", user=user) == 4
    assert kube.count_requests(verb="get", status=403) == 1
    assert kube.count_requests(verb="patch", user=user, status=200) == 1
    last = kube.requests[-1]
    assert (last.method, last.path, last.user, last.status) == (
        "GET", "/api/v1/nodes/worker-1", user, 403,
    )  # fmt: skip

    kube.fail_requests(503, verb="patch", resource="nodes")
    async with ApiClient(kube.client_configuration(me)) as api:
        with pytest.raises(ApiException) as exc:
            await client.CoreV1Api(api).patch_node("worker-0", {"metadata": {"labels": {}}})
        assert exc.value.status == 503
        await client.CoreV1Api(api).patch_node("worker-0", {"metadata": {"labels": {"c": "d"}}})


async def test_request_log_keeps_the_bodies_of_writes(kube: FakeKube) -> None:
    """A write that changes nothing leaves the store as it was: only the log shows it."""
    kube.put(node("worker-0"))
    kube.clear_requests()
    same = {"metadata": {"annotations": {DESIRED_DRAIN: "drain-rendered-1"}}}
    async with ApiClient(kube.client_configuration(kube.node_identity("worker-0"))) as api:
        v1 = client.CoreV1Api(api)
        await v1.patch_node("worker-0", same)
        rv = (await v1.read_node("worker-0")).metadata.resource_version
        await v1.patch_node("worker-0", same)  # a no-op: same resourceVersion, no event
        assert (await v1.read_node("worker-0")).metadata.resource_version == rv
        with pytest.raises(ApiException):  # refused, and logged with its body all the same
            await v1.patch_node("worker-1", same)
    patches = [r for r in kube.requests if r.verb == "patch"]
    assert [(r.name, r.status, r.json()) for r in patches] == [
        ("worker-0", 200, same), ("worker-0", 200, same), ("worker-1", 403, same),
    ]  # fmt: skip
    assert isinstance(patches[0].body, bytes) and json.loads(patches[0].body) == same
    reads = [r for r in kube.requests if r.verb == "get"]
    assert len(reads) == 2 and all(r.body is None and r.json() is None for r in reads)


async def test_drain_controller(kube: FakeKube) -> None:
    kube.put(node("worker-0"))
    kube.put(pod("web-1", app="web"))
    kube.put(pod("elsewhere", node_name="worker-1"))
    drain = kube.enable_drain_controller(delay=0.05, evict_pods=True)
    kube.patch_annotations("Node", "worker-0", {DESIRED_DRAIN: "drain-rendered-1"})
    n = await kube.wait_for(
        "Node", "worker-0",
        lambda o: (o or {})["metadata"]["annotations"].get(LAST_APPLIED_DRAIN)
        == "drain-rendered-1",
    )  # fmt: skip
    assert n and n["spec"]["unschedulable"] is True
    assert kube.try_get("Pod", "web-1", "apps") is None
    assert kube.try_get("Pod", "elsewhere", "apps") is not None

    kube.patch_annotations("Node", "worker-0", {DESIRED_DRAIN: "uncordon-rendered-1"})
    n = await kube.wait_for(
        "Node", "worker-0",
        lambda o: (o or {})["metadata"]["annotations"].get(LAST_APPLIED_DRAIN)
        == "uncordon-rendered-1",
    )  # fmt: skip
    assert n and "unschedulable" not in n["spec"]
    assert drain.handled == [("worker-0", "drain-rendered-1"), ("worker-0", "uncordon-rendered-1")]

    kube.disable_drain_controller()
    kube.patch_annotations("Node", "worker-0", {DESIRED_DRAIN: "drain-rendered-2"})
    await drain.idle()  # whatever the write scheduled has run (a disabled controller: nothing)
    assert len(drain.handled) == 2
    assert kube.get("Node", "worker-0")["metadata"]["annotations"][LAST_APPLIED_DRAIN] == (
        "uncordon-rendered-1"
    )


async def test_discovery_and_two_servers(kube: FakeKube, admin: ApiClient) -> None:
    other = FakeKube()
    async with other:
        assert other.port != kube.port
        kube.put(node("only-here"))
        assert other.try_get("Node", "only-here") is None
    groups = await client.ApisApi(admin).get_api_versions()
    assert {g.name for g in groups.groups} >= {MC_GROUP, OP_GROUP, "policy"}
    resources = await client.CoreV1Api(admin).get_api_resources()
    assert {"nodes", "nodes/status", "pods/eviction", "events"} <= {
        r.name for r in resources.resources
    }
    assert (await client.VersionApi(admin).get_code()).major == "1"


async def test_node_may_register_only_itself(kube: FakeKube) -> None:
    async with ApiClient(kube.client_configuration(kube.node_identity("worker-0"))) as api:
        v1 = client.CoreV1Api(api)
        await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="worker-0")))
        with pytest.raises(ApiException) as exc:
            await v1.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="worker-9")))
        assert exc.value.status == 403


async def test_threaded_server_and_sync_controls() -> None:
    """For sync tests or an agent in a subprocess: the server runs on its own thread."""
    await asyncio.to_thread(_threaded_server_scenario)


def _threaded_server_scenario() -> None:
    import urllib.request

    kube = FakeKube().start_in_thread()
    try:
        kube.put(node("worker-0"))
        req = urllib.request.Request(
            f"{kube.url}/api/v1/nodes/worker-0",
            headers={"Authorization": f"Bearer {kube.token_for()}"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.load(resp)["metadata"]["name"] == "worker-0"
        assert kube.count_requests(verb="get", resource="nodes") == 1
    finally:
        kube.stop_in_thread()


# RFC 7386 appendix A, plus the strategic-merge directives we document in standins/kube/patch.py.
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
async def test_merge_patch_rfc7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


async def test_strategic_merge_directives() -> None:
    meta = {"finalizers": ["a", "b"], "labels": {"x": "1"}, "ownerReferences": [{"uid": "u"}]}
    out = strategic_merge_patch(
        {"metadata": meta, "spec": {"taints": [{"key": "k1"}], "podCIDR": "x"}},
        {
            "metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"],
                         "labels": {"$patch": "replace", "y": "2"}},
            "spec": {"taints": [{"key": "k2"}], "$retainKeys": ["taints"]},
            "$setElementOrder/x": [],
        },
    )  # fmt: skip
    assert out["metadata"]["finalizers"] == ["b", "c"]
    assert out["metadata"]["labels"] == {"y": "2"}
    assert out["spec"] == {"taints": [{"key": "k2"}]}  # no patchStrategy: replaced
    doc = json_patch({"a": [1, 2]}, [{"op": "add", "path": "/a/-", "value": 3},
                                     {"op": "move", "from": "/a", "path": "/b"}])  # fmt: skip
    assert doc == {"b": [1, 2, 3]}


async def test_leases_are_optimistic_as_the_pre_pull_lanes_need(admin: ApiClient) -> None:
    """What agent/cluster/pull_lanes.py relies on, as the CoordinationV1 API documents it: a
    second create is 409 AlreadyExists, an update with a stale resourceVersion 409 Conflict,
    one with the current resourceVersion goes through, and MicroTime round-trips."""
    leases = client.CoordinationV1Api(admin)
    ns = "openshift-machine-config-operator"
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="lane", namespace=ns),
                           spec=client.V1LeaseSpec(holder_identity="a",
                                                   lease_duration_seconds=30))  # fmt: skip
    made = await leases.create_namespaced_lease(ns, lease)
    with pytest.raises(ApiException) as exc:
        await leases.create_namespaced_lease(ns, lease)
    assert exc.value.status == 409 and body(exc.value)["reason"] == "AlreadyExists"
    made.spec.holder_identity = "b"
    taken = await leases.replace_namespaced_lease("lane", ns, made)
    assert taken.spec.holder_identity == "b"
    assert int(taken.metadata.resource_version) > int(made.metadata.resource_version)
    made.spec.holder_identity = "c"  # still carries the resourceVersion "b" replaced
    with pytest.raises(ApiException) as exc:
        await leases.replace_namespaced_lease("lane", ns, made)
    assert exc.value.status == 409 and body(exc.value)["reason"] == "Conflict"
    when = datetime(2026, 12, 4, 0, 0, 0, 123456, tzinfo=UTC)
    taken.spec.renew_time = when
    renewed = await leases.replace_namespaced_lease("lane", ns, taken)
    assert renewed.spec.renew_time == when
