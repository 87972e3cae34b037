"""The D-Bus connection to systemd and logind: calls, their errors, and the signals jobs await.

The systemd adapter (systemd.py) is built on it: a job's end arrives as systemd's JobRemoved
signal, a unit's change as its PropertiesChanged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from agent.errors import HostError

SYSTEMD = "org.freedesktop.systemd1"
SYSTEMD_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
SERVICE = "org.freedesktop.systemd1.Service"
LOGIND = "org.freedesktop.login1"
LOGIND_PATH = "/org/freedesktop/login1"
LOGIND_MANAGER = "org.freedesktop.login1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
# Jobs whose JobRemoved arrived before the caller looked: kept briefly, bounded.
_MAX_EARLY_JOBS = 256
# The D-Bus signature of unit properties callers may pass as plain Python values (modules
# that stay free of D-Bus, e.g. stage_unit.py's STAGE_PRIORITY, cannot build Variants).
PLAIN_PROPERTY_SIGNATURES: Mapping[str, str] = MappingProxyType({
    "Type": "s",
    "Slice": "s",
    "Nice": "i",
    "IOSchedulingClass": "i",
    "IOSchedulingPriority": "i",
    "CPUWeight": "t",
    "IOWeight": "t",
    "BindReadOnlyPaths": "a(ssbt)",  # (source, destination, ignore a missing source, flags)
})  # fmt: skip


class DBusCallError(HostError):
    """A D-Bus method returned an error; `name` is the D-Bus error name."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(f"{name}: {message}", kind="systemd")


def as_variant(name: str, value: Any) -> Variant:
    """A unit property as systemd takes it: a Variant as given, a plain value of a known
    property wrapped in its D-Bus type; anything else is the caller's error (a wrong type
    would otherwise fail deep in marshalling, or be rejected by systemd with less context)."""
    if isinstance(value, Variant):
        return value
    signature = PLAIN_PROPERTY_SIGNATURES.get(name)
    if signature is None:
        known = ", ".join(sorted(PLAIN_PROPERTY_SIGNATURES))
        raise HostError(
            f"unit property {name}={value!r}: pass a dbus_fast Variant (plain values only "
            f"for {known})",
            kind="input",
        )
    if isinstance(value, bool) and signature != "b":  # bool is an int to Python, not to us
        raise HostError(f"unit property {name}: {value!r} is not a number", kind="input")
    try:
        return Variant(signature, value)
    except (ValueError, TypeError) as exc:  # out of range / not the type (dbus-fast's words)
        raise HostError(f"unit property {name}={value!r}: {exc}", kind="input") from None


class SystemdBus:
    """One connection to the bus, made on the first call and again after it drops, subscribed
    to systemd's JobRemoved and units' PropertiesChanged. `bus_address` None means the system
    bus (or the session bus with `system_bus=False`)."""

    def __init__(
        self, bus_address: str | None, *, system_bus: bool = True, call_timeout: float = 30.0
    ) -> None:
        self._address = bus_address
        self._bus_type = BusType.SYSTEM if system_bus else BusType.SESSION
        self.call_timeout = call_timeout
        self._bus: MessageBus | None = None
        self._connecting = asyncio.Lock()
        self._job_waiters: dict[str, asyncio.Future[str]] = {}
        self._early_jobs: dict[str, str] = {}
        self._unit_watchers: dict[str, set[asyncio.Event]] = {}

    # -- connection ----------------------------------------------------------------------
    async def _connect(self) -> MessageBus:
        async with self._connecting:
            if self._bus is not None and self._bus.connected:
                return self._bus
            bus = MessageBus(
                bus_address=self._address, bus_type=self._bus_type, negotiate_unix_fd=True
            )
            async with asyncio.timeout(self.call_timeout):
                await bus.connect()
            bus.add_message_handler(self._on_message)
            for rule in (
                f"type='signal',sender='{SYSTEMD}',interface='{MANAGER}',member='JobRemoved'",
                f"type='signal',sender='{SYSTEMD}',interface='{PROPERTIES}',"
                f"member='PropertiesChanged',path_namespace='{SYSTEMD_PATH}/unit'",
            ):
                await self._raw_call(
                    bus, "org.freedesktop.DBus", "/org/freedesktop/DBus",
                    "org.freedesktop.DBus", "AddMatch", "s", [rule],
                )  # fmt: skip
            # systemd only emits unit and job signals to clients that subscribed.
            await self._raw_call(bus, SYSTEMD, SYSTEMD_PATH, MANAGER, "Subscribe")
            self._bus = bus
            return bus

    async def close(self) -> None:
        if self._bus is not None:
            self._bus.disconnect()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await self._bus.wait_for_disconnect()
            self._bus = None

    def _on_message(self, msg: Message) -> None:
        if msg.message_type != MessageType.SIGNAL:
            return
        if msg.member == "JobRemoved" and msg.interface == MANAGER:
            _id, job, _unit, result = msg.body
            waiter = self._job_waiters.pop(job, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
            elif waiter is None:
                self._early_jobs[job] = result
                while len(self._early_jobs) > _MAX_EARLY_JOBS:
                    self._early_jobs.pop(next(iter(self._early_jobs)))
        elif msg.member == "PropertiesChanged" and msg.path in self._unit_watchers:
            for event in self._unit_watchers[msg.path]:
                event.set()

    async def _raw_call(
        self,
        bus: MessageBus,
        dest: str,
        path: str,
        iface: str,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        timeout: float | None = None,
    ) -> Message:
        msg = Message(
            destination=dest,
            path=path,
            interface=iface,
            member=member,
            signature=signature,
            body=list(body),
        )
        try:
            async with asyncio.timeout(timeout or self.call_timeout):
                reply = await bus.call(msg)
        except TimeoutError:
            raise HostError(f"D-Bus call {iface}.{member} timed out", kind="timeout") from None
        if reply is None:
            raise HostError(f"D-Bus call {iface}.{member}: no reply", kind="systemd")
        if reply.message_type == MessageType.ERROR:
            detail = reply.body[0] if reply.body else ""
            raise DBusCallError(reply.error_name or "unknown", str(detail))
        return reply

    async def _call(
        self,
        dest: str,
        path: str,
        iface: str,
        member: str,
        signature: str = "",
        body: Sequence[Any] = (),
        timeout: float | None = None,
    ) -> Message:
        bus = await self._connect()
        return await self._raw_call(bus, dest, path, iface, member, signature, body, timeout)

    async def _manager(self, member: str, signature: str = "", *body: Any) -> list[Any]:
        reply = await self._call(SYSTEMD, SYSTEMD_PATH, MANAGER, member, signature, body)
        return list(reply.body)
