"""Cluster mode: the Node's annotations in, the engine in the middle, annotations and Events out.

Every wait is driven by a watch (the Node, the rendered MachineConfig, ControllerConfig,
MachineConfiguration); API faults only delay the agent.

Nothing a pass reads ends the process. Input the agent cannot use (the desired or the current
MachineConfig, ControllerConfig, MachineConfiguration, the first-boot annotations file, a
config recorded on the host) is reported Degraded, with a reason that names the object and
the field (`cannot use machineconfig rendered-worker-2: spec.config.ignition.version: ...`);
the pass stops there, acting on nothing, and the next one runs when the object's watch sees a
change (or, for what no watch covers, after the backoff): the Node heals when the input does.

The passes are here; what a pass reads is in inputs.py, what it writes in reports.py."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from agent.cluster import annotations as A
from agent.cluster import mcn as M
from agent.cluster.drain import Drainer, DrainHandshake, DrainTimeout, SelfDrain
from agent.cluster.events import EventRecorder
from agent.cluster.handover import McdRecord
from agent.cluster.inputs import ClusterInputs, ClusterOptions, Unusable
from agent.cluster.kube import (
    CONTROLLERCONFIGS,
    MACHINECONFIGS,
    MACHINECONFIGURATIONS,
    Kube,
    node_path,
)
from agent.cluster.mcn_steps import PassSteps
from agent.cluster.mcn_writer import MachineConfigNodeWriter
from agent.cluster.node_writer import NodeWriter, ProgressReporter
from agent.cluster.passes import PassLoop
from agent.cluster.pool_target import PoolTarget
from agent.cluster.prestager import Prestager
from agent.cluster.watch import NamedWatch, ObjectWatch
from agent.core.desired import Desired
from agent.core.policy import Allowlist
from agent.core.validate import DRIFT_REASON_PREFIX
from agent.errors import HostError, InputError
from agent.host.ports import Host
from agent.observe.http import StatusBoard
from agent.update.drift_guard import DriftGuard
from agent.update.engine import DEGRADED, Engine, Hooks, Outcome
from agent.update.journal import IN_FLIGHT, Record

# The cluster agent's API: app/kube_source.py starts it with its options.
__all__ = ["ClusterAgent", "ClusterOptions"]


class ClusterAgent(ClusterInputs):
    """The Node agent of cluster mode: its watches and its passes (inputs.py reads, reports.py
    writes)."""

    def __init__(self, api: Kube, node_api: Kube, host: Host, allowlist: Allowlist,
                 options: ClusterOptions, board: StatusBoard | None = None) -> None:  # fmt: skip
        self.board = board or StatusBoard()
        self.api, self.node_api, self.host = api, node_api, host
        self.allowlist, self.options = allowlist, options
        self.name = options.node_name
        self.wakeup = asyncio.Event()
        self.node = ObjectWatch(node_api, "/api/v1/nodes", self.name, on_change=self._node_changed)
        self.controller_config = ObjectWatch(api, CONTROLLERCONFIGS, "machine-config-controller",
                                             on_change=self.wakeup.set)  # fmt: skip
        self.configuration = ObjectWatch(api, MACHINECONFIGURATIONS, "cluster",
                                         on_change=self.wakeup.set)  # fmt: skip
        self.rendered = NamedWatch(api, MACHINECONFIGS, on_change=self.wakeup.set)
        # The Node's currentConfig, followed only while it is to be adopted as the baseline.
        self.current_rendered = NamedWatch(api, MACHINECONFIGS, on_change=self.wakeup.set)
        self.events = EventRecorder(node_api, self.name)
        self.log = structlog.get_logger("cluster").bind(node=self.name)
        self.writer = NodeWriter(node_api, self.node, self.name, dry_run=options.dry_run,
                                 log=self.log)  # fmt: skip
        self.patch_node = self.writer.patch
        self.drainer: Drainer = (
            SelfDrain(
                api,
                self.node,
                self.patch_node,
                self._report_progress,
                self.name,
                deadline=options.drain_timeout,
            )
            if options.drain == "self"
            else DrainHandshake(
                self.node, self.patch_node, options.drain_timeout, options.uncordon_timeout
            )
        )
        self.mcn = MachineConfigNodeWriter(
            api,
            self.name,
            lambda: self.node.obj,
            enabled=not options.dry_run,
            read_node=lambda: node_api.get(node_path(self.name)),
        )
        self.steps = PassSteps(self.mcn, lambda: A.NodeView.of(self.node.obj or {}))
        self._on_progress = ProgressReporter(self._report_progress, self.board.metrics,
                                             enabled=not options.dry_run, log=self.log)  # fmt: skip
        hooks = Hooks(before_disruption=self._before_reboot, progress=self._on_progress,
                      notice=self.board.metrics.notice, checkpoint=self.steps.on_checkpoint,
                      committing=self._hand_back)  # fmt: skip
        # The MCD's on-disk config: taken as the current config where the MCD left one, and
        # kept current after each update for an MCD that takes the node back.
        self.mcd_record = McdRecord(host.files)
        self.engine = Engine(host, policy=allowlist.policy, hooks=hooks,
                             max_boot_attempts=options.max_boot_attempts,
                             soft_reboot=options.soft_reboot,
                             external_current=self.mcd_record.config)  # fmt: skip
        self.drift = DriftGuard(
            host, self.board.metrics, self.wakeup.set,
            lambda reason, text: self.events.emit(reason, text, warning=True),
            etc_ignore=options.etc_ignore,
        )  # fmt: skip
        self.prestager: Prestager | None = None
        if options.prestage.mode == "pool" and not options.dry_run:
            source = PoolTarget(api, self.node, self.events, self._pool_desired,
                                options.prestage.repick, options.prestage)  # fmt: skip
            self.prestager = Prestager(self.node, self.engine, self.events, self.board.metrics,
                                       source, options.prestage)  # fmt: skip
        # Read at scrape time: every request counts, also those after the last pass.
        for kube, who in ((api, "reads"), (node_api, "node")):
            counter = kube.counter
            metric = self.board.metrics.api_requests
            metric.labels(f"{who}-get").set_function(lambda c=counter: c.reads)
            metric.labels(f"{who}-write").set_function(lambda c=counter: c.writes)
        self._retrying: str | None = None  # the Desired.key of an update failed retryably
        self._tasks: list[asyncio.Task[None]] = []

    def _node_changed(self) -> None:
        self.wakeup.set()
        if self.prestager is not None:
            self.prestager.poke()

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> int:
        """Until cancelled; returns 3 when the host's reboot ends the process."""
        for watch in (self.node, self.controller_config, self.configuration):
            self._tasks.append(asyncio.create_task(watch.run()))
        self.mcn.start()
        try:
            # Policy and certificates must be known before the first decision.
            for watch in (self.node, self.controller_config, self.configuration):
                await watch.synced.wait()
            if self.prestager is not None:
                self._tasks.append(asyncio.create_task(self.prestager.run()))
            loop = PassLoop(self.sync, lambda reason: self._set_state(DEGRADED, reason),
                            self._publish, self.wakeup, self.host.reboot_ends_process,
                            self.log)  # fmt: skip
            return await loop.run()
        finally:
            await self.drift.stop()
            await self.mcn.close()  # bounded: what a reboot or a stop left queued
            await self._on_progress.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.rendered.close()
            await self.current_rendered.close()

    def _publish(self, outcome: Outcome | None) -> None:
        """The Node's view plus the journal's phase, for /status and /metrics."""
        node = A.NodeView.of(self.node.obj or {})
        try:
            phase, prestaged = str(self.engine.journal.load().phase), self.engine.prestaged()
        except HostError:  # an unreadable journal: the pass reported it
            phase, prestaged = "unknown", None
        self.board.publish({
            "state": node.get(A.STATE) or (outcome.state if outcome else ""),
            "reason": node.get(A.REASON) or "",
            "phase": phase,
            "currentConfig": node.get(A.CURRENT_CONFIG),
            "desiredConfig": node.desired_config,
            "currentImage": node.get(A.CURRENT_IMAGE),
            "desiredImage": node.get(A.DESIRED_IMAGE),
            "prestaged": prestaged,
            "validation": self.drift.last.to_json() if self.drift.last else None,
        })  # fmt: skip

    # -- one pass ----------------------------------------------------------------------------
    async def sync(self) -> Outcome | None:
        """One pass. Unusable input is reported Degraded and ends the pass before anything is
        acted on; its watch (or the backoff) brings the next pass."""
        try:
            return await self._sync()
        except Unusable as exc:
            reason = f"cannot use {exc.error}"
            self.log.warning("input not usable", reason=reason)
            await self._set_state("Degraded", reason)
            return Outcome(DEGRADED, reason, retryable=not exc.watched)

    async def _sync(self) -> Outcome | None:
        if self.node.obj is None:
            self.log.warning("own Node not found; waiting for it")
            return None
        node = A.NodeView.of(self.node.obj)
        self.events.node_uid = node.uid
        if node.get(A.CURRENT_CONFIG) is None and await self._seed_first_boot():
            return None  # the watch brings the seeded annotations back
        try:
            rotation = await self._sync_certificates(node)
            if rotation is not None:
                return rotation
            self._refresh_policy()
        except Unusable as exc:
            # An update past its live writes (drained, staged, rebooting) finishes with the
            # policy it started under: a broken ControllerConfig must not leave a node
            # cordoned. The next pass, idle, reports it.
            if not self._in_flight():
                raise
            self.log.warning("input not usable; finishing the update in flight first",
                             reason=f"cannot use {exc.error}")  # fmt: skip
        desired_name = node.desired_config
        if not desired_name:
            return None
        rendered = await self.rendered.get(desired_name)
        if rendered is None:
            reason = f"machineconfig {desired_name} not found; waiting for it to be rendered"
            await self._set_state("Degraded", reason)
            return Outcome(DEGRADED, reason)  # the rendered-config watch wakes us
        try:
            desired = self._desired(node, rendered)
        except InputError as exc:
            raise Unusable(exc) from None  # the rendered-config (or the Node's) watch wakes us
        await self._adopt_current(node, desired_name)
        journal = self.engine.journal.load()
        settled = node.is_done() and journal.update_key == desired.key
        if self.options.dry_run:
            if not (settled and str(journal.phase) == "idle"):
                outcome = await self.engine.reconcile(desired, dry_run=True)
                self.log.info("dry run", plan=outcome.plan.to_json() if outcome.plan else None)
            return None
        force = journal.phase not in IN_FLIGHT and await self.drift.forced()
        if not force and journal.phase not in IN_FLIGHT:
            applied = journal.update_key == desired.key and str(journal.phase) == "idle"
            idle = settled and applied
            blocked = await self._check_host(node, desired, journal, settled=idle,
                                             update_ahead=not applied)  # fmt: skip
            if blocked is not None:
                return blocked
            if idle:
                self.mcn.record(M.updated(self.name))  # as the MCD on every pass with nothing to do
                return None
        await self.drift.stop()  # the update's own writes are not drift
        paused = self.prestager.paused() if self.prestager else contextlib.nullcontext()
        async with paused:  # a pre-stage never runs beside the update (bootc's one lock)
            outcome = await self._update(node, desired, journal, force=force)
        if force:
            await self.drift.consume_force()
        if outcome.state == "Done" and self.drift.due():
            self.wakeup.set()  # one more pass: validate what the update left, and watch it
        return outcome

    async def _check_host(
        self, node: A.NodeView, desired: Desired, journal: Record, *, settled: bool,
        update_ahead: bool,
    ) -> Outcome | None:  # fmt: skip
        """Validate the host against its current config when it is due (update/drift_guard.py); a
        finding that an update cannot go past is reported Degraded and ends the pass (a
        drift event or a Node change brings the next one)."""
        if settled and not self.drift.due():
            return None
        recorded = journal.current_name is not None or self.mcd_record.config() is not None
        image = journal.current_image or self.mcd_record.image() or node.get(A.CURRENT_IMAGE)
        reason = await self.drift.gate(self.engine, desired, settled=settled,
                                       update_ahead=update_ahead, recorded=recorded,
                                       image=image)  # fmt: skip
        if reason is None:
            return None
        if node.get(A.STATE) != DEGRADED or node.get(A.REASON) != reason:
            await self._set_state(DEGRADED, reason)
        return Outcome(DEGRADED, reason)

    async def _update(
        self, node: A.NodeView, desired: Desired, journal: Record, *, force: bool = False
    ) -> Outcome:
        stuck = journal.update_key == desired.key and str(journal.phase) in (
            "degraded",
            "unreconcilable",
        )
        # A retry of an update that failed for a cause that may pass (a host error, e.g. a
        # recorded config it cannot read, a drain timeout) leaves the Node Degraded until it
        # succeeds: a retry that fails the same way then writes nothing. (Every write wakes
        # the loop: Working, Degraded, Working... would retry at the API server's pace, not
        # the backoff's.)
        retry, self._retrying = self._retrying == desired.key, None
        self.mcn.record(M.needs_update(self.name))
        # Not over a drift Degraded that just healed: the pass ends Done at once (the MCD too
        # keeps a Degraded node from flapping through Working).
        drift_healed = (node.get(A.REASON) or "").startswith(DRIFT_REASON_PREFIX)
        if not node.is_done() and not stuck and not retry and not drift_healed:
            await self._set_state("Working", "")
        self.steps.begin(str(journal.phase))
        try:
            outcome = await self.engine.reconcile(desired, force=force)
        except DrainTimeout as exc:
            self._retrying = desired.key
            self.log.warning("update failed; retrying", error=str(exc))
            await self._set_state("Degraded", str(exc))
            await self.events.emit("FailedToDrain", str(exc), warning=True)
            return Outcome(DEGRADED, str(exc), retryable=True)
        except HostError as exc:
            self._retrying = desired.key
            reason = f"host error ({exc.kind}): {exc}"
            self.log.warning("update failed; retrying", error=reason)
            await self._set_state("Degraded", reason)
            return Outcome(DEGRADED, reason, retryable=True)
        await self._report(node, desired, outcome)
        if outcome.state == DEGRADED and outcome.retryable:
            self._retrying = desired.key
        return outcome

    def _in_flight(self) -> bool:
        try:
            return self.engine.journal.load().phase in IN_FLIGHT
        except HostError:  # unreadable: the pass reports it
            return False
