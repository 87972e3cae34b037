"""Certificates from ControllerConfig `machine-config-controller`, written live as the MCD's
certificate writer does (docs/mco-protocol.md §11; upstream
https://github.com/openshift/machine-config-operator/blob/7ff337a4ffac8e7562692181178ede61e4b2eec5/pkg/daemon/certificate_writer.go
), and the kubeconfig CA rotation that comes with them (`agent/cluster/kubeconfig.py`)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import stat
from dataclasses import dataclass, field
from typing import Any

import structlog

from agent.cluster.kube import Kube, KubeError
from agent.cluster.kubeconfig import (
    CA_BUNDLE_KEY,
    KUBECONFIG_DATA_PATH,
    KUBECONFIG_DATA_SOURCE,
    ServerCAPlan,
    ca_bundle,
    plan_server_ca,
    with_certificate_authority,
)
from agent.core.policy import (
    CERTS_DIR,
    CLOUD_CA,
    INTERNAL_PULL_SECRET,
    KUBECONFIG,
    KUBELET_CA,
    KUBELET_KUBECONFIG,
)
from agent.errors import HostError, InputError
from agent.host.ports import FilesPort, Host
from agent.model.ignition import Owner

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
    """The files a ControllerConfig asks for (pure); InputError naming the field it cannot
    use, whatever the shape of the object."""
    spec = controller_config.get("spec") or {}
    if not isinstance(spec, dict):
        raise InputError("expected an object", field="spec")
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
        bundles = spec.get(key) or []
        if not isinstance(bundles, list):
            raise InputError("expected a list", field=f"spec.{key}")
        for i, bundle in enumerate(bundles):
            if not isinstance(bundle, dict):
                raise InputError("expected an object", field=f"spec.{key}[{i}]")
            name = str(bundle.get("file", ""))
            directory = name.replace("..", ":")
            if not directory or "/" in directory or directory in (".", ":"):
                raise InputError(f"invalid registry name {name!r}", field=f"spec.{key}[{i}].file")
            dirs.add(directory)
            data = _decode(bundle.get("data"), f"spec.{key}[{i}].data")
            files.append(CertFile(f"{CERTS_DIR}{directory}/ca.crt", data))
    return CertSet(tuple(files), frozenset(dirs))


def _write_if_changed(files_port: FilesPort, cert: CertFile) -> bool:
    mode = files_port.mode_of(cert.path)
    return files_port.write(cert.path, cert.contents,
                            mode=cert.new_mode if mode is None else mode,
                            user=ROOT, group=ROOT)  # fmt: skip


@dataclass(frozen=True)
class CertsWritten:
    """What `write_certificates` did, for the log: `changed` written or removed, `warnings`
    for the registry directories it could not remove (the MCD warns and goes on)."""

    changed: list[str]
    warnings: list[str]


def _stale_registry_dirs(files_port: FilesPort, base: str, listed: frozenset[str]) -> list[str]:
    """Directories under `base` that no registry bundle names. Only directories, as lstat
    sees them: Ignition's `.create` placeholder, every other regular file and every link are
    left where they are, as the MCD leaves them (certificate_writer.go, `entry.IsDir()` of
    os.ReadDir, which does not follow links)."""
    stale = []
    for name in files_port.list_dir(base):
        if name in listed:
            continue
        kind = files_port.inspect_kind(f"{base}/{name}")
        if kind is not None and stat.S_ISDIR(kind):
            stale.append(name)
    return stale


def write_certificates(files_port: FilesPort, certs: CertSet) -> CertsWritten:
    """Remove the registry directories no longer listed, then write the set (atomic, existing
    modes kept, a file already as wanted left untouched), following the MCD's certificate
    writer, `syncControllerConfigHandler`
    (https://github.com/openshift/machine-config-operator/blob/7ff337a4ffac8e7562692181178ede61e4b2eec5/pkg/daemon/certificate_writer.go#L238-L279):
    a directory that cannot be removed is a warning, not a failure.

    Where the MCD compares a directory's name with the bundle's raw `file` (so a bundle for
    `host..5000` has its `host:5000` directory removed and written again at every sync), this
    compares with the name the bundle is written under, so a listed directory is never touched."""
    changed, warnings = [], []
    base = CERTS_DIR.rstrip("/")
    for name in _stale_registry_dirs(files_port, base, certs.registry_dirs):
        try:
            files_port.remove_dir(f"{base}/{name}")
        except HostError as exc:
            warnings.append(f"could not remove old certificate directory {base}/{name}: {exc}")
            continue
        changed.append(f"{base}/{name}")
    changed.extend(cert.path for cert in certs.files if _write_if_changed(files_port, cert))
    return CertsWritten(changed, warnings)


def _read_kubeconfig(files_port: FilesPort, path: str) -> bytes:
    data = files_port.read(path)
    if data is None:
        raise InputError("file not found", source=path)
    return data


async def rotate_server_ca(host: Host, bundle: bytes) -> tuple[ServerCAPlan, list[str]]:
    """Bring the kubeconfigs to the kube-apiserver serving-CA `bundle` (the kubeconfig-data
    ConfigMap's), as the MCD does (`syncControllerConfigHandler`): `/etc/kubernetes/kubeconfig`
    gets every parseable certificate when one is new to it; when a new one is not a
    localhost/lb signer, `/var/lib/kubelet/kubeconfig` gets the same CA data, then
    `daemon-reload` and a restart of kubelet.service. Existing modes are kept. Returns the
    plan and what was written or done, for the log.

    A kubeconfig that cannot be read or parsed is an InputError before anything is written.
    Order: the kubelet's kubeconfig and its restart come first and `/etc/kubernetes/kubeconfig`
    last, because the decision is taken from the latter: a failure part-way leaves the
    decision as it was and the next attempt does the whole step again (the MCD writes
    /etc/kubernetes/kubeconfig first and so never retries a failed kubelet restart). Where the
    MCD stops the kubelet, writes and starts it, a restart after the atomic write is the same:
    the kubelet reads its kubeconfig only when it starts."""
    files = host.files
    kubeconfig = await asyncio.to_thread(_read_kubeconfig, files, KUBECONFIG)
    plan = plan_server_ca(kubeconfig, bundle, KUBECONFIG)
    if plan.kubeconfig is None:
        return plan, []
    done = []
    if plan.restart_kubelet:
        kubelet = await asyncio.to_thread(_read_kubeconfig, files, KUBELET_KUBECONFIG)
        new = with_certificate_authority(kubelet, plan.ca, KUBELET_KUBECONFIG)
        if await asyncio.to_thread(
            _write_if_changed, files, CertFile(KUBELET_KUBECONFIG, new, 0o600)
        ):
            done.append(KUBELET_KUBECONFIG)
        for action in ("daemon-reload", "restart kubelet.service"):
            await host.system.perform(action)
            done.append(action)
    if await asyncio.to_thread(
        _write_if_changed, files, CertFile(KUBECONFIG, plan.kubeconfig, 0o600)
    ):
        done.append(KUBECONFIG)
    return plan, done


async def rotate_if_published(api: Kube, host: Host) -> bool:
    """The rotation the operator flagged: the bundle it published in the kubeconfig-data
    ConfigMap, applied with `rotate_server_ca`. False when there is no bundle to read yet (the
    caller leaves the flag unrecorded, so the next pass asks again; the MCD records it anyway
    and so drops the rotation for good). A 5xx is raised for a retry; an unusable bundle or
    kubeconfig is an InputError."""
    log = structlog.get_logger("certs")
    try:
        configmap: dict[str, Any] = await api.get(KUBECONFIG_DATA_PATH)
    except KubeError as exc:
        if exc.status >= 500:
            raise
        log.warning("cannot read " + KUBECONFIG_DATA_SOURCE, error=str(exc))
        return False
    bundle = ca_bundle(configmap)
    if bundle is None:
        log.warning("no " + CA_BUNDLE_KEY + " in " + KUBECONFIG_DATA_SOURCE)
        return False
    plan, done = await rotate_server_ca(host, bundle)
    log.info("kube-apiserver serving CA synced", done=done, added=plan.added,
             restart=plan.restart_kubelet)  # fmt: skip
    return True
