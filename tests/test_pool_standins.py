"""The stand-ins of the machine-config-controller (standins/kube/pool_rules.py,
standins/kube/node_controller.py, standins/kube/render_controller.py,
standins/kube/mcn_status.py) checked against the controller's own
code at openshift/machine-config-operator 7ff337a4: the cases of its unit tables
(pkg/controller/node/node_controller_test.go TestGetCandidateMachines, TestMaxUnavailable,
TestSortNodeList; non-layered cases only), then the controllers on a loopback server."""

from __future__ import annotations

from typing import Any

import pytest

from standins.kube import FakeKube, NodeController, RenderController
from standins.kube import mcn_status as M
from standins.kube import pool_rules as R
from standins.kube.render_controller import merge_configs
from tests.scenarios.standin import base_config, node_object, pool_object

P = "machineconfiguration.openshift.io/"
V0, V1, V2 = "rendered-worker-v0", "rendered-worker-v1", "rendered-worker-v2"


def node(name: str, current: str | None, desired: str | None, ready: bool = True,
         state: str = "Done", **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A Node as the controller's test helpers build one (NewNodeWithReady: state Done)."""
    annotations = {P + "currentConfig": current, P + "desiredConfig": desired, P + "state": state}
    labels = {"node-role.kubernetes.io/worker": ""}
    if "zone" in extra:
        labels[R.ZONE] = extra["zone"]
    return {"metadata": {"name": name, "labels": labels,
                         "creationTimestamp": extra.get("created", "1970-01-01T00:00:00Z"),
                         "annotations": {k: v for k, v in annotations.items() if v is not None}},
            "spec": {"unschedulable": True} if extra.get("cordoned") else {},
            "status": {"conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}  # fmt: skip


def pool(config: str = V1, max_unavailable: Any = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"configuration": {"name": config},
                            "nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
                            **spec}  # fmt: skip
    if max_unavailable is not None:
        body["maxUnavailable"] = max_unavailable
    return {"metadata": {"name": "worker", "generation": 1}, "spec": body}


def names(nodes: list[dict[str, Any]]) -> list[str]:
    return [n["metadata"]["name"] for n in nodes]


# -- TestGetCandidateMachines (non-layered): (progress, nodes, expected, other, capacity) --------
CANDIDATES = {
    "no progress - capacity 1": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1), node("node-2", V1, V1)], [], [], 1),
    "no progress - capacity 0": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1), node("node-2", V1, V1, ready=False)],
        [], [], 0),
    "no progress because we have an unavailable node": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1, ready=False), node("node-2", V0, V1)],
        [], [], 0),
    "node-0 is unavailable and should be skipped over": (
        2, [node("node-0", V0, V0, ready=False), node("node-1", V0, V0), node("node-2", V0, V0)],
        ["node-1"], ["node-2"], 1),
    "node-2 is going to change config, so we can only progress one more": (
        3, [node("node-0", V1, V1), node("node-1", V1, V1, ready=False), node("node-2", V0, V1),
            node("node-3", V0, V0), node("node-4", V0, V0)],
        ["node-3"], ["node-4"], 1),
    "We have a node working, don't start anything else": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1), node("node-2", V0, V1),
            node("node-3", V0, V0), node("node-4", V0, V0)],
        [], [], 0),
    "progress on old stuck node": (
        1, [node("node-0", V1, V1), node("node-1", "v0.1", "v0.2", state="Degraded"),
            node("node-2", V0, V0)],
        ["node-1"], ["node-2"], 1),
    "Don't change a degraded node to same config, but also don't start another": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1, state="Degraded"),
            node("node-2", V0, V0)],
        [], [], 0),
    "Must be able to roll back": (
        1, [node("node-0", V1, V1), node("node-1", V1, V1),
            node("node-2", V1, V2, state="Degraded"), node("node-3", V1, V1)],
        ["node-2"], [], 1),
    "Validate we also don't affect nodes which haven't started work": (
        1, [node("node-0", V1, V1), node("node-2", V1, V2), node("node-3", V1, V1)], [], [], 0),
    "More nodes in mixed order": (
        4, [node("node-0", V1, V1), node("node-1", V1, V1, ready=False), node("node-2", V0, V1),
            node("node-3", V0, V0), node("node-4", V0, V0), node("node-5", V0, V0),
            node("node-6", V0, V0), node("node-7", V1, V1), node("node-8", V1, V1)],
        ["node-3", "node-4"], ["node-5", "node-6"], 2),
}  # fmt: skip


@pytest.mark.parametrize("case", CANDIDATES, ids=list(CANDIDATES))
def test_candidates_as_the_controllers_table(case: str) -> None:
    progress, nodes, expected, other, capacity = CANDIDATES[case]
    target = pool(max_unavailable=progress)
    found, room = R.all_candidates(target, nodes)
    assert room == capacity
    assert names(R.candidates(target, nodes)) == expected
    assert names(found)[len(expected) :] == other


@pytest.mark.parametrize(("value", "expected"), [
    (None, 1), (2, 2), (0, 1), ("50%", 2), ("60%", 2),
])  # fmt: skip
def test_max_unavailable_as_the_controllers_table(value: Any, expected: int) -> None:
    assert R.max_unavailable(pool(max_unavailable=value), 4) == expected


@pytest.mark.parametrize("value", ["50 percent", "60", "40 %"])
def test_max_unavailable_refuses_what_the_controller_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="invalid value for IntOrString"):
        R.max_unavailable(pool(max_unavailable=value), 4)


def test_sort_as_the_controllers_table() -> None:
    """TestSortNodeList: zones first (by zone, then age), then the Nodes with none by age."""
    at = {42: "1970-01-01T00:00:00Z", 100: "1970-01-01T00:01:40Z", 200: "1970-01-01T00:03:20Z",
          900: "1970-01-01T00:15:00Z", 1500: "1970-01-01T00:25:00Z"}  # fmt: skip
    made = {
        "node-1": node("node-1", V1, V1, zone="QQQ", created=at[42]),
        "node-2": node("node-2", V1, V1, zone="RRR", created=at[42]),
        "node-3": node("node-3", V1, V1, zone="RRR", created=at[100]),
        "node-4": node("node-4", V1, V1, zone="ZZZ", created=at[42]),
        "node-5": node("node-5", V1, V1, zone="ZZZ", created=at[100]),
        "node-6": node("node-6", V1, V1, zone="ZZZ", created=at[1500]),
        "node-7": node("node-7", V1, V1, created=at[42]),
        "node-8": node("node-8", V1, V1, created=at[200]),
        "node-9": node("node-9", V1, V1, created=at[900]),
    }
    given = ["node-5", "node-6", "node-4", "node-3", "node-8", "node-2", "node-9", "node-7",
             "node-1"]  # fmt: skip
    assert names(R.sort_candidates([made[n] for n in given])) == [f"node-{k}" for k in range(1, 10)]


def test_paused_or_unconfigured_pool_aims_nothing() -> None:
    nodes = [node("node-0", V0, V0), node("node-1", V0, V0)]
    assert R.candidates(pool(paused=True), nodes) == []
    assert R.candidates(pool(config=""), nodes) == []
    assert names(R.candidates(pool(), nodes)) == ["node-0"]


def test_a_node_the_daemon_never_managed_is_unavailable() -> None:
    """No currentConfig: not done and not failing, so it holds the pool's capacity (the
    reference notes: the controller ignores such a Node and counts it unavailable)."""
    fresh = node("node-0", None, None, state="")
    assert R.is_unavailable(fresh)
    assert R.candidates(pool(), [fresh, node("node-1", V0, V0)]) == []


def test_primary_pool_custom_wins_over_worker_master_over_all() -> None:
    worker, infra, master, gpu = (
        {"metadata": {"name": n}, "spec": {"nodeSelector": {"matchLabels": {f"role/{n}": ""}}}}
        for n in ("worker", "infra", "master", "gpu")
    )
    labelled = {"metadata": {"name": "n", "labels": {"role/worker": "", "role/infra": ""}}}
    assert R.primary_pool(labelled, [worker, infra]) == "infra"
    labelled["metadata"]["labels"]["role/master"] = ""
    assert R.primary_pool(labelled, [worker, infra, master]) == "master"
    two_custom = {"metadata": {"name": "n", "labels": {"role/infra": "", "role/gpu": ""}}}
    assert R.primary_pool(two_custom, [worker, infra, gpu]) is None


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def test_status_counts_and_conditions_while_updating_then_updated() -> None:
    target = pool()
    nodes = [node("node-0", V1, V1), node("node-1", V0, V1, state="Working"),
             node("node-2", V0, V0)]  # fmt: skip
    status = R.pool_status(target, nodes, now="T1")
    assert {k: status[k] for k in ("machineCount", "updatedMachineCount", "readyMachineCount",
                                   "unavailableMachineCount", "degradedMachineCount")} == {
        "machineCount": 3, "updatedMachineCount": 1, "readyMachineCount": 1,
        "unavailableMachineCount": 1, "degradedMachineCount": 0,
    }  # fmt: skip
    assert conditions(status)["Updated"] == ("False", "", "")
    assert conditions(status)["Updating"] == ("True", "", f"All nodes are updating to "
                                              f"MachineConfig {V1}")  # fmt: skip
    assert status["configuration"] == {}  # not all there yet: the old one stays
    target["status"] = status
    done = [node(f"node-{k}", V1, V1) for k in range(3)]
    status = R.pool_status(target, done, now="T2")
    assert conditions(status)["Updated"] == ("True", "", f"All nodes are updated with "
                                             f"MachineConfig {V1}")  # fmt: skip
    assert status["configuration"] == {"name": V1}
    times = {c["type"]: c["lastTransitionTime"] for c in status["conditions"]}
    assert times["Updated"] == "T2" and times["NodeDegraded"] == "T1"  # unchanged: kept


def test_a_cordoned_node_at_its_config_is_updated_but_not_ready() -> None:
    status = R.pool_status(pool(), [node("node-0", V1, V1, cordoned=True)], now="T")
    assert (status["updatedMachineCount"], status["readyMachineCount"]) == (1, 0)
    assert status["unavailableMachineCount"] == 1
    assert conditions(status)["Updated"][0] == "False"


def test_degraded_message_from_machineconfignodes_then_reasons() -> None:
    """calculateStatus: the count and the first reasons come from MachineConfigNodes that
    report NodeDegraded, then their Nodes' reason annotations; the NodeDegraded condition is
    set from the Nodes' state annotations."""
    bad = node("node-1", V0, V1, state="Degraded")
    bad["metadata"]["annotations"][P + "reason"] = 'rolled back to "v0"'
    nodes = [node("node-0", V1, V1), bad]
    degraded = {"type": "NodeDegraded", "status": "True", "message": "boot check failed"}
    mcns = {"node-0": {"status": {"conditions": [{"type": "Updated", "status": "True"}]}},
            "node-1": {"status": {"conditions": [degraded]}}}  # fmt: skip
    status = R.pool_status(pool(), nodes, mcns, now="T")
    assert status["degradedMachineCount"] == 1
    assert conditions(status)["NodeDegraded"] == (
        "True", "1 nodes are reporting degraded status on sync",
        'Node node-1 is reporting: "boot check failed", '
        'Node node-1 is reporting: "rolled back to \\"v0\\""',
    )  # fmt: skip
    assert conditions(status)["Degraded"][0] == "True"
    # Without MachineConfigNodes the condition is still set, with no message.
    status = R.pool_status(pool(), nodes, {}, now="T")
    assert conditions(status)["NodeDegraded"] == (
        "True",
        "0 nodes are reporting degraded status on sync",
        "",
    )
    # The controller's loop stops at the first MachineConfigNode with no conditions.
    mcns["node-0"] = {"status": {}}
    assert conditions(R.pool_status(pool(), nodes, mcns))["NodeDegraded"][1].startswith("0 ")


def test_taint_on_nodes_not_at_the_pools_config() -> None:
    assert R.needs_taint(node("node-0", V0, V0), pool())
    assert not R.needs_taint(node("node-0", V0, V1), pool())


# -- the render stand-in ------------------------------------------------------------------------
def mc(name: str, role: str = "worker", annotations: dict[str, str] | None = None,
       **spec: Any) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": name, "labels": {P + "role": role},
                         "annotations": annotations or {}}, "spec": spec}  # fmt: skip


def test_merge_order_and_fields_as_merge_machine_configs() -> None:
    core = {"name": "core", "sshAuthorizedKeys": ["ssh-a"]}
    configs = [
        mc("99-worker-ssh", config={"ignition": {"version": "3.5.0"}, "passwd": {"users": [
            {"name": "core", "sshAuthorizedKeys": ["ssh-b"]}]}}),
        mc("00-worker", config={"ignition": {"version": "3.5.0"}, "passwd": {"users": [core]},
                                "storage": {"files": [{"path": "/etc/a", "mode": 420}]}},
           kernelArguments=["a=1"], osImageURL="ignored@sha256:1",
           annotations={P + "generated-by-controller-version": "v"}),
        mc("50-custom", role="infra", kernelType="realtime", kernelArguments=["b=2"],
           config={"ignition": {"version": "3.5.0"},
                   "storage": {"files": [{"path": "/etc/a", "mode": 384}]}}),
        mc("98-worker-os", osImageURL="quay.example/os@sha256:2", fips=True),
    ]  # fmt: skip
    spec = merge_configs(configs, "base@sha256:0")
    users = spec["config"]["passwd"]["users"]
    assert users == [{"name": "core", "sshAuthorizedKeys": ["ssh-a", "ssh-b"]}]
    # worker configs by name first, then the others: the custom pool's file wins
    assert spec["config"]["storage"]["files"] == [{"path": "/etc/a", "mode": 384,
                                                   "overwrite": True}]  # fmt: skip
    assert spec["kernelArguments"] == ["a=1", "b=2"]
    assert spec["kernelType"] == "realtime" and spec["fips"] is True
    # a generated config never overrides osImageURL; the last user config does
    assert spec["osImageURL"] == "quay.example/os@sha256:2"
    assert merge_configs(configs[:3], "base@sha256:0")["osImageURL"] == "base@sha256:0"


# -- the MachineConfigNode writes -------------------------------------------------------------
def test_mcn_phase_written_once_and_the_child_alone_changes_nothing() -> None:
    n = node("node-0", V0, V1)
    first = M.applied({"metadata": {"generation": 3}, "status": {}}, n, M.cordoned(False))
    kinds = [c["type"] for c in first["conditions"]]
    assert kinds[:2] == ["UpdateExecuted", "Cordoned"] and len(kinds) == len(set(kinds)) == 14
    assert first["conditions"][1]["reason"] == "UpdateExecutedCordoned"
    assert first["conditions"][1]["message"].endswith("Unschedulable = false")
    assert first["configVersion"] == {"desired": V1, "current": V0}
    assert first["observedGeneration"] == 4
    mcn = {"metadata": {"generation": 3}, "status": first}
    # Draining: the parent's message changes, so both are written.
    draining = M.applied(mcn, n, M.draining(f"drain-{V1}", ""))
    assert {c["type"]: c["status"] for c in draining["conditions"]}["Drained"] == "Unknown"
    # The same parent again: nothing is written, even with a new child.
    again = M.Phase("UpdateExecuted", "Drained", "Unknown", "True",
                    "Cordoned Node as part of update executed phase", "x")  # fmt: skip
    assert M.applied(mcn, n, again) is None


def test_mcn_updated_true_becomes_false_on_a_new_phase() -> None:
    updated = {"type": "Updated", "status": "True", "reason": "", "message": "Node Updated"}
    mcn = {"metadata": {}, "status": {"conditions": [updated]}}
    status = M.applied(mcn, node("node-0", V1, V2), M.cordoned(False))
    updated = next(c for c in status["conditions"] if c["type"] == "Updated")
    assert (updated["status"], updated["message"]) == ("False", M.MANUAL_UPDATE)


# -- the controllers on a loopback server ------------------------------------------------------
@pytest.fixture
async def kube():
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


async def config_named(kube: FakeKube, predicate) -> str:
    """Until the worker pool names a config that satisfies `predicate`; returns it."""
    found = await kube.wait_for("machineconfigpools", "worker", lambda p: predicate(
        (p["spec"].get("configuration") or {}).get("name")), timeout=5)  # fmt: skip
    return found["spec"]["configuration"]["name"]


async def test_render_and_node_controllers_roll_a_pool_one_node_at_a_time(kube: FakeKube) -> None:
    kube.put({"apiVersion": f"{P[:-1]}/v1", "kind": "ControllerConfig",
              "metadata": {"name": "machine-config-controller"},
              "spec": {"osImageURL": "quay.example/os@sha256:0"}})  # fmt: skip
    kube.put(pool_object("worker", {}))
    kube.put(base_config("worker"))
    for k in range(3):
        kube.put(node_object(f"worker-{k}"))
    render, nodes = RenderController(kube), NodeController(kube)
    render.start()
    nodes.start()
    try:
        first = await config_named(kube, lambda name: bool(name))
        assert first.startswith("rendered-worker-") and len(first) == len("rendered-worker-") + 32
        # Nodes the daemon never managed hold the capacity: nothing is aimed at them.
        await render.idle()
        await nodes.idle()
        assert nodes.targeted == []
        pool_now = kube.get("machineconfigpools", "worker")
        assert pool_now["status"]["unavailableMachineCount"] == 3
        for k in range(3):  # what the daemons' first start writes
            seed = {P + "currentConfig": first, P + "desiredConfig": first, P + "state": "Done"}
            kube.patch_annotations("nodes", f"worker-{k}", seed)
        await kube.wait_for("machineconfigpools", "worker", lambda p: p["status"].get(
            "configuration", {}).get("name") == first, timeout=5)  # fmt: skip
        kube.put({"apiVersion": f"{P[:-1]}/v1", "kind": "MachineConfig",
                  "metadata": {"name": "99-worker-os", "labels": {P + "role": "worker"}},
                  "spec": {"osImageURL": "quay.example/os@sha256:1"}})  # fmt: skip
        second = await config_named(kube, lambda name: name != first)
        assert kube.get("machineconfigs", second)["spec"]["osImageURL"].endswith("sha256:1")
        for k in range(3):
            # One Node aimed at a time: it must finish before the next is picked.
            await kube.wait_for("nodes", f"worker-{k}", lambda n: n["metadata"]["annotations"]
                                .get(P + "desiredConfig") == second, timeout=5)  # fmt: skip
            await nodes.idle()
            aimed = [n for n in kube.list("nodes")
                     if n["metadata"]["annotations"][P + "desiredConfig"] == second]  # fmt: skip
            assert names(aimed) == [f"worker-{j}" for j in range(k + 1)]
            taints = {n["metadata"]["name"]: n["spec"].get("taints") for n in kube.list("nodes")}
            assert all(taints[f"worker-{j}"] is None for j in range(k + 1))
            assert all(taints[f"worker-{j}"] == [R.UPDATE_IN_PROGRESS_TAINT]
                       for j in range(k + 1, 3))  # fmt: skip
            kube.patch_annotations("nodes", f"worker-{k}", {P + "currentConfig": second})
        final = await kube.wait_for("machineconfigpools", "worker", lambda p: p["status"].get(
            "configuration", {}).get("name") == second, timeout=5)  # fmt: skip
        assert final["status"]["updatedMachineCount"] == 3
        assert nodes.targeted == [(f"worker-{k}", second) for k in range(3)]
    finally:
        render.stop()
        nodes.stop()
