"""One object kept current by list + watch: resume from the last resourceVersion, bookmarks,
relist on 410 Gone or an ERROR event, reconnect with exponential backoff and jitter, never give
up (an answer that is not the JSON the API promises is one more fault to retry with backoff,
never the end of the watch). Waiters are woken by the watch, never by polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential, wait_random

from agent.cluster.kube import Kube, KubeError


class _Relist(Exception):
    """The watch cannot resume (410 Gone, or an ERROR event): list again."""


class _Malformed(Exception):
    """An answer that is not the JSON the API promises: list and watch again after backoff."""


class ObjectWatch:
    def __init__(
        self,
        kube: Kube,
        collection: str,
        name: str,
        *,
        on_change: Callable[[], None] | None = None,
        max_backoff: float = 30.0,
    ) -> None:
        self.kube = kube
        self._on_change = on_change
        self.collection = collection  # e.g. /api/v1/nodes
        self.name = name
        self.obj: dict[str, Any] | None = None
        self.missing = False  # listed, and the object does not exist
        self.synced = asyncio.Event()
        self._changed = asyncio.Condition()
        self._rv: str | None = None
        self._max_backoff = max_backoff
        self.log = structlog.get_logger("watch").bind(collection=collection, name=name)

    async def _set(self, obj: dict[str, Any] | None, notify: bool = True) -> None:
        async with self._changed:
            self.obj, self.missing = obj, obj is None
            self.synced.set()
            self._changed.notify_all()
        if notify and self._on_change is not None:
            self._on_change()

    @staticmethod
    def _version(obj: dict[str, Any] | None) -> int:
        try:
            return int((obj or {}).get("metadata", {}).get("resourceVersion") or 0)
        except ValueError:
            return 0

    async def observe(self, obj: dict[str, Any]) -> None:
        """Take the object our own write returned, when newer than what the watch delivered:
        the next decision must not act on the state from before that write."""
        if self._version(obj) > self._version(self.obj):
            await self._set(obj, notify=False)

    async def _list(self) -> None:
        listing = await self.kube.get(self.collection, fieldSelector=f"metadata.name={self.name}")
        if not isinstance(listing, dict):
            raise _Malformed(f"malformed list answer from {self.collection}")
        meta, items = listing.get("metadata"), listing.get("items") or []
        if (
            not isinstance(meta, dict | None)
            or not isinstance(items, list)
            or not all(isinstance(item, dict) for item in items)
        ):
            raise _Malformed(f"malformed list answer from {self.collection}")
        self._rv = (meta or {}).get("resourceVersion")
        await self._set(items[0] if items else None)

    async def _watch(self) -> None:
        query = [("fieldSelector", f"metadata.name={self.name}")]
        if self._rv:
            query.append(("resourceVersion", self._rv))
        try:
            async for event in self.kube.watch(self.collection, query):
                if not isinstance(event, dict) or not isinstance(event.get("object") or {}, dict):
                    raise _Malformed(f"malformed watch event from {self.collection}")
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise _Relist(f"ERROR event: {obj.get('code')} {obj.get('message', '')}")
                self._rv = obj.get("metadata", {}).get("resourceVersion") or self._rv
                if kind in ("ADDED", "MODIFIED"):
                    # An event older than the object our own write returned (observe) would
                    # roll the cache back. resourceVersions are etcd revisions: comparable.
                    if self._version(obj) >= self._version(self.obj):
                        await self._set(obj)
                elif kind == "DELETED":
                    await self._set(None)
        except KubeError as exc:
            if exc.status == 410:
                raise _Relist("410 Gone") from None
            raise
        except ValueError:  # a line that is no JSON
            raise _Malformed(f"malformed watch event from {self.collection}") from None

    async def _session(self) -> None:
        """List once, then watch (resuming) until the watch can no longer resume."""
        await self._list()
        while True:
            try:
                await self._watch()  # the server ended the stream: resume from the last RV
            except _Relist as why:
                self.log.info("relisting", why=str(why))
                self._rv = None
                await self._list()

    async def run(self) -> None:
        """Forever; API faults (and malformed answers) only delay it."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=0.1, max=self._max_backoff) + wait_random(0, 0.5),
            before_sleep=lambda state: self.log.warning(
                "watch failed; retrying",
                error=str(state.outcome.exception()),
                attempt=state.attempt_number,
            ),
            reraise=True,
        )
        while True:
            async for attempt in retrying:
                with attempt:
                    await self._session()

    async def wait_for(
        self, predicate: Callable[[dict[str, Any] | None], bool], timeout: float | None = None
    ) -> dict[str, Any] | None:
        """The object once `predicate` holds for it; TimeoutError after `timeout`."""
        await self.synced.wait()
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.obj))
            return self.obj

    async def next_change(self, seen: dict[str, Any] | None) -> dict[str, Any] | None:
        return await self.wait_for(lambda obj: obj is not seen)


class NamedWatch:
    """One object of a collection whose name changes over time (the rendered config a Node or
    a pool names, the Node's pool): one ObjectWatch at a time, replaced when the name does."""

    def __init__(
        self, kube: Kube, collection: str, on_change: Callable[[], None] | None = None
    ) -> None:
        self.kube, self.collection, self._on_change = kube, collection, on_change
        self.watch: ObjectWatch | None = None
        self._task: asyncio.Task[None] | None = None

    def follow(self, name: str) -> ObjectWatch:
        """The watch of `name`, started (and the previous one stopped) when it is new."""
        if self.watch is None or self.watch.name != name:
            self.stop()
            self.watch = ObjectWatch(self.kube, self.collection, name, on_change=self._on_change)
            self._task = asyncio.create_task(self.watch.run())
        return self.watch

    async def get(self, name: str) -> dict[str, Any] | None:
        """The object named `name` once listed (None: it does not exist)."""
        watch = self.follow(name)
        await watch.synced.wait()
        return watch.obj

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.watch, self._task = None, None

    async def close(self) -> None:
        task = self._task
        self.stop()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
