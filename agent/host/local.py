"""The real host: bootc through its CLI (staging in a transient unit), systemd and logind over
the system D-Bus, files under the host root. In a pod the host root is mounted (e.g. /rootfs),
the host's D-Bus socket is mounted at /run/dbus/system_bus_socket, and bootc runs in PID 1's
namespaces through `nsenter` (a `--bootc-prefix`)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.host.bootc import Bootc
from agent.host.health import CheckRunner
from agent.host.ports import CheckReport, CheckResult, Host
from agent.host.systemd import Systemd

POD_BOOTC_PREFIX = "nsenter -t 1 -m -u -i -n -p --"
UPDATE_TIMER = "bootc-fetch-apply-updates.timer"


@dataclass
class LocalOptions:
    root: Path = Path("/")
    bootc: str = "bootc"
    bootc_prefix: str = ""  # e.g. POD_BOOTC_PREFIX in a privileged pod
    bus_address: str | None = None  # None: the system bus
    check_timeout: float = 300.0


class HostHealth:
    """The admin checks plus what only a real host can tell: whether ostree finalized the
    staged deployment (`ostree-boot-complete.service` not failed)."""

    def __init__(self, runner: CheckRunner, systemd: Systemd) -> None:
        self.runner, self.systemd = runner, systemd

    async def run_checks(self) -> CheckReport:
        report = await self.runner.run_checks()
        state = await self.systemd.unit_state("ostree-boot-complete.service")
        finalize = CheckResult("ostree-boot-complete.service", True, state.active_state != "failed",
                               f"{state.active_state}/{state.result}")  # fmt: skip
        return CheckReport((finalize, *report.results))


def local_host(options: LocalOptions, is_allowed: Callable[[str], bool]) -> tuple[Host, Systemd]:
    from agent.host.files import RootedFiles

    systemd = Systemd(options.bus_address, command_prefix=shlex.split(options.bootc_prefix))
    bootc = Bootc(
        bootc=options.bootc,
        command_prefix=shlex.split(options.bootc_prefix),
        runner=systemd,
        host_root=options.root,
    )
    host = Host(
        root=options.root,
        files=RootedFiles(options.root, is_allowed),
        bootc=bootc,
        system=systemd,
        health=HostHealth(CheckRunner(options.root, options.check_timeout), systemd),
    )
    return host, systemd
