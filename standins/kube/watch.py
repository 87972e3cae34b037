"""Streaming `?watch=1` responses: newline-delimited JSON events over a chunked 200 response."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any, Protocol

from aiohttp import web

from .changes import EndWatch
from .errors import ApiError
from .request_log import RequestRecord
from .resources import ResourceType
from .selectors import Selector
from .store import Store

TRUTHY = ("1", "true", "True")


class Watched(Protocol):
    """What a watch reads of the server that serves it (FakeKube): its store and its watch
    settings. A protocol, so that this module never imports the server, which imports it."""

    store: Store
    bookmark_interval: float
    default_watch_timeout: float | None
    too_large_rv_wait: float


def _line(event_type: str, obj: dict[str, Any]) -> bytes:
    return (json.dumps({"type": event_type, "object": obj}, separators=(",", ":")) + "\n").encode()


def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}


async def wait_for_rv(kube: Watched, rv: int) -> None:
    """A too-new RV: the real watch cache waits ~3 s to catch up, then gives 504."""
    deadline = asyncio.get_running_loop().time() + kube.too_large_rv_wait
    while kube.store.resource_version < rv:
        if asyncio.get_running_loop().time() >= deadline:
            raise ApiError(
                504,
                "Timeout",
                f"Too large resource version: {rv}, current: {kube.store.resource_version}",
                {
                    "causes": [
                        {
                            "reason": "ResourceVersionTooLarge",
                            "message": "Too large resource version",
                        }
                    ],
                    "retryAfterSeconds": 1,
                },
            )
        await asyncio.sleep(0.05)


async def serve_watch(
    kube: Watched,
    request: web.Request,
    record: RequestRecord,
    rt: ResourceType,
    namespace: str | None,
    selector: Selector,
) -> web.StreamResponse:
    q = request.query
    rv_param = q.get("resourceVersion", "")
    send_initial = q.get("sendInitialEvents") in TRUTHY
    since: int | None = None
    if rv_param not in ("", "0") and not send_initial:
        try:
            since = int(rv_param)
        except ValueError:
            raise ApiError.bad_request(f"invalid resource version: {rv_param!r}") from None
        await wait_for_rv(kube, since)
    timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else kube.default_watch_timeout
    bookmarks = q.get("allowWatchBookmarks") in TRUTHY

    resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    loop = asyncio.get_running_loop()
    try:
        initial, watcher, start_rv = kube.store.register_watch(rt, namespace, selector, since, loop)
    except ApiError as err:
        # Like the real server: the stream opens with 200 and carries a single ERROR event.
        await resp.prepare(request)
        record.status = 200
        await resp.write(_line("ERROR", err.status()))
        await resp.write_eof()
        return resp

    await resp.prepare(request)
    record.status = 200
    deadline = loop.time() + timeout if timeout else None
    next_bookmark = loop.time() + kube.bookmark_interval
    try:
        for event_type, obj in initial:
            await resp.write(_line(event_type, obj))
        if send_initial:
            await resp.write(_line("BOOKMARK", _bookmark(rt, start_rv, initial_end=True)))
        while True:
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            # Wake at least once a second to notice clients that went away.
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - now)
            if bookmarks:
                wait = min(wait, max(0.0, next_bookmark - now))
            try:
                item = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    break
                if bookmarks and loop.time() >= next_bookmark:
                    # The queue is empty, so every change up to progress_rv has been sent.
                    await resp.write(_line("BOOKMARK", _bookmark(rt, watcher.progress_rv)))
                    next_bookmark = loop.time() + kube.bookmark_interval
                continue
            if isinstance(item, EndWatch):
                if item.status is not None:
                    await resp.write(_line("ERROR", item.status))
                break
            await resp.write(_line(*item))
    except (ConnectionError, RuntimeError):
        pass  # client went away mid-write
    finally:
        kube.store.unregister_watch(watcher)
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write_eof()
    return resp
