"""The order in which HyperShift's in-place upgrader picks a NodePool's Nodes, as far as a node
can tell it (pure): the key that ranks them for the pre-pull lanes (agent/cluster/pull_order.py
ranks, agent/cluster/lane_lease.py says when a rank's lane is free).

The upgrader (UPGRADER below: openshift/hypershift at commit 3ee96155, `inplaceupgrader.go`)
lists the MachineSet's Machines from its cache (`getNodesForMachineSet`), takes each one's
`status.nodeRef` Node in that order, and picks the first `capacity` = maxUnavailable - (Nodes
with currentConfig ≠ desiredConfig) of the Nodes with desiredConfig ≠ target and currentConfig =
desiredConfig (`getAvailableCandidates`; "TODO(jerzhang): do some ordering here"). The Machines
are in the management cluster, out of a node's reach; each guest Node names its Machine in the
annotation `cluster.x-k8s.io/machine`. The cache lists them from a namespace index, a Go map,
so their order is not fixed (the kit saw "selection order is the cache's, not the names'").
The Machines' names are the guess here (the order etcd, and so an informer's first list,
returns them in); any fixed order is a guess. A wrong one costs little: the queue follows the
upgrader's actual picks (a picked Node leaves it at its turn), as in cluster mode.

maxUnavailable is an annotation of that MachineSet (`hypershift.openshift.io/
nodePoolMaxUnavailable`, from `NodePool.spec.management.inPlace.maxUnavailable`), also out of
reach: `--prestage-slots auto` is the upgrader's default when it is unset (`maxUnavail := 1`),
the same on every node (every node must count the same lanes); give the NodePool's
maxUnavailable as `--prestage-slots K` where it is larger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

UPGRADER = (
    "https://github.com/openshift/hypershift/blob/3ee9615567acffaf3e3ee25c2ca2942d650565cf/"
    "control-plane-operator/hostedclusterconfigoperator/controllers/inplaceupgrader/"
    "inplaceupgrader.go"
)
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"
AUTO_SLOTS = 1  # UPGRADER's maxUnavailable when the MachineSet names none


def listing_key(node: Mapping[str, Any]) -> tuple[int, str, str]:
    """The upgrader's listing order as guessed: by Machine name, then (for a Node that names
    no Machine: the upgrader never picks it) last, by Node name."""
    meta = node.get("metadata") or {}
    machine = (meta.get("annotations") or {}).get(MACHINE_ANNOTATION)
    name = meta.get("name") or ""
    return (0, machine, name) if machine else (1, "", name)


def nodepool_members(
    nodes: Iterable[Mapping[str, Any]], label: str, nodepool: str
) -> list[Mapping[str, Any]]:
    """The NodePool's Nodes: those labelled with its name (the HCCO keeps the label)."""
    return [n for n in nodes
            if ((n.get("metadata") or {}).get("labels") or {}).get(label) == nodepool]  # fmt: skip


def slots_for(setting: str) -> int:
    """K for `--prestage-slots` on a NodePool: `auto` is AUTO_SLOTS (the node cannot read the
    NodePool's maxUnavailable), an integer is taken as given."""
    return AUTO_SLOTS if setting == "auto" else max(1, int(setting))
