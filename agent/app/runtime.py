"""Wires a desired-state source, a host and the engine into a running agent (file mode).

Nothing the file-mode loop reads ends it: a desired file it cannot use (unreadable,
unparseable, a bad image reference), a config recorded on the host that cannot be parsed, an
unreadable journal, are reported Degraded (status.json and /status, the reason naming the file
and the field) and read again when the desired file changes or after the backoff. Only the
one-shot runs (`--once`, `--dry-run`) end on a desired file they cannot use: exit 2, one line
on stderr, as `plan` does."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from agent.core.desired import Desired
from agent.core.policy import Allowlist
from agent.errors import HostError, InputError, describe_fault, fault_frames, parsing
from agent.host.durable import write_json
from agent.host.ports import Host
from agent.model.bootc_caps import prestage_path
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.observe.http import StatusBoard
from agent.observe.metrics import Metrics
from agent.sources.disruption_policy import load_live_policy
from agent.sources.file import FileWatch, load_desired
from agent.update.drift_guard import DriftGuard
from agent.update.engine import (
    DEGRADED,
    DONE,
    REBOOTING,
    UNRECONCILABLE,
    WORKING,
    Engine,
    Hooks,
    Outcome,
)
from agent.update.journal import IN_FLIGHT, Phase

if TYPE_CHECKING:  # the real-host adapters (dbus-fast) load only when a real host is used
    from agent.host.local import LocalOptions

EXIT_DONE, EXIT_USAGE, EXIT_REBOOT, EXIT_DEGRADED = 0, 2, 3, 4
_RETRY_DELAYS = (5.0, 15.0, 60.0, 300.0)


@dataclass
class RunOptions:
    once: bool = False
    dry_run: bool = False
    image_override: str | None = None
    max_boot_attempts: int = 1
    poll_interval: float = 1.0
    soft_reboot: bool = False
    policy_file: Path | None = None  # MachineConfiguration/cluster, read on every pass
    etc_ignore: tuple[str, ...] = DEFAULT_ETC_IGNORE  # /etc paths that are never drift


def etc_ignore(extra: list[str] | None) -> tuple[str, ...]:
    """The /etc paths never taken for image drift: the built-in ones and `--etc-drift-ignore`."""
    return (*DEFAULT_ETC_IGNORE, *(extra or ()))


async def open_host(spec: str, allowlist: Allowlist, local: LocalOptions | None = None) -> Host:
    """`simulated:DIR` (the machine boots first, as it would before its services start) or
    `local` (this machine, or the one whose root is mounted at `local.root`)."""
    kind, _, arg = spec.partition(":")
    if kind == "simulated" and arg:
        # A simulated host is a stand-in (standins/), never loaded unless asked for.
        from standins.host.simulated import SimulatedHost

        sim = SimulatedHost(Path(arg))
        sim.boot()
        return sim.host(allowlist.allows)
    if spec == "local":
        from agent.host.local import UPDATE_TIMER, LocalOptions, local_host

        host, systemd = local_host(local or LocalOptions(), allowlist.allows)
        try:  # one driver only: bootc's own updater would stage and reboot behind our back
            await systemd.mask_unit(UPDATE_TIMER)
        except HostError as exc:
            structlog.get_logger("agent").warning("could not mask " + UPDATE_TIMER, error=str(exc))
        return host
    raise InputError(f"unknown host {spec!r}: expected simulated:DIR or local", field="--host")


async def watchdog() -> None:
    """READY=1 once, then WATCHDOG=1 as often as the unit's WatchdogSec asks (Type=notify);
    nothing when not started by systemd."""
    from agent.host.notify import Notifier

    notifier = Notifier()
    if not notifier.enabled:
        return
    notifier.ready("reconciling")
    interval = notifier.watchdog_interval()
    while interval:
        await asyncio.sleep(interval)
        notifier.watchdog()


async def run_verify(
    host: Host,
    max_boot_attempts: int,
    kubeconfig: str | None = None,
    node_name: str | None = None,
    node_deadline: float = 600.0,
) -> int:
    """The boot-time verifier: 0 when this boot is good (or nothing waited for it), 1 when it
    is not and a rollback or another boot was asked for. With a kubeconfig and a node name,
    the Node must also report Ready."""
    kube = None
    if kubeconfig and node_name:
        from agent.cluster.kube import Kube
        from agent.cluster.ready import node_ready_check
        from agent.host.health import WithExtraChecks

        kube = await Kube.connect(kubeconfig)
        host.health = WithExtraChecks(
            host.health, lambda: node_ready_check(kube, node_name, node_deadline)
        )
    try:
        engine = Engine(host, max_boot_attempts=max_boot_attempts)
        outcome = await engine.verify_boot()
    finally:
        if kube is not None:
            await kube.close()
    if outcome is None:
        print("verify: no update was waiting for this boot")
        return EXIT_DONE
    print(f"verify: {outcome.state}{': ' + outcome.reason if outcome.reason else ''}")
    return 1 if outcome.state == REBOOTING else EXIT_DONE


async def run_cluster_source(
    host: Host, allowlist: Allowlist, args: object, board: StatusBoard | None = None
) -> int:
    """`run --source kube`: credentials, the Node's name, then the cluster agent."""
    from agent.cluster.agent import ClusterAgent, ClusterOptions
    from agent.cluster.kube import Kube
    from agent.cluster.prestager import PrestageOptions

    node_name = getattr(args, "node_name", None) or os.environ.get("NODE_NAME")
    if not node_name:
        raise InputError("no node name: pass --node-name or set NODE_NAME", field="--node-name")
    api = await Kube.connect(getattr(args, "kubeconfig", None))
    node_kubeconfig = getattr(args, "node_kubeconfig", None)
    node_api = await Kube.connect(node_kubeconfig) if node_kubeconfig else api
    options = ClusterOptions(
        node_name=node_name,
        drain=getattr(args, "drain", "controller"),
        drain_timeout=getattr(args, "drain_timeout", 3600.0),
        dry_run=getattr(args, "dry_run", False),
        max_boot_attempts=getattr(args, "max_boot_attempts", 1),
        soft_reboot=getattr(args, "allow_soft_reboot", False),
        prestage=PrestageOptions(
            mode=getattr(args, "prestage", "pool"),
            slots=getattr(args, "prestage_slots", "auto"),
            jitter=getattr(args, "prestage_jitter", 60.0),
            retry_initial=getattr(args, "prestage_retry", 10.0),
            lease_namespace=getattr(
                args, "prestage_lease_namespace", "openshift-machine-config-operator"
            ),
            lease_seconds=getattr(args, "prestage_lease_seconds", 30),
        ),
        etc_ignore=etc_ignore(getattr(args, "etc_drift_ignore", None)),
    )
    board = board or StatusBoard()
    if not options.dry_run:
        await announce_bootc(host, board)
    agent = ClusterAgent(api, node_api, host, allowlist, options, board)
    try:
        return await until_signalled(agent.run())
    finally:
        # What this process asked of the API server, for capacity planning (a reboot ends it).
        structlog.get_logger("agent").info(
            "api requests", reads=api.counter.reads, writes=api.counter.writes,
            node_reads=node_api.counter.reads if node_api is not api else 0,
            node_writes=node_api.counter.writes if node_api is not api else 0,
        )  # fmt: skip
        await api.close()
        if node_api is not api:
            await node_api.close()


async def run_hypershift_source(
    host: Host, allowlist: Allowlist, args: object, board: StatusBoard | None = None
) -> int:
    """`run --source hypershift`: the kubelet's credentials, the Node's name, then the agent
    that stands in for the MCD pod of a hosted cluster's InPlace NodePool."""
    from agent.cluster.kube import Kube
    from agent.cluster.prestager import PrestageOptions
    from agent.hypershift.agent import HypershiftAgent, HypershiftOptions

    node_name = getattr(args, "node_name", None) or os.environ.get("NODE_NAME")
    if not node_name:
        raise InputError("no node name: pass --node-name or set NODE_NAME", field="--node-name")
    refused_retry = getattr(args, "refused_retry", 60.0)
    if not refused_retry > 0:
        raise InputError(f"must be > 0, got {refused_retry}", field="--refused-retry")
    options = HypershiftOptions(
        node_name=node_name,
        upgrade_namespace=getattr(args, "upgrade_namespace", None),
        upgrade_configmap=getattr(args, "upgrade_configmap", None),
        drain_timeout=getattr(args, "drain_timeout", 3600.0),
        dry_run=getattr(args, "dry_run", False),
        max_boot_attempts=getattr(args, "max_boot_attempts", 1),
        soft_reboot=getattr(args, "allow_soft_reboot", False),
        refused_retry=refused_retry,
        # The lanes' Leases live in the upgrade namespace (--prestage-lease-namespace is
        # cluster mode's), where deploy/hypershift/rbac.yaml lets the nodes use them.
        prestage=PrestageOptions(
            mode=getattr(args, "prestage", "pool"),
            slots=getattr(args, "prestage_slots", "auto"),
            jitter=getattr(args, "prestage_jitter", 60.0),
            retry_initial=getattr(args, "prestage_retry", 10.0),
            lease_seconds=getattr(args, "prestage_lease_seconds", 30),
        ),
    )
    api = await Kube.connect(getattr(args, "kubeconfig", None))
    board = board or StatusBoard()
    if not options.dry_run:
        await announce_bootc(host, board)
    agent = HypershiftAgent(api, host, allowlist, options, board)
    try:
        return await until_signalled(agent.run())
    finally:
        # One identity here (the kubelet's): everything is in reads/writes; the node_ fields
        # keep the line's shape the same as cluster mode's.
        structlog.get_logger("agent").info(
            "api requests", reads=api.counter.reads, writes=api.counter.writes,
            node_reads=0, node_writes=0,
        )  # fmt: skip
        await api.close()


async def until_signalled(work: Coroutine[Any, Any, int]) -> int:
    """Run `work`; SIGTERM or SIGINT cancel it at its next await and the process exits 0.
    The journal makes stopping safe at any point."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        return await work
    except asyncio.CancelledError:
        structlog.get_logger("agent").info("stopped by signal")
        return EXIT_DONE
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def write_status(
    host: Host,
    outcome: Outcome,
    phase: str,
    board: StatusBoard,
    extra: dict[str, Any] | None = None,
) -> None:
    """`status.json` beside the journal (what `image-mode-agent status` reads) and the
    status board behind `/status` and `/metrics`; `extra`: a mode's own part (follow)."""
    status: dict[str, Any] = {
        "state": outcome.state,
        "reason": outcome.reason,
        "phase": phase,
        "currentConfig": outcome.current_config,
        "currentImage": outcome.current_image,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **(extra or {}),
    }
    if board.bootc is not None:
        status["bootc"] = board.bootc
    try:
        write_json(host.state_dir / "status.json", status)
    except OSError as exc:
        # The file keeps its last status whole; /status still tells the truth, and the next
        # report writes the file again.
        structlog.get_logger("agent").warning(
            "status.json not written", path=str(host.state_dir / "status.json"),
            error=exc.strerror or str(exc),
        )  # fmt: skip
    board.publish(status)


async def announce_bootc(host: Host, board: StatusBoard) -> None:
    """Probe the host's bootc once at start: one log line naming what it has and lacks, the
    capability metric, and `bootc` in /status and status.json. A probe that fails is logged;
    the first bootc call that needs it fails again, with its own reason."""
    log = structlog.get_logger("agent")
    try:
        caps = await host.bootc.capabilities()
    except HostError as exc:
        log.warning("bootc capabilities unknown", error=str(exc), kind=exc.kind)
        return
    path = prestage_path(caps)
    board.publish_bootc({
        "version": caps.version or None,
        "capabilities": caps.named(),
        "prestage": path.kind,
        "note": path.note or None,
    })  # fmt: skip
    log.info("bootc capabilities", summary=caps.summary(), prestage=path.kind,
             note=path.note or None)  # fmt: skip


def metered_hooks(metrics: Metrics) -> Hooks:
    """Engine hooks that feed the agent's metrics (notices and staging progress)."""
    return Hooks(notice=metrics.notice, progress=metrics.record_progress)


def journal_phase(engine: Engine) -> str:
    try:
        return str(engine.journal.load().phase)
    except HostError:  # an unreadable journal: the pass reported it
        return "unknown"


def exit_code(outcome: Outcome) -> int:
    return {DONE: EXIT_DONE, REBOOTING: EXIT_REBOOT, WORKING: EXIT_DONE}.get(
        outcome.state, EXIT_DEGRADED
    )


async def run_file_source(
    path: Path,
    host: Host,
    options: RunOptions,
    out: TextIO = sys.stdout,
    board: StatusBoard | None = None,
    allowlist: Allowlist | None = None,
) -> int:
    """Reconcile PATH until stopped (or once). Returns the process exit code. `allowlist`:
    the one the host's files port asks, kept in step with `options.policy_file`."""
    board = board or StatusBoard()
    if not options.dry_run:
        await announce_bootc(host, board)
    loop = _reconcile_loop(path, host, options, out, board, allowlist)
    return await until_signalled(loop)


def _load_desired(path: Path, image_override: str | None) -> Desired:
    """The desired file; InputError naming it (a parser's crash on a shape it did not
    expect, too)."""
    return parsing(load_desired, path, image_override, source=str(path))


async def _reconcile(
    engine: Engine, desired: Desired, dry_run: bool, *, force: bool = False
) -> Outcome:
    """One pass of the engine toward `desired`; a failure is a retryable Degraded outcome."""
    try:
        outcome = await engine.reconcile(desired, dry_run=dry_run, force=force)
        # An update that finished may not be the newest desired state: one more pass.
        for _ in range(3):
            if outcome.state != DONE or engine.journal.load().update_key == desired.key:
                break
            outcome = await engine.reconcile(desired)
    except HostError as exc:  # a recorded config or the journal unreadable, too
        return Outcome(DEGRADED, f"host error ({exc.kind}): {exc}", retryable=True)
    except InputError as exc:  # other input than the desired file (its source names it)
        return Outcome(DEGRADED, f"cannot use {exc}", retryable=True)
    except Exception as exc:  # a bug, or a parser's crash nobody foresaw: report, retry
        reason = f"unexpected error: {describe_fault(exc)}"
        structlog.get_logger("agent").error("pass failed", error=reason,
                                            traceback=fault_frames(exc))  # fmt: skip
        return Outcome(DEGRADED, reason, retryable=True)
    return outcome


async def _reconcile_loop(
    path: Path,
    host: Host,
    options: RunOptions,
    out: TextIO,
    board: StatusBoard,
    allowlist: Allowlist | None,
) -> int:
    log = structlog.get_logger("agent")
    metrics = board.metrics
    hooks = metered_hooks(metrics)
    engine = Engine(host, max_boot_attempts=options.max_boot_attempts, hooks=hooks,
                    soft_reboot=options.soft_reboot)  # fmt: skip
    watch = FileWatch(path, options.poll_interval)
    drifted = asyncio.Event()

    async def found(reason: str, text: str) -> None:
        log.warning(reason, reason=text)

    guard = DriftGuard(host, metrics, drifted.set, found, etc_ignore=options.etc_ignore)
    try:
        return await _file_passes(path, host, options, out, board, allowlist, engine, watch,
                                  guard, drifted)  # fmt: skip
    finally:
        await guard.stop()


async def _guarded_pass(engine: Engine, desired: Desired, guard: DriftGuard) -> Outcome:
    """A pass that validates the host first, when due (update/drift_guard.py), and stops
    the drift monitor while it updates; the force file re-applies instead."""
    rec = engine.journal.load()
    if rec.phase in IN_FLIGHT:
        return await _reconcile(engine, desired, False)
    settled = rec.phase == Phase.IDLE and rec.update_key == desired.key
    force = await guard.forced()
    if not force:
        try:
            reason = await guard.gate(engine, desired, settled=settled,
                                      recorded=rec.current_name is not None,
                                      image=rec.current_image)  # fmt: skip
        except HostError as exc:
            return Outcome(DEGRADED, f"host error ({exc.kind}): {exc}", retryable=True)
        if reason is not None:
            return Outcome(DEGRADED, reason, current_config=rec.current_name,
                           current_image=rec.current_image)  # fmt: skip
        if settled:
            return await _reconcile(engine, desired, False)
    await guard.stop()  # the update's own writes are not drift
    outcome = await _reconcile(engine, desired, False, force=force)
    if force:
        await guard.consume_force()
    return outcome


async def _changed(watch: FileWatch, seen: Any, drifted: asyncio.Event,
                   timeout: float | None = None) -> None:  # fmt: skip
    """Until the desired file changes, the drift monitor reports, or `timeout` passes."""
    waits = [asyncio.ensure_future(watch.changed_since(seen, timeout=timeout)),
             asyncio.ensure_future(drifted.wait())]  # fmt: skip
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _file_passes(
    path: Path, host: Host, options: RunOptions, out: TextIO, board: StatusBoard,
    allowlist: Allowlist | None, engine: Engine, watch: FileWatch, guard: DriftGuard,
    drifted: asyncio.Event,
) -> int:  # fmt: skip
    log = structlog.get_logger("agent")
    failures = 0
    while True:
        seen = watch.mark()
        drifted.clear()  # what the monitor sees from here on brings the next pass
        try:
            if options.policy_file is not None:  # the allowlist of this pass, then its input
                engine.policy = load_live_policy(options.policy_file)
                if allowlist is not None:
                    allowlist.policy = engine.policy
            desired = _load_desired(path, options.image_override)
        except InputError as exc:
            if options.dry_run:
                raise  # a one-shot: exit 2 (cli), one line on stderr, nothing written
            outcome = Outcome(DEGRADED, f"cannot use the desired state: {exc}", retryable=True)
            if options.once:
                write_status(host, outcome, journal_phase(engine), board)
                raise
        else:
            outcome = await (_reconcile(engine, desired, True) if options.dry_run
                             else _guarded_pass(engine, desired, guard))  # fmt: skip
        if options.dry_run:
            if outcome.plan is None:  # a pass that failed: nothing was planned
                print(f"{outcome.state}: {outcome.reason}", file=sys.stderr)
                return exit_code(outcome)
            print(outcome.plan.render_text(), file=out)
            print(outcome.reason, file=out)
            return EXIT_DONE
        if outcome.state == DONE and guard.unchecked and not options.once:
            # An update (or a forced re-apply) just ended: validate what it left before the
            # status says Done with the last validation, and watch it from now on.
            continue
        phase = journal_phase(engine)
        validation = {"validation": guard.last.to_json() if guard.last else None}
        write_status(host, outcome, phase, board, validation)
        log.info("reconciled", state=outcome.state, reason=outcome.reason, phase=phase)
        if outcome.state in (DEGRADED, UNRECONCILABLE) and options.once:
            print(f"{outcome.state}: {outcome.reason}", file=sys.stderr)
        if options.once or (outcome.state == REBOOTING and host.reboot_ends_process):
            return exit_code(outcome)
        if outcome.state == REBOOTING:
            await asyncio.Event().wait()  # the shutdown stops us (SIGTERM)
        if outcome.state == DEGRADED and outcome.retryable:
            delay = _RETRY_DELAYS[min(failures, len(_RETRY_DELAYS) - 1)]
            failures += 1
            await _changed(watch, seen, drifted, timeout=delay)
        else:
            failures = 0
            await _changed(watch, seen, drifted)
