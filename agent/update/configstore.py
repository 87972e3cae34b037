"""The configs recorded on the host: the one it runs (`current-config`, like the MCD's on-disk
config) and the one an update is bringing (`pending-config`), each replaced atomically.

A recorded config that cannot be read or parsed is never deleted, replaced or skipped to get
past it: it is the only record of what the host runs (current) or of the update in flight
(pending), and planning from a guess could apply, or fail to refuse, a change. Reading it
raises HostError(kind="journal") whose message names the file and the field at fault, so the
agent reports Degraded (the Node's reason in cluster mode, status.json and /status in file
mode), keeps running, and reads the file again with backoff: it heals once someone fixes the
file or moves it away (with no current-config, cluster mode adopts the Node's currentConfig
again and file mode plans from none, as on a first start). Only the engine's own bookkeeping
replaces or drops a pending config: a new update records its own, a commit or a rollback
drops it once done (a revert that cannot read it stops before the drop)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent.errors import HostError, InputError, parsing
from agent.host.durable import write_record
from agent.model.machineconfig import MachineConfig, parse_machine_config


def parse_config(data: bytes, default_name: str = "") -> MachineConfig:
    """`parse_machine_config`, with a parser crash on an unexpected shape as an InputError."""
    return parsing(parse_machine_config, data, default_name)


class ConfigStore:
    """`external`: another record of the current config, which wins when it differs from this
    store's (cluster mode: the MCD's on-disk config, as the MCD takes its own file as truth
    over the Node; it differs only when the MCD ran on the host after this agent, since the
    agent writes it before its own at every commit). It returns the document and the path
    it read (for messages), or None when there is none."""

    def __init__(
        self, state_dir: Path, external: Callable[[], tuple[bytes, str] | None] | None = None
    ) -> None:
        self.current_path = state_dir / "current-config"
        self.pending_path = state_dir / "pending-config"
        self.external = external

    @staticmethod
    def _bytes(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(f"recorded config {path} is unreadable: {exc.strerror or exc}",
                            kind="journal") from None  # fmt: skip

    @staticmethod
    def _parse(path: Path, data: bytes) -> MachineConfig:
        try:
            return parse_config(data)
        except InputError as exc:
            problem = f"recorded config {path} is unreadable: {exc}"
            raise HostError(problem, kind="journal") from None

    def _read(self, path: Path) -> MachineConfig | None:
        data = self._bytes(path)
        return None if data is None else self._parse(path, data)

    def current(self) -> MachineConfig | None:
        own = self._read(self.current_path)
        found = self.external() if self.external is not None else None
        if found is None:
            return own
        data, where = found
        theirs = self._parse(Path(where), data)
        return theirs if own != theirs else own

    def external_differs(self) -> tuple[MachineConfig, bytes] | None:
        """The other record's config and document when this store has a current config of its
        own and the other record holds a different one: someone else (the MCD) applied it
        after this agent last recorded its own, or this agent's commit was cut off between the
        two records (see the class). None otherwise, and always on a first takeover, which
        leaves no record of this store's own."""
        if self.external is None:
            return None
        own = self._read(self.current_path)
        found = self.external() if own is not None else None
        if found is None:
            return None
        data, where = found
        theirs = self._parse(Path(where), data)
        return None if theirs == own else (theirs, data)

    def has_external(self) -> bool:
        """Whether the other record of the current config (see the class) holds one."""
        return self.external is not None and self.external() is not None

    def current_document(self) -> bytes | None:
        """The current config's bytes as recorded (None: none recorded yet)."""
        return self._bytes(self.current_path)

    def pending(self) -> MachineConfig | None:
        return self._read(self.pending_path)

    def pending_document(self) -> bytes:
        """The pending config's bytes; HostError naming the file when it is missing (an update
        in flight without its record) or unreadable."""
        data = self._bytes(self.pending_path)
        if data is None:
            raise HostError(f"recorded config {self.pending_path} is missing: the update in "
                            "flight has no record of its config", kind="journal")  # fmt: skip
        return data

    def pending_recorded(self) -> tuple[MachineConfig, bytes]:
        """The pending config, parsed, and its bytes (HostError as `pending_document`)."""
        data = self.pending_document()
        return self._parse(self.pending_path, data), data

    def record_current(self, document: bytes) -> None:
        parse_config(document)  # refuse to record what could not be read back
        write_record(self.current_path, document, "recorded config")

    def record_pending(self, document: bytes) -> None:
        write_record(self.pending_path, document, "recorded config")

    def commit(self) -> None:
        """The pending config becomes the current one (idempotent until `drop_pending`)."""
        write_record(self.current_path, self.pending_document(), "recorded config")

    def drop_pending(self) -> None:
        self.pending_path.unlink(missing_ok=True)
