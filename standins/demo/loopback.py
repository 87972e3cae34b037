"""A loopback cluster plus a simulated host, and the real agent process between them."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.cluster.kubeconfig import KUBECONFIG_DATA_NAME, KUBECONFIG_DATA_NAMESPACE
from standins.demo.objects import machine_config
from standins.host.simulated import SimulatedHost
from standins.kube import FakeKube, Rule

P = "machineconfiguration.openshift.io/"
SA_RULES = [
    (verb, group, resource)
    for verb in ("get", "list", "watch")
    for group, resource in (
        ("machineconfiguration.openshift.io", "machineconfigs"),
        ("machineconfiguration.openshift.io", "controllerconfigs"),
        ("operator.openshift.io", "machineconfigurations"),
        ("", "pods"),
        ("machineconfiguration.openshift.io", "machineconfigpools"),
    )
] + [
    ("list", "", "nodes"),
    ("create", "", "pods/eviction"),
    ("get", "machineconfiguration.openshift.io", "machineconfignodes"),
    ("create", "machineconfiguration.openshift.io", "machineconfignodes"),
    ("patch", "machineconfiguration.openshift.io", "machineconfignodes"),
    ("patch", "machineconfiguration.openshift.io", "machineconfignodes/status"),
    ("update", "machineconfiguration.openshift.io", "machineconfignodes/status"),
]
# deploy/rbac.yaml grants this one in the operator's namespace only, for the kubeconfig-data
# ConfigMap only (a Role with resourceNames, as the MCD's); the demo's account gets it so.
# (SA_RULES and this are what tests/test_deploy.py checks deploy/rbac.yaml against: the demo
# runs from an installed wheel, which has no deploy/ to read them from.)
NAMESPACED_SA_RULES = [("get", "", "configmaps")]
# The pre-pull lanes' Leases (agent/cluster/pull_lanes.py), in the same namespace, any name.
LEASE_RULES = [(verb, "coordination.k8s.io", "leases")
               for verb in ("get", "list", "watch", "create", "update")]  # fmt: skip
SCOPED_SA_RULES = [
    *(
        Rule(*rule, namespace=KUBECONFIG_DATA_NAMESPACE, names=(KUBECONFIG_DATA_NAME,))
        for rule in NAMESPACED_SA_RULES
    ),
    *(Rule(*rule, namespace=KUBECONFIG_DATA_NAMESPACE) for rule in LEASE_RULES),
]
IMAGE = "quay.example/os/node"
CHECK = """#!/bin/sh
state=$(cat "$IMAGE_MODE_AGENT_ROOT/usr/lib/app/healthy" 2>/dev/null)
[ "$state" = yes ] || { echo "app unhealthy (${state:-missing})"; exit 1; }
"""


async def stop_processes(procs: list[asyncio.subprocess.Process]) -> None:
    """SIGTERM the agents still running (ours only), SIGKILL what does not stop in 10 s."""
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def make_host(
    base: Path, os_files: Mapping[str, str] | None = None
) -> tuple[SimulatedHost, dict[str, str]]:
    """A simulated host booted on v1 with a health check, and the images it can pull.
    `os_files` (path under the root -> text): what every one of its images ships besides the
    app, e.g. the OS's own units that a rendered config enables without giving their contents."""
    healthy = {**(os_files or {}), "usr/lib/app/healthy": "yes"}
    broken = {**healthy, "usr/lib/app/healthy": "no"}
    sim = SimulatedHost.create(base / "host", f"{IMAGE}:v1", healthy)
    check = sim.root / "etc/image-mode-agent/check/required.d/50-app"
    check.parent.mkdir(parents=True)
    check.write_text(CHECK)
    check.chmod(0o755)
    digest = sim.status_document()["status"]["booted"]["image"]["imageDigest"]
    images = {
        "v1": f"{IMAGE}@{digest}",
        "v2": sim.add_image(f"{IMAGE}:v2", healthy),
        "bad": sim.add_image(f"{IMAGE}:v3", broken),
        "slow": sim.add_image(f"{IMAGE}:v4-slow", healthy, pull_seconds=4),
        "missing": f"{IMAGE}@sha256:" + "9" * 64,
    }
    return sim, images


@dataclass
class Cluster:
    kube: FakeKube
    base: Path
    sim: SimulatedHost
    node: str = "worker-0"
    images: dict[str, str] = field(default_factory=dict)
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    @classmethod
    async def create(cls, base: Path, *, annotations: dict[str, str] | None = None) -> Cluster:
        kube = FakeKube(bookmark_interval=0.5)
        await kube.start()
        sim, images = make_host(base)
        cluster = cls(kube, base, sim, images=images)
        cluster.add_config("rendered-worker-1", "v1", keys=["ssh-ed25519 AAAA-one"])
        if annotations is None:
            annotations = {
                P + "currentConfig": "rendered-worker-1",
                P + "desiredConfig": "rendered-worker-1",
                P + "state": "Done",
            }
        kube.put({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": cluster.node, "annotations": annotations},
                  "spec": {}})  # fmt: skip
        node_id = kube.node_identity(cluster.node)
        sa = kube.service_account("openshift-machine-config-operator", "machine-config-daemon",
                                  [*SA_RULES, *SCOPED_SA_RULES])  # fmt: skip
        kube.write_kubeconfig(base / "node.kubeconfig", node_id)
        kube.write_kubeconfig(base / "sa.kubeconfig", sa)
        return cluster

    def add_config(self, name: str, image: str, **kwargs: Any) -> None:
        doc = machine_config(name=name, image=self.images.get(image, image), **kwargs)
        self.kube.put(doc)

    def annotations(self) -> dict[str, str]:
        return self.kube.get("Node", self.node)["metadata"].get("annotations") or {}

    def set_desired(self, name: str, **extra: str | None) -> None:
        self.kube.patch_annotations("Node", self.node, {P + "desiredConfig": name, **extra})

    def start_agent_args(self, *extra: str, log_level: str = "warning") -> list[str]:
        # No endpoints unless `extra` asks (a later --listen wins): a demo agent must not take
        # the port of a real agent on this machine, nor fail to when one holds it.
        return [
            sys.executable, "-m", "agent", "--log-level", log_level, "run", "--source", "kube",
            "--host", f"simulated:{self.sim.base}", "--listen", "",
            "--kubeconfig", str(self.base / "sa.kubeconfig"),
            "--node-kubeconfig", str(self.base / "node.kubeconfig"), "--node-name", self.node,
            *extra,
        ]  # fmt: skip

    async def start_agent(
        self, *extra: str, log_level: str = "warning", stderr: Any = None
    ) -> asyncio.subprocess.Process:
        """The agent process for this Node; `stderr` as asyncio.create_subprocess_exec takes it
        (None: this process's)."""
        args = self.start_agent_args(*extra, log_level=log_level)
        proc = await asyncio.create_subprocess_exec(*args, stderr=stderr)
        self.procs.append(proc)
        return proc

    async def wait_annotations(self, predicate, timeout: float = 20.0) -> dict[str, str]:
        node = await self.kube.wait_for(
            "Node", self.node,
            lambda n: n is not None and predicate(n["metadata"].get("annotations") or {}),
            timeout=timeout,
        )  # fmt: skip
        return node["metadata"]["annotations"]

    async def wait_done(self, config: str, timeout: float = 20.0) -> dict[str, str]:
        return await self.wait_annotations(
            lambda a: a.get(P + "currentConfig") == config and a.get(P + "state") == "Done",
            timeout,
        )

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    def node_writes(self) -> int:
        return self.kube.count_requests(verb="patch", resource="nodes")

    async def close(self) -> None:
        await stop_processes(self.procs)
        await self.kube.stop()

    def status(self) -> dict[str, Any]:
        return json.loads((self.sim.root / "var/lib/image-mode-agent/status.json").read_text())
