"""The durable phase record: what the agent intends to do next, written before it does it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from agent.errors import HostError
from agent.host.durable import write_record

JOURNAL_VERSION = 1


class Phase(StrEnum):
    IDLE = "idle"
    APPLYING_LIVE = "applying-live"
    STAGING = "staging"
    REBOOTING = "rebooting"
    ROLLING_BACK = "rolling-back"
    ROLLBACK_REBOOTING = "rollback-rebooting"
    COMMITTING = "committing"
    DEGRADED = "degraded"
    UNRECONCILABLE = "unreconcilable"


IN_FLIGHT = frozenset(
    {
        Phase.APPLYING_LIVE,
        Phase.STAGING,
        Phase.REBOOTING,
        Phase.ROLLING_BACK,
        Phase.ROLLBACK_REBOOTING,
        Phase.COMMITTING,
    }
)


@dataclass(frozen=True)
class Record:
    phase: Phase = Phase.IDLE
    started: float | None = None  # wall-clock start of the update, for its duration
    update_key: str | None = None  # the desired state (config + target) this record is about
    config_name: str | None = None
    target: str | None = None  # digest-pinned image being rolled out
    previous: str | None = None  # booted image before the update
    boot_id: str | None = None  # boot ID recorded just before a reboot was asked for
    soft_reboots: int | None = None
    attempts: int = 0  # boots of the target that failed their checks
    reboots: int = 0  # reboots asked for during this update
    cause: str | None = None
    failed: dict[str, str] = field(default_factory=dict)  # digest -> update key it failed under
    # digest -> why it failed (the rollback's cause), shown for as long as it is not retried
    failed_causes: dict[str, str] = field(default_factory=dict)
    current_name: str | None = None
    current_image: str | None = None
    # A pool target staged locked ahead of this node's turn (idle phase only): the pinned ref,
    # written before the stage starts, so that a restart adopts or cleans it.
    prestage: str | None = None
    # The pinned ref last pre-pulled with its signatures verified (`ostree-image-signed:`). A
    # stage that must verify finds any other pre-pulled copy in the repository, and bootc's
    # switch verifies nothing it finds there (docs/bootc-releases.md §7): that copy is pruned first.
    verified_pull: str | None = None

    def to(self, phase: Phase, **changes: Any) -> Record:
        return replace(self, phase=phase, **changes)


class Journal:
    """One JSON document, replaced atomically; readable after a crash at any point."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> Record:
        try:
            raw = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return Record()
        except (OSError, ValueError) as exc:
            raise HostError(f"journal {self.path} is unreadable: {exc}", kind="journal") from None
        if not isinstance(raw, dict) or raw.get("version") != JOURNAL_VERSION:
            raise HostError(f"journal {self.path}: unknown version", kind="journal")
        known = {f.name for f in fields(Record)}
        values = {k: v for k, v in raw.items() if k in known}
        try:
            values["phase"] = Phase(values.get("phase", "idle"))
        except ValueError:
            raise HostError(f"journal {self.path}: unknown phase", kind="journal") from None
        return Record(**values)

    def save(self, record: Record) -> None:
        body = {"version": JOURNAL_VERSION, **asdict(record), "phase": str(record.phase)}
        write_record(
            self.path, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode(), "journal"
        )
