"""What differs between two MachineConfigs (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from agent.model.ignition import User
from agent.model.machineconfig import MachineConfig


@dataclass(frozen=True)
class ConfigDiff:
    files_changed: tuple[str, ...]  # added or modified (contents, mode or owner)
    files_removed: tuple[str, ...]
    units_changed: tuple[str, ...]
    units_removed: tuple[str, ...]
    ssh_keys: bool
    password: bool
    kernel_arguments: bool
    extensions: bool
    kernel_type: bool
    fips: bool

    @property
    def empty(self) -> bool:
        return not (
            self.files_changed
            or self.files_removed
            or self.units_changed
            or self.units_removed
            or self.ssh_keys
            or self.password
            or self.kernel_arguments
            or self.extensions
            or self.kernel_type
            or self.fips
        )


def core_user(users: tuple[User, ...] | None) -> User | None:
    return next((u for u in users or () if u.name == "core"), None)


def ssh_keys_of(users: tuple[User, ...] | None) -> tuple[str, ...]:
    """Keys of every listed user, in order (the MCD concatenates them all into core's file)."""
    return tuple(key for user in users or () for key in user.ssh_keys)


def diff_configs(current: MachineConfig, desired: MachineConfig) -> ConfigDiff:
    old, new = current.ignition, desired.ignition
    files_changed = tuple(sorted(p for p, entry in new.files.items() if old.files.get(p) != entry))
    files_removed = tuple(sorted(p for p in old.files if p not in new.files))
    units_changed = tuple(sorted(n for n, unit in new.units.items() if old.units.get(n) != unit))
    units_removed = tuple(sorted(n for n in old.units if n not in new.units))
    old_core, new_core = core_user(old.users), core_user(new.users)
    return ConfigDiff(
        files_changed=files_changed,
        files_removed=files_removed,
        units_changed=units_changed,
        units_removed=units_removed,
        # `users: null` means "not managed here", not "delete every key" (as the MCD).
        ssh_keys=new.users is not None and ssh_keys_of(old.users) != ssh_keys_of(new.users),
        password=new.users is not None
        and (old_core.password_hash if old_core else None)
        != (new_core.password_hash if new_core else None),
        # nil and [] are equal; order and duplicates matter (the MCD's deep-equal).
        kernel_arguments=current.kernel_arguments != desired.kernel_arguments,
        extensions=current.extensions != desired.extensions,
        kernel_type=current.kernel_type != desired.kernel_type,
        fips=current.fips != desired.fips,
    )
