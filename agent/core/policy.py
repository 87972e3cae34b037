"""What may be written live, and what follows each write (pure).

The built-in allowlist: the SSH keys and password hash of `core`, the pull secret (and bootc's
copy of it), the certificate writer's files and the user CA bundle. Cluster admins extend it
through the NodeDisruptionPolicy status of `MachineConfiguration/cluster`, with the MCD's
semantics (docs/mco-protocol.md §13): files match by longest prefix, units by exact name, SSH
keys by the `sshkey` entry."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InputError
from agent.model.mcd_disk import CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH

PULL_SECRET = "/var/lib/kubelet/config.json"
BOOTC_AUTH = "/run/ostree/auth.json"
USER_CA_BUNDLE = "/etc/pki/ca-trust/source/anchors/openshift-config-user-ca-bundle.crt"
KUBELET_CA = "/etc/kubernetes/kubelet-ca.crt"
CLOUD_CA = "/etc/kubernetes/static-pod-resources/configmaps/cloud-config/ca-bundle.pem"
INTERNAL_PULL_SECRET = "/etc/mco/internal-registry-pull-secret.json"
# The bootstrap kubeconfig and the kubelet's own: the MCD rewrites their cluster CA when the
# kube-apiserver's serving CA rotates (pkg/daemon/certificate_writer.go).
KUBECONFIG = "/etc/kubernetes/kubeconfig"
KUBELET_KUBECONFIG = "/var/lib/kubelet/kubeconfig"
SSH_KEYS_PATH = "/home/core/.ssh/authorized_keys.d/ignition"
SHADOW_PATH = "/etc/shadow"
FORCE_FILE = "/run/machine-config-daemon-force"

# Contents of these never reach a log, an event or a reason.
SECRET_PATHS = frozenset({PULL_SECRET, BOOTC_AUTH, INTERNAL_PULL_SECRET, SHADOW_PATH, KUBECONFIG,
                          KUBELET_KUBECONFIG})  # fmt: skip
# Files written with a forced mode regardless of what the MachineConfig says.
FORCED_MODES = {PULL_SECRET: 0o600, BOOTC_AUTH: 0o600, INTERNAL_PULL_SECRET: 0o600}
# A live write of the key also lands at these paths (bootc reads its pull secret there).
MIRRORS = {PULL_SECRET: (BOOTC_AUTH,)}

_UNIT_SUFFIXES = (
    ".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
    ".timer", ".snapshot", ".slice", ".scope",
)  # fmt: skip


@dataclass(frozen=True)
class Action:
    """A follow-up after a live write. `kind` uses NodeDisruptionPolicy's names, plus
    `UpdateCATrust` for the trust-store refresh the user CA bundle needs."""

    kind: str
    service: str | None = None

    def render(self) -> str:
        match self.kind:
            case "Reload":
                return f"reload {self.service}"
            case "Restart":
                return f"restart {self.service}"
            case "DaemonReload":
                return "daemon-reload"
            case "UpdateCATrust":
                return "update-ca-trust"
            case "Special":
                return "reload crio.service"
            case _:
                return self.kind.lower()


NONE: tuple[Action, ...] = ()
KNOWN_KINDS = frozenset({"None", "Reboot", "Drain", "Reload", "Restart", "DaemonReload", "Special"})


@dataclass(frozen=True)
class LivePolicy:
    files: Mapping[str, tuple[Action, ...]] = field(default_factory=dict)
    units: Mapping[str, tuple[Action, ...]] = field(default_factory=dict)
    sshkey: tuple[Action, ...] = NONE

    def file_actions(self, path: str) -> tuple[Action, ...] | None:
        """Actions for a path by longest-prefix match, or None when the path is image content."""
        best: str | None = None
        for prefix in self.files:
            if (path == prefix or path.startswith(prefix.rstrip("/") + "/")) and (
                best is None or len(prefix) > len(best)
            ):
                best = prefix
        if best is None:
            return None
        actions = self.files[best]
        return None if any(a.kind == "Reboot" for a in actions) else actions

    def unit_actions(self, name: str) -> tuple[Action, ...] | None:
        actions = self.units.get(name)
        if actions is None or any(a.kind == "Reboot" for a in actions):
            return None
        return actions

    def extended(self, other: LivePolicy) -> LivePolicy:
        """This policy with `other`'s entries added (same path or unit name: other wins)."""
        return LivePolicy(
            files={**self.files, **other.files},
            units={**self.units, **other.units},
            sshkey=other.sshkey if other.sshkey else self.sshkey,
        )


BUILTIN_POLICY = LivePolicy(
    files={
        PULL_SECRET: NONE,
        KUBELET_CA: NONE,
        USER_CA_BUNDLE: (Action("UpdateCATrust"), Action("Restart", "crio.service")),
    },
)


def requires_drain(actions: Iterable[Action]) -> bool:
    # The MCD drains for Special unless the registries.conf change is provably safe; we do not
    # re-derive that TOML analysis, so Special always drains (the conservative side).
    return any(a.kind in ("Drain", "Special", "Reboot") for a in actions)


def _actions(raw: Any, where: str) -> tuple[Action, ...]:
    if not isinstance(raw, list):
        raise InputError("expected a list", field=where)
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or item.get("type") not in KNOWN_KINDS:
            raise InputError(f"unknown action {item!r}", field=f"{where}[{i}]")
        kind = item["type"]
        service = None
        if kind in ("Reload", "Restart"):
            service = (item.get(kind.lower()) or {}).get("serviceName")
            if not isinstance(service, str) or not service.endswith(_UNIT_SUFFIXES):
                raise InputError("serviceName must name a systemd unit", field=f"{where}[{i}]")
        if kind != "None":
            out.append(Action(kind, service))
    return tuple(out)


def policy_from_machine_configuration(obj: Any) -> LivePolicy | None:
    """The cluster policies of `MachineConfiguration/cluster`, or None while the operator has not
    observed the current generation (the MCD reads status only then)."""
    if not isinstance(obj, dict):
        raise InputError("expected a MachineConfiguration object")
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if meta.get("generation") is not None and meta.get("generation") != status.get(
        "observedGeneration"
    ):
        return None
    cluster = (status.get("nodeDisruptionPolicyStatus") or {}).get("clusterPolicies") or {}
    files = {}
    for i, entry in enumerate(cluster.get("files") or []):
        where = f"status.nodeDisruptionPolicyStatus.clusterPolicies.files[{i}]"
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            raise InputError("expected an absolute path", field=f"{where}.path")
        files[posixpath.normpath(path)] = _actions(entry.get("actions") or [], f"{where}.actions")
    units = {}
    for i, entry in enumerate(cluster.get("units") or []):
        where = f"status.nodeDisruptionPolicyStatus.clusterPolicies.units[{i}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise InputError("expected a unit name", field=f"{where}.name")
        units[name] = _actions(entry.get("actions") or [], f"{where}.actions")
    sshkey = cluster.get("sshkey") or {}
    return LivePolicy(
        files=files,
        units=units,
        sshkey=_actions(sshkey.get("actions") or [], "clusterPolicies.sshkey.actions"),
    )


CERTS_DIR = "/etc/docker/certs.d/"
# Not the live allowlist, but the files that hand a node between the MCD and this agent
# (model/mcd_disk.py), and the force file the agent removes once it has acted on it.
HANDOVER_PATHS = frozenset({CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH, FORCE_FILE})
LIVE_DIRS = frozenset({"/home/core/.ssh", "/home/core/.ssh/authorized_keys.d"})
_FIXED_LIVE_PATHS = frozenset(
    {SSH_KEYS_PATH, SHADOW_PATH, BOOTC_AUTH, KUBELET_CA, CLOUD_CA, INTERNAL_PULL_SECRET,
     KUBECONFIG, KUBELET_KUBECONFIG}
)  # fmt: skip


@dataclass
class Allowlist:
    """The paths a host's files port may write, following the policy in force (the cluster's
    NodeDisruptionPolicy can change at run time, so the writer asks per call)."""

    policy: LivePolicy = BUILTIN_POLICY

    def allows(self, path: str) -> bool:
        """A file path the live part may write; with a trailing "/", a directory it may create
        and set the mode and owner of (only the SSH key's parents)."""
        if path.endswith("/"):
            return path.rstrip("/") in LIVE_DIRS
        if path in _FIXED_LIVE_PATHS or path in HANDOVER_PATHS or path.startswith(CERTS_DIR):
            return True
        if self.policy.file_actions(path) is not None:
            return True
        if path.startswith("/etc/systemd/system/"):
            unit = path.removeprefix("/etc/systemd/system/").split("/", 1)[0]
            return self.policy.unit_actions(unit.removesuffix(".d")) is not None
        return False
