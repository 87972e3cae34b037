"""What the cluster and HyperShift agents share: the pass loop (agent/cluster/passes.py) and the
staging progress written into the Node's reason (agent/cluster/node_writer.py)."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from agent.cluster.kube import KubeError
from agent.cluster.node_writer import ProgressReporter
from agent.cluster.passes import PassLoop
from agent.errors import HostError, InputError
from agent.host.ports import Progress
from agent.observe.metrics import Metrics
from agent.update.engine import DEGRADED, REBOOTING, Outcome

MIB = 1024 * 1024
LOG = structlog.get_logger("test")


def loop_of(sync, degraded: list[str], **kwargs) -> PassLoop:
    async def degrade(reason: str) -> None:
        degraded.append(reason)

    return PassLoop(sync, degrade, lambda outcome: None, asyncio.Event(),
                    reboot_ends_process=True, log=LOG, **kwargs)  # fmt: skip


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (HostError("disk full", kind="io"), "host error (io): disk full"),
        (InputError("not JSON", field="data.config"), "cannot use data.config: not JSON"),
        (ZeroDivisionError("division by zero"), "unexpected error: ZeroDivisionError"),
    ],
)
async def test_a_pass_that_fails_is_reported_degraded_and_retried(error, reason) -> None:
    async def sync() -> Outcome | None:
        raise error

    degraded: list[str] = []
    outcome = await loop_of(sync, degraded).one()
    assert outcome is not None and outcome.state == DEGRADED and outcome.retryable
    assert outcome.reason.startswith(reason), outcome.reason
    assert degraded == [outcome.reason]


async def test_an_api_failure_is_retried_without_a_write() -> None:
    async def sync() -> Outcome | None:
        raise KubeError(503, "ServiceUnavailable", "etcd leader changed")

    degraded: list[str] = []
    outcome = await loop_of(sync, degraded).one()
    assert outcome == Outcome(DEGRADED, "503 ServiceUnavailable: etcd leader changed",
                              retryable=True)  # fmt: skip
    assert degraded == []  # the API server would not take it either


async def test_a_simulated_reboot_ends_the_loop() -> None:
    async def sync() -> Outcome | None:
        return Outcome(REBOOTING)

    assert await loop_of(sync, []).run() == 3


async def test_the_idle_callback_runs_after_the_idle_timeout_only_with_no_failure() -> None:
    """A retryable outcome waits its backoff and passes again without the idle callback; an
    idle pass with an idle timeout calls it when no watch woke the loop."""
    outcomes = [Outcome(DEGRADED, "registry down", retryable=True), None, None]
    seen: list[str] = []

    async def sync() -> Outcome | None:
        if not outcomes:
            raise asyncio.CancelledError  # the end of the test
        outcome = outcomes.pop(0)
        seen.append("pass" if outcome is None else "retryable")
        return outcome

    async def idle() -> None:
        seen.append("idle")

    loop = loop_of(sync, [], idle_timeout=lambda: 0.05, on_idle=idle, retry_delays=(0.05,))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop.run(), 10)
    assert seen == ["retryable", "pass", "idle", "pass", "idle"]


async def test_a_watch_wakes_an_idle_loop_before_its_timeout() -> None:
    passes_run = 0
    idled: list[int] = []

    async def sync() -> Outcome | None:
        nonlocal passes_run
        passes_run += 1
        if passes_run == 3:
            raise asyncio.CancelledError
        return None

    async def idle() -> None:
        idled.append(passes_run)

    loop = loop_of(sync, [], idle_timeout=lambda: 60.0, on_idle=idle)

    async def wake() -> None:
        while passes_run < 3:
            loop.wakeup.set()
            await asyncio.sleep(0.01)

    waker = asyncio.create_task(wake())
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop.run(), 5)
    waker.cancel()
    assert idled == []  # woken each time long before 60 s


# -- staging progress -------------------------------------------------------------------------
def progress(done_mib: int) -> Progress:
    return Progress(done_bytes=done_mib * MIB, total_bytes=1380 * MIB)


async def test_progress_is_written_at_most_every_interval() -> None:
    written: list[str] = []

    async def report(reason: str) -> None:
        written.append(reason)

    metrics = Metrics()
    reporter = ProgressReporter(report, metrics, enabled=True, log=LOG, interval=0.2)
    reporter(progress(1))
    for mib in range(2, 20):  # a fast pull: all within the interval
        reporter(progress(mib))
    await asyncio.sleep(0.25)
    reporter(progress(412))
    await asyncio.sleep(0)
    await reporter.close()
    assert written == ["Staging image: 1/1380 MiB", "Staging image: 412/1380 MiB"]
    assert metrics.staging_bytes.labels("done")._value.get() == 412 * MIB  # every event counts


async def test_progress_never_has_two_writes_in_flight() -> None:
    started, release = [], asyncio.Event()

    async def report(reason: str) -> None:
        started.append(reason)
        await release.wait()

    reporter = ProgressReporter(report, Metrics(), enabled=True, log=LOG, interval=0.0)
    reporter(progress(1))
    await asyncio.sleep(0.01)
    reporter(progress(2))  # the first write is still in flight
    await asyncio.sleep(0.01)
    assert started == ["Staging image: 1/1380 MiB"]
    release.set()
    await asyncio.sleep(0.01)
    reporter(progress(3))
    await asyncio.sleep(0.01)
    await reporter.close()
    assert started == ["Staging image: 1/1380 MiB", "Staging image: 3/1380 MiB"]


async def test_progress_a_missed_write_is_dropped_and_a_dry_run_writes_none() -> None:
    calls: list[str] = []

    async def failing(reason: str) -> None:
        calls.append(reason)
        raise KubeError(500, "InternalError", "try again")

    reporter = ProgressReporter(failing, Metrics(), enabled=True, log=LOG, interval=0.0)
    reporter(progress(1))
    await asyncio.sleep(0.01)
    await reporter.close()  # nothing raised: progress is news, not state
    assert calls == ["Staging image: 1/1380 MiB"]

    dry = ProgressReporter(failing, Metrics(), enabled=False, log=LOG, interval=0.0)
    dry(progress(2))
    await asyncio.sleep(0.01)
    assert calls == ["Staging image: 1/1380 MiB"]
