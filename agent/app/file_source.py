"""`run --source file:PATH`: reconcile a host toward a MachineConfig file, until stopped or once.

Nothing the file-mode loop reads ends it: a desired file it cannot use (unreadable,
unparseable, a bad image reference), a config recorded on the host that cannot be parsed, an
unreadable journal, are reported Degraded (status.json and /status, the reason naming the file
and the field) and read again when the desired file changes or after the backoff. Only the
one-shot runs (`--once`, `--dry-run`) end on a desired file they cannot use: exit 2, one line
on stderr, as `plan` does."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import structlog

from agent.app.runtime import (
    EXIT_DONE,
    announce_bootc,
    exit_code,
    journal_phase,
    metered_hooks,
    until_signalled,
    write_status,
)
from agent.core.desired import Desired
from agent.core.policy import Allowlist
from agent.errors import HostError, InputError, describe_fault, fault_frames, parsing
from agent.host.ports import Host
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.observe.http import StatusBoard
from agent.sources.disruption_policy import load_live_policy
from agent.sources.file import FileWatch, load_desired
from agent.update.drift_guard import DriftGuard
from agent.update.engine import DEGRADED, DONE, REBOOTING, UNRECONCILABLE, Engine, Outcome
from agent.update.journal import IN_FLIGHT, Phase

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
            reason = await guard.gate(engine, desired, settled=settled, update_ahead=not settled,
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
