"""sd_notify(3) with no dependency, so that file mode does not load the D-Bus stack."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET per state change."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._socket = env.get("NOTIFY_SOCKET", "")
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self._watchdog_usec = int(usec) if usec.isdigit() and mine else 0

    @property
    def enabled(self) -> bool:
        return bool(self._socket)

    def watchdog_interval(self) -> float | None:
        """How often to send WATCHDOG=1: half the unit's WatchdogSec, as sd_watchdog_enabled
        documents; None when no watchdog is armed for this process."""
        return self._watchdog_usec / 2e6 if self._watchdog_usec else None

    def notify(self, state: str) -> bool:
        if not self._socket:
            return False
        address = self._socket
        if address.startswith("@"):
            address = "\0" + address[1:]  # abstract namespace
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")
