"""The configs recorded on the host: the one it runs (`current-config`, like the MCD's on-disk
config) and the one an update is bringing (`pending-config`), each replaced atomically."""

from __future__ import annotations

from pathlib import Path

from agent.errors import HostError, InputError
from agent.host.durable import write_atomic
from agent.model.machineconfig import MachineConfig, parse_machine_config


class ConfigStore:
    def __init__(self, state_dir: Path) -> None:
        self.current_path = state_dir / "current-config"
        self.pending_path = state_dir / "pending-config"

    @staticmethod
    def _read(path: Path) -> MachineConfig | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return parse_machine_config(data)
        except InputError as exc:
            raise HostError(f"recorded {path.name} is unreadable: {exc}", kind="journal") from None

    def current(self) -> MachineConfig | None:
        return self._read(self.current_path)

    def pending(self) -> MachineConfig | None:
        return self._read(self.pending_path)

    def pending_document(self) -> bytes:
        return self.pending_path.read_bytes()

    def record_current(self, document: bytes) -> None:
        parse_machine_config(document)  # refuse to record what could not be read back
        write_atomic(self.current_path, document)

    def record_pending(self, document: bytes) -> None:
        write_atomic(self.pending_path, document)

    def commit(self) -> None:
        """The pending config becomes the current one (idempotent until `drop_pending`)."""
        write_atomic(self.current_path, self.pending_document())

    def drop_pending(self) -> None:
        self.pending_path.unlink(missing_ok=True)
