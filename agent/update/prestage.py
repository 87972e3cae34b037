"""Pre-staging: an update's image pull done before its turn, while the host stays idle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agent.core.desired import Desired
from agent.core.trust import changes_trust, stage_trust
from agent.host.ports import ProgressCallback
from agent.model.bootc_caps import prestage_path
from agent.model.sigpolicy import POLICY_PATH
from agent.update.engine_records import EngineRecords
from agent.update.journal import Phase


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


class Prestaging(EngineRecords):
    """The pre-stage pass of the engine: it runs only from the idle phase and leaves the
    journal idle, recording which image it pre-staged."""

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
