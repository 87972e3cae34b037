"""The three PATCH flavours kube-apiserver accepts (server-side apply is not supported).

* JSON merge patch (RFC 7386): maps merge recursively, `null` deletes, lists are replaced.
* Strategic merge patch (built-in types only; CRs answer 415 like the real server). Supported:
  - maps merge as in merge patch, `null` deletes a key;
  - lists of maps whose field name is in `LIST_MERGE_KEYS` (e.g. `containers` by `name`,
    `conditions` and `addresses` by `type`) merge item-by-item on that key: a patch item updates
    the existing item with the same key (recursively) or is appended; `{"<key>": .., "$patch":
    "delete"}` removes the item; a `{"$patch": "replace"}` item makes the patch list replace;
  - lists of scalars named in `PRIMITIVE_SET_LISTS` (`finalizers`) are unioned, and
    `$deleteFromPrimitiveList/<field>` removes values from them;
  - `{"$patch": "replace"}` in a map replaces the map, `{"$patch": "delete"}` removes it;
  - `$retainKeys` keeps only the listed keys; `$setElementOrder/...` is accepted and ignored
    (merged lists keep the existing order with new items appended).
  Every other list is replaced, which is what the real server does for lists without a
  `patchStrategy` (e.g. `spec.taints`).
* JSON patch (RFC 6902): add, remove, replace, move, copy, test.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Short aliases accepted by the in-process API (FakeKube.patch(..., patch_type="merge")).
PATCH_TYPE_ALIASES = {
    "merge": MERGE_PATCH,
    "strategic": STRATEGIC_MERGE_PATCH,
    "json": JSON_PATCH,
}

# Field name -> merge key, taken from the `patchMergeKey` tags of the core/v1 Go types.
LIST_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}
PRIMITIVE_SET_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip_directives(v)
            for k, v in value.items()
            if not k.startswith("$") and v is not None
        }
    if isinstance(value, list):
        return [_strip_directives(v) for v in value if not _is_directive_item(v)]
    return value


def _is_directive_item(item: Any) -> bool:
    return isinstance(item, dict) and set(item) == {"$patch"}


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise ApiError.bad_request(f"Unknown patch type: {directive}")
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    deferred_deletes: list[tuple[str, list[Any]]] = []
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            deferred_deletes.append((key.split("/", 1)[1], value or []))
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, values in deferred_deletes:
        if isinstance(result.get(key), list):
            result[key] = [v for v in result[key] if v not in values]
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if not isinstance(current, list) or any(
        isinstance(i, dict) and i.get("$patch") == "replace" for i in patch
    ):
        return _strip_directives(patch)
    if field in PRIMITIVE_SET_LISTS:
        return current + [v for v in patch if v not in current]
    key = LIST_MERGE_KEYS.get(field)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return _strip_directives(patch)
    result = copy.deepcopy(current)
    for item in patch:
        if key not in item:
            result.append(_strip_directives(item))
            continue
        idx = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
        elif idx is None:
            result.append(_strip_directives(item))
        else:
            result[idx] = strategic_merge_patch(result[idx], item)
    return result


# -- RFC 6902 --------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(422, "Invalid", f"doc is missing path: {path!r}: missing value")
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(422, "Invalid", f"doc is missing path: {path!r}: missing value")


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    value = _get(doc, path)
    parent = _parent(doc, parts, path)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        del parent[int(parts[-1])]
    return value


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise ApiError(422, "Invalid", f"add operation: index out of bounds: {path!r}")
    else:
        raise ApiError(422, "Invalid", f"doc is missing path: {path!r}: missing value")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError.bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
        )
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError.bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            if _pointer(path):
                _remove(doc, path)
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {path} failed: test failed")
        else:
            raise ApiError.bad_request(f"Unexpected kind: {kind}")
    return doc


def apply_patch(content_type: str, target: dict[str, Any], body: Any, *, custom: bool) -> Any:
    """Apply `body` to `target` as the given media type. `custom` = CRD-backed resource."""
    content_type = PATCH_TYPE_ALIASES.get(content_type, content_type)
    accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
    if not custom:
        accepted.insert(2, STRATEGIC_MERGE_PATCH)
    if content_type not in accepted or content_type == APPLY_PATCH:
        raise ApiError.unsupported_media_type(content_type, accepted)
    if content_type == JSON_PATCH:
        return json_patch(target, body)
    if not isinstance(body, dict):
        raise ApiError.bad_request(
            "couldn't get version/kind; json parse error: json: cannot unmarshal array into Go "
            "value of type struct"
        )
    if content_type == MERGE_PATCH:
        return merge_patch(target, body)
    return strategic_merge_patch(target, body)
