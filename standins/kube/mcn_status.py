"""How the machine-config-controller's controllers write a Node's MachineConfigNode status: a
parent condition and a child condition at once (the drain controller's Cordoned, Drained and
Uncordoned phases), as pkg/upgrademonitor GenerateAndApplyMachineConfigNodes does at
openshift/machine-config-operator 7ff337a4 with the ImageModeStatusReporting gate off:

- a MachineConfigNode with no conditions gets the two, then every other condition False with
  reason NotYetOccurred;
- otherwise the child replaces its namesake; the parent replaces its namesake unless the
  status and the message are unchanged, in which case nothing at all is written (the child's
  change included); an `Updated` True that is not the parent becomes False ("sensed disruption
  via a manual update");
- `status.configVersion.desired` is the Node's desiredConfig (or NotYetSet), `current` its
  currentConfig when set, `observedGeneration` the object's generation + 1.

A Node with no MachineConfigNode is left alone here (the real one creates it; the agent always
has by the time a controller writes)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .errors import ApiError

if TYPE_CHECKING:
    from .store_api import StoreApi

P = "machineconfiguration.openshift.io/"
NOT_YET_SET = "NotYetSet"
MANUAL_UPDATE = "This node is not updated, sensed disruption via a manual update."
ALL_TYPES = ("UpdatePrepared", "UpdateExecuted", "UpdatePostActionComplete", "UpdateComplete",
             "Resumed", "Drained", "AppliedFilesAndOS", "Cordoned", "RebootedNode", "Updated",
             "Uncordoned", "NodeDegraded", "PinnedImageSetsDegraded",
             "PinnedImageSetsProgressing")  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """One parent/child pair, as the controller's `upgrademonitor.Condition`s carry it."""

    parent: str
    child: str
    parent_status: str
    child_status: str
    parent_message: str
    child_message: str


def cordoned(unschedulable: bool) -> Phase:
    reporting = f"The node is reporting Unschedulable = {_go(unschedulable)}"
    return Phase("UpdateExecuted", "Cordoned", "Unknown", "True",
                 "Cordoned Node as part of update executed phase",
                 f"Cordoned node. {reporting}")  # fmt: skip


def draining(desired: str, last_applied: str) -> Phase:
    return Phase("UpdateExecuted", "Drained", "Unknown", "Unknown",
                 "Draining Node as part of update executed phase",
                 f"Draining node. The drain will not be complete until desired drainer {desired} "
                 f"matches current drainer {last_applied}")  # fmt: skip


def drained(desired: str) -> Phase:
    return Phase("UpdateExecuted", "Drained", "Unknown", "True",
                 "Drained Node as part of update executed phase",
                 "Drained node. The drain is complete as the desired drainer matches current "
                 f"drainer: {desired}")  # fmt: skip


def uncordoned(unschedulable: bool) -> Phase:
    reporting = f"The node is reporting Unschedulable = {_go(unschedulable)}"
    return Phase("UpdateComplete", "Uncordoned", "True", "True",
                 "Uncordoned Node as part of completing upgrade phase",
                 f"UnCordoned node. {reporting}")  # fmt: skip


def _go(value: bool) -> str:
    return "true" if value else "false"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def applied(mcn: dict[str, Any], node: dict[str, Any], phase: Phase) -> dict[str, Any] | None:
    """The new status, or None when the controller would write nothing."""
    now = _now()
    parent = {"type": phase.parent, "status": phase.parent_status, "reason": phase.child,
              "message": phase.parent_message, "lastTransitionTime": now}  # fmt: skip
    child = {"type": phase.child, "status": phase.child_status,
             "reason": phase.parent + phase.child, "message": phase.child_message,
             "lastTransitionTime": now}  # fmt: skip
    status = dict(mcn.get("status") or {})
    conditions = [dict(c) for c in status.get("conditions") or []]
    if not conditions:
        conditions = [parent, child] + [
            {"type": kind, "status": "False", "reason": "NotYetOccurred",
             "message": f"This node has not yet entered the {kind} phase",
             "lastTransitionTime": now}
            for kind in ALL_TYPES if kind not in (phase.parent, phase.child)
        ]  # fmt: skip
    else:
        found_parent = found_child = False
        for i, condition in enumerate(conditions):
            kind = condition.get("type")
            if kind == "Updated" and condition.get("status") == "True" and kind != phase.parent:
                conditions[i] = {"type": "Updated", "status": "False", "reason": "Updated",
                                 "message": MANUAL_UPDATE, "lastTransitionTime": now}  # fmt: skip
            elif kind == phase.child:
                found_child, conditions[i] = True, child
            elif kind == phase.parent:
                found_parent = True
                if (condition.get("status"), condition.get("message")) == (
                    parent["status"], parent["message"],
                ):  # fmt: skip
                    return None
                conditions[i] = parent
        conditions += [c for c, found in ((child, found_child), (parent, found_parent))
                       if not found]  # fmt: skip
    annotations = node["metadata"].get("annotations") or {}
    version = {"desired": annotations.get(P + "desiredConfig") or NOT_YET_SET}
    current = annotations.get(P + "currentConfig") or (status.get("configVersion") or {}).get(
        "current"
    )
    if current:
        version["current"] = current
    generation = mcn.get("metadata", {}).get("generation", 0)
    return {**status, "conditions": conditions, "configVersion": version,
            "observedGeneration": generation + 1}  # fmt: skip


def apply(kube: StoreApi, node: dict[str, Any], phase: Phase) -> bool:
    """Write the phase onto the Node's MachineConfigNode; whether anything was written."""
    name = node["metadata"]["name"]
    mcn = kube.try_get("machineconfignodes", name)
    if mcn is None:
        return False
    status = applied(mcn, node, phase)
    if status is None:
        return False

    def replace(obj: dict[str, Any]) -> None:
        obj["status"] = status

    try:
        kube.mutate("machineconfignodes", name, replace, subresource="status")
    except ApiError:
        return False  # gone meanwhile
    return True
