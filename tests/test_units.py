"""The shipped systemd units load cleanly (`systemd-analyze verify`) and install as intended
(`systemctl --root preset`, mask), in a throwaway root that carries the host's own unit tree so
dependencies such as boot-complete.target resolve. Needs the `systemd` package's tools (Debian:
`apt-get install systemd`); no running systemd is needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "systemd"
SERVICES = ("image-mode-agent.service", "image-mode-agent-verify.service")
SYSTEM_UNITS = next(
    (p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()),
    None,
)
# The stock bootc units (bootc's systemd/ directory), as the system tier's guest ships them.
BOOTC_TIMER = (
    "[Unit]\nDescription=Apply bootc updates\n[Timer]\nOnBootSec=1h\nOnUnitInactiveSec=8h\n"
    "[Install]\nWantedBy=timers.target\n"
)
BOOTC_SERVICE = (
    "[Unit]\nDescription=Apply bootc updates\n[Service]\nType=oneshot\n"
    "ExecStart=/usr/bin/bootc upgrade --apply --quiet\n"
)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install Debian's `systemd` package (apt-get install systemd)"
        )
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with the host's units, our units in /usr/lib, and stand-in executables."""
    if SYSTEM_UNITS is None:
        pytest.fail("no systemd unit directory on this machine: install the `systemd` package")
    lib = tmp_path / "usr/lib/systemd"
    shutil.copytree(SYSTEM_UNITS, lib / "system", symlinks=True)
    (lib / "system-preset").mkdir()
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "usr/bin").mkdir(parents=True)
    for exe in ("image-mode-agent", "bootc"):
        stub = tmp_path / "usr/bin" / exe
        stub.write_text("#!/bin/sh\n")
        stub.chmod(0o755)
    for unit in SERVICES:
        shutil.copy(UNITS / unit, lib / "system" / unit)
    (lib / "system/bootc-fetch-apply-updates.timer").write_text(BOOTC_TIMER)
    (lib / "system/bootc-fetch-apply-updates.service").write_text(BOOTC_SERVICE)
    shutil.copy(UNITS / "80-image-mode-agent.preset", lib / "system-preset")
    return tmp_path


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_tool("systemd-analyze"), "verify", "--man=no", "--generators=no", f"--root={root}",
         *units],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_units_verify_without_warnings(root: Path) -> None:
    result = _verify(root, *SERVICES)
    assert result.returncode == 0, result.stderr
    # verify only warns about unknown keys or bad values; any line about our units is a defect.
    ours = [line for line in result.stderr.splitlines() if "image-mode-agent" in line]
    assert ours == [], result.stderr


def test_verify_catches_a_broken_unit(root: Path) -> None:
    """The harness is not vacuous: a unit whose command is missing fails verification."""
    unit = root / "usr/lib/systemd/system/image-mode-agent.service"
    unit.write_text(unit.read_text().replace("/usr/bin/image-mode-agent", "/usr/bin/missing"))
    assert _verify(root, "image-mode-agent.service").returncode != 0


def test_verify_unit_gates_boot_complete() -> None:
    text = (UNITS / "image-mode-agent-verify.service").read_text()
    for line in ("Type=oneshot", "Before=boot-complete.target", "RequiredBy=boot-complete.target",
                 "ExecStart=/usr/bin/image-mode-agent verify"):  # fmt: skip
        assert line in text.splitlines()
    assert any(
        line.startswith("Wants=") and "boot-complete.target" in line for line in text.splitlines()
    )
    agent = (UNITS / "image-mode-agent.service").read_text().splitlines()
    for line in ("Type=notify", "Restart=on-failure"):
        assert line in agent
    assert any(line.startswith("WatchdogSec=") for line in agent)


def test_preset_and_mask_install_as_intended(root: Path) -> None:
    systemctl = _tool("systemctl")
    subprocess.run(
        [systemctl, f"--root={root}", "preset", *SERVICES, "bootc-fetch-apply-updates.timer"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    # The mask ships as a /dev/null symlink, installed into /etc/systemd/system.
    mask = UNITS / "bootc-fetch-apply-updates.timer"
    assert mask.is_symlink() and os.readlink(mask) == "/dev/null"
    shutil.copy(mask, root / "etc/systemd/system", follow_symlinks=False)

    def enabled(unit: str) -> str:
        return subprocess.run(
            [systemctl, f"--root={root}", "is-enabled", unit],
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()  # fmt: skip

    assert enabled("image-mode-agent.service") == "enabled"
    assert enabled("image-mode-agent-verify.service") == "enabled"
    assert enabled("bootc-fetch-apply-updates.timer") == "masked"
    requires = root / "etc/systemd/system/boot-complete.target.requires"
    assert (requires / "image-mode-agent-verify.service").is_symlink()
