"""The state machine: the only place that orders side effects on a host.

Every transition is journaled before the side effect it names, and every side effect is
idempotent, so a process killed at any point resumes where it stopped: no second drain, no
second reboot, no half-written file (DESIGN.md §1.4)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from agent.core.desired import Desired
from agent.core.plan import CORE, LiveStep, Plan, live_changes, live_summary, plan_update
from agent.core.policy import BUILTIN_POLICY, LivePolicy
from agent.core.trust import StageTrust, changes_trust, stage_trust
from agent.core.verify import AfterBoot, BootFacts, decide_after_boot
from agent.errors import HostError, InputError
from agent.host.ports import Host, Progress, ProgressCallback
from agent.model.bootc_caps import prestage_path
from agent.model.bootc_status import BootcHost
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import MachineConfig
from agent.model.sigpolicy import POLICY_PATH
from agent.update.configstore import ConfigStore
from agent.update.journal import IN_FLIGHT, Journal, Phase, Record

DONE, WORKING, REBOOTING = "Done", "Working", "Rebooting"
DEGRADED, UNRECONCILABLE = "Degraded", "Unreconcilable"


@dataclass(frozen=True)
class Outcome:
    state: str  # Done | Rebooting | Degraded | Unreconcilable | Working (dry run)
    reason: str = ""
    plan: Plan | None = None
    current_config: str | None = None
    current_image: str | None = None
    retryable: bool = False  # a Degraded that may heal by trying again (registry, disk...)


@dataclass(frozen=True)
class PrestageResult:
    """What a pre-stage did: `staged`/`already-staged` (locked, download-only), `pulled`/
    `already-pulled` (into the repository, nothing staged), or `skipped`; `note` says why (a
    capability this bootc lacks, or why nothing was done)."""

    outcome: str
    note: str = ""

    @property
    def skipped(self) -> bool:
        return self.outcome == "skipped"

    def __str__(self) -> str:
        return f"{self.outcome}: {self.note}" if self.note else self.outcome


@dataclass
class Hooks:
    """Points where a caller observes the engine. `checkpoint` runs after every journal write
    and side effect (tests kill the engine there); `before_disruption` runs once, after
    staging and before the reboot (cluster mode drains there)."""

    checkpoint: Callable[[str], None] = lambda label: None
    progress: Callable[[Progress], None] = lambda progress: None
    before_disruption: Callable[[Desired], object] | None = None
    events: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # recent, for people
    # (kind, text) for counters: staged, stage-failed, reboot-failed, committed, rolled-back,
    # degraded; `seconds` is the update's duration when it ends.
    notice: Callable[[str, str, float | None], None] = lambda kind, text, seconds: None
    # (config name, document) just before an update's config becomes the current one: cluster
    # mode keeps the MCD's on-disk config current there (a coroutine is awaited).
    committing: Callable[[str, bytes], object] | None = None


class Engine:
    def __init__(
        self,
        host: Host,
        *,
        policy: LivePolicy = BUILTIN_POLICY,
        max_boot_attempts: int = 1,
        hooks: Hooks | None = None,
        soft_reboot: bool = False,
        external_current: Callable[[], tuple[bytes, str] | None] | None = None,
    ) -> None:
        self.host = host
        self.policy = policy
        self.max_boot_attempts = max(1, max_boot_attempts)
        self.soft_reboot = soft_reboot
        self.hooks = hooks or Hooks()
        self.journal = Journal(host.state_dir / "journal.json")
        self.configs = ConfigStore(host.state_dir, external_current)
        self.log = structlog.get_logger("engine").bind(root=str(host.root))

    # -- stored configs ------------------------------------------------------------------
    def current_config(self) -> MachineConfig | None:
        """The config recorded as the one the host runs; None when none is recorded yet.
        A recorded file that cannot be read or parsed raises HostError(kind="journal") naming
        the file and the field: it is reported Degraded and read again with backoff, never
        deleted or planned around (see agent/update/configstore.py)."""
        return self.configs.current()

    def adopt_current(self, document: bytes) -> None:
        """Record `document` as the config the host runs, when none is recorded yet."""
        self.configs.record_current(document)

    def follow_external(self) -> str | None:
        """The MCD's "disk is truth", which it applies at every start: when the other
        record of the current config (`external_current`, the MCD's) holds a config that was
        applied after this agent last recorded its own, that config is the current one. The
        journal names it first, with no image of its own (callers read the MCD's record,
        then the config's osImageURL), so a crash before the rest finds it newer again; then
        it is recorded as this agent's own, and an update left in flight here is dropped,
        never resumed over it (that would take the node back to an older config). Returns
        its name; None when nothing changed."""
        found = self.configs.external_differs()
        if found is None:
            return None
        config, document = found
        rec = self.journal.load()
        if rec.phase == Phase.COMMITTING and config == self.configs.pending():
            return None  # this agent's own commit, cut off between the two records
        dropped = rec.config_name if rec.phase in IN_FLIGHT else None
        self._save(Record(failed=rec.failed, failed_causes=rec.failed_causes,
                          verified_pull=rec.verified_pull, current_name=config.name))  # fmt: skip
        self.configs.record_current(document)
        self.configs.drop_pending()
        self._event(f"{config.name} was applied after this agent last ran here (the MCD's "
                    "on-disk config): it is the current config"
                    + (f"; the update to {dropped} left in flight is dropped" if dropped
                       else ""))  # fmt: skip
        return config.name

    def _pending(self) -> Desired:
        config, data = self.configs.pending_recorded()  # HostError naming the file if unusable
        rec = self.journal.load()
        target = parse_image_ref(rec.target) if rec.target else None
        return Desired(config, data, target)

    # -- bookkeeping ---------------------------------------------------------------------
    def _save(self, record: Record) -> Record:
        self.journal.save(record)
        self.hooks.checkpoint(f"journal:{record.phase}")
        return record

    def _did(self, what: str) -> None:
        self.hooks.checkpoint(f"did:{what}")

    def _notice(self, kind: str, text: str, rec: Record | None = None) -> None:
        seconds = time.time() - rec.started if rec is not None and rec.started else None
        self.hooks.notice(kind, text, seconds)

    def _event(self, text: str) -> None:
        self.hooks.events.append(text)
        self.log.info(text)

    @staticmethod
    def _booted_ref(status: BootcHost) -> ImageRef | None:
        ref = status.booted_ref
        try:
            return parse_image_ref(ref) if ref else None
        except InputError:
            return None

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

    async def _plan(
        self, desired: Desired, rec: Record, *, force: bool = False
    ) -> tuple[Plan, BootcHost]:
        status = await self.host.bootc.status()
        failed = frozenset(d for d, key in rec.failed.items() if key == desired.key)
        current = self.current_config()
        # Forced (the MCD's force file), or adopted from the cluster and never validated
        # here: nothing says the live files are as recorded, so all of them are written.
        # Refusals and image content are still decided from the recorded config.
        adopted = rec.current_name is None and not self.configs.has_external()
        plan = plan_update(
            current,
            desired.config,
            booted=self._booted_ref(status),
            target=desired.target,
            policy=self.policy,
            failed_digests=failed,
            rewrite_live=current is not None and (force or adopted),
        )
        return plan, status

    async def plan(self, desired: Desired) -> Plan:
        """The plan toward `desired` from the host as it is now; nothing changes."""
        plan, _ = await self._plan(desired, self.journal.load())
        return plan

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

    # -- pre-staging ---------------------------------------------------------------------
    async def prestage(
        self, desired: Desired, on_progress: ProgressCallback | None = None
    ) -> PrestageResult:
        """Take `desired`'s image pull out of the update that will ask for it, the best way
        this bootc can (model/bootc_caps.py): staged locked (download-only), or pre-pulled
        into the repository with nothing staged; the host keeps running and nothing else
        changes. HostError when bootc fails. Only from the idle phase: an update in flight
        owns the staged deployment. Again after a pre-pull, it checks the image is still in
        the repository (any staging prunes it) and pulls it again if not."""
        rec = self.journal.load()
        if rec.phase != Phase.IDLE:
            return PrestageResult("skipped", f"an update is in flight (phase {rec.phase})")
        plan, status = await self._plan(desired, rec)
        target = desired.target
        if plan.verdict != "image" or target is None or target.digest is None:
            return PrestageResult("skipped", f"the update would be {plan.verdict}, not an image")
        path = prestage_path(await self.host.bootc.capabilities())
        if path.kind == "none":
            return PrestageResult("skipped", path.note)
        policy = await asyncio.to_thread(self.host.files.read, POLICY_PATH)
        changed = changes_trust([step.path for step in plan.live], policy)
        if changed is not None:
            return PrestageResult("skipped", f"the update changes {changed}; the image is "
                                  "staged at this node's turn, once the new signature policy "
                                  "is written")  # fmt: skip
        rec = self.journal.load()  # read again: no await between this check and the write
        if rec.phase != Phase.IDLE:
            return PrestageResult("skipped", f"an update is in flight (phase {rec.phase})")
        if rec.prestage != str(target):
            self._save(rec.to(Phase.IDLE, prestage=str(target)))
        trust = stage_trust(policy, target)
        if path.kind == "pre-pull":
            verified = str(target) if trust.enforce else None
            if await self.host.bootc.pulled(target):
                if not trust.enforce or rec.verified_pull == verified:
                    return PrestageResult("already-pulled", path.note)
                # A signed pull of a present image verifies nothing either: drop it first.
                await self.host.bootc.prune()
            await self.host.bootc.pull(target, on_progress, trust=trust)
            rec = self.journal.load()
            if rec.phase == Phase.IDLE and rec.verified_pull != verified:
                self._save(rec.to(Phase.IDLE, verified_pull=verified))
            self._did("prestage")
            self._event(f"pre-pulled {target} into the repository (nothing staged: a reboot "
                        f"before the turn boots the running image); {path.note}")  # fmt: skip
            return PrestageResult("pulled", path.note)
        if status.staged_locked(target.digest):
            return PrestageResult("already-staged")
        await self.host.bootc.stage(target, on_progress, locked=True, trust=trust)
        self._did("prestage")
        self._event(f"pre-staged {target} (locked: applied only at its reboot)")
        return PrestageResult("staged")

    async def drop_prestage(self) -> bool:
        """Forget a pre-stage that is no longer wanted: stop its stage or pull if it still
        runs (a finished locked deployment needs nothing: no ordinary boot applies it, and the
        next stage replaces it; a pre-pulled image goes with the next stage's prune). Returns
        whether there was one."""
        rec = self.journal.load()
        if rec.phase != Phase.IDLE or rec.prestage is None:
            return False
        await self.host.bootc.cancel_stage()
        rec = self.journal.load()
        if rec.phase == Phase.IDLE and rec.prestage is not None:
            self._save(rec.to(Phase.IDLE, prestage=None))
        self._event(f"pre-stage of {rec.prestage} dropped")
        return True

    def prestaged(self) -> str | None:
        """The pinned ref pre-staged (or being pre-staged) while idle, from the journal."""
        rec = self.journal.load()
        return rec.prestage if rec.phase == Phase.IDLE else None

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
