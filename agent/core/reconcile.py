"""Changes that are refused outright (state Unreconcilable), as the MCO's
`IsRenderedConfigReconcilable` (docs/mco-protocol.md §14), and Ignition spec 2, which image mode
never converts."""

from __future__ import annotations

import posixpath

from agent.core.policy import FORCE_FILE
from agent.model.diff import core_user
from agent.model.machineconfig import MachineConfig


def unreconcilable_reasons(current: MachineConfig, desired: MachineConfig) -> list[str]:
    """Why `desired` cannot be reached from `current`; empty when it can."""
    old, new = current.ignition, desired.ignition
    if not new.supported:
        return [
            f"ignition version {new.version} is not supported: image mode accepts Ignition "
            "spec 3.0-3.5 only (spec 2 configs must be converted to spec 3)"
        ]
    reasons: list[str] = []
    for section in ("disks", "filesystems", "raid"):
        if getattr(old, section) != getattr(new, section):
            reasons.append(f"ignition {section} section contains changes")
    if old.directories != new.directories:
        reasons.append("ignition directories section contains changes")
    if added := sorted(new.links - old.links):
        reasons.append(f"ignition links section contains added links: {', '.join(added)}")
    if old.kernel_arguments != new.kernel_arguments:
        reasons.append(
            "ignition kernelArguments section contains changes: use spec.kernelArguments"
        )
    if old.groups != new.groups:
        reasons.append("ignition passwd groups section contains changes")
    for path, entry in new.files.items():
        if entry.has_append:
            reasons.append(f"ignition file {path} includes append: unsupported")
        if path == FORCE_FILE:
            reasons.append(f"ignition file {path} is the MCD force file: unsupported")
        if not path.startswith("/") or posixpath.normpath(path) != path or "/../" in path + "/":
            reasons.append(f"ignition file path {path!r} is not an absolute, normalized path")
    if new.users is not None and new.users != old.users:
        reasons.extend(_user_reasons(desired))
    if current.fips != desired.fips:
        reasons.append("detected change to FIPS flag; refusing to modify FIPS on a running node")
    return reasons


def _user_reasons(desired: MachineConfig) -> list[str]:
    users = desired.ignition.users or ()
    reasons = [
        f"ignition passwd user section contains unsupported changes: user {u.name!r} "
        "(only user core may be managed)"
        for u in users
        if u.name != "core"
    ]
    core = core_user(users)
    if core is not None:
        if core.other_fields:
            reasons.append(
                "ignition passwd user section contains unsupported changes: user core fields "
                f"{', '.join(sorted(core.other_fields))} (only sshAuthorizedKeys and passwordHash)"
            )
        if not core.ssh_keys and not core.password_hash:
            reasons.append(
                "ignition passwd user core has no SSH keys and no password hash: it would lock "
                "out the user"
            )
    return reasons
