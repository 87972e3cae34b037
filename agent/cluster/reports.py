"""What a cluster pass writes, as the MCD does: the Node's state, an update's outcome, its reboot.

On the Node's annotations, the MachineConfigNode and Events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent.cluster import annotations as A
from agent.cluster import mcn as M
from agent.cluster.drain import Drainer, SelfDrain
from agent.cluster.events import EventRecorder
from agent.cluster.handover import McdRecord
from agent.cluster.mcn_steps import PassSteps
from agent.cluster.mcn_writer import MachineConfigNodeWriter
from agent.cluster.node_writer import NodeWriter
from agent.cluster.prestager import Prestager
from agent.cluster.watch import NamedWatch, ObjectWatch
from agent.core.desired import Desired
from agent.errors import HostError
from agent.host.ports import Host
from agent.model.imageref import ImageRef
from agent.update.engine import DEGRADED, UNRECONCILABLE, Outcome

# A reboot waits this long at most for the MachineConfigNode to say so.
_MCN_FLUSH_TIMEOUT = 5.0


class ClusterReports:
    """The writing part of the cluster agent (agent.py), over the parts it sets up."""

    name: str
    host: Host
    node: ObjectWatch
    rendered: NamedWatch
    writer: NodeWriter
    patch_node: Callable[[dict[str, Any]], Awaitable[None]]
    mcn: MachineConfigNodeWriter
    steps: PassSteps
    drainer: Drainer
    events: EventRecorder
    mcd_record: McdRecord
    prestager: Prestager | None
    log: Any

    # -- writing the Node --------------------------------------------------------------------
    async def _set_state(self, state: str, reason: str = "", **extra: str | None) -> None:
        if state == DEGRADED:  # the MCD reports every Degraded on its MachineConfigNode too
            self.mcn.record(M.degraded(self.name, reason))
        await self.writer.set({A.STATE: state, A.REASON: reason, **extra})

    async def _report_progress(self, reason: str) -> None:
        await self._set_state("Working", reason)

    # -- an update's outcome ---------------------------------------------------------------
    async def _still_on(self, target: ImageRef | None) -> bool:
        """Whether the host may still run `target`: when bootc cannot
        say, assume it does, so a failed image never gets workloads back by accident."""
        if target is None:
            return False
        try:
            return (await self.host.bootc.status()).booted_digest == target.digest
        except HostError as exc:
            self.log.warning("bootc status failed; the node stays cordoned", error=str(exc))
            return True

    async def _report(self, node: A.NodeView, desired: Desired, outcome: Outcome) -> None:
        name = desired.config.name
        match outcome.state:
            case "Done":
                ran, config = self.steps.ran, outcome.current_config or name
                if ran:
                    self.mcn.record(M.resumed(config))
                fresh = A.NodeView.of(self.node.obj or {})
                if self.drainer.drained(fresh) and not fresh.single_replica:
                    await self.drainer.uncordon(config)
                    unschedulable = A.NodeView.of(self.node.obj or {}).unschedulable
                    self.mcn.record(M.uncordoned(unschedulable))
                elif ran:
                    self.mcn.record(M.uncordon_not_required())
                if outcome.plan is not None and outcome.plan.verdict == "live":
                    await self.events.emit("SkipReboot", f"Config changes to {name} applied "
                                           "live; no reboot or drain needed")  # fmt: skip
                image = node.get(A.DESIRED_IMAGE)
                patch = A.done_patch(outcome.current_config or name, image)
                fresh = A.NodeView.of(self.node.obj or {})
                wanted = patch["metadata"]["annotations"].items()
                await self.events.emit("NodeDone", f"Setting node {self.name}, currentConfig "
                                       f"{outcome.current_config or name} to Done")  # fmt: skip
                if any(fresh.annotations.get(k) != v for k, v in wanted):
                    await self.patch_node(patch)
                if ran and self.steps.start == "rebooting":
                    self.mcn.record(M.resumed(config, annotations_written=True))
                self.mcn.record(M.healthy(self.name))
                self.mcn.record(M.updated(self.name))
            case "Unreconcilable":
                current = node.get(A.CURRENT_CONFIG) or ""
                self.mcn.record(M.not_compatible(current, name, outcome.reason))
                self.mcn.record(M.degraded(self.name, outcome.reason))
                await self.events.emit("FailedToReconcile", outcome.reason, warning=True)
                await self._set_state(UNRECONCILABLE, outcome.reason)
            case "Degraded":
                fresh = A.NodeView.of(self.node.obj or {})
                # Rolled back or fell back: the node runs its last good config again. Not when
                # the rollback failed: it still runs the image whose checks failed, so it stays
                # cordoned until it is rolled back by hand (the reason says so).
                if (
                    self.drainer.drained(fresh)
                    and not outcome.retryable
                    and not await self._still_on(desired.target)
                ):
                    await self.drainer.uncordon(fresh.get(A.CURRENT_CONFIG) or name)
                await self.events.emit("FailedToReconcile", outcome.reason, warning=True)
                await self._set_state(DEGRADED, outcome.reason, **{A.POST_CONFIG_ACTION: None})
            case _:
                pass  # Rebooting: annotated before the reboot

    async def _before_reboot(self, desired: Desired) -> None:
        """After staging, before the reboot: drain, then say we reboot."""
        node = A.NodeView.of(self.node.obj or {})
        target, name = desired.target, desired.config.name
        if self.prestager is not None:  # the next node's pre-pull overlaps this drain
            await self.prestager.turn_staged()
        await self.events.emit("OSUpdateStaged", f"Changes to OS staged: {target}")
        if not node.single_replica:
            await self.events.emit("Drain", f"Draining node to update config {name}")
            if isinstance(self.drainer, SelfDrain):  # we are the drain controller: say what it says
                self.mcn.record(M.cordoned())
                self.mcn.record(M.draining(f"drain-{name}", node.get(A.LAST_APPLIED_DRAIN) or ""))
            await self.drainer.drain(name)
            # The drain controller writes the same once it drained: no second write then.
            self.mcn.record(M.drained(f"drain-{name}"))
            # The MCD drains before it writes; we staged first, so the executed phase ends
            # here and is reported complete again, as the MCD leaves it before its reboot.
            self.mcn.record(M.applied_files_and_os(True, self.steps.live_writes > 0))
        self.mcn.record(M.rebooting())
        await self.patch_node(A.annotations_patch({A.POST_CONFIG_ACTION: A.REBOOTING}))
        await self.events.emit("Reboot", f"Node will reboot into config {name}")
        self.mcn.record(M.healthy(self.name))  # the MCD's update() returns with the reboot queued
        await self.mcn.flush(_MCN_FLUSH_TIMEOUT)

    async def _hand_back(self, config_name: str, document: bytes) -> None:
        """Before an update's config becomes current: the MCD's on-disk config says it, in the
        MCD's format, from the rendered object as the API server has it."""
        rendered = await self.rendered.get(config_name) if config_name else None
        image = A.NodeView.of(self.node.obj or {}).get(A.DESIRED_IMAGE)
        if await asyncio.to_thread(self.mcd_record.write, rendered, document, image):
            self.log.info("MCD on-disk config written", config=config_name, image=image or "")
