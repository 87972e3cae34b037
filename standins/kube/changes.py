"""Committed writes (`Change`) and the watchers they reach, as the watch cache translates them.

A watcher lives on an event loop; the store, which may be written from any thread, hands it
each change with `call_soon_threadsafe`, which keeps the per-watcher order."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any

from .resources import ResourceType
from .selectors import Selector

Obj = dict[str, Any]


@dataclass(frozen=True)
class Change:
    """One committed write: what watchers and hooks see."""

    type: str  # ADDED, MODIFIED or DELETED
    rt: ResourceType
    obj: Obj  # new state; for DELETED the last state, carrying the deletion's resourceVersion
    old: Obj | None
    rv: int


@dataclass(frozen=True)
class EndWatch:
    """Queued to a watcher to end its stream, optionally with an ERROR event first."""

    status: dict[str, Any] | None = None


class Watcher:
    """A registered watch. Events and a progress marker arrive on `queue` in commit order."""

    def __init__(
        self,
        rt: ResourceType,
        namespace: str | None,
        selector: Selector,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.rt = rt
        self.namespace = namespace
        self.selector = selector
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        # Highest RV whose change (matching or not) has been queued; bookmarks may only report
        # an RV once every event up to it is in the queue, so it is advanced on the loop.
        self.progress_rv = 0

    def translate(self, ch: Change) -> tuple[str, Obj] | None:
        """Map a store change to the event this watch must see, as the watch cache does:
        an object that starts matching the selector is ADDED, one that stops is DELETED."""
        if (ch.rt.group, ch.rt.plural) != (self.rt.group, self.rt.plural):
            return None
        if self.namespace and ch.obj["metadata"].get("namespace") != self.namespace:
            return None
        now = self.selector.matches(ch.obj)
        if ch.type != "MODIFIED":
            return (ch.type, ch.obj) if now else None
        before = ch.old is not None and self.selector.matches(ch.old)
        if now:
            return ("MODIFIED" if before else "ADDED", ch.obj)
        if before and ch.old is not None:
            gone = copy.deepcopy(ch.old)
            gone["metadata"]["resourceVersion"] = str(ch.rv)
            return ("DELETED", gone)
        return None

    def deliver(self, event: Any, rv: int) -> None:
        """Runs on the watcher's loop."""
        if event is not None:
            self.queue.put_nowait(event)
        self.progress_rv = max(self.progress_rv, rv)

    def notify(self, event: Any, rv: int = 0) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.deliver, event, rv)
        except RuntimeError:  # loop closed: the watch is gone
            return False
        return True
