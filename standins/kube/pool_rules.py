"""The machine-config-controller's rules for a pool's Nodes, as pure functions over the objects
(dicts as the API serves them): which Nodes belong to a pool, which are done, unavailable or
failing, which get the pool's config next, and the pool's status. Each follows the code of
openshift/machine-config-operator at 7ff337a4 (the commit the conformance kit's controller was
validated with), non-layered pools only (no MachineOSConfig), feature gate
ImageModeStatusReporting off (as in the kit's feature-gate list, so counts come from the Node
annotations, not from MachineConfigNode conditions):

- pkg/controller/common/layered_node_state.go: IsNodeDone, IsUnavailableForUpdate, IsNodeReady,
  IsNodeMCDFailing, CheckNodeCandidacyForUpdate, IsDone;
- pkg/controller/node/node_controller.go: getNodesForPool / getPrimaryPoolForNode,
  maxUnavailable, getAllCandidateMachines, updateCandidateMachines, sortNodeList;
- pkg/controller/node/status.go calculateStatus with pkg/controller/common/helpers.go
  GetMachinesByState, and pkg/apihelpers SetMachineConfigPoolCondition.

Not modelled: layered pools, the master/arbiter quorum rules, pinned image sets, cert expiry,
the custom-pool-booted filter (nodes here carry no such annotation)."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from .selectors import label_selector_matches

Obj = dict[str, Any]
P = "machineconfiguration.openshift.io/"
CURRENT, DESIRED, STATE = P + "currentConfig", P + "desiredConfig", P + "state"
CURRENT_IMAGE, DESIRED_IMAGE, REASON = P + "currentImage", P + "desiredImage", P + "reason"
ZONE = "topology.kubernetes.io/zone"
# pkg/constants NodeUpdateInProgressTaint: on every Node of a pool that is not at its config.
UPDATE_IN_PROGRESS_TAINT = {"key": "UpdateInProgress", "effect": "PreferNoSchedule"}


def _annotations(node: Obj) -> dict[str, str]:
    return node.get("metadata", {}).get("annotations") or {}


def target(pool: Obj) -> str:
    return ((pool.get("spec") or {}).get("configuration") or {}).get("name") or ""


def is_node_done(node: Obj) -> bool:
    """IsNodeDone: current = desired (both set), image annotations both absent or equal and
    set, state Done."""
    a = _annotations(node)
    if not a.get(CURRENT) or not a.get(DESIRED) or a[CURRENT] != a[DESIRED]:
        return False
    if DESIRED_IMAGE in a or CURRENT_IMAGE in a:
        desired, current = a.get(DESIRED_IMAGE, ""), a.get(CURRENT_IMAGE, "")
        if not desired or not current or desired != current:
            return False
    return a.get(STATE) == "Done"


def is_ready(node: Obj) -> bool:
    """CheckNodeReady: Ready True, DiskPressure and NetworkUnavailable False where reported,
    and schedulable."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        if kind == "Ready" and status != "True":
            return False
        if kind in ("DiskPressure", "NetworkUnavailable") and status != "False":
            return False
    return not (node.get("spec") or {}).get("unschedulable")


def is_failing(node: Obj) -> bool:
    """IsNodeMCDFailing: configs differ and the daemon reported Degraded or Unreconcilable."""
    a = _annotations(node)
    return a.get(CURRENT) != a.get(DESIRED) and a.get(STATE) in ("Degraded", "Unreconcilable")


def is_unavailable(node: Obj) -> bool:
    """IsUnavailableForUpdate: not ready, or not done and not failing (a Node with no
    currentConfig, one the daemon never managed, is unavailable)."""
    if not is_ready(node):
        return True
    return not is_node_done(node) and not is_failing(node)


def is_updated(node: Obj, pool: Obj) -> bool:
    """IsDone for a non-layered pool: done at the pool's config, no desiredImage."""
    a = _annotations(node)
    return is_node_done(node) and a.get(DESIRED) == target(pool) and DESIRED_IMAGE not in a


def is_degraded(node: Obj) -> bool:
    return _annotations(node).get(STATE) in ("Degraded", "Unreconcilable")


def primary_pool(node: Obj, pools: list[Obj]) -> str | None:
    """getPrimaryPoolForNode: master wins; otherwise a custom pool wins over worker; a Node
    selected by two custom pools belongs to none (the controller logs an error)."""
    labels = node.get("metadata", {}).get("labels") or {}
    names = [p["metadata"]["name"] for p in pools
             if label_selector_matches((p.get("spec") or {}).get("nodeSelector"),
                                       labels)]  # fmt: skip
    if "master" in names:
        return "master"
    custom = [n for n in names if n != "worker"]
    if len(custom) > 1:
        return None
    return custom[0] if custom else (names[0] if names else None)


def nodes_for_pool(pool: Obj, pools: list[Obj], nodes: list[Obj]) -> list[Obj]:
    name = pool["metadata"]["name"]
    return [n for n in nodes if primary_pool(n, pools) == name]


def max_unavailable(pool: Obj, count: int) -> int:
    """maxUnavailable: an integer or "N%" of the pool's Nodes rounded down (intstr, roundUp
    false); 1 when unset or when that comes to 0."""
    value = (pool.get("spec") or {}).get("maxUnavailable")
    if value is None:
        value = 1
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?\d+%", value):  # intstr: Atoi of the text before the "%"
            raise ValueError(f"maxUnavailable: invalid value for IntOrString: {value!r}")
        value = math.floor(int(value[:-1]) * count / 100)
    return max(int(value), 1)


def _created(node: Obj) -> str:
    return node.get("metadata", {}).get("creationTimestamp") or ""


def sort_candidates(nodes: list[Obj]) -> list[Obj]:
    """sortNodeList: Nodes with a zone label first, by zone then age (oldest first); then
    Nodes with none, by age."""

    def key(node: Obj) -> tuple[int, str, str]:
        zone = (node.get("metadata", {}).get("labels") or {}).get(ZONE)
        return (0, zone, _created(node)) if zone is not None else (1, "", _created(node))

    return sorted(nodes, key=key)


def all_candidates(pool: Obj, nodes: list[Obj]) -> tuple[list[Obj], int]:
    """getAllCandidateMachines: the ready Nodes not aimed at the pool's config yet, and the
    capacity: maxUnavailable - unavailable Nodes - Nodes aimed at the config and failing on it
    (a transient failure that clears must not start several at once). A Node failing on its
    way to another config is a candidate: it may be retargeted."""
    config = target(pool)
    capacity = max_unavailable(pool, len(nodes)) - sum(1 for n in nodes if is_unavailable(n))
    if capacity <= 0:
        return [], 0
    chosen, failing = [], 0
    for node in nodes:
        a = _annotations(node)
        if a.get(DESIRED) == config and DESIRED_IMAGE not in a:  # CheckNodeCandidacyForUpdate
            failing += is_failing(node)
            continue
        if is_ready(node):
            chosen.append(node)
    if failing >= capacity:
        return [], 0
    return chosen, capacity - failing


def candidates(pool: Obj, nodes: list[Obj]) -> list[Obj]:
    """The Nodes to aim at the pool's config now: updateCandidateMachines' cut of
    all_candidates, in sortNodeList's order when there are more than the capacity. None when
    the pool is paused or has no config yet."""
    if not target(pool) or (pool.get("spec") or {}).get("paused"):
        return []
    chosen, capacity = all_candidates(pool, nodes)
    return sort_candidates(chosen)[:capacity] if capacity < len(chosen) else chosen


def needs_taint(node: Obj, pool: Obj) -> bool:
    """Whether the Node should carry the UpdateInProgress taint: not aimed at the pool's config,
    or still carrying both image annotations."""
    a = _annotations(node)
    at_config = a.get(DESIRED) == target(pool)
    return not (at_config and not (DESIRED_IMAGE in a and CURRENT_IMAGE in a))


def _condition(kind: str, status: str, reason: str = "", message: str = "") -> Obj:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _set_condition(conditions: list[Obj], new: Obj, now: str) -> list[Obj]:
    """SetMachineConfigPoolCondition: unchanged when status, reason and message are; the
    transition time kept when only the reason or message changed."""
    old = next((c for c in conditions if c.get("type") == new["type"]), None)
    if old is not None and all(old.get(k, "") == new[k] for k in ("status", "reason", "message")):
        return conditions
    stamped = {**new, "lastTransitionTime": now}
    if old is not None and old.get("status") == new["status"]:
        stamped["lastTransitionTime"] = old.get("lastTransitionTime", now)
    return [c for c in conditions if c.get("type") != new["type"]] + [stamped]


def _degraded_by_mcn(nodes: list[Obj], mcns: dict[str, Obj]) -> list[tuple[Obj, str]]:
    """calculateStatus's first loop: in the pool's Node order, the Nodes whose
    MachineConfigNode has NodeDegraded True, with that condition's message. As there, the loop
    ends at the first MachineConfigNode that has no conditions yet."""
    found = []
    for node in nodes:
        mcn = mcns.get(node["metadata"]["name"])
        if mcn is None:
            continue  # syncStatusOnly skips a Node whose MachineConfigNode it cannot get
        conditions = (mcn.get("status") or {}).get("conditions") or []
        if not conditions:
            break
        for condition in conditions:
            if condition.get("type") == "NodeDegraded" and condition.get("status") == "True":
                found.append((node, condition.get("message", "")))
                break
    return found


def pool_status(pool: Obj, nodes: list[Obj], mcns: dict[str, Obj] | None = None,
                now: str | None = None) -> Obj:  # fmt: skip
    """calculateStatus for a non-layered pool with ImageModeStatusReporting off: the counts
    come from the Node annotations; the NodeDegraded message from the MachineConfigNodes that
    report NodeDegraded (by Node name), then their Nodes' reason annotations."""
    now = now or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = pool.get("status") or {}
    spec = pool.get("spec") or {}
    config = target(pool)
    updated = [n for n in nodes if is_updated(n, pool)]
    ready = [n for n in updated if is_ready(n)]
    unavailable = [n for n in nodes if is_unavailable(n)]
    degraded = [n for n in nodes if is_degraded(n)]
    total = len(nodes)
    status: Obj = {
        "observedGeneration": pool.get("metadata", {}).get("generation", 0),
        "machineCount": total,
        "updatedMachineCount": len(updated),
        "readyMachineCount": len(ready),
        "unavailableMachineCount": len(unavailable),
        "degradedMachineCount": len(degraded),
        "configuration": old.get("configuration") or {},
    }
    conditions = list(old.get("conditions") or [])
    line = f"MachineConfig {config}"
    if len(updated) == total and len(ready) == total and not unavailable:
        conditions = _set_condition(
            conditions, _condition("Updated", "True", message=f"All nodes are updated with {line}"),
            now,
        )  # fmt: skip
        conditions = _set_condition(conditions, _condition("Updating", "False"), now)
        status["configuration"] = spec.get("configuration") or {}
    else:
        conditions = _set_condition(conditions, _condition("Updated", "False"), now)
        message = (f"Pool is paused; will not update to {line}" if spec.get("paused")
                   else f"All nodes are updating to {line}")  # fmt: skip
        updating = "False" if spec.get("paused") else "True"
        conditions = _set_condition(conditions, _condition("Updating", updating, "", message), now)
    by_mcn = _degraded_by_mcn(nodes, mcns or {})
    reasons = [f"Node {n['metadata']['name']} is reporting: {_go_quote(message)}"
               for n, message in by_mcn]  # fmt: skip
    reasons += [f"Node {n['metadata']['name']} is reporting: {_go_quote(_annotations(n)[REASON])}"
                for n, _ in by_mcn if _annotations(n).get(REASON)]  # fmt: skip
    if degraded:
        # As there: the count in the reason is the MachineConfigNodes', not the Nodes'.
        node_degraded = _condition("NodeDegraded", "True",
                                   f"{len(by_mcn)} nodes are reporting degraded status on sync",
                                   ", ".join(reasons))  # fmt: skip
    else:
        node_degraded = _condition("NodeDegraded", "False")
    conditions = _set_condition(conditions, node_degraded, now)
    render_degraded = any(c.get("type") == "RenderDegraded" and c.get("status") == "True"
                          for c in conditions)  # fmt: skip
    if degraded or render_degraded:
        degraded_condition = _condition("Degraded", "True", "", node_degraded["message"])
    else:
        degraded_condition = _condition("Degraded", "False")
    status["conditions"] = _set_condition(conditions, degraded_condition, now)
    return status


def _go_quote(text: str) -> str:
    """Go's %q for the printable text a reason holds."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
