"""What a standalone host's operator reads, through the files and endpoint the agent serves
(status.json beside the journal, and /status): a rollback's cause while the host stays off the
digest that failed, and a reboot request a lock manager has not answered yet."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from agent.app.runtime import journal_phase, write_status
from agent.follow.agent import HELD
from agent.host.ports import Host
from agent.observe.http import StatusBoard, serve
from agent.strategy.fleet_lock import FleetLockStrategy
from agent.update.engine import DEGRADED, DONE, REBOOTING, Engine, Outcome
from tests.fleetlock_server import FleetLockServer
from tests.scenarios.harness import free_port, until
from tests.test_follow import IMAGE, TAG, Fleet


class Served:
    """The agent's reporting as `run --source image:` wires it: status.json and the board
    behind /status, served on 127.0.0.1."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.board = StatusBoard()
        self.url = f"http://127.0.0.1:{free_port()}/status"

    def reporter(self, host: Host, engine: Engine) -> Callable[[Outcome, dict[str, Any]], None]:
        return lambda outcome, extra: write_status(host, outcome, journal_phase(engine),
                                                   self.board, extra)  # fmt: skip

    def file(self) -> dict[str, Any]:
        path = self.fleet.sim.root / "var/lib/image-mode-agent/status.json"
        return json.loads(path.read_text())

    async def endpoint(self) -> dict[str, Any]:
        limit = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession() as session, session.get(self.url, timeout=limit) as got:
            return await got.json()

    async def both(self) -> dict[str, Any]:
        """status.json and /status, which must say the same."""
        file, served = self.file(), await self.endpoint()
        assert {k: v for k, v in served.items() if k != "bootc"} == file
        return file


@asynccontextmanager
async def served(fleet: Fleet):
    s = Served(fleet)
    runner = await serve(s.board, s.url.removeprefix("http://").removesuffix("/status"))
    assert runner is not None
    try:
        yield s
    finally:
        await runner.cleanup()


async def test_a_rollback_cause_stays_in_the_status_until_a_new_digest_is_taken(
    tmp_path: Path,
) -> None:
    """A digest whose health check fails is rolled back. From the rolled-back boot on, every
    pass (each a process life of its own) reports Degraded with the cause first, then that
    the digest is not staged again; once the tag moves on, the new digest's update replaces
    it."""
    fleet = Fleet(tmp_path)
    good = fleet.booted()
    bad = fleet.push(healthy=False)
    async with served(fleet) as status:
        outcome = await fleet.life(status.reporter).tick()
        assert outcome[0].state == REBOOTING
        for _ in range(3):  # the bad boot: checks fail, roll back, reboot; then the old image
            outcome, _ = await fleet.life(status.reporter).tick()
            if outcome.state != REBOOTING:
                break
        assert fleet.booted() == good
        for _ in range(3):  # and later passes, in later lives, while the tag stays on `bad`
            shown = await status.both()
            assert shown["state"] == DEGRADED
            note = (f"; {TAG} points to {bad}, which failed on this host before and is not "
                    f"staged again; running {good} until the tag moves on")  # fmt: skip
            assert shown["reason"].endswith(note), shown["reason"]
            cause = shown["reason"].removesuffix(note)
            assert cause.startswith(f"rolled back to {TAG}@{good}: required health check "
                                    f"failed on {bad}: 50-app: exit 1"), cause  # fmt: skip
            assert shown["follow"]["latestDigest"] == bad
            await fleet.life(status.reporter).tick()
        fixed = fleet.push(name="fixed")
        assert (await fleet.life(status.reporter).tick())[0].state == REBOOTING
        shown = await status.both()
        assert shown["reason"] == f"rebooting into {IMAGE}@{fixed}"
        assert (await fleet.life(status.reporter).tick())[0].state == DONE
        assert (await status.both())["reason"] == ""


async def test_while_the_lock_manager_has_not_answered_the_status_says_the_reboot_waits(
    tmp_path: Path,
) -> None:
    """A lock manager that takes the pre-reboot request and never answers: for as long as the
    client waits (its timeout, 2 s here), status.json and /status say that the new digest is
    staged and the reboot waits for the strategy's answer, since when; the tag's new digest is
    the latest. Then the timeout is the reason, and nothing is outstanding."""
    lock = FleetLockServer(default_slots=1)
    lock.silent.add("pre-reboot")
    async with lock as base_url:
        fleet = Fleet(tmp_path)
        fleet.strategy = FleetLockStrategy.from_config(
            base_url, group="workers", root=fleet.sim.root, timeout=2.0
        )
        new = fleet.push()
        async with served(fleet) as status, contextlib.aclosing(fleet.strategy):
            write_status(fleet.sim.host(lambda p: True), Outcome(DONE), "idle", status.board)
            tick = asyncio.create_task(fleet.life(status.reporter).tick())
            await until(lambda: lock.calls("pre-reboot"), what="the pre-reboot request")
            shown = await status.both()
            assert shown["state"] == HELD
            waits = (f"staged {IMAGE}@{new}; reboot waits for the fleet_lock strategy's "
                     f"answer (asked at {shown['follow']['askedSince']})")  # fmt: skip
            assert shown["reason"] == waits
            assert shown["follow"]["latestDigest"] == new
            assert shown["follow"]["decision"] is None
            assert fleet.staged()["downloadOnly"] is True and not tick.done()
            outcome, _ = await asyncio.wait_for(tick, 30)
            assert outcome.state == HELD and fleet.reboots() == 0
            shown = await status.both()
            assert "no answer within 2 s" in shown["reason"]
            assert shown["follow"]["askedSince"] is None
            assert shown["follow"]["decision"]["allowed"] is False
