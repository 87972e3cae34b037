"""Pre-staging: follow the target the node's controller publishes before it picks nodes, and
stage that image locked in the background before this node's turn.

Where the target comes from is a `TargetSource`: the Node's pool and the rendered config it
moves to (`PoolTarget`: one pool, found by the controller's rule in `pool.py`, and one
rendered config are watched; no other Node is), or a HyperShift NodePool's upgrade ConfigMap
(agent/hypershift/target.py). The Node itself is never written: state, cordon and annotations
stay as they are, so the controller does not count the node unavailable. A failed pre-stage
is retried with backoff and reported (Event, metric), never Degraded; a full disk stops it
until the target changes. The update loop pauses the pre-stager while it acts (`paused()`),
so a node whose turn comes while it still waits out its jitter starts at once."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from agent.cluster import annotations as A
from agent.cluster.events import EventRecorder
from agent.cluster.kube import MACHINECONFIGS, TRANSIENT, Kube, KubeError
from agent.cluster.pool import MACHINECONFIGPOOLS, PoolError, primary_pool
from agent.cluster.prestage import Act, Decision, decide, pool_target
from agent.cluster.watch import NamedWatch, ObjectWatch
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
    jitter: float = 60.0  # the start is delayed by up to this many seconds (registry load)
    retry_initial: float = 10.0
    retry_max: float = 600.0
    repick: float = 600.0  # seconds between re-listing the pools (a new custom pool)


class TargetSource(Protocol):
    """Where the pre-stager learns the target: `what` names it in Events and logs ("pool
    target", capitalised at a sentence's start); `on_change` is set by the pre-stager and called
    when the target may have moved."""

    what: str
    on_change: Callable[[], None]

    async def target(self) -> str | None:
        """The name of the config the node will be asked for next (None: none published)."""
        ...

    def decide(self, node: A.NodeView, target: str | None, journal_idle: bool) -> Decision: ...

    async def desired(self, target: str) -> Desired | None:
        """The desired state of `target`; None while it is not there yet (a watch brings it);
        InputError when it cannot be used."""
        ...

    async def close(self) -> None: ...


class PoolTarget:
    """The Node's pool (re-picked when the Node's labels change, the pool is gone, or `repick`
    seconds passed) and the rendered config its `spec.configuration.name` names."""

    what = "pool target"

    def __init__(
        self,
        api: Kube,
        node: ObjectWatch,
        events: EventRecorder,
        desired_of: Callable[[dict[str, Any]], Desired],
        repick: float,
    ) -> None:
        self.api, self.node, self.events, self.desired_of = api, node, events, desired_of
        self.repick = repick
        self.on_change: Callable[[], None] = lambda: None
        self.pool = NamedWatch(api, MACHINECONFIGPOOLS, on_change=lambda: self.on_change())
        self.rendered = NamedWatch(api, MACHINECONFIGS, on_change=lambda: self.on_change())
        self._labels: dict[str, str] | None = None
        self._picked_at = 0.0
        self.log = structlog.get_logger("prestage").bind(node=node.name)

    async def target(self) -> str | None:
        return pool_target(await self._pool())

    def decide(self, node: A.NodeView, target: str | None, journal_idle: bool) -> Decision:
        return decide(node, target, journal_idle)

    async def desired(self, target: str) -> Desired | None:
        rendered = await self.rendered.get(target)
        return None if rendered is None else self.desired_of(rendered)

    async def close(self) -> None:
        await self.pool.close()
        await self.rendered.close()

    async def _pool(self) -> dict[str, Any] | None:
        labels = dict(((self.node.obj or {}).get("metadata") or {}).get("labels") or {})
        now = asyncio.get_running_loop().time()
        watch = self.pool.watch
        gone = watch is not None and watch.missing
        if labels == self._labels and not gone and now - self._picked_at < self.repick:
            return watch.obj if watch is not None else None
        self._labels, self._picked_at = labels, now
        listing = await self.api.get(MACHINECONFIGPOOLS)
        try:
            name = primary_pool(self.node.name, labels, listing.get("items") or [])
        except PoolError as exc:
            await self.events.emit("PrestageSkipped", f"{exc}; pre-staging is off until this "
                                   "is fixed", warning=True)  # fmt: skip
            self.log.warning("no pool to pre-stage for", error=str(exc))
            name = None
        if name is None:
            self.pool.stop()
            return None
        if watch is None or watch.name != name:
            self.log.info("following pool", pool=name)
        return await self.pool.get(name)


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
        self._stopped_key: str | None = None  # a pre-stage stopped for good (full disk)
        self._paused = 0
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
            await self._cancel_task()
            yield
        finally:
            self._paused -= 1
            self.poke()

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
                await self._cancel_task()
            case Act.DROP:
                await self._cancel_task()
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
            return  # running, or staged locked (no ordinary boot or prune undoes that)
        # Not yet, or pre-pulled: any staging since (an admin's, the timer's) pruned it from
        # the repository, so every wake-up checks it is still there (one `image list`).
        await self._cancel_task()
        if self._paused:
            return  # the update began while we looked: it owns bootc now
        self._task_key = desired.key
        self._task = asyncio.create_task(self._prestage(name, desired))

    def _task_done(self) -> bool:
        return self._task is not None and self._task.done()

    async def _cancel_task(self) -> None:
        task, self._task, self._task_key, self._pulled = self._task, None, None, False
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- one pre-stage ---------------------------------------------------------------------
    async def _prestage(self, name: str, desired: Desired) -> None:
        target = str(desired.target)
        resumed = self.engine.prestaged() == target  # started before a restart: no new jitter
        delay = 0.0 if resumed else self.rng.uniform(0.0, max(0.0, self.options.jitter))
        self._set_state("waiting")
        self.log.info("pre-stage planned", config=name, image=target, delay=round(delay, 1))
        await asyncio.sleep(delay)

        def retryable(exc: BaseException) -> bool:
            return isinstance(exc, HostError) and exc.kind not in _NO_RETRY

        async def report_failure(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            await self._failed(name, target, exc, retrying=True)

        retrying = AsyncRetrying(
            retry=retry_if_exception(retryable),
            wait=wait_exponential_jitter(self.options.retry_initial, self.options.retry_max),
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
            return
        if result.skipped:
            self.log.info("not pre-staged", config=name, why=result.note)
            self._set_state("none")
            if result.note.startswith("pre-staging unavailable"):
                await self.events.emit("PrestageSkipped", f"{self._what} {name}: "
                                       f"{result.note}", warning=True)  # fmt: skip
            return
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
