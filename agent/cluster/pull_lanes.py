"""One node's lane for pre-pulls through the API server: wait for it in the controller's
order, take it, keep it renewed, give it back (the Lease rules are in lane_lease.py).

Every write is an update with the resourceVersion last read, so two nodes never both win a
free lane: the loser gets 409 and reads again. Waiting is a watch on the one Lease (no poll),
plus a timer for the holder's expiry and for skipping a predecessor that never came. The turn
(`try_take`) never waits. A hold that can no longer be renewed (someone else took the lane
over, or the API server stayed out of reach for a whole lease) ends in LaneLost, and the
caller stops its pull: the bound holds even when this node was the one that fell silent."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from agent.cluster.kube import TRANSIENT, Kube, KubeError, namespaced_path
from agent.cluster.lane_lease import (
    Decision,
    LaneRecord,
    Verdict,
    as_read_by,
    decide,
    lease_name,
    micro_time,
    released,
    renewed,
    taken,
    turn_may_take,
)
from agent.cluster.pull_order import Queue
from agent.cluster.watch import ObjectWatch

LEASES = ("coordination.k8s.io", "v1")


class LaneLost(Exception):
    """This node no longer holds its lane."""


class PullLane:
    def __init__(
        self,
        api: Kube,
        *,
        namespace: str,
        pool: str,
        me: str,
        queue: Queue,
        duration: int = 30,
        skip_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.namespace, self.pool, self.me, self.queue = api, namespace, pool, me, queue
        self.duration = max(1, int(duration))
        # The predecessor takes a free lane within a watch event; twice a lease is long enough
        # to tell it is not coming (down, or not pulling in bounded mode).
        self.skip_after = 2.0 * self.duration if skip_after is None else skip_after
        self.clock = clock
        self.name = lease_name(pool, queue.lane)
        self.collection = namespaced_path(*LEASES, namespace, "leases")
        self.path = f"{self.collection}/{self.name}"
        self.lease: dict[str, Any] | None = None  # the last one this node wrote or read
        self._changed = asyncio.Event()
        self._watch: ObjectWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._seen: tuple[Any, ...] | None = None  # (holder, renewTime) as last observed
        self._seen_at = 0.0
        self.log = structlog.get_logger("prepull-lane").bind(node=me, lane=self.name)

    # -- reading ---------------------------------------------------------------------------
    def _observe(self, lease: dict[str, Any] | None) -> LaneRecord | None:
        record = LaneRecord.of(lease)
        seen = None if record is None else record.seen_as
        if seen != self._seen:
            self._seen, self._seen_at = seen, self.clock()
        return record

    def _expired(self, record: LaneRecord | None) -> bool:
        if record is None or record.holder is None:
            return False
        return self.clock() - self._seen_at > record.duration

    async def _start_watch(self) -> ObjectWatch:
        if self._watch is None:
            self._watch = ObjectWatch(self.api, self.collection, self.name,
                                      on_change=self._changed.set)  # fmt: skip
            self._watch_task = asyncio.create_task(self._watch.run())
        await self._watch.synced.wait()
        return self._watch

    async def close(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        self._watch, self._watch_task = None, None

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self.api.get(self.path)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    # -- taking ----------------------------------------------------------------------------
    async def _write_taken(self, lease: dict[str, Any] | None, record: LaneRecord | None,
                           through: frozenset[int] = frozenset()) -> bool:  # fmt: skip
        body = taken(lease, record, name=self.name, namespace=self.namespace, pool=self.pool,
                     me=self.me, queue=self.queue, duration=self.duration, now=micro_time(),
                     through=through)  # fmt: skip
        try:
            if lease is None:
                self.lease = await self.api.post(self.collection, body)
            else:
                self.lease = await self.api.put(self.path, body)
        except KubeError as exc:
            if exc.conflict:  # another node wrote first (409 Conflict or AlreadyExists)
                return False
            raise
        self._observe(self.lease)
        return True

    async def acquire(self, on_wait: Callable[[Decision], None] = lambda d: None) -> str:
        """Wait until this node may take its lane in the controller's order, and take it;
        returns why it could. A refusal (403: no Role for the Leases) is raised at once, by
        one read, rather than left to the watch's retries."""
        if self._watch is None:
            self._observe(await self._read())
        watch = await self._start_watch()
        blocked_since: float | None = None  # the lane free, yet the predecessor not through
        last_why = ""
        while True:
            self._changed.clear()
            lease = watch.obj
            record = as_read_by(self._observe(lease), self.me, self.queue.target)
            expired = self._expired(record)
            free = record is None or record.holder is None or expired
            if free and blocked_since is None:
                blocked_since = self.clock()
            elif not free:
                blocked_since = None
            skip = blocked_since is not None and self.clock() - blocked_since >= self.skip_after
            decision = decide(record, self.me, self.queue, expired=expired, skip=skip)
            if decision.verdict == Verdict.MINE:
                self.lease = lease
                return decision.why
            if decision.verdict == Verdict.TAKE:
                if await self._write_taken(lease, record, decision.through):
                    self.log.info("lane taken", why=decision.why, rank=self.queue.rank)
                    return decision.why
                await self._wait(1.0)  # lost the race: the watch brings the winner's record
                continue
            if decision.why != last_why:
                on_wait(decision)
                last_why = decision.why
            await self._wait(self._deadline(record, blocked_since))

    def _deadline(self, record: LaneRecord | None, blocked_since: float | None) -> float | None:
        """Seconds until the next thing a timer (not the watch) can change: the holder's
        expiry, or the end of the wait for the predecessor."""
        waits = []
        if record is not None and record.holder is not None:
            waits.append(self._seen_at + record.duration - self.clock() + 0.05)
        if blocked_since is not None:
            waits.append(blocked_since + self.skip_after - self.clock() + 0.05)
        return max(0.0, min(waits)) if waits else None

    async def _wait(self, seconds: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._changed.wait()

    async def try_take(self) -> bool:
        """At the node's turn: the lane if it is free now, no waiting (one read, one write)."""
        lease = await self._read()
        record = self._observe(lease)
        if not turn_may_take(record, self.me, expired=self._expired(record)):
            return False
        if record is not None and record.holder == self.me:
            self.lease = lease
            return True
        return await self._write_taken(lease, record)

    # -- holding ---------------------------------------------------------------------------
    async def keep(self) -> None:
        """Renew every third of the lease until cancelled; LaneLost when the lane went to
        another node or could not be renewed within a lease's time."""
        last_renewed = self.clock()
        while True:
            await asyncio.sleep(self.duration / 3)
            try:
                await self._renew()
                last_renewed = self.clock()
            except LaneLost:
                raise
            except (KubeError, *TRANSIENT) as exc:
                self.log.warning("lane renewal failed", error=str(exc))
                if self.clock() - last_renewed >= self.duration:
                    raise LaneLost(f"{self.name} not renewed for {self.duration} s: "
                                   f"{exc}") from None  # fmt: skip

    async def _renew(self) -> None:
        for _ in range(3):
            lease = self.lease or await self._read()
            record = LaneRecord.of(lease)
            if lease is None or record is None or record.holder != self.me:
                holder = record.holder if record else None
                raise LaneLost(f"{self.name} is held by {holder or 'nobody'} now")
            try:
                self.lease = await self.api.put(self.path, renewed(lease, micro_time()))
                return
            except KubeError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
                self.lease = None  # read again: an annotation changed, or the lane was taken
        raise LaneLost(f"{self.name}: renewal kept conflicting")

    async def release(self, *, passed: bool) -> None:
        """Give the lane back and, when this node is through (its pull is over, or its turn
        came while another node held the lane: it pulls at its turn, out of the queue), say so
        for the nodes after it. Best effort: on failure the hold simply expires (and a mark
        not written is skipped after `skip_after`)."""
        try:
            for _ in range(5):
                lease = await self._read()
                if lease is None:
                    return
                body = released(lease, self.me, self.queue, passed=passed)
                if body is None:
                    return
                try:
                    self.lease = await self.api.put(self.path, body)
                    self.log.info("lane released", passed=passed, rank=self.queue.rank)
                    return
                except KubeError as exc:
                    if not exc.conflict:
                        raise
        except (KubeError, *TRANSIENT) as exc:
            self.log.warning("lane release failed; it expires instead", error=str(exc))
        finally:
            self.lease = None
