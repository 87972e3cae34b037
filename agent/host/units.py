"""Units: what the agent knows of a unit's state, the contract of a unit runner (systemd's
transient units on a host), and the child-process runner used where there is no systemd.
Free of D-Bus, so that modules which only run commands do not load it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import HostError

_UNIT_SUFFIXES = (
    ".service", ".socket", ".device", ".mount", ".automount", ".swap", ".target", ".path",
    ".timer", ".slice", ".scope",
)  # fmt: skip


@dataclass(frozen=True)
class UnitState:
    """What systemd says about a unit (the service fields are empty for other unit types)."""

    name: str
    load_state: str = "not-found"
    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = ""
    exec_main_code: int = 0  # CLD_EXITED=1, CLD_KILLED=2, CLD_DUMPED=3
    exec_main_status: int = 0
    description: str = ""

    @property
    def running(self) -> bool:
        """Started and not yet finished (a RemainAfterExit service that exited is finished)."""
        if self.active_state in ("activating", "deactivating", "reloading"):
            return True
        return self.active_state == "active" and self.sub_state != "exited"

    @property
    def ok(self) -> bool:
        return self.active_state != "failed" and self.result in ("", "success")


class UnitRunner(Protocol):
    """Runs a named command so that it outlives the caller and can be found again by name.
    `can_bind_paths`: whether the `BindReadOnlyPaths` property takes effect (a private mount
    namespace for the unit)."""

    can_bind_paths: bool

    async def start_transient_service(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        properties: Mapping[str, Any] | None = None,
        description: str = "",
    ) -> str: ...

    async def unit_state(self, name: str) -> UnitState: ...

    async def wait_unit_finished(self, name: str, timeout: float) -> UnitState: ...

    async def stop_unit(self, name: str) -> str: ...

    async def clear_unit(self, name: str) -> None: ...


def unit_name(name: str) -> str:
    """`crio` → `crio.service`, as systemctl completes a bare name."""
    return name if name.endswith(_UNIT_SUFFIXES) else f"{name}.service"


@dataclass(frozen=True)
class ProcessResult:
    status: int | None  # None: killed at the deadline
    stdout: bytes
    stderr: bytes


_PIPE_GRACE = 2.0  # seconds to finish reading output once the command has exited


async def run_process(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> ProcessResult:
    """Run a command to completion or the deadline (then kill its process group). Output read
    so far is returned either way, so a timeout can still say what the command was doing."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()

    async def drain(stream: asyncio.StreamReader | None, into: bytearray) -> None:
        while stream is not None and (chunk := await stream.read(65536)):
            into.extend(chunk)

    readers = asyncio.gather(drain(proc.stdout, out), drain(proc.stderr, err))
    status: int | None = None
    try:
        async with asyncio.timeout(timeout):
            status = await _exit_status(proc)
    except TimeoutError:
        pass
    except BaseException:  # cancelled (a stop): nobody collects the output; stop reading it
        readers.cancel()
        readers.add_done_callback(_retrieve)
        _close_pipes(proc)
        raise
    finally:
        if proc.returncode is None:  # deadline or cancellation: end all of it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    await _exit_status(proc)
    try:
        async with asyncio.timeout(_PIPE_GRACE):
            await readers
    except TimeoutError:
        pass  # what was read is what the command said
    _close_pipes(proc)
    return ProcessResult(status, bytes(out), bytes(err))


async def _exit_status(proc: asyncio.subprocess.Process) -> int:
    """The exit status as soon as the process has exited. `Process.wait()` (Python 3.11) also
    waits for the pipes to close, which a grandchild in another session can hold open."""
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while proc.returncode is None and not waiter.done():
            await asyncio.wait({waiter}, timeout=0.05)
    finally:
        waiter.cancel()
        waiter.add_done_callback(_retrieve)
    assert proc.returncode is not None
    return proc.returncode


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Release pipes a grandchild may still hold (asyncio's Process has no public close); a
    no-op once they are closed."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's outcome as seen (no "exception was never retrieved" at exit)."""
    if not future.cancelled():
        future.exception()


class ProcessUnitRunner:
    """The unit runner for hosts without a reachable systemd (tests, some containers): plain
    child processes, keyed by unit name on this instance. Nothing survives the agent here.

    Of the unit `properties` only `Nice` has an effect: it is applied to the started process
    group right after the spawn, best effort (a child forked in that instant may keep the
    agent's priority). The rest (I/O class, CPU and I/O weights, ...) need systemd and are
    ignored, so a stage that needs a policy mounted is refused before it starts."""

    can_bind_paths = False

    def __init__(self, command_prefix: Sequence[str] = ()) -> None:
        self._prefix = list(command_prefix)
        self._procs: dict[str, tuple[asyncio.subprocess.Process, str]] = {}

    async def start_transient_service(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        properties: Mapping[str, Any] | None = None,
        description: str = "",
    ) -> str:
        if (await self.unit_state(name)).load_state == "loaded":
            raise HostError(f"unit {name} already exists", kind="exists")
        proc = await asyncio.create_subprocess_exec(
            *self._prefix,
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Like a unit, it does not inherit the agent's environment (in a pod that includes
            # `container`, which makes bootc refuse to run); only PATH and what is given.
            env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **(env or {})},
            start_new_session=True,  # its own group, so stop_unit can end all of it
        )
        self._procs[name] = (proc, description)
        _renice(proc.pid, (properties or {}).get("Nice"))
        return "done"

    async def unit_state(self, name: str) -> UnitState:
        entry = self._procs.get(name)
        return UnitState(name) if entry is None else self._state(name, *entry)

    @staticmethod
    def _state(name: str, proc: asyncio.subprocess.Process, description: str) -> UnitState:
        code = proc.returncode
        if code is None:
            return UnitState(name, "loaded", "active", "running", "success", 0, 0, description)
        if code == 0:
            return UnitState(name, "loaded", "active", "exited", "success", 1, 0, description)
        killed = code < 0
        return UnitState(
            name,
            "loaded",
            "failed",
            "failed",
            "signal" if killed else "exit-code",
            2 if killed else 1,
            -code if killed else code,
            description,
        )

    async def wait_unit_finished(self, name: str, timeout: float) -> UnitState:
        entry = self._procs.get(name)
        if entry is None:
            return UnitState(name)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(entry[0].wait())
        except TimeoutError:
            raise HostError(f"{name} still running after {timeout:g}s", kind="timeout") from None
        if self._procs.get(name) is not entry:  # stopped, or replaced by a new start
            return await self.unit_state(name)
        return self._state(name, *entry)

    async def stop_unit(self, name: str) -> str:
        entry = self._procs.get(name)
        if entry is not None and entry[0].returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(entry[0].pid, signal.SIGTERM)
            await entry[0].wait()
        self._procs.pop(name, None)
        return "done"

    async def clear_unit(self, name: str) -> None:
        await self.stop_unit(name)


def _renice(pgid: int, nice: Any) -> None:
    """Best effort: a plain integer `Nice` for the whole process group (the group, so that a
    command the wrapper already forked is covered too); a D-Bus Variant carries `.value`."""
    value = getattr(nice, "value", nice)
    if not isinstance(value, int) or isinstance(value, bool):
        return
    with contextlib.suppress(OSError):  # gone already, or a higher priority than we may set
        os.setpriority(os.PRIO_PGRP, pgid, value)
