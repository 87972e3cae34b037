"""PodDisruptionBudget arithmetic, the eviction subresource, and a stand-in for the disruption
controller that keeps `status.disruptionsAllowed` current.

Simplification (documented in the package docstring): a pod counts as healthy when it exists,
is not terminating and is not Succeeded/Failed (no Ready condition is required); the expected
pod count is the number of pods the PDB selects (there are no workload controllers).
"""

from __future__ import annotations

import math
from typing import Any

from .changes import Change, Obj
from .errors import ApiError
from .resources import Registry
from .selectors import label_selector_matches
from .store import Store
from .strategy import now_rfc3339


def _terminating_or_done(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp")) or (
        (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    )


def selects(pdb: Obj, pod: Obj) -> bool:
    return pdb["metadata"].get("namespace") == pod["metadata"].get(
        "namespace"
    ) and label_selector_matches(
        (pdb.get("spec") or {}).get("selector"), pod["metadata"].get("labels") or {}
    )


def _scaled(value: Any, total: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def compute_status(pdb: Obj, pods: list[Obj]) -> dict[str, Any]:
    matching = [p for p in pods if selects(pdb, p)]
    expected = len(matching)
    healthy = sum(1 for p in matching if not _terminating_or_done(p))
    spec = pdb.get("spec") or {}
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    elif spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    else:
        desired = 0
    allowed = max(0, healthy - desired)
    old = pdb.get("status") or {}
    old_cond = next(
        (c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), {}
    )
    cond_status = "True" if allowed > 0 else "False"
    return {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": cond_status,
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": pdb["metadata"].get("generation", 1),
                # Keep the transition time stable so recomputation is a no-op write.
                "lastTransitionTime": old_cond.get("lastTransitionTime")
                if old_cond.get("status") == cond_status
                else now_rfc3339(),
            }
        ],
    }


class DisruptionStatusController:
    """Store hook: recompute PDB status in a namespace whenever its pods or PDBs change."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.pods = registry.resolve("pods")
        self.pdbs = registry.resolve("poddisruptionbudgets")

    def __call__(self, change: Change) -> None:
        if change.rt == self.pdbs and change.type == "DELETED":
            return
        if change.rt not in (self.pods, self.pdbs):
            return
        self.refresh(change.obj["metadata"].get("namespace", ""))

    def refresh(self, namespace: str) -> None:
        with self.store.lock:
            pdbs, _ = self.store.list(self.pdbs, namespace)
            pods, _ = self.store.list(self.pods, namespace)
            for pdb in pdbs:
                status = compute_status(pdb, pods)
                if status != pdb.get("status"):
                    self.store.mutate(
                        self.pdbs,
                        pdb["metadata"]["name"],
                        lambda o, s=status: {**o, "status": s},
                        namespace,
                        subresource="status",
                    )


def evict(
    store: Store,
    registry: Registry,
    namespace: str,
    name: str,
    body: Any,
    *,
    pods_vanish: bool,
) -> dict[str, Any]:
    """POST pods/{name}/eviction. Returns the Success Status (201) or raises ApiError."""
    pods_rt, pdb_rt = registry.resolve("pods"), registry.resolve("poddisruptionbudgets")
    if isinstance(body, dict):
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise ApiError.bad_request("name in URL does not match name in Eviction object")
    with store.lock:
        pod = store.get(pods_rt, name, namespace)
        if not _terminating_or_done(pod):
            pdbs = [p for p in store.list(pdb_rt, namespace)[0] if selects(p, pod)]
            if len(pdbs) > 1:
                raise ApiError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support.",
                )
            if pdbs:
                pdb = pdbs[0]
                status = compute_status(pdb, store.list(pods_rt, namespace)[0])
                if status["disruptionsAllowed"] <= 0:
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdb['metadata']['name']} "
                                    f"needs {status['desiredHealthy']} healthy pods and has "
                                    f"{status['currentHealthy']} currently",
                                }
                            ]
                        },
                    )
                status["disruptionsAllowed"] -= 1
                status["disruptedPods"] = {name: now_rfc3339()}
                store.mutate(
                    pdb_rt,
                    pdb["metadata"]["name"],
                    lambda o: {**o, "status": status},
                    namespace,
                    subresource="status",
                )
        # No kubelet: a pod on a node would stay Terminating unless told to vanish.
        immediate = pods_vanish or not (pod.get("spec") or {}).get("nodeName")
        store.delete(pods_rt, name, namespace, immediate=immediate)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
