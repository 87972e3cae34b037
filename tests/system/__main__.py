"""`python -m tests.system run [-k NAME] [--keep]`: the system tier.

Builds (or reuses) the cached rootfs, starts the loopback registries, pushes the test images,
runs each scenario in its own nspawn machine and prints pass/fail, boots and wall time.
Exit status: 0 when every selected scenario passed, 1 otherwise."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from tests.system import secrets
from tests.system.image_scenarios import ALL_SCENARIOS as SCENARIOS
from tests.system.machine import Machine, MachineError
from tests.system.rootfs import ensure_rootfs
from tests.system.scenarios import Scenario, diagnostics, probe_agent
from tests.system.world import World, cleanup

TOOLS = ("mmdebstrap", "systemd-nspawn", "docker-registry", "skopeo", "nsenter", "journalctl")


@dataclass
class Result:
    name: str
    ok: bool
    boots: int
    seconds: float
    detail: str = ""


def say(text: str) -> None:
    print(text, flush=True)


def run_one(world: World, scenario: Scenario, blocked: str | None) -> Result:
    if scenario.needs_agent and blocked:
        return Result(scenario.name, False, 0, 0.0, blocked)
    start = time.monotonic()
    machine = None
    try:
        # A scenario's own lower tree (a built image) is part of the scenario: its failures too.
        lower = scenario.lower(world) if scenario.lower else None
        machine = world.machine(scenario.name, lower, scenario.persona)
        ok, detail = _run_scenario(world, scenario, machine)
        if scenario.needs_agent:
            # Everything the agent emitted, before the machine goes (tests/system/secrets.py).
            # A failed scenario reports leaks only, not what it never got to emit.
            leak = secrets.check(machine, require_complete=ok)
            if leak:
                ok, detail = False, "\n".join(filter(None, (detail, leak)))
        return Result(scenario.name, ok, machine.boots, time.monotonic() - start, detail)
    except MachineError as exc:  # no machine: its lower tree could not be made
        boots = machine.boots if machine else 0
        return Result(scenario.name, False, boots, time.monotonic() - start, str(exc))
    except Exception:  # a harness bug must still report and clean up the machine
        detail = traceback.format_exc(limit=4)
        boots = machine.boots if machine else 0
        return Result(scenario.name, False, boots, time.monotonic() - start, detail)
    finally:
        if machine:
            world.destroy(machine)


def _run_scenario(world: World, scenario: Scenario, machine: Machine) -> tuple[bool, str]:
    try:
        scenario.run(world, machine)
        return True, ""
    except MachineError as exc:
        detail = str(exc)
        if scenario.needs_agent:
            detail += "\n" + diagnostics(machine)
        return False, detail
    except Exception:  # a harness bug: reported as the scenario's failure
        return False, traceback.format_exc(limit=4)


def reap_stale(base: Path) -> None:
    """Unmount and delete what a killed earlier run left (its overlays stay mounted), but only
    runs whose owner process is gone: a concurrent run's machines are left alone."""
    for workdir in base.glob("ima-system-*"):
        try:
            owner = int((workdir / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # no pidfile: kept with --keep, or not ours
        if Path(f"/proc/{owner}").exists():
            continue
        for mount in (*workdir.glob("machines/*/root"), *workdir.glob("machines/*/sysroot")):
            subprocess.run(["timeout", "30", "umount", "-l", str(mount)], capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(workdir)])


def cmd_run(args: argparse.Namespace) -> int:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        say(f"missing host tools: {', '.join(missing)} (run tests/system/setup-host.sh)")
        return 1
    selected = [s for s in SCENARIOS if not args.k or any(k in s.name for k in args.k)]
    total = time.monotonic()
    rootfs = ensure_rootfs(log=say)
    say(f"rootfs: {rootfs.path} ({'built' if rootfs.built else 'cached'}, {rootfs.seconds:.1f}s)")
    host_mode, blocked = probe_agent()
    say(f"agent: {blocked}" if blocked else f"agent: runs as a unit with --host {host_mode}")
    base = Path(os.environ.get("IMA_SYSTEM_WORK", tempfile.gettempdir()))
    reap_stale(base)
    workdir = Path(tempfile.mkdtemp(prefix="ima-system-", dir=base))
    (workdir / "owner.pid").write_text(str(os.getpid()))
    world = World(rootfs.path, workdir, keep=args.keep, host_mode=host_mode or "local")
    results: list[Result] = []
    try:
        t = time.monotonic()
        world.start()
        say(f"registries up, images pushed ({time.monotonic() - t:.1f}s): "
            + ", ".join(f"{k}={v.digest[7:19]}" for k, v in world.images.items()))  # fmt: skip
        for scenario in selected:
            result = run_one(world, scenario, blocked)
            results.append(result)
            mark = "PASS" if result.ok else "FAIL"
            say(f"{mark} {result.name:<28} boots={result.boots} {result.seconds:6.1f}s"
                + (f"  {result.detail}" if result.detail else ""))  # fmt: skip
    finally:
        world.stop()
        (workdir / "owner.pid").unlink(missing_ok=True)  # a kept run is not stale
        cleanup(workdir, args.keep)
    passed = sum(r.ok for r in results)
    say(f"{passed}/{len(results)} passed in {time.monotonic() - total:.1f}s"
        + (f" (kept {workdir})" if args.keep else ""))  # fmt: skip
    # The plain closing line CI reads: "N passed, N failed".
    say(f"system: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the scenarios")
    run.add_argument("-k", action="append", help="only scenarios whose name contains this")
    run.add_argument("--keep", action="store_true", help="keep machines and logs for debugging")
    sub.add_parser("list", help="list the scenarios")
    sub.add_parser("build", help="build (or find) the cached rootfs only")
    args = parser.parse_args(argv)
    if args.command == "list":
        for s in SCENARIOS:
            say(f"{s.name:<28} {(s.doc or '').splitlines()[0] if s.doc else ''}")
        return 0
    if args.command == "build":
        rootfs = ensure_rootfs(log=say)
        say(f"{rootfs.path} ({'built' if rootfs.built else 'cached'}, {rootfs.seconds:.1f}s)")
        return 0
    if os.geteuid() != 0:
        say("the system tier needs root (mount, systemd-nspawn)")
        return 1
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
