"""The engine on the real-host adapters: systemd over D-Bus (a real `systemd --user` manager),
the bootc adapter driving the stand-in bootc in a named transient unit, a stand-in logind for
the reboot, files under a host root. A whole update: live write, stage, reboot request, the
"boot" (stand-in bootloader), then the boot-time verifier commits."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from agent.core.desired import Desired
from agent.core.policy import Allowlist
from agent.host.bootc import Bootc
from agent.host.files import RootedFiles
from agent.host.health import CHECK_DIR, CheckRunner
from agent.host.local import HostHealth
from agent.host.ports import Host
from agent.model.checks import CheckResult
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import machine_config_from_object
from agent.update.engine import DONE, REBOOTING, Engine
from tests.builders import machine_config
from tests.test_bootc_adapter import D1, D2, NAME, STANDIN, StandinHost
from tests.test_systemd_adapter import UserManager, logind, user_manager  # noqa: F401

SSH = "home/core/.ssh/authorized_keys.d/ignition"


def _root(base: Path) -> Path:
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text(
        "root:x:0:0::/root:/bin/sh\ncore:x:1000:1000::/home/core:/bin/sh\n"
    )
    (root / "etc/group").write_text("root:x:0:\ncore:x:1000:\n")
    return root


def _desired(name: str, digest: str, key: str) -> Desired:
    doc = machine_config(name=name, image=f"{NAME}@{digest}", keys=[key])
    config = machine_config_from_object(doc)
    return Desired(config, json.dumps(doc).encode(), parse_image_ref(config.os_image_url))


def _host(manager: UserManager, root: Path, standin: StandinHost, boot_id: Path) -> Host:
    systemd = manager.client(boot_id_path=boot_id)
    bootc = Bootc(bootc=str(STANDIN), runner=systemd, run_dir=root / "run", env=standin.env,
                  progress_poll=0.02)  # fmt: skip
    return Host(
        root=root,
        files=RootedFiles(root, Allowlist().allows),
        bootc=bootc,
        system=systemd,
        health=HostHealth(CheckRunner(root, 30), systemd),
    )


async def test_update_on_real_host_adapters(
    user_manager: UserManager,  # noqa: F811
    logind,  # noqa: F811
    tmp_path: Path,
) -> None:
    root = _root(tmp_path)
    state = tmp_path / "bootc-state"
    state.mkdir()
    standin = StandinHost(state)
    standin.bootc("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    standin.bootc("internals", "standin-add-image", f"{NAME}@{D2}", "2.0", str(64 << 20))
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("boot-1\n")

    host = _host(user_manager, root, standin, boot_id)
    engine = Engine(host)
    first = await engine.reconcile(_desired("rendered-1", D1, "k1"))
    assert first.state == DONE
    assert (root / SSH).read_text() == "k1\n"
    assert logind.reboots == []

    update = await engine.reconcile(_desired("rendered-2", D2, "k2"))
    assert update.state == REBOOTING
    assert logind.reboots == [False]  # logind Reboot(interactive=false)
    assert (root / SSH).read_text() == "k2\n"  # the live part before the reboot
    assert logind.inhibits and logind.inhibits[0][0] == "shutdown"  # held while journaling
    switches = standin.verb_calls("switch")
    assert len(switches) == 1 and switches[0][-1] == f"{NAME}@{D2}"
    assert "--apply" not in switches[0] and "--download-only" in switches[0]
    # Staged locked, unlocked at the reboot slot so the reboot applies it.
    assert standin.verb_calls("upgrade") == [["upgrade", "--from-downloaded"]]
    await host.system.close()

    # The machine reboots: the stand-in bootloader boots the staged deployment.
    standin.bootc("internals", "standin-reboot")
    boot_id.write_text("boot-2\n")
    host = _host(user_manager, root, standin, boot_id)
    verified = await Engine(host).verify_boot()
    assert verified is not None and verified.state == DONE
    status = await host.bootc.status()
    assert status.booted_digest == D2
    assert await Engine(host).verify_boot() is None  # nothing waits for the next boot
    await host.system.close()


async def test_kubelet_healthz_check(tmp_path: Path) -> None:
    from aiohttp import web

    from agent.host.local import kubelet_healthy

    answers = [500, 500, 200]

    async def healthz(request: web.Request) -> web.Response:
        code = answers.pop(0) if answers else 200
        return web.Response(status=code, text="ok" if code == 200 else "not yet")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        assert (await kubelet_healthy(url, deadline=5, interval=0.05)).ok
        answers.extend([500] * 100)
        failed = await kubelet_healthy(url, deadline=0.2, interval=0.05)
        assert not failed.ok and "HTTP 500: not yet" in failed.detail
    finally:
        await runner.cleanup()
    # A port bound but not listening refuses connections, whatever else runs on this machine.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/healthz"
        refused = await kubelet_healthy(url, deadline=0, interval=0.05)
    assert not refused.ok and "Cannot connect" in refused.detail, refused.detail


def test_pod_mode_cli_writes_under_the_host_root(user_manager: UserManager, tmp_path: Path) -> None:  # noqa: F811
    """`--host local --host-root DIR`, as in a pod with the host's / at /rootfs."""
    import os
    import subprocess
    import sys

    root = _root(tmp_path)
    state = tmp_path / "bootc-state"
    state.mkdir()
    standin = StandinHost(state)
    standin.bootc("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    desired = tmp_path / "mc.json"
    desired.write_text(json.dumps(machine_config(name="r1", image=f"{NAME}@{D1}", keys=["pod"])))
    done = subprocess.run(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", "local", "--host-root", str(root), "--bootc", str(STANDIN),
         "--bus-address", user_manager.address, "--once", "--listen", ""],
        env={**os.environ, **standin.env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (root / SSH).read_text() == "pod\n"
    status = json.loads((root / "var/lib/image-mode-agent/status.json").read_text())
    assert status["state"] == "Done"


def _check(root: Path, rel: str, mode: int, text: str = "#!/bin/sh\necho fine\n") -> None:
    path = root / CHECK_DIR / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


async def test_every_file_in_the_check_folders_is_a_check(tmp_path: Path) -> None:
    """A check whose `chmod +x` was forgotten fails (a required one fails the boot, a wanted one
    warns) instead of being skipped, which would leave the boot ungated unnoticed. Dotfiles
    and folders are not checks."""
    _check(tmp_path, "required.d/10-ok", 0o755)
    _check(tmp_path, "required.d/20-forgotten", 0o644)
    _check(tmp_path, "required.d/.20-forgotten.swp", 0o644)
    (tmp_path / CHECK_DIR / "required.d/30-folder").mkdir()
    _check(tmp_path, "wanted.d/40-forgotten", 0o600)
    report = await CheckRunner(tmp_path, 30).run_checks()
    assert report.results == (
        CheckResult("10-ok", True, True, "fine"),
        CheckResult("20-forgotten", True, False,
                    "not executable (mode 0644): chmod +x it or remove it"),
        CheckResult("40-forgotten", False, False,
                    "not executable (mode 0600): chmod +x it or remove it"),
    )  # fmt: skip
    assert not report.ok


async def test_a_check_past_its_timeout_is_killed_and_fails(tmp_path: Path) -> None:
    _check(tmp_path, "required.d/50-slow", 0o755, "#!/bin/sh\nexec sleep 30\n")
    report = await CheckRunner(tmp_path, 0.2).run_checks()
    assert report.results == (CheckResult("50-slow", True, False, "timed out after 0.2s"),)
