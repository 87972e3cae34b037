"""The shipped manifests: the RBAC grants what the integration tests grant the agent and
nothing they show it does not need; the DaemonSet's probes and ports reach what the agent
serves; the admission policy guards the agent's own MachineConfigNode. (That the API server
accepts them all, and enforces the policy: tests/conformance/test_deploy_manifests.py.)"""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import yaml

from agent.app.cli import build_parser
from agent.observe.http import StatusBoard, make_app, serve
from standins.demo.loopback import LEASE_RULES, NAMESPACED_SA_RULES, SA_RULES

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def test_rbac_matches_what_the_agent_uses() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] ==
                "image-mode-agent")  # fmt: skip
    granted = {(verb, group, resource) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}  # fmt: skip
    assert granted == set(SA_RULES)


def test_namespaced_rbac_matches_what_the_agent_uses() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    roles = [d for d in docs if d["kind"] == "Role"]

    def granted(role: dict) -> set[tuple[str, str, str]]:
        return {(verb, group, resource) for rule in role["rules"]
                for group in rule["apiGroups"] for resource in rule["resources"]
                for verb in rule["verbs"]}  # fmt: skip

    assert [granted(role) for role in roles] == [set(NAMESPACED_SA_RULES), set(LEASE_RULES)]
    assert roles[0]["rules"][0]["resourceNames"] == ["kubeconfig-data"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    for role, binding in zip(roles, bindings, strict=True):
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]


def test_daemonset_parses_and_runs_the_agent() -> None:
    ds = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:5] == ["image-mode-agent", "run", "--source", "kube", "--host"]
    assert ds["spec"]["template"]["spec"]["hostPID"] is True
    args = build_parser().parse_args(container["command"][1:])
    # bootc must run in the host's namespaces: in the pod's own it would see no booted host.
    assert args.bootc_prefix.split()[:3] == ["nsenter", "-t", "1"]
    assert args.host_root == "/rootfs"


# -- every manifest --------------------------------------------------------------------------
def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_every_manifest_parses_and_says_what_it_is_for() -> None:
    files = sorted(DEPLOY.glob("*.yaml"))
    assert {f.name for f in files} >= {"rbac.yaml", "daemonset.yaml", "metrics.yaml",
                                       "admission.yaml"}  # fmt: skip
    for f in files:
        text = f.read_text()
        assert text.startswith("# "), f"{f.name}: no header comment"
        header = text.split("\napiVersion:", 1)[0]
        assert "docs/install.md" in header, f"{f.name}: header does not point at the docs"
        for doc in _docs(f.name):
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], f.name
            if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                                   "ValidatingAdmissionPolicyBinding"):  # fmt: skip
                assert doc["metadata"]["namespace"] == "openshift-machine-config-operator"


# -- the DaemonSet's probes and ports against what the agent serves ---------------------------
def _pod() -> dict:
    return _docs("daemonset.yaml")[0]["spec"]["template"]["spec"]


def _container(name: str) -> dict:
    return next(c for c in _pod()["containers"] if c["name"] == name)


def _listen() -> tuple[str, int]:
    """The agent's --listen as the DaemonSet runs it (the CLI's default when absent)."""
    command = _container("agent")["command"]
    args = build_parser().parse_args(command[1:])
    host, _, port = args.listen.rpartition(":")
    return host, int(port)


def test_agent_listens_on_the_mcd_metrics_address_of_the_host_loopback() -> None:
    assert _listen() == ("127.0.0.1", 8797)
    default = build_parser().parse_args(["run", "--source", "kube", "--host", "local"]).listen
    assert default == "127.0.0.1:8797"
    pod = _pod()
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    agent = _container("agent")
    assert agent["securityContext"] == {"privileged": True, "runAsUser": 0}
    mounts = {m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts == {"/rootfs", "/run/dbus/system_bus_socket"}
    assert "/rootfs/var/lib/kubelet/kubeconfig" in agent["command"]
    (port,) = agent["ports"]
    assert (port["containerPort"], port["hostIP"]) == (_listen()[1], _listen()[0])


def test_probes_reach_what_the_agent_serves() -> None:
    host, port = _listen()
    agent = _container("agent")
    probes = {kind: agent[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe",
                                                        "readinessProbe")}  # fmt: skip
    for kind, get in probes.items():
        # hostNetwork: without `host` the kubelet would call the node's IP, where nothing listens.
        assert (get["host"], get["port"], get["scheme"]) == (host, port, "HTTP"), kind
    assert probes["livenessProbe"]["path"] == probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    # A long first pass or update never trips liveness: minutes of silence before a restart.
    live, start = agent["livenessProbe"], agent["startupProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 300
    assert start["periodSeconds"] * start["failureThreshold"] >= 300
    served = {r.resource.canonical for r in make_app(StatusBoard()).router.routes()}
    assert {get["path"] for get in probes.values()} <= served
    assert "limits" not in agent["resources"]
    assert {"cpu", "memory"} <= agent["resources"]["requests"].keys()


async def test_probe_paths_answer_as_the_kubelet_expects() -> None:
    """The real endpoints on the DaemonSet's host (a free port: 8797 may be taken here):
    alive at once, ready only after the first reconcile published a status."""
    host, _ = _listen()
    with socket.socket() as s:
        s.bind((host, 0))
        free = s.getsockname()[1]
    board = StatusBoard()
    runner = await serve(board, f"{host}:{free}")
    assert runner is not None
    try:
        async with aiohttp.ClientSession() as session:

            async def get(path: str) -> int:
                async with session.get(f"http://{host}:{free}{path}") as resp:
                    return resp.status

            assert await get("/healthz") == 200
            assert await get("/readyz") == 503
            board.publish({"state": "Done", "reason": "", "phase": "idle"})
            assert await get("/readyz") == 200
            assert await get("/metrics") == 200
    finally:
        await runner.cleanup()


def test_metrics_port_as_the_mcd_exposes_it() -> None:
    host, port = _listen()
    proxy = _container("kube-rbac-proxy")
    assert proxy["ports"] == [{"name": "metrics", "containerPort": 9001, "protocol": "TCP"}]
    flags = dict(a.removeprefix("--").split("=", 1) for a in proxy["args"])
    assert flags["secure-listen-address"] == "0.0.0.0:9001"
    assert flags["upstream"] == f"http://{host}:{port}"
    assert flags["allow-paths"] == "/metrics"
    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}
    assert flags["tls-cert-file"].startswith(mounts["metrics-tls"] + "/")
    assert flags["config-file"].startswith(mounts["kube-rbac-proxy"] + "/")
    volumes = {v["name"]: v for v in _pod()["volumes"]}
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs("metrics.yaml")}
    service = docs[("Service", "image-mode-agent")]
    assert service["spec"]["selector"] == _docs("daemonset.yaml")[0]["spec"]["selector"][
        "matchLabels"]  # fmt: skip
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert (service["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"]
            == volumes["metrics-tls"]["secret"]["secretName"])  # fmt: skip
    assert ("ConfigMap", volumes["kube-rbac-proxy"]["configMap"]["name"]) in docs


# -- the MachineConfigNode guard --------------------------------------------------------------
def test_admission_policy_guards_the_agents_own_machineconfignode() -> None:
    policy, binding = _docs("admission.yaml")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert (policy["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy",
                                                 "ValidatingAdmissionPolicyBinding")  # fmt: skip
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}  # fmt: skip
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["machineconfiguration.openshift.io"]
    assert set(rule["resources"]) == {"machineconfignodes", "machineconfignodes/status"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    (condition,) = spec["matchConditions"]
    sa = _docs("rbac.yaml")[0]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert f"request.userInfo.username == '{user}'" in " ".join(condition["expression"].split())
    assert _pod()["serviceAccountName"] == sa["metadata"]["name"]
    expressions = " ".join(v["expression"] for v in spec["validations"])
    assert "object.metadata.name" in expressions
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in expressions
