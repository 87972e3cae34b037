"""When the agent validates the host, and what it does with a finding: at the first pass
after a start, before each update, on every drift monitor event and after each update,
against the current config (docs/mco-protocol.md §10). Cluster and file mode share it.

A finding is reported as the MCD reports it: Degraded with "unexpected on-disk state
validating against <config>: ..." (the Node's reason, or status.json's), an event
(`OnDiskStateValidationFailed` at a start, `PreflightConfigDriftCheckFailed` before an update,
`ConfigDriftDetected` from the monitor: a Kubernetes Event in cluster mode), and
`mcd_config_drift` set to when it was found. It heals when the host is right again: the next
validation is clean and the state goes back to Done. `/run/machine-config-daemon-force` skips
the validation and re-applies the config (engine `force`), then is removed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from agent.core.desired import Desired
from agent.core.policy import FORCE_FILE, LivePolicy
from agent.core.validate import Expectations, drift_reason
from agent.host.ports import Host
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.model.machineconfig import MachineConfig
from agent.update.drift_monitor import DriftMonitor, image_etc_files
from agent.update.engine import Engine
from agent.update.validator import Validation, Validator


class DriftMetrics(Protocol):
    """The two gauges this sets (observe/metrics.py): `mcd_config_drift` and the last
    validation's time by result."""

    config_drift: Any
    validated: Any


class DriftGuard:
    """`wakeup()`: a drift event wants a pass; `on_found(event reason, text)`: a finding the
    state does not carry yet, to say (an Event in cluster mode)."""

    def __init__(self, host: Host, metrics: DriftMetrics, wakeup: Callable[[], None],
                 on_found: Callable[[str, str], Awaitable[None]], *,
                 etc_ignore: tuple[str, ...] = DEFAULT_ETC_IGNORE) -> None:  # fmt: skip
        self.host, self.metrics, self.on_found = host, metrics, on_found
        self.validator = Validator(host, etc_ignore=etc_ignore)
        self.monitor = DriftMonitor(host.root, self._changed)
        self._wakeup = wakeup
        self._dirty = True  # validate at the first pass
        self._from_monitor = False
        self._validated = False  # since this process started
        self._reported: str | None = None  # the drift reason the Node has now
        self._found_at = 0.0
        self.log = structlog.get_logger("drift")

    @property
    def last(self) -> Validation | None:
        return self.validator.last

    def _changed(self) -> None:
        self._dirty, self._from_monitor = True, True
        self._wakeup()

    @property
    def unchecked(self) -> bool:
        """Whether something may have changed since the last validation (a start, a drift
        event, an update that stopped the monitor)."""
        return self._dirty

    def due(self) -> bool:
        """Whether a settled node needs validating: after a start, a drift event, or while
        no monitor runs (after an update, or after the monitor gave up)."""
        return self._dirty or not self.monitor.running

    async def forced(self) -> bool:
        """Whether the force file is there (then the pass skips the validation)."""
        present = await asyncio.to_thread(self.host.files.read, FORCE_FILE) is not None
        if present:
            self.log.info(f"Skipping on-disk validation; {FORCE_FILE} present")
        return present

    async def consume_force(self) -> None:
        await asyncio.to_thread(self.host.files.delete, FORCE_FILE)
        self.log.info(f"{FORCE_FILE} acted on and removed")

    async def gate(self, engine: Engine, desired: Desired, *, settled: bool, update_ahead: bool,
                   recorded: bool, image: str | None) -> str | None:  # fmt: skip
        """The validation a pass runs before anything else, when it is due; the Degraded
        reason that ends the pass, or None. `settled`: nothing to update and nothing
        reported (then only a start, a drift event or a stopped monitor make it due);
        `update_ahead`: the desired state is not the one last applied, so this pass updates
        if the host passes. They differ on a node Degraded by drift: unsettled, yet nothing
        to update, so another booted image is reported again, never booted back without the
        force file. `recorded`: a config is recorded on the host (a first start's adopted one
        says what the cluster thinks, not what was ever written here: nothing is checked
        against it); `image`: the one recorded."""
        if settled and not self.due():
            return None
        current = engine.current_config() if recorded else None
        if current is None:
            self._dirty = False  # nothing to check against: nothing left unchecked
            return None
        target = desired.target.digest if desired.target else None
        return await self._check(current, engine.policy, image or current.os_image_url,
                                 before_update=update_ahead, target=target)  # fmt: skip

    async def _check(self, config: MachineConfig, policy: LivePolicy, image: str | None, *,
                     before_update: bool, target: str | None) -> str | None:  # fmt: skip
        """Validate, report what is new, watch again; the Degraded reason when the host
        differs in a way the pass must not go past, else None."""
        # The MCD's three: at its start, before an update, and from its monitor (here also
        # a settled node's check after an update, which is what the monitor would see).
        if not self._validated:
            event = "OnDiskStateValidationFailed"
        elif before_update and not self._from_monitor:
            event = "PreflightConfigDriftCheckFailed"
        else:
            event = "ConfigDriftDetected"
        self._dirty = self._from_monitor = False
        expected = self.validator.expected(config, policy, image)
        self.watch(expected)  # first: what changes while this validates is seen
        # The force file is read at the pass's start, not by the validation: one touched
        # since then left its event in the monitor this restart dropped.
        if await asyncio.to_thread(self.host.files.read, FORCE_FILE) is not None:
            self._changed()
        result = await self.validator.validate(expected)
        self._validated = True
        self.metrics.validated.labels("ok" if result.ok else "drift").set(result.at)
        # Only an update ahead stages the target again (drained, at the controller's pace):
        # then a booted image other than the recorded one is what it ends. A settled node
        # running another image is reported, never rebooted.
        image_changes = before_update and target is not None and target != result.booted_digest
        blocking = result.blocking(image_changes=image_changes)
        if not blocking:
            self._found_at, self._reported = 0.0, None
            self.metrics.config_drift.set(0)
            return None
        reason = drift_reason(result.against, blocking)
        self._found_at = self._found_at or result.at
        self.metrics.config_drift.set(self._found_at)
        if reason != self._reported:
            self.log.warning("on-disk state differs from the current config", reason=reason)
            await self.on_found(event, reason)
        self._reported = reason
        return reason

    def watch(self, expected: Expectations) -> None:
        etc = image_etc_files(self.host.root, self.validator.etc_ignore, expected.paths)
        # The force file too: touching it acts at once, as the MCD's retry loop picks it up.
        self.monitor.start(expected, [*etc, FORCE_FILE])

    async def stop(self) -> None:
        await self.monitor.stop()
        self._dirty = True  # what happens meanwhile is validated after it
