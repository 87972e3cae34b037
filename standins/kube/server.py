"""`FakeKube`: lifecycle, identities, in-process store API and test controls."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from .admission import Admission
from .auth import Identity, RuleLike
from .disruption import DisruptionStatusController
from .errors import ApiError, status_body
from .patch import MERGE_PATCH
from .resources import DEFAULT_RESOURCES, Registry, ResourceType
from .selectors import Selector
from .store import Change, Obj, Store
from .watch import EndWatch

if TYPE_CHECKING:
    from agent.cluster.kubeclient import Configuration

    from .drain_controller import DrainController

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "openshift-machine-config-operator")


@dataclass
class RequestRecord:
    """One HTTP request as seen by the server (status is filled in when known; for a watch,
    when the stream opens)."""

    method: str
    path: str
    query: dict[str, str]
    user: str | None = None
    status: int | None = None
    verb: str | None = None  # Kubernetes verb: get, list, watch, create, update, patch, delete
    resource: str | None = None  # plural, e.g. "nodes"
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    time: float = field(default_factory=time.time)
    # The raw body of a write (POST, PUT, PATCH, DELETE; b"" when it had none), as received:
    # a write that changed nothing leaves no trace in the store, only here.
    body: bytes | None = None

    def json(self) -> Any:
        """The body decoded as JSON; None for a read, an empty body or one that is not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass
class _Fault:
    code: int
    reason: str
    message: str
    verb: str | None
    resource: str | None
    subresource: str | None
    name: str | None
    user: str | None
    remaining: int

    def matches(self, r: RequestRecord) -> bool:
        return (
            self.remaining != 0
            and self.verb in (None, r.verb)
            and self.resource in (None, r.resource)
            and self.subresource in (None, r.subresource)
            and self.name in (None, r.name)
            and self.user in (None, r.user)
        )


_DEFAULT_WATCH_ERRORS = {
    504: ("Timeout", "Too large resource version", "ResourceVersionTooLarge"),
    410: ("Expired", "too old resource version", None),
    500: ("InternalError", "Internal error occurred", None),
}


class FakeKube:
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
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.too_large_rv_wait = too_large_rv_wait
        self.evicted_pods_vanish = evicted_pods_vanish
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
        self.registry = Registry([*DEFAULT_RESOURCES, *extra_resources])
        self.store = Store(history_size)
        # Before any write: the policy plugin must see every policy and binding.
        self.admission = Admission(self.store, self.registry, admission_policy_delay)
        self.admin = Identity.admin()
        self._identities: dict[str, Identity] = {}
        for ident in (self.admin, *identities):
            self.add_identity(ident)
        self._log: list[RequestRecord] = []
        self._faults: list[_Fault] = []
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
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

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop serving HTTP (for `asyncio.run_coroutine_threadsafe` from other threads)."""
        return self._loop

    async def start(self) -> FakeKube:
        """Listen on `port` (a free one the first time if 0; the same one after `stop()`)."""
        from .handlers import build_app

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

    def _identity_for_token(self, token: str) -> Identity | None:
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

    # -- in-process store API ---------------------------------------------------------------

    def resource(self, kind: str | ResourceType, api_version: str | None = None) -> ResourceType:
        return self.registry.resolve(kind, api_version)

    def put(self, obj: Obj) -> Obj:
        """Create or replace `obj` (dict with apiVersion/kind/metadata), status included.
        A missing namespace is created. Returns the stored object."""
        rt = self.resource(obj["kind"], obj.get("apiVersion"))
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") if rt.namespaced else None
        if rt.namespaced:
            ns = ns or "default"
            ns_rt = self.resource("namespaces")
            if self.store.try_get(ns_rt, ns) is None:
                self.store.create(ns_rt, {"metadata": {"name": ns}})
        body = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
        with self.store.lock:
            if self.store.try_get(rt, meta.get("name", ""), ns) is None:
                return self.store.create(rt, body, ns, keep_status=True)
            self.store.update(rt, body, ns)
            if "status" in rt.subresources:
                self.store.update(rt, body, ns, subresource="status")
            return self.store.get(rt, meta["name"], ns)

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        """Raises ApiError(404) when missing; see `try_get`."""
        return self.store.get(self.resource(kind), name, namespace)

    def try_get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return self.store.try_get(self.resource(kind), name, namespace)

    def list(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        rt = self.resource(kind)
        return self.store.list(rt, namespace, Selector.parse(rt, label_selector, field_selector))[0]

    def patch(
        self,
        kind: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = MERGE_PATCH,
        subresource: str | None = None,
    ) -> Obj:
        """`patch_type`: a media type or "merge" / "strategic" / "json"."""
        rt = self.resource(kind)
        return self.store.patch(rt, name, patch, patch_type, namespace, subresource=subresource)

    def patch_annotations(
        self, kind: str, name: str, annotations: dict[str, str | None], namespace: str | None = None
    ) -> Obj:
        """Set annotations (None removes one) with a merge patch."""
        return self.patch(
            kind, name, {"metadata": {"annotations": annotations}}, namespace=namespace
        )

    def patch_labels(
        self, kind: str, name: str, labels: dict[str, str | None], namespace: str | None = None
    ) -> Obj:
        return self.patch(kind, name, {"metadata": {"labels": labels}}, namespace=namespace)

    def patch_status(
        self, kind: str, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> Obj:
        """Merge-patch .status (through the status subresource when the type has one)."""
        rt = self.resource(kind)
        sub = "status" if "status" in rt.subresources else None
        return self.store.patch(
            rt, name, {"status": status}, MERGE_PATCH, namespace, subresource=sub
        )

    def mutate(
        self,
        kind: str,
        name: str,
        fn: Callable[[Obj], Obj | None],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        """Read-modify-write; `fn` edits the object in place or returns a replacement."""
        return self.store.mutate(self.resource(kind), name, fn, namespace, subresource=subresource)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> Obj:
        """Delete immediately (a force delete; finalizers still hold the object)."""
        return self.store.delete(self.resource(kind), name, namespace, immediate=True)[0]

    async def wait_for(
        self,
        kind: str,
        name: str,
        predicate: Callable[[Obj | None], bool],
        namespace: str | None = None,
        timeout: float = 5.0,
    ) -> Obj | None:
        """Poll until `predicate(obj or None)` holds; raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.try_get(kind, name, namespace)
            if predicate(obj):
                return obj
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{kind} {name}: condition not met within {timeout}s: {obj}")
            await asyncio.sleep(0.02)

    def add_hook(self, fn: Callable[[Change], None]) -> None:
        """`fn(change)` runs (in the writer's thread) after every committed write."""
        self.store.add_hook(fn)

    def remove_hook(self, fn: Callable[[Change], None]) -> None:
        self.store.remove_hook(fn)

    # -- test controls ----------------------------------------------------------------------

    def inject_watch_error(
        self,
        code: int = 504,
        reason: str | None = None,
        message: str | None = None,
        resource: str | None = None,
    ) -> int:
        """End open watches (optionally only those on `resource`) with an ERROR event carrying
        a Status. Defaults per code: 504 Timeout/ResourceVersionTooLarge (what the reference
        server did), 410 Expired. Returns how many watches were ended. Thread-safe."""
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
            _Fault(
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

    def _check_faults(self, record: RequestRecord) -> None:
        for fault in self._faults:
            if fault.matches(record):
                fault.remaining -= 1
                raise ApiError(fault.code, fault.reason, fault.message)

    def _record(self, request: web.Request) -> RequestRecord:
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
        from .drain_controller import DrainController

        if self.drain_controller is None:
            self.drain_controller = DrainController(self, delay=delay, **kwargs)
        self.drain_controller.delay = delay
        self.drain_controller.start()
        return self.drain_controller

    def disable_drain_controller(self) -> None:
        if self.drain_controller is not None:
            self.drain_controller.stop()
