"""Writes the own Node's annotations as the MCD does, for both Node agents (cluster and
HyperShift): merge patches retried on conflicts and faults, only what the Node does not say
already (every write wakes the agent's own watch), and staging progress at most every 5 s."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random

from agent.cluster import annotations as A
from agent.cluster.kube import TRANSIENT, Kube, KubeError, node_path
from agent.cluster.watch import ObjectWatch
from agent.host.ports import Progress
from agent.observe.metrics import Metrics


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT) or (
        isinstance(exc, KubeError) and (exc.conflict or exc.status >= 500)
    )


class NodeWriter:
    """The own Node's annotations; what a patch returns feeds the Node's watch at once, so the
    next decision reads the Node as written, not as the watch last delivered it."""

    def __init__(self, api: Kube, node: ObjectWatch, name: str, *, dry_run: bool, log: Any) -> None:
        self.api, self.node, self.name = api, node, name
        self.dry_run, self.log = dry_run, log

    async def patch(self, body: dict[str, Any]) -> None:
        """A merge patch of the own Node, retried on conflicts and transient faults."""
        if self.dry_run:
            self.log.info("dry run: would patch node", patch=body)
            return
        async for attempt in AsyncRetrying(retry=retry_if_exception(_retryable),
                                           wait=wait_random(0.01, 0.2),
                                           stop=stop_after_attempt(8), reraise=True):  # fmt: skip
            with attempt:
                await self.node.observe(await self.api.patch(node_path(self.name), body))

    async def set(self, values: dict[str, str | None]) -> None:
        """`values` (whole annotation keys; None removes one) unless the Node says so already;
        a reason is cut to what the MCD's reason annotation holds."""
        wanted = dict(values)
        if wanted.get(A.REASON):
            wanted[A.REASON] = A.truncate(wanted[A.REASON])
        node = A.NodeView.of(self.node.obj or {})
        if any(node.annotations.get(key) != value for key, value in wanted.items()):
            await self.patch(A.annotations_patch(wanted))


class ProgressReporter:
    """Staging progress ("Staging image: 412/1380 MiB") into the Node's `reason` through
    `report`, at most every `interval` s and never two writes in flight, so that a fast pull
    does not flood the API server. Progress is news, not state: a write the API server misses
    is logged and dropped (the next report, or the Done patch, says more)."""

    def __init__(self, report: Callable[[str], Awaitable[None]], metrics: Metrics, *,
                 enabled: bool, log: Any, interval: float = 5.0) -> None:  # fmt: skip
        self.report, self.metrics = report, metrics
        self.enabled, self.log, self.interval = enabled, log, interval
        self._at = 0.0
        self._task: asyncio.Task[None] | None = None

    def __call__(self, progress: Progress) -> None:
        self.metrics.record_progress(progress)
        now = asyncio.get_running_loop().time()
        busy = self._task is not None and not self._task.done()
        if busy or now - self._at < self.interval or not self.enabled:
            return
        self._at = now
        self._task = asyncio.create_task(self._send(progress.render()))

    async def _send(self, reason: str) -> None:
        try:
            await self.report(reason)
        except (KubeError, *TRANSIENT) as exc:
            self.log.warning("staging progress not reported", error=str(exc))

    async def close(self) -> None:
        """Cancel a write still in flight."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
