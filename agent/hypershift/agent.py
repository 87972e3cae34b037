"""HyperShift mode: the node side of a hosted cluster's InPlace NodePool upgrade, in place of the
machine-config-daemon pod the upgrader starts (docs/mco-protocol.md §15).

In: the own Node (`desiredConfig`, `currentConfig`, `lastAppliedDrain`) and the NodePool's upgrade
ConfigMap (`data.hash`, `data.config`), both watched with the kubelet's identity. Out: the same
Node annotations as the MCD writes in this mode, and Events:
- an update begins: `state=Working` (the staging progress in `reason`);
- before the reboot: one patch `state=Working`, `reason=""`, `desiredDrain=drain-<hash>`, then the
  drainer's `lastAppliedDrain` is awaited;
- Done: one patch `state=Done`, `reason=""`, `currentConfig=<hash>`, `desiredDrain=uncordon-<hash>`
  (also with no drain, as the MCD: the upgrader counts a node done only when the drain
  annotations agree);
- any failure: `state=Degraded` and the reason, never `Unreconcilable`: the upgrader looks for
  nothing else (docs/mco-protocol.md §15 step 9) and would wait on an Unreconcilable node for ever.

The same core plans (live allowlist, refusals, image updates) and the same engine and journal act.
No MachineConfig, pool, ControllerConfig or MachineConfigNode exists in a hosted cluster, and
`currentImage`/`desiredImage`/`post-config-action` are not written.

A refused payload halts the whole NodePool (the upgrader stops at a Degraded node before it
writes the next target's ConfigMap), so a refusal could never see the fix. Every
`refused_retry` seconds the agent therefore lifts its Degraded for `probe_window` seconds
(`state=Working`, the refusal still in `reason`): the upgrader's next reconcile then publishes a
new target, if there is one, and moves this node to it (`getAlreadyUnavailableCandidates`). A
refused node has not been drained or staged, and nodes picked meanwhile refuse the same payload
the same way, so the window disrupts nothing. A node that failed after it was disrupted (a
rollback) keeps Degraded: the halt is what keeps the next node from taking the same image."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import structlog

from agent.cluster import annotations as A
from agent.cluster.drain import DrainTimeout
from agent.cluster.events import EventRecorder
from agent.cluster.inputs import Unusable, parsed
from agent.cluster.kube import TRANSIENT, Kube, KubeError
from agent.cluster.node_writer import NodeWriter, ProgressReporter
from agent.cluster.passes import PassLoop
from agent.cluster.prestager import PrestageOptions, Prestager
from agent.cluster.watch import ObjectWatch
from agent.core.desired import Desired
from agent.core.plan import IMAGE_BUILD_HINT
from agent.core.policy import Allowlist
from agent.errors import HostError, InputError
from agent.host.durable import write_atomic
from agent.host.ports import Host
from agent.hypershift.target import NodePoolTarget
from agent.model.hypershift import (
    MC_CONTENT_PATH,
    MCD_CURRENT_CONFIG,
    NODEPOOL_LABEL,
    Payload,
    named_document,
    payload_from_configmap,
    upgrade_objects,
)
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import parse_machine_config
from agent.observe.http import StatusBoard
from agent.update.engine import DEGRADED, Engine, Hooks, Outcome
from agent.update.journal import IN_FLIGHT

NODEPOOL_HINT = (
    "these changes are image content: build an OS image that carries this config and name it, "
    "pinned by digest, as spec.osImageURL of a MachineConfig in the NodePool's spec.config"
)


@dataclass
class HypershiftOptions:
    node_name: str
    upgrade_namespace: str | None = None  # default: `<np>-upgrade`, np from the Node's label
    upgrade_configmap: str | None = None
    drain_timeout: float = 3600.0
    dry_run: bool = False
    max_boot_attempts: int = 1
    soft_reboot: bool = False
    refused_retry: float = 60.0
    probe_window: float = 5.0
    prestage: PrestageOptions = field(default_factory=PrestageOptions)


def refusal_lift_message(refused: str, lift: int, window: float, retry: float,
                         cause: str) -> str:  # fmt: skip
    """The Event of one lift of a refusal's Degraded (see the module's docstring)."""
    return (f"Lift {lift}: Degraded lifted for {window:g} s so that the in-place upgrader, "
            f"halted by the refused target {refused}, can publish a new one; Degraded again "
            f"after it unless the target changes, and lifted again every {retry:g} s "
            f"(--refused-retry). Refused: {cause}")  # fmt: skip


class HypershiftAgent:
    def __init__(self, node_api: Kube, host: Host, allowlist: Allowlist,
                 options: HypershiftOptions, board: StatusBoard | None = None) -> None:  # fmt: skip
        self.board = board or StatusBoard()
        self.api, self.host, self.allowlist, self.options = node_api, host, allowlist, options
        self.name = options.node_name
        self.wakeup = asyncio.Event()
        self.node = ObjectWatch(node_api, "/api/v1/nodes", self.name, on_change=self._changed)
        self.configmap: ObjectWatch | None = None
        self._configmap_task: asyncio.Task[None] | None = None
        self.events = EventRecorder(node_api, self.name)
        self.log = structlog.get_logger("hypershift").bind(node=self.name)
        self.writer = NodeWriter(node_api, self.node, self.name, dry_run=options.dry_run,
                                 log=self.log)  # fmt: skip
        self._on_progress = ProgressReporter(self._report_staging, self.board.metrics,
                                             enabled=not options.dry_run, log=self.log)  # fmt: skip
        hooks = Hooks(before_disruption=self._before_reboot, progress=self._on_progress,
                      notice=self.board.metrics.notice)  # fmt: skip
        self.engine = Engine(host, policy=allowlist.policy, hooks=hooks,
                             max_boot_attempts=options.max_boot_attempts,
                             soft_reboot=options.soft_reboot)  # fmt: skip
        self.prestager: Prestager | None = None
        if options.prestage.mode == "pool" and not options.dry_run:
            source = NodePoolTarget(lambda: self.configmap, self._desired, api=node_api,
                                    node_name=self.name, place=self._nodepool_place,
                                    options=options.prestage)  # fmt: skip
            self.prestager = Prestager(self.node, self.engine, self.events, self.board.metrics,
                                       source, options.prestage)  # fmt: skip
        counter = node_api.counter
        metric = self.board.metrics.api_requests
        metric.labels("node-get").set_function(lambda: counter.reads)
        metric.labels("node-write").set_function(lambda: counter.writes)
        self._refused: str | None = None  # the target hash of a refusal that holds the NodePool
        self._lifts: tuple[str | None, int] = (None, 0)  # lifts of that refusal so far
        self._retrying: str | None = None  # the Desired.key of an update failed retryably

    def _changed(self) -> None:
        self.wakeup.set()
        if self.prestager is not None:
            self.prestager.poke()

    # -- writing the Node --------------------------------------------------------------------
    async def _set(self, **values: str | None) -> None:
        """Write only what the Node does not already say (every write wakes the loop)."""
        await self.writer.set({A.PREFIX + key: value for key, value in values.items()})

    async def _degraded(self, reason: str, **extra: str | None) -> None:
        await self._set(state=DEGRADED, reason=reason, **extra)

    async def _report_staging(self, reason: str) -> None:
        await self._set(state="Working", reason=reason)

    # -- the upgrade ConfigMap ---------------------------------------------------------------
    def _configmap_location(self) -> tuple[str, str]:
        """From the flags, else from the Node's NodePool label (the HCCO keeps it in sync)."""
        namespace, name = self.options.upgrade_namespace, self.options.upgrade_configmap
        if namespace and name:
            return namespace, name
        labels = ((self.node.obj or {}).get("metadata") or {}).get("labels") or {}
        nodepool = labels.get(NODEPOOL_LABEL)
        if not nodepool:
            raise Unusable(InputError(
                f"no label {NODEPOOL_LABEL}: pass --upgrade-namespace and --upgrade-configmap",
                source=f"node {self.name}", field="metadata.labels",
            ))  # fmt: skip
        default_namespace, default_name = upgrade_objects(nodepool)
        return namespace or default_namespace, name or default_name

    def _nodepool_place(self) -> tuple[str, str] | None:
        """The NodePool this node is in and its upgrade namespace, where the pre-pull lanes
        live; None when the Node names no NodePool (flags alone say where the ConfigMap is)."""
        labels = ((self.node.obj or {}).get("metadata") or {}).get("labels") or {}
        nodepool = labels.get(NODEPOOL_LABEL)
        if not nodepool:
            return None
        try:
            namespace, _ = self._configmap_location()
        except Unusable:
            return None
        return nodepool, namespace

    def _follow_configmap(self) -> ObjectWatch:
        namespace, name = self._configmap_location()
        collection = f"/api/v1/namespaces/{namespace}/configmaps"
        watch = self.configmap
        if watch is None or (watch.collection, watch.name) != (collection, name):
            if self._configmap_task is not None:
                self._configmap_task.cancel()
            watch = ObjectWatch(self.api, collection, name, on_change=self._changed)
            self.configmap, self._configmap_task = watch, asyncio.create_task(watch.run())
            self.log.info("following the NodePool's upgrade ConfigMap", namespace=namespace,
                          configmap=name)  # fmt: skip
            self._changed()  # the pre-stager may now see a target
        return watch

    def _desired(self, payload: Payload) -> Desired:
        config = parse_machine_config(payload.document)
        target = None
        if config.os_image_url:
            try:
                target = parse_image_ref(config.os_image_url)
            except InputError as exc:
                raise InputError(exc.message, field="data.config: spec.osImageURL") from None
        return Desired(config, payload.document, target)

    # -- lifecycle ---------------------------------------------------------------------------
    async def run(self) -> int:
        """Until cancelled; returns 3 when the host's reboot ends the process."""
        node_task = asyncio.create_task(self.node.run())
        prestage_task: asyncio.Task[None] | None = None
        try:
            await self.node.synced.wait()
            if self.prestager is not None:
                prestage_task = asyncio.create_task(self.prestager.run())
            loop = PassLoop(self.sync, self._degraded, self._publish, self.wakeup,
                            self.host.reboot_ends_process, self.log,
                            idle_timeout=self._refusal_holds, on_idle=self._probe)  # fmt: skip
            return await loop.run()
        finally:
            await self._on_progress.close()
            tasks = [t for t in (node_task, prestage_task, self._configmap_task) if t]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _refusal_holds(self) -> float | None:
        """How long a refusal holds the NodePool before `_probe` (None: no refusal)."""
        return self.options.refused_retry if self._refused is not None else None

    async def _probe(self) -> None:
        """Lift the Degraded a refusal holds for `probe_window` s so that the upgrader can
        publish a new target (see the module's docstring); a new desiredConfig ends it early."""
        refused = self._refused
        node = A.NodeView.of(self.node.obj or {})
        if refused is None or node.get(A.STATE) != DEGRADED or node.desired_config != refused:
            return
        cause = node.get(A.REASON) or ""
        lift = self._lifts[1] + 1 if self._lifts[0] == refused else 1
        self._lifts = (refused, lift)
        self.log.info("refusal holds the NodePool; looking for a new target", config=refused,
                      lift=lift)  # fmt: skip
        with contextlib.suppress(KubeError, *TRANSIENT):
            # Each lift is its own Event (the lift's number makes it distinct): whoever sees
            # the NodePool's degraded message clear and come back finds why beside it.
            await self.events.emit(
                "RefusalLifted",
                refusal_lift_message(
                    refused, lift, self.options.probe_window, self.options.refused_retry, cause
                ),
            )
            await self._set(state="Working", reason=f"looking for a new NodePool target; {cause}")
            with contextlib.suppress(TimeoutError):
                await self.node.wait_for(
                    lambda obj: A.NodeView.of(obj or {}).desired_config != refused,
                    self.options.probe_window,
                )

    def _publish(self, outcome: Outcome | None) -> None:
        node = A.NodeView.of(self.node.obj or {})
        try:
            phase, prestaged = str(self.engine.journal.load().phase), self.engine.prestaged()
        except HostError:
            phase, prestaged = "unknown", None
        self.board.publish({
            "source": "hypershift",
            "state": node.get(A.STATE) or (outcome.state if outcome else ""),
            "reason": node.get(A.REASON) or "",
            "phase": phase,
            "currentConfig": node.get(A.CURRENT_CONFIG),
            "desiredConfig": node.desired_config,
            "upgradeConfigMap": self._configmap_name(),
            "prestaged": prestaged,
        })  # fmt: skip

    def _configmap_name(self) -> str | None:
        watch = self.configmap
        if watch is None:
            return None
        return f"{watch.collection.split('/')[4]}/{watch.name}"

    # -- one pass ----------------------------------------------------------------------------
    async def sync(self) -> Outcome | None:
        try:
            return await self._sync()
        except Unusable as exc:
            reason = f"cannot use {exc.error}"
            self.log.warning("input not usable", reason=reason)
            await self._degraded(reason)
            return Outcome(DEGRADED, reason, retryable=not exc.watched)

    async def _sync(self) -> Outcome | None:
        if self.node.obj is None:
            self.log.warning("own Node not found; waiting for it")
            return None
        node = A.NodeView.of(self.node.obj)
        self.events.node_uid = node.uid
        watch = self._follow_configmap()
        desired_hash, current_hash = node.desired_config, node.get(A.CURRENT_CONFIG)
        journal = self.engine.journal.load()
        if desired_hash is None or (
            desired_hash == current_hash and journal.phase not in IN_FLIGHT
        ):
            self._refused = None
            if node.get(A.STATE) == DEGRADED and str(journal.phase) == "idle":
                # What made it Degraded (a Node, a ConfigMap, a host file) is fixed and nothing
                # is asked: the Node says again what it said before (a Node never updated in
                # place had no state at all).
                if current_hash is None:
                    await self._set(state=None, reason=None)
                else:
                    await self._set(state="Done", reason="")
            return None  # nothing asked, or done: the upgrader reads these annotations
        await watch.synced.wait()
        configmap = watch.obj
        published = ((configmap or {}).get("data") or {}).get("hash")
        if published != desired_hash:
            # The upgrader writes the ConfigMap before desiredConfig; a kubelet-mounted copy
            # lags (the MCD may apply a stale payload then): never act on another target.
            self.log.info("waiting for the payload of the desired config", desired=desired_hash,
                          published=published)  # fmt: skip
            return None
        what = f"configmap {self._configmap_name()}"
        try:
            desired = self._desired(parsed(what, payload_from_configmap, configmap))
        except InputError as exc:
            raise Unusable(exc.located(what) if not exc.source else exc) from None
        await self._adopt_current(current_hash)
        if self.options.dry_run:
            outcome = await self.engine.reconcile(desired, dry_run=True)
            self.log.info("dry run", plan=outcome.plan.to_json() if outcome.plan else None)
            return None
        paused = self.prestager.paused() if self.prestager else contextlib.nullcontext()
        async with paused:  # a pre-stage never runs beside the update (bootc's one lock)
            return await self._update(node, desired_hash, desired)

    async def _update(self, node: A.NodeView, config_hash: str, desired: Desired) -> Outcome:
        journal = self.engine.journal.load()
        stuck = journal.update_key == desired.key and str(journal.phase) in (
            "degraded",
            "unreconcilable",
        )
        retry, self._retrying = self._retrying == desired.key, None
        if not stuck and not retry and node.get(A.STATE) != "Working":
            await self._set(state="Working", reason="")
        try:
            outcome = await self.engine.reconcile(desired)
        except DrainTimeout as exc:
            self._retrying = desired.key
            self.log.warning("update failed; retrying", error=str(exc))
            await self._degraded(str(exc))
            await self.events.emit("FailedToDrain", str(exc), warning=True)
            return Outcome(DEGRADED, str(exc), retryable=True)
        except HostError as exc:
            self._retrying = desired.key
            reason = f"host error ({exc.kind}): {exc}"
            self.log.warning("update failed; retrying", error=reason)
            await self._degraded(reason)
            return Outcome(DEGRADED, reason, retryable=True)
        await self._report(config_hash, desired, outcome)
        if outcome.state == DEGRADED and outcome.retryable:
            self._retrying = desired.key
        return outcome

    async def _report(self, config_hash: str, desired: Desired, outcome: Outcome) -> None:
        self._refused = None
        match outcome.state:
            case "Done":
                # What the engine committed: an update in flight when the upgrader moved this
                # node to a newer target (getAlreadyUnavailableCandidates) finishes first, and
                # is reported as what it is; the next pass takes the newer one.
                done = outcome.current_config or config_hash
                if outcome.plan is not None and outcome.plan.verdict == "live":
                    await self.events.emit("SkipReboot", f"Config changes to {done} applied "
                                           "live; no reboot or drain needed")  # fmt: skip
                await self.events.emit("NodeDone", f"Setting node {self.name}, currentConfig "
                                       f"{done} to Done")  # fmt: skip
                await self._record_for_the_mcd()
                await self._set(state="Done", reason="", currentConfig=done,
                                desiredDrain=f"uncordon-{done}")  # fmt: skip
            case "Unreconcilable":
                reason = refusal_reason(config_hash, outcome.reason)
                self._refused = config_hash
                await self.events.emit("FailedToReconcile", reason, warning=True)
                await self._degraded(reason)
            case "Degraded":
                extra: dict[str, str | None] = {}
                drained = A.NodeView.of(self.node.obj or {}).get(A.DESIRED_DRAIN) or ""
                # Rolled back or fell back: the node runs its last good image again and gets
                # its workloads back. Not when the rollback failed (the reason says so).
                if (
                    drained.startswith("drain-")
                    and not outcome.retryable
                    and not await self._still_on(desired)
                ):
                    extra["desiredDrain"] = f"uncordon-{config_hash}"
                await self.events.emit("FailedToReconcile", outcome.reason, warning=True)
                await self._degraded(outcome.reason, **extra)
            case _:
                pass  # Rebooting: the drain was asked for before the reboot

    async def _still_on(self, desired: Desired) -> bool:
        if desired.target is None:
            return False
        try:
            return (await self.host.bootc.status()).booted_digest == desired.target.digest
        except HostError as exc:
            self.log.warning("bootc status failed; the node stays cordoned", error=str(exc))
            return True

    async def _before_reboot(self, desired: Desired) -> None:
        """After staging, before the reboot: ask the drainer, as the MCD does in this mode,
        and wait for its acknowledgement."""
        config_hash = desired.config.name
        request = f"drain-{config_hash}"
        if self.prestager is not None:  # the lane passes on: the next pre-pull overlaps this drain
            await self.prestager.turn_staged()
        await self.events.emit("OSUpdateStaged", f"Changes to OS staged: {desired.target}")
        await self.events.emit("Drain", f"Draining node to update config {config_hash}")
        node = A.NodeView.of(self.node.obj or {})
        if node.get(A.LAST_APPLIED_DRAIN) != request:
            await self._set(state="Working", reason="", desiredDrain=request)
            try:
                await self.node.wait_for(
                    lambda obj: A.NodeView.of(obj or {}).get(A.LAST_APPLIED_DRAIN) == request,
                    self.options.drain_timeout,
                )
            except TimeoutError:
                raise DrainTimeout(f"failed to drain node: no acknowledgement of {request} "
                                   f"after {self.options.drain_timeout:g}s") from None  # fmt: skip
        await self.events.emit("Reboot", f"Node will reboot into config {config_hash}")

    async def _record_for_the_mcd(self) -> None:
        """What the MCD writes after each update in this mode (update.go:1403-1475): the
        applied MachineConfig as `/etc/mcd-currentconfig.json`, so that an MCD pod started on
        this node later (the way back) diffs from what the node runs."""
        document = self.engine.configs.current_document()
        if self.options.dry_run or document is None:
            return
        path = self.host.root / MCD_CURRENT_CONFIG.lstrip("/")
        try:
            await asyncio.to_thread(write_atomic, path, document, 0o644)
        except OSError as exc:
            raise HostError(f"cannot write {MCD_CURRENT_CONFIG}: {exc.strerror}") from None

    # -- the current config ------------------------------------------------------------------
    async def _adopt_current(self, current_hash: str | None) -> None:
        """With nothing recorded on the host yet, the baseline is what the MCD would read: its
        `/etc/mcd-currentconfig.json` (a node it updated in place), else the MachineConfig
        Ignition wrote at provisioning. Never the first-boot node-annotations.json: it names a
        rendered config, not a config-version hash (docs/mco-protocol.md §15)."""
        if self.engine.current_config() is not None or self.options.dry_run:
            return  # a dry run records nothing: it plans from what is recorded
        for path in (MCD_CURRENT_CONFIG, MC_CONTENT_PATH):
            raw = await asyncio.to_thread(self.host.files.read, path)
            if raw is None:
                continue
            name = current_hash or "provisioned"
            try:
                document = parsed(path, named_document, raw, name)
            except InputError as exc:
                raise Unusable(exc.located(path), watched=False) from None
            self.engine.adopt_current(document)
            self.log.info("current config adopted", path=path, name=name)
            return
        self.log.warning("no current config on the host; first start plans from none",
                         looked_in=[MCD_CURRENT_CONFIG, MC_CONTENT_PATH])  # fmt: skip


def refusal_reason(config_hash: str, reason: str) -> str:
    """A refusal as the NodePool's operator must read it (the upgrader copies it into the
    MachineSet's `nodePoolUpgradeInProgressFalse` and the NodePool's condition)."""
    parts = [part for part in reason.split("; ") if part and part != IMAGE_BUILD_HINT]
    hint = NODEPOOL_HINT if IMAGE_BUILD_HINT in reason else ""
    return "; ".join([f"NodePool config {config_hash} cannot be applied in place", *parts,
                      *([hint] if hint else [])])  # fmt: skip
