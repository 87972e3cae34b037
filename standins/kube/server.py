"""`FakeKube`: the in-process store API served over HTTP, with its lifecycle and test controls.

The store API is store_api.py's `StoreApi`, which `FakeKube` extends with identities, the
request log and injected faults; the HTTP layer is handlers.py, which serves anything of its
`Served` protocol, so that neither module imports this one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from .admission import Admission
from .auth import Identity, RuleLike
from .changes import EndWatch
from .disruption import DisruptionStatusController
from .drain_controller import DrainController
from .errors import ApiError, status_body
from .handlers import build_app
from .request_log import Fault, RequestRecord
from .resources import DEFAULT_RESOURCES, Registry, ResourceType
from .store import Store
from .store_api import StoreApi

if TYPE_CHECKING:
    from agent.cluster.kubeclient import Configuration

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "openshift-machine-config-operator")


_DEFAULT_WATCH_ERRORS = {
    504: ("Timeout", "Too large resource version", "ResourceVersionTooLarge"),
    410: ("Expired", "too old resource version", None),
    500: ("InternalError", "Internal error occurred", None),
}


class FakeKube(StoreApi):
    """A loopback kube-apiserver. See the package docstring for the tour."""

    def __init__(
        self,
        *,
        identities: Iterable[Identity] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        history_size: int = 1000,
        bookmark_interval: float = 1.0,
        default_watch_timeout: float | None = None,
        too_large_rv_wait: float = 3.0,
        evicted_pods_vanish: bool = True,
        pdb_status_controller: bool = True,
        extra_resources: Iterable[ResourceType] = (),
        namespaces: Iterable[str] = DEFAULT_NAMESPACES,
        admission_policy_delay: float = 0.0,
    ) -> None:
        super().__init__(
            Registry([*DEFAULT_RESOURCES, *extra_resources]),
            Store(history_size),
            evicted_pods_vanish=evicted_pods_vanish,
        )
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.too_large_rv_wait = too_large_rv_wait
        self.version_info = {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0-fakekube",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-11-30T00:00:00Z",
            "goVersion": "go1.23.3",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
        # Before any write: the policy plugin must see every policy and binding.
        self.admission = Admission(self.store, self.registry, admission_policy_delay)
        self.admin = Identity.admin()
        self._identities: dict[str, Identity] = {}
        for ident in (self.admin, *identities):
            self.add_identity(ident)
        self._log: list[RequestRecord] = []
        self._faults: list[Fault] = []
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.drain_controller: DrainController | None = None
        if pdb_status_controller:
            self.store.add_hook(DisruptionStatusController(self.store, self.registry))
        for ns in namespaces:
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> FakeKube:
        """Listen on `port` (a free one the first time if 0; the same one after `stop()`)."""
        if self._runner is not None:
            return self
        runner = web.AppRunner(build_app(self), shutdown_timeout=2.0, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self._runner = runner
        self._loop = asyncio.get_running_loop()
        return self

    async def stop(self) -> None:
        """Stop serving; the store (objects, RVs, history) is kept for a later `start()`.
        Open watches are closed without an ERROR event, like a dropped connection."""
        if self._runner is None:
            return
        for watcher in self.store.watchers():
            watcher.notify(EndWatch())
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def restart(self, downtime: float = 0.0) -> None:
        await self.stop()
        if downtime:
            await asyncio.sleep(downtime)
        await self.start()

    async def __aenter__(self) -> FakeKube:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> FakeKube:
        """Serve from a private event loop in a daemon thread (for sync tests, or an agent
        running in a subprocess). Stop with `stop_in_thread()`."""
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="fakekube", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop_in_thread(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop = self._loop
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._thread = None
        loop.close()

    # -- identities -------------------------------------------------------------------------

    def add_identity(self, identity: Identity) -> Identity:
        self._identities[identity.token] = identity
        return identity

    def node_identity(self, node_name: str, rules: Iterable[RuleLike] = ()) -> Identity:
        """Register (or return the existing) `system:node:<node_name>` identity."""
        wanted = Identity.node(node_name, rules)
        for ident in self._identities.values():
            if ident.node_name == node_name and ident.rules == wanted.rules:
                return ident
        return self.add_identity(wanted)

    def service_account(
        self,
        namespace: str,
        name: str,
        rules: Iterable[RuleLike] = (),
        *,
        node: str | None = None,
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> Identity:
        """Register a service-account identity; `node` binds its token to a pod on that node
        (userInfo.extra carries the node, see Identity.service_account)."""
        return self.add_identity(
            Identity.service_account(namespace, name, rules, node=node, extra=extra)
        )

    def identity_for_token(self, token: str) -> Identity | None:
        """The identity a bearer token authenticates (for the HTTP layer); None if unknown."""
        return self._identities.get(token)

    def _identity(self, who: Identity | str | None) -> Identity:
        if who is None:
            return self.admin
        if isinstance(who, Identity):
            return who
        for ident in self._identities.values():
            if ident.user == who:
                return ident
        raise KeyError(f"no identity for user {who!r}")

    def token_for(self, identity: Identity | str | None = None) -> str:
        """Bearer token of an Identity or a user name (default: the admin)."""
        return self._identity(identity).token

    def kubeconfig(self, identity: Identity | str | None = None) -> dict[str, Any]:
        ident = self._identity(identity)
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fakekube", "cluster": {"server": self.url}}],
            "users": [{"name": ident.user, "user": {"token": ident.token}}],
            "contexts": [
                {"name": "fakekube", "context": {"cluster": "fakekube", "user": ident.user}}
            ],
            "current-context": "fakekube",
        }

    def write_kubeconfig(self, path: str | Path, identity: Identity | str | None = None) -> Path:
        """Write a kubeconfig for `identity` (call after `start()`: it embeds the port)."""
        path = Path(path)
        path.write_text(yaml.safe_dump(self.kubeconfig(identity), sort_keys=False))
        return path

    def client_configuration(self, identity: Identity | str | None = None) -> Configuration:
        """A kubernetes_asyncio Configuration talking to this server as `identity`."""
        from agent.cluster.kubeclient import Configuration

        cfg = Configuration(host=self.url)
        cfg.api_key = {"BearerToken": self.token_for(identity)}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    # -- test controls ----------------------------------------------------------------------

    def inject_watch_error(
        self,
        code: int = 504,
        reason: str | None = None,
        message: str | None = None,
        resource: str | None = None,
    ) -> int:
        """End open watches (optionally only those on `resource`) with an ERROR event carrying
        a Status. Defaults per code: 504 Timeout/ResourceVersionTooLarge (what a real
        kube-apiserver v1.32 sent, on an etcd without RequestWatchProgress), 410 Expired.
        Returns how many watches were ended. Thread-safe."""
        d_reason, d_message, cause = _DEFAULT_WATCH_ERRORS.get(code, ("InternalError", "", None))
        details = {"causes": [{"reason": cause, "message": d_message}]} if cause else None
        status = status_body(code, reason or d_reason, message or d_message, details)
        if code == 504:
            status.setdefault("details", {})["retryAfterSeconds"] = 1
        rt = self.resource(resource) if resource else None
        ended = 0
        for watcher in self.store.watchers():
            if rt is None or (watcher.rt.group, watcher.rt.plural) == (rt.group, rt.plural):
                ended += watcher.notify(EndWatch(status))
        return ended

    def open_watches(self, resource: str | None = None) -> int:
        rt = self.resource(resource) if resource else None
        return sum(
            1
            for w in self.store.watchers()
            if rt is None or (w.rt.group, w.rt.plural) == (rt.group, rt.plural)
        )

    async def wait_for_watches(
        self, count: int = 1, resource: str | None = None, timeout: float = 5.0
    ) -> None:
        """Wait until at least `count` watches (on `resource`) are open: inject errors or make
        changes only once the agent is actually watching."""
        deadline = time.monotonic() + timeout
        while self.open_watches(resource) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.open_watches(resource)} watches open, wanted {count}")
            await asyncio.sleep(0.01)

    def expire_history(self) -> None:
        """Compact all watch history: resuming from any RV older than the current one is 410."""
        self.store.expire_history()

    def fail_requests(
        self,
        code: int = 500,
        *,
        reason: str | None = None,
        message: str | None = None,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
        user: str | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` matching requests (after authn/authz) with a Status error;
        `times=-1` means until `clear_faults()`."""
        default_reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                          504: "Timeout", 409: "Conflict"}.get(code, "InternalError")  # fmt: skip
        self._faults.append(
            Fault(
                code,
                reason or default_reason,
                message or f"injected fault ({code})",
                verb,
                resource,
                subresource,
                name,
                user,
                times,
            )
        )

    def clear_faults(self) -> None:
        self._faults.clear()

    def check_faults(self, record: RequestRecord) -> None:
        """Raise the first injected fault that matches `record` (after authn/authz)."""
        for fault in self._faults:
            if fault.matches(record):
                fault.remaining -= 1
                raise ApiError(fault.code, fault.reason, fault.message)

    def record_request(self, request: web.Request) -> RequestRecord:
        """Log a request as it arrives; the HTTP layer fills the record in as it learns more."""
        rec = RequestRecord(request.method, request.path, dict(request.query))
        self._log.append(rec)
        return rec

    @property
    def requests(self) -> list[RequestRecord]:
        """Every request so far (oldest first)."""
        return list(self._log)

    def clear_requests(self) -> None:
        self._log.clear()

    def count_requests(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        user: str | None = None,
        method: str | None = None,
        status: int | None = None,
        name: str | None = None,
    ) -> int:
        """Count logged requests matching every given filter."""
        return sum(
            1
            for r in self._log
            if verb in (None, r.verb)
            and resource in (None, r.resource)
            and subresource in (None, r.subresource)
            and user in (None, r.user)
            and method in (None, r.method)
            and status in (None, r.status)
            and name in (None, r.name)
        )

    def enable_drain_controller(self, delay: float = 0.0, **kwargs: Any) -> DrainController:
        """Start the simulated MCC drain controller (see drain_controller.DrainController)."""
        if self.drain_controller is None:
            self.drain_controller = DrainController(self, delay=delay, **kwargs)
        self.drain_controller.delay = delay
        self.drain_controller.start()
        return self.drain_controller

    def disable_drain_controller(self) -> None:
        if self.drain_controller is not None:
            self.drain_controller.stop()
