"""The drift guard's hand-over between monitors: each validation restarts the monitor, and
what changed before the new one was armed must still bring a pass.

A Degraded node validates at every pass, so each pass restarts the monitor; the force file is
read at the pass's start, not by the validation. Touched between that read and the restart,
its event sat unread in the old monitor, which the restart dropped: the node stayed Degraded
with the force file present (seen once in CI, tests/test_drift.py, 2026-12-07)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.core.policy import FORCE_FILE, LivePolicy
from agent.model.machineconfig import empty_machine_config
from agent.observe.metrics import Metrics
from agent.update.drift_guard import DriftGuard
from standins.host.simulated import SimulatedHost

pytestmark = pytest.mark.asyncio


class Guarded:
    def __init__(self, base: Path) -> None:
        self.sim = SimulatedHost.create(base, "quay.example/os/node:v1")
        self.woken = asyncio.Event()
        self.found: list[tuple[str, str]] = []
        self.guard = DriftGuard(self.sim.host(lambda _path: True), Metrics(), self.woken.set,
                                self._found)  # fmt: skip
        config = empty_machine_config("rendered-worker-1")
        self.engine = SimpleNamespace(current_config=lambda: config, policy=LivePolicy())

    async def _found(self, reason: str, text: str) -> None:
        self.found.append((reason, text))

    async def validate(self) -> str | None:
        """A Degraded (unsettled) node's validation, as a pass runs it."""
        desired = SimpleNamespace(target=None)
        return await self.guard.gate(self.engine, desired, settled=False, update_ahead=False,
                                     recorded=True,
                                     image=None)  # fmt: skip

    def touch_force_file(self) -> None:
        (self.sim.root / FORCE_FILE.lstrip("/")).touch()


@pytest.fixture
async def guarded(tmp_path: Path):
    g = Guarded(tmp_path / "host")
    yield g
    await g.guard.stop()


async def test_a_force_file_touched_before_the_monitor_restarts_still_wakes_a_pass(
    guarded: Guarded,
) -> None:
    g = guarded
    assert await g.validate() is None  # the first pass: clean, the monitor armed
    g.woken.clear()
    assert not await g.guard.forced()  # the next pass's check, before anything is touched
    g.touch_force_file()  # then the touch: the old monitor has not read its event yet
    assert await g.validate() is None  # the same pass's validation restarts the monitor
    await asyncio.wait_for(g.woken.wait(), 5)
    assert g.guard.unchecked
    assert await g.guard.forced()  # and the pass it brings acts on it


async def test_a_force_file_touched_after_the_restart_is_seen_by_the_new_monitor(
    guarded: Guarded,
) -> None:
    g = guarded
    assert await g.validate() is None
    await asyncio.sleep(0.2)  # the first monitor's start-up settled
    g.woken.clear()
    g.touch_force_file()
    await asyncio.wait_for(g.woken.wait(), 5)
    assert g.guard.unchecked


async def test_no_force_file_no_wakeup(guarded: Guarded) -> None:
    """The check after arming wakes a pass only for a force file that is there."""
    g = guarded
    assert await g.validate() is None
    g.woken.clear()
    assert await g.validate() is None
    await asyncio.sleep(0.3)
    assert not g.woken.is_set()
    assert not g.found
