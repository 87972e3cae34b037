"""When to pre-stage the pool's target: a pure decision from the Node, the pool and the journal.

The machine-config-controller counts a node unavailable from the moment its `desiredConfig`
changes until it reports Done (`IsUnavailableForUpdate`, pkg/controller/common/
layered_node_state.go), so a pull inside that window is on the rollout's critical path. The
pool's `spec.configuration.name` names the rendered config the pool moves to before the
controller picks this node: staging its image locked while the node still serves takes the pull
out of the window. Nothing here writes the Node: the controller must not see a pre-stage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agent.cluster.annotations import CURRENT_CONFIG, CURRENT_IMAGE, DESIRED_IMAGE, STATE, NodeView


class Act(StrEnum):
    STAGE = "stage"  # pre-stage the pool's target now (after the jitter)
    HANDOVER = "handover"  # the node's turn came: the update stages it, adopting what runs
    DROP = "drop"  # nothing ahead of the node: forget a pre-stage
    WAIT = "wait"  # the node is busy or failing: start nothing, stop nothing


@dataclass(frozen=True)
class Decision:
    act: Act
    reason: str
    target: str | None = None  # the rendered config to pre-stage (STAGE only)


def pool_target(pool: Mapping[str, Any] | None) -> str | None:
    """The rendered config the pool moves to (`spec.configuration.name`)."""
    if not pool:
        return None
    name = ((pool.get("spec") or {}).get("configuration") or {}).get("name")
    return name or None


def decide(node: NodeView, target: str | None, journal_idle: bool) -> Decision:
    current, desired = node.get(CURRENT_CONFIG), node.desired_config
    if target is None:
        return Decision(Act.DROP, "the pool names no target config")
    if target == current:
        return Decision(Act.DROP, f"the node runs the pool's target {target}")
    if target == desired:
        return Decision(Act.HANDOVER, f"the node's turn for {target} came")
    if node.get(CURRENT_IMAGE) or node.get(DESIRED_IMAGE):
        # On-cluster layering: the pool's image comes from its MachineOSBuild, not from the
        # rendered config's osImageURL, and the agent does not read those yet.
        return Decision(Act.DROP, "the node runs a layered image (desiredImage): not pre-staged")
    if not node.is_done() or not journal_idle:
        state = node.get(STATE) or "unknown"
        return Decision(Act.WAIT, f"the node is not idle (state {state}, desired {desired})")
    return Decision(Act.STAGE, f"pool target {target} is ahead of the node's {current}", target)
