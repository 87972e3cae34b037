"""The state machine: the only place that orders side effects on a host.

Every transition is journaled before the side effect it names, and every side effect is
idempotent, so a process killed at any point resumes where it stopped: no second drain, no
second reboot, no half-written file. The records it stands on are in engine_records.py, the
pre-stage pass in prestage.py, what a pass returns in outcome.py."""

from __future__ import annotations

import asyncio
import contextlib
import time

from agent.core.desired import Desired
from agent.core.plan import CORE, LiveStep, Plan, live_changes, live_summary
from agent.core.trust import StageTrust, stage_trust
from agent.core.verify import AfterBoot, BootFacts, decide_after_boot
from agent.errors import HostError
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.sigpolicy import POLICY_PATH
from agent.update.journal import IN_FLIGHT, Phase, Record
from agent.update.outcome import (
    DEGRADED,
    DONE,
    REBOOTING,
    UNRECONCILABLE,
    WORKING,
    Hooks,
    Outcome,
)
from agent.update.prestage import PrestageResult, Prestaging

# Callers import these from here: the engine's API is one module.
__all__ = ["DEGRADED", "DONE", "REBOOTING", "UNRECONCILABLE", "WORKING", "Engine", "Hooks",
           "Outcome", "PrestageResult"]  # fmt: skip


class Engine(Prestaging):
    """Moves a host one whole update toward a desired state (`reconcile`), finishes one a
    boot waited for (`verify_boot`), and pre-stages an image while idle (prestage.py)."""

    # -- entry point ---------------------------------------------------------------------
    async def reconcile(
        self, desired: Desired, *, dry_run: bool = False, force: bool = False
    ) -> Outcome:
        """Move the host one whole update toward `desired`, or finish the one in flight.
        `force` (the MCD's force file): every live file of `desired` is written again, and
        its image staged if another one is booted."""
        if not dry_run:
            self.follow_external()
        rec = self.journal.load()
        if dry_run:
            return await self._dry_run(rec, desired)
        if rec.phase in IN_FLIGHT:
            return await self._resume(rec)
        if force:
            return await self._start(rec, desired, force=True)
        if (
            rec.phase == Phase.DEGRADED
            and rec.update_key == desired.key
            and rec.failed.get((desired.target and desired.target.digest) or "") == desired.key
        ):
            return Outcome(DEGRADED, rec.cause or "", current_config=rec.current_name)
        return await self._start(rec, desired)

    async def _dry_run(self, rec: Record, desired: Desired) -> Outcome:
        plan, _ = await self._plan(desired, rec)
        note = f"dry run: journal phase {rec.phase}; would {plan.verdict}"
        return Outcome(WORKING, note, plan=plan, current_config=rec.current_name)

    async def _start(self, rec: Record, desired: Desired, *, force: bool = False) -> Outcome:
        plan, status = await self._plan(desired, rec, force=force)
        name = desired.config.name
        if plan.verdict == "refused":
            reason = "; ".join(plan.reasons)
            self._save(rec.to(Phase.UNRECONCILABLE, update_key=desired.key, cause=reason))
            return Outcome(UNRECONCILABLE, reason, plan=plan, current_config=rec.current_name)
        current = self.current_config()
        # Compared by content: the same config read from the MCD's file and from the API
        # server differ in their metadata, not in what the host runs.
        if plan.verdict == "none" and current is not None and current == desired.config:
            if rec.phase != Phase.IDLE or rec.update_key != desired.key:
                rec = self._save(rec.to(Phase.IDLE, cause=None, update_key=desired.key))
            return Outcome(DONE, plan=plan, current_config=rec.current_name,
                           current_image=rec.current_image)  # fmt: skip
        self.configs.record_pending(desired.document)
        booted = status.booted_ref
        rec = self._save(
            Record(
                phase=Phase.APPLYING_LIVE,
                started=time.time(),
                update_key=desired.key,
                config_name=name,
                target=str(desired.target) if desired.target else None,
                previous=booted,
                failed=rec.failed,
                failed_causes=rec.failed_causes,
                verified_pull=rec.verified_pull,
                current_name=rec.current_name,
                current_image=rec.current_image,
            )
        )
        self._event(f"update to {name}: {plan.verdict} ({plan.summary()})")
        return await self._execute(rec, desired, plan)

    async def _execute(
        self, rec: Record, desired: Desired, plan: Plan, *, resumed: bool = False
    ) -> Outcome:
        """Run `plan` from the APPLYING_LIVE phase on. `resumed`: a run of it was cut off, so
        files it wrote then are as wanted now and their follow-ups may not have run."""
        await self._apply_live(plan, resumed=resumed)
        if plan.verdict != "image":
            return await self._commit(rec.to(Phase.COMMITTING), plan)
        return await self._stage(rec.to(Phase.STAGING), plan)

    async def _apply_step(self, step: LiveStep) -> bool:
        """One live step; whether it changed the host (a file whose bytes, mode and owner
        match already is not written, so no watcher wakes and no mtime moves)."""
        files = self.host.files
        if step.kind == "ssh-keys":
            for folder in ("/home/core/.ssh", "/home/core/.ssh/authorized_keys.d"):
                await asyncio.to_thread(files.ensure_dir, folder, mode=0o700, user=CORE,
                                        group=CORE)  # fmt: skip
        if step.kind == "password":
            return await asyncio.to_thread(files.set_password_hash, "core",
                                           step.contents.decode())  # fmt: skip
        if step.action == "write":
            return await asyncio.to_thread(
                files.write, step.path, step.contents,
                mode=step.mode, user=step.user, group=step.group,
            )  # fmt: skip
        return await asyncio.to_thread(files.delete, step.path)

    async def _apply_live(self, plan: Plan, *, resumed: bool = False) -> None:
        files = self.host.files
        changed: list[LiveStep] = []
        for i, step in enumerate(plan.live):
            if await self._apply_step(step):
                changed.append(step)
                self.log.info("live write", path=step.path, action=step.action)  # no contents
            else:
                self.log.debug("live file as desired already", path=step.path)
            self._did(f"live:{i}")
        for step in plan.live:
            # /etc is 3-way merged from the image's /usr/etc: a file we manage live that the
            # image also ships there would have its image version silently shadowed.
            if (
                step.path.startswith("/etc/")
                and await asyncio.to_thread(files.read, "/usr" + step.path) is not None
            ):
                self._event(f"warning: {step.path} is managed live but the booted image also "
                            f"ships /usr{step.path}: the image's version is shadowed")  # fmt: skip
        # Only what a change asks for, except after a cut-off run, whose writes may be done
        # and their follow-ups not.
        for action in (plan if resumed else Plan(plan.verdict, live=tuple(changed))).follow_ups:
            await self.host.system.perform(action)
            self._did(f"action:{action}")
        if plan.live:
            self._event(live_summary(plan, changed))

    async def _stage(self, rec: Record, plan: Plan | None = None) -> Outcome:
        rec = self._save(rec)
        assert rec.target is not None
        target = parse_image_ref(rec.target)
        trust = StageTrust()
        try:
            # Read now, after the live writes: a policy that is live content governs the
            # image it arrives with.
            trust = await self._trust(target)
            await self._unverified_copy_pruned(rec, target, trust)
            # Locked where this bootc can: a reboot before the drain discards it, never
            # boots it undrained.
            locked = (await self.host.bootc.capabilities()).locked_staging
            fetched = await self.host.bootc.stage(target, self.hooks.progress, locked=locked,
                                                  trust=trust)  # fmt: skip
        except HostError as exc:
            cause = f"staging {target} failed ({exc.kind}): {exc}"
            if exc.kind == "signature":
                cause = f"staging {target} refused by the signature policy ({trust.scope}): {exc}"
            self._save(rec.to(Phase.DEGRADED, cause=cause))
            self._notice("stage-failed", cause)
            return Outcome(DEGRADED, cause, plan=plan, current_config=rec.current_name,
                           retryable=True)  # fmt: skip
        self._did("stage")
        self._event(f"staged {target}" + _fetched_note(fetched))
        self._notice("staged", str(target))
        if fetched is not None:
            self.hooks.notice("turn-fetched", str(fetched), None)
        if self.hooks.before_disruption is not None:
            result = self.hooks.before_disruption(self._pending())
            if asyncio.iscoroutine(result):
                await result
        return await self._reboot(rec.to(Phase.REBOOTING), plan, f"rebooting into {target}")

    async def _unverified_copy_pruned(
        self, rec: Record, target: ImageRef, trust: StageTrust
    ) -> None:
        """A stage that must verify `target` while a copy pulled unverified (a pre-pull under
        an earlier policy) sits in the repository: bootc would take that copy and verify
        nothing, so it goes first and the stage fetches and verifies."""
        if not trust.enforce or rec.verified_pull == str(target):
            return
        if await self.host.bootc.pulled(target) and target.digest != (
            (await self.host.bootc.status()).staged_digest
        ):
            await self.host.bootc.prune()
            self._event(f"{target} was pre-pulled without its signatures verified; pruned "
                        "from the repository so that this stage verifies it")  # fmt: skip

    async def _trust(self, target: ImageRef) -> StageTrust:
        """How the host's signature policy lets `target` be staged (core/trust.py)."""
        policy = await asyncio.to_thread(self.host.files.read, POLICY_PATH)
        return stage_trust(policy, target)

    async def _soft_reboots(self) -> int | None:
        count = getattr(self.host.system, "soft_reboots_count", None)  # real hosts only
        return await count() if count is not None else None

    async def _reboot(self, rec: Record, plan: Plan | None, why: str) -> Outcome:
        soft = False
        if rec.phase == Phase.REBOOTING:
            # A download-only (locked) staged deployment must be unlocked at the reboot slot, or
            # the reboot discards it; a soft reboot only where bootc says the deployment can.
            status = await self.host.bootc.status()
            soft = self.soft_reboot and bool(status.staged and status.staged.soft_reboot_capable)
            if soft and not (caps := await self.host.bootc.capabilities()).soft_reboot_at_turn:
                self._event(f"soft reboot unavailable: {caps.who} has no `upgrade "
                            "--from-downloaded --soft-reboot`; rebooting fully")  # fmt: skip
                soft = False
            if status.staged is not None:  # a boot retry reboots the booted target: none staged
                await self.host.bootc.unlock_staged(soft=soft)
        guard = getattr(self.host.system, "shutdown_delayed", None)
        # Hold a delay inhibitor while the journal records the reboot, so a shutdown that
        # someone else starts cannot land between the record and our own request.
        async with guard("image-mode-agent", why) if guard else contextlib.nullcontext():
            rec = self._save(
                rec.to(
                    rec.phase,
                    boot_id=await self.host.system.boot_id(),
                    soft_reboots=await self._soft_reboots(),
                    reboots=rec.reboots + 1,
                )
            )
        try:
            await self.host.system.reboot(soft=soft)
        except HostError as exc:
            self._notice("reboot-failed", str(exc))
            raise
        self._did("reboot")
        self._event(why)
        return Outcome(REBOOTING, why, plan=plan, current_config=rec.current_name)

    async def _commit(self, rec: Record, plan: Plan | None = None) -> Outcome:
        rec = self._save(rec)
        if self.hooks.committing is not None:
            result = self.hooks.committing(rec.config_name or "", self.configs.pending_document())
            if asyncio.iscoroutine(result):
                await result
        self.configs.commit()
        self._did("commit")
        rec = self._save(
            rec.to(
                Phase.IDLE,
                current_name=rec.config_name,
                current_image=rec.target or rec.current_image,
                cause=None,
                boot_id=None,
                attempts=0,
            )
        )
        self.configs.drop_pending()
        self._event(f"update to {rec.config_name} committed")
        self._notice("committed", rec.config_name or "", rec)
        return Outcome(
            DONE, plan=plan, current_config=rec.current_name, current_image=rec.current_image
        )

    async def verify_boot(self) -> Outcome | None:
        """The boot-time verifier's entry: finish an update waiting for this boot (verify,
        then commit or roll back); None when the journal expects no boot."""
        rec = self.journal.load()
        if rec.phase not in (Phase.REBOOTING, Phase.ROLLBACK_REBOOTING):
            return None
        return await self._resume(rec)

    # -- resuming ------------------------------------------------------------------------
    async def _resume(self, rec: Record) -> Outcome:
        self.log.info("resuming", phase=str(rec.phase))
        match rec.phase:
            case Phase.APPLYING_LIVE:
                pending = self._pending()
                plan, _ = await self._plan(pending, rec.to(Phase.IDLE))
                if plan.verdict not in ("live", "image", "none"):
                    reason = "; ".join(plan.reasons)
                    self._save(rec.to(Phase.UNRECONCILABLE, cause=reason))
                    return Outcome(UNRECONCILABLE, reason, plan=plan)
                return await self._execute(rec, pending, plan, resumed=True)
            case Phase.STAGING:
                return await self._stage(rec)
            case Phase.COMMITTING:
                return await self._commit(rec)
            case Phase.REBOOTING:
                return await self._after_boot(rec)
            case Phase.ROLLING_BACK:
                return await self._roll_back(rec)
            case _:  # ROLLBACK_REBOOTING
                return await self._after_rollback_boot(rec)

    async def _after_boot(self, rec: Record) -> Outcome:
        status = await self.host.bootc.status()
        target = parse_image_ref(rec.target) if rec.target else None
        facts = BootFacts(
            boot_id_before=rec.boot_id,
            boot_id_now=await self.host.system.boot_id(),
            booted_digest=status.booted_digest,
            target_digest=target.digest if target else None,
            attempts=rec.attempts,
            max_attempts=self.max_boot_attempts,
            soft_reboots_before=rec.soft_reboots,
            soft_reboots_now=await self._soft_reboots(),
        )
        verdict = decide_after_boot(facts)
        if verdict.decision == AfterBoot.NOT_REBOOTED:
            if target and status.staged_digest != target.digest:
                return await self._stage(rec.to(Phase.STAGING))  # the staged deployment is gone
            return await self._reboot(rec, None, f"rebooting into {target}")
        if verdict.decision == AfterBoot.FELL_BACK:
            return await self._degrade(rec, verdict.cause)
        facts = BootFacts(**{**facts.__dict__, "checks": await self.host.health.run_checks()})
        verdict = decide_after_boot(facts)
        for warning in verdict.warnings:
            self._event(warning)
        match verdict.decision:
            case AfterBoot.COMMIT:
                self._event(f"verified {target}: booted digest matches, required checks pass")
                return await self._commit(rec.to(Phase.COMMITTING))
            case AfterBoot.RETRY_BOOT:
                rec = rec.to(Phase.REBOOTING, attempts=rec.attempts + 1, cause=verdict.cause)
                return await self._reboot(
                    rec, None, f"check failed, boot attempt {rec.attempts + 1}"
                )
            case _:
                assert target is not None and target.digest is not None
                failed = {**rec.failed, target.digest: rec.update_key or ""}
                rec = self._save(rec.to(Phase.ROLLING_BACK, cause=verdict.cause, failed=failed))
                return await self._roll_back(rec)

    async def _revert_live(self) -> None:
        """The host runs its last good image again: put the live part back to the recorded
        config too, so that what is on disk matches what is reported (the MCD reverts files)."""
        current, pending = self.configs.current(), self.configs.pending()
        if current is None or pending is None:
            return
        steps = live_changes(pending, current, self.policy)
        if steps:
            await self._apply_live(Plan("revert", live=steps))
            self._event(f"reverted {len(steps)} live change(s) to {current.name}")

    async def _degrade(self, rec: Record, cause: str) -> Outcome:
        await self._revert_live()
        failed, causes = dict(rec.failed), dict(rec.failed_causes)
        if rec.target:
            digest = parse_image_ref(rec.target).digest or ""
            failed[digest], causes[digest] = rec.update_key or "", cause
        self._save(rec.to(Phase.DEGRADED, cause=cause, failed=failed, failed_causes=causes))
        self.configs.drop_pending()
        self._event(f"degraded: {cause}")
        self._notice("rolled-back" if rec.phase == Phase.ROLLBACK_REBOOTING else "degraded",
                     cause, rec)  # fmt: skip
        return Outcome(DEGRADED, cause, current_config=rec.current_name,
                       current_image=rec.current_image)  # fmt: skip

    async def _roll_back(self, rec: Record) -> Outcome:
        status = await self.host.bootc.status()
        target = parse_image_ref(rec.target) if rec.target else None
        on_target = target is not None and status.booted_digest == target.digest
        # `bootc rollback` is a toggle: only ask when it is not queued already.
        if on_target and not status.rollback_queued:
            try:
                await self.host.bootc.rollback()
            except HostError as exc:
                return await self._degrade(rec, f"{rec.cause}; rollback failed: {exc}")
            self._did("rollback")
        elif not on_target:
            return await self._degrade(rec, rec.cause or "rolled back")
        return await self._reboot(
            rec.to(Phase.ROLLBACK_REBOOTING), None, f"rolling back from {target}"
        )

    async def _after_rollback_boot(self, rec: Record) -> Outcome:
        boot_id = await self.host.system.boot_id()
        if boot_id == rec.boot_id:
            return await self._roll_back(rec.to(Phase.ROLLING_BACK))
        status = await self.host.bootc.status()
        cause = f"rolled back to {status.booted_ref}: {rec.cause}"
        return await self._degrade(rec, cause)


def _fetched_note(fetched: int | None) -> str:
    """How much the turn's stage fetched: 0 after a pre-pull or pre-stage that held."""
    if fetched is None:
        return ""
    if fetched == 0:
        return " (nothing fetched: the image was in the repository)"
    return f" ({fetched / (1024 * 1024):.1f} MiB fetched at the turn)"
