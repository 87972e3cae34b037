"""The pre-stager checks a pre-pull again after a wake-up that came while the pull's task was
still ending (giving its lane back): that wake-up may be an administrator's stage, whose prune
dropped the pulled image. Without the check the node's turn fetches the whole image. And a
pass on a node already at its pool's config is no turn: it takes no lane."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from agent.cluster.prestage import Act, Decision
from agent.cluster.prestager import PrestageOptions, Prestager
from agent.cluster.pull_order import Queue
from agent.observe.metrics import Metrics
from agent.update.engine import PrestageResult


class SlowLane:
    """A pre-pull lane whose release waits for `released` (a slow API server)."""

    def __init__(self) -> None:
        self.name = "lane-0"
        self.queue = Queue(target="rendered-worker-2", rank=0, lanes=1, predecessor=None,
                           predecessor_rank=None, members=3)  # fmt: skip
        self.releasing = asyncio.Event()
        self.released = asyncio.Event()

    async def acquire(self, on_wait: Any) -> str:
        return "first in line"

    async def keep(self) -> None:
        await asyncio.Event().wait()

    async def release(self, *, passed: bool) -> None:
        self.releasing.set()
        await self.released.wait()


class Source:
    what, grant = "pool target", "a Role"

    def __init__(self, lane: SlowLane) -> None:
        self._lane = lane
        self.on_change = lambda: None

    async def target(self) -> str:
        return "rendered-worker-2"

    def decide(self, node: Any, target: str | None, journal_idle: bool) -> Decision:
        return Decision(Act.STAGE, "ahead", target)

    async def desired(self, target: str) -> Any:
        return SimpleNamespace(key=target, target="quay.example/os@sha256:" + "1" * 64)

    async def lane(self, target: str) -> SlowLane:
        return self._lane

    async def close(self) -> None:
        pass


class Engine:
    def __init__(self) -> None:
        self.pulls = 0
        self.journal = SimpleNamespace(load=lambda: SimpleNamespace(phase="idle"))

    async def prestage(self, desired: Any, on_progress: Any) -> PrestageResult:
        self.pulls += 1
        return PrestageResult("pulled")

    def prestaged(self) -> None:
        return None


class Events:
    async def emit(self, reason: str, message: str, warning: bool = False) -> None:
        pass


async def test_a_wake_up_while_the_pre_pull_gives_its_lane_back_is_checked_after() -> None:
    lane, engine = SlowLane(), Engine()
    node = SimpleNamespace(name="worker-0", obj={"metadata": {"name": "worker-0"}})
    prestager = Prestager(node, engine, Events(), Metrics(), Source(lane),  # type: ignore[arg-type]
                          PrestageOptions(retry_initial=0.01))  # fmt: skip
    runner = asyncio.create_task(prestager.run())
    try:
        async with asyncio.timeout(5):
            await lane.releasing.wait()  # pulled; its task now gives the lane back, slowly
            assert engine.pulls == 1
            prestager.poke()  # e.g. the pool object touched after an admin's stage
            await asyncio.sleep(0.05)  # the step ran and found the task still ending
            lane.released.set()
            while engine.pulls < 2:
                await asyncio.sleep(0.01)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


class TurnLane(SlowLane):
    """A lane that counts the turns that tried to take it."""

    def __init__(self) -> None:
        super().__init__()
        self.tries = 0
        self.released.set()

    async def try_take(self) -> bool:
        self.tries += 1
        return True


def node_at(desired: str, current: str) -> SimpleNamespace:
    notes = {"machineconfiguration.openshift.io/desiredConfig": desired,
             "machineconfiguration.openshift.io/currentConfig": current}  # fmt: skip
    return SimpleNamespace(name="worker-0", obj={"metadata": {"name": "worker-0",
                                                              "annotations": notes}})  # fmt: skip


async def test_a_pass_on_a_node_at_its_config_is_no_turn_and_takes_no_lane() -> None:
    """An update pass on a node already at the pool's config (a first start, a forced
    re-apply) pulls nothing: its lane is left alone. A hold of it for that config, released
    as the next rollout began, once let this node's pre-pull start beside the lane's rightful
    holder. A node the controller picked takes its lane at its turn."""
    for current, tries in (("rendered-worker-2", 0), ("rendered-worker-1", 1)):
        lane = TurnLane()
        prestager = Prestager(node_at("rendered-worker-2", current), Engine(), Events(),
                              Metrics(), Source(lane), PrestageOptions())  # type: ignore[arg-type]  # fmt: skip
        async with asyncio.timeout(5):
            async with prestager.paused():
                await asyncio.sleep(0.05)  # the turn's task, if any, has run
        assert lane.tries == tries, current
