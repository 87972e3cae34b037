"""The `periodic` strategy: finalize only inside weekly maintenance windows, as Zincati's
(`[updates.periodic]`). The window arithmetic is `agent.core.windows`; this module adds the
clock and the one file it reads, /etc/localtime."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from agent.core.windows import Schedule, parse_windows, refuse_unknown_keys, zone_key_from_path
from agent.errors import InputError
from agent.strategy.base import Decision

TABLE = "updates.periodic"
TIME_ZONE_FIELD = f"{TABLE}.time_zone"
WINDOW_FIELD = f"{TABLE}.window"
LOCALTIME = Path("/etc/localtime")
_TABLE_KEYS = ("time_zone", "window")
# When no window opens within the schedule's horizon (every window fell into clock changes):
# ask again in an hour rather than never.
_FALLBACK_RETRY = 3600.0


def utc_now() -> datetime:
    return datetime.now(UTC)


class PeriodicStrategy:
    """Allows the reboot while the wall clock of the schedule's zone reads inside a window."""

    name = "periodic"

    def __init__(self, schedule: Schedule, clock: Callable[[], datetime] = utc_now) -> None:
        self.schedule = schedule
        self._clock = clock  # injectable: tests pin "now"

    @classmethod
    def from_config(cls, table: Mapping[str, Any], *, clock: Callable[[], datetime] = utc_now,
                    localtime: Path = LOCALTIME) -> PeriodicStrategy:  # fmt: skip
        """From the parsed `[updates.periodic]` table: `{"time_zone": ..., "window": [...]}`,
        fragments already merged (windows concatenated, the last time_zone wins)."""
        refuse_unknown_keys(table, _TABLE_KEYS, TABLE)
        if "window" not in table:
            raise InputError("periodic strategy needs at least one window", field=WINDOW_FIELD)
        windows = parse_windows(table["window"], WINDOW_FIELD)
        zone = load_time_zone(table.get("time_zone", "UTC"), localtime)
        return cls(Schedule(windows, zone), clock)

    async def report_steady(self) -> bool:
        return True  # windows gate the reboot only; nothing is held afterwards

    async def can_finalize(self) -> Decision:
        now = self._clock()
        window = self.schedule.contains(now)
        if window is not None:
            ends = self.schedule.current_end(now)
            return Decision(True, f"inside the maintenance window {window.describe()}",
                            window_ends=ends, retry_after=_seconds(now, ends))  # fmt: skip
        opens = self.schedule.next_start(now)
        if opens is None:
            return Decision(False, "outside the maintenance windows; none opens in the next "
                            "three weeks", retry_after=_FALLBACK_RETRY)  # fmt: skip
        return Decision(False, f"outside the maintenance windows; the next opens "
                        f"{opens.isoformat()}", next_window=opens,
                        retry_after=_seconds(now, opens))  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "timeZone": self.schedule.zone_name,
            "windows": self.schedule.describe(),
            "totalMinutes": self.schedule.total_minutes(),
        }


def load_time_zone(name: str, localtime: Path = LOCALTIME) -> tzinfo:
    """The zone of `updates.periodic.time_zone`: "UTC" (the default), "localtime" (the
    system's, from `localtime`), or an IANA name such as "Europe/Berlin"."""
    if not isinstance(name, str):
        raise InputError("expected a string", field=TIME_ZONE_FIELD)
    if name == "UTC":
        return UTC  # needs no tz database
    if name == "localtime":
        return _system_zone(localtime)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a directory such as "America"; ValueError: an absolute or "../" path.
        raise InputError(f"unknown time zone {name[:60]!r} (expected \"UTC\", \"localtime\" "
                         "or an IANA name such as \"Europe/Berlin\")",
                         field=TIME_ZONE_FIELD) from None  # fmt: skip


def _system_zone(localtime: Path) -> tzinfo:
    """/etc/localtime as systemd keeps it: a link into a zoneinfo directory (its name is the
    zone's), absent (UTC), or, on hand-made systems, a copied zone file."""
    if localtime.is_symlink():
        target = localtime.resolve()  # follows chains of links, as Zincati's canonicalize()
        key = zone_key_from_path(str(target))
        if key is None:
            raise InputError(f"{localtime} links to {target}, outside any zoneinfo directory",
                             field=TIME_ZONE_FIELD)  # fmt: skip
        return _zone_file(target, key)
    if not localtime.exists():
        return UTC
    return _zone_file(localtime, "localtime")


def _zone_file(path: Path, key: str) -> tzinfo:
    try:
        with path.open("rb") as file:
            return ZoneInfo.from_file(file, key=key)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the time zone file {path} ({type(exc).__name__})",
                         field=TIME_ZONE_FIELD) from None  # fmt: skip


def _seconds(now: datetime, then: datetime | None) -> float | None:
    # Both in UTC: two datetimes sharing a ZoneInfo subtract as wall-clock readings.
    if then is None:
        return None
    return max(0.0, (then.astimezone(UTC) - now.astimezone(UTC)).total_seconds())
