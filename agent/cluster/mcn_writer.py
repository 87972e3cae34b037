"""Writes the node's MachineConfigNode status (`agent/cluster/mcn.py` says what), thin and best
effort as the MCD's upgrade monitor: a failure is logged, never raised into an update."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from agent.cluster.annotations import CURRENT_CONFIG, NodeView
from agent.cluster.kube import TRANSIENT, Kube, KubeError
from agent.cluster.mcn import (
    MACHINECONFIGNODES,
    Change,
    Status,
    Versions,
    fold,
    new_machine_config_node,
    spec_patch,
)
from agent.cluster.pool import PoolError, node_pool

MAX_PENDING = 256


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class MachineConfigNodeWriter:
    """Records steps without waiting and writes them in the background: the steps of a quick
    update land in one merge patch of `/status`; nothing is written when the status would not
    change. Every call has a timeout and every failure is logged, never raised: like the MCD,
    an update never fails or waits because of its MachineConfigNode. A cluster without the
    MachineConfigNode API turns the writer off."""

    def __init__(
        self,
        api: Kube,
        node_name: str,
        node: Callable[[], dict[str, Any] | None],
        *,
        enabled: bool = True,
        timeout: float = 10.0,
        settle: float = 0.2,
        retry_interval: float = 30.0,
        clock: Callable[[], str] = utc_now,
        read_node: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.api, self.node_name, self._node = api, node_name, node
        self._read_node = read_node  # the Node from the server, for the create
        self.enabled = enabled
        self.timeout, self.settle, self.retry_interval = timeout, settle, retry_interval
        self.clock = clock
        self.path = f"{MACHINECONFIGNODES}/{node_name}"
        self._pending: list[tuple[int, Change, Versions]] = []
        self._seq = 0
        self._known: dict[str, Any] | None = None  # the object as last read or written
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._last_error = ""
        self._spec_refused = ""
        self.log = structlog.get_logger("mcn")  # bound per call: configured logging applies

    def record(self, change: Change) -> None:
        """Queue one step with the Node's config annotations as they are now."""
        if not self.enabled:
            return
        view = NodeView.of(self._node() or {})
        self._seq += 1
        versions = Versions(view.desired_config, view.get(CURRENT_CONFIG))
        self._pending.append((self._seq, change, versions))
        del self._pending[:-MAX_PENDING]
        self._wake.set()

    def start(self) -> None:
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def close(self, timeout: float = 3.0) -> None:
        """Stop the background task and write what is still queued, bounded by `timeout`."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush(timeout)

    async def _run(self) -> None:
        while True:
            retry = self.retry_interval if self._pending else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(retry):
                    await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.settle)  # let the steps of one pass arrive together
            await self.flush(self.timeout)

    async def flush(self, timeout: float | None = None) -> bool:
        """Write what is queued now; True when nothing is left to write."""
        if not self.enabled or not self._pending:
            return True
        async with self._lock:
            batch = list(self._pending)
            if not batch:
                return True
            try:
                async with asyncio.timeout(timeout or self.timeout):
                    await self._write([(change, versions) for _, change, versions in batch])
            except (KubeError, PoolError, *TRANSIENT) as exc:
                self._known = None  # read it again next time
                if str(exc) != self._last_error:  # one line per distinct failure
                    self.log.warning(
                        "MachineConfigNode not updated",
                        node=self.node_name,
                        error=str(exc) or "timeout",
                    )
                    self._last_error = str(exc)
                return False
            self._last_error = ""
            last = batch[-1][0]
            self._pending = [p for p in self._pending if p[0] > last]
            return True

    async def _write(self, steps: list[tuple[Change, Versions]]) -> None:
        await self._write_status(steps)
        synced = [versions for change, versions in steps if change.sync_spec]
        if synced:
            await self._write_spec(synced[-1])

    async def _write_spec(self, versions: Versions) -> None:
        """The spec from the Node, as the MCD applies it at "Update Compatible": the
        controller writes it when it aims the Node, but does not retry a write that failed
        (or found no object yet), and `oc get machineconfignode` shows it."""
        obj = self._known or await self._read_or_create(versions)
        if obj is None:
            return
        pool = await node_pool(self.api, self._node() or {})
        body = spec_patch(obj, self.node_name, pool, versions.desired)
        if body is None:
            return
        try:
            self._known = await self.api.patch(self.path, body)
        except KubeError as exc:
            if exc.status not in (401, 403):
                raise
            # An agent upgraded before its RBAC: the status is written; the spec is the
            # controller's to keep, as before. Said once per distinct refusal, never retried.
            if str(exc) != self._spec_refused:
                self.log.warning("MachineConfigNode spec not set: patch on machineconfignodes "
                                 "not granted (deploy/rbac.yaml)", node=self.node_name,
                                 error=str(exc))  # fmt: skip
                self._spec_refused = str(exc)
            return
        self.log.info("MachineConfigNode spec set from the Node", node=self.node_name,
                      desired=versions.desired, pool=pool)  # fmt: skip

    async def _write_status(self, steps: list[tuple[Change, Versions]]) -> None:
        for _ in range(5):  # conflicts with other writers (the controllers) are retried
            obj = self._known or await self._read_or_create(steps[-1][1])
            if obj is None:
                return  # no MachineConfigNode API here
            meta = obj.get("metadata") or {}
            before = Status.from_json(obj.get("status"))
            after = fold(before, steps, self.clock(), generation=int(meta.get("generation") or 1))
            if after == before:
                self._known = obj
                return
            body = {
                "metadata": {"resourceVersion": meta.get("resourceVersion")},
                "status": after.to_json(),
            }
            try:
                self._known = await self.api.patch(f"{self.path}/status", body)
                return
            except KubeError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
                self._known = None
        raise KubeError(409, "Conflict", "MachineConfigNode kept changing; will try again")

    async def _read_or_create(self, versions: Versions) -> dict[str, Any] | None:
        try:
            return await self.api.get(self.path)
        except KubeError as exc:
            if not exc.not_found:
                raise
        node = await self._node_of_now()
        pool = await node_pool(self.api, node)
        uid = (node.get("metadata") or {}).get("uid", "")
        # The Node as it is now, as the MCD creates it from its current Node: a step queued
        # before the controller aimed the Node elsewhere must not create the object with the
        # old config, which the controller (it wrote the new one while there was no object)
        # never writes again.
        desired = NodeView.of(node).desired_config or versions.desired
        body = new_machine_config_node(self.node_name, pool, desired, uid)
        try:
            created = await self.api.post(MACHINECONFIGNODES, body)
        except KubeError as exc:
            if exc.status == 409:  # created meanwhile, by a controller
                return await self.api.get(self.path)
            if exc.not_found:  # a create finds no such resource: the CRD is not installed
                self.log.info(
                    "no MachineConfigNode API on this cluster; not reporting", node=self.node_name
                )
                self.enabled = False
                self._pending.clear()
                return None
            raise
        self.log.info("created MachineConfigNode", node=self.node_name, pool=pool)
        return created

    async def _node_of_now(self) -> dict[str, Any]:
        """The Node read from the server where it can be, else as the watch last saw it: under
        load the watch can lag behind the controller's new desiredConfig, and the object is
        created only once (one read per creation)."""
        if self._read_node is not None:
            with contextlib.suppress(KubeError, *TRANSIENT):
                return await self._read_node()
        return self._node() or {}
