"""`StoreApi`: the objects by kind and name, read and written in-process, with no HTTP.

No authentication, authorization or admission either: this is how tests set a cluster up and
how the controller stand-ins (drain, render, node) act on it. `FakeKube` (server.py) is a
`StoreApi` that also serves it over HTTP; the controllers depend on this class only, so they
never import the server that starts them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from .changes import Change, Obj
from .patch import MERGE_PATCH
from .resources import Registry, ResourceType
from .selectors import Selector
from .store import Store


class StoreApi:
    """The in-process store API over `store`, naming kinds as `registry` resolves them."""

    def __init__(self, registry: Registry, store: Store, *, evicted_pods_vanish: bool) -> None:
        self.registry = registry
        self.store = store
        # Read by whatever evicts (the HTTP layer, the drain controller): see FakeKube.
        self.evicted_pods_vanish = evicted_pods_vanish
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop serving HTTP (for `asyncio.run_coroutine_threadsafe` from other threads);
        None until the server first starts."""
        return self._loop

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
