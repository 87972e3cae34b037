"""The loop the controller stand-ins share: a store hook that wakes on writes to the resources
a controller watches, and one `sync()` at a time on the caller's event loop, with the writes
that arrive during a sync coalesced into one more (as a controller's workqueue coalesces a
key's events)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from .changes import Change

if TYPE_CHECKING:
    from .store_api import StoreApi


class Reconciler:
    watched: frozenset[str] = frozenset()  # resource plurals whose writes wake a sync

    def __init__(self, kube: StoreApi, *, delay: float = 0.0) -> None:
        self.kube = kube
        self.delay = delay  # seconds between a wake and the sync (the real ones batch events)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._dirty = False
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def sync(self) -> None:
        raise NotImplementedError

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin reacting, with a first sync at once; must know a running loop."""
        self._loop = loop or self.kube.loop or asyncio.get_running_loop()
        if not self._active:
            self.kube.add_hook(self._on_change)
            self._active = True
            self._schedule()

    def stop(self) -> None:
        self.kube.remove_hook(self._on_change)
        self._active = False
        if self._task is not None:
            self._task.cancel()

    def _on_change(self, change: Change) -> None:
        if change.rt.plural in self.watched:
            self._schedule()

    def _schedule(self) -> None:
        assert self._loop is not None
        # Hooks run in the writer's thread; the sync runs on our loop.
        with contextlib.suppress(RuntimeError):  # loop closed: nothing left to sync for
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())  # type: ignore[union-attr]

    async def _run(self) -> None:
        while self._dirty and self._active:
            self._dirty = False
            if self.delay:
                await asyncio.sleep(self.delay)
            self.sync()

    async def idle(self) -> None:
        """Until no sync is pending."""
        await asyncio.sleep(0)
        while self._task is not None and not self._task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(self._task, return_exceptions=True)
            await asyncio.sleep(0)
