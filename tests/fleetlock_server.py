"""A FleetLock lock manager on 127.0.0.1 for tests: per group a counting semaphore of owned,
recursive locks (the protocol's RecursiveLock / UnlockIfHeld), plus faults on demand.

    async with FleetLockServer(slots={"workers": 2}) as base_url:
        ...  # base_url ends with "/"; server.records, server.holders, ...

Errors follow the protocol's `{"kind", "value"}` shape: 400 `failed_bad_request` for a request
that breaks it, 409 `failed_lock_semaphore_full` (the protocol document's example kind; airlock
answers 500 `failed_lock` there) when every slot of the group is held by someone else."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

GROUP = re.compile(r"[a-zA-Z0-9.-]+")


@dataclass(frozen=True)
class Record:
    api: str  # "pre-reboot" | "steady-state"
    id: str | None
    group: str | None
    status: int
    kind: str = ""  # the error kind answered, "" on success or a fault


class FleetLockServer:
    def __init__(self, slots: dict[str, int] | None = None, *, default_slots: int = 1,
                 prefix: str = "/") -> None:  # fmt: skip
        self.slots = dict(slots or {})
        self.default_slots = default_slots
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.holders: dict[str, list[str]] = defaultdict(list)  # group -> ids, in lock order
        self.max_concurrent_holders: dict[str, int] = defaultdict(int)
        self.records: list[Record] = []
        self.delay = 0.0  # seconds every handler sleeps first: for client timeouts
        self.silent: set[str] = set()  # apis whose requests are read and never answered
        self._stopping = asyncio.Event()
        self._faults: list[int] = []  # statuses answered, non-JSON, to the next requests
        self._redirects: list[str] = []  # Location answered with 307 to the next requests
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # -- control ---------------------------------------------------------------------------

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next `count` requests with `status` and a body that is not JSON."""
        self._faults.extend([status] * count)

    def redirect_next(self, location: str, count: int = 1) -> None:
        """Answer the next `count` requests with a 307 to `location`."""
        self._redirects.extend([location] * count)

    def set_slots(self, group: str, slots: int) -> None:
        self.slots[group] = slots

    def calls(self, api: str | None = None) -> list[Record]:
        return [r for r in self.records if api is None or r.api == api]

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> str:
        app = web.Application()
        for api in ("pre-reboot", "steady-state"):
            app.router.add_post(f"{self.prefix}v1/{api}", self._handler(api))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}{self.prefix}"
        return self.base_url

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        self._stopping.set()  # ends the handlers that never answer, or cleanup waits for them
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the protocol ----------------------------------------------------------------------

    def _handler(self, api: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            if self.delay:
                await asyncio.sleep(self.delay)
            if api in self.silent:
                await request.read()
                self.records.append(Record(api, None, None, 0, "unanswered"))
                await self._stopping.wait()  # the client gives up first; then the server stops
                return web.Response(status=503)
            if self._redirects:
                self.records.append(Record(api, None, None, 307))
                raise web.HTTPTemporaryRedirect(self._redirects.pop(0))
            if self._faults:
                status = self._faults.pop(0)
                self.records.append(Record(api, None, None, status))
                return web.Response(status=status, text="lock manager on fire\n")
            ident, group, problem = await self._parse(request)
            if problem:
                return self._error(api, ident, group, 400, "failed_bad_request", problem)
            assert ident is not None and group is not None
            if api == "pre-reboot":
                return self._lock(ident, group)
            if ident in self.holders[group]:
                self.holders[group].remove(ident)
            return self._ok(api, ident, group)

        return handle

    async def _parse(self, request: web.Request) -> tuple[str | None, str | None, str]:
        if request.headers.get("fleet-lock-protocol") != "true":
            return None, None, "missing or wrong fleet-lock-protocol header"
        try:
            params = json.loads(await request.read())["client_params"]
            ident, group = params.get("id"), params.get("group")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None, None, "body is not JSON with client_params"
        if not isinstance(ident, str) or not ident:
            return None, group if isinstance(group, str) else None, "missing client id"
        if not isinstance(group, str) or not GROUP.fullmatch(group):
            return ident, None, "missing group or group not matching ^[a-zA-Z0-9.-]+$"
        return ident, group, ""

    def _lock(self, ident: str, group: str) -> web.Response:
        held = self.holders[group]
        if ident not in held:
            if len(held) >= self.slots.get(group, self.default_slots):
                full = "semaphore currently full, all slots are locked already"
                return self._error("pre-reboot", ident, group, 409, "failed_lock_semaphore_full",
                                   full)  # fmt: skip
            held.append(ident)
            self.max_concurrent_holders[group] = max(self.max_concurrent_holders[group], len(held))
        return self._ok("pre-reboot", ident, group)

    def _ok(self, api: str, ident: str, group: str) -> web.Response:
        self.records.append(Record(api, ident, group, 200))
        return web.Response(status=200)

    def _error(self, api: str, ident: str | None, group: str | None, status: int, kind: str,
               value: str) -> web.Response:  # fmt: skip
        self.records.append(Record(api, ident, group, status, kind))
        return web.json_response({"kind": kind, "value": value}, status=status)
