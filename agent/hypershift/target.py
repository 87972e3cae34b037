"""Pre-staging on a HyperShift NodePool: the upgrader publishes the target in ConfigMap
`<np>-upgrade` before it picks any node (docs/mco-protocol.md §15, steps 11-12: the manifests
come before `getNodesToUpgrade`; the kit saw the ConfigMap 0.5 to 1 s before the first
`desiredConfig`), so every node of the pool can stage that image locked while it still serves,
and its turn is a drain and a reboot. The upgrader counts a node unavailable only from
`desiredConfig` on (`getCapacity`): nothing here writes the Node.

The pre-pulls are bounded as a pool's are (agent/cluster/pull_lanes.py): K Lease lanes
`image-mode-prepull-<np>-<lane>` in the upgrade namespace, taken in the order the upgrader
lists the NodePool's Nodes (order.py), with the kubelet's identity: the Node authorizer gives
it neither those Leases nor a list of other Nodes, so deploy/hypershift/rbac.yaml grants both
to group system:nodes. Without them the pre-pulls fall back to the jitter, with a
PrestageUnbounded Event (cluster/prestager.py)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from agent.cluster.annotations import CURRENT_CONFIG, STATE, NodeView
from agent.cluster.kube import Kube
from agent.cluster.prestage import Act, Decision
from agent.cluster.prestager import PrestageOptions
from agent.cluster.pull_lanes import PullLane
from agent.cluster.pull_order import pool_size_note, queue_of
from agent.cluster.watch import ObjectWatch
from agent.core.desired import Desired
from agent.errors import InputError
from agent.hypershift.order import listing_key, nodepool_members, slots_for
from agent.model.hypershift import NODEPOOL_LABEL, Payload, check_hash, payload_from_configmap


def decide(node: NodeView, target: str | None, journal_idle: bool) -> Decision:
    """What to do with the NodePool's published target. A node the upgrader never updated
    in place has no annotations at all: it is idle, and pre-stages too."""
    current, desired = node.get(CURRENT_CONFIG), node.desired_config
    if target is None:
        return Decision(Act.DROP, "the NodePool publishes no target")
    if target == current:
        return Decision(Act.DROP, f"the node runs the NodePool's target {target}")
    if target == desired:
        return Decision(Act.HANDOVER, f"the node's turn for {target} came")
    if desired is not None and desired != current:
        return Decision(Act.WAIT, f"the node is updating to {desired}")
    if (node.get(STATE) or "Done") != "Done" or not journal_idle:
        return Decision(Act.WAIT, f"the node is not idle (state {node.get(STATE)})")
    return Decision(Act.STAGE, f"NodePool target {target} is ahead of the node's {current}", target)


class NodePoolTarget:
    """The target in the upgrade ConfigMap the agent already watches (`configmap()`: its watch,
    None while the ConfigMap's location is not known yet), and this node's pre-pull lane:
    `place()` says which NodePool the node is in and the upgrade namespace (None when the Node
    names no NodePool: its fellow Nodes cannot be told, and the pre-pulls are unbounded)."""

    what = "NodePool target"
    grant = (
        "the Role image-mode-agent-prepull and the ClusterRole image-mode-agent-nodepool-order "
        "of deploy/hypershift/rbac.yaml"
    )

    def __init__(
        self,
        configmap: Callable[[], ObjectWatch | None],
        desired_of: Callable[[Payload], Desired],
        *,
        api: Kube | None = None,
        node_name: str = "",
        place: Callable[[], tuple[str, str] | None] = lambda: None,
        options: PrestageOptions | None = None,
    ) -> None:
        self.configmap, self.desired_of = configmap, desired_of
        self.api, self.node_name, self.place = api, node_name, place
        self.options = options or PrestageOptions()
        self.on_change: Callable[[], None] = lambda: None
        self._lane: PullLane | None = None
        self.log = structlog.get_logger("prestage").bind(node=node_name)

    async def _object(self) -> dict | None:
        watch = self.configmap()
        if watch is None:
            return None
        await watch.synced.wait()
        return watch.obj

    async def target(self) -> str | None:
        data = ((await self._object()) or {}).get("data")
        try:
            return check_hash((data or {}).get("hash"), "data.hash") if data else None
        except InputError:
            return None  # reported by the update pass when it is this node's turn

    def decide(self, node: NodeView, target: str | None, journal_idle: bool) -> Decision:
        return decide(node, target, journal_idle)

    async def desired(self, target: str) -> Desired | None:
        configmap = await self._object()
        if configmap is None:
            return None
        payload = payload_from_configmap(configmap)
        return self.desired_of(payload) if payload.hash == target else None

    async def lane(self, target: str) -> PullLane | None:
        """This node's lane for `target`, from one list of the NodePool's Nodes (label
        selector, `resourceVersion=0`: the API server's watch cache); None when unbounded."""
        if not self.options.bounded or self.api is None:
            return None
        if self._lane is not None and self._lane.queue.target == target:
            return self._lane
        await self._drop_lane()
        place = self.place()
        if place is None:
            self.log.warning("pre-pulls not bounded: the Node names no NodePool, so its "
                             "fellow Nodes are not known")  # fmt: skip
            return None
        nodepool, namespace = place
        selector = f"{NODEPOOL_LABEL}={nodepool}"
        listing = await self.api.get("/api/v1/nodes", resourceVersion="0", labelSelector=selector)
        members = nodepool_members(listing.get("items") or [], NODEPOOL_LABEL, nodepool)
        slots = slots_for(self.options.slots)
        queue = queue_of(self.node_name, members, target, slots, key=listing_key)
        if queue is None:
            return None
        self.log.info("pre-pull queue", nodepool=nodepool, target=target,
                      order=pool_size_note(queue))  # fmt: skip
        self._lane = PullLane(self.api, namespace=namespace, pool=nodepool, me=self.node_name,
                              queue=queue, duration=self.options.lease_seconds)  # fmt: skip
        return self._lane

    async def _drop_lane(self) -> None:
        if self._lane is not None:
            await self._lane.close()
            self._lane = None

    async def close(self) -> None:
        """The ConfigMap's watch is the agent's: it stops it. The lane's watch is ours."""
        await self._drop_lane()
