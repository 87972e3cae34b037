"""Taking the node's workloads away before a reboot, and giving the node back after it.

Two ways: the MCO's drain controller, through the `desiredDrain`/`lastAppliedDrain` handshake
(docs/mco-protocol.md §5) awaited on the Node watch; or a self-drain for clusters with no
drain controller: cordon, evict through the Eviction API (PodDisruptionBudgets respected),
uncordon only what we cordoned."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from agent.cluster.annotations import (
    ADMIN_CORDONED,
    DESIRED_DRAIN,
    LAST_APPLIED_DRAIN,
    NodeView,
    annotations_patch,
)
from agent.cluster.kube import Kube, KubeError
from agent.cluster.watch import ObjectWatch

Patch = Callable[[dict[str, Any]], Awaitable[None]]
Report = Callable[[str], Awaitable[None]]


class DrainTimeout(Exception):
    pass


class Drainer(Protocol):
    async def drain(self, config: str) -> None: ...

    def drained(self, node: NodeView) -> bool:
        """Whether a drain of ours is still in force (after a restart or a reboot)."""
        ...

    async def uncordon(self, config: str) -> None: ...


class DrainHandshake:
    """The drain controller does the work; we ask and wait for its acknowledgement."""

    def __init__(self, watch: ObjectWatch, patch: Patch, drain_timeout: float = 3600,
                 uncordon_timeout: float = 600) -> None:  # fmt: skip
        self.watch, self.patch = watch, patch
        self.drain_timeout, self.uncordon_timeout = drain_timeout, uncordon_timeout

    async def _handshake(self, value: str, timeout: float, what: str) -> None:
        node = NodeView.of(self.watch.obj or {})
        if node.get(LAST_APPLIED_DRAIN) == value:
            return
        if node.get(DESIRED_DRAIN) != value:  # after a restart the request may stand already
            await self.patch(annotations_patch({DESIRED_DRAIN: value}))
        try:
            await self.watch.wait_for(
                lambda obj: NodeView.of(obj or {}).get(LAST_APPLIED_DRAIN) == value, timeout
            )
        except TimeoutError:
            raise DrainTimeout(
                f"failed to {what} node: no acknowledgement of {value} after {timeout:g}s"
            ) from None

    async def drain(self, config: str) -> None:
        await self._handshake(f"drain-{config}", self.drain_timeout, "drain")

    def drained(self, node: NodeView) -> bool:
        return (node.get(DESIRED_DRAIN) or "").startswith("drain-")

    async def uncordon(self, config: str) -> None:
        await self._handshake(f"uncordon-{config}", self.uncordon_timeout, "uncordon")


def _evictable(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False  # static pods: the kubelet owns them
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return False  # they would come straight back, and they tolerate the cordon
    if meta.get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class SelfDrain:
    """Cordon, evict, wait; the reason names the pods that block."""

    def __init__(self, api: Kube, watch: ObjectWatch, patch: Patch, report: Report, node: str,
                 deadline: float = 3600, retry_interval: float = 5.0) -> None:  # fmt: skip
        self.api, self.watch, self.patch, self.report = api, watch, patch, report
        self.node = node
        self.deadline = deadline
        self.retry_interval = retry_interval
        self.log = structlog.get_logger("drain").bind(node=node)

    def drained(self, node: NodeView) -> bool:
        return node.get(ADMIN_CORDONED) is not None

    async def _cordon(self) -> None:
        node = NodeView.of(self.watch.obj or {})
        if node.get(ADMIN_CORDONED) is not None:
            return  # cordoned by us before a restart
        if node.unschedulable:
            await self.patch(annotations_patch({ADMIN_CORDONED: "true"}))
        else:
            await self.patch({"spec": {"unschedulable": True},
                              **annotations_patch({ADMIN_CORDONED: "false"})})  # fmt: skip

    async def _pods(self) -> list[dict[str, Any]]:
        listing = await self.api.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node}")
        return [p for p in listing.get("items") or [] if _evictable(p)]

    async def _evict(self, pod: dict[str, Any]) -> bool:
        """True when the pod is on its way out; False when a disruption budget blocks it."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction"
        try:
            await self.api.post(path, body)
        except KubeError as exc:
            if exc.status == 429:
                return False
            if exc.status != 404:
                raise
        return True

    async def drain(self, config: str) -> None:
        await self._cordon()
        loop = asyncio.get_running_loop()
        until = loop.time() + self.deadline
        while True:
            pods = await self._pods()
            if not pods:
                return
            blocked = [p for p in pods if not await self._evict(p)]
            names = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                              for p in blocked)  # fmt: skip
            if blocked:
                await self.report(f"draining: eviction blocked by a PodDisruptionBudget: {names}")
            if loop.time() >= until:
                raise DrainTimeout(
                    f"failed to drain node after {self.deadline:g}s: "
                    f"blocked by PodDisruptionBudget: {names or 'pods still terminating'}"
                )
            # The Eviction API answers "retry later" (429); kubectl drain retries every 5 s.
            await asyncio.sleep(self.retry_interval)

    async def uncordon(self, config: str) -> None:
        node = NodeView.of(self.watch.obj or {})
        mark = node.get(ADMIN_CORDONED)
        if mark == "false":
            await self.patch({"spec": {"unschedulable": False},
                              **annotations_patch({ADMIN_CORDONED: None})})  # fmt: skip
        elif mark == "true":  # an admin cordoned it: leave it so
            await self.patch(annotations_patch({ADMIN_CORDONED: None}))
