"""The MCO node annotation protocol (docs/mco-protocol.md §3-4), as pure helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIX = "machineconfiguration.openshift.io/"
CURRENT_CONFIG = PREFIX + "currentConfig"
DESIRED_CONFIG = PREFIX + "desiredConfig"
CURRENT_IMAGE = PREFIX + "currentImage"
DESIRED_IMAGE = PREFIX + "desiredImage"
STATE = PREFIX + "state"
REASON = PREFIX + "reason"
DESIRED_DRAIN = PREFIX + "desiredDrain"
LAST_APPLIED_DRAIN = PREFIX + "lastAppliedDrain"
POST_CONFIG_ACTION = PREFIX + "post-config-action"
CONTROL_PLANE_TOPOLOGY = PREFIX + "controlPlaneTopology"
LAST_SYNCED_CC = PREFIX + "lastSyncedControllerConfigResourceVersion"
# The MCD's ControllerConfigSyncServerCA (pkg/daemon/constants/constants.go): the value of the
# ControllerConfig's SERVICE_CA_ROTATE the node last acted on.
LAST_OBSERVED_SERVER_CA = PREFIX + "lastObservedServerCAAnnotation"
# On ControllerConfig, set by the operator (pkg/operator/sync.go syncControllerConfig): "true" right
# after it copied a new kube-apiserver serving CA into the kubeconfig-data ConfigMap, else "false".
SERVICE_CA_ROTATE = PREFIX + "service-ca-rotate"
SERVICE_CA_ROTATE_TRUE = "true"
# Ours: the node was cordoned by an admin before a self-drain, so we must not uncordon it.
ADMIN_CORDONED = "image-mode-agent.openshift.io/admin-cordoned"

REASON_LIMIT = 2000
REBOOTING = "Rebooting"


def truncate(reason: str, limit: int = REASON_LIMIT) -> str:
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


@dataclass(frozen=True)
class NodeView:
    """What the agent reads from its Node."""

    name: str
    annotations: dict[str, str]
    unschedulable: bool = False
    uid: str = ""

    @classmethod
    def of(cls, node: dict[str, Any]) -> NodeView:
        meta = node.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            annotations=dict(meta.get("annotations") or {}),
            unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
            uid=meta.get("uid", ""),
        )

    def get(self, key: str) -> str | None:
        value = self.annotations.get(key)
        return value or None

    @property
    def desired_config(self) -> str | None:
        return self.get(DESIRED_CONFIG)

    @property
    def single_replica(self) -> bool:
        return self.get(CONTROL_PLANE_TOPOLOGY) == "SingleReplica"

    def is_done(self) -> bool:
        """The controller's view of Done (layered_node_state.go): configs equal, images
        equal or both absent, state Done."""
        return (
            self.get(CURRENT_CONFIG) is not None
            and self.get(CURRENT_CONFIG) == self.desired_config
            and self.get(CURRENT_IMAGE) == self.get(DESIRED_IMAGE)
            and (self.get(STATE) or "Done") == "Done"
        )


def done_patch(config: str, image: str | None) -> dict[str, Any]:
    """The ONE patch that reports Done: state, reason, current config and image together.
    `None` deletes an annotation in a JSON merge patch."""
    return {
        "metadata": {
            "annotations": {
                STATE: "Done",
                REASON: "",
                CURRENT_CONFIG: config,
                CURRENT_IMAGE: image,
                POST_CONFIG_ACTION: None,
            }
        }
    }


def annotations_patch(values: dict[str, str | None]) -> dict[str, Any]:
    return {"metadata": {"annotations": values}}
