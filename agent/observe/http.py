"""The agent's HTTP endpoints (aiohttp), on 127.0.0.1 by default: `/healthz` (the event loop
answers), `/readyz` (the first reconcile finished), `/metrics` (Prometheus), `/status` (JSON:
state, phase, images, last error)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web

from agent.observe.metrics import Metrics


@dataclass
class StatusBoard:
    """What the agent last reported; the HTTP endpoints read it."""

    metrics: Metrics = field(default_factory=Metrics)
    ready: bool = False
    status: dict[str, Any] = field(default_factory=dict)
    bootc: dict[str, Any] | None = None  # what the host's bootc can do, probed at start

    def publish_bootc(self, bootc: dict[str, Any]) -> None:
        self.bootc = bootc
        self.metrics.record_capabilities(bootc["capabilities"])

    def document(self) -> dict[str, Any]:
        """The /status document: the last report, and the bootc it was made with."""
        return {**self.status, "bootc": self.bootc} if self.bootc is not None else self.status

    def publish(self, status: dict[str, Any]) -> None:
        self.status = status
        self.ready = True
        self.metrics.record_state(str(status.get("state", "")), str(status.get("reason", "")))
        if status.get("phase"):
            self.metrics.record_phase(str(status["phase"]))


def make_app(board: StatusBoard) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(status=200 if board.ready else 503,
                            text="ready\n" if board.ready else "not ready\n")  # fmt: skip

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=board.metrics.render(),
                            content_type="text/plain", charset="utf-8")  # fmt: skip

    async def status(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(board.document(), indent=1) + "\n",
                            content_type="application/json")  # fmt: skip

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app


async def serve(board: StatusBoard, listen: str) -> web.AppRunner | None:
    """Start the endpoints on HOST:PORT; None (and a warning) when the address is taken: the
    endpoints are for people and scrapers, never a reason to stop updating a node."""
    if not listen:
        return None
    host, _, port = listen.rpartition(":")
    runner = web.AppRunner(make_app(board), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()
    except OSError as exc:
        structlog.get_logger("http").warning("endpoints not served", listen=listen, error=str(exc))
        await runner.cleanup()
        return None
    return runner
