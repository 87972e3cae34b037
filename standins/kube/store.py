"""In-memory object store with etcd-like resource versions, watch history and hooks.

All public methods are synchronous and guarded by one re-entrant lock, so tests may call them
from the server's event loop or from another thread. Watchers (changes.py) live on an event
loop; what a create or an update may set is the registry's strategy (strategy.py).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .changes import Change, Obj, Watcher
from .errors import ApiError
from .patch import apply_patch
from .resources import ResourceType
from .selectors import Selector
from .strategy import check_preconditions, now_rfc3339, prepare_create, prepare_update

Key = tuple[str, str, str, str]  # group, plural, namespace ("" if cluster-scoped), name
# Admission of a write through the API (admission.py): called with the operation ("CREATE" or
# "UPDATE"), the object as it would be stored and the stored one (None on CREATE), after the
# strategy prepared it and before it is committed or found to be a no-op; it may change the
# object or raise ApiError.
Admit = Callable[[str, Obj, Obj | None], None]


def _key(rt: ResourceType, name: str, namespace: str | None) -> Key:
    return (rt.group, rt.plural, (namespace or "") if rt.namespaced else "", name)


class Store:
    def __init__(self, history_size: int = 1000) -> None:
        self.lock = threading.RLock()
        self._objects: dict[Key, Obj] = {}
        self._rv = 1
        self._history: deque[Change] = deque()
        self._history_size = history_size
        # RVs <= this may have had changes we no longer retain: watching from them is 410.
        self._compacted_rv = 0
        self._watchers: set[Watcher] = set()
        self._hooks: list[Callable[[Change], None]] = []

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def compacted_rv(self) -> int:
        return self._compacted_rv

    def add_hook(self, fn: Callable[[Change], None]) -> None:
        """`fn(change)` runs in the writing thread after every committed write."""
        self._hooks.append(fn)

    def remove_hook(self, fn: Callable[[Change], None]) -> None:
        if fn in self._hooks:
            self._hooks.remove(fn)

    def _commit(self, type_: str, rt: ResourceType, key: Key, obj: Obj, old: Obj | None) -> Change:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if type_ == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        change = Change(
            type_, rt, copy.deepcopy(obj), copy.deepcopy(old) if old else None, self._rv
        )
        if len(self._history) >= self._history_size:
            self._compacted_rv = self._history.popleft().rv
        self._history.append(change)
        for w in list(self._watchers):
            if not w.notify(w.translate(change), change.rv):
                self._watchers.discard(w)
        return change

    def _run_hooks(self, changes: list[Change]) -> None:
        for ch in changes:
            for hook in list(self._hooks):
                hook(ch)

    def _existing(self, rt: ResourceType, name: str, namespace: str | None) -> tuple[Key, Obj]:
        key = _key(rt, name, namespace)
        obj = self._objects.get(key)
        if obj is None:
            raise ApiError.not_found(rt, name)
        return key, obj

    # -- reads ------------------------------------------------------------------------------

    def get(self, rt: ResourceType, name: str, namespace: str | None = None) -> Obj:
        with self.lock:
            return copy.deepcopy(self._existing(rt, name, namespace)[1])

    def try_get(self, rt: ResourceType, name: str, namespace: str | None = None) -> Obj | None:
        with self.lock:
            obj = self._objects.get(_key(rt, name, namespace))
            return copy.deepcopy(obj) if obj else None

    def list(
        self, rt: ResourceType, namespace: str | None = None, selector: Selector | None = None
    ) -> tuple[list[Obj], int]:
        """Matching objects sorted by (namespace, name), and the RV of this snapshot."""
        with self.lock:
            items = [
                copy.deepcopy(obj)
                for (group, plural, ns, _), obj in sorted(self._objects.items())
                if (group, plural) == (rt.group, rt.plural)
                and (not namespace or not rt.namespaced or ns == namespace)
                and (selector is None or selector.matches(obj))
            ]
            return items, self._rv

    # -- writes -----------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        obj: Obj,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        keep_status: bool = False,
        admit: Admit | None = None,
    ) -> Obj:
        obj = prepare_create(rt, obj, namespace, keep_status=keep_status)
        meta = obj["metadata"]
        name = meta["name"]
        if admit is not None:  # before the AlreadyExists check, as the real registry orders it
            admit("CREATE", obj, None)
        with self.lock:
            key = _key(rt, name, meta.get("namespace"))
            if key in self._objects:
                raise ApiError.already_exists(rt, name)
            if dry_run:
                meta["resourceVersion"] = ""
                return obj
            change = self._commit("ADDED", rt, key, obj, None)
        self._run_hooks([change])
        return copy.deepcopy(change.obj)

    def _write(
        self,
        rt: ResourceType,
        name: str,
        namespace: str | None,
        build: Callable[[Obj], Obj],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        admit: Admit | None = None,
    ) -> tuple[Obj, list[Change]]:
        """Read-modify-write under the lock; `build(current)` returns the desired object and
        raises ApiError for conflicts. Returns the stored object and the committed changes."""
        with self.lock:
            key, current = self._existing(rt, name, namespace)
            desired = build(copy.deepcopy(current))
            result = prepare_update(rt, current, desired, subresource)
            if admit is not None:  # a no-op update is admitted (or refused) all the same
                admit("UPDATE", result, copy.deepcopy(current))
            if result == current or dry_run:
                # No-op writes keep the RV and emit no event, like the real apiserver.
                return copy.deepcopy(result), []
            changes = [self._commit("MODIFIED", rt, key, result, current)]
            m = result["metadata"]
            # Last finalizer removed from an object being deleted: it goes away now.
            if (
                m.get("deletionTimestamp")
                and not m.get("finalizers")
                and m.get("deletionGracePeriodSeconds", 0) == 0
            ):
                changes.append(self._commit("DELETED", rt, key, copy.deepcopy(result), result))
            return copy.deepcopy(changes[-1].obj), changes

    def update(
        self,
        rt: ResourceType,
        obj: Obj,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        admit: Admit | None = None,
    ) -> Obj:
        """PUT semantics: a body RV must match the stored one (409 otherwise); no RV means an
        unconditional update. A PUT that creates is a CREATE for admission."""
        name = obj.get("metadata", {}).get("name", "")

        def build(current: Obj) -> Obj:
            check_preconditions(rt, current, obj.get("metadata") or {})
            return obj

        with self.lock:
            if (
                rt.create_on_update
                and self.try_get(rt, name, namespace) is None
                and not subresource
            ):
                return self.create(rt, obj, namespace, dry_run=dry_run, admit=admit)
            result, changes = self._write(
                rt, name, namespace, build, subresource=subresource, dry_run=dry_run, admit=admit
            )
        self._run_hooks(changes)
        return result

    def patch(
        self,
        rt: ResourceType,
        name: str,
        body: Any,
        patch_type: str,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        admit: Admit | None = None,
    ) -> Obj:
        """PATCH semantics: a patch that sets a stale metadata.resourceVersion is 409; for
        admission it is an UPDATE."""

        def build(current: Obj) -> Obj:
            patched = apply_patch(patch_type, current, body, custom=rt.custom)
            if not isinstance(patched, dict):
                raise ApiError.bad_request("patch did not produce an object")
            meta = patched.get("metadata") or {}
            if meta.get("name", name) != name:
                raise ApiError.bad_request("metadata.name: Invalid value: field is immutable")
            check_preconditions(rt, current, meta)
            return patched

        result, changes = self._write(
            rt, name, namespace, build, subresource=subresource, dry_run=dry_run, admit=admit
        )
        self._run_hooks(changes)
        return result

    def mutate(
        self,
        rt: ResourceType,
        name: str,
        fn: Callable[[Obj], Obj | None],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> Obj:
        """In-process read-modify-write: `fn` edits the object in place (or returns a new one)."""

        def build(current: Obj) -> Obj:
            out = fn(current)
            return current if out is None else out

        result, changes = self._write(rt, name, namespace, build, subresource=subresource)
        self._run_hooks(changes)
        return result

    def delete(
        self,
        rt: ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        immediate: bool = True,
        grace_period: int = 30,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete, or (finalizers present / `immediate` false, i.e. a pod with no kubelet to
        confirm) only mark deletionTimestamp. Returns (last state, gone)."""
        with self.lock:
            key, current = self._existing(rt, name, namespace)
            check_preconditions(rt, current, preconditions or {})
            if dry_run:
                return copy.deepcopy(current), True
            meta = current["metadata"]
            if meta.get("finalizers") or not immediate:
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(current), False
                marked = copy.deepcopy(current)
                marked["metadata"]["deletionTimestamp"] = now_rfc3339()
                marked["metadata"]["deletionGracePeriodSeconds"] = (
                    0 if meta.get("finalizers") and immediate else grace_period
                )
                if rt.track_generation:
                    marked["metadata"]["generation"] = int(meta.get("generation", 1)) + 1
                change = self._commit("MODIFIED", rt, key, marked, current)
                gone = False
            else:
                change = self._commit("DELETED", rt, key, copy.deepcopy(current), current)
                gone = True
        self._run_hooks([change])
        return copy.deepcopy(change.obj), gone

    # -- watch support ----------------------------------------------------------------------

    def register_watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        selector: Selector,
        since: int | None,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[list[tuple[str, Obj]], Watcher, int]:
        """Atomically take the initial events and subscribe, so no change falls in between.

        `since=None`: ADDED for every current match. Otherwise replay retained history after
        `since`; 410 Expired if it has been compacted away. Returns (events, watcher, rv)."""
        with self.lock:
            if since is None:
                items, _ = self.list(rt, namespace, selector)
                initial = [("ADDED", obj) for obj in items]
            else:
                if since < self._compacted_rv:
                    raise ApiError.expired(
                        f"too old resource version: {since} ({self._compacted_rv})"
                    )
                watcher_probe = Watcher(rt, namespace, selector, loop)
                initial = [
                    ev
                    for ch in self._history
                    if ch.rv > since and (ev := watcher_probe.translate(ch)) is not None
                ]
            watcher = Watcher(rt, namespace, selector, loop)
            watcher.progress_rv = self._rv
            self._watchers.add(watcher)
            return initial, watcher, self._rv

    def unregister_watch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def watchers(self) -> list[Watcher]:
        with self.lock:
            return list(self._watchers)

    def expire_history(self) -> None:
        """Forget all history: resuming a watch from any RV older than now gives 410."""
        with self.lock:
            self._history.clear()
            self._compacted_rv = self._rv
