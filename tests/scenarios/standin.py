"""A pool backend with no peer binaries: the project's loopback API server (standins/kube) with the
stand-ins of the machine-config-controller's render, node and drain controllers, set up as the kit's
`mcc-up` sets up the real one (its objects as ../shared/kit/lib/gen-objects.py writes them: the
master and worker pools, the ControllerConfig, Nodes worker-0..N-1 Ready with a kubelet's
annotation, one kubeconfig per Node identity), with the ControllerConfig the real controller
rendered from and the worker configuration it rendered (tests/fixtures/mcc-rendered/) in place of
its template controller's output. The pool scenarios and bench/rollout.py run on it when no
machine-config-controller was supplied."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standins.kube import FakeKube, NodeController, RenderController
from standins.kube.render_controller import GENERATED_BY, STANDIN_VERSION
from tests.fixtures_paths import MCC_CONTROLLER_CONFIG, MCC_RENDERED_WORKER
from tests.scenarios.backend import MCO_NS, PoolBackend
from tests.scenarios.fake import AGENT_SA, agent_rules

MCA = "machineconfiguration.openshift.io"
GENERATED_KUBELET = "99-worker-generated-kubelet"  # the kubelet-config controller's first name
# A kubelet always sets one annotation (the kit's Nodes carry it too).
KUBELET_ANNOTATION = {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "kubelet is posting ready status (written by the test)"}  # fmt: skip


def pool_object(name: str, extra_labels: dict[str, str]) -> dict:
    labels = {f"{MCA}/mco-built-in": "", f"pools.operator.{MCA}/{name}": "", **extra_labels}
    nodes = {"matchLabels": {f"node-role.kubernetes.io/{name}": ""}}
    return {"apiVersion": f"{MCA}/v1", "kind": "MachineConfigPool",
            "metadata": {"name": name, "labels": labels},
            "spec": {"machineConfigSelector": {"matchLabels": {f"{MCA}/role": name}},
                     "nodeSelector": nodes}}  # fmt: skip


def node_object(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": dict(KUBELET_ANNOTATION),
                         "labels": {"node-role.kubernetes.io/worker": "",
                                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64"}},
            "spec": {}, "status": {"conditions": [READY]}}  # fmt: skip


def base_config(role: str) -> dict:
    """What the template controller generates for `role`, as one config `00-<role>`: for the
    workers, the Ignition config the real controller rendered from the kit's objects
    (MCC_RENDERED_WORKER: every template's files and units, merged), so the stand-in's render
    of the pool is what a real cluster serves and the hosts are laid out from it; for the
    masters (no scenario runs one), an empty config of the templates' Ignition version.
    Injected here rather than embedded in the render stand-in:
    standins/kube/render_controller.py says why."""
    config: dict = {"ignition": {"version": "3.5.0"}}
    if role == "worker":
        config = json.loads(MCC_RENDERED_WORKER.read_text())["spec"]["config"]
    return {"apiVersion": f"{MCA}/v1", "kind": "MachineConfig",
            "metadata": {"name": f"00-{role}", "labels": {f"{MCA}/role": role},
                         "annotations": {GENERATED_BY: STANDIN_VERSION}},
            "spec": {"config": config}}  # fmt: skip


def controller_config(os_image: str) -> dict:
    """The ControllerConfig the real controller rendered from (MCC_CONTROLLER_CONFIG: the kit's
    CAs, infrastructure and images), on the cluster's OS image."""
    cc = json.loads(MCC_CONTROLLER_CONFIG.read_text())
    cc["spec"].update(osImageURL=os_image, baseOSContainerImage=os_image)
    return cc


@dataclass
class StandInCluster(PoolBackend):
    base: Path
    # The real drain controller answered in about 5 s; a fraction keeps the handshake's order
    # (the agent waits for the answer) without the wait.
    drain_delay: float = 0.3
    kube: FakeKube = field(default_factory=lambda: FakeKube(bookmark_interval=0.5))
    controllers: list = field(default_factory=list)

    controller = "stand-ins of the controller's render, node and drain controllers"

    @property
    def url(self) -> str:
        return self.kube.url

    def admin_token(self) -> str:
        return self.kube.token_for()

    async def up(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        await self.kube.start()

    async def mcc_up(self, workers: int, os_image: str) -> str:
        kube = self.kube
        kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MCO_NS}})
        kube.put(controller_config(os_image))
        kube.put(pool_object("master", {f"operator.{MCA}/required-for-upgrade": ""}))
        kube.put(pool_object("worker", {}))
        for role in ("master", "worker"):
            kube.put(base_config(role))
        for k in range(workers):
            name = f"worker-{k}"
            kube.put(node_object(name))
            kube.write_kubeconfig(self.node_kubeconfig(name), kube.node_identity(name))
        self.controllers = [RenderController(kube), NodeController(kube)]
        for controller in self.controllers:
            controller.start()
        kube.enable_drain_controller(delay=self.drain_delay)
        pool = await kube.wait_for(
            "machineconfigpools", "worker",
            lambda p: bool(p and p["spec"].get("configuration", {}).get("name")), timeout=10,
        )  # fmt: skip
        return pool["spec"]["configuration"]["name"]

    async def apply_rbac(self, path: Path) -> None:
        """The service account and what the file's Roles and bindings grant it, as the loopback
        server's RBAC reads them (standins/kube/rbac.py)."""
        self.kube.service_account(MCO_NS, AGENT_SA, agent_rules(path))

    async def token_for(self, service_account: str, namespace: str = MCO_NS) -> str:
        return self.kube.token_for(f"system:serviceaccount:{namespace}:{service_account}")

    def node_kubeconfig(self, node: str) -> Path:
        return self.base / f"node-{node}.kubeconfig"

    # The stand-ins sync on every write; half a second covers their pass.
    requeue_period = 0.5

    async def add_kubelet_config(self, name: str, kubelet_config: dict[str, Any]) -> None:
        """What the kubelet-config controller makes of a KubeletConfig for the worker pool: a
        generated MachineConfig `99-worker-generated-kubelet` that writes
        /etc/kubernetes/kubelet.conf (the stand-in's file holds only the fields given; the
        real one renders the whole KubeletConfiguration)."""
        body = {"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
                **kubelet_config}  # fmt: skip
        data = "data:," + urllib.parse.quote(json.dumps(body, sort_keys=True))
        file = {"path": "/etc/kubernetes/kubelet.conf", "mode": 420, "overwrite": True,
                "contents": {"source": data}}  # fmt: skip
        self.kube.put({"apiVersion": f"{MCA}/v1", "kind": "MachineConfig",
                       "metadata": {"name": GENERATED_KUBELET, "labels": {f"{MCA}/role": "worker"},
                                    "annotations": {GENERATED_BY: STANDIN_VERSION,
                                                    f"{MCA}/kubeletconfig": name}},
                       "spec": {"config": {"ignition": {"version": "3.5.0"},
                                           "storage": {"files": [file]}}}})  # fmt: skip

    async def delete_kubelet_config(self, name: str) -> None:
        self.kube.delete("machineconfigs", GENERATED_KUBELET)

    async def controller_config_seen(self, timeout: float = 60.0) -> None:
        for controller in self.controllers:
            await asyncio.wait_for(controller.idle(), timeout)

    async def down(self) -> None:
        for controller in self.controllers:
            controller.stop()
        self.kube.disable_drain_controller()
        await self.close_session()
        await self.kube.stop()
