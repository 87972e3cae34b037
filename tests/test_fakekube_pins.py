"""fakekube against what the real kube-apiserver answered: the behaviours the project learned in
its conformance runs that tests/test_fakekube.py did not pin yet (admission's Node taint, status
subresources, namespaced RBAC with resourceNames, deploy/admission.yaml's policy with node-bound
tokens), and how the policy plugin words and codes what it refuses."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml

from standins.demo.loopback import LEASE_RULES, NAMESPACED_SA_RULES, SA_RULES, SCOPED_SA_RULES
from standins.kube import (
    NODE_NAME_CLAIM,
    NOT_READY_TAINT,
    FakeKube,
    Identity,
    Rule,
    rules_for_user,
    service_account_rules,
)
from tests.scenarios.fake import AGENT_SA, MCO_NS, agent_rules

TOP = Path(__file__).resolve().parents[1]
DEPLOY = TOP / "deploy"
MC = "machineconfiguration.openshift.io"
MCN = f"/apis/{MC}/v1/machineconfignodes"
MCP = f"/apis/{MC}/v1/machineconfigpools"
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAPB = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
MERGE = "application/merge-patch+json"
POLICY = "image-mode-agent-mcn-guards"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


async def call(
    kube: FakeKube,
    who: Identity | None,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """One request as `who` (the admin if None): (status, decoded JSON body)."""
    headers = {"Authorization": f"Bearer {kube.token_for(who)}", "Content-Type": content_type}
    data = None if body is None else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, kube.url + path, data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def ok(kube: FakeKube, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    status, answer = await call(kube, None, method, path, body, **kw)
    assert status in (200, 201), (status, answer)
    return answer


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


def _mcn(node: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": f"{MC}/v1", "kind": "MachineConfigNode", "metadata": {"name": node},
            "spec": {"node": {"name": node}, "pool": {"name": "worker"},
                     "configVersion": {"desired": "rendered-worker-1"}}, **extra}  # fmt: skip


def _pool(name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": f"{MC}/v1", "kind": "MachineConfigPool", "metadata": {"name": name},
            "spec": {"paused": False}, **extra}  # fmt: skip


# -- TaintNodesByCondition --------------------------------------------------------------------


async def test_a_node_created_through_the_api_is_tainted_not_ready(kube: FakeKube) -> None:
    # Recorded: by the conformance tier only in fakekube's docstring (differences, 8b5f4b1).
    taint = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    assert taint == NOT_READY_TAINT
    made = await ok(kube, "POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    assert made["spec"]["taints"] == [taint]
    # Other taints stay; the same key and effect is not added twice (a value does not matter).
    own = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "value": "x"}
    other = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
    made = await ok(kube, "POST", "/api/v1/nodes",
                    {"metadata": {"name": "n2"}, "spec": {"taints": [other, own]}})  # fmt: skip
    assert made["spec"]["taints"] == [other, own]
    made = await ok(kube, "POST", "/api/v1/nodes",
                    {"metadata": {"name": "n3"}, "spec": {"taints": [other]}})  # fmt: skip
    assert made["spec"]["taints"] == [other, taint]
    # A PUT that creates is a CREATE for admission too; a kubelet registering itself as well.
    made = await ok(kube, "PUT", "/api/v1/nodes/n4", {"metadata": {"name": "n4"}})
    assert made["spec"]["taints"] == [taint]
    status, made = await call(kube, kube.node_identity("n5"), "POST", "/api/v1/nodes",
                              {"metadata": {"name": "n5"}})  # fmt: skip
    assert status == 201 and made["spec"]["taints"] == [taint]
    # Only on create: once the node controller (here: anyone) removes it, updates leave it out.
    fixed = await ok(kube, "PATCH", "/api/v1/nodes/n1", {"spec": {"taints": None}},
                     content_type=MERGE)  # fmt: skip
    assert "taints" not in fixed["spec"]
    fixed = await ok(kube, "PUT", "/api/v1/nodes/n1", fixed)
    assert "taints" not in fixed["spec"]
    # The in-process helper is test setup, not a write through the API: no admission.
    put = kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n6"}, "spec": {}})
    assert put["spec"] == {}


# -- status subresources ----------------------------------------------------------------------


@pytest.mark.parametrize(("path", "make"), [(MCN, _mcn), (MCP, _pool)], ids=["mcn", "mcp"])
async def test_custom_resources_with_a_status_subresource(
    kube: FakeKube, path: str, make: Any
) -> None:
    # Recorded: kube-apiserver v1.32 (its patches), tests/conformance/README.md (MCN status).
    status = {"observedGeneration": 1, "conditions": []}
    made = await ok(kube, "POST", path, make("a", status=status))
    assert "status" not in made and made["metadata"]["generation"] == 1  # create drops .status
    kube.patch_status(made["kind"], "a", status)

    # The main endpoint ignores .status (merge patch and PUT), takes the rest.
    patched = await ok(kube, "PATCH", f"{path}/a", {"metadata": {"labels": {"l": "1"}},
                       "spec": {"x": 1}, "status": {"observedGeneration": 9}},
                       content_type=MERGE)  # fmt: skip
    assert patched["status"] == status and patched["metadata"]["labels"] == {"l": "1"}
    assert patched["spec"]["x"] == 1 and patched["metadata"]["generation"] == 2
    replaced = await ok(kube, "PUT", f"{path}/a", {**patched, "status": {"gone": True}})
    assert replaced["status"] == status
    assert replaced["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]

    # /status touches .status only: spec, labels and annotations sent along are dropped.
    written = await ok(kube, "PATCH", f"{path}/a/status", {
        "metadata": {"labels": {"l": "2"}, "annotations": {"a": "b"}}, "spec": {"x": 2},
        "status": {"observedGeneration": 2}}, content_type=MERGE)  # fmt: skip
    assert written["status"] == {"observedGeneration": 2, "conditions": []}
    assert written["spec"]["x"] == 1 and written["metadata"]["labels"] == {"l": "1"}
    assert "annotations" not in written["metadata"] and written["metadata"]["generation"] == 2
    put = await ok(kube, "PUT", f"{path}/a/status",
                   {**written, "spec": {"x": 3}, "status": {"observedGeneration": 3}})  # fmt: skip
    assert put["status"] == {"observedGeneration": 3} and put["spec"]["x"] == 1


async def test_node_status_subresource_may_change_metadata(kube: FakeKube) -> None:
    # Recorded: kube-apiserver v1.32 (patches of nodes/status and of annotations, both 200).
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    made = await ok(kube, "POST", "/api/v1/nodes",
                    {"metadata": {"name": "n"}, "spec": {}, "status": ready})  # fmt: skip
    assert made["status"] == ready  # a kubelet registers with its status: nodes keep it
    patched = await ok(kube, "PATCH", "/api/v1/nodes/n", {"status": {"conditions": []}},
                       content_type=MERGE)  # fmt: skip
    assert patched["status"] == ready  # the main endpoint ignores .status
    me = kube.node_identity("n")
    status, written = await call(kube, me, "PATCH", "/api/v1/nodes/n/status", {
        "metadata": {"labels": {"l": "1"}, "annotations": {"a": "b"}},
        "spec": {"unschedulable": True}, "status": {"capacity": {"cpu": "2"}}},
        MERGE)  # fmt: skip
    assert status == 200, written
    assert written["metadata"]["labels"] == {"l": "1"}
    assert written["metadata"]["annotations"] == {"a": "b"}
    assert written["status"]["capacity"] == {"cpu": "2"} and written["status"]["conditions"]
    assert written["spec"] == made["spec"]  # nodes/status never changes the spec


# -- RBAC from deploy/rbac.yaml: a namespaced Role with resourceNames -------------------------


def test_rules_from_rbac_yaml_match_the_demos() -> None:
    rules = agent_rules()
    cluster_wide = {r[:3] for r in rules if not r.namespace and not r.names}
    assert cluster_wide == set(SA_RULES)
    scoped = [r for r in rules if r.namespace]
    kubeconfig_data = Rule("get", "", "configmaps", MCO_NS, ("kubeconfig-data",))
    leases = [Rule(*rule, MCO_NS) for rule in LEASE_RULES]
    assert scoped == SCOPED_SA_RULES == [kubeconfig_data, *leases]
    assert {r[:3] for r in scoped} == set(NAMESPACED_SA_RULES) | set(LEASE_RULES)
    # The SCC grant is cluster-wide, for one name (nothing here serves it).
    assert [r for r in rules if r.names and not r.namespace] == [
        Rule("use", "security.openshift.io", "securitycontextconstraints", "", ("privileged",))
    ]
    # image-mode-agent-node-writer has no binding in the file: nothing of it is granted (the
    # pre-pull order's one list of Nodes is the service account's own, read-only rule).
    assert [r for r in rules if r.resource in ("nodes", "events")] == [Rule("list", "", "nodes")]


def test_rules_follow_bindings_and_subjects() -> None:
    """As the RBAC authorizer resolves them: a RoleBinding to a ClusterRole grants it in the
    binding's namespace only; a ServiceAccount subject without a namespace is the binding's; a
    Group subject matches the service-account groups; a binding to a missing role, or one that
    names someone else, grants nothing."""
    docs: list[Any] = [
        {"kind": "ClusterRole", "metadata": {"name": "reader"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"kind": "Role", "metadata": {"name": "cm", "namespace": "ns"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                    "resourceNames": ["a", "b"]}]},
        {"kind": "RoleBinding", "metadata": {"name": "x", "namespace": "ns"},
         "roleRef": {"kind": "ClusterRole", "name": "reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa"}]},
        {"kind": "RoleBinding", "metadata": {"name": "y", "namespace": "ns"},
         "roleRef": {"kind": "Role", "name": "cm"},
         "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ns"}]},
        {"kind": "ClusterRoleBinding", "metadata": {"name": "z"},
         "roleRef": {"kind": "ClusterRole", "name": "missing"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]},
        {"kind": "ClusterRoleBinding", "metadata": {"name": "w"},
         "roleRef": {"kind": "ClusterRole", "name": "reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "other"}]},
        None,
    ]  # fmt: skip
    assert service_account_rules(docs, "ns", "sa") == [
        Rule("get", "", "pods", "ns"), Rule("list", "", "pods", "ns"),
        Rule("get", "", "configmaps", "ns", ("a", "b")),
    ]  # fmt: skip
    assert rules_for_user(docs, "someone", ["system:authenticated"]) == []


async def test_namespaced_role_limited_to_kubeconfig_data(kube: FakeKube) -> None:
    # Recorded: tests/conformance/README.md (deploy/rbac.yaml applied for real, kubeconfig-data).
    for ns in (MCO_NS, "default"):
        for name in ("kubeconfig-data", "other"):
            meta = {"name": name, "namespace": ns}
            kube.put(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}
            )
    sa = kube.service_account(MCO_NS, AGENT_SA, agent_rules())
    user = f"system:serviceaccount:{MCO_NS}:{AGENT_SA}"
    status, cm = await call(kube, sa, "GET", f"/api/v1/namespaces/{MCO_NS}/configmaps/"
                            "kubeconfig-data")  # fmt: skip
    assert status == 200 and cm["data"] == {"k": "kubeconfig-data"}

    def denied(name: str, ns: str) -> str:
        return (f'configmaps "{name}" is forbidden: User "{user}" cannot get resource '
                f'"configmaps" in API group "" in the namespace "{ns}"')  # fmt: skip

    for name, ns in (("other", MCO_NS), ("kubeconfig-data", "default")):
        status, answer = await call(kube, sa, "GET", f"/api/v1/namespaces/{ns}/configmaps/{name}")
        assert status == 403, answer
        assert (answer["reason"], answer["message"]) == ("Forbidden", denied(name, ns))
        assert answer["details"] == {"name": name, "kind": "configmaps"}
    # resourceNames grant no list of the namespace.
    status, answer = await call(kube, sa, "GET", f"/api/v1/namespaces/{MCO_NS}/configmaps")
    assert status == 403 and "cannot list resource" in answer["message"], answer
    # The 3-tuple form is still "everywhere, any name".
    wide = kube.service_account("ns", "wide", [("get", "", "configmaps")])
    status, _ = await call(kube, wide, "GET", "/api/v1/namespaces/default/configmaps/other")
    assert status == 200


# -- deploy/admission.yaml: the MachineConfigNode guard and node-bound tokens ------------------


def test_a_node_bound_service_account_token_carries_the_node() -> None:
    # Recorded: tests/conformance/README.md (tests/conformance/test_deploy_manifests.py: the
    # pod-bound token).
    bound = Identity.service_account(MCO_NS, AGENT_SA, [], node="node-a")
    assert bound.extra == {NODE_NAME_CLAIM: ["node-a"]}
    assert NODE_NAME_CLAIM == "authentication.kubernetes.io/node-name"
    assert Identity.service_account(MCO_NS, AGENT_SA, []).extra == {}
    assert bound.user == f"system:serviceaccount:{MCO_NS}:{AGENT_SA}"


async def test_admission_yaml_guards_the_agents_own_machineconfignode() -> None:
    # Recorded: tests/conformance/README.md (tests/conformance/test_deploy_manifests.py, the
    # guard's every case).
    kube = FakeKube(admission_policy_delay=0.3)
    async with kube:
        rules = agent_rules()
        on_a = kube.service_account(MCO_NS, AGENT_SA, rules, node="node-a")
        unbound = kube.service_account(MCO_NS, AGENT_SA, rules)
        for node in ("node-a", "node-b"):
            kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            await ok(kube, "POST", MCN, _mcn(node))

        async def patch_status(who: Identity, node: str, desired: str) -> tuple[int, Any]:
            body = {"status": {"configVersion": {"desired": desired}}}
            return await call(kube, who, "PATCH", f"{MCN}/{node}/status", body, MERGE)

        # Before the guard, RBAC alone lets the agent's account write any MachineConfigNode.
        assert (await patch_status(on_a, "node-b", "rendered-worker-2"))[0] == 200

        policy, binding = _docs("admission.yaml")
        assert (await ok(kube, "POST", VAP, policy))["metadata"]["name"] == POLICY
        await ok(kube, "POST", VAPB, binding)
        created = time.monotonic()
        while True:  # as the conformance test waits for the plugin to pick the policy up
            status, answer = await patch_status(on_a, "node-b", "rendered-worker-2")
            if status != 200:
                break
            assert time.monotonic() - created < 5, "the policy never took effect"
            await asyncio.sleep(0.05)
        assert 0.25 <= time.monotonic() - created < 2
        assert status == 403, answer
        message = (f'machineconfignodes.{MC} "node-b" is forbidden: ValidatingAdmissionPolicy '
                   f"'{POLICY}' with binding '{POLICY}' denied request: image-mode-agent on node "
                   "node-a may not write MachineConfigNode node-b")  # fmt: skip
        assert (answer["code"], answer["reason"], answer["message"]) == (403, "Forbidden",
                                                                          message)  # fmt: skip
        cause = message.split(" is forbidden: ", 1)[1]
        assert answer["details"] == {"name": "node-b", "group": MC, "kind": "machineconfignodes",
                                     "causes": [{"message": cause}]}  # fmt: skip

        # Its own node's: allowed, to patch the status and to create; another's: refused.
        status, answer = await patch_status(on_a, "node-a", "rendered-worker-2")
        assert status == 200, answer
        assert answer["status"]["configVersion"]["desired"] == "rendered-worker-2"
        status, answer = await call(kube, on_a, "POST", MCN, _mcn("node-c"))
        assert status == 403 and f"ValidatingAdmissionPolicy '{POLICY}'" in answer["message"]
        assert "may not write MachineConfigNode node-c" in answer["message"], answer
        assert kube.try_get("MachineConfigNode", "node-c") is None
        await ok(kube, "DELETE", f"{MCN}/node-a")
        status, answer = await call(kube, on_a, "POST", MCN, _mcn("node-a"))
        assert status == 201, answer

        # No node claim: refused for both, with the first validation's message.
        for node in ("node-a", "node-b"):
            status, answer = await patch_status(unbound, node, "rendered-worker-3")
            assert status == 403, answer
            assert answer["message"].endswith(
                f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
                'image-mode-agent needs a token bound to a node (claim '
                '"authentication.kubernetes.io/node-name")'
            ), answer  # fmt: skip
        # Every other user is not matched: the admin writes either.
        for node in ("node-a", "node-b"):
            body = {"status": {"configVersion": {"desired": "rendered-worker-3"}}}
            await ok(kube, "PATCH", f"{MCN}/{node}/status", body, content_type=MERGE)
        # A refused write leaves nothing behind (node-b still has what node-a's token wrote
        # before the guard, then the admin's).
        assert kube.get("MachineConfigNode", "node-b")["status"]["configVersion"] == {
            "desired": "rendered-worker-3"
        }


# -- the policy plugin's words and codes (staging/src/k8s.io/apiserver/pkg/admission/plugin/
#    policy/validating: dispatcher.go, validator.go; plugin/cel/filter.go) --------------------


def _policy(name: str, validations: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                "resources": ["configmaps"]}]}, "validations": validations, **spec}}  # fmt: skip


def _binding(name: str, actions: tuple[str, ...] = ("Deny",), **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": f"{name}-binding"},
            "spec": {"policyName": name, "validationActions": list(actions), **spec}}  # fmt: skip


async def _create_cm(kube: FakeKube, name: str, data: dict[str, str]) -> tuple[int, Any]:
    return await call(kube, None, "POST", "/api/v1/namespaces/default/configmaps",
                      {"metadata": {"name": name}, "data": data})  # fmt: skip


@pytest.mark.parametrize(
    ("validation", "spec", "code", "reason", "message"),
    [
        ({"expression": "object.data.k == 'good'"}, {}, 422, "Invalid",
         "failed expression: object.data.k == 'good'"),
        ({"expression": "object.data.k == 'good'", "reason": "Forbidden", "message": " no. "}, {},
         403, "Forbidden", "no."),
        ({"expression": "object.data.k == 'good'", "reason": "Unauthorized",
          "message": "fallback", "messageExpression": "1 + 1"}, {}, 401, "Unauthorized",
         "fallback"),
        ({"expression": "object.data.k == 'good'", "reason": "RequestEntityTooLarge",
          "messageExpression": "'k is ' + object.data.k"}, {}, 413, "RequestEntityTooLarge",
         "k is bad"),
        ({"expression": "object.data.missing == 'x'"}, {}, 422, "Invalid",
         "expression 'object.data.missing == 'x'' resulted in error: no such member"),
        ({"expression": "object.data.k ==", "reason": "Forbidden"}, {}, 422, "Invalid",
         "compilation error: "),
        ({"expression": "true"}, {"matchConditions": [{"name": "c", "expression": "1 +"}]}, 422,
         "Invalid", "compilation error: "),
        ({"expression": "variables.ok"},
         {"variables": [{"name": "ok", "expression": "object.data.k == 'good'"}]}, 422,
         "Invalid", "failed expression: variables.ok"),
    ],
    ids=["default-invalid", "forbidden-message", "unauthorized-fallback", "message-expression",
         "eval-error", "compile-error", "match-condition-error", "variables"],
)  # fmt: skip
async def test_policy_refusals_are_worded_and_coded_like_the_plugin(
    kube: FakeKube,
    validation: dict[str, Any],
    spec: dict[str, Any],
    code: int,
    reason: str,
    message: str,
) -> None:
    await ok(kube, "POST", VAP, _policy("p", [validation], **spec))
    await ok(kube, "POST", VAPB, _binding("p"))
    status, answer = await _create_cm(kube, "c", {"k": "bad"})
    assert (status, answer["code"], answer["reason"]) == (code, code, reason), answer
    prefix = (
        "configmaps \"c\" is forbidden: ValidatingAdmissionPolicy 'p' with binding "
        f"'p-binding' denied request: {message}"
    )
    assert answer["message"].startswith(prefix), answer["message"]
    assert answer["details"]["causes"] == [{"message": answer["message"].split(
        " is forbidden: ", 1)[1]}]  # fmt: skip
    if message.startswith(("failed", "no.", "fallback", "k is")):
        assert (await _create_cm(kube, "c", {"k": "good"}))[0] == 201


async def test_policy_scope_failure_policy_and_actions(kube: FakeKube) -> None:
    """What a policy does not refuse: Ignore on errors, false matchConditions, a binding that
    only warns, a policy with no binding, writes not matched by the rules, in-process writes;
    UPDATE sees oldObject, and a no-op update is refused all the same."""
    never = {"expression": "false", "message": "never"}
    await ok(kube, "POST", VAP, _policy("unbound", [never]))
    await ok(kube, "POST", VAP, _policy("ignore", [{"expression": "1 +"}],
                                        failurePolicy="Ignore"))  # fmt: skip
    await ok(kube, "POST", VAPB, _binding("ignore"))
    await ok(kube, "POST", VAP, _policy("warn", [never]))
    await ok(kube, "POST", VAPB, _binding("warn", ("Warn", "Audit")))
    await ok(kube, "POST", VAP, _policy("cond", [never], matchConditions=[
        {"name": "only-x", "expression": "object.metadata.name == 'x'"}]))  # fmt: skip
    await ok(kube, "POST", VAPB, _binding("cond"))
    assert (await _create_cm(kube, "a", {"k": "1"}))[0] == 201
    status, answer = await _create_cm(kube, "x", {"k": "1"})
    assert status == 422 and "ValidatingAdmissionPolicy 'cond'" in answer["message"]

    # oldObject on UPDATE; a binding's matchResources narrows the policy.
    await ok(kube, "POST", VAP, _policy("grow", [{
        "expression": "oldObject == null || size(object.data) >= size(oldObject.data)",
        "reason": "Forbidden", "message": "data may only grow"}]))  # fmt: skip
    await ok(kube, "POST", VAPB, _binding("grow", matchResources={
        "objectSelector": {"matchLabels": {"guard": "yes"}}}))  # fmt: skip
    path = "/api/v1/namespaces/default/configmaps/a"
    await ok(kube, "PATCH", path, {"data": {"k": None}}, content_type=MERGE)  # not labelled
    await ok(kube, "PATCH", path, {"metadata": {"labels": {"guard": "yes"}}, "data": {"k": "1"}},
             content_type=MERGE)  # fmt: skip
    status, answer = await call(kube, None, "PATCH", path, {"data": {"k": None}}, MERGE)
    assert (status, answer["reason"]) == (403, "Forbidden"), answer
    assert answer["message"].endswith("denied request: data may only grow")
    kube.patch("ConfigMap", "a", {"data": {"k": None}}, namespace="default")  # setup: no admission
    assert kube.get("ConfigMap", "a", "default")["data"] == {}
    # Deleting the binding lifts the policy.
    await ok(kube, "DELETE", f"{VAPB}/grow-binding")
    await ok(kube, "PATCH", path, {"data": {"k": "1", "j": "2"}}, content_type=MERGE)
    await ok(kube, "PATCH", path, {"data": {"k": None}}, content_type=MERGE)

    # Validating admission runs before the store finds an update changes nothing.
    await ok(kube, "POST", VAP, _policy("frozen", [{
        "expression": "object.metadata.name != 'frozen'", "reason": "Forbidden"}]))  # fmt: skip
    await ok(kube, "POST", VAPB, _binding("frozen"))
    kube.put({"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "frozen", "namespace": "default"}})  # fmt: skip
    same = kube.get("ConfigMap", "frozen", "default")
    status, answer = await call(kube, None, "PUT", "/api/v1/namespaces/default/configmaps/frozen",
                                same)  # fmt: skip
    assert status == 403, answer
    assert kube.get("ConfigMap", "frozen", "default") == same


async def test_no_policy_needs_no_cel_python() -> None:
    """The demo and the agent never import celpy: writes through the API with no policy, or with
    policies that match nothing written, leave it unloaded (in a process of its own, as this
    one has imported it already)."""
    script = """
import asyncio, json, sys, urllib.request
from standins.kube import FakeKube

def req(kube, method, path, body):
    r = urllib.request.Request(kube.url + path, method=method, data=json.dumps(body).encode(),
                               headers={"Authorization": "Bearer " + kube.token_for(),
                                        "Content-Type": "application/" + (
                                            "merge-patch+json" if method == "PATCH" else "json")})
    return urllib.request.urlopen(r, timeout=5).status

def policy(name, group, resources, expression):  # on every write of them, bound to deny
    vap = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolic"
    rule = {"apiGroups": [group], "apiVersions": ["*"], "operations": ["*"],
            "resources": resources}
    req(kube, "POST", vap + "ies", {"metadata": {"name": name}, "spec": {
        "matchConstraints": {"resourceRules": [rule]},
        "validations": [{"expression": expression}]}})
    req(kube, "POST", vap + "ybindings", {"metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]}})

kube = FakeKube().start_in_thread()
try:
    req(kube, "POST", "/api/v1/nodes", {"metadata": {"name": "n"}})
    policy("p", "x.io", ["*"], "false")
    req(kube, "PATCH", "/api/v1/nodes/n", {"metadata": {"labels": {"a": "b"}}})
    print("celpy" in sys.modules)
    policy("q", "", ["nodes"], "true")
    req(kube, "PATCH", "/api/v1/nodes/n", {"metadata": {"labels": {"a": "c"}}})
    print("celpy" in sys.modules)
finally:
    kube.stop_in_thread()
"""
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", script], cwd=TOP, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]  # a matched policy does load it
