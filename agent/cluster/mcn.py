"""The node's MachineConfigNode status, kept current the way the MCD's upgrade monitor does.

Sources (openshift/machine-config-operator at 7ff337a4): the types and condition names in
`vendor/github.com/openshift/api/machineconfiguration/v1/types_machineconfignode.go`; the rules
for combining a step with the stored conditions in `pkg/upgrademonitor/upgrade_monitor.go`
(`generateAndApplyMachineConfigNodes`); the steps, with their reasons and messages, where
`pkg/daemon/update.go`, `pkg/daemon/daemon.go`, `pkg/daemon/drain.go` and
`pkg/controller/drain/drain_controller.go` call it. The condition set is the one written with
the ImageModeStatusReporting gate off (the Default feature set): `AppliedFilesAndOS` is one
condition.

Pure: a step (`Change`) folded into a `Status`; `agent/cluster/mcn_writer.py` writes it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agent.cluster.kube import MC_GROUP, custom_path
from agent.cluster.pool import NOT_YET_SET

MACHINECONFIGNODES = custom_path(*MC_GROUP, "machineconfignodes")
API_VERSION = "/".join(MC_GROUP)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

UPDATE_PREPARED = "UpdatePrepared"
UPDATE_EXECUTED = "UpdateExecuted"
UPDATE_POST_ACTION_COMPLETE = "UpdatePostActionComplete"
UPDATE_COMPLETE = "UpdateComplete"
UPDATED = "Updated"
RESUMED = "Resumed"
DRAINED = "Drained"
APPLIED_FILES_AND_OS = "AppliedFilesAndOS"
CORDONED = "Cordoned"
UNCORDONED = "Uncordoned"
REBOOTED_NODE = "RebootedNode"
NODE_DEGRADED = "NodeDegraded"
PINNED_IMAGE_SETS_PROGRESSING = "PinnedImageSetsProgressing"
PINNED_IMAGE_SETS_DEGRADED = "PinnedImageSetsDegraded"

# Conditions with no children: written even when unchanged (the PinnedImageSet manager's).
SINGLETONS = (PINNED_IMAGE_SETS_DEGRADED, PINNED_IMAGE_SETS_PROGRESSING)
# Every type a status carries, in the order the upgrade monitor creates them.
CONDITION_TYPES = (
    UPDATE_PREPARED,
    UPDATE_EXECUTED,
    UPDATE_POST_ACTION_COMPLETE,
    UPDATE_COMPLETE,
    RESUMED,
    DRAINED,
    APPLIED_FILES_AND_OS,
    CORDONED,
    REBOOTED_NODE,
    UPDATED,
    UNCORDONED,
    NODE_DEGRADED,
    *SINGLETONS,
)
NOT_YET_OCCURRED = "NotYetOccurred"
MESSAGE_LIMIT = 32768  # the CRD's maxLength for a condition message
# Steps kept while the API cannot be written; the latest ones decide the status anyway.


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str = ""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Condition:
        return cls(
            str(raw.get("type", "")),
            str(raw.get("status", "")),
            str(raw.get("reason", "")),
            str(raw.get("message", "")),
            str(raw.get("lastTransitionTime", "")),
        )

    def to_json(self) -> dict[str, str]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }


@dataclass(frozen=True)
class Change:
    """One call of the upgrade monitor: a parent condition and, for a phase with parts (e.g.
    UpdateExecuted), the child; the child's reason is the parent's type plus its own."""

    parent: Condition
    child: Condition | None = None
    # The MCD applies the spec from its Node at this step too (update.go, after "Update
    # Compatible"): the controller's own write of it is not retried when it fails.
    sync_spec: bool = False


@dataclass(frozen=True)
class Versions:
    """What the Node's annotations say when a step happens: the monitor reads them then."""

    desired: str | None = None
    current: str | None = None


@dataclass(frozen=True)
class Status:
    conditions: tuple[Condition, ...] = ()
    desired: str | None = None  # status.configVersion.desired
    current: str | None = None  # status.configVersion.current
    observed_generation: int | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> Status:
        raw = raw or {}
        version = raw.get("configVersion") or {}
        return cls(
            tuple(Condition.from_json(c) for c in raw.get("conditions") or []),
            version.get("desired") or None,
            version.get("current") or None,
            raw.get("observedGeneration"),
        )

    def to_json(self) -> dict[str, Any]:
        """The fields a merge patch of `/status` sets; the rest of the status is left alone."""
        version: dict[str, str] = {"desired": self.desired or NOT_YET_SET}
        if self.current:  # the CRD requires a DNS name when the field is present
            version["current"] = self.current
        body: dict[str, Any] = {
            "conditions": [c.to_json() for c in self.conditions],
            "configVersion": version,
        }
        if self.observed_generation is not None:
            body["observedGeneration"] = self.observed_generation
        return body

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


# What a True `Updated` becomes when another phase starts without the MCD having said so.
_DISRUPTED = Condition(
    UPDATED, FALSE, UPDATED, "This node is not updated, sensed disruption via a manual update."
)


def _stamp(new: Condition, old: Condition | None, now: str) -> Condition:
    # Unlike the MCD (which stamps every write), the time moves only when the status does,
    # as Kubernetes conditions are meant to: "since when" stays readable.
    when = old.last_transition_time if old is not None and old.status == new.status else now
    return replace(new, message=new.message[:MESSAGE_LIMIT], last_transition_time=when)


def apply(
    status: Status, change: Change, versions: Versions, now: str, *, generation: int = 1
) -> Status:
    """`status` after one step, by the upgrade monitor's rules: an unchanged parent (same
    status and message) makes the whole step a no-op; a parent `Updated` resets every other
    condition that is not False; any other parent turns a True `Updated` False; types not yet
    set are False with reason NotYetOccurred."""
    parent, child = change.parent, change.child
    old = {c.type: c for c in status.conditions}
    previous = old.get(parent.type)
    unchanged = previous is not None and (previous.status, previous.message) == (
        parent.status,
        parent.message,
    )
    if unchanged and parent.type not in SINGLETONS:
        return status
    desired_for_message = versions.desired or NOT_YET_SET
    result: list[Condition] = []
    for cond in status.conditions:
        if cond.type == UPDATED and cond.status == TRUE and parent.type != UPDATED:
            result.append(_stamp(_DISRUPTED, cond, now))
        elif child is not None and cond.type == child.type:
            result.append(_stamp(child, cond, now))
        elif cond.type == parent.type:
            result.append(_stamp(parent, cond, now))
        elif parent.type == UPDATED and cond.status != FALSE:
            message = f"Action during update to {desired_for_message}: {cond.message}"
            result.append(_stamp(replace(cond, status=FALSE, message=message), cond, now))
        else:
            result.append(cond)
    present = {c.type for c in result}
    for extra in (child, parent):
        if extra is not None and extra.type not in present:
            result.append(_stamp(extra, None, now))
            present.add(extra.type)
    for kind in CONDITION_TYPES:
        if kind not in present:
            result.append(
                Condition(
                    kind,
                    FALSE,
                    NOT_YET_OCCURRED,
                    f"This node has not yet entered the {kind} phase",
                    now,
                )
            )
    # The desired config is reported once the update is known to be compatible: a failed
    # preparation puts the placeholder back.
    failed_preparation = parent.type == UPDATE_PREPARED and parent.status != TRUE
    desired = NOT_YET_SET if failed_preparation else (versions.desired or NOT_YET_SET)
    # The MCD writes generation + 1; the CRD refuses an observedGeneration that goes down.
    observed = max(generation + 1, status.observed_generation or 0)
    return Status(tuple(result), desired, versions.current or status.current, observed)


def fold(
    status: Status, steps: list[tuple[Change, Versions]], now: str, *, generation: int = 1
) -> Status:
    for change, versions in steps:
        status = apply(status, change, versions, now, generation=generation)
    return status


# -- the steps, as the MCD and the drain controller write them ---------------------------


def _parent(kind: str, status: str, message: str, reason: str | None = None) -> Condition:
    return Condition(kind, status, reason or kind, message)


def _pair(parent: str, child: str, statuses: tuple[str, str], messages: tuple[str, str]) -> Change:
    return Change(
        Condition(parent, statuses[0], child, messages[0]),
        Condition(child, statuses[1], parent + child, messages[1]),
    )


def needs_update(node: str) -> Change:
    return Change(_parent(UPDATED, FALSE, f"Node {node} needs an update"))


def updated(node: str) -> Change:
    return Change(_parent(UPDATED, TRUE, f"Node {node} Updated"))


def prepared(drain: bool) -> Change:
    # The MCD prints its legacy action list, always empty on the NodeDisruptionPolicy path.
    return Change(
        _parent(
            UPDATE_PREPARED,
            TRUE,
            "Update Compatible. Post Cfg Actions: [] "
            f"Drain Required: {'true' if drain else 'false'}",
        ),
        sync_spec=True,
    )


def not_compatible(current: str, desired: str, error: str) -> Change:
    return Change(
        _parent(
            UPDATE_PREPARED,
            UNKNOWN,
            "Update Failed compatibility validation. "
            f"MachineConfigs {current} and {desired} are not compatible. "
            f"Err: {error}",
        )
    )


def drain_not_required() -> Change:
    text = "Node Drain Not required for this update."
    return _pair(UPDATE_EXECUTED, DRAINED, (UNKNOWN, FALSE), (text, text))


def cordoned(unschedulable: bool = True) -> Change:
    return _pair(
        UPDATE_EXECUTED,
        CORDONED,
        (UNKNOWN, TRUE),
        (
            "Cordoned Node as part of update executed phase",
            f"Cordoned node. The node is reporting Unschedulable = {_go(unschedulable)}",
        ),
    )


def draining(desired_drain: str, last_applied_drain: str) -> Change:
    return _pair(
        UPDATE_EXECUTED,
        DRAINED,
        (UNKNOWN, UNKNOWN),
        (
            "Draining Node as part of update executed phase",
            "Draining node. The drain will not be complete until desired drainer "
            f"{desired_drain} matches current drainer {last_applied_drain}",
        ),
    )


def drained(desired_drain: str) -> Change:
    return _pair(
        UPDATE_EXECUTED,
        DRAINED,
        (UNKNOWN, TRUE),
        (
            "Drained Node as part of update executed phase",
            "Drained node. The drain is complete as the desired drainer matches current "
            f"drainer: {desired_drain}",
        ),
    )


def applying_files_and_os(os_update: bool, files: bool) -> Change:
    return _pair(
        UPDATE_EXECUTED,
        APPLIED_FILES_AND_OS,
        (UNKNOWN, UNKNOWN),
        (
            "Updating the Files and OS on disk as a part of the in progress phase",
            f"Applying files and new OS config to node. OS will {_need(os_update)} need "
            f"an update. SSH Keys will {_need(files)} need an update",
        ),
    )


def applied_files_and_os(os_update: bool, files: bool) -> Change:
    return _pair(
        UPDATE_EXECUTED,
        APPLIED_FILES_AND_OS,
        (TRUE, TRUE),
        (
            "Updated the Files and OS on disk as a part of the in progress phase",
            f"Applied files and new OS config to node. OS did {_need(os_update)} need an "
            f"update. SSH Keys did {_need(files)} need an update",
        ),
    )


def post_action_none() -> Change:
    return Change(
        _parent(UPDATE_POST_ACTION_COMPLETE, TRUE, "Changes do not require a reboot", reason="None")
    )


def post_action_reloaded(service: str) -> Change:
    return Change(
        _parent(UPDATE_POST_ACTION_COMPLETE, TRUE, f"Node has reloaded service {service}")
    )


def rebooting() -> Change:
    return Change(_parent(REBOOTED_NODE, UNKNOWN, "Upgrade requires a reboot."))


def rebooted() -> Change:
    return Change(_parent(REBOOTED_NODE, TRUE, "Node has rebooted"))


def resumed(config: str, *, annotations_written: bool = False) -> Change:
    # Before the Done annotations the MCD says it is applying them; after a boot it says it
    # once more without that tail.
    tail = "" if annotations_written else " Applying proper annotations."
    return Change(
        _parent(RESUMED, TRUE, f"In desired config {config}. Resumed normal operations.{tail}")
    )


def uncordoned(unschedulable: bool = False) -> Change:
    return _pair(
        UPDATE_COMPLETE,
        UNCORDONED,
        (TRUE, TRUE),
        (
            "Uncordoned Node as part of completing upgrade phase",
            f"UnCordoned node. The node is reporting Unschedulable = {_go(unschedulable)}",
        ),
    )


def uncordon_not_required() -> Change:
    # Ours: the MCD always asks for an uncordon; an update that never drained does not.
    text = "Node Uncordon Not required for this update."
    return _pair(UPDATE_COMPLETE, UNCORDONED, (TRUE, FALSE), (text, text))


def degraded(node: str, error: str) -> Change:
    return Change(_parent(NODE_DEGRADED, TRUE, f"Node {node} upgrade failure. {error}"))


def healthy(node: str) -> Change:
    return Change(_parent(NODE_DEGRADED, FALSE, f"Node {node} upgrade succeeded"))


def _go(flag: bool) -> str:
    return "true" if flag else "false"


def _need(flag: bool) -> str:
    return "" if flag else "not"


def new_machine_config_node(node: str, pool: str, desired: str | None, uid: str) -> dict[str, Any]:
    """The object the MCD creates when its node has none: named after the Node and owned by it,
    so that it goes away with the Node."""
    meta: dict[str, Any] = {"name": node}
    if uid:  # an owner reference needs the owner's uid
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]
    return {
        "apiVersion": API_VERSION,
        "kind": "MachineConfigNode",
        "metadata": meta,
        "spec": {
            "node": {"name": node},
            "pool": {"name": pool},
            "configVersion": {"desired": desired or NOT_YET_SET},
        },
    }


def spec_patch(
    obj: dict[str, Any], node: str, pool: str, desired: str | None
) -> dict[str, Any] | None:
    """The merge patch that makes the object's spec say what the Node says, as the MCD's
    GenerateAndApplyMachineConfigNodeSpec applies it at "Update Compatible"; None when its
    node, pool and desired config already match (the MCD's no-diff guard)."""
    spec = obj.get("spec") or {}
    wanted = {
        "node": {"name": node},
        "pool": {"name": pool},
        "configVersion": {"desired": desired or NOT_YET_SET},
    }
    current = {
        "node": {"name": (spec.get("node") or {}).get("name")},
        "pool": {"name": (spec.get("pool") or {}).get("name")},
        "configVersion": {"desired": (spec.get("configVersion") or {}).get("desired")},
    }
    return None if current == wanted else {"spec": wanted}
