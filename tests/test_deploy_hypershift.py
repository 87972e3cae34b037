"""deploy/hypershift/: what an operator installs to run the agent as the node side of a hosted
cluster's InPlace NodePool (docs/mco-protocol.md §15), checked
on the loopback API server (standins/kube):

* rbac.yaml, as the RBAC authorizer reads it (fakekube's rules_for_user, Group subject
  included): the kubelet's identity lists and watches the NodePool's upgrade ConfigMap with the
  agent's own client and selector, and reads no other ConfigMap; it uses the pre-pull lanes'
  Leases in the upgrade namespace (create any, read and update the lanes only, delete none) and
  lists the Nodes (no get, no watch of another Node);
* admission.yaml: the machine-config-daemon pod the upgrader would start is refused with the
  policy's message; other pods there, and MCD pods elsewhere, are admitted; deleting the
  binding brings the MCD pod back;
* agent.env: the arguments systemd hands to `image-mode-agent run`.

(That the real kube-apiserver accepts both manifests and enforces them the same way:
tests/conformance/test_deploy_manifests.py.)"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
import yaml

from agent.app.cli import build_parser
from agent.cluster.kube import Kube
from agent.cluster.watch import ObjectWatch
from standins.kube import FakeKube, Identity, Rule, rules_for_user

TOP = Path(__file__).resolve().parents[1]
HCP = TOP / "deploy" / "hypershift"
NP = "np"  # the NodePool of these tests: its upgrade namespace and ConfigMap are np-upgrade
UPGRADE = f"{NP}-upgrade"
NODE = f"{NP}-0"
NODE_GROUPS = ("system:nodes", "system:authenticated")
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAPB = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
POLICY = "image-mode-agent-no-mcd-pod"
# The real API server labels every Namespace with its name; fakekube does not, so the tests
# put the label on the Namespaces they make.
NAME_LABEL = "kubernetes.io/metadata.name"


def _text(name: str, nodepool: str | None = None) -> str:
    """A manifest as shipped, or with NODEPOOL replaced as its header tells the operator."""
    text = (HCP / name).read_text()
    return text if nodepool is None else text.replace("NODEPOOL", nodepool)


def _docs(name: str, nodepool: str | None = None) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_text(name, nodepool)) if d]


def _header(name: str) -> str:
    return _text(name).split("\napiVersion:", 1)[0]


async def call(kube: FakeKube, who: Identity | None, method: str, path: str,
               body: Any = None) -> tuple[int, Any]:  # fmt: skip
    """One request as `who` (the admin if None): (status, decoded JSON body)."""
    headers = {"Authorization": f"Bearer {kube.token_for(who)}",
               "Content-Type": "application/json"}  # fmt: skip
    data = None if body is None else json.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, kube.url + path, data=data, headers=headers) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[FakeKube]:
    server = FakeKube()
    await server.start()
    yield server
    await server.stop()


def _namespace(kube: FakeKube, name: str) -> None:
    kube.put({"apiVersion": "v1", "kind": "Namespace",
              "metadata": {"name": name, "labels": {NAME_LABEL: name}}})  # fmt: skip


# -- the manifests say what they are for ------------------------------------------------------


def test_manifests_parse_and_say_what_they_are_for() -> None:
    for name in ("rbac.yaml", "admission.yaml"):
        header = _header(name)
        assert header.startswith("# "), name
        assert "docs/install.md" in header and "HyperShift" in header, name
        assert "NODEPOOL" in header, f"{name}: does not say to replace NODEPOOL"
        for doc in _docs(name):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], name
    # Two Roles + RoleBindings for one NodePool's namespace and one ClusterRole +
    # ClusterRoleBinding, for every node's kubelet.
    role, binding, prepull, prepull_binding, order, order_binding = _docs("rbac.yaml")
    assert [d["kind"] for d in (role, binding, prepull, prepull_binding, order, order_binding)] \
        == ["Role", "RoleBinding"] * 2 + ["ClusterRole", "ClusterRoleBinding"]  # fmt: skip
    for doc in (role, binding, prepull, prepull_binding):
        assert doc["metadata"]["namespace"] == "NODEPOOL-upgrade"
    assert prepull["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": [f"image-mode-prepull-NODEPOOL-{k}" for k in range(10)],
         "verbs": ["get", "list", "watch", "update"]},
    ]  # fmt: skip
    assert order["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    assert "NODEPOOL" not in str(order) + str(order_binding)  # one for every NodePool
    for ref, bound in ((prepull, prepull_binding), (order, order_binding)):
        kind, name = ref["kind"], ref["metadata"]["name"]
        assert bound["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                    "name": name}  # fmt: skip
        assert bound["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                      "name": "system:nodes"}]  # fmt: skip
    # Each says why, and what RBAC cannot narrow.
    text = " ".join(line.lstrip("# ") for line in _text("rbac.yaml").splitlines())
    assert "They cannot limit create" in text and "no delete" in text
    assert "RBAC cannot narrow a list of Nodes" in text and "AuthorizeNodeWithSelectors" in text
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["NODEPOOL-upgrade"],
                              "verbs": ["get", "list", "watch"]}]  # fmt: skip
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                    "name": "system:nodes"}]  # fmt: skip
    # The admission policy: what it refuses, what that costs, and the way back.
    header = " ".join(line.lstrip("# ") for line in _header("admission.yaml").splitlines())
    assert "machine-config-daemon-*" in header and "CREATE" in header
    assert "error at each reconcile" in header
    assert '"Also observed"' in header and "Upstream bug observed" in header
    assert f"oc delete validatingadmissionpolicybinding {POLICY}" in header
    assert "way back to the MCD" in header
    policy, vapb = _docs("admission.yaml")
    assert (policy["kind"], vapb["kind"]) == ("ValidatingAdmissionPolicy",
                                              "ValidatingAdmissionPolicyBinding")  # fmt: skip
    assert policy["metadata"]["name"] == vapb["spec"]["policyName"] == POLICY
    assert vapb["metadata"]["name"] == POLICY
    assert vapb["spec"]["validationActions"] == ["Deny"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"]) == (["CREATE"], ["pods"])
    (selector,) = vapb["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == {"key": NAME_LABEL, "operator": "In", "values": ["NODEPOOL-upgrade"]}


# -- rbac.yaml: the kubelet's identity reads the upgrade ConfigMap, and nothing else ----------


def _node_rules() -> list[Rule]:
    return rules_for_user(_docs("rbac.yaml", NP), f"system:node:{NODE}", NODE_GROUPS)


LANES = tuple(f"image-mode-prepull-{NP}-{k}" for k in range(10))


def test_rbac_grants_the_nodes_group_the_configmap_the_lanes_and_a_node_list() -> None:
    names = (UPGRADE,)
    assert _node_rules() == [
        *(Rule(verb, "", "configmaps", UPGRADE, names) for verb in ("get", "list", "watch")),
        Rule("create", "coordination.k8s.io", "leases", UPGRADE),
        *(Rule(verb, "coordination.k8s.io", "leases", UPGRADE, LANES)
          for verb in ("get", "list", "watch", "update")),
        Rule("list", "", "nodes"),
    ]  # fmt: skip
    # Only through the group: a user outside system:nodes gets nothing from it.
    assert rules_for_user(_docs("rbac.yaml", NP), f"system:node:{NODE}",
                          ["system:authenticated"]) == []  # fmt: skip


async def test_node_identity_watches_its_upgrade_configmap_and_reads_no_other(
    kube: FakeKube, tmp_path: Path
) -> None:
    for ns in (UPGRADE, "other-upgrade"):
        _namespace(kube, ns)
    for ns, name in ((UPGRADE, UPGRADE), (UPGRADE, "other"), ("other-upgrade", "other-upgrade"),
                     ("default", "kube-root-ca.crt")):  # fmt: skip
        meta = {"name": name, "namespace": ns}
        kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                  "data": {"hash": "0000000a"}})  # fmt: skip
    collection = f"/api/v1/namespaces/{UPGRADE}/configmaps"

    # Without the grant the kubelet's identity may not read it (no pod of the node uses it).
    bare = kube.node_identity(NODE)
    status, answer = await call(kube, bare, "GET", f"{collection}/{UPGRADE}")
    assert status == 403, answer

    node = kube.node_identity(NODE, _node_rules())
    status, answer = await call(kube, node, "GET", f"{collection}/{UPGRADE}")
    assert (status, answer["data"]) == (200, {"hash": "0000000a"})
    # The agent's own client and watch (agent/hypershift/agent.py follows the ConfigMap with
    # ObjectWatch): list, then watch, both narrowed by fieldSelector=metadata.name.
    api = await Kube.connect(str(kube.write_kubeconfig(tmp_path / "node.kubeconfig", node)))
    watch = ObjectWatch(api, collection, UPGRADE)
    task = asyncio.create_task(watch.run())
    try:
        async with asyncio.timeout(3):
            await watch.synced.wait()
            assert watch.obj is not None and watch.obj["data"] == {"hash": "0000000a"}
            await kube.wait_for_watches(1, "configmaps")
            kube.patch("ConfigMap", UPGRADE, {"data": {"hash": "0000000b"}}, namespace=UPGRADE)
            await watch.wait_for(lambda cm: (cm or {}).get("data", {}).get("hash") == "0000000b")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
    reads = [(r.verb, r.status) for r in kube.requests
             if r.user == node.user and r.resource == "configmaps"]  # fmt: skip
    assert ("list", 200) in reads and ("watch", 200) in reads, reads

    # Nothing else: not the namespace's other ConfigMaps, not a list of all of them, not
    # another NodePool's, not elsewhere.
    for path in (f"{collection}/other", collection,
                 f"{collection}?fieldSelector=metadata.name%3Dother",
                 "/api/v1/namespaces/other-upgrade/configmaps/other-upgrade",
                 "/api/v1/namespaces/default/configmaps/kube-root-ca.crt",
                 "/api/v1/namespaces/default/configmaps", "/api/v1/configmaps"):  # fmt: skip
        status, answer = await call(kube, node, "GET", path)
        assert status == 403, (path, answer)
        assert f'User "system:node:{NODE}" cannot' in answer["message"], answer


async def test_node_identity_uses_the_lanes_and_lists_nodes_and_nothing_more(
    kube: FakeKube,
) -> None:
    """What the bounded pre-pulls need, as the loopback server enforces it for group
    system:nodes: each request the agent makes is allowed, its neighbours are not."""
    for ns in (UPGRADE, "other-upgrade"):
        _namespace(kube, ns)
    labels = {"hypershift.openshift.io/nodePool": NP}
    for name in (NODE, f"{NP}-1"):
        kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    node = kube.node_identity(NODE, _node_rules())
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{UPGRADE}/leases"

    def lease(name: str) -> dict[str, Any]:
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": UPGRADE},
                "spec": {"holderIdentity": NODE}}  # fmt: skip

    lane = LANES[0]
    assert (await call(kube, node, "POST", leases, lease(lane)))[0] == 201
    status, body = await call(kube, node, "GET", f"{leases}/{lane}")
    assert status == 200
    assert (await call(kube, node, "PUT", f"{leases}/{lane}", body))[0] == 200
    for query in (f"fieldSelector=metadata.name%3D{lane}",
                  f"fieldSelector=metadata.name%3D{lane}&watch=1&timeoutSeconds=1"):  # fmt: skip
        assert (await call(kube, node, "GET", f"{leases}?{query}"))[0] == 200, query
    # The Nodes of the NodePool, as the agent lists them once per target.
    selector = "labelSelector=hypershift.openshift.io%2FnodePool%3Dnp"
    status, listed = await call(kube, node, "GET", f"/api/v1/nodes?resourceVersion=0&{selector}")
    assert status == 200 and {n["metadata"]["name"] for n in listed["items"]} == {NODE, f"{NP}-1"}

    # Create cannot be narrowed by name (any Lease of that namespace); nothing else is granted.
    assert (await call(kube, node, "POST", leases, lease("any-name")))[0] == 201
    refused = [
        ("GET", f"{leases}/any-name"), ("PUT", f"{leases}/any-name"),
        ("DELETE", f"{leases}/{lane}"), ("GET", leases),
        ("GET", f"{leases}?fieldSelector=metadata.name%3Dany-name"),
        ("GET", f"{leases}/image-mode-prepull-{NP}-10"),
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/other-upgrade/leases"),
        ("GET", f"/api/v1/nodes/{NP}-1"), ("GET", "/api/v1/nodes?watch=1"),
    ]  # fmt: skip
    for method, path in refused:
        body = lease("x") if method == "POST" else (kube.try_get("Lease", "any-name", UPGRADE)
                                                    if method == "PUT" else None)  # fmt: skip
        status, answer = await call(kube, node, method, path, body)
        assert status == 403, (method, path, answer)
    # Without the grant (the kit's ConfigMap Role only) the Node list is refused, as the agent
    # finds out before it falls back to the jitter with a PrestageUnbounded Event.
    bare = kube.node_identity(NODE, [Rule(v, "", "configmaps", namespace=UPGRADE)
                                     for v in ("get", "list", "watch")])  # fmt: skip
    status, answer = await call(kube, bare, "GET", "/api/v1/nodes")
    assert status == 403 and "cannot read all nodes" in answer["message"], answer


# -- admission.yaml: no MCD pod in the listed upgrade namespaces ------------------------------


def _pod(name: str) -> dict[str, Any]:
    """A pod as the upgrader makes it (docs/mco-protocol.md §15 step 13)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "hostNetwork": True, "hostPID": True, "restartPolicy": "OnFailure",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "machine-config-daemon",
                                     "image": "quay.example/mco@sha256:" + "0" * 64,
                                     "command": ["/usr/bin/machine-config-daemon", "start",
                                                 f"--node-name={NODE}"],
                                     "securityContext": {"privileged": True}}]}}  # fmt: skip


async def test_admission_refuses_the_mcd_pod_in_the_listed_upgrade_namespace(
    kube: FakeKube,
) -> None:
    for ns in (UPGRADE, "other-upgrade"):
        _namespace(kube, ns)
    mcd = f"machine-config-daemon-{NODE}"
    # Before the policy (the first in-place rollout made one for every node): not touched by
    # the policy, which refuses creations only; the header says to delete it.
    early = f"machine-config-daemon-{NP}-1"
    assert (await call(kube, None, "POST", f"/api/v1/namespaces/{UPGRADE}/pods", _pod(early)))[0] \
        == 201  # fmt: skip
    policy, binding = _docs("admission.yaml", NP)
    for path, doc in ((VAP, policy), (VAPB, binding)):
        status, answer = await call(kube, None, "POST", path, doc)
        assert status == 201, answer

    status, answer = await call(kube, None, "POST", f"/api/v1/namespaces/{UPGRADE}/pods",
                                _pod(mcd))  # fmt: skip
    assert (status, answer["reason"]) == (403, "Forbidden"), answer
    assert answer["message"] == (
        f"pods \"{mcd}\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding "
        f"'{POLICY}' denied request: image-mode-agent is this NodePool's node side (a host "
        f"service): no pod {mcd} in {UPGRADE}; delete ValidatingAdmissionPolicyBinding "
        f"{POLICY} to bring the MCD back"
    )
    assert kube.try_get("Pod", mcd, UPGRADE) is None
    # Another pod in that namespace, and an MCD pod in a namespace the binding does not list.
    for ns, name in ((UPGRADE, "debug-np-0"), ("other-upgrade", mcd),
                     (UPGRADE, "machine-config-daemon")):  # fmt: skip
        status, answer = await call(kube, None, "POST", f"/api/v1/namespaces/{ns}/pods",
                                    _pod(name))  # fmt: skip
        assert status == 201, (ns, name, answer)
    # Updates are not matched: the pod made before the binding can still be changed (deleted).
    status, answer = await call(kube, None, "PUT", f"/api/v1/namespaces/{UPGRADE}/pods/{early}",
                                kube.get("Pod", early, UPGRADE))  # fmt: skip
    assert status == 200, answer

    # The way back: without the binding the MCD pod is admitted again.
    status, _ = await call(kube, None, "DELETE", f"{VAPB}/{POLICY}")
    assert status == 200
    status, answer = await call(kube, None, "POST", f"/api/v1/namespaces/{UPGRADE}/pods",
                                _pod(mcd))  # fmt: skip
    assert status == 201, answer


# -- agent.env: what systemd hands the agent ---------------------------------------------------


def _environment_file(text: str) -> dict[str, str]:
    """The assignments of an EnvironmentFile= (systemd.exec(5)): comment and empty lines are
    skipped, a quoted value is unquoted. This file uses no line continuation."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), line
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), line
        (env[key],) = shlex.split(value)
    return env


def test_agent_env_runs_the_hypershift_source_with_the_kubelets_kubeconfig() -> None:
    text = (HCP / "agent.env").read_text()
    assert text.startswith("# /etc/image-mode-agent/agent.env")
    env = _environment_file(text)
    assert list(env) == ["IMAGE_MODE_AGENT_ARGS"]
    # ExecStart=... $IMAGE_MODE_AGENT_ARGS: systemd splits the value at whitespace.
    unit = (TOP / "systemd" / "image-mode-agent.service").read_text()
    assert "EnvironmentFile=-/etc/image-mode-agent/agent.env" in unit
    assert "ExecStart=/usr/bin/image-mode-agent run $IMAGE_MODE_AGENT_ARGS" in unit
    argv = env["IMAGE_MODE_AGENT_ARGS"].split()
    args = build_parser().parse_args(["run", *argv])
    assert (args.command, args.source, args.host) == ("run", "hypershift", "local")
    assert args.kubeconfig == "/var/lib/kubelet/kubeconfig"
    assert args.node_kubeconfig is None  # one identity: the kubelet's reads and writes
    assert args.node_name == "NODE"  # the placeholder the header says to replace
    assert (args.prestage, args.upgrade_namespace, args.upgrade_configmap) == ("pool", None, None)
    assert args.listen == "127.0.0.1:8797"
    # Every flag is explained in the comments above it.
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) >= 4
    for flag in flags:
        assert re.search(rf"^#\s+{flag}(\s|$)", text, re.MULTILINE), f"{flag} not commented"
