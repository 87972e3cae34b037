"""The real host: bootc through its CLI (staging in a transient unit), systemd and logind over
the system D-Bus, files under the host root. In a pod the host root is mounted (e.g. /rootfs),
the host's D-Bus socket is mounted at /run/dbus/system_bus_socket, and bootc runs in PID 1's
namespaces through `nsenter` (a `--bootc-prefix`)."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from agent.host.bootc import Bootc
from agent.host.health import CheckRunner
from agent.host.ports import Host
from agent.host.skopeo import TagResolver
from agent.host.systemd import Systemd
from agent.model.checks import CheckReport, CheckResult

POD_BOOTC_PREFIX = "nsenter -t 1 -m -u -i -n -p --"
UPDATE_TIMER = "bootc-fetch-apply-updates.timer"


@dataclass
class LocalOptions:
    root: Path = Path("/")
    bootc: str = "bootc"
    bootc_prefix: str = ""  # e.g. POD_BOOTC_PREFIX in a privileged pod
    bus_address: str | None = None  # None: the system bus
    check_timeout: float = 300.0
    kubelet_url: str | None = None  # e.g. http://localhost:10248/healthz


async def kubelet_healthy(url: str, deadline: float, interval: float = 2.0) -> CheckResult:
    """GET the kubelet's healthz until it answers 200 or the deadline passes (after a boot the
    kubelet needs a while)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline
    detail = "no answer"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return CheckResult("kubelet-healthz", True, True, "ok")
                    detail = f"HTTP {resp.status}: {(await resp.text())[:100]}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                detail = str(exc) or type(exc).__name__
            if loop.time() >= until:
                return CheckResult("kubelet-healthz", True, False, f"{url}: {detail}")
            await asyncio.sleep(interval)


class HostHealth:
    """The admin checks plus what only a real host can tell: whether ostree finalized the
    staged deployment (`ostree-boot-complete.service` not failed) and, where configured,
    whether the kubelet comes up healthy."""

    def __init__(self, runner: CheckRunner, systemd: Systemd, kubelet_url: str | None = None,
                 kubelet_deadline: float = 300.0) -> None:  # fmt: skip
        self.runner, self.systemd = runner, systemd
        self.kubelet_url, self.kubelet_deadline = kubelet_url, kubelet_deadline

    async def run_checks(self) -> CheckReport:
        state = await self.systemd.unit_state("ostree-boot-complete.service")
        finalize = CheckResult("ostree-boot-complete.service", True, state.active_state != "failed",
                               f"{state.active_state}/{state.result}")  # fmt: skip
        results = [finalize]
        if self.kubelet_url:
            results.append(await kubelet_healthy(self.kubelet_url, self.kubelet_deadline))
        report = await self.runner.run_checks()
        return CheckReport((*results, *report.results))


def local_host(options: LocalOptions, is_allowed: Callable[[str], bool]) -> tuple[Host, Systemd]:
    from agent.host.files import RootedFiles

    systemd = Systemd(options.bus_address, command_prefix=shlex.split(options.bootc_prefix))
    prefix = shlex.split(options.bootc_prefix)
    bootc = Bootc(
        bootc=options.bootc,
        command_prefix=prefix,
        runner=systemd,
        host_root=options.root,
        # bootc before 1.15 cannot check a tag once the host runs a digest: ask the registry
        # as bootc would (its auth files, the host's architecture).
        resolver=TagResolver(command_prefix=prefix, host_root=options.root),
    )
    host = Host(
        root=options.root,
        files=RootedFiles(options.root, is_allowed),
        bootc=bootc,
        system=systemd,
        health=HostHealth(
            CheckRunner(options.root, options.check_timeout), systemd, options.kubelet_url
        ),
    )
    return host, systemd
