"""The engine's records: the journal, the stored configs, and what each write tells the hooks.

Every pass of the engine (prestage.py, engine.py) stands on these, and plans from them."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from agent.core.desired import Desired
from agent.core.plan import Plan, plan_update
from agent.core.policy import BUILTIN_POLICY, LivePolicy
from agent.errors import InputError
from agent.host.ports import Host
from agent.model.bootc_status import BootcHost
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import MachineConfig
from agent.update.configstore import ConfigStore
from agent.update.journal import IN_FLIGHT, Journal, Phase, Record
from agent.update.outcome import Hooks


class EngineRecords:
    """The state an engine keeps on the host (`host.state_dir`) and the bookkeeping of every
    journal write; the passes live in the classes built on it (prestage.py, engine.py)."""

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

    # -- planning ------------------------------------------------------------------------
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
