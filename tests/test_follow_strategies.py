"""The follow loop with the real strategies: a periodic schedule on an injected clock, and
three hosts behind one FleetLock slot (tests/fleetlock_server.py) rebooting one at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.follow.agent import HELD
from agent.strategy.fleet_lock import FleetLockStrategy
from agent.strategy.periodic import PeriodicStrategy
from agent.update.engine import DONE, REBOOTING
from tests.fleetlock_server import FleetLockServer
from tests.test_follow import Fleet

# Saturday 2026-12-05 23:30 UTC for 60 minutes, every week.
WINDOWS = {"time_zone": "UTC",
           "window": [{"days": ["Sat"], "start_time": "23:30", "length_minutes": 60}]}  # fmt: skip


async def test_periodic_holds_the_reboot_until_the_window_opens(tmp_path: Path) -> None:
    now = [datetime(2026, 12, 5, 12, 0, tzinfo=UTC)]  # Saturday noon: outside
    strategy = PeriodicStrategy.from_config(WINDOWS, clock=lambda: now[0])
    fleet = Fleet(tmp_path, strategy)
    new = fleet.push()
    agent = fleet.life()
    outcome, wait = await agent.tick()
    assert outcome.state == HELD and "outside the maintenance windows" in outcome.reason
    assert fleet.staged()["image"]["imageDigest"] == new and fleet.reboots() == 0
    assert 60 - 1 <= wait <= 66  # the check interval (60 s + jitter) is sooner than the window
    decision = fleet.reports[-1][1]["follow"]["decision"]
    assert decision["nextWindow"] == "2026-12-05T23:30:00+00:00"
    text = agent.metrics.render().decode()
    assert "image_mode_agent_strategy_next_window_timestamp_seconds 1.7965134e+09" in text
    assert 'image_mode_agent_strategy_can_finalize_responses_total{allowed="false"' in text
    now[0] = datetime(2026, 12, 5, 23, 29, 59, tzinfo=UTC)
    assert (await agent.tick())[0].state == HELD and fleet.reboots() == 0
    now[0] += timedelta(seconds=1)  # the window opens
    assert (await agent.tick())[0].state == REBOOTING
    now[0] += timedelta(minutes=5)
    assert (await fleet.life().tick())[0].state == DONE and fleet.booted() == new
    assert fleet.reboots() == 1


async def test_periodic_never_reboots_outside_but_applies_nothing_else(tmp_path: Path) -> None:
    now = [datetime(2026, 12, 6, 0, 30, tzinfo=UTC)]  # Sunday 00:30: the window just closed
    strategy = PeriodicStrategy.from_config(WINDOWS, clock=lambda: now[0])
    fleet = Fleet(tmp_path, strategy)
    fleet.push()
    agent = fleet.life()
    for _ in range(3):
        outcome, _ = await agent.tick()
        assert outcome.state == HELD and "2026-12-12T23:30:00+00:00" in outcome.reason
        now[0] += timedelta(days=2)
    assert fleet.reboots() == 0 and len(fleet.switches()) == 1


async def test_fleet_lock_lets_one_host_of_three_reboot_at_a_time(tmp_path: Path) -> None:
    server = FleetLockServer(default_slots=1)
    async with server as base_url:
        fleets = [Fleet(tmp_path / f"h{i}") for i in range(3)]
        for fleet in fleets:  # each host's id comes from its own /etc/machine-id
            fleet.strategy = FleetLockStrategy.from_config(
                base_url, group="workers", root=fleet.sim.root
            )
        ids = {fleet.strategy.describe()["nodeId"] for fleet in fleets}
        assert len(ids) == 3
        news = [fleet.push() for fleet in fleets]
        done: set[int] = set()
        for _round in range(12):
            for i, fleet in enumerate(fleets):
                if i in done:
                    continue
                outcome = await fleet.tick()
                # between its reboot and its verified boot a host holds the one slot
                rebooting = [
                    j
                    for j, f in enumerate(fleets)
                    if f.reboots()
                    and j not in done
                    and not (f.booted() == news[j] and j == i and outcome.state == DONE)
                ]
                assert len(rebooting) <= 1, f"hosts {rebooting} rebooting at once"
                if outcome.state == DONE and fleet.booted() == news[i]:
                    done.add(i)
            if len(done) == 3:
                break
        assert done == {0, 1, 2}
        assert [fleet.reboots() for fleet in fleets] == [1, 1, 1]
        assert server.max_concurrent_holders["workers"] == 1
        assert server.holders["workers"] == []  # every slot given back after its verified boot
        held = [r for r in server.records if r.api == "pre-reboot" and r.status != 200]
        assert held and all(r.kind == "failed_lock_semaphore_full" for r in held)
        for fleet in fleets:
            await fleet.strategy.aclose()
