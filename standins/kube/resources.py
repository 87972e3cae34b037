"""Resource types the fake API server knows, and how each one behaves.

Behavioural flags live here (rather than as special cases in the server) so that adding a
resource for a new test is a one-line registry entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import ApiError

# Field selectors every resource supports (the generic registry adds these for all types).
_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    # CRD-backed: no strategic merge patch (415), items keep kind/apiVersion in lists.
    custom: bool = False
    # metadata.generation is maintained (bumped when anything but metadata/status changes).
    track_generation: bool = False
    # DELETE answers with the deleted object (pods, CRs) instead of a Success Status.
    return_deleted_object: bool = False
    # PUT of a missing object creates it (nodes, events), as the real registry does.
    create_on_update: bool = False
    field_labels: frozenset[str] = field(default=frozenset())
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`nodes` or `machineconfigs.machineconfiguration.openshift.io`, as in API messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def supports_field(self, name: str) -> bool:
        return name in _COMMON_FIELDS or name in self.field_labels

    def collection_path(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else "/api/v1"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"


_STATUS = frozenset({"status"})
_MC_GROUP = "machineconfiguration.openshift.io"

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "", "v1", "namespaces", "Namespace", False, frozenset({"status", "finalize"}),
        create_on_update=False, field_labels=frozenset({"status.phase"}), short_names=("ns",),
    ),
    ResourceType(
        "", "v1", "nodes", "Node", False, _STATUS,
        create_on_update=True, field_labels=frozenset({"spec.unschedulable"}),
        short_names=("no",),
    ),
    ResourceType(
        "", "v1", "pods", "Pod", True, frozenset({"status", "eviction"}),
        return_deleted_object=True,
        field_labels=frozenset({
            "spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
            "spec.serviceAccountName", "status.phase", "status.podIP",
            "status.nominatedNodeName",
        }),
        short_names=("po",),
    ),
    ResourceType(
        "", "v1", "events", "Event", True,
        create_on_update=True,
        field_labels=frozenset({
            "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
            "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
            "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
        }),
        short_names=("ev",),
    ),
    # events.k8s.io/v1 is stored separately (the real server converts between the two;
    # nothing we test depends on that conversion).
    ResourceType(
        "events.k8s.io", "v1", "events", "Event", True,
        create_on_update=True,
        field_labels=frozenset({
            "regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
            "reason", "reportingController", "type",
        }),
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",)),
    # Pre-pull lanes (agent/cluster/pull_lanes.py), as kube-node-lease's heartbeats.
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, _STATUS,
        track_generation=True, short_names=("pdb",),
    ),
    ResourceType(_MC_GROUP, "v1", "machineconfigs", "MachineConfig", False,
                 custom=True, track_generation=True, return_deleted_object=True,
                 short_names=("mc",)),
    ResourceType(_MC_GROUP, "v1", "controllerconfigs", "ControllerConfig", False, _STATUS,
                 custom=True, track_generation=True, return_deleted_object=True),
    ResourceType(_MC_GROUP, "v1", "machineconfigpools", "MachineConfigPool", False, _STATUS,
                 custom=True, track_generation=True, return_deleted_object=True,
                 short_names=("mcp",)),
    ResourceType(_MC_GROUP, "v1", "machineconfignodes", "MachineConfigNode", False, _STATUS,
                 custom=True, track_generation=True, return_deleted_object=True),
    ResourceType("operator.openshift.io", "v1", "machineconfigurations",
                 "MachineConfiguration", False, _STATUS,
                 custom=True, track_generation=True, return_deleted_object=True),
    # Enforced by admission.py on writes through the API.
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies",
                 "ValidatingAdmissionPolicy", False, _STATUS, track_generation=True),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
                 "ValidatingAdmissionPolicyBinding", False, track_generation=True),
)  # fmt: skip


class Registry:
    """Lookup of resource types by URL coordinates or by a human-friendly name."""

    def __init__(self, types: Iterable[ResourceType]) -> None:
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        for rt in types:
            self._by_path[(rt.group, rt.version, rt.plural)] = rt

    def __iter__(self):
        return iter(self._by_path.values())

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """group -> versions, in registration order (for /apis discovery)."""
        out: dict[str, list[str]] = {}
        for rt in self:
            if rt.group and rt.version not in out.setdefault(rt.group, []):
                out[rt.group].append(rt.version)
        return out

    def resolve(self, name: str | ResourceType, api_version: str | None = None) -> ResourceType:
        """Find a type by kind (`Node`), plural (`nodes`), short name or `plural.group`.

        Ambiguous names (core and events.k8s.io `Event`) prefer the core group unless
        `api_version` says otherwise.
        """
        if isinstance(name, ResourceType):
            return name
        lname = name.lower()
        matches = [
            rt
            for rt in self
            if lname in (rt.kind.lower(), rt.plural, rt.qualified, *rt.short_names)
            and (api_version is None or rt.api_version == api_version)
        ]
        if not matches:
            raise ApiError.not_found_resource(f"unknown resource type {name!r}")
        matches.sort(key=lambda rt: rt.group != "")  # core group first
        return matches[0]
