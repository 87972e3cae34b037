"""Certificates from ControllerConfig `machine-config-controller`, written live
(DESIGN.md §3, reference/mco-daemon.md §4.3)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InputError
from agent.host.ports import FilesPort
from agent.model.ignition import Owner
from agent.policy import CERTS_DIR, CLOUD_CA, INTERNAL_PULL_SECRET, KUBELET_CA

ROOT = Owner(id=0)


@dataclass(frozen=True)
class CertFile:
    path: str
    contents: bytes = field(repr=False)
    new_mode: int = 0o644  # used only when the file does not exist yet: existing modes are kept


@dataclass(frozen=True)
class CertSet:
    files: tuple[CertFile, ...]
    registry_dirs: frozenset[str]  # every directory under /etc/docker/certs.d that should exist


def _decode(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InputError("invalid base64", field=where) from None
    raise InputError("expected base64 data", field=where)


def _with_newline(data: bytes) -> bytes:
    return data if data.endswith(b"\n") else data + b"\n"


def certificates(controller_config: dict[str, Any]) -> CertSet:
    """The files a ControllerConfig asks for (pure)."""
    spec = controller_config.get("spec") or {}
    files = []
    if spec.get("kubeAPIServerServingCAData"):
        data = _decode(spec["kubeAPIServerServingCAData"], "spec.kubeAPIServerServingCAData")
        files.append(CertFile(KUBELET_CA, _with_newline(data)))
    if spec.get("cloudProviderCAData"):
        data = _decode(spec["cloudProviderCAData"], "spec.cloudProviderCAData")
        files.append(CertFile(CLOUD_CA, _with_newline(data)))
    if spec.get("internalRegistryPullSecret"):
        secret = _decode(spec["internalRegistryPullSecret"], "spec.internalRegistryPullSecret")
        files.append(CertFile(INTERNAL_PULL_SECRET, secret, 0o600))
    dirs = set()
    for key in ("imageRegistryBundleData", "imageRegistryBundleUserData"):
        for i, bundle in enumerate(spec.get(key) or []):
            name = str(bundle.get("file", ""))
            directory = name.replace("..", ":")
            if not directory or "/" in directory or directory in (".", ":"):
                raise InputError(f"invalid registry name {name!r}", field=f"spec.{key}[{i}].file")
            dirs.add(directory)
            data = _decode(bundle.get("data"), f"spec.{key}[{i}].data")
            files.append(CertFile(f"{CERTS_DIR}{directory}/ca.crt", data))
    return CertSet(tuple(files), frozenset(dirs))


def write_certificates(files_port: FilesPort, certs: CertSet) -> list[str]:
    """Write the set (atomic, existing modes kept) and remove registry directories that are
    no longer listed. Returns the paths written or removed, for the log."""
    changed = []
    for cert in certs.files:
        if files_port.read(cert.path) == cert.contents:
            continue
        mode = files_port.mode_of(cert.path)
        files_port.write(cert.path, cert.contents, mode=cert.new_mode if mode is None else mode,
                         user=ROOT, group=ROOT)  # fmt: skip
        changed.append(cert.path)
    base = CERTS_DIR.rstrip("/")
    for directory in files_port.list_dir(base):
        if directory not in certs.registry_dirs:
            files_port.remove_dir(f"{base}/{directory}")
            changed.append(f"{base}/{directory}")
    return changed
