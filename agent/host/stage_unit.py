"""The stage unit: a long bootc command run as a named transient unit, and the files it leaves.

- Staging (`bootc switch`) and a pre-pull can take many minutes, so they run as the NAMED
  transient unit `image-mode-agent-stage.service` through a `UnitRunner` (systemd's
  StartTransientUnit on a real host): it keeps running across an agent restart, the restarted
  agent adopts it by name instead of starting a second one, and `cancel()` stops it. It runs at
  low priority (STAGE_PRIORITY): a pull must not starve the node's workloads of disk or CPU.
- Progress: bootc's `--progress-fd` writes JSON lines. A pipe cannot outlive the agent (and a full
  pipe with no reader would block bootc), so fd 3 of the command is a file in `run_dir` that the
  agent tails; stderr goes to a second file so a failure has its `error:` line.
- A stage policy (core/trust.py) is bind-mounted read-only over /etc/containers/policy.json in
  the unit's own mount namespace, never on the host."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from agent.core.trust import StageTrust
from agent.errors import HostError
from agent.host import bootc_errors
from agent.host.durable import write_atomic
from agent.host.ports import Progress, ProgressCallback
from agent.host.units import UnitRunner, UnitState
from agent.model.sigpolicy import POLICY_PATH

STAGE_UNIT = "image-mode-agent-stage.service"
# Runs bootc with stderr and fd 3 (progress) in files, then copies stderr to the unit's own
# stream (the journal) so `journalctl -u image-mode-agent-stage` still shows the error.
_WRAPPER = 'err=$1 prog=$2; shift 2; "$@" 2>"$err" 3>>"$prog"; rc=$?; cat "$err" >&2; exit $rc'
# systemd properties of the stage unit, as plain values (this module stays free of D-Bus; the
# systemd runner types them): idle I/O class (3) and low weights, so a pull only uses what the
# node's workloads leave, and a nice level for runners that can only renice.
STAGE_PRIORITY: Mapping[str, Any] = MappingProxyType(
    {"IOSchedulingClass": 3, "IOWeight": 10, "CPUWeight": 20, "Nice": 10}
)


def progress_from_event(line: str) -> Progress | None:
    """One `--progress-fd` JSON line (progress-v0 schema) as a Progress; None for others."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    kind, task = event.get("type"), str(event.get("task") or "")
    if kind == "ProgressBytes":
        return Progress(
            done_bytes=int(event.get("bytes") or 0),
            total_bytes=int(event.get("bytesTotal") or 0),
            step=task,
            cached_bytes=int(event.get("bytesCached") or 0),
        )
    if kind == "ProgressSteps":
        steps, total = int(event.get("steps") or 0), int(event.get("stepsTotal") or 0)
        return Progress(step=f"{task} {steps}/{total}" if total else task)
    return None


class StageUnit:
    """The one stage unit of a bootc adapter. `run_dir` is where the command's stderr and
    progress files live, as the command sees it; the agent reads them under `host_root` (the
    host's `/` as mounted in a pod). Callers serialize its use (the adapter's lock)."""

    def __init__(
        self,
        runner: UnitRunner,
        *,
        unit: str = STAGE_UNIT,
        run_dir: Path = Path("/run/image-mode-agent"),
        host_root: Path = Path("/"),
        env: Mapping[str, str] | None = None,
        progress_poll: float = 0.2,
    ) -> None:
        self.runner = runner
        self.unit = unit
        self._env = dict(env or {})
        self._poll = progress_poll
        self._run_dir = Path(run_dir)
        self._local_run_dir = Path(host_root) / self._run_dir.relative_to("/")
        self._cancelled = False

    async def running(self) -> bool:
        """Whether a command runs in the unit now (ours to adopt, or one replacing it)."""
        return (await self.runner.unit_state(self.unit)).running

    def check_bind(self, ref: str, trust: StageTrust) -> None:
        """Kind `signature` when `trust` needs a stage policy mounted and the runner cannot."""
        if trust.policy is not None and not self.runner.can_bind_paths:
            raise HostError(
                f"cannot verify {ref}: the stage policy needs a systemd unit to mount it",
                kind="signature",
            )

    def _paths(self, what: tuple[str, ...] = ("stderr", "progress")) -> tuple[Path, ...]:
        """Files beside the stage (stderr, progress by default) as the command sees them,
        then as the agent reads them."""
        names = tuple(f"{self.unit}.{suffix}" for suffix in what)
        return (
            *(self._run_dir / name for name in names),
            *(self._local_run_dir / name for name in names),
        )

    async def start_or_adopt(
        self, ref: str, argv: list[str], trust: StageTrust, verb: str = "stage"
    ) -> str:
        """Start `argv` in the unit, or adopt the run of it an earlier agent process started;
        returns the unit's description, which `follow` checks."""
        # The description names what the unit does and verifies: a stage started under other
        # trust (a pre-stage before the policy changed), or a pre-pull where a stage is wanted,
        # is never adopted.
        description = f"image-mode-agent: {verb} {ref}"
        if trust.enforce:
            description += " (signatures enforced)"
        state = await self.runner.unit_state(self.unit)
        if state.running and state.description == description:
            return description  # started by an earlier agent process: adopt, never start twice
        if state.running:
            await self.runner.stop_unit(self.unit)  # staging an older target: superseded
        if state.load_state == "loaded":
            await self.runner.clear_unit(self.unit)
        err, prog, local_err, local_prog = self._paths()
        self._local_run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in (local_err, local_prog):
            path.unlink(missing_ok=True)
        self._cancelled = False
        properties = dict(STAGE_PRIORITY)
        if trust.policy is not None:
            policy, local_policy = self._paths(("policy.json",))
            write_atomic(local_policy, trust.policy)  # 0600: mounted as the host's policy
            properties["BindReadOnlyPaths"] = [(str(policy), POLICY_PATH, False, 0)]
        wrapped = ["/bin/sh", "-c", _WRAPPER, "image-mode-agent-stage", str(err), str(prog), *argv]
        await self.runner.start_transient_service(
            self.unit, wrapped, env=self._env, properties=properties, description=description
        )
        return description

    async def follow(
        self,
        description: str,
        on_progress: ProgressCallback | None,
        what: str,
        timeout: float,
    ) -> None:
        """Wait for the unit's command to end, feeding its progress to `on_progress`; a
        failure is a HostError with bootc's reason, a stop or a newer stage kind `cancelled`,
        the deadline kind `timeout` (the unit is stopped)."""
        _, _, local_err, local_prog = self._paths()
        tail = asyncio.create_task(self._tail(local_prog, on_progress)) if on_progress else None
        final: UnitState | None = None
        try:
            final = await self.runner.wait_unit_finished(self.unit, timeout)
        except HostError as exc:
            if exc.kind != "timeout":
                raise
        finally:
            if tail is not None:
                tail.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tail
        stderr = _read_text(local_err)
        # The name as it is now, not as it was when our unit ended: a stage of a newer target
        # may have replaced ours meanwhile. Not ours to judge or clear (clearing would stop it).
        now = await self.runner.unit_state(self.unit) if final is not None else None
        if now is not None and now.load_state == "loaded" and now.description != description:
            raise HostError("staging was superseded by a newer stage", kind="cancelled")
        if final is None:  # deadline: stop the unit; a later stage starts afresh
            await self.runner.stop_unit(self.unit)
            await self.runner.clear_unit(self.unit)
            raise bootc_errors.timed_out(what, stderr, timeout)
        await self.runner.clear_unit(self.unit)
        if self._cancelled:
            raise HostError("staging was cancelled", kind="cancelled")
        if final.load_state != "loaded":  # stopped by someone else, then garbage-collected
            raise HostError(f"{self.unit} was stopped before bootc finished", kind="cancelled")
        if not final.ok or final.exec_main_status != 0:
            raise bootc_errors.failure(what, stderr, final.exec_main_status)

    def fetched(self) -> int:
        """The bytes the last stage fetched, from its progress events: `bytes - bytesCached`
        of the pull; 0 when bootc reported no pull (the image was in the repository)."""
        _, local_prog = self._paths(("progress",))
        fetched = 0
        for line in _read_text(local_prog).splitlines():
            progress = progress_from_event(line)
            if progress is not None and progress.total_bytes:
                fetched = max(fetched, progress.done_bytes - progress.cached_bytes)
        return fetched

    async def _tail(self, path: Path, on_progress: ProgressCallback) -> None:
        """Feed progress lines to the callback as bootc appends them (a partial last line
        waits for its newline); when cancelled, read once more so the final event lands."""
        offset, pending = 0, b""

        def feed() -> None:
            nonlocal offset, pending
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                return
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                progress = progress_from_event(line.decode(errors="replace"))
                if progress is not None:
                    on_progress(progress)

        try:
            while True:
                feed()
                await asyncio.sleep(self._poll)
        finally:
            feed()

    async def cancel(self) -> None:
        """Stop the running command (the waiting `follow()` then raises kind `cancelled`)."""
        self._cancelled = True
        state = await self.runner.unit_state(self.unit)
        if state.running:
            await self.runner.stop_unit(self.unit)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
