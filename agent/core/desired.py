"""The desired state of a host, as a source delivers it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from agent.model.imageref import ImageRef
from agent.model.machineconfig import MachineConfig


@dataclass(frozen=True)
class Desired:
    config: MachineConfig
    document: bytes  # the source document, kept on the host as the record of what was applied
    target: ImageRef | None  # the OS image to run (an override, or the config's osImageURL)

    @property
    def key(self) -> str:
        """Identity of this desired state: changes when the config or the target changes."""
        text = f"{self.config.fingerprint}|{self.target or ''}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]
