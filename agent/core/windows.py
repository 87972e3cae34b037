"""Weekly maintenance windows for the `periodic` strategy, as Zincati's
`[[updates.periodic.window]]` (pure: instants and time zones come in as arguments).

A window is a wall-clock span that recurs every week: a start (minute of the week, Monday 00:00
is 0) and a length in minutes. It may cross day and week boundaries (Sun 23:30 for 60 minutes
runs to Mon 00:30); windows may overlap, and what counts is their union.

Time zones and daylight saving time. All windows share one zone, and "reboot window clock times
are always obeyed": an instant is inside the schedule when the local wall clock *reads* a time
inside a window at that instant. Nothing else is added or removed, so on the days the clocks
change a window may be longer, shorter, split or skipped. With America/New_York (clocks go
02:00 EST -> 03:00 EDT in spring, 02:00 EDT -> 01:00 EST in autumn) and Sun 01:30 for 60 min:

* an ordinary Sunday: 01:30-02:30, 60 minutes;
* spring-forward day: 02:00-02:59 never appears on the clock, so only 01:30-02:00 EST, 30 min;
  a window lying wholly in the gap (Sun 02:10 for 30 min) does not happen that week, and one
  that starts in the gap but outlasts it (Sun 02:30 for 60 min) opens when the clock jumps to
  03:00 EDT and closes at 03:30 EDT;
* fall-back day: 01:00-01:59 is read twice. The clock reads 01:30-02:00 EDT (inside), jumps
  back to 01:00 EST, reads 01:00-01:30 EST (outside), then 01:30-02:30 EST (inside): 90 minutes
  in two stretches. A window that covers the repeated hour's end and start (Europe/Berlin
  Sun 02:00 for 60 min, where 02:00-02:59 repeats) stays open across the jump, 120 minutes.

So `next_start` is the next instant at which the clock goes from outside to inside: a window
start read on the clock, or a clock change that lands inside (the gap's end, or the repeated
hour's first minute). Instants come back with the zone's offset at that moment as a fixed
offset. Zone transitions are found by probing the UTC offset hourly, which only a pair of
changes less than an hour apart could hide."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from functools import cached_property
from itertools import pairwise
from typing import Any

from agent.errors import InputError

MINUTES_PER_WEEK = 7 * 24 * 60
WEEK = timedelta(weeks=1)
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
# Zincati (src/weekly/utils.rs) accepts the C-locale names in any case, full or first three
# letters. (Its full Tuesday is misspelt "tuesady"; the real word is accepted here.)
_DAY_NUMBERS = {
    **{name.lower(): number for number, name in enumerate(DAY_NAMES)},
    **{name: number for number, name in enumerate(("monday", "tuesday", "wednesday", "thursday",
                                                   "friday", "saturday", "sunday"))},
}  # fmt: skip
# Zincati splits on ":" and reads two small integers, so "7:5" is 07:05; signs and other
# digit systems are refused here (Rust's u8 parser would take "+7", nobody means that).
_CLOCK_TIME = re.compile(r"([0-9]{1,2}):([0-9]{1,2})")
_WINDOW_KEYS = ("days", "start_time", "length_minutes")

_PROBE = timedelta(hours=1)  # offset sampling step when looking for zone transitions
# Far enough to reach a weekly window even when a clock change swallowed this week's one.
_HORIZON = timedelta(weeks=3)
_TICK = timedelta(microseconds=1)  # "just before" an instant, at datetime's resolution


@dataclass(frozen=True, order=True)
class Window:
    """One weekly wall-clock span: `start` minutes after Monday 00:00, `length` minutes long."""

    start: int
    length: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < MINUTES_PER_WEEK:
            raise ValueError(f"window start {self.start} is not a minute of the week")
        if not 0 < self.length <= MINUTES_PER_WEEK:
            raise ValueError(f"window length {self.length} is not 1..{MINUTES_PER_WEEK}")

    def covers(self, position: timedelta) -> bool:
        """Whether a wall-clock position in the week (since Monday 00:00) lies inside; the
        start is inside, the end is not. Modular, so a window past Sunday wraps to Monday."""
        return (position - timedelta(minutes=self.start)) % WEEK < timedelta(minutes=self.length)

    def describe(self) -> str:
        day, minute = divmod(self.start, 24 * 60)
        return f"{DAY_NAMES[day]} {minute // 60:02d}:{minute % 60:02d} ({self.length} min)"


@dataclass(frozen=True)
class Schedule:
    """The union of some windows, read on the wall clock of one time zone."""

    windows: tuple[Window, ...]
    tz: tzinfo

    def __post_init__(self) -> None:
        if not self.windows:
            raise ValueError("a schedule needs at least one window")
        # Sorted and without repeats, so describe() and contains() are stable.
        object.__setattr__(self, "windows", tuple(sorted(set(self.windows))))

    @property
    def zone_name(self) -> str:
        return str(self.tz)  # a ZoneInfo's key ("Europe/Berlin"), or "UTC"

    def contains(self, now: datetime) -> Window | None:
        """The first window the wall clock reads inside at the aware instant `now`, if any."""
        position = _position(_wall(now, self.tz))
        return next((w for w in self.windows if w.covers(position)), None)

    def next_start(self, now: datetime) -> datetime | None:
        """The first instant after `now` at which the clock enters the schedule (from outside),
        shown in the zone's offset at that instant; None if that does not happen within three
        weeks (a schedule covering the whole week never opens: it is always open)."""
        after = _as_utc(now)
        for begin, end, offset in self._stretches(after):
            if begin > after and self._enters_at(begin):
                return self._local(begin)
            start = _next_boundary(_naive(begin) + offset, self._union_starts)
            if start is not None and start < _naive(end) + offset:
                return self._local((start - offset).replace(tzinfo=UTC))
        return None

    def current_end(self, now: datetime) -> datetime | None:
        """When the clock next leaves the schedule (in the zone's offset then), if `now` is
        inside; None when outside or when the schedule never closes (it covers the week)."""
        if self.contains(now) is None:
            return None
        after = _as_utc(now)
        for begin, end, offset in self._stretches(after):
            if begin > after and self.contains(begin) is None:
                return self._local(begin)  # a clock change jumped out of the window
            finish = _next_boundary(_naive(begin) + offset, self._union_ends)
            if finish is not None and finish < _naive(end) + offset:
                return self._local((finish - offset).replace(tzinfo=UTC))
        return None

    def total_minutes(self) -> int:
        """Minutes per week inside the union of the windows, as written (DST ignored): Zincati's
        `periodic_schedule_length_minutes`."""
        return sum(end - start for start, end in self._union)

    def describe(self) -> list[str]:
        return [window.describe() for window in self.windows]

    @cached_property
    def _union(self) -> list[tuple[int, int]]:
        """The windows merged into disjoint [start, end) minute ranges within one week; a
        window past Sunday's end is cut in two at the week boundary."""
        pieces = []
        for window in self.windows:
            end = window.start + window.length
            pieces.append((window.start, min(end, MINUTES_PER_WEEK)))
            if end > MINUTES_PER_WEEK:
                pieces.append((0, end - MINUTES_PER_WEEK))
        merged: list[tuple[int, int]] = []
        for start, end in sorted(pieces):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    @cached_property
    def _wraps(self) -> bool:
        # The union runs through Sunday 24:00 into Monday 00:00: no boundary there.
        return self._union[0][0] == 0 and self._union[-1][1] == MINUTES_PER_WEEK

    @cached_property
    def _union_starts(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self._union if not (self._wraps and s == 0))

    @cached_property
    def _union_ends(self) -> tuple[int, ...]:
        return tuple(e % MINUTES_PER_WEEK for _, e in self._union
                     if not (self._wraps and e == MINUTES_PER_WEEK))  # fmt: skip

    def _local(self, instant: datetime) -> datetime:
        """The instant as the zone's clock shows it, with that moment's offset fixed: a
        ZoneInfo-aware value inside a repeated hour is never == to the same instant in another
        zone, and subtracting two of them gives wall-clock, not elapsed, time."""
        offset = _offset(self.tz, instant)
        return _naive(instant + offset).replace(tzinfo=timezone(offset))

    def _enters_at(self, instant: datetime) -> bool:
        return self.contains(instant) is not None and self.contains(instant - _TICK) is None

    def _stretches(self, since: datetime) -> Iterator[tuple[datetime, datetime, timedelta]]:
        """[begin, end) UTC stretches from `since` over the horizon on which the zone's offset
        is constant, so the wall clock runs evenly: wall = UTC + offset."""
        until = since + _HORIZON
        cuts = [since, *_transitions(self.tz, since, until), until]
        for begin, end in pairwise(cuts):
            yield begin, end, _offset(self.tz, begin)


def parse_windows(entries: list[dict[str, Any]], where: str) -> tuple[Window, ...]:
    """The `[[updates.periodic.window]]` tables (`where` names them in errors), one window per
    listed day. Unknown keys are refused: a misspelt key would otherwise drop a window."""
    if not isinstance(entries, list):
        raise InputError("expected an array of tables ([[...]])", field=where)
    if not entries:
        raise InputError("periodic strategy needs at least one window", field=where)
    windows: list[Window] = []
    for index, entry in enumerate(entries):
        windows.extend(_parse_entry(entry, f"{where}[{index}]"))
    return tuple(dict.fromkeys(windows))  # "Sat" and "Saturday" are one window


def zone_key_from_path(target: str) -> str | None:
    """The zone name a resolved /etc/localtime link points at: the part after the last
    `zoneinfo` directory ("/usr/share/zoneinfo/Europe/Berlin" -> "Europe/Berlin")."""
    parts = [part for part in target.split("/") if part]
    if "zoneinfo" not in parts:
        return None
    rest = parts[len(parts) - parts[::-1].index("zoneinfo") :]
    return "/".join(rest) or None


def refuse_unknown_keys(table: Any, allowed: tuple[str, ...], where: str) -> None:
    """InputError unless `table` is a table whose keys are all `allowed` (a typo is refused,
    never ignored)."""
    if not isinstance(table, Mapping):
        raise InputError("expected a table", field=where)
    for key in table:
        if key not in allowed:
            raise InputError(f"unknown key (expected {', '.join(allowed)})",
                             field=f"{where}.{str(key)[:40]}")  # fmt: skip


def _parse_entry(entry: Any, where: str) -> list[Window]:
    refuse_unknown_keys(entry, _WINDOW_KEYS, where)
    for key in _WINDOW_KEYS:
        if key not in entry:
            raise InputError("missing", field=f"{where}.{key}")
    days = _parse_days(entry["days"], f"{where}.days")
    minute_of_day = _parse_start_time(entry["start_time"], f"{where}.start_time")
    length = _parse_length(entry["length_minutes"], f"{where}.length_minutes")
    return [Window(day * 24 * 60 + minute_of_day, length) for day in days]


def _parse_days(value: Any, where: str) -> list[int]:
    if not isinstance(value, list):
        raise InputError("expected an array of weekday names", field=where)
    if not value:
        raise InputError("at least one day is needed", field=where)
    days = []
    for index, name in enumerate(value):
        number = _DAY_NUMBERS.get(name.lower()) if isinstance(name, str) else None
        if number is None:
            raise InputError(f"unknown weekday {_shown(name)} (expected Mon..Sun or "
                             "Monday..Sunday)", field=f"{where}[{index}]")  # fmt: skip
        days.append(number)
    return days


def _parse_start_time(value: Any, where: str) -> int:
    match = _CLOCK_TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise InputError(f"expected hh:mm (24-hour clock), got {_shown(value)}", field=where)
    hour, minute = int(match[1]), int(match[2])
    if hour > 23 or minute > 59:
        raise InputError(f"no such time of day: {value}", field=where)
    return hour * 60 + minute


def _parse_length(value: Any, where: str) -> int:
    # bool is an int in Python; TOML's `true` is not a length.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"expected a whole number of minutes, got {_shown(value)}", field=where)
    if value <= 0:
        raise InputError(f"must be positive, got {value}", field=where)
    if value > MINUTES_PER_WEEK:
        raise InputError(f"longer than a week ({MINUTES_PER_WEEK} minutes)", field=where)
    return value


def _shown(value: Any) -> str:
    """A bad value for an error message, cut short: config is not secret but may be huge."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_utc(instant: datetime) -> datetime:
    # Arithmetic on a ZoneInfo-aware datetime is wall-clock arithmetic; in UTC it is elapsed time.
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError("an aware datetime is needed")
    return instant.astimezone(UTC)


def _naive(instant: datetime) -> datetime:
    return instant.replace(tzinfo=None)


def _wall(instant: datetime, tz: tzinfo) -> datetime:
    """What the clock in `tz` reads at the instant (fold dropped: a repeated reading is the
    same reading)."""
    return _naive(_as_utc(instant).astimezone(tz))


def _position(wall: datetime) -> timedelta:
    """A wall-clock reading as time since its week's Monday 00:00."""
    midnight = wall.replace(hour=0, minute=0, second=0, microsecond=0)
    return timedelta(days=wall.weekday()) + (wall - midnight)


def _next_boundary(wall: datetime, boundaries: Sequence[int]) -> datetime | None:
    """The first wall-clock reading strictly after `wall` at one of the weekly minutes."""
    if not boundaries:
        return None
    position = _position(wall)
    ahead = min((timedelta(minutes=b) - position) % WEEK or WEEK for b in boundaries)
    return wall + ahead


def _offset(tz: tzinfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None  # astimezone into a tzinfo always yields an aware datetime
    return offset


def _transitions(tz: tzinfo, since: datetime, until: datetime) -> list[datetime]:
    """Instants in (since, until) at which the zone's UTC offset changes."""
    found = []
    probe = since.replace(microsecond=0)  # transitions fall on whole seconds
    before = _offset(tz, probe)
    while probe < until:
        following = probe + _PROBE
        after = _offset(tz, following)
        if after != before:
            found.append(_bisect(tz, probe, following, before))
        probe, before = following, after
    return [instant for instant in found if since < instant < until]


def _bisect(tz: tzinfo, low: datetime, high: datetime, old: timedelta) -> datetime:
    """The first whole second in (low, high] whose offset is no longer `old`."""
    while high - low > timedelta(seconds=1):
        middle = low + timedelta(seconds=int((high - low).total_seconds()) // 2)
        if _offset(tz, middle) == old:
            low = middle
        else:
            high = middle
    return high
