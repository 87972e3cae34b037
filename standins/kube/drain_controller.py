"""A stand-in for machine-config-controller's drain controller.

The real controller (pkg/controller/drain/drain_controller.go of
openshift/machine-config-operator at 7ff337a4, the build the conformance tier runs) answers a
Node annotation `machineconfiguration.openshift.io/desiredDrain`:

* `drain-<cfg>`: cordon (`spec.unschedulable=true`), drain, then set
  `machineconfiguration.openshift.io/lastAppliedDrain=drain-<cfg>`;
* `uncordon-<cfg>`: uncordon, then echo the value into `lastAppliedDrain`.

This simulator does the same through the in-process store API (no HTTP, no identity), after
`delay` seconds (the real one took ~5 s), and writes the MachineConfigNode conditions the real
one writes at each step (mcn_status.py: Cordoned, Drained, Uncordoned with their parents).
With `evict_pods=True` draining also evicts the
node's pods through the eviction logic, retrying while a PDB says 429, as `oc adm drain` does;
DaemonSet pods and mirror pods are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from . import mcn_status
from .changes import Change
from .disruption import evict
from .errors import ApiError

if TYPE_CHECKING:
    from .store_api import StoreApi

DESIRED_DRAIN = "machineconfiguration.openshift.io/desiredDrain"
LAST_APPLIED_DRAIN = "machineconfiguration.openshift.io/lastAppliedDrain"


def _annotation(obj: dict | None, key: str) -> str | None:
    if not obj:
        return None
    return (obj.get("metadata", {}).get("annotations") or {}).get(key)


class DrainController:
    def __init__(
        self,
        kube: StoreApi,
        *,
        delay: float = 0.0,
        evict_pods: bool = False,
        evict_retry_interval: float = 0.2,
    ) -> None:
        self.kube = kube
        self.delay = delay
        self.evict_pods = evict_pods
        self.evict_retry_interval = evict_retry_interval
        self.handled: list[tuple[str, str]] = []  # (node, desiredDrain value) once applied
        self._nodes = kube.resource("nodes")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin reacting; must know a running loop (the caller's, or `loop`)."""
        self._loop = loop or self.kube.loop or asyncio.get_running_loop()
        if not self._active:
            self.kube.add_hook(self._on_change)
            self._active = True
            # Pick up requests made while we were disabled.
            for node in self.kube.list("nodes"):
                want = _annotation(node, DESIRED_DRAIN)
                if want and want != _annotation(node, LAST_APPLIED_DRAIN):
                    self._schedule(node["metadata"]["name"], want)

    def stop(self) -> None:
        """Stop reacting and abandon pending work."""
        self.kube.remove_hook(self._on_change)
        self._active = False
        for task in list(self._tasks):
            task.cancel()

    def _on_change(self, change: Change) -> None:
        if change.rt != self._nodes or change.type == "DELETED":
            return
        want = _annotation(change.obj, DESIRED_DRAIN)
        if not want or want == _annotation(change.old, DESIRED_DRAIN):
            return
        if want == _annotation(change.obj, LAST_APPLIED_DRAIN):
            return
        self._schedule(change.obj["metadata"]["name"], want)

    def _schedule(self, node: str, value: str) -> None:
        assert self._loop is not None
        # Hooks run in the writer's thread; the work runs on our loop.
        with contextlib.suppress(RuntimeError):  # loop closed: nothing left to simulate for
            self._loop.call_soon_threadsafe(self._spawn, node, value)

    def _spawn(self, node: str, value: str) -> None:
        task = self._loop.create_task(self._apply(node, value))  # type: ignore[union-attr]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, node: str, value: str) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        current = self.kube.try_get("nodes", node)
        if current is None or _annotation(current, DESIRED_DRAIN) != value:
            return  # node gone, or superseded by a newer request
        # The real controller words its conditions with the Node as it read it, before acting.
        was_unschedulable = bool(current.get("spec", {}).get("unschedulable"))
        if value.startswith("drain-"):
            self.kube.patch("nodes", node, {"spec": {"unschedulable": True}})
            mcn_status.apply(self.kube, current, mcn_status.cordoned(was_unschedulable))
            last = _annotation(current, LAST_APPLIED_DRAIN) or ""
            mcn_status.apply(self.kube, current, mcn_status.draining(value, last))
            if self.evict_pods:
                await self._drain(node)
            mcn_status.apply(self.kube, current, mcn_status.drained(value))
        elif value.startswith("uncordon-"):
            self.kube.patch("nodes", node, {"spec": {"unschedulable": None}})
            mcn_status.apply(self.kube, current, mcn_status.uncordoned(was_unschedulable))
        if _annotation(self.kube.try_get("nodes", node), DESIRED_DRAIN) != value:
            return
        self.kube.patch_annotations("nodes", node, {LAST_APPLIED_DRAIN: value})
        self.handled.append((node, value))

    async def _drain(self, node: str) -> None:
        pods = self.kube.list("pods", field_selector=f"spec.nodeName={node}")
        for pod in pods:
            meta = pod["metadata"]
            owners = meta.get("ownerReferences") or []
            if any(o.get("kind") == "DaemonSet" for o in owners) or (
                "kubernetes.io/config.mirror" in (meta.get("annotations") or {})
            ):
                continue
            while True:
                try:
                    evict(
                        self.kube.store,
                        self.kube.registry,
                        meta["namespace"],
                        meta["name"],
                        None,
                        pods_vanish=self.kube.evicted_pods_vanish,
                    )
                    break
                except ApiError as err:
                    if err.code == 404:
                        break
                    if err.code != 429:
                        raise
                await asyncio.sleep(self.evict_retry_interval)

    async def idle(self) -> None:
        """Wait for scheduled work to finish."""
        await asyncio.sleep(0)
        while self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
