"""The node's MachineConfigNode: the upgrade monitor's rules and the MCD's timelines as tables,
the pool a Node belongs to, the best-effort writer against the loopback API server, and the
real agent process keeping the status current through live and image updates."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from kubernetes_asyncio.client import ApiClient

from agent.cluster import mcn as M
from agent.cluster.kube import Kube
from agent.cluster.mcn_writer import MachineConfigNodeWriter
from agent.cluster.pool import NOT_YET_SET, PoolError, node_pool, pools_for_node, primary_pool
from standins.demo.loopback import SA_RULES, Cluster, P
from standins.kube import FakeKube
from standins.kube.resources import DEFAULT_RESOURCES, Registry

N = "worker-0"
BEFORE = M.Versions("rendered-worker-2", "rendered-worker-1")  # the Node during the update
AFTER = M.Versions("rendered-worker-2", "rendered-worker-2")  # after the Done annotations
T, F, U = "True", "False", "Unknown"


def run(steps: list[tuple[M.Change, M.Versions]]) -> list[M.Status]:
    """The status after each step, each step one second after the one before."""
    status, out = M.Status(), []
    for i, (change, versions) in enumerate(steps):
        status = M.apply(status, change, versions, f"2026-01-01T00:00:{i:02d}Z")
        out.append(status)
    return out


def cond(status: M.Status, kind: str) -> M.Condition:
    found = status.condition(kind)
    assert found is not None, f"no {kind} condition"
    return found


def shown(status: M.Status) -> dict[str, str]:
    """The conditions that are not False: what `oc get machineconfignode -o wide` stands out by."""
    return {c.type: c.status for c in status.conditions if c.status != F}


PREPARED, EXECUTED, POST = M.UPDATE_PREPARED, M.UPDATE_EXECUTED, M.UPDATE_POST_ACTION_COMPLETE
COMPLETE, FILES, DRAINED = M.UPDATE_COMPLETE, M.APPLIED_FILES_AND_OS, M.DRAINED
REBOOTED, RESUMED, UNCORDONED = M.REBOOTED_NODE, M.RESUMED, M.UNCORDONED
DEGRADED, UPDATED = M.NODE_DEGRADED, M.UPDATED

# (step, Node versions, the conditions shown after it); each timeline as the MCD and the drain
# controller write it (pkg/daemon/daemon.go syncNode and updateConfigAndState, update.go
# update() and performPostConfigChangeNodeDisruptionAction, drain_controller.go).
LIVE_AS_THE_MCD = [
    (M.needs_update(N), BEFORE, {}),
    (M.prepared(drain=False), BEFORE, {PREPARED: T}),
    (M.drain_not_required(), BEFORE, {PREPARED: T, EXECUTED: U}),
    (M.applying_files_and_os(False, True), BEFORE, {PREPARED: T, EXECUTED: U, FILES: U}),
    (M.applied_files_and_os(False, True), BEFORE, {PREPARED: T, EXECUTED: T, FILES: T}),
    (M.post_action_none(), BEFORE, {PREPARED: T, EXECUTED: T, FILES: T, POST: T}),
    (M.resumed("rendered-worker-2"), BEFORE,
     {PREPARED: T, EXECUTED: T, FILES: T, POST: T, RESUMED: T}),
    (M.uncordoned(), BEFORE,
     {PREPARED: T, EXECUTED: T, FILES: T, POST: T, RESUMED: T, COMPLETE: T, UNCORDONED: T}),
    (M.healthy(N), AFTER,
     {PREPARED: T, EXECUTED: T, FILES: T, POST: T, RESUMED: T, COMPLETE: T, UNCORDONED: T}),
    (M.updated(N), AFTER, {UPDATED: T}),
]  # fmt: skip

# Ours differs in one step: an update that never drained asks for no uncordon.
LIVE_AS_THE_AGENT = [
    *LIVE_AS_THE_MCD[:7],
    (M.uncordon_not_required(), BEFORE,
     {PREPARED: T, EXECUTED: T, FILES: T, POST: T, RESUMED: T, COMPLETE: T}),
    (M.healthy(N), AFTER, {PREPARED: T, EXECUTED: T, FILES: T, POST: T, RESUMED: T, COMPLETE: T}),
    (M.updated(N), AFTER, {UPDATED: T}),
]  # fmt: skip

_STAGED = {PREPARED: T, EXECUTED: T, FILES: T}
_DRAINED = {PREPARED: T, EXECUTED: T, FILES: T, DRAINED: T}
# The agent stages before it drains, then reports the executed phase complete again.
IMAGE_WITH_REBOOT = [
    (M.needs_update(N), BEFORE, {}),
    (M.prepared(drain=True), BEFORE, {PREPARED: T}),
    (M.applying_files_and_os(True, False), BEFORE, {PREPARED: T, EXECUTED: U, FILES: U}),
    (M.applied_files_and_os(True, False), BEFORE, _STAGED),
    (M.drained("drain-rendered-worker-2"), BEFORE, {**_DRAINED, EXECUTED: U}),
    (M.applied_files_and_os(True, False), BEFORE, _DRAINED),
    (M.rebooting(), BEFORE, {**_DRAINED, REBOOTED: U}),
    (M.healthy(N), BEFORE, {**_DRAINED, REBOOTED: U}),
    (M.rebooted(), BEFORE, {**_DRAINED, REBOOTED: T}),
    (M.resumed("rendered-worker-2"), BEFORE, {**_DRAINED, REBOOTED: T, RESUMED: T}),
    (M.uncordoned(), BEFORE,
     {**_DRAINED, REBOOTED: T, RESUMED: T, COMPLETE: T, UNCORDONED: T}),
    (M.resumed("rendered-worker-2", annotations_written=True), AFTER,
     {**_DRAINED, REBOOTED: T, RESUMED: T, COMPLETE: T, UNCORDONED: T}),
    (M.healthy(N), AFTER, {**_DRAINED, REBOOTED: T, RESUMED: T, COMPLETE: T, UNCORDONED: T}),
    (M.updated(N), AFTER, {UPDATED: T}),
]  # fmt: skip

CAUSE = "rolled back to quay.example/os/node@sha256:aaa: required check 50-app failed"
ROLLED_BACK = [
    *IMAGE_WITH_REBOOT[:8],
    (M.rebooted(), BEFORE, {**_DRAINED, REBOOTED: T}),  # booted the new image, checks failed
    (M.rebooting(), BEFORE, {**_DRAINED, REBOOTED: U}),  # the rollback's reboot
    (M.rebooted(), BEFORE, {**_DRAINED, REBOOTED: T}),
    (M.degraded(N, CAUSE), BEFORE, {**_DRAINED, REBOOTED: T, DEGRADED: T}),
]  # fmt: skip

REFUSAL = "can't reconcile config rendered-worker-1 with rendered-worker-2: FIPS changed"
UNRECONCILABLE = [
    (M.needs_update(N), BEFORE, {}),
    (M.not_compatible("rendered-worker-1", "rendered-worker-2", REFUSAL), BEFORE, {PREPARED: U}),
    (M.degraded(N, REFUSAL), BEFORE, {PREPARED: U, DEGRADED: T}),
]

TIMELINES = {
    "live update, as the MCD": LIVE_AS_THE_MCD,
    "live update, as the agent": LIVE_AS_THE_AGENT,
    "image update with reboot": IMAGE_WITH_REBOOT,
    "bad image rolled back": ROLLED_BACK,
    "unreconcilable": UNRECONCILABLE,
}


@pytest.mark.parametrize("name", TIMELINES)
def test_timeline_shows_the_conditions_the_mcd_shows(name: str) -> None:
    timeline = TIMELINES[name]
    statuses = run([(change, versions) for change, versions, _ in timeline])
    for i, (status, (change, _, expected)) in enumerate(zip(statuses, timeline, strict=True)):
        assert shown(status) == expected, f"after step {i} ({change.parent.message})"
        assert {c.type for c in status.conditions} == set(M.CONDITION_TYPES)


@pytest.mark.parametrize("name", ["live update, as the agent", "image update with reboot"])
def test_done_reports_the_new_config_and_keeps_what_happened(name: str) -> None:
    final = run([(change, versions) for change, versions, _ in TIMELINES[name]])[-1]
    assert (final.desired, final.current) == ("rendered-worker-2", "rendered-worker-2")
    assert cond(final, UPDATED).message == f"Node {N} Updated"
    resumed = final.condition(RESUMED)
    assert resumed is not None and resumed.status == F
    assert resumed.message.startswith("Action during update to rendered-worker-2: In desired")
    degraded = final.condition(DEGRADED)
    assert degraded is not None and degraded.message == f"Node {N} upgrade succeeded"


def test_config_version_during_an_update_and_after_a_refusal() -> None:
    statuses = run([(change, versions) for change, versions, _ in UNRECONCILABLE])
    assert (statuses[0].desired, statuses[0].current) == ("rendered-worker-2", "rendered-worker-1")
    assert statuses[1].desired == M.NOT_YET_SET  # a failed preparation puts the placeholder back
    assert statuses[2].desired == "rendered-worker-2"
    prepared = statuses[1].condition(PREPARED)
    assert prepared is not None and prepared.message == (
        "Update Failed compatibility validation. MachineConfigs rendered-worker-1 and "
        f"rendered-worker-2 are not compatible. Err: {REFUSAL}"
    )
    assert cond(statuses[2], DEGRADED).message == f"Node {N} upgrade failure. {REFUSAL}"


def test_unset_types_are_false_not_yet_occurred() -> None:
    (status,) = run([(M.needs_update(N), BEFORE)])
    assert status.conditions[0] == M.Condition(
        UPDATED, F, UPDATED, f"Node {N} needs an update", "2026-01-01T00:00:00Z"
    )
    for other in status.conditions[1:]:
        assert (other.status, other.reason) == (F, "NotYetOccurred")
        assert other.message == f"This node has not yet entered the {other.type} phase"
    assert status.observed_generation == 2  # the MCD writes generation + 1
    ahead = M.Status(status.conditions, observed_generation=7)  # never down: the CRD refuses it
    assert M.apply(ahead, M.updated(N), AFTER, "2026-01-01T00:00:01Z").observed_generation == 7


def test_child_reason_is_parent_type_plus_child_type() -> None:
    (_, status) = run([(M.needs_update(N), BEFORE), (M.drained("drain-rendered-worker-2"), BEFORE)])
    assert status.condition(EXECUTED) == M.Condition(
        EXECUTED, U, DRAINED, "Drained Node as part of update executed phase",
        "2026-01-01T00:00:01Z",
    )  # fmt: skip
    drained = status.condition(DRAINED)
    assert drained is not None and (drained.status, drained.reason) == (T, "UpdateExecutedDrained")
    assert drained.message.endswith("matches current drainer: drain-rendered-worker-2")


def test_updated_resets_the_others_with_the_update_named() -> None:
    statuses = run([(change, versions) for change, versions, _ in LIVE_AS_THE_AGENT])
    files = statuses[-1].condition(FILES)
    assert files is not None and (files.status, files.reason) == (
        F,
        "UpdateExecutedAppliedFilesAndOS",
    )
    assert files.message == (
        "Action during update to rendered-worker-2: Applied files and new OS config to node. "
        "OS did not need an update. SSH Keys did  need an update"  # the MCD's spacing
    )
    cordoned = statuses[-1].condition("Cordoned")  # never set: left as it was
    assert cordoned is not None and cordoned.reason == "NotYetOccurred"


def test_another_parent_turns_a_true_updated_false() -> None:
    *_, status = run([(M.updated(N), AFTER), (M.degraded(N, "disk full"), AFTER)])
    assert status.condition(UPDATED) == M.Condition(
        UPDATED, F, UPDATED, "This node is not updated, sensed disruption via a manual update.",
        "2026-01-01T00:00:01Z",
    )  # fmt: skip
    *_, healed = run([(M.updated(N), AFTER), (M.degraded(N, "disk full"), AFTER),
                      (M.healthy(N), AFTER), (M.updated(N), AFTER)])  # fmt: skip
    assert shown(healed) == {UPDATED: T}


def test_an_unchanged_parent_makes_the_step_a_no_op() -> None:
    (status,) = run([(M.rebooting(), BEFORE)])
    assert M.apply(status, M.rebooting(), AFTER, "2026-01-01T01:00:00Z") is status
    # Even with a new child: the MCD compares the parent only.
    drained = M.apply(status, M.drained("drain-x"), BEFORE, "2026-01-01T01:00:00Z")
    again = M.Change(cond(drained, EXECUTED), M.Condition(DRAINED, F, "x", "other"))
    assert M.apply(drained, again, BEFORE, "2026-01-01T02:00:00Z") is drained


def test_transition_time_moves_only_when_the_status_does() -> None:
    steps = [(M.needs_update(N), BEFORE), (M.resumed("a"), BEFORE), (M.resumed("b"), BEFORE),
             (M.updated(N), AFTER)]  # fmt: skip
    statuses = run(steps)
    assert cond(statuses[2], RESUMED).last_transition_time == "2026-01-01T00:00:01Z"
    assert cond(statuses[3], RESUMED).last_transition_time == "2026-01-01T00:00:03Z"
    assert cond(statuses[3], PREPARED).last_transition_time == "2026-01-01T00:00:00Z"


def test_conditions_stored_by_others_are_kept() -> None:
    theirs = {"type": "InternalReleaseImageDegraded", "status": "False", "reason": "AsExpected",
              "message": "ok", "lastTransitionTime": "2025-01-01T00:00:00Z"}  # fmt: skip
    version = {"desired": "rendered-worker-1", "current": "rendered-worker-1"}
    stored = M.Status.from_json({"conditions": [theirs], "configVersion": version})
    status = M.apply(stored, M.needs_update(N), BEFORE, "2026-01-01T00:00:00Z")
    assert status.conditions[0].type == "InternalReleaseImageDegraded"
    assert len(status.conditions) == len(M.CONDITION_TYPES) + 1
    assert M.Status.from_json(status.to_json()) == status


# -- the status against the CRD (machineconfiguration_v1_machineconfignodes.crd.yaml) ------------

KIT_CRD = (
    Path(__file__).resolve().parents[2]
    / "shared/kit/crds/machineconfiguration_v1_machineconfignodes.crd.yaml"
)
# From that CRD (openshift/api as vendored at MCO 7ff337a4), for where the kit is not around.
REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
TYPE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$")  # fmt: skip
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
REQUIRED = {"lastTransitionTime", "message", "reason", "status", "type"}


def _crd_status_schema() -> dict[str, Any] | None:
    if not KIT_CRD.exists():
        return None
    crd = yaml.safe_load(KIT_CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]


@pytest.mark.parametrize("name", TIMELINES)
def test_every_status_written_fits_the_crd(name: str) -> None:
    schema = _crd_status_schema()
    item = schema["properties"]["conditions"]["items"] if schema else None
    for status in run([(change, versions) for change, versions, _ in TIMELINES[name]]):
        body = status.to_json()
        assert len(body["conditions"]) <= 20  # maxItems
        for written in body["conditions"]:
            assert set(written) == REQUIRED
            assert written["status"] in ("True", "False", "Unknown")
            assert REASON.match(written["reason"]) and TYPE.match(written["type"])
            assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", written["lastTransitionTime"])
            if item is not None:
                assert set(item["required"]) == REQUIRED
                assert written["status"] in item["properties"]["status"]["enum"]
                assert re.match(item["properties"]["reason"]["pattern"], written["reason"])
                assert len(written["message"]) <= item["properties"]["message"]["maxLength"]
        assert set(body["configVersion"]) <= {"desired", "current"}
        assert all(DNS1123.match(v) for v in body["configVersion"].values())
        assert body["observedGeneration"] >= 1
        if schema is not None:
            assert set(body) <= set(schema["properties"])
            assert set(schema["properties"]["configVersion"]["required"]) <= set(
                body["configVersion"]
            )


def test_created_object_fits_the_crd_spec() -> None:
    body = M.new_machine_config_node(N, "worker", None, "uid-1")
    assert body["metadata"]["name"] == body["spec"]["node"]["name"]  # the CRD's rule
    assert body["spec"]["configVersion"] == {"desired": M.NOT_YET_SET}
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": N, "uid": "uid-1"}
    ]
    assert "ownerReferences" not in M.new_machine_config_node(N, "worker", "r", "")["metadata"]


# -- the pool a Node belongs to (pkg/helpers/helpers.go) ----------------------------------------


def _pool(name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeSelector": selector}}


def _role(role: str) -> dict[str, Any]:
    return {"matchLabels": {f"node-role.kubernetes.io/{role}": ""}}


def _pool_object(role: str) -> dict[str, Any]:
    """A pool as the API holds it: the nodes that carry the role's label."""
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
            **_pool(role, _role(role))}  # fmt: skip


POOLS = [_pool("master", _role("master")), _pool("worker", _role("worker")),
         _pool("infra", _role("infra")), _pool("gpu", _role("gpu"))]  # fmt: skip
ROLE = "node-role.kubernetes.io/"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({ROLE + "worker": ""}, ["worker"]),
        ({ROLE + "worker": "", ROLE + "infra": ""}, ["infra", "worker"]),  # custom over worker
        ({ROLE + "infra": ""}, ["infra"]),
        ({ROLE + "master": "", ROLE + "worker": ""}, ["master"]),
        ({ROLE + "master": "", ROLE + "infra": "", ROLE + "worker": ""}, ["master", "worker"]),
        ({"kubernetes.io/hostname": "worker-0"}, []),  # no pool
        ({ROLE + "worker": "", "kubernetes.io/os": "windows"}, []),  # not managed by the MCO
    ],
)
def test_pools_for_node(labels: dict[str, str], expected: list[str]) -> None:
    assert pools_for_node(N, labels, POOLS) == expected
    assert primary_pool(N, labels, POOLS) == (expected[0] if expected else None)


def test_two_custom_pools_are_an_error_naming_them() -> None:
    with pytest.raises(PoolError) as err:
        pools_for_node(N, {ROLE + "worker": "", ROLE + "infra": "", ROLE + "gpu": ""}, POOLS)
    assert str(err.value) == (
        "node worker-0 belongs to 2 custom pools (gpu, infra); a node may be in at most one "
        "custom pool besides worker"
    )


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (None, False),
        ({}, False),  # an empty selector matches nothing, not everything
        ({"matchLabels": {"a": "1"}}, True),
        ({"matchLabels": {"a": "2"}}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, False),
        ({"matchExpressions": [{"key": "z", "operator": "NotIn", "values": ["1"]}]}, True),
        ({"matchExpressions": [{"key": "b", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "b", "operator": "DoesNotExist"}]}, False),
        ({"matchLabels": {"a": "1"},
          "matchExpressions": [{"key": "z", "operator": "Exists"}]}, False),
    ],
)  # fmt: skip
def test_node_selector(selector: dict[str, Any] | None, matches: bool) -> None:
    assert bool(pools_for_node(N, {"a": "1", "b": ""}, [_pool("p", selector)])) is matches


def test_invalid_selector_is_an_error() -> None:
    bad = _pool("p", {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]})
    with pytest.raises(PoolError, match="unknown operator 'Gt'"):
        pools_for_node(N, {"a": "1"}, [bad])


# -- the writer against the loopback API server -------------------------------------------------


class _Writer:
    """A writer with the agent's service account, its Node in the store. `watched`: the Node as
    the agent's watch shows it (default: the store's, never behind); `read_node`: the create
    reads the Node from the server with the node's identity, as the agent does."""

    def __init__(
        self,
        kube: FakeKube,
        labels: dict[str, str],
        *,
        watched: dict[str, Any] | None = None,
        read_node: bool = False,
        rules: list[Any] = SA_RULES,
    ) -> None:
        kube.put({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": N, "labels": labels, "annotations": {
                      P + "desiredConfig": "rendered-worker-2",
                      P + "currentConfig": "rendered-worker-1"}}})  # fmt: skip
        sa = kube.service_account("openshift-machine-config-operator", "agent", rules)
        self.client = ApiClient(kube.client_configuration(sa))
        self.node_client = ApiClient(kube.client_configuration(kube.node_identity(N)))
        self.kube = kube
        node_api = Kube(self.node_client)
        self.writer = MachineConfigNodeWriter(
            Kube(self.client), N, lambda: watched or kube.get("Node", N), settle=0.0,
            read_node=(lambda: node_api.get(f"/api/v1/nodes/{N}")) if read_node else None,
        )  # fmt: skip

    async def close(self) -> None:
        await self.client.close()
        await self.node_client.close()

    def requests(self, verb: str) -> int:
        return self.kube.count_requests(verb=verb, resource="machineconfignodes")


@pytest.fixture
async def kube():
    server = FakeKube()
    for name in ("worker", "infra"):
        server.put(_pool_object(name))
    async with server:
        yield server


async def test_writer_creates_a_missing_mcn_then_writes_only_changes(kube: FakeKube) -> None:
    w = _Writer(kube, {ROLE + "worker": "", ROLE + "infra": ""})
    try:
        w.writer.record(M.needs_update(N))
        w.writer.record(M.prepared(drain=True))
        assert await w.writer.flush()
        obj = kube.get("MachineConfigNode", N)
        assert obj["spec"] == {"node": {"name": N}, "pool": {"name": "infra"},
                               "configVersion": {"desired": "rendered-worker-2"}}  # fmt: skip
        node_uid = kube.get("Node", N)["metadata"]["uid"]
        assert obj["metadata"]["ownerReferences"][0] == {
            "apiVersion": "v1", "kind": "Node", "name": N, "uid": node_uid,
        }  # fmt: skip
        assert shown(M.Status.from_json(obj["status"])) == {PREPARED: T}
        assert obj["status"]["configVersion"] == {
            "desired": "rendered-worker-2", "current": "rendered-worker-1",
        }  # fmt: skip
        patches = w.requests("patch")
        assert patches == 1  # the steps of one pass in one write
        w.writer.record(M.prepared(drain=True))  # nothing new
        assert await w.writer.flush()
        assert (w.requests("patch"), w.requests("get")) == (patches, 1)  # and nothing read
    finally:
        await w.close()


STALE_WATCH = {"metadata": {"name": N, "labels": {ROLE + "worker": ""},
                            "annotations": {P + "desiredConfig": "rendered-worker-2"}}}  # fmt: skip


@pytest.mark.parametrize(
    ("watched", "read_node"),
    [(None, False), (STALE_WATCH, True)],
    ids=["the watch has it", "the watch lags: read from the server"],
)
async def test_writer_creates_the_mcn_with_the_nodes_config_of_now(
    kube: FakeKube, watched: dict[str, Any] | None, read_node: bool
) -> None:
    """A step queued before the controller aimed the Node at a new config, written once the
    controller has (it found no MachineConfigNode to write its spec into): the object is
    created with the new config, as the MCD creates it from its current Node. Also when the
    agent's watch still shows the old one (it lags under load): the create reads the Node."""
    w = _Writer(kube, {ROLE + "worker": ""}, watched=watched, read_node=read_node)
    try:
        w.writer.record(M.needs_update(N))  # queued while desiredConfig is rendered-worker-2
        kube.patch_annotations("Node", N, {P + "desiredConfig": "rendered-worker-3"})
        assert await w.writer.flush()
        obj = kube.get("MachineConfigNode", N)
        assert obj["spec"]["configVersion"] == {"desired": "rendered-worker-3"}
    finally:
        await w.close()


async def test_writer_creates_from_the_watch_when_the_node_cannot_be_read(kube: FakeKube) -> None:
    w = _Writer(kube, {ROLE + "worker": ""}, read_node=True)
    try:
        kube.fail_requests(503, resource="nodes", times=-1)
        w.writer.record(M.needs_update(N))
        assert await w.writer.flush()
        obj = kube.get("MachineConfigNode", N)
        assert obj["spec"]["configVersion"] == {"desired": "rendered-worker-2"}
        assert kube.count_requests(verb="get", resource="nodes") >= 1  # it did try
    finally:
        await w.close()


async def test_writer_merges_what_a_controller_wrote_meanwhile(kube: FakeKube) -> None:
    w = _Writer(kube, {ROLE + "worker": ""})
    try:
        w.writer.record(M.needs_update(N))
        assert await w.writer.flush()
        # The drain controller writes its own steps (server-side apply, no resourceVersion).
        stored = M.Status.from_json(kube.get("MachineConfigNode", N)["status"])
        theirs = M.apply(stored, M.cordoned(), BEFORE, "2026-01-01T00:00:00Z", generation=1)
        kube.patch_status("MachineConfigNode", N, theirs.to_json())
        w.writer.record(M.prepared(drain=True))
        assert await w.writer.flush()  # 409 on the stale resourceVersion, read, apply again
        status = M.Status.from_json(kube.get("MachineConfigNode", N)["status"])
        assert shown(status) == {PREPARED: T, EXECUTED: U, "Cordoned": T}
        assert kube.count_requests(verb="patch", resource="machineconfignodes") == 3
    finally:
        await w.close()


async def test_writer_sets_the_spec_from_the_node_when_the_update_is_prepared(
    kube: FakeKube,
) -> None:
    """The controller writes the spec's desired config when it aims the Node, once, and not
    again when that write fails (openshift/machine-config-operator 7ff337a4
    pkg/controller/node/node_controller.go: UpdateMachineConfigNodeSpecDesiredAnnotations,
    its error only logged); the MCD applies the spec from its Node at "Update Compatible"
    (pkg/daemon/update.go: GenerateAndApplyMachineConfigNodeSpec), and so does the agent:
    a spec left behind is set right at the next update, and one that matches is not
    written."""
    w = _Writer(kube, {ROLE + "worker": ""})
    try:
        w.writer.record(M.needs_update(N))
        assert await w.writer.flush()
        stale = kube.get("MachineConfigNode", N)
        stale["spec"]["configVersion"] = {"desired": "rendered-worker-1"}  # the write lost
        kube.put(stale)
        w.writer.record(M.needs_update(N))  # a step with no preparation leaves the spec
        assert await w.writer.flush()
        assert kube.get("MachineConfigNode", N)["spec"]["configVersion"] == {
            "desired": "rendered-worker-1"
        }
        w.writer.record(M.prepared(drain=True))
        assert await w.writer.flush()
        obj = kube.get("MachineConfigNode", N)
        assert obj["spec"] == {"node": {"name": N}, "pool": {"name": "worker"},
                               "configVersion": {"desired": "rendered-worker-2"}}  # fmt: skip
        assert shown(M.Status.from_json(obj["status"]))[PREPARED] == T  # the status kept
        patches = w.requests("patch")
        w.writer.record(M.updated(N))
        w.writer.record(M.needs_update(N))
        w.writer.record(M.prepared(drain=True))  # the next update: the spec matches
        assert await w.writer.flush()
        assert w.requests("patch") == patches + 1  # the status only
    finally:
        await w.close()


async def test_writer_without_the_spec_grant_writes_the_status_and_leaves_the_spec(
    kube: FakeKube, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent upgraded before its RBAC (no patch on machineconfignodes): the status is
    written, the spec stays the controller's, the refusal is said once and not retried."""
    rules = [r for r in SA_RULES if r != ("patch", "machineconfiguration.openshift.io",
                                          "machineconfignodes")]  # fmt: skip
    w = _Writer(kube, {ROLE + "worker": ""}, rules=rules)
    try:
        w.writer.record(M.needs_update(N))
        assert await w.writer.flush()
        stale = kube.get("MachineConfigNode", N)
        stale["spec"]["configVersion"] = {"desired": "rendered-worker-1"}
        kube.put(stale)
        for _ in range(2):
            w.writer.record(M.updated(N))
            w.writer.record(M.prepared(drain=True))
            assert await w.writer.flush()  # nothing kept to write again
        obj = kube.get("MachineConfigNode", N)
        assert shown(M.Status.from_json(obj["status"]))[PREPARED] == T
        assert obj["spec"]["configVersion"] == {"desired": "rendered-worker-1"}
        assert capsys.readouterr().out.count("MachineConfigNode spec not set") == 1
    finally:
        await w.close()


async def test_writer_failures_are_logged_and_kept_for_later(kube: FakeKube) -> None:
    w = _Writer(kube, {ROLE + "worker": ""})
    try:
        kube.fail_requests(503, resource="machineconfignodes", times=-1)
        w.writer.record(M.needs_update(N))
        with structlog.testing.capture_logs() as logs:
            assert not await w.writer.flush()
            assert not await w.writer.flush()
        assert [e["event"] for e in logs] == ["MachineConfigNode not updated"]  # once
        kube.clear_faults()
        assert await w.writer.flush()
        assert shown(M.Status.from_json(kube.get("MachineConfigNode", N)["status"])) == {}
    finally:
        await w.close()


async def test_writer_two_custom_pools_logs_why_and_creates_nothing(kube: FakeKube) -> None:
    kube.put(_pool_object("gpu"))
    w = _Writer(kube, {ROLE + "worker": "", ROLE + "infra": "", ROLE + "gpu": ""})
    try:
        w.writer.record(M.needs_update(N))
        with structlog.testing.capture_logs() as logs:
            assert not await w.writer.flush()
        assert "belongs to 2 custom pools (gpu, infra)" in logs[0]["error"]
        assert kube.try_get("MachineConfigNode", N) is None
    finally:
        await w.close()


async def test_writer_no_pool_yet_uses_the_placeholder(kube: FakeKube) -> None:
    w = _Writer(kube, {})
    try:
        assert await node_pool(Kube(w.client), kube.get("Node", N)) == NOT_YET_SET
        w.writer.record(M.needs_update(N))
        assert await w.writer.flush()
        assert kube.get("MachineConfigNode", N)["spec"]["pool"] == {"name": NOT_YET_SET}
    finally:
        await w.close()


async def test_writer_turns_itself_off_without_the_mcn_api() -> None:
    server = FakeKube()
    server.registry = Registry([r for r in DEFAULT_RESOURCES if r.plural != "machineconfignodes"])
    async with server:
        w = _Writer(server, {})
        try:
            w.writer.record(M.needs_update(N))
            with structlog.testing.capture_logs() as logs:
                assert await w.writer.flush()
            assert not w.writer.enabled
            assert [e["log_level"] for e in logs] == ["info"]  # quietly
            before = len(server.requests)
            w.writer.record(M.updated(N))
            assert await w.writer.flush()
            assert len(server.requests) == before
        finally:
            await w.close()


async def test_writer_with_the_api_server_gone_gives_up_within_its_timeout(kube: FakeKube) -> None:
    w = _Writer(kube, {ROLE + "worker": ""})
    try:
        await kube.stop()
        w.writer.record(M.needs_update(N))
        async with asyncio.timeout(5):
            assert not await w.writer.flush(timeout=1.0)
    finally:
        await w.close()


# -- the agent process ---------------------------------------------------------------------------


@pytest.fixture
async def cluster(tmp_path: Path):
    c = await Cluster.create(tmp_path)
    c.kube.put(_pool_object("worker"))
    c.kube.patch_labels("Node", c.node, {ROLE + "worker": ""})
    yield c
    await c.close()


async def mcn_status(cluster: Cluster, predicate, timeout: float = 20.0) -> M.Status:
    obj = await cluster.kube.wait_for(
        "MachineConfigNode", cluster.node,
        lambda o: o is not None and predicate(M.Status.from_json(o.get("status"))),
        timeout=timeout,
    )  # fmt: skip
    assert obj is not None
    return M.Status.from_json(obj.get("status"))


def updated_to(config: str):
    return lambda s: shown(s) == {UPDATED: T} and s.current == config == s.desired


async def test_agent_keeps_the_mcn_current_through_live_and_image_updates(cluster: Cluster) -> None:
    assert cluster.kube.try_get("MachineConfigNode", cluster.node) is None
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    await mcn_status(cluster, updated_to("rendered-worker-1"))  # created, as the MCD does
    obj = cluster.kube.get("MachineConfigNode", cluster.node)
    assert obj["spec"]["pool"] == {"name": "worker"}
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "Node"

    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    cluster.set_desired("rendered-worker-2")
    await cluster.wait_done("rendered-worker-2")
    status = await mcn_status(cluster, updated_to("rendered-worker-2"))
    post = status.condition(POST)
    assert post is not None and post.reason == "None"
    assert (
        post.message == "Action during update to rendered-worker-2: Changes do not require a reboot"
    )

    cluster.kube.enable_drain_controller()
    cluster.add_config("rendered-worker-3", "v2", keys=["ssh-ed25519 AAAA-two"])
    cluster.set_desired("rendered-worker-3", **{P + "desiredImage": cluster.images["v2"]})
    assert await asyncio.wait_for(cluster.procs[-1].wait(), 30) == 3  # the simulated reboot
    before_boot = M.Status.from_json(cluster.kube.get("MachineConfigNode", cluster.node)["status"])
    assert shown(before_boot) == {PREPARED: T, EXECUTED: T, FILES: T, DRAINED: T, REBOOTED: U}
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-3")
    status = await mcn_status(cluster, updated_to("rendered-worker-3"))
    rebooted = status.condition(REBOOTED)
    assert rebooted is not None
    assert rebooted.message == "Action during update to rendered-worker-3: Node has rebooted"


async def test_agent_reports_an_unreconcilable_update_as_node_degraded(cluster: Cluster) -> None:
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v1", fips=True)
    cluster.set_desired("rendered-worker-2")
    status = await mcn_status(cluster, lambda s: shown(s) == {PREPARED: U, DEGRADED: T})
    degraded = status.condition(DEGRADED)
    assert degraded is not None and degraded.message.startswith(
        "Node worker-0 upgrade failure. can't reconcile config rendered-worker-1 with "
        "rendered-worker-2: "
    )
    assert status.current == "rendered-worker-1"
