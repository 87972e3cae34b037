"""Weekly maintenance windows (agent/core/windows.py): parsing Zincati's
`[[updates.periodic.window]]` tables, and the arithmetic on the wall clock across week ends,
overlaps and DST changes.

Reference week in UTC: Monday 2024-01-01 .. Sunday 2024-01-07. DST dates of 2024:
America/New_York springs forward Sun 03-10 02:00 EST (07:00Z) and falls back Sun 11-03 02:00 EDT
(06:00Z); Europe/Berlin springs forward Sun 03-31 02:00 CET (01:00Z) and falls back Sun 10-27
03:00 CEST (01:00Z)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.core.windows import (
    MINUTES_PER_WEEK,
    Schedule,
    Window,
    parse_windows,
    zone_key_from_path,
)
from agent.errors import InputError

TICK = timedelta(microseconds=1)
NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")


def entry(days: list[str], start: str, length: int) -> dict[str, Any]:
    return {"days": days, "start_time": start, "length_minutes": length}


def schedule(*entries: dict[str, Any], tz: Any = UTC) -> Schedule:
    return Schedule(parse_windows(list(entries), "updates.periodic.window"), tz)


def at(text: str) -> datetime:
    """An aware instant from ISO text; a bare time means UTC."""
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def minutes_inside(sched: Schedule, start: datetime, hours: int = 24) -> int:
    """Minutes the schedule is open, counted on the UTC minutes of the span (every boundary in
    these zones falls on a whole UTC minute)."""
    begin = start.astimezone(UTC)
    return sum(sched.contains(begin + timedelta(minutes=m)) is not None
               for m in range(hours * 60))  # fmt: skip


# Sat and Sun 23:30 for an hour (both cross midnight, Sunday's crosses the week end), and Wed.
WEEKEND = schedule(entry(["Sat", "Sun"], "23:30", 60), entry(["Wed"], "01:00", 30))


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("days", "start", "length", "expected"),
    [
        (["Mon"], "00:00", 1, [Window(0, 1)]),
        (["Sun"], "23:30", 60, [Window(6 * 1440 + 1410, 60)]),
        (
            ["sat", "SUNDAY"],
            "23:30",
            60,
            [Window(5 * 1440 + 1410, 60), Window(6 * 1440 + 1410, 60)],
        ),
        (["Wednesday"], "7:5", 30, [Window(2 * 1440 + 425, 30)]),  # Zincati reads "7:5" as 07:05
        (["Tue", "Tuesday", "tue"], "12:00", 15, [Window(1440 + 720, 15)]),  # one window, not 3
        (["Thu"], "23:59", MINUTES_PER_WEEK, [Window(3 * 1440 + 1439, MINUTES_PER_WEEK)]),
        (["Fri"], "09:00", 10, [Window(4 * 1440 + 540, 10)]),
    ],
)
def test_parse_gives_one_window_per_day(days, start, length, expected) -> None:
    assert list(parse_windows([entry(days, start, length)], "w")) == expected


def test_parse_concatenates_entries_from_several_fragments() -> None:
    windows = parse_windows([entry(["Sat"], "23:30", 60), entry(["Wed"], "01:00", 30)], "w")
    assert windows == (Window(5 * 1440 + 1410, 60), Window(2 * 1440 + 60, 30))


GOOD = entry(["Sat"], "23:30", 60)


@pytest.mark.parametrize(
    ("entries", "field", "message"),
    [
        ({"days": ["Sat"]}, "w", "expected an array of tables"),
        ([], "w", "periodic strategy needs at least one window"),
        (["Sat"], "w[0]", "expected a table"),
        ([{"start_time": "01:00", "length_minutes": 5}], "w[0].days", "missing"),
        ([{"days": ["Sat"], "length_minutes": 5}], "w[0].start_time", "missing"),
        ([{"days": ["Sat"], "start_time": "01:00"}], "w[0].length_minutes", "missing"),
        ([GOOD, {**GOOD, "lenght_minutes": 5}], "w[1].lenght_minutes", "unknown key"),
        ([{**GOOD, "days": "Sat"}], "w[0].days", "expected an array of weekday names"),
        ([{**GOOD, "days": []}], "w[0].days", "at least one day is needed"),
        ([{**GOOD, "days": ["Sat", "Funday"]}], "w[0].days[1]", "unknown weekday 'Funday'"),
        ([{**GOOD, "days": ["Sa"]}], "w[0].days[0]", "unknown weekday 'Sa'"),
        ([{**GOOD, "days": [6]}], "w[0].days[0]", "unknown weekday 6"),
        ([{**GOOD, "start_time": "25:00"}], "w[0].start_time", "no such time of day: 25:00"),
        ([{**GOOD, "start_time": "24:00"}], "w[0].start_time", "no such time of day"),
        ([{**GOOD, "start_time": "23:60"}], "w[0].start_time", "no such time of day"),
        ([{**GOOD, "start_time": "0700"}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": "07:00:00"}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": "-1:00"}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": "+7:00"}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": "007:00"}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": "\u0667:00"}], "w[0].start_time", "expected hh:mm"),  # Arabic 7
        ([{**GOOD, "start_time": ""}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "start_time": 700}], "w[0].start_time", "expected hh:mm"),
        ([{**GOOD, "length_minutes": 0}], "w[0].length_minutes", "must be positive, got 0"),
        ([{**GOOD, "length_minutes": -5}], "w[0].length_minutes", "must be positive, got -5"),
        ([{**GOOD, "length_minutes": 1.5}], "w[0].length_minutes", "expected a whole number"),
        ([{**GOOD, "length_minutes": 60.0}], "w[0].length_minutes", "expected a whole number"),
        ([{**GOOD, "length_minutes": True}], "w[0].length_minutes", "expected a whole number"),
        ([{**GOOD, "length_minutes": "60"}], "w[0].length_minutes", "expected a whole number"),
        ([{**GOOD, "length_minutes": 10081}], "w[0].length_minutes", "longer than a week"),
    ],
)
def test_parse_errors_name_the_entry_and_key(entries, field, message) -> None:
    with pytest.raises(InputError) as caught:
        parse_windows(entries, "w")
    assert caught.value.field == field
    assert message in caught.value.message
    assert str(caught.value).startswith(f"{field}: ")


def test_a_huge_bad_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(InputError) as caught:
        parse_windows([{**GOOD, "days": ["x" * 10_000]}], "w")
    assert len(caught.value.message) < 120


@pytest.mark.parametrize(("start", "length"), [(-1, 5), (MINUTES_PER_WEEK, 5), (0, 0), (0, 10081)])
def test_window_refuses_impossible_values(start, length) -> None:
    with pytest.raises(ValueError):
        Window(start, length)


def test_schedule_refuses_no_windows() -> None:
    with pytest.raises(ValueError, match="at least one window"):
        Schedule((), UTC)


def test_describe_lists_windows_by_start_in_the_week() -> None:
    assert WEEKEND.describe() == ["Wed 01:00 (30 min)", "Sat 23:30 (60 min)", "Sun 23:30 (60 min)"]
    assert WEEKEND.zone_name == "UTC"
    assert schedule(GOOD, tz=BERLIN).zone_name == "Europe/Berlin"


@pytest.mark.parametrize(
    ("target", "key"),
    [
        ("/usr/share/zoneinfo/Europe/Berlin", "Europe/Berlin"),
        ("/usr/share/zoneinfo/UTC", "UTC"),
        ("/usr/share/zoneinfo/posix/Asia/Tokyo", "posix/Asia/Tokyo"),
        ("/nix/store/abc-tzdata/share/zoneinfo/America/New_York", "America/New_York"),
        ("/usr/share/zoneinfo/", None),
        ("/opt/zones/Europe/Berlin", None),
        ("/etc/localtime", None),
    ],
)
def test_zone_key_from_a_resolved_localtime_link(target, key) -> None:
    assert zone_key_from_path(target) == key


# -- contains, next_start, current_end in UTC ------------------------------------------------


@pytest.mark.parametrize(
    ("now", "inside"),
    [
        ("2024-01-06T23:30", "Sat 23:30 (60 min)"),  # the exact start is inside
        ("2024-01-06T23:29:59.999999", None),
        ("2024-01-07T00:29:59", "Sat 23:30 (60 min)"),  # across midnight
        ("2024-01-07T00:30", None),  # the exact end is outside
        ("2024-01-07T23:45", "Sun 23:30 (60 min)"),
        ("2024-01-08T00:15", "Sun 23:30 (60 min)"),  # across the week end, into Monday
        ("2024-01-01T00:29", "Sun 23:30 (60 min)"),  # Monday morning of any week
        ("2024-01-08T00:30", None),
        ("2024-01-03T01:00", "Wed 01:00 (30 min)"),
        ("2024-01-03T01:30", None),
        ("2024-01-03T02:15+01:00", "Wed 01:00 (30 min)"),  # any offset: the instant counts
        ("2024-01-04T12:00", None),
    ],
)
def test_contains(now, inside) -> None:
    found = WEEKEND.contains(at(now))
    assert (found.describe() if found else None) == inside


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("2024-01-01T12:00", "2024-01-03T01:00"),  # outside
        ("2024-01-03T00:59:59.999999", "2024-01-03T01:00"),  # just before
        ("2024-01-03T01:00", "2024-01-06T23:30"),  # at a start: the following one
        ("2024-01-03T01:15", "2024-01-06T23:30"),  # inside: the next opening after this
        ("2024-01-03T01:30", "2024-01-06T23:30"),  # just after
        ("2024-01-06T23:45", "2024-01-07T23:30"),
        ("2024-01-07T23:45", "2024-01-10T01:00"),  # inside across the week end
        ("2024-01-08T00:30", "2024-01-10T01:00"),
    ],
)
def test_next_start(now, expected) -> None:
    assert WEEKEND.next_start(at(now)) == at(expected)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("2024-01-06T23:30", "2024-01-07T00:30"),
        ("2024-01-07T23:59", "2024-01-08T00:30"),
        ("2024-01-03T01:29:59", "2024-01-03T01:30"),
        ("2024-01-03T01:30", None),  # outside
        ("2024-01-04T12:00", None),
    ],
)
def test_current_end(now, expected) -> None:
    end = WEEKEND.current_end(at(now))
    assert end == (at(expected) if expected else None)


def test_results_are_in_the_schedules_zone() -> None:
    opens = schedule(GOOD, tz=BERLIN).next_start(at("2024-01-01T00:00"))
    assert opens is not None
    assert opens.isoformat() == "2024-01-06T23:30:00+01:00"


def test_touching_windows_are_one_opening() -> None:
    touching = schedule(entry(["Mon"], "01:00", 60), entry(["Mon"], "02:00", 60))
    assert touching.current_end(at("2024-01-01T01:30")) == at("2024-01-01T03:00")
    # 02:00 is no entry: the clock was already inside.
    assert touching.next_start(at("2024-01-01T01:30")) == at("2024-01-08T01:00")


def test_overlapping_windows_count_as_their_union() -> None:
    overlapping = schedule(entry(["Mon"], "01:00", 120), entry(["Mon"], "02:00", 30))
    assert overlapping.contains(at("2024-01-01T02:15")) is not None
    assert overlapping.current_end(at("2024-01-01T02:15")) == at("2024-01-01T03:00")
    assert overlapping.next_start(at("2024-01-01T00:00")) == at("2024-01-01T01:00")
    assert overlapping.next_start(at("2024-01-01T01:30")) == at("2024-01-08T01:00")


def test_a_whole_week_never_opens_or_closes() -> None:
    always = schedule(entry(["Thu"], "12:00", MINUTES_PER_WEEK), GOOD)
    now = at("2024-01-04T12:00")
    assert always.contains(now) is not None
    assert always.contains(now - TICK) is not None
    assert always.next_start(now) is None
    assert always.current_end(now) is None


@pytest.mark.parametrize(
    ("entries", "total"),
    [
        ([entry(["Sat"], "23:30", 60)], 60),
        ([entry(["Sat", "Sun"], "23:30", 60), entry(["Wed"], "01:00", 30)], 150),
        ([entry(["Sat", "Saturday"], "23:30", 60)], 60),
        ([entry(["Mon"], "01:00", 120), entry(["Mon"], "02:00", 30)], 120),  # one inside other
        ([entry(["Mon"], "01:00", 60), entry(["Mon"], "01:30", 60)], 90),  # partly overlapping
        ([entry(["Mon"], "01:00", 60), entry(["Mon"], "02:00", 60)], 120),  # touching
        ([entry(["Sun"], "23:00", 120), entry(["Mon"], "00:30", 60)], 150),  # across week end
        ([entry(["Sun"], "00:00", MINUTES_PER_WEEK), GOOD], MINUTES_PER_WEEK),
    ],
)
def test_total_minutes_counts_the_union(entries, total) -> None:
    assert schedule(*entries).total_minutes() == total


# -- daylight saving time --------------------------------------------------------------------


def test_new_york_an_ordinary_sunday_has_the_full_window() -> None:
    sched = schedule(entry(["Sun"], "01:30", 60), tz=NEW_YORK)
    assert minutes_inside(sched, at("2024-03-03T00:00-05:00")) == 60
    assert sched.total_minutes() == 60  # the weekly figure is as written


def test_new_york_spring_forward_shortens_the_window() -> None:
    sched = schedule(entry(["Sun"], "01:30", 60), tz=NEW_YORK)
    assert sched.next_start(at("2024-03-09T12:00-05:00")) == at("2024-03-10T01:30-05:00")
    assert sched.contains(at("2024-03-10T01:59:59-05:00")) is not None
    # 01:59:59 EST is followed by 03:00 EDT: 02:00-02:30 never shows on the clock.
    assert sched.contains(at("2024-03-10T03:00-04:00")) is None
    assert sched.current_end(at("2024-03-10T01:45-05:00")) == at("2024-03-10T03:00-04:00")
    assert minutes_inside(sched, at("2024-03-10T00:00-05:00")) == 30


def test_new_york_a_window_wholly_in_the_spring_gap_is_skipped() -> None:
    sched = schedule(entry(["Sun"], "02:10", 30), tz=NEW_YORK)
    assert minutes_inside(sched, at("2024-03-10T00:00-05:00")) == 0
    assert sched.next_start(at("2024-03-09T12:00-05:00")) == at("2024-03-17T02:10-04:00")


def test_new_york_a_window_starting_in_the_gap_opens_at_its_end() -> None:
    sched = schedule(entry(["Sun"], "02:30", 60), tz=NEW_YORK)
    opens = sched.next_start(at("2024-03-09T12:00-05:00"))
    assert opens == at("2024-03-10T03:00-04:00")
    assert sched.current_end(opens) == at("2024-03-10T03:30-04:00")
    assert minutes_inside(sched, at("2024-03-10T00:00-05:00")) == 30


def test_new_york_fall_back_lengthens_the_window_in_two_stretches() -> None:
    sched = schedule(entry(["Sun"], "01:30", 60), tz=NEW_YORK)
    first = sched.next_start(at("2024-11-03T00:00-04:00"))
    assert first == at("2024-11-03T01:30-04:00")
    # At 02:00 EDT the clock reads 01:00 EST: outside until it reads 01:30 again.
    assert sched.current_end(first) == at("2024-11-03T06:00Z")
    assert sched.contains(at("2024-11-03T01:15-05:00")) is None
    second = sched.next_start(first)
    assert second == at("2024-11-03T01:30-05:00")
    assert sched.current_end(second) == at("2024-11-03T02:30-05:00")
    assert minutes_inside(sched, at("2024-11-03T00:00-04:00")) == 90


def test_new_york_fall_back_reenters_at_the_clock_change() -> None:
    # 00:45-01:30: the jump back to 01:00 EST lands inside the window again.
    sched = schedule(entry(["Sun"], "00:45", 45), tz=NEW_YORK)
    assert sched.current_end(at("2024-11-03T01:00-04:00")) == at("2024-11-03T01:30-04:00")
    assert sched.next_start(at("2024-11-03T01:40-04:00")) == at("2024-11-03T06:00Z")
    assert sched.current_end(at("2024-11-03T06:00Z")) == at("2024-11-03T01:30-05:00")
    assert minutes_inside(sched, at("2024-11-03T00:00-04:00")) == 75


def test_berlin_a_window_wholly_in_the_spring_gap_is_skipped() -> None:
    sched = schedule(entry(["Sun"], "02:00", 60), tz=BERLIN)
    assert minutes_inside(sched, at("2024-03-31T00:00+01:00")) == 0
    assert sched.next_start(at("2024-03-30T12:00+01:00")) == at("2024-04-07T02:00+02:00")


def test_berlin_spring_forward_shortens_and_delays() -> None:
    before_gap = schedule(entry(["Sun"], "01:30", 60), tz=BERLIN)
    assert before_gap.current_end(at("2024-03-31T01:45+01:00")) == at("2024-03-31T03:00+02:00")
    assert minutes_inside(before_gap, at("2024-03-31T00:00+01:00")) == 30
    across_gap = schedule(entry(["Sun"], "02:30", 60), tz=BERLIN)
    assert across_gap.next_start(at("2024-03-31T00:00+01:00")) == at("2024-03-31T03:00+02:00")
    assert minutes_inside(across_gap, at("2024-03-31T00:00+01:00")) == 30


def test_berlin_fall_back_keeps_a_window_open_across_the_repeated_hour() -> None:
    # 02:00-03:00 on a day that reads 02:00-02:59 twice: 120 minutes without a break.
    sched = schedule(entry(["Sun"], "02:00", 60), tz=BERLIN)
    assert sched.next_start(at("2024-10-26T12:00+02:00")) == at("2024-10-27T02:00+02:00")
    assert sched.contains(at("2024-10-27T02:59:59+02:00")) is not None
    assert sched.contains(at("2024-10-27T02:00+01:00")) is not None
    assert sched.current_end(at("2024-10-27T02:30+02:00")) == at("2024-10-27T03:00+01:00")
    assert sched.next_start(at("2024-10-27T02:30+02:00")) == at("2024-11-03T02:00+01:00")
    assert minutes_inside(sched, at("2024-10-27T00:00+02:00")) == 120


def test_berlin_fall_back_splits_a_window_starting_inside_the_repeated_hour() -> None:
    sched = schedule(entry(["Sun"], "02:30", 60), tz=BERLIN)
    assert sched.current_end(at("2024-10-27T02:30+02:00")) == at("2024-10-27T01:00Z")
    assert sched.next_start(at("2024-10-27T02:30+02:00")) == at("2024-10-27T02:30+01:00")
    assert minutes_inside(sched, at("2024-10-27T00:00+02:00")) == 90


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        WEEKEND.contains(datetime(2024, 1, 1))


# -- properties -------------------------------------------------------------------------------

windows_st = st.lists(
    st.builds(Window, start=st.integers(0, MINUTES_PER_WEEK - 1), length=st.integers(1, 3000)),
    min_size=1,
    max_size=5,
)
instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)
)


def covered_minutes(windows: list[Window]) -> set[int]:
    return {(w.start + k) % MINUTES_PER_WEEK for w in windows for k in range(w.length)}


def minute_of_week(instant: datetime) -> int:
    return instant.weekday() * 1440 + instant.hour * 60 + instant.minute


def minute_starts(after: datetime, before: datetime) -> list[datetime]:
    """Whole UTC minutes in (after, before)."""
    first = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    count = int((before - first).total_seconds() // 60) + 1
    return [m for m in (first + timedelta(minutes=k) for k in range(count)) if m < before]


@given(windows_st, instants)
def test_contains_agrees_with_counting_minutes(windows, now) -> None:
    sched = Schedule(tuple(windows), UTC)
    assert (sched.contains(now) is not None) == (minute_of_week(now) in covered_minutes(windows))
    assert sched.total_minutes() == len(covered_minutes(windows))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(windows_st, instants)
def test_next_start_is_the_first_entry_after_now(windows, now) -> None:
    covered = covered_minutes(windows)
    assume(len(covered) < MINUTES_PER_WEEK)
    sched = Schedule(tuple(windows), UTC)
    opens = sched.next_start(now)
    assert opens is not None
    assert now < opens <= now + timedelta(days=8)
    assert sched.contains(opens) is not None
    assert sched.contains(opens - TICK) is None
    for minute in minute_starts(now, opens):
        here = minute_of_week(minute)
        assert not (here in covered and (here - 1) % MINUTES_PER_WEEK not in covered)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(windows_st, instants)
def test_current_end_is_where_the_clock_leaves(windows, now) -> None:
    covered = covered_minutes(windows)
    assume(len(covered) < MINUTES_PER_WEEK)
    sched = Schedule(tuple(windows), UTC)
    end = sched.current_end(now)
    if sched.contains(now) is None:
        assert end is None
        return
    assert end is not None
    assert now < end <= now + timedelta(days=8)
    assert sched.contains(end) is None
    assert sched.contains(end - TICK) is not None
    assert all(minute_of_week(m) in covered for m in minute_starts(now, end))


# Windows near early Sunday, where every one of these zones changes its clocks, and instants in
# the weeks around the 2024 changes (March/April and October/November).
sunday_night_windows = st.lists(
    st.builds(Window, start=st.integers(6 * 1440, 6 * 1440 + 240), length=st.integers(1, 240)),
    min_size=1,
    max_size=3,
)
near_clock_changes = st.one_of(
    st.datetimes(min_value=datetime(2024, 3, 1), max_value=datetime(2024, 4, 10),
                 timezones=st.just(UTC)),
    st.datetimes(min_value=datetime(2024, 9, 25), max_value=datetime(2024, 11, 5),
                 timezones=st.just(UTC)),
)  # fmt: skip


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.one_of(windows_st, sunday_night_windows),
    near_clock_changes,
    st.sampled_from(["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"]),
)
def test_in_zones_with_clock_changes_next_start_is_the_first_entry(windows, now, zone) -> None:
    # Lord Howe shifts by 30 minutes, Kolkata is a half-hour offset without DST.
    assume(len(covered_minutes(windows)) < MINUTES_PER_WEEK)
    sched = Schedule(tuple(windows), ZoneInfo(zone))
    opens = sched.next_start(now)
    assert opens is not None
    assert now < opens <= now + timedelta(days=15)
    assert sched.contains(opens) is not None
    assert sched.contains(opens - TICK) is None
    for minute in minute_starts(now, opens):  # every entry in these zones is on a UTC minute
        assert not (sched.contains(minute) and sched.contains(minute - TICK) is None)
    end = sched.current_end(opens)
    assert end is not None
    assert opens < end
    assert sched.contains(end) is None
    assert sched.contains(end - TICK) is not None
