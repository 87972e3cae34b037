"""The VM tiers' qemu driver (vm-tests/run.py `drive`), with a shell script in qemu's place:
boots counted from the console, a boot that never reaches its step stopped early and named,
the console's tail kept for the report, and a first-boot stall run once more."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from tests.system.world import World

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vm():
    spec = importlib.util.spec_from_file_location("vm_tier_run", REPO / "vm-tests/run.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    path, modules = list(sys.path), set(sys.modules)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # puts vm-tests/ on sys.path: taken off again below
    yield module
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def guest(script: str) -> list[str]:
    """A stand-in for qemu: the script's output is the serial console."""
    return ["sh", "-c", script]


def drive(vm, tmp_path: Path, script: str, boots: int = 1, **limits):
    share = tmp_path / "share"
    share.mkdir(exist_ok=True)
    limits = {"boot_timeout": 30, "stall_after": 1, **limits}
    return vm.drive(guest(script), tmp_path, share, "s", boots, time.monotonic(), **limits)


UP = "echo 'HARNESS boot=1 up bootid=x uptime=20'"
PASS = 'echo "boot=2 RESULT pass" >> share/results.log'


def test_a_run_that_reports_pass_after_its_boots_passes(vm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = f"{UP}; echo '[ 40.1] reboot: Restarting system'; echo 'HARNESS boot=2 up x'; {PASS}"
    result = drive(vm, tmp_path, script, boots=2)
    assert (result.ok, result.boots, result.detail, result.console_tail) == (True, 2, "", ())
    assert "reboot: Restarting system" in (tmp_path / "console.log").read_text()


def test_a_first_boot_that_never_reaches_its_step_is_stopped_as_a_stall(vm, tmp_path):
    started = time.monotonic()
    result = drive(vm, tmp_path, "echo 'SeaBIOS'; echo 'Loading vmlinuz'; exec sleep 60")
    assert time.monotonic() - started < 20  # stopped at the stall, not at the 60 s limit
    assert (result.ok, result.stalled_boot, result.boots) == (False, 1, 1)
    assert result.detail == "boot 1 stalled: no step 1s after it began"
    assert result.console_tail == ("SeaBIOS", "Loading vmlinuz")


def test_a_later_boot_that_stalls_is_named(vm, tmp_path):
    # The first boot's step runs longer than the stall limit: only a boot without a step stalls.
    script = f"{UP}; sleep 2; echo 'reboot: Restarting system'; echo 'Loading'; exec sleep 60"
    result = drive(vm, tmp_path, script, boots=2)
    assert (result.ok, result.stalled_boot, result.boots) == (False, 2, 2)
    assert result.console_tail[-2:] == ("reboot: Restarting system", "Loading")


def test_the_overall_limit_ends_a_run_whose_step_never_finishes(vm, tmp_path):
    result = drive(vm, tmp_path, f"{UP}; exec sleep 60", boot_timeout=1, stall_after=30)
    assert (result.ok, result.stalled_boot) == (False, 0)
    assert result.detail == "timed out; ''"
    assert result.console_tail == ("HARNESS boot=1 up bootid=x uptime=20",)


def test_a_failing_result_and_a_wrong_boot_count_fail(vm, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = drive(vm, tmp_path, f"{UP}; echo 'boot=1 RESULT fail: no key' >> share/results.log")
    assert (result.ok, result.detail) == (False, "fail: no key")
    (tmp_path / "share/results.log").unlink()
    result = drive(vm, tmp_path, f"{UP}; {PASS}", boots=2)
    assert (result.ok, result.detail) == (False, "expected 2 boots")


def runner_of(results: list, calls: list):
    def runner(world: World, folder: Path):
        folder.mkdir()  # as the tiers' runners do: a second run in the same folder would fail
        calls.append(folder)
        return results.pop(0)

    return runner


def test_a_first_boot_stall_is_run_once_more_and_said(vm, tmp_path, capsys):
    stall = vm.VmResult("s", False, 1, 120.0, "boot 1 stalled", 1, ("SeaBIOS",))
    calls: list[Path] = []
    runner = runner_of([stall, vm.VmResult("s", True, 2, 200.0)], calls)
    result = vm.run_once_more_after_a_first_boot_stall(runner, None, tmp_path / "s")
    assert (result.ok, result.detail) == (True, "run again after a first-boot stall")
    assert calls == [tmp_path / "s", tmp_path / "s"] and (tmp_path / "s.stalled").is_dir()
    out = capsys.readouterr().out
    assert "STALL s" in out and "boot 1 stalled" in out and "    | SeaBIOS" in out


@pytest.mark.parametrize("stalled_boot", [0, 2])
def test_other_failures_are_not_run_again(vm, tmp_path, stalled_boot):
    failed = vm.VmResult("s", False, 2, 300.0, "fail", stalled_boot)
    calls: list[Path] = []
    runner = runner_of([failed], calls)
    assert vm.run_once_more_after_a_first_boot_stall(runner, None, tmp_path / "s") is failed
    assert len(calls) == 1


def test_a_second_stall_is_the_result(vm, tmp_path):
    stalls = [vm.VmResult("s", False, 1, 120.0, "boot 1 stalled", 1) for _ in range(2)]
    result = vm.run_once_more_after_a_first_boot_stall(runner_of(stalls, []), None, tmp_path / "s")
    assert (result.ok, result.detail) == (
        False,
        "boot 1 stalled; run again after a first-boot stall",
    )
