"""MachineConfig documents (machineconfiguration.openshift.io/v1): the desired state of a node."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InputError
from agent.model.document import load_document, plain_value
from agent.model.ignition import IgnitionConfig, empty_config, parse_ignition

_KERNEL_TYPES = {
    "": "default",
    "default": "default",
    "realtime": "realtime",
    "64k-pages": "64k-pages",
}


@dataclass(frozen=True)
class MachineConfig:
    name: str
    ignition: IgnitionConfig
    os_image_url: str | None = None
    kernel_arguments: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    kernel_type: str = "default"
    fips: bool = False
    # Fingerprint of the source document: tells "the desired state changed" without a deep compare.
    fingerprint: str = field(default="", compare=False)


def empty_machine_config(name: str = "") -> MachineConfig:
    return MachineConfig(name=name, ignition=empty_config())


def _string_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError("expected a list of strings", field=where)
    return tuple(value)


def machine_config_from_object(
    obj: Any, default_name: str = "", fingerprint: str | None = None
) -> MachineConfig:
    """A parsed document to a MachineConfig. A bare Ignition config is accepted as the
    `spec.config` of an otherwise empty MachineConfig."""
    obj = plain_value(obj)  # any value, not only one load_document returned
    if fingerprint is None:
        canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
        fingerprint = hashlib.sha256(canonical.encode()).hexdigest()
    return _machine_config(obj, default_name, fingerprint)


def _machine_config(obj: Any, default_name: str, fingerprint: str) -> MachineConfig:
    if not isinstance(obj, dict):
        raise InputError(f"expected a MachineConfig object, got {type(obj).__name__}")
    if "ignition" in obj and "kind" not in obj:
        return MachineConfig(
            name=default_name, ignition=parse_ignition(obj, "config"), fingerprint=fingerprint
        )
    kind = obj.get("kind")
    if kind != "MachineConfig":
        raise InputError(
            f"not a MachineConfig (kind {kind!r})" if kind else "not a MachineConfig (no kind)",
            field="kind",
        )
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InputError("expected an object", field="metadata")
    name = metadata.get("name") or default_name
    if not isinstance(name, str):
        raise InputError("expected a string", field="metadata.name")
    spec = obj.get("spec", {}) if obj.get("spec") is not None else {}
    if not isinstance(spec, dict):
        raise InputError("expected an object", field="spec")

    config = spec.get("config")
    if isinstance(config, str):  # a RawExtension may arrive serialized
        try:
            config = json.loads(config) if config.strip() else None
        except json.JSONDecodeError as exc:
            raise InputError(f"invalid Ignition JSON: {exc.msg}", field="spec.config") from None
        except (ValueError, RecursionError):  # a number too long, nesting too deep
            raise InputError("invalid Ignition JSON", field="spec.config") from None
        config = plain_value(config, "spec.config")
    ignition = empty_config() if config in (None, {}) else parse_ignition(config, "spec.config")

    url = spec.get("osImageURL")
    if url is not None and not isinstance(url, str):
        raise InputError("expected a string", field="spec.osImageURL")
    kernel_type = spec.get("kernelType") or ""
    if not isinstance(kernel_type, str) or kernel_type not in _KERNEL_TYPES:
        raise InputError(
            f"unknown kernel type {kernel_type!r} (default, realtime, 64k-pages)",
            field="spec.kernelType",
        )
    fips = spec.get("fips", False)
    if not isinstance(fips, bool) and fips is not None:
        raise InputError("expected a boolean", field="spec.fips")
    return MachineConfig(
        name=name,
        ignition=ignition,
        os_image_url=url or None,
        kernel_arguments=_string_list(spec.get("kernelArguments"), "spec.kernelArguments"),
        extensions=_string_list(spec.get("extensions"), "spec.extensions"),
        kernel_type=_KERNEL_TYPES[kernel_type],
        fips=bool(fips),
        fingerprint=fingerprint,
    )


def parse_machine_config(data: bytes, default_name: str = "") -> MachineConfig:
    """Bytes of a MachineConfig (or bare Ignition) document to a MachineConfig."""
    # Hashing the bytes is cheaper than a canonical re-serialization of a large document.
    fingerprint = hashlib.sha256(data).hexdigest()
    return _machine_config(load_document(data), default_name, fingerprint)
