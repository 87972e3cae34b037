"""Pre-staging on a HyperShift NodePool: the upgrader publishes the target in ConfigMap
`<np>-upgrade` before it picks any node (inplaceupgrader.go: the manifests come before
`getNodesToUpgrade`; the kit saw the ConfigMap 0.5 to 1 s before the first `desiredConfig`), so
every node of the pool can stage that image locked while it still serves, and its turn is a
drain and a reboot. The upgrader counts a node unavailable only from `desiredConfig` on
(`getCapacity`): nothing here writes the Node."""

from __future__ import annotations

from collections.abc import Callable

from agent.cluster.annotations import CURRENT_CONFIG, STATE, NodeView
from agent.cluster.prestage import Act, Decision
from agent.cluster.watch import ObjectWatch
from agent.core.desired import Desired
from agent.errors import InputError
from agent.model.hypershift import Payload, check_hash, payload_from_configmap


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
    None while the ConfigMap's location is not known yet)."""

    what = "NodePool target"

    def __init__(
        self,
        configmap: Callable[[], ObjectWatch | None],
        desired_of: Callable[[Payload], Desired],
    ) -> None:
        self.configmap, self.desired_of = configmap, desired_of
        self.on_change: Callable[[], None] = lambda: None

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

    async def lane(self, target: str) -> None:
        """No pre-pull lanes here: the agent holds only the kubelet's identity, which the Node
        authorizer gives no Leases outside kube-node-lease; pre-pulls start after the jitter."""
        return None

    async def close(self) -> None:
        """The ConfigMap's watch is the agent's: it stops it."""
