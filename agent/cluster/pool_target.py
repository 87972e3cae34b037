"""Where a pool-following node's pre-stage target and pre-pull lane come from: the Node's
MachineConfigPool (one pool, found by the controller's rule in `pool.py`, and one rendered
config are watched; no other Node is) and, for a bounded pre-pull, one list of the pool's
Nodes per target for this node's place in the controller's order (pull_order.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from agent.cluster import annotations as A
from agent.cluster.events import EventRecorder
from agent.cluster.kube import MACHINECONFIGS, Kube
from agent.cluster.pool import MACHINECONFIGPOOLS, PoolError, primary_pool
from agent.cluster.prestage import Decision, decide, pool_target
from agent.cluster.prestager import PrestageOptions
from agent.cluster.pull_lanes import PullLane
from agent.cluster.pull_order import (
    label_selector,
    pool_members,
    pool_size_note,
    queue_of,
    slots_for,
)
from agent.cluster.watch import NamedWatch, ObjectWatch
from agent.core.desired import Desired


class PoolTarget:
    """The Node's pool (re-picked when the Node's labels change, the pool is gone, or `repick`
    seconds passed) and the rendered config its `spec.configuration.name` names."""

    what = "pool target"
    grant = "the Role image-mode-agent-prepull and nodes list of deploy/rbac.yaml"

    def __init__(
        self,
        api: Kube,
        node: ObjectWatch,
        events: EventRecorder,
        desired_of: Callable[[dict[str, Any]], Desired],
        repick: float,
        options: PrestageOptions | None = None,
    ) -> None:
        self.api, self.node, self.events, self.desired_of = api, node, events, desired_of
        self.repick = repick
        self.options = options or PrestageOptions(repick=repick)
        self._pools: list[dict[str, Any]] = []  # the last listing, for the members' pool rule
        self._lane: PullLane | None = None
        self.on_change: Callable[[], None] = lambda: None
        self.pool = NamedWatch(api, MACHINECONFIGPOOLS, on_change=lambda: self.on_change())
        self.rendered = NamedWatch(api, MACHINECONFIGS, on_change=lambda: self.on_change())
        self._labels: dict[str, str] | None = None
        self._picked_at = 0.0
        self.log = structlog.get_logger("prestage").bind(node=node.name)

    async def target(self) -> str | None:
        return pool_target(await self._pool())

    def decide(self, node: A.NodeView, target: str | None, journal_idle: bool) -> Decision:
        return decide(node, target, journal_idle)

    async def desired(self, target: str) -> Desired | None:
        rendered = await self.rendered.get(target)
        return None if rendered is None else self.desired_of(rendered)

    async def lane(self, target: str) -> PullLane | None:
        if not self.options.bounded:
            return None
        if self._lane is not None and self._lane.queue.target == target:
            return self._lane
        await self._drop_lane()
        pool = await self._pool()
        watch = self.pool.watch
        if pool is None or watch is None:
            return None
        selector = label_selector((pool.get("spec") or {}).get("nodeSelector"))
        # One list per target, served from the API server's watch cache (resourceVersion=0):
        # the order is read once, not followed (no watch on every Node of the pool).
        query = {"resourceVersion": "0", **({"labelSelector": selector} if selector else {})}
        listing = await self.api.get("/api/v1/nodes", **query)
        members = pool_members(watch.name, listing.get("items") or [], self._pools)
        try:
            slots = slots_for(self.options.slots, pool, len(members))
        except PoolError as exc:
            self.log.warning("pre-pulls not bounded", error=str(exc))
            return None
        queue = queue_of(self.node.name, members, target, slots)
        if queue is None:
            return None
        self.log.info("pre-pull queue", pool=watch.name, target=target, order=pool_size_note(queue))
        self._lane = PullLane(self.api, namespace=self.options.lease_namespace, pool=watch.name,
                              me=self.node.name, queue=queue,
                              duration=self.options.lease_seconds)  # fmt: skip
        return self._lane

    async def _drop_lane(self) -> None:
        if self._lane is not None:
            await self._lane.close()
            self._lane = None

    async def close(self) -> None:
        await self._drop_lane()
        await self.pool.close()
        await self.rendered.close()

    async def _pool(self) -> dict[str, Any] | None:
        labels = dict(((self.node.obj or {}).get("metadata") or {}).get("labels") or {})
        now = asyncio.get_running_loop().time()
        watch = self.pool.watch
        gone = watch is not None and watch.missing
        if labels == self._labels and not gone and now - self._picked_at < self.repick:
            return watch.obj if watch is not None else None
        self._labels, self._picked_at = labels, now
        listing = await self.api.get(MACHINECONFIGPOOLS)
        self._pools = listing.get("items") or []
        try:
            name = primary_pool(self.node.name, labels, self._pools)
        except PoolError as exc:
            await self.events.emit("PrestageSkipped", f"{exc}; pre-staging is off until this "
                                   "is fixed", warning=True)  # fmt: skip
            self.log.warning("no pool to pre-stage for", error=str(exc))
            name = None
        if name is None:
            self.pool.stop()
            return None
        if watch is None or watch.name != name:
            self.log.info("following pool", pool=name)
        return await self.pool.get(name)
