"""The follow loop: check where the tag points, pre-stage a new digest, ask the strategy, then
let the engine reboot into it (and verify, and roll back) as it does every update.

One pass (`tick`):
1. An update in flight (the boot after a reboot, a stage cut short) is finished first; an
   update past the strategy's gate finishes without asking again.
2. The strategy hears that the host is steady (FleetLock: its reboot slot released) before
   anything new is looked for, as Zincati's initialization does; retried until accepted.
3. `bootc upgrade --check` says where the tag points. A digest that failed on this host (the
   journal's `failed`) is never staged again: the host stays on its image, Degraded with the
   reason, until the tag moves on. A check that fails still lets live config apply.
4. Live config applies first, on the booted image (no reboot, so no gate): a held reboot never
   holds back an SSH key. A new digest is then pre-staged locked (download-only, idle I/O) and
   the strategy is asked; held, the status says why and when the next window opens; allowed,
   the engine stages (already done) and reboots.
A pass that took a reboot slot and did not reboot hands it back on the next pass."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from agent.core.backoff import backoff
from agent.core.desired import Desired
from agent.core.plan import Plan
from agent.errors import HostError, InputError, describe_fault, fault_frames
from agent.follow.live_config import desired_state
from agent.host.ports import Host
from agent.model.imageref import ImageRef, parse_image_ref
from agent.observe.metrics import Metrics
from agent.sources.file import FileWatch
from agent.strategy.base import Decision, Strategy
from agent.update.engine import (
    DEGRADED,
    DONE,
    REBOOTING,
    WORKING,
    Engine,
    Outcome,
    PrestageResult,
)
from agent.update.journal import IN_FLIGHT

# A staged update held by the strategy is reported Working: an update is under way.
HELD = WORKING


@dataclass(frozen=True)
class FollowOptions:
    image: ImageRef  # the tag followed
    interval: float = 300.0  # seconds between checks of the tag
    jitter: float = 0.1  # each wait is longer by up to this fraction (Zincati: 0-10 %)
    live_config: Path | None = None
    once: bool = False
    dry_run: bool = False
    retry_initial: float = 5.0  # first wait after a failed check or steady report
    file_poll: float = 1.0  # seconds between checks of the live config file


Report = Callable[[Outcome, dict[str, Any]], None]


class FollowAgent:
    def __init__(
        self,
        host: Host,
        engine: Engine,
        strategy: Strategy,
        options: FollowOptions,
        report: Report,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.host, self.engine, self.strategy, self.options = host, engine, strategy, options
        self.report = report
        self.metrics = metrics or Metrics()
        self.rng = rng or random.Random()
        self.log = structlog.get_logger("follow").bind(image=str(options.image))
        self.steady = False  # the strategy accepted that this host holds no reboot slot
        self.failures = 0  # failed passes in a row (check, steady report), for the backoff
        self.latest: str | None = None  # the digest the tag pointed to at the last check
        self.decision: Decision | None = None
        self.asking: str | None = None  # when the unanswered reboot request was sent

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> Outcome:
        """Passes until stopped (or one with `once`); the outcome of the last pass."""
        watch = FileWatch(self.options.live_config, self.options.file_poll) \
            if self.options.live_config else None  # fmt: skip
        while True:
            seen = watch.mark() if watch else None
            outcome, wait = await self.tick()
            if self.options.once or self.options.dry_run:
                return outcome
            if outcome.state == REBOOTING:
                if self.host.reboot_ends_process:
                    return outcome
                await asyncio.Event().wait()  # the shutdown stops us (SIGTERM)
            if watch is not None:
                await watch.changed_since(seen, timeout=wait)
            else:
                await asyncio.sleep(wait)

    async def tick(self) -> tuple[Outcome, float]:
        """One pass; returns its outcome (already reported) and the seconds to wait."""
        try:
            outcome, wait = await self._pass()
        except InputError as exc:
            outcome = Outcome(DEGRADED, f"cannot use {exc}", retryable=True)
            wait = self._retry_wait()
        except HostError as exc:
            outcome = Outcome(DEGRADED, f"host error ({exc.kind}): {exc}", retryable=True)
            wait = self._retry_wait()
        except Exception as exc:  # a bug: report it and try again later, never stop
            reason = f"unexpected error: {describe_fault(exc)}"
            self.log.error("pass failed", error=reason, traceback=fault_frames(exc))
            outcome = Outcome(DEGRADED, reason, retryable=True)
            wait = self._retry_wait()
        else:
            if outcome.state != DEGRADED:
                self.failures = 0
        if outcome.state != REBOOTING:
            wait = min(wait, self._interval())
        self.report(outcome, self.status_extra(wait))
        self.log.info("followed", state=outcome.state, reason=outcome.reason,
                      next_check_in=round(wait, 1))  # fmt: skip
        return outcome, wait

    def _interval(self) -> float:
        return self.options.interval * (1 + self.rng.uniform(0, self.options.jitter))

    def _retry_wait(self) -> float:
        self.failures += 1
        return backoff(self.failures, self.options.retry_initial, self.options.interval)

    # -- one pass ------------------------------------------------------------------------
    async def _pass(self) -> tuple[Outcome, float]:
        rec = self.engine.journal.load()
        if rec.phase in IN_FLIGHT and not self.options.dry_run:
            target = parse_image_ref(rec.target) if rec.target else None
            outcome = await self.engine.reconcile(self._desired(target))
            if outcome.state == REBOOTING:
                return outcome, 0.0
            # Verified (or rolled back): the slot taken for that reboot goes back below.
            self.steady = False
        if not (self.steady or self.options.dry_run or await self._report_steady()):
            reason = (f"waiting for the {self.strategy.name} strategy to accept that this host "
                      "is steady (it may still hold a reboot slot)")  # fmt: skip
            return Outcome(HELD, reason, retryable=True), self._retry_wait()
        status = await self.host.bootc.status()
        booted = status.booted_digest
        check_error: str | None = None
        try:
            self.latest = await self.host.bootc.check_update(self.options.image)
            self.metrics.record_follow_check(True)
        except HostError as exc:
            self.metrics.record_follow_check(False)
            check_error = f"cannot check {self.options.image} ({exc.kind}): {exc}"
            self.latest = None
        journal = self.engine.journal.load()
        failed = journal.failed
        new = self.latest not in (None, booted) and self.latest not in failed
        if not new:
            self.decision = None  # no reboot pending: no decision to show
        if self.options.dry_run:
            target = self.latest if new else booted
            return await self._dry_run(self.options.image.with_digest(target) if target else None)
        # Live config first, on the booted image: a held reboot never holds an SSH key back.
        here = self.options.image.with_digest(booted) if booted else None
        outcome = await self.engine.reconcile(self._desired(here))
        if outcome.state != DONE:
            return outcome, self._retry_wait() if outcome.retryable else self._interval()
        if check_error is not None:
            return replace(outcome, state=DEGRADED, reason=check_error,
                           retryable=True), self._retry_wait()  # fmt: skip
        if self.latest in failed:
            # Why it failed comes first, for as long as the host stays off that digest.
            cause = journal.failed_causes.get(self.latest or "")
            reason = (f"{self.options.image} points to {self.latest}, which failed on this "
                      f"host before and is not staged again; running {booted} until the tag "
                      "moves on")  # fmt: skip
            reason = f"{cause}; {reason}" if cause else reason
            return replace(outcome, state=DEGRADED, reason=reason), self._interval()
        if not new:
            if self.engine.prestaged():
                await self.engine.drop_prestage()  # the tag moved back: no reboot wants it
            return outcome, self._interval()
        assert self.latest is not None
        return await self._update(self.options.image.with_digest(self.latest))

    async def _report_steady(self) -> bool:
        accepted = await self.strategy.report_steady()
        self.metrics.record_strategy(self.strategy, steady=accepted)
        self.log.info("report steady", strategy=self.strategy.name, accepted=accepted)
        self.steady = accepted
        return accepted

    def _desired(self, target: ImageRef | None) -> Desired:
        return desired_state(self.options.live_config, target)

    async def _dry_run(self, target: ImageRef | None) -> tuple[Outcome, float]:
        """Plan toward where the tag points (or the booted image); change and ask nothing."""
        outcome = await self.engine.reconcile(self._desired(target), dry_run=True)
        if outcome.plan is not None and outcome.plan.verdict == "image":
            outcome = replace(outcome, reason=outcome.reason + f"; the {self.strategy.name} "
                              "strategy decides when to reboot")  # fmt: skip
        return outcome, self._interval()

    async def _update(self, target: ImageRef) -> tuple[Outcome, float]:
        """A new digest: plan, pre-stage, ask the strategy, reboot when it allows."""
        desired = self._desired(target)
        plan = await self.engine.plan(desired)
        if plan.verdict != "image":  # refused (Unreconcilable), or nothing after all
            outcome = await self.engine.reconcile(desired)
            return outcome, self._interval()
        try:
            prestaged = await self.engine.prestage(desired, self.metrics.record_progress)
        except HostError as exc:
            if exc.kind != "unsupported":  # the registry, the disk, the signature policy
                reason = f"pre-staging {target} failed ({exc.kind}): {exc}"
                self.metrics.prestage_failures.labels(exc.kind).inc()
                return Outcome(DEGRADED, reason, plan=plan, retryable=True), self._retry_wait()
            prestaged = PrestageResult("skipped", str(exc))  # staged at the reboot
        self.log.info("pre-stage", target=str(target), result=str(prestaged))
        self.decision = await self._ask_to_reboot(target, plan, prestaged)
        self.metrics.record_strategy(self.strategy, self.decision)
        d = self.decision
        self.log.info("can finalize", strategy=self.strategy.name, allowed=d.allowed,
                      reason=d.reason, lock_held=d.lock_held,
                      next_window=d.next_window.isoformat() if d.next_window else None)  # fmt: skip
        if not self.decision.allowed:
            ready, held = _ready(target, prestaged), self.decision.reason
            if prestaged.skipped:
                reason = f"{ready}: {held} ({prestaged})"
            elif prestaged.outcome.endswith("pulled"):
                reason = f"{ready}; reboot held: {held} ({prestaged.note})"
            else:
                reason = f"{ready}; reboot held: {held}"
            wait = self.decision.retry_after if self.decision.retry_after is not None \
                else self._interval()  # fmt: skip
            return Outcome(HELD, reason, plan=plan), max(1.0, wait)
        if self.decision.lock_held:
            self.steady = False  # a slot is ours until a steady report gives it back
        outcome = await self.engine.reconcile(desired)
        if outcome.state == REBOOTING:
            return outcome, 0.0
        wait = self._retry_wait() if outcome.retryable else self._interval()
        return outcome, wait

    async def _ask_to_reboot(
        self, target: ImageRef, plan: Plan, prestaged: PrestageResult
    ) -> Decision:
        """The strategy's answer. A lock manager may take up to its client's timeout (or
        accept the connection and never answer): meanwhile the status says what is staged
        and that the reboot waits for that answer, since when."""
        self.decision = None
        self.asking = _iso(time.time())
        reason = (f"{_ready(target, prestaged)}; reboot waits for the {self.strategy.name} "
                  f"strategy's answer (asked at {self.asking})")  # fmt: skip
        self.report(Outcome(HELD, reason, plan=plan), self.status_extra(self.options.interval))
        try:
            return await self.strategy.can_finalize()
        finally:
            self.asking = None

    # -- status --------------------------------------------------------------------------
    def status_extra(self, wait: float) -> dict[str, Any]:
        """The follow part of /status and status.json."""
        return {
            "follow": {
                "image": str(self.options.image),
                "latestDigest": self.latest,
                "nextCheck": _iso(time.time() + wait),
                "strategy": self.strategy.describe(),
                "decision": self.decision.to_json() if self.decision else None,
                "askedSince": self.asking,  # a reboot request still unanswered
                "steadyReported": self.steady,
            }
        }

    async def aclose(self) -> None:
        closer = getattr(self.strategy, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()


def _ready(target: ImageRef, prestaged: PrestageResult) -> str:
    """How far the update got before the strategy's answer, as a reason begins."""
    if prestaged.skipped:
        return f"update to {target} waits"
    return f"{'pre-pulled' if prestaged.outcome.endswith('pulled') else 'staged'} {target}"


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
