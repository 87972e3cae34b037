"""What every strategy answers (Zincati's `report_steady` and `can_finalize`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class Decision:
    """A strategy's answer to "may this host reboot into its staged update now?"."""

    allowed: bool
    reason: str  # for people: "inside the maintenance window Sat 23:30 (60 min)", ...
    next_window: datetime | None = None  # periodic: the next window's start (aware), if held
    window_ends: datetime | None = None  # periodic: when the open window closes, if allowed
    lock_held: bool | None = None  # fleet_lock: whether this host holds a reboot slot
    retry_after: float | None = None  # seconds until asking again can change the answer

    def to_json(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "nextWindow": self.next_window.isoformat() if self.next_window else None,
            "windowEnds": self.window_ends.isoformat() if self.window_ends else None,
            "lockHeld": self.lock_held,
        }


class Strategy(Protocol):
    name: str  # "immediate" | "periodic" | "fleet_lock"

    async def report_steady(self) -> bool:
        """The host runs a verified image and holds nothing: True once the strategy accepted
        it (fleet_lock: its slot released). The caller retries until True."""
        ...

    async def can_finalize(self) -> Decision:
        """Whether the staged update may be finalized (rebooted into) now."""
        ...

    def describe(self) -> dict[str, Any]:
        """The strategy's configuration, for /status (never a credential)."""
        ...
