"""systemd and logind over D-Bus: the SystemPort of a real host and the unit runner of staging.

dbus-fast, asyncio; the connection is in systemd_bus.py, sd_notify in notify.py, the unit
contract and the subprocess fallback runner in units.py.

Why D-Bus and not `systemctl`: job results arrive as `JobRemoved` signals (no polling, no parsing
of human output), the agent can run in a pod with only the host's bus socket mounted, and a test
can point the same code at a private `systemd --user` manager (bus address is a parameter)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dbus_fast import Variant

from agent.errors import HostError
from agent.host.notify import Notifier  # noqa: F401  (re-exported: part of this API)
from agent.host.systemd_bus import (
    LOGIND,
    LOGIND_MANAGER,
    LOGIND_PATH,
    MANAGER,
    PROPERTIES,
    SERVICE,
    SYSTEMD,
    SYSTEMD_PATH,
    UNIT,
    UNKNOWN_METHOD,
    DBusCallError,
    SystemdBus,
    as_variant,
)
from agent.host.units import (  # noqa: F401  (re-exported)
    ProcessResult,
    ProcessUnitRunner,
    UnitRunner,
    UnitState,
    run_process,
    unit_name,
)

_NO_PROPERTY = (
    "org.freedesktop.DBus.Error.UnknownProperty",
    "org.freedesktop.DBus.Error.InvalidArgs",
)
_NO_UNIT_FILE = (
    "org.freedesktop.DBus.Error.FileNotFound",
    "System.Error.ENOENT",
    "org.freedesktop.systemd1.NoSuchUnit",
)


class ShutdownInhibitor:
    """A held logind inhibitor lock; released by closing the fd logind handed out."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Systemd(SystemdBus):
    """The SystemPort and UnitRunner of a real host, over systemd's and logind's D-Bus APIs.

    `bus_address` None means the system bus (or the session bus with `system_bus=False`);
    tests pass the address of a private bus that a `systemd --user` manager is on."""

    can_bind_paths = True

    def __init__(
        self,
        bus_address: str | None = None,
        *,
        system_bus: bool = True,
        job_timeout: float = 120.0,
        call_timeout: float = 30.0,
        command_timeout: float = 300.0,
        boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id"),
        update_ca_trust: Sequence[str] = ("update-ca-trust",),
        command_prefix: Sequence[str] = (),
        poll_interval: float = 1.0,
    ) -> None:
        super().__init__(bus_address, system_bus=system_bus, call_timeout=call_timeout)
        self.job_timeout = job_timeout
        self.command_timeout = command_timeout
        self.boot_id_path = Path(boot_id_path)
        self._update_ca_trust = [*command_prefix, *update_ca_trust]
        self._poll = poll_interval

    async def __aenter__(self) -> Systemd:
        await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- jobs ----------------------------------------------------------------------------
    async def _job(self, member: str, name: str, mode: str = "replace") -> str:
        """Queue a unit job and wait for its JobRemoved; returns systemd's result string
        (`done`, `failed`, `canceled`, `timeout`, `dependency`, `skipped`)."""
        (job,) = await self._manager(member, "ss", unit_name(name), mode)
        if job in self._early_jobs:
            return self._early_jobs.pop(job)
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._job_waiters[job] = waiter
        try:
            async with asyncio.timeout(self.job_timeout):
                return await waiter
        except TimeoutError:
            raise HostError(
                f"{member} {name}: job not finished after {self.job_timeout:g}s", kind="timeout"
            ) from None
        finally:
            self._job_waiters.pop(job, None)

    async def start_unit(self, name: str) -> str:
        return await self._job("StartUnit", name)

    async def stop_unit(self, name: str) -> str:
        try:
            return await self._job("StopUnit", name)
        except DBusCallError as exc:
            if exc.name == "org.freedesktop.systemd1.NoSuchUnit":
                return "done"  # a transient unit that ended and was collected: stopped already
            raise

    async def restart_unit(self, name: str) -> str:
        return await self._job("RestartUnit", name)

    async def reload_unit(self, name: str) -> str:
        return await self._job("ReloadUnit", name)

    async def daemon_reload(self) -> None:
        # Manager.Reload replies once the reload is complete; it can take a while on big hosts.
        await self._call(SYSTEMD, SYSTEMD_PATH, MANAGER, "Reload", timeout=self.job_timeout)

    async def mask_unit(self, name: str, *, stop: bool = True) -> None:
        """Mask persistently (runtime=false: survives reboots) and reload. A masked unit that is
        still active keeps running, so stop it too: for `bootc-fetch-apply-updates.timer` a live
        timer would still fire `bootc upgrade --apply`."""
        await self._manager("MaskUnitFiles", "asbb", [unit_name(name)], False, True)
        await self.daemon_reload()
        if stop and (await self.unit_state(name)).active_state in ("active", "activating"):
            await self.stop_unit(name)

    async def unmask_unit(self, name: str) -> None:
        await self._manager("UnmaskUnitFiles", "asb", [unit_name(name)], False)
        await self.daemon_reload()

    # -- units ---------------------------------------------------------------------------
    async def _unit_path(self, name: str) -> str:
        # LoadUnit (not GetUnit) so that a unit not loaded yet reads as not-found/inactive
        # instead of an error.
        (path,) = await self._manager("LoadUnit", "s", unit_name(name))
        return str(path)

    async def _get_all(self, path: str, iface: str) -> dict[str, Any]:
        reply = await self._call(SYSTEMD, path, PROPERTIES, "GetAll", "s", [iface])
        return {key: value.value for key, value in reply.body[0].items()}

    async def unit_state(self, name: str) -> UnitState:
        full = unit_name(name)
        path = await self._unit_path(full)
        unit = await self._get_all(path, UNIT)
        service: dict[str, Any] = {}
        if full.endswith(".service") and unit.get("LoadState") != "not-found":
            service = await self._get_all(path, SERVICE)
        return UnitState(
            name=full,
            load_state=str(unit.get("LoadState", "")),
            active_state=str(unit.get("ActiveState", "")),
            sub_state=str(unit.get("SubState", "")),
            result=str(service.get("Result", "")),
            exec_main_code=int(service.get("ExecMainCode", 0)),
            exec_main_status=int(service.get("ExecMainStatus", 0)),
            description=str(unit.get("Description", "")),
        )

    async def unit_file_state(self, name: str) -> str:
        """Manager.GetUnitFileState, in `systemctl is-enabled`'s words; `not-found` for a unit
        with no unit file (systemd answers ENOENT as FileNotFound)."""
        try:
            (state,) = await self._manager("GetUnitFileState", "s", unit_name(name))
        except DBusCallError as exc:
            if exc.name in _NO_UNIT_FILE:
                return "not-found"
            raise
        return str(state)

    async def wait_unit_finished(self, name: str, timeout: float) -> UnitState:
        """Wait until the unit is no longer starting or running; PropertiesChanged wakes us,
        a slow poll covers a missed signal."""
        path = await self._unit_path(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = asyncio.Event()
        self._unit_watchers.setdefault(path, set()).add(event)
        try:
            while True:
                event.clear()
                state = await self.unit_state(name)
                if not state.running:
                    return state
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise HostError(f"{name} still running after {timeout:g}s", kind="timeout")
                # asyncio.timeout, never wait_for, across this package: on Python 3.11
                # wait_for can swallow a cancellation that races its completion (fixed in
                # 3.12), and an agent stopped mid-stage must stay stopped.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, self._poll)):
                        await event.wait()
        finally:
            watchers = self._unit_watchers.get(path, set())
            watchers.discard(event)
            if not watchers:
                self._unit_watchers.pop(path, None)

    async def start_transient_service(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        properties: Mapping[str, Any] | None = None,
        description: str = "",
    ) -> str:
        """Start `argv` as transient service `name`; returns the start job's result. Type=exec:
        the job ends once the command runs; RemainAfterExit: the result stays readable after the
        process ends (an adopting agent reads it), until `clear_unit`. Mode "fail": a second
        start of a unit that exists is an error, never a second process. `properties`: Variants,
        or plain values for the names in PLAIN_PROPERTY_SIGNATURES (systemd_bus.py)."""
        exe = argv[0] if argv[0].startswith("/") else shutil.which(argv[0])
        if not exe:
            raise HostError(f"cannot start {name}: {argv[0]} not found", kind="systemd")
        props: dict[str, Variant] = {
            "Description": Variant("s", description or name),
            "Type": Variant("s", "exec"),
            "RemainAfterExit": Variant("b", True),
            "ExecStart": Variant("a(sasb)", [[exe, [exe, *argv[1:]], False]]),
        }
        if env:
            props["Environment"] = Variant("as", [f"{k}={v}" for k, v in env.items()])
        props.update({key: as_variant(key, value) for key, value in (properties or {}).items()})
        try:
            (job,) = await self._manager(
                "StartTransientUnit", "ssa(sv)a(sa(sv))",
                unit_name(name), "fail", [[k, v] for k, v in props.items()], [],
            )  # fmt: skip
        except DBusCallError as exc:
            if exc.name == "org.freedesktop.systemd1.UnitExists":
                raise HostError(f"unit {name} already exists", kind="exists") from None
            raise
        result = self._early_jobs.pop(job, None)
        if result is None:
            waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self._job_waiters[job] = waiter
            try:
                async with asyncio.timeout(self.job_timeout):
                    result = await waiter
            finally:
                self._job_waiters.pop(job, None)
        # "failed" is no error here: a command that exits non-zero at once can fail the start
        # job (Type=exec races its exit); the unit keeps the result for wait_unit_finished.
        return result

    async def clear_unit(self, name: str) -> None:
        """Forget a finished transient unit (stop an exited one, reset a failed one) so the
        name can be used again."""
        state = await self.unit_state(name)
        if state.active_state == "failed":
            await self._manager("ResetFailedUnit", "s", unit_name(name))
        elif state.active_state != "inactive":
            await self.stop_unit(name)

    # -- boot, reboot, inhibitors ---------------------------------------------------------
    async def boot_id(self) -> str:
        return self.boot_id_path.read_text().strip()

    async def soft_reboots_count(self) -> int:
        """systemd's SoftRebootsCount (v254+); 0 where the property does not exist."""
        try:
            reply = await self._call(
                SYSTEMD, SYSTEMD_PATH, PROPERTIES, "Get", "ss", [MANAGER, "SoftRebootsCount"]
            )
        except DBusCallError as exc:
            if exc.name in _NO_PROPERTY:
                return 0
            raise
        return int(reply.body[0].value)

    async def reboot(self, *, soft: bool = False) -> None:
        """Request a reboot and return. Soft: systemd's SoftReboot (v254+; bootc prepared the
        next root); where systemd lacks it, fall back to a full reboot, which a prepared
        /run/nextroot on systemd >= 255 turns into a soft one anyway."""
        if soft:
            try:
                await self._manager("SoftReboot", "s", "")
                return
            except DBusCallError as exc:
                if exc.name != UNKNOWN_METHOD:
                    raise
        # interactive=false: never wait for a polkit prompt.
        await self._call(LOGIND, LOGIND_PATH, LOGIND_MANAGER, "Reboot", "b", [False])

    async def inhibit_shutdown(self, who: str, why: str, mode: str = "delay") -> ShutdownInhibitor:
        """Take a logind inhibitor lock on shutdown; logind delays a shutdown (up to
        InhibitDelayMaxSec) until the returned lock is released."""
        reply = await self._call(
            LOGIND, LOGIND_PATH, LOGIND_MANAGER, "Inhibit", "ssss", ["shutdown", who, why, mode]
        )
        if not reply.unix_fds:
            raise HostError("logind Inhibit returned no file descriptor", kind="systemd")
        fd = reply.unix_fds[reply.body[0]]
        for extra in reply.unix_fds:
            if extra != fd:
                os.close(extra)
        return ShutdownInhibitor(fd)

    @contextlib.asynccontextmanager
    async def shutdown_delayed(self, who: str, why: str) -> AsyncIterator[ShutdownInhibitor]:
        lock = await self.inhibit_shutdown(who, why)
        try:
            yield lock
        finally:
            lock.release()

    # -- follow-up actions -----------------------------------------------------------------
    async def perform(self, action: str) -> None:
        verb, _, target = action.strip().partition(" ")
        target = target.strip()
        if verb == "daemon-reload" and not target:
            await self.daemon_reload()
            return
        if verb == "update-ca-trust" and not target:
            await self._run_update_ca_trust()
            return
        jobs = {"restart": self.restart_unit, "reload": self.reload_unit}
        if verb not in jobs or not target or " " in target:
            raise HostError(f"unknown follow-up action {action!r}", kind="input")
        result = await jobs[verb](target)
        if result != "done":
            raise HostError(f"{verb} {unit_name(target)}: job {result}", kind="unit")

    async def _run_update_ca_trust(self) -> None:
        result = await run_process(self._update_ca_trust, self.command_timeout)
        if result.status is None:
            raise HostError(
                f"update-ca-trust timed out after {self.command_timeout:g}s", kind="timeout"
            )
        if result.status != 0:
            tail = result.stderr.decode(errors="replace").strip().splitlines()[-1:]
            raise HostError(
                f"update-ca-trust exited {result.status}: {' '.join(tail)}", kind="command"
            )
