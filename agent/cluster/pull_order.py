"""Where this node stands in the controller's order for a pool target: its rank, its lane and
the node before it in that lane (pure).

The machine-config-controller picks a pool's candidates in one order (openshift/machine-config-
operator `pkg/controller/node/node_controller.go` `sortNodeList`, used by
`updateCandidateMachines` whenever the candidates outnumber the capacity): Nodes with a
`topology.kubernetes.io/zone` label first, by zone and then by age, oldest first; then the
Nodes with none, by age. Go's `sort.Slice` is not stable, and the Nodes it sorts come from an
informer's cache in no fixed order, so Nodes created in the same second (a MachineSet
scale-up) are picked in an order nobody can know in advance; the name breaks that tie here,
which is one guess among equals. Nodes the controller skips for a while (not Ready, cordoned)
are still ranked: they are picked later, and a later rank only delays their pre-pull.

The order is a guess, so the queue follows the controller's actual picks: when a Node's turn
comes (its `desiredConfig` is the target), it takes its lane if the lane is free (no pre-pull
runs beside a turn's pull), else it leaves the queue at once, marked through on its lane
(lane_lease.py), and pulls at its turn without the lane. Either way the lane records it, so each
Node waits for exactly the lower ranks of its lane still off the target at its list
(`Queue.before`) that are not through yet, whatever order the controller picks them in.

The bound on pre-pulls is K lanes per pool (Leases, `pull_lanes.py`): lane j serves the ranks
j, j+K, j+2K, ... in that order, so the pre-pulls run in the order the turns come, at most K at
a time, with no node looking at any other Node after its one list per target. Another mode
ranks its Nodes with its own `key` (agent/hypershift/order.py: a NodePool's Nodes in the
in-place upgrader's listing order)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.cluster.annotations import CURRENT_CONFIG
from agent.cluster.pool import PoolError, primary_pool

ZONE_LABEL = "topology.kubernetes.io/zone"
_PERCENT = re.compile(r"[+-]?\d+%")


@dataclass(frozen=True)
class Queue:
    """This node's place among the pool's Nodes for one target."""

    target: str  # the rendered config the pool moves to
    rank: int  # 0 = the controller's first pick
    lanes: int  # K
    predecessor: str | None  # the node just before this one in its lane that still waits
    predecessor_rank: int | None
    members: int  # the pool's Nodes
    # Every lower rank of this lane still waiting for a pre-pull at list time, (rank, name),
    # nearest last: the lane is this node's once each of them is through (or skipped).
    before: tuple[tuple[int, str], ...] = ()

    @property
    def lane(self) -> int:
        return self.rank % self.lanes

    def name_of(self, rank: int) -> str:
        return next((name for r, name in self.before if r == rank), f"rank {rank}")


def order_key(node: Mapping[str, Any]) -> tuple[int, str, str, str]:
    """sortNodeList's key, with the name as the tie-break it lacks."""
    meta = node.get("metadata") or {}
    zone = (meta.get("labels") or {}).get(ZONE_LABEL)
    created = meta.get("creationTimestamp") or ""  # RFC 3339 in UTC: sorts as text
    name = meta.get("name") or ""
    return (0, zone, created, name) if zone is not None else (1, "", created, name)


def pool_members(
    pool: str, nodes: Iterable[Mapping[str, Any]], pools: list[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The Nodes whose primary pool is `pool`, by the controller's rule (pool.py); a Node
    that belongs to two custom pools belongs to none, as the controller treats it."""
    members = []
    for node in nodes:
        meta = node.get("metadata") or {}
        try:
            if primary_pool(meta.get("name", ""), meta.get("labels") or {}, pools) == pool:
                members.append(node)
        except PoolError:
            continue
    return members


def max_unavailable(pool: Mapping[str, Any], members: int) -> int:
    """The pool's `spec.maxUnavailable` as the controller resolves it (intstr, a percentage
    of the pool's Nodes rounded down; 1 when unset or when that comes to 0). PoolError for
    a value it would reject."""
    value = (pool.get("spec") or {}).get("maxUnavailable")
    if value is None:
        return 1
    if isinstance(value, str):
        if not _PERCENT.fullmatch(value):
            raise PoolError(f"maxUnavailable: invalid value for IntOrString: {value!r}")
        value = math.floor(int(value[:-1]) * members / 100)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PoolError(f"maxUnavailable: expected an integer or a percentage, got {value!r}")
    return max(value, 1)


def waiting(node: Mapping[str, Any], target: str) -> bool:
    """Whether the node has the target's pull ahead of it: not at the target yet. A node the
    controller picked already counts too: its turn says on the lane whether it holds it (its
    pull through the lane) or is through (it pulls without it, out of the queue); a list alone
    cannot tell which, and guessing "through" would let a pre-pull start beside its turn."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return annotations.get(CURRENT_CONFIG) != target


OrderKey = Callable[[Mapping[str, Any]], Any]


def queue_of(
    me: str, members: list[Mapping[str, Any]], target: str, lanes: int, key: OrderKey = order_key
) -> Queue | None:
    """This node's Queue among the pool's `members` for `target`, ranked by `key` (the
    controller's order); None when it is not one of them (its pool changed under it). Every
    node ranks all members, so all agree on each rank and lane; only the Nodes still waiting
    hold a node up."""
    ordered = sorted(members, key=key)
    names = [(n.get("metadata") or {}).get("name") or "" for n in ordered]
    if me not in names:
        return None
    lanes = max(1, lanes)
    rank = names.index(me)
    before = tuple((earlier, names[earlier]) for earlier in range(rank % lanes, rank, lanes)
                   if waiting(ordered[earlier], target))  # fmt: skip
    predecessor, predecessor_rank = (before[-1][1], before[-1][0]) if before else (None, None)
    return Queue(target, rank, lanes, predecessor, predecessor_rank, len(ordered), before)


def label_selector(selector: Mapping[str, Any] | None) -> str:
    """The equality part of a pool's nodeSelector as a list query (`a=b,c=d`): it narrows
    what the server sends; the full rule (pool.py) decides membership afterwards."""
    labels = (selector or {}).get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        return ""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def slots_for(setting: str, pool: Mapping[str, Any], members: int) -> int:
    """K for `--prestage-slots`: `auto` is the pool's maxUnavailable (the model in
    bench/fleet_model.py: one wave of pulls ahead hides every later pull behind the waves'
    reboots; more slots only slow the first wave's own pulls), an integer is taken as given."""
    if setting == "auto":
        return max_unavailable(pool, members)
    return max(1, int(setting))


def pool_size_note(queue: Queue) -> str:
    """How the queue reads in logs and Events."""
    before = (f"after {queue.predecessor} (rank {queue.predecessor_rank})"
              if queue.predecessor else "first in its lane")  # fmt: skip
    return (
        f"rank {queue.rank} of {queue.members} in the predicted pick order, lane "
        f"{queue.lane} of {queue.lanes}, {before}"
    )
