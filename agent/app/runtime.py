"""What every way of running the agent shares: the host, signals, the watchdog, status, exit codes.

`run` wires a desired-state source, a host and the engine together: file mode in
file_source.py, cluster and HyperShift modes in kube_source.py, standalone mode in
standalone.py; `verify` is run_verify here."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from agent.core.policy import Allowlist
from agent.errors import HostError, InputError
from agent.host.durable import write_json
from agent.host.ports import Host
from agent.model.bootc_caps import prestage_path
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.observe.http import StatusBoard
from agent.observe.metrics import Metrics
from agent.update.engine import DONE, REBOOTING, WORKING, Engine, Hooks, Outcome

if TYPE_CHECKING:  # the real-host adapters (dbus-fast) load only when a real host is used
    from agent.host.local import LocalOptions

EXIT_DONE, EXIT_USAGE, EXIT_REBOOT, EXIT_DEGRADED = 0, 2, 3, 4


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


def host_root(spec: str, root: str) -> Path:
    """The host's `/` as this process sees it (its /etc/machine-id, /etc/localtime): `root`
    (`--host-root`), or the simulated host's root for `simulated:DIR`."""
    kind, _, arg = spec.partition(":")
    if kind == "simulated" and arg:
        from standins.host.simulated import SimulatedHost

        return SimulatedHost(Path(arg)).root
    return Path(root)


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
