"""Cluster mode: the Node's annotations in, the engine in the middle, annotations and Events
out. Every wait is driven by a watch (the Node, the rendered MachineConfig, ControllerConfig,
MachineConfiguration); API faults only delay the agent.

Nothing a pass reads ends the process. Input the agent cannot use (the desired or the current
MachineConfig, ControllerConfig, MachineConfiguration, the first-boot annotations file, a
config recorded on the host) is reported Degraded, with a reason that names the object and
the field (`cannot use machineconfig rendered-worker-2: spec.config.ignition.version: ...`);
the pass stops there, acting on nothing, and the next one runs when the object's watch sees a
change (or, for what no watch covers, after the backoff): the Node heals when the input does."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from agent.cluster import annotations as A
from agent.cluster import kubeconfig as kc
from agent.cluster import mcn as M
from agent.cluster.certs import certificates, rotate_if_published, write_certificates
from agent.cluster.drain import Drainer, DrainHandshake, DrainTimeout, SelfDrain
from agent.cluster.events import EventRecorder
from agent.cluster.handover import McdRecord
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
from agent.cluster.prestager import PrestageOptions, Prestager
from agent.cluster.watch import NamedWatch, ObjectWatch
from agent.core.desired import Desired
from agent.core.policy import BUILTIN_POLICY, Allowlist, policy_from_machine_configuration
from agent.core.validate import DRIFT_REASON_PREFIX
from agent.errors import HostError, InputError, parsing
from agent.host.ports import Host
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import parse_machine_config
from agent.observe.http import StatusBoard
from agent.update.drift_guard import DriftGuard
from agent.update.engine import DEGRADED, UNRECONCILABLE, Engine, Hooks, Outcome
from agent.update.journal import IN_FLIGHT, Record

NODE_ANNOTATIONS_FILE = "/etc/machine-config-daemon/node-annotations.json"
# A reboot waits this long at most for the MachineConfigNode to say so.
_MCN_FLUSH_TIMEOUT = 5.0
T = TypeVar("T")


class Unusable(Exception):
    """Input a pass cannot use. `error.source` names the object (`machineconfig <name>`,
    `controllerconfig machine-config-controller`, a path on the host), `error.field` the field.
    `watched`: a watch wakes the agent when the object changes; otherwise the pass is retried
    with backoff."""

    def __init__(self, error: InputError, *, watched: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.watched = error, watched


def parsed(what: str, parse: Callable[..., T], *args: Any) -> T:
    """`parse(*args)`, its InputError attributed to `what` (the object it reads); a parser's
    crash on a shape it did not expect is an InputError too."""
    try:
        return parsing(parse, *args, source=what)
    except InputError as exc:
        raise exc if exc.source else exc.located(what) from None


@dataclass
class ClusterOptions:
    node_name: str
    drain: str = "controller"  # "controller" (the MCO drain controller) or "self"
    drain_timeout: float = 3600.0
    uncordon_timeout: float = 600.0
    dry_run: bool = False
    max_boot_attempts: int = 1
    soft_reboot: bool = False
    prestage: PrestageOptions = field(default_factory=PrestageOptions)
    etc_ignore: tuple[str, ...] = DEFAULT_ETC_IGNORE  # /etc paths that are never drift


class ClusterAgent:
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

    # -- writing the Node --------------------------------------------------------------------
    async def _set_state(self, state: str, reason: str = "", **extra: str | None) -> None:
        if state == DEGRADED:  # the MCD reports every Degraded on its MachineConfigNode too
            self.mcn.record(M.degraded(self.name, reason))
        await self.writer.set({A.STATE: state, A.REASON: reason, **extra})

    async def _report_progress(self, reason: str) -> None:
        await self._set_state("Working", reason)

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
            idle = settled and str(journal.phase) == "idle"
            blocked = await self._check_host(node, desired, journal, settled=idle)
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
        self, node: A.NodeView, desired: Desired, journal: Record, *, settled: bool
    ) -> Outcome | None:
        """Validate the host against its current config when it is due (drift_guard.py); a
        finding that an update cannot go past is reported Degraded and ends the pass (a
        drift event or a Node change brings the next one)."""
        if settled and not self.drift.due():
            return None
        recorded = journal.current_name is not None or self.mcd_record.config() is not None
        image = journal.current_image or self.mcd_record.image() or node.get(A.CURRENT_IMAGE)
        reason = await self.drift.gate(self.engine, desired, settled=settled, recorded=recorded,
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

    def _pool_desired(self, rendered: dict[str, Any]) -> Desired:
        """The pool's target as this node will be asked for it: the rendered config, its
        osImageURL as the image (the controller sets desiredImage only at the node's turn)."""
        return self._desired(A.NodeView(self.name, {}), rendered)

    def _desired(self, node: A.NodeView, rendered: dict[str, Any]) -> Desired:
        """The desired state from a rendered config and the Node's desiredImage; InputError
        naming the object (`machineconfig <name>` or `node <name>`) and the field."""
        # Parsed from the very bytes the host records, so that the recorded config and the
        # desired one have the same fingerprint when their content is the same.
        # Only the name is kept of the metadata: a new resourceVersion is not a new config.
        meta = rendered.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        what = f"machineconfig {name}"
        stable = {**rendered, "metadata": {"name": name}}
        document = parsed(what, lambda: json.dumps(stable, sort_keys=True).encode())
        config = parsed(what, parse_machine_config, document)
        image_text = node.get(A.DESIRED_IMAGE)
        where = (f"node {node.name}", f"metadata.annotations[{A.DESIRED_IMAGE}]")
        if not image_text:
            image_text, where = config.os_image_url, (what, "spec.osImageURL")
        target = None
        if image_text:
            try:
                target = parse_image_ref(image_text)
            except InputError as exc:
                raise InputError(exc.message, source=where[0], field=where[1]) from None
        return Desired(config, document, target)

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
            if self.options.drain == "self":  # we are the drain controller: say what it says
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

    # -- inputs --------------------------------------------------------------------------------
    async def _adopt_current(self, node: A.NodeView, desired_name: str) -> None:
        """With no config recorded on the host yet, the Node's currentConfig is the baseline
        (the MCD's on-disk config starts the same way); refusals need a real baseline. One that
        cannot be parsed is Unusable: nothing is planned from a guess, and its watch (kept
        until it is adopted) brings the next pass when it is replaced."""
        if not self.options.dry_run:
            # Before anything reads the journal: a config the MCD applied after this agent
            # last ran here is the one validated against, never this agent's older record. A
            # record that cannot be read is reported where the update reads it (Degraded,
            # naming the file, retried with the update's backoff), not here.
            with contextlib.suppress(HostError):
                self.engine.follow_external()
        current_name = node.get(A.CURRENT_CONFIG)
        if (
            not current_name
            or current_name == desired_name
            or self.engine.current_config() is not None
            or self.options.dry_run
        ):
            self.current_rendered.stop()
            return
        current = await self.current_rendered.get(current_name)
        if current is None:
            self.current_rendered.stop()
            self.log.warning("current config not found; first start plans from none",
                             config=current_name)  # fmt: skip
            return
        what = f"machineconfig {current_name}"
        try:
            document = parsed(what, lambda: json.dumps(current, sort_keys=True).encode())
            parsed(what, self.engine.adopt_current, document)
        except InputError as exc:
            raise Unusable(exc) from None
        self.current_rendered.stop()

    def _in_flight(self) -> bool:
        try:
            return self.engine.journal.load().phase in IN_FLIGHT
        except HostError:  # unreadable: the pass reports it
            return False

    def _refresh_policy(self) -> None:
        """The live policy: the built-in one extended by MachineConfiguration/cluster. One that
        cannot be parsed is Unusable: no update is planned with a policy the cluster did not
        ask for (the last good one stays in force for what is already running)."""
        policy = BUILTIN_POLICY
        if self.configuration.obj is not None:
            try:
                extra = parsed("machineconfiguration cluster", policy_from_machine_configuration,
                               self.configuration.obj)  # fmt: skip
            except InputError as exc:
                raise Unusable(exc) from None
            if extra is not None:
                policy = BUILTIN_POLICY.extended(extra)
        self.allowlist.policy = policy
        self.engine.policy = policy

    async def _sync_certificates(self, node: A.NodeView) -> Outcome | None:
        """The MCD's certificate writer (pkg/daemon/certificate_writer.go): the ControllerConfig's
        certificates, then the kube-apiserver serving-CA rotation of the kubeconfigs, then
        `lastSyncedControllerConfigResourceVersion` and `lastObservedServerCAAnnotation`.
        A ControllerConfig that cannot be used is Unusable (its watch brings the fix); an
        unusable rotation (the kubeconfig-data bundle, a kubeconfig on the host: no watch) is a
        Degraded outcome retried with backoff."""
        cc = self.controller_config.obj
        if cc is None or self.options.dry_run or not kc.certificates_due(cc, node.annotations):
            return None
        version = (cc.get("metadata") or {}).get("resourceVersion", "")
        try:
            certs = parsed("controllerconfig machine-config-controller", certificates, cc)
        except InputError as exc:
            raise Unusable(exc) from None
        written = await asyncio.to_thread(write_certificates, self.host.files, certs)
        for warning in written.warnings:
            self.log.warning(warning)
        self.log.info("certificates synced", changed=written.changed, resource_version=version)
        values: dict[str, str | None] = {A.LAST_SYNCED_CC: version}
        observed = kc.rotate_value(cc)
        if kc.rotation_due(cc, node.annotations):
            try:
                applied = await rotate_if_published(self.api, self.host)
            except InputError as exc:
                reason = f"kube-apiserver serving CA rotation: {exc}"
                await self._set_state("Degraded", reason)
                return Outcome(DEGRADED, reason, retryable=True)
            if not applied:
                observed = node.annotations.get(A.LAST_OBSERVED_SERVER_CA, "")
        if node.annotations.get(A.LAST_OBSERVED_SERVER_CA, "") != observed:
            values[A.LAST_OBSERVED_SERVER_CA] = observed
        if any(node.annotations.get(key) != value for key, value in values.items()):
            await self.patch_node(A.annotations_patch(values))
        return None

    async def _seed_first_boot(self) -> bool:
        """A Node with no currentConfig gets the annotations the machine-config-server left on
        the host (the controller ignores a Node without them). A file that is no JSON object
        is Unusable (no watch: retried with backoff); none at all is only logged."""
        data = await asyncio.to_thread(self.host.files.read, NODE_ANNOTATIONS_FILE)
        if data is None:
            self.log.warning("no currentConfig on the Node and no " + NODE_ANNOTATIONS_FILE)
            return False
        try:
            seeded = json.loads(data)
        except ValueError as exc:
            problem = InputError(f"invalid JSON: {exc}", source=NODE_ANNOTATIONS_FILE)
            raise Unusable(problem, watched=False) from None
        if not isinstance(seeded, dict):
            problem = InputError("expected a JSON object", source=NODE_ANNOTATIONS_FILE)
            raise Unusable(problem, watched=False)
        values = {k: str(v) for k, v in seeded.items() if k.startswith(A.PREFIX)}
        await self.patch_node(A.annotations_patch(values))
        self.log.info("seeded node annotations", keys=sorted(values))
        return True
