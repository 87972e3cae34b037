"""The scenarios' primitives on the real kube-apiserver from the kit: the CRDs the agent reads,
`deploy/rbac.yaml` applied as shipped, the agent's service-account token from the
TokenRequest API, the Node's own identity from the kit, and an admin-side watcher that records
every `desiredDrain` and, when asked, answers it as the MCO's drain controller would."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from standins.demo.loopback import make_host
from tests.conformance.kit import MCO_NS, Kit, KitCluster
from tests.scenarios.harness import DEFAULT_ANNOTATIONS, Harness
from tests.scenarios.rest import WatchRefused, admin_watch, collection, follow, put_object

P = "machineconfiguration.openshift.io/"
REPO = Path(__file__).resolve().parents[2]
AGENT_CRDS = (
    "machineconfiguration_v1_machineconfigs.crd.yaml",
    "machineconfiguration_v1_controllerconfigs.crd.yaml",
    "machineconfiguration_v1_machineconfigpools.crd.yaml",
    "machineconfiguration_v1_machineconfignodes.crd.yaml",
    "operator_v1_machineconfigurations.crd.yaml",
)
# A kubelet always sets one annotation; the MCC panics on a Node with none.
KUBELET_ANNOTATION = {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}


@dataclass
class RealHarness(Harness):
    cluster: KitCluster | None = None
    answer_drains: bool = False
    _drains: list[str] = field(default_factory=list)
    _last_drain: str | None = None
    _watcher: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, kit: Kit, base: Path, *,
                     annotations: dict[str, str] | None = None) -> RealHarness:  # fmt: skip
        cluster = KitCluster(kit, base / "cluster")
        await cluster.up()
        sim, images = make_host(base)
        h = cls(base, sim, images, cluster=cluster)
        try:
            await h._prepare(DEFAULT_ANNOTATIONS if annotations is None else annotations)
        except BaseException:
            await cluster.down()
            raise
        return h

    async def _prepare(self, annotations: dict[str, str]) -> None:
        cluster = self.cluster
        crds = [arg for name in AGENT_CRDS for arg in ("-f", str(cluster.kit.path / "crds" / name))]
        await asyncio.to_thread(cluster.kubectl, "apply", "--server-side", *crds)
        await asyncio.to_thread(cluster.kubectl, "wait", "--for", "condition=established",
                                "--timeout=60s", "crd", "--all")  # fmt: skip
        await put_object(cluster, {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": MCO_NS}})  # fmt: skip
        # The shipped RBAC, exactly as an operator applies it.
        await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(REPO / "deploy/rbac.yaml"))
        token = await cluster.token_for("image-mode-agent")
        user = f"system:serviceaccount:{MCO_NS}:image-mode-agent"
        cluster.write_kubeconfig(self.base / "sa.kubeconfig", user, token)
        await self.add_config("rendered-worker-1", "v1", keys=["ssh-ed25519 AAAA-one"])
        await put_object(cluster, {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node, "annotations": {**KUBELET_ANNOTATION, **annotations},
                         "labels": {"node-role.kubernetes.io/worker": "",
                                    "kubernetes.io/hostname": self.node}},
        })  # fmt: skip
        selector = {"fieldSelector": f"metadata.name={self.node}"}
        self._watcher = asyncio.create_task(
            follow(self.cluster, "/api/v1/nodes", selector, self._saw)
        )

    # -- the admin-side watcher: drain values, and the drain controller's answers ----------------
    async def _saw(self, node: dict[str, Any]) -> None:
        annotations = node["metadata"].get("annotations") or {}
        wanted = annotations.get(P + "desiredDrain")
        if wanted and wanted != self._last_drain:
            self._drains.append(wanted)
        self._last_drain = wanted
        if self.answer_drains and wanted and annotations.get(P + "lastAppliedDrain") != wanted:
            await asyncio.sleep(0.2)
            # What the MCO's drain controller does: cordon (no pods here to evict) or
            # uncordon, then echo the request.
            await self.cluster.merge_patch(f"/api/v1/nodes/{self.node}", {
                "spec": {"unschedulable": True if wanted.startswith("drain-") else None},
                "metadata": {"annotations": {P + "lastAppliedDrain": wanted}},
            })  # fmt: skip

    # -- primitives -------------------------------------------------------------------------
    async def put(self, obj: dict[str, Any]) -> None:
        await put_object(self.cluster, obj)

    async def delete(self, kind: str, name: str) -> None:
        await self.cluster.call("DELETE", f"{collection(kind)}/{name}")

    async def node_object(self) -> dict[str, Any] | None:
        return await self.cluster.get(f"/api/v1/nodes/{self.node}")

    async def patch_annotations(self, values: dict[str, str | None]) -> None:
        await self.cluster.merge_patch(f"/api/v1/nodes/{self.node}",
                                       {"metadata": {"annotations": values}})  # fmt: skip

    async def event_reasons(self) -> list[str]:
        events = await self.cluster.call("GET", "/api/v1/namespaces/default/events")
        return [e["reason"] for e in events["items"]
                if e.get("involvedObject", {}).get("name") == self.node]  # fmt: skip

    async def enable_drain_controller(self) -> None:
        self.answer_drains = True

    def drain_values(self) -> list[str]:
        return self._drains

    async def restart_api_server(self, downtime: float) -> None:
        await self.cluster.kill_apiserver()
        await asyncio.sleep(downtime)
        await self.cluster.start_apiserver()

    async def expire_watches(self) -> None:
        """Freeze the agent, move etcd on and compact its history, restart the API server so
        every watch must resume, prove with a watch of our own that the agent's last
        resourceVersion is now 410 Gone, then let the agent go on."""
        node = await self.node_object()
        old_rv = node["metadata"]["resourceVersion"]
        running = [p for p in self.procs if p.returncode is None]
        for proc in running:
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            for i in range(3):  # history the agent has not seen
                await put_object(self.cluster, {
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "conformance-tick", "labels": {"tick": str(i)}},
                })  # fmt: skip
            await self._compact_etcd()
            await self.cluster.kill_apiserver()
            await self.cluster.start_apiserver()
            status = await self._watch_status(old_rv)
            assert status == 410, f"resuming from {old_rv} gave {status}, not 410 Gone"
        finally:
            for proc in running:
                os.kill(proc.pid, signal.SIGCONT)

    async def _compact_etcd(self) -> None:
        """Compact etcd to its newest revision through its gRPC gateway (the API server
        would do the same on its --etcd-compaction-interval, default 5 minutes)."""
        env = dict(line.split("=", 1) for line in
                   (self.cluster.run / "kit.env").read_text().split() if "=" in line)  # fmt: skip
        etcd = f"http://127.0.0.1:{env['KIT_ETCD_PORT']}"
        key = base64.b64encode(b"/registry").decode()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.post(f"{etcd}/v3/kv/range", json={"key": key, "limit": 1}) as r:
                revision = (await r.json())["header"]["revision"]
            async with session.post(
                f"{etcd}/v3/kv/compaction", json={"revision": revision, "physical": True}
            ) as r:
                if r.status != 200:
                    raise RuntimeError(f"etcd compaction: {r.status} {await r.text()}")

    async def _watch_status(self, rv: str) -> int:
        selector = {"fieldSelector": f"metadata.name={self.node}", "resourceVersion": rv}
        try:
            async with asyncio.timeout(15):
                async for event in admin_watch(self.cluster, "/api/v1/nodes", selector):
                    if event["type"] == "ERROR":
                        return int(event["object"].get("code", 0))
                    return 200
        except WatchRefused as exc:
            return exc.status
        return 200

    def agent_kubeconfigs(self) -> tuple[Path, Path]:
        return self.base / "sa.kubeconfig", self.cluster.node_kubeconfig(self.node)

    async def close_server(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.cluster.down()
