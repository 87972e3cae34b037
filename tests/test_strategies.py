"""The `immediate` and `periodic` reboot strategies, with a pinned clock, and how the periodic
strategy finds its time zone (UTC, an IANA name, or the system's /etc/localtime)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from agent.errors import InputError
from agent.strategy.base import Decision, Strategy
from agent.strategy.immediate import ImmediateStrategy
from agent.strategy.periodic import PeriodicStrategy, load_time_zone, utc_now

ZONEINFO = Path("/usr/share/zoneinfo")
needs_zoneinfo = pytest.mark.skipif(
    not (ZONEINFO / "America/New_York").exists(), reason="no system time zone database"
)

# Sat and Sun 23:30 for an hour, in Berlin (UTC+1 in January): Sat 2024-01-06 22:30Z.
TABLE: dict[str, Any] = {
    "time_zone": "Europe/Berlin",
    "window": [{"days": ["Sat", "Sun"], "start_time": "23:30", "length_minutes": 60}],
}


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: str) -> None:
        self.now = datetime.fromisoformat(now)

    def __call__(self) -> datetime:
        return self.now


def periodic(now: str, table: dict[str, Any] = TABLE) -> PeriodicStrategy:
    return PeriodicStrategy.from_config(table, clock=Clock(now))


# -- immediate --------------------------------------------------------------------------------


async def test_immediate_always_allows_and_is_steady() -> None:
    strategy: Strategy = ImmediateStrategy()
    assert strategy.name == "immediate"
    assert await strategy.report_steady() is True
    decision = await strategy.can_finalize()
    assert decision == Decision(True, "immediate strategy: reboot as soon as staged")
    assert decision.next_window is None and decision.retry_after is None
    assert strategy.describe() == {"strategy": "immediate"}


# -- periodic ---------------------------------------------------------------------------------


async def test_periodic_holds_outside_and_names_the_next_window() -> None:
    strategy: Strategy = periodic("2024-01-06T12:00:00+00:00")
    decision = await strategy.can_finalize()
    assert not decision.allowed
    assert decision.next_window == datetime(2024, 1, 6, 22, 30, tzinfo=UTC)
    assert decision.retry_after == 10.5 * 3600
    assert decision.window_ends is None
    assert decision.reason == (
        "outside the maintenance windows; the next opens 2024-01-06T23:30:00+01:00"
    )
    assert decision.to_json()["nextWindow"] == "2024-01-06T23:30:00+01:00"


async def test_periodic_allows_inside_and_says_when_the_window_ends() -> None:
    strategy = periodic("2024-01-06T22:45:00+00:00")
    decision = await strategy.can_finalize()
    assert decision.allowed
    assert decision.reason == "inside the maintenance window Sat 23:30 (60 min)"
    assert decision.window_ends == datetime(2024, 1, 6, 23, 30, tzinfo=UTC)
    assert decision.retry_after == 45 * 60
    assert decision.next_window is None
    assert decision.to_json()["windowEnds"] == "2024-01-07T00:30:00+01:00"


async def test_periodic_follows_the_clock_across_a_window() -> None:
    clock = Clock("2024-01-06T22:29:59+00:00")
    strategy = PeriodicStrategy.from_config(TABLE, clock=clock)
    assert not (await strategy.can_finalize()).allowed
    clock.now += timedelta(seconds=1)  # the exact start is inside
    assert (await strategy.can_finalize()).allowed
    clock.now += timedelta(minutes=60)  # the exact end is outside
    held = await strategy.can_finalize()
    assert not held.allowed
    assert held.next_window == datetime(2024, 1, 7, 22, 30, tzinfo=UTC)  # Sunday's window


async def test_periodic_retry_after_is_elapsed_time_across_a_clock_change() -> None:
    # A clock in Berlin time, Sun 2024-03-31 00:45 CET: Sunday's window opens at 23:30 CEST,
    # 22.75 hours later on the wall clock but 21.75 hours later in fact (03:00 came at 02:00).
    berlin = ZoneInfo("Europe/Berlin")
    strategy = PeriodicStrategy.from_config(
        TABLE, clock=lambda: datetime(2024, 3, 31, 0, 45, tzinfo=berlin)
    )
    held = await strategy.can_finalize()
    assert held.next_window == datetime(2024, 3, 31, 21, 30, tzinfo=UTC)
    assert held.retry_after == 21.75 * 3600
    assert held.reason.endswith("the next opens 2024-03-31T23:30:00+02:00")


async def test_periodic_report_steady_and_describe() -> None:
    strategy = periodic("2024-01-01T00:00:00+00:00")
    assert await strategy.report_steady() is True
    assert strategy.name == "periodic"
    assert strategy.describe() == {
        "strategy": "periodic",
        "timeZone": "Europe/Berlin",
        "windows": ["Sat 23:30 (60 min)", "Sun 23:30 (60 min)"],
        "totalMinutes": 120,
    }


async def test_periodic_defaults_to_utc_and_the_real_clock() -> None:
    strategy = PeriodicStrategy.from_config({"window": TABLE["window"]})
    assert strategy.describe()["timeZone"] == "UTC"
    decision = await strategy.can_finalize()  # whatever the day, an answer with a reason
    assert decision.reason
    assert decision.allowed == (decision.window_ends is not None)
    now = utc_now()
    assert now.utcoffset() == timedelta(0)
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ({"time_zone": "UTC"}, "updates.periodic.window", "needs at least one window"),
        ({"window": []}, "updates.periodic.window", "needs at least one window"),
        ({**TABLE, "windows": []}, "updates.periodic.windows", "unknown key"),
        ({**TABLE, "time_zone": "Mars/Olympus"}, "updates.periodic.time_zone", "unknown time zone"),
        ({**TABLE, "time_zone": 5}, "updates.periodic.time_zone", "expected a string"),
        ({"window": [{"days": ["Sat"]}]}, "updates.periodic.window[0].start_time", "missing"),
        (["window"], "updates.periodic", "expected a table"),
    ],
)
def test_periodic_config_errors_name_the_field(table, field, message) -> None:
    with pytest.raises(InputError) as caught:
        PeriodicStrategy.from_config(table)
    assert caught.value.field == field
    assert message in caught.value.message


# -- load_time_zone ---------------------------------------------------------------------------

WINTER = datetime(2024, 1, 15, 12, tzinfo=UTC)
SUMMER = datetime(2024, 7, 15, 12, tzinfo=UTC)


def offsets(zone: Any) -> tuple[timedelta, timedelta]:
    return WINTER.astimezone(zone).utcoffset(), SUMMER.astimezone(zone).utcoffset()


def test_utc_needs_no_database(tmp_path: Path) -> None:
    zone = load_time_zone("UTC", tmp_path / "unused")
    assert str(zone) == "UTC"
    assert offsets(zone) == (timedelta(0), timedelta(0))


def test_an_iana_name() -> None:
    zone = load_time_zone("Europe/Berlin")
    assert str(zone) == "Europe/Berlin"
    assert offsets(zone) == (timedelta(hours=1), timedelta(hours=2))


@needs_zoneinfo
def test_localtime_follows_the_link_into_zoneinfo(tmp_path: Path) -> None:
    localtime = tmp_path / "localtime"
    localtime.symlink_to(ZONEINFO / "America/New_York")
    zone = load_time_zone("localtime", localtime)
    assert str(zone) == "America/New_York"
    assert offsets(zone) == (timedelta(hours=-5), timedelta(hours=-4))


@needs_zoneinfo
def test_localtime_follows_a_chain_of_links(tmp_path: Path) -> None:
    (tmp_path / "zone").symlink_to(ZONEINFO / "Asia/Tokyo")
    localtime = tmp_path / "localtime"
    localtime.symlink_to(tmp_path / "zone")
    zone = load_time_zone("localtime", localtime)
    assert str(zone) == "Asia/Tokyo"
    assert offsets(zone) == (timedelta(hours=9), timedelta(hours=9))


def test_localtime_absent_means_utc(tmp_path: Path) -> None:
    zone = load_time_zone("localtime", tmp_path / "localtime")
    assert str(zone) == "UTC"
    assert offsets(zone) == (timedelta(0), timedelta(0))


@needs_zoneinfo
def test_localtime_as_a_copied_file_is_read(tmp_path: Path) -> None:
    localtime = tmp_path / "localtime"
    shutil.copyfile(ZONEINFO / "Europe/Berlin", localtime)
    zone = load_time_zone("localtime", localtime)
    assert str(zone) == "localtime"
    assert offsets(zone) == (timedelta(hours=1), timedelta(hours=2))


@needs_zoneinfo
def test_localtime_linking_outside_zoneinfo_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "Berlin"
    shutil.copyfile(ZONEINFO / "Europe/Berlin", copy)
    localtime = tmp_path / "localtime"
    localtime.symlink_to(copy)
    with pytest.raises(InputError, match="outside any zoneinfo directory") as caught:
        load_time_zone("localtime", localtime)
    assert caught.value.field == "updates.periodic.time_zone"


def test_localtime_dangling_link_is_refused(tmp_path: Path) -> None:
    localtime = tmp_path / "localtime"
    localtime.symlink_to(tmp_path / "zoneinfo/Nowhere/Land")
    with pytest.raises(InputError, match="cannot read the time zone file") as caught:
        load_time_zone("localtime", localtime)
    assert caught.value.field == "updates.periodic.time_zone"


def test_localtime_that_is_no_zone_file_is_refused(tmp_path: Path) -> None:
    localtime = tmp_path / "localtime"
    localtime.write_text("Europe/Berlin\n")
    with pytest.raises(InputError, match="cannot read the time zone file"):
        load_time_zone("localtime", localtime)


@pytest.mark.parametrize("name", ["Mars/Olympus", "utc", "America", "../etc/passwd",
                                  "/usr/share/zoneinfo/UTC", ""])  # fmt: skip
def test_an_unknown_zone_names_the_field(name: str) -> None:
    with pytest.raises(InputError, match="unknown time zone") as caught:
        load_time_zone(name)
    assert caught.value.field == "updates.periodic.time_zone"
