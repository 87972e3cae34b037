"""The real registry's strategies: what a create or an update may set, and its preconditions.

Pure functions of the objects involved; the store (store.py) calls them under its lock."""

from __future__ import annotations

import copy
import secrets
import string
import uuid
from datetime import UTC, datetime
from typing import Any

from .changes import Obj
from .errors import ApiError
from .resources import ResourceType


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def prepare_create(
    rt: ResourceType, obj: Obj, namespace: str | None, *, keep_status: bool = False
) -> Obj:
    """A copy of `obj` as the create strategy stores it: name generated, namespace set,
    system fields reset, status dropped where a status subresource owns it."""
    obj = copy.deepcopy(obj)
    obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
    meta = obj.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in "12345")
        meta["name"] = meta["generateName"] + suffix
    if not meta.get("name"):
        raise ApiError.invalid(
            rt, "", "metadata.name: Required value: name or generateName is required"
        )
    if rt.namespaced:
        meta["namespace"] = namespace or meta.get("namespace") or "default"
    else:
        meta.pop("namespace", None)
    for system_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
        meta.pop(system_field, None)
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = now_rfc3339()
    if rt.track_generation:
        meta["generation"] = 1
    # As the real strategies do: create cannot set status through a status subresource
    # (nodes excepted); in-process setup (`keep_status`) may.
    if not keep_status and "status" in rt.subresources and rt.plural != "nodes":
        obj.pop("status", None)
    if rt.plural == "pods":
        obj.setdefault("status", {}).setdefault("phase", "Pending")
    elif rt.plural == "namespaces":
        obj.setdefault("status", {}).setdefault("phase", "Active")
    return obj


def _without_status_meta(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def prepare_update(rt: ResourceType, old: Obj, new: Obj, subresource: str | None) -> Obj:
    """Apply the strategy rules of the real registry to a full replacement object."""
    new = copy.deepcopy(new)
    if subresource == "status":
        if rt.custom:
            # CR status writes change nothing but .status.
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        elif "spec" in old:
            new["spec"] = copy.deepcopy(old["spec"])
        else:
            new.pop("spec", None)
    elif "status" in rt.subresources:
        # The main resource ignores status changes when a status subresource exists.
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)
    new["kind"], new["apiVersion"] = rt.kind, rt.api_version
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        meta = new["metadata"] = {}
    old_meta = old["metadata"]
    for system_field in (
        "uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
        "generation", "name", "namespace", "resourceVersion",
    ):  # fmt: skip
        if system_field in old_meta:
            meta[system_field] = old_meta[system_field]
        else:
            meta.pop(system_field, None)
    if rt.track_generation and _without_status_meta(old) != _without_status_meta(new):
        meta["generation"] = int(old_meta.get("generation", 1)) + 1
    return new


def check_preconditions(rt: ResourceType, current: Obj, body_meta: dict[str, Any]) -> None:
    """A write's resourceVersion and uid, when given, must be the stored ones (409)."""
    name = current["metadata"]["name"]
    rv = body_meta.get("resourceVersion")
    if rv and rv != current["metadata"]["resourceVersion"]:
        raise ApiError.conflict(rt, name)
    uid = body_meta.get("uid")
    if uid and uid != current["metadata"]["uid"]:
        raise ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rt.qualified} "{name}": Precondition failed: '
            f"UID in precondition: {uid}, UID in object meta: {current['metadata']['uid']}",
            {"name": name, "kind": rt.plural},
        )
