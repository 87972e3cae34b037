"""The loop of update passes both Node agents (cluster and HyperShift) run: a pass whatever fails
in it, the backoff after a retryable outcome, a wait for the watches otherwise, and the end of
the process when the host's reboot ends it (`Host.reboot_ends_process`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.cluster.kube import TRANSIENT, KubeError
from agent.errors import HostError, InputError, describe_fault, fault_frames
from agent.update.engine import DEGRADED, REBOOTING, Outcome

RETRY_DELAYS = (2.0, 5.0, 15.0, 60.0, 300.0)


def _no_idle_timeout() -> float | None:
    return None


@dataclass
class PassLoop:
    """`sync` is one pass; `degrade(reason)` reports what a pass could not (the Node's
    Degraded); `publish` shows each outcome (/status, /metrics). With nothing to retry the loop
    waits for `wakeup` (a watch saw a change), or for `idle_timeout()` seconds when that says
    so, and then calls `on_idle`."""

    sync: Callable[[], Awaitable[Outcome | None]]
    degrade: Callable[[str], Awaitable[None]]
    publish: Callable[[Outcome | None], None]
    wakeup: asyncio.Event
    reboot_ends_process: bool
    log: Any
    idle_timeout: Callable[[], float | None] = _no_idle_timeout
    on_idle: Callable[[], Awaitable[None]] | None = None
    retry_delays: tuple[float, ...] = RETRY_DELAYS

    async def run(self) -> int:
        """Until cancelled; returns 3 when the host's reboot ends the process."""
        failures = 0
        while True:
            self.wakeup.clear()
            outcome = await self.one()
            self.publish(outcome)
            if outcome is not None and outcome.state == REBOOTING:
                if self.reboot_ends_process:
                    return 3
                await asyncio.Event().wait()  # the shutdown stops us (SIGTERM)
            # A retryable outcome waits out the backoff, which grows until a pass ends
            # otherwise; any other waits for a watch to see a change.
            if outcome is not None and outcome.retryable:
                timeout = self.retry_delays[min(failures, len(self.retry_delays) - 1)]
                failures += 1
            else:
                failures, timeout = 0, self.idle_timeout()
            try:
                async with asyncio.timeout(timeout):
                    await self.wakeup.wait()
            except TimeoutError:
                if not failures and self.on_idle is not None:
                    await self.on_idle()

    async def one(self) -> Outcome | None:
        """One pass; whatever fails in it becomes an outcome, never the end of the process."""
        try:
            return await self.sync()
        except (KubeError, *TRANSIENT) as exc:
            self.log.warning("sync failed; retrying", error=str(exc))
            return Outcome(DEGRADED, str(exc), retryable=True)
        except HostError as exc:  # e.g. a certificate path the writer refuses
            reason = f"host error ({exc.kind}): {exc}"
            self.log.warning("sync failed; retrying", error=reason)
        except InputError as exc:  # unusable input no step attributed (sync reports those)
            reason = f"cannot use {exc}"
            self.log.warning("sync failed; retrying", error=reason)
        except Exception as exc:  # a bug, or a parser's crash nobody foresaw: report, retry
            reason = f"unexpected error: {describe_fault(exc)}"
            self.log.error("sync failed; retrying", error=reason, traceback=fault_frames(exc))
        with contextlib.suppress(KubeError, *TRANSIENT):
            await self.degrade(reason)
        return Outcome(DEGRADED, reason, retryable=True)
