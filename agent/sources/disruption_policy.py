"""The live allowlist's extension from a `MachineConfiguration/cluster` document on disk (file
mode and `plan --policy`); cluster mode watches the object instead (cluster/agent.py)."""

from __future__ import annotations

from pathlib import Path

from agent.core.policy import BUILTIN_POLICY, LivePolicy, policy_from_machine_configuration
from agent.errors import InputError
from agent.model.document import load_document


def load_live_policy(path: Path) -> LivePolicy:
    """The built-in allowlist extended by the file's NodeDisruptionPolicy status (as is while
    the operator has not observed its generation); InputError naming the file and field."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=str(path)) from None
    try:
        extra = policy_from_machine_configuration(load_document(data))
    except InputError as exc:
        raise exc.located(str(path)) from None
    return BUILTIN_POLICY.extended(extra) if extra else BUILTIN_POLICY
