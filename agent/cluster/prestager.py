"""Pre-staging: follow the target the node's controller publishes before it picks nodes, and
stage that image locked in the background before this node's turn.

Where the target comes from is a `TargetSource`: the Node's pool and the rendered config it
moves to (`pool_target.py`), or a HyperShift NodePool's upgrade ConfigMap
(agent/hypershift/target.py). The source also gives the node's pre-pull lane (pull_lanes.py):
a bounded pre-pull waits for it in the controller's order and holds it while it pulls; without
one (unbounded) a random delay spreads the pulls. The Node itself is never written: state,
cordon and annotations stay as they are, so the controller does not count the node
unavailable. A failed pre-stage is retried with backoff and reported (Event, metric), never
Degraded; a full disk stops it until the target changes. The update loop pauses the
pre-stager while it acts (`paused()`), so a node whose turn comes while it still waits (for
its lane, or out the jitter) starts at once, and its lane passes on once the turn's image is
staged (`turn_staged()`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from agent.cluster import annotations as A
from agent.cluster.events import EventRecorder
from agent.cluster.kube import TRANSIENT, KubeError
from agent.cluster.prestage import Act, Decision
from agent.cluster.pull_lanes import LaneLost, PullLane
from agent.cluster.pull_order import pool_size_note
from agent.cluster.watch import ObjectWatch
from agent.core.backoff import backoff
from agent.core.desired import Desired
from agent.errors import HostError, InputError
from agent.host.ports import Progress
from agent.observe.metrics import Metrics
from agent.update.engine import Engine

# A signature refusal stands until the pool target (which carries the policy) changes.
_NO_RETRY = frozenset({"disk-space", "unsupported", "input", "signature"})


@dataclass(frozen=True)
class PrestageOptions:
    mode: str = "pool"  # "pool" or "off"
    # "auto" (K = the pool's maxUnavailable), a number K, or "unbounded": every node of the
    # pool pre-pulls at once after `jitter` (the behaviour before the lanes).
    slots: str = "auto"
    jitter: float = 60.0  # unbounded only: the start is delayed by up to this many seconds
    retry_initial: float = 10.0
    retry_max: float = 600.0
    repick: float = 600.0  # seconds between re-listing the pools (a new custom pool)
    lease_namespace: str = "openshift-machine-config-operator"
    lease_seconds: int = 30

    @property
    def bounded(self) -> bool:
        return self.slots != "unbounded"


class TargetSource(Protocol):
    """Where the pre-stager learns the target: `what` names it in Events and logs ("pool
    target", capitalised at a sentence's start); `grant` names the RBAC its pre-pull lanes
    need (said when it is missing); `on_change` is set by the pre-stager and called when the
    target may have moved."""

    what: str
    grant: str
    on_change: Callable[[], None]

    async def target(self) -> str | None:
        """The name of the config the node will be asked for next (None: none published)."""
        ...

    def decide(self, node: A.NodeView, target: str | None, journal_idle: bool) -> Decision: ...

    async def desired(self, target: str) -> Desired | None:
        """The desired state of `target`; None while it is not there yet (a watch brings it);
        InputError when it cannot be used."""
        ...

    async def lane(self, target: str) -> PullLane | None:
        """This node's pre-pull lane for `target` (None: pre-pulls are not bounded here)."""
        ...

    async def close(self) -> None: ...


class Prestager:
    def __init__(
        self,
        node: ObjectWatch,
        engine: Engine,
        events: EventRecorder,
        metrics: Metrics,
        source: TargetSource,
        options: PrestageOptions,
        rng: random.Random | None = None,
    ) -> None:
        self.node, self.engine, self.source = node, engine, source
        self.events, self.metrics, self.options = events, metrics, options
        self.rng = rng or random.Random()
        self.wakeup = asyncio.Event()
        source.on_change = self.poke
        self._task: asyncio.Task[None] | None = None
        self._task_key: str | None = None  # the Desired.key the task pre-stages
        self._pulled = False  # the task's pre-stage was a pre-pull (checked again on wake-up)
        self._recheck = False  # a wake-up came while the task ran: check again when it ends
        self._stopped_key: str | None = None  # a pre-stage stopped for good (full disk)
        self._paused = 0
        # Bounded pre-pulls: the lane this node holds (renewed by `_keeper`), the target whose
        # pull is over (its lane passed on), and the turn's own hold of the lane.
        self._held: PullLane | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._passed: str | None = None
        self._turn: asyncio.Task[None] | None = None
        self._turn_over = asyncio.Event()
        self.log = structlog.get_logger("prestage").bind(node=node.name)

    @property
    def _what(self) -> str:
        what = self.source.what
        return what[:1].upper() + what[1:]

    def poke(self) -> None:
        self.wakeup.set()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """While the update loop acts: no pre-stage runs or starts. A running stage is left
        to the update (it adopts the stage unit of the same image, or replaces it)."""
        self._paused += 1
        try:
            await self._cancel_task(keep_lane=True)
            self._start_turn()
            yield
        finally:
            self._paused -= 1
            self._turn_over.set()
            self.poke()

    async def turn_staged(self) -> None:
        """The turn's image is staged (before its drain): its lane goes to the next node,
        which pre-pulls while this one drains and reboots."""
        self._turn_over.set()
        if self._turn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._turn), 10.0)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while True:
                self.wakeup.clear()
                if not self._paused:
                    try:
                        await self._step()
                    except (KubeError, *TRANSIENT) as exc:
                        self.log.warning("pre-stage check failed; retrying", error=str(exc))
                        await asyncio.sleep(self.options.retry_initial)
                        continue
                    except Exception as exc:  # e.g. a pool or a journal it cannot read
                        # Never Degraded, never the end of pre-staging: logged, and checked
                        # again when the Node, the pool or its target changes (or at `repick`).
                        self.log.warning("pre-stage check failed", error=str(exc),
                                         kind=type(exc).__name__)  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.repick):
                        await self.wakeup.wait()
        finally:
            await self._cancel_task()
            for task in (self._turn, self._keeper):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            await self.source.close()

    async def _step(self) -> None:
        if self.node.obj is None:
            return
        target = await self.source.target()
        node = A.NodeView.of(self.node.obj)
        decision = self.source.decide(node, target, journal_idle=self._journal_idle())
        match decision.act:
            case Act.WAIT:
                pass
            case Act.HANDOVER:
                await self._cancel_task(keep_lane=True)  # the turn adopts pull and lane
            case Act.DROP:
                await self._cancel_task()
                await self._release(passed=True)
                self._stopped_key = None
                if self.engine.prestaged() is not None:
                    await self.engine.drop_prestage()
                    self._set_state("none")
            case Act.STAGE:
                assert decision.target is not None
                await self._stage_target(decision.target)

    def _journal_idle(self) -> bool:
        return str(self.engine.journal.load().phase) == "idle"

    async def _stage_target(self, name: str) -> None:
        try:
            desired = await self.source.desired(name)
        except InputError as exc:
            self.log.warning(f"{self.source.what} not usable; not pre-staged", config=name,
                             error=str(exc))  # fmt: skip
            return
        if desired is None:
            return  # not published yet: its watch wakes us
        if desired.key == self._stopped_key:
            return  # stopped for good
        if desired.key == self._task_key and not (self._pulled and self._task_done()):
            # Running, or staged locked (no ordinary boot or prune undoes that). A wake-up
            # while a pre-pull still finishes (its lane's release) may be an admin's prune:
            # it is checked once that task ends.
            self._recheck = not self._task_done()
            return
        # Not yet, or pre-pulled: any staging since (an admin's, the timer's) pruned it from
        # the repository, so every wake-up checks it is still there (one `image list`).
        await self._cancel_task()
        if self._paused:
            return  # the update began while we looked: it owns bootc now
        self._task_key = desired.key
        self._recheck = False
        self._task = asyncio.create_task(self._prestage(name, desired))
        self._task.add_done_callback(self._after_task)

    def _after_task(self, task: asyncio.Task[None]) -> None:
        if task is self._task and self._pulled and self._recheck:
            self._recheck = False
            self.poke()

    def _task_done(self) -> bool:
        return self._task is not None and self._task.done()

    async def _cancel_task(self, keep_lane: bool = False) -> None:
        """Stop the running pre-stage; its lane is given back, or kept for the turn that
        adopts its pull (`keep_lane`)."""
        task, self._task, self._task_key, self._pulled = self._task, None, None, False
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not keep_lane:
            await self._release(passed=False)

    # -- the lane (bounded pre-pulls) ------------------------------------------------------
    def _hold(self, lane: PullLane, owner: asyncio.Task[Any] | None) -> None:
        """Keep `lane` renewed; if it is lost, `owner` (the pull through it) is stopped."""
        if self._keeper is not None and self._held is lane:
            return
        self._held = lane

        async def keep() -> None:
            try:
                await lane.keep()
            except LaneLost as exc:
                self.log.warning("pre-pull lane lost; the pull stops and queues again",
                                 error=str(exc))  # fmt: skip
                self._held, self._keeper = None, None
                if owner is not None and owner is self._task:
                    self._task_key = None  # queued again at the next step
                    owner.cancel()
                    self.poke()

        self._keeper = asyncio.create_task(keep())

    async def _release(self, *, passed: bool) -> None:
        lane, keeper = self._held, self._keeper
        self._held, self._keeper = None, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        if lane is not None:
            await lane.release(passed=passed)
            if passed:
                self._passed = lane.queue.target

    def _start_turn(self) -> None:
        """The node's turn for the pool's target: its pull takes the lane if the lane is free
        (never waiting for it) so that no pre-pull starts beside it, and the lane passes on
        once the turn's image is staged. If another node holds the lane, this one leaves the
        queue at once: the controller picked it (perhaps before the order said), so the lane
        goes to the next node still waiting as soon as the holder is through, not after this
        turn's own pull. The update does not wait for any of this."""
        node = A.NodeView.of(self.node.obj or {})
        desired = node.desired_config
        if not self.options.bounded or desired is None or self._passed == desired:
            return
        if node.get(A.CURRENT_CONFIG) == desired:
            return  # no turn: a pass on a node already at the pool's config pulls nothing
        if self._turn is not None and not self._turn.done():
            return
        self._turn_over.clear()
        self._turn = asyncio.create_task(self._hold_for_turn(desired))

    async def _hold_for_turn(self, target: str) -> None:
        try:
            if self._held is not None and self._held.queue.target != target:
                await self._release(passed=False)  # a pre-pull of an older target
            lane = self._held or await self.source.lane(target)
            if lane is None:
                return
            if self._held is lane:
                self.log.info("turn adopts the pre-pull and its lane", lane=lane.name)
            elif await lane.try_take():
                self._hold(lane, owner=None)
                self.log.info("turn pulls through its lane", lane=lane.name)
            else:
                self.log.info("turn pulls without its lane (another node holds it); out of "
                              "its queue", lane=lane.name, rank=lane.queue.rank)  # fmt: skip
                await lane.release(passed=True)
                self._passed = target
                return
            await self._turn_over.wait()
        except (KubeError, *TRANSIENT) as exc:
            self.log.warning("turn's lane not taken", error=str(exc))
            return
        if self._held is lane:
            await self._release(passed=True)
        else:  # the lane was lost meanwhile: the nodes after it still learn it is through
            await lane.release(passed=True)
            self._passed = target

    # -- one pre-stage ---------------------------------------------------------------------
    async def _prestage(self, name: str, desired: Desired) -> None:
        target = str(desired.target)
        lane = await self._take_lane(name, target)
        if lane is None:  # unbounded: a random delay spreads the pool's pulls
            resumed = self.engine.prestaged() == target  # started before a restart: no jitter
            delay = 0.0 if resumed else self.rng.uniform(0.0, max(0.0, self.options.jitter))
            self._set_state("waiting")
            self.log.info("pre-stage planned", config=name, image=target, delay=round(delay, 1))
            await asyncio.sleep(delay)
        over = False  # the pull is over for good (done, or stopped): the lane passes on
        try:
            over = await self._pull(name, desired, target)
        finally:
            if lane is not None and self._held is lane and self._task is asyncio.current_task():
                await self._release(passed=over)

    async def _take_lane(self, name: str, target: str) -> PullLane | None:
        """This node's lane for the target, taken in the controller's order (held from
        here on); None when the pre-pulls are unbounded: asked for, or not allowed (the
        identity lacks the grant the source names: pre-staging goes on as before the bound,
        after the jitter, and says so). API faults are retried; the turn never waits for any
        of this."""
        failures = 0
        while True:
            try:
                lane = await self.source.lane(name)
                if lane is None:
                    return None
                self._set_state("queued")
                self.log.info("pre-pull queued", config=name, image=target,
                              order=pool_size_note(lane.queue))  # fmt: skip
                why = await lane.acquire(lambda d: self.log.info("pre-pull waits", why=d.why))
            except KubeError as exc:
                if exc.status not in (401, 403):
                    error: Exception = exc
                else:
                    jitter = f"{self.options.jitter:g}"
                    note = (f"pre-pulls of {name} not bounded: {exc} ({self.source.grant}); "
                            f"pre-pulling after a random delay up to {jitter} s")  # fmt: skip
                    self.log.warning(note)
                    await self.events.emit("PrestageUnbounded", note, warning=True)
                    return None
            except TRANSIENT as exc:
                error = exc
            else:
                self._hold(lane, owner=asyncio.current_task())
                self.log.info("pre-pull lane held", lane=lane.name, why=why)
                return lane
            failures += 1
            delay = backoff(failures, self.options.retry_initial, self.options.retry_max)
            self.log.warning("pre-pull lane not reached; retrying", error=str(error),
                             delay=round(delay, 1))  # fmt: skip
            await asyncio.sleep(delay)

    async def _pull(self, name: str, desired: Desired, target: str) -> bool:
        """The pre-stage with its retries; whether it is over (done or stopped for good)."""

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, HostError) and exc.kind not in _NO_RETRY

        async def report_failure(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            await self._failed(name, target, exc, retrying=True)

        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            wait=lambda state: backoff(
                state.attempt_number, self.options.retry_initial, self.options.retry_max
            ),
            before_sleep=report_failure,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    self._set_state("staging")
                    result = await self.engine.prestage(desired, self._on_progress)
        except HostError as exc:
            self._stopped_key = desired.key
            await self._failed(name, target, exc, retrying=False)
            return True
        if result.skipped:
            self.log.info("not pre-staged", config=name, why=result.note)
            self._set_state("none")
            if result.note.startswith("pre-staging unavailable"):
                await self.events.emit("PrestageSkipped", f"{self._what} {name}: "
                                       f"{result.note}", warning=True)  # fmt: skip
            return True
        self._pulled = result.outcome.endswith("pulled")
        self._set_state("staged")
        self.log.info("pre-staged", config=name, image=target, result=str(result))
        if result.outcome == "staged":
            await self.events.emit("OSImagePrestaged", f"{self._what} {name}: OS image {target} "
                                   "staged locked; it is applied only when this node's turn "
                                   "comes")  # fmt: skip
        elif result.outcome == "pulled":
            await self.events.emit("OSImagePrepulled", f"{self._what} {name}: OS image {target} "
                                   "pulled into the repository, nothing staged; this node's "
                                   f"turn fetches no layer ({result.note})")  # fmt: skip
        return True

    async def _failed(self, name: str, target: str, exc: BaseException | None,
                      retrying: bool) -> None:  # fmt: skip
        kind = getattr(exc, "kind", "other")
        self.metrics.prestage_failures.labels(kind).inc()
        self._set_state("failed" if retrying else "stopped")
        what = f"Pre-staging {target} for {self.source.what} {name}"
        if kind == "disk-space":
            text = (f"{what} stopped: out of disk space ({exc}); the image is pulled when this "
                    "node's turn comes")  # fmt: skip
        elif retrying:
            text = f"{what} failed ({kind}): {exc}; retrying"
        else:
            text = f"{what} stopped ({kind}): {exc}"
        self.log.warning("pre-stage failed", config=name, kind=kind, error=str(exc),
                         retrying=retrying)  # fmt: skip
        await self.events.emit("OSImagePrestageFailed", text, warning=True)

    def _on_progress(self, progress: Progress) -> None:
        self.metrics.prestage_bytes.labels("done").set(progress.done_bytes)
        self.metrics.prestage_bytes.labels("total").set(progress.total_bytes)

    def _set_state(self, state: str) -> None:
        self.metrics.record_prestage(state)
