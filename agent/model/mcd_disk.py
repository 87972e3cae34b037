"""The machine-config-daemon's on-disk config (pure): the two files through which a node
changes hands between the MCD and this agent, in the MCD's own format.

`/etc/machine-config-daemon/currentconfig` is the MCD's `json.Marshal` of the MachineConfig it
last applied, with the on-cluster-layering annotations taken out and the original osImageURL
put back (MCO `pkg/daemon/daemon.go` `storeCurrentConfigOnDisk`, `pkg/daemon/ocl.go`
`newOnDiskConfigFromMachineConfig`); `currentimage` is the layered image as a bare string, empty
when the node is not layered. Both are written 0644, atomically. The MCD reads them back as
truth over the Node's annotations (`checkStateOnFirstRun`: "disk is truth"), so this agent
reads them when it takes a node over and keeps them current after each of its own updates,
for an MCD that takes the node back.

Go writes struct fields in declaration order (openshift/api `machineconfiguration/v1`
`MachineConfig`, `MachineConfigSpec`; apimachinery `ObjectMeta`), compact, with `<`, `>`, `&`,
U+2028 and U+2029 escaped; a typed informer's object carries no TypeMeta, so neither
`kind` nor `apiVersion` is written. The MCD decodes the file with `json.Decoder`, which
accepts any order: the order matters for people comparing files, not for the MCD."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.errors import InputError

CURRENT_CONFIG_PATH = "/etc/machine-config-daemon/currentconfig"
CURRENT_IMAGE_PATH = "/etc/machine-config-daemon/currentimage"
MC_API_VERSION = "machineconfiguration.openshift.io/v1"
ORIGINAL_OS_IMAGE_URL = "machineconfiguration.openshift.io/original-osimageurl"
OCL_OS_IMAGE_URL = "machineconfiguration.openshift.io/ocl-osimageurl"

# apimachinery ObjectMeta's fields in declaration order (all omitempty).
_META_ORDER = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
)  # fmt: skip
# MachineConfigSpec's fields in declaration order, with Go's zero value for those that are
# not omitempty (`config` is a struct, which omitempty never drops: a nil Raw is `null`).
_SPEC_ORDER = (
    ("osImageURL", ""), ("baseOSExtensionsContainerImage", ""), ("config", None),
    ("kernelArguments", None), ("extensions", None), ("fips", False), ("kernelType", ""),
)  # fmt: skip
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
               "\u2029": "\\u2029"}  # fmt: skip


def _go_json(value: Any) -> str:
    """Compact JSON as Go's encoding/json writes it (its HTML-safe escaping included). The
    characters it escapes only ever occur inside strings, so escaping them in the text is
    escaping them in the strings."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "".join(_GO_ESCAPES.get(ch, ch) for ch in text)


def _ordered(obj: Mapping[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    known = {key: obj[key] for key in order if key in obj}
    return {**known, **{key: obj[key] for key in sorted(obj) if key not in known}}


def on_disk_config(rendered: Mapping[str, Any]) -> bytes:
    """`currentconfig` for the rendered MachineConfig `rendered` (an object as the API server
    returns it), as the MCD writes it."""
    metadata = dict(rendered.get("metadata") or {})
    spec = dict(rendered.get("spec") or {})
    annotations = dict(metadata.get("annotations") or {})
    if ORIGINAL_OS_IMAGE_URL in annotations or OCL_OS_IMAGE_URL in annotations:
        spec["osImageURL"] = annotations.pop(ORIGINAL_OS_IMAGE_URL, "")
        annotations.pop(OCL_OS_IMAGE_URL, None)
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    ordered_spec = {key: spec.get(key, zero) for key, zero in _SPEC_ORDER}
    ordered_spec.update({key: spec[key] for key in sorted(spec) if key not in ordered_spec})
    document: dict[str, Any] = {}
    if metadata:
        document["metadata"] = _ordered(metadata, _META_ORDER)
    document["spec"] = ordered_spec
    return _go_json(document).encode()


def config_document(data: bytes, source: str = CURRENT_CONFIG_PATH) -> bytes:
    """The MachineConfig document of a `currentconfig` file, in the form this agent records
    a rendered config in (the name alone of the metadata, `kind` and `apiVersion` set), so
    that the same config read from the MCD's file and from the API server compares equal.
    InputError naming `source` for a file that is no MachineConfig object."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid JSON: {exc}", source=source) from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", source=source)
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise InputError("expected the config's name", source=source, field="metadata.name")
    kind = obj.get("kind") or "MachineConfig"
    if kind != "MachineConfig":
        raise InputError(f"not a MachineConfig (kind {kind!r})", source=source, field="kind")
    stable = {**obj, "apiVersion": obj.get("apiVersion") or MC_API_VERSION, "kind": kind,
              "metadata": {"name": name}}  # fmt: skip
    return json.dumps(stable, sort_keys=True).encode()


def on_disk_image(image: str | None) -> bytes:
    """`currentimage`: the image as a bare string, empty for none."""
    return (image or "").encode()


def read_image(data: bytes | None) -> str | None:
    """The image a `currentimage` file names (the MCD trims it); None for none."""
    text = (data or b"").decode(errors="replace").strip()
    return text or None
