"""VM tier: `python vm-tests/run.py [-k NAME] [--keep]` (root; see vm-tests/README.md).

The same images and stand-in bootc as the system tier, in a qemu VM under TCG (KVM hangs on
this machine): direct kernel boot, a qcow2 overlay of the cached disk per scenario, serial
console, 9p shares for the repo, the stand-in and the scenario, and the loopback registry
reachable from the guest at 10.0.2.100:5000 through slirp's guestfwd (restrict=on: no other
network). A reboot inside the guest resets the VM and boots the same kernel again; the stand-in's
boot unit picks the deployment, so the harness need not play bootloader."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from image import VmImage, ensure_image  # noqa: E402

from tests.system.rootfs import REPO  # noqa: E402
from tests.system.scenarios import probe_agent  # noqa: E402
from tests.system.world import (  # noqa: E402
    AGENT_ENV,
    DESIRED,
    KEY_A,
    SELFTEST_LIB,
    UNIT_SUFFIXES,
    Image,
    World,
    agent_units_dir,
)

GUEST_REGISTRY = "10.0.2.100:5000"
BOOT_TIMEOUT = 150  # seconds per expected boot under TCG (≈30-45 s measured)
# Boots are counted from the console: the first, plus one per kernel restart (printed even with
# `quiet`), so a boot that never reaches the step script still counts.
RESTART = "reboot: Restarting system"
# The first line each boot's step script prints (guest/run-step.sh, both tiers): the boot is up.
STEP_UP = re.compile(r"HARNESS boot=\d+ up ")
# A boot reaches its step in 25-45 s under TCG; one that has not after this long has stalled
# (seen once in CI: a first boot that never reached its step in 900 s).
STALL_AFTER = 120
CONSOLE_TAIL = 25  # console lines printed under a failed scenario


@dataclass(frozen=True)
class VmScenario:
    name: str
    step: str  # the guest's step script (placeholders: {V1} {V2} {V3} {MISSING} digests/refs)
    boots: int
    needs_agent: bool = True


PLATFORM = """\
case $n in
1) bootc switch {MISSING_REF} 2>/tmp/err
   grep -q "manifest unknown" /tmp/err || finish "fail: $(cat /tmp/err)"
   bootc switch --transport registry {V2_REF} || finish "fail: switch to v2"
   log staged; systemctl reboot --no-block ;;
2) [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest)"
   grep -q VERSION=v2 /usr/lib/testos-release || finish "fail: v2 files not applied"
   finish pass ;;
esac
"""
IMAGE_UPDATE = """\
case $n in
1) wait_agent Done {V1} || finish "fail: not Done on v1: $(agent_field reason)"
   cp /mnt/harness/desired-next.yaml {DESIRED}.tmp && mv {DESIRED}.tmp {DESIRED}
   sleep 240; finish "fail: no reboot after v2 was desired ($(agent_field reason))" ;;
2) wait_agent Done {V2} || finish "fail: not Done on v2: $(agent_field reason)"
   [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest)"
   systemctl is-active boot-complete.target || finish "fail: boot-complete not reached"
   finish pass ;;
*) finish "fail: boot $n: more reboots than one" ;;
esac
"""
HEALTH_ROLLBACK = """\
case $n in
1) wait_agent Done {V1} || finish "fail: not Done on v1: $(agent_field reason)"
   cp /mnt/harness/desired-next.yaml {DESIRED}.tmp && mv {DESIRED}.tmp {DESIRED}
   sleep 240; finish "fail: no reboot after v3 was desired" ;;
2) sleep 240; finish "fail: no rollback reboot from v3 ($(agent_field reason))" ;;
3) wait_agent Degraded 50-testos-health || finish "fail: not Degraded: $(agent_field reason)"
   [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest)"
   finish pass ;;
*) finish "fail: boot $n" ;;
esac
"""
SCENARIOS = [
    VmScenario("platform-vm", PLATFORM, 2, needs_agent=False),
    VmScenario("image-update-vm", IMAGE_UPDATE, 2),
    VmScenario("health-rollback-vm", HEALTH_ROLLBACK, 3),
]
NEXT = {"image-update-vm": "v2", "health-rollback-vm": "v3"}


def guest_image(image: Image) -> Image:
    """The same repository and digest, as the guest reaches the registry."""
    return Image(f"{GUEST_REGISTRY}/{image.name.split('/', 1)[1]}", image.tag, image.digest)


def desired_doc(image: Image, files: tuple[dict, ...] = ()) -> str:
    """A rendered MachineConfig for `image` with core's SSH key and Ignition `files`."""
    return json.dumps({
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": f"rendered-worker-{image.tag}"},
        "spec": {
            "osImageURL": image.pinned,
            "config": {
                "ignition": {"version": "3.4.0"},
                "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [KEY_A]}]},
                "storage": {"files": list(files)},
            },
        },
    }, indent=1)  # fmt: skip


def seed_agent_units(seed_root: Path) -> None:
    """The repo's agent units under seed_root/etc/systemd/system, enabled as `systemctl enable`
    would from their own [Install] sections."""
    units = seed_root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in sorted(agent_units_dir().glob("*")):
        if unit.suffix in UNIT_SUFFIXES and unit.is_symlink():  # a mask: -> /dev/null
            (units / unit.name).symlink_to(os.readlink(unit))
        elif unit.suffix in UNIT_SUFFIXES:
            shutil.copy(unit, units / unit.name)
        elif unit.suffix == ".py" and agent_units_dir() != REPO / "systemd":
            lib = seed_root / SELFTEST_LIB.lstrip("/")
            lib.mkdir(parents=True, exist_ok=True)
            shutil.copy(unit, lib / unit.name)
    for unit in units.glob("image-mode-agent*.service"):
        for target in re.findall(r"^(?:WantedBy|RequiredBy)=(.+)$", unit.read_text(), re.M):
            for t in target.split():
                wants = units / f"{t}.wants"
                wants.mkdir(exist_ok=True)
                (wants / unit.name).symlink_to(f"/etc/systemd/system/{unit.name}")


def seed(world: World, share: Path, scenario: VmScenario) -> None:
    """The files the first boot copies into the disk (harness-seed.service)."""
    s = share / "seed"
    images = {k: guest_image(v) for k, v in world.images.items()}
    v1 = images["v1"]
    store = s / "var/lib/standin-bootc/store"
    store.parent.mkdir(parents=True)
    subprocess.run(
        ["timeout", "60", "skopeo", "copy", "--quiet", "--src-tls-verify=false",
         f"docker://{world.images['v1'].pinned}", f"oci:{store}:{v1.digest[7:]}"],
        check=True,
    )  # fmt: skip
    slot = {"ref": v1.pinned, "name": v1.name, "digest": v1.digest, "version": "v1"}
    state = {"booted": slot, "staged": None, "rollback": None, "rollbackQueued": False}
    (s / "var/lib/standin-bootc/state.json").write_text(json.dumps(state))
    conf = s / "etc/containers/registries.conf.d/50-vm-tier.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'[[registry]]\nlocation = "{GUEST_REGISTRY}"\ninsecure = true\n')
    if scenario.needs_agent:
        seed_agent_units(s)
        desired = s / DESIRED.lstrip("/")
        desired.parent.mkdir(parents=True, exist_ok=True)
        desired.write_text(desired_doc(v1))
        args = f"--source file:{DESIRED} --host {world.host_mode}"
        (s / AGENT_ENV.lstrip("/")).write_text(f'IMAGE_MODE_AGENT_ARGS="{args}"\n')
        (share / "desired-next.yaml").write_text(desired_doc(images[NEXT[scenario.name]]))
    step = scenario.step
    for key, value in {
        "{V1}": images["v1"].digest, "{V2}": images["v2"].digest, "{V3}": images["v3"].digest,
        "{V2_REF}": images["v2"].pinned, "{MISSING_REF}": images["missing"].pinned,
        "{DESIRED}": DESIRED,
    }.items():  # fmt: skip
        step = step.replace(key, value)
    # The share is the guest's /mnt/harness; guest/run-step.sh sources the step script there.
    (share / "step.sh").write_text(step)
    shutil.copy(HERE / "guest/run-step.sh", share / "run-step")


@dataclass
class VmResult:
    name: str
    ok: bool
    boots: int
    seconds: float
    detail: str = ""
    stalled_boot: int = 0  # the boot that never reached its step script (0: none did)
    console_tail: tuple[str, ...] = ()  # the console's last lines, printed on a failure


def run_vm(image: VmImage, world: World, scenario: VmScenario, workdir: Path) -> VmResult:
    start = time.monotonic()
    share = workdir / "harness"
    share.mkdir(parents=True)
    seed(world, share, scenario)
    overlay = workdir / "overlay.qcow2"
    subprocess.run(["timeout", "30", "qemu-img", "create", "-q", "-f", "qcow2", "-b",
                    str(image.base), "-F", "raw", str(overlay)], check=True)  # fmt: skip
    assert world.registry
    cmd = [
        "qemu-system-x86_64", "-accel", "tcg", "-m", "2048", "-smp", "2", "-nographic",
        "-nic", f"user,model=virtio-net-pci,restrict=on,"
                f"guestfwd=tcp:{GUEST_REGISTRY}-cmd:/usr/bin/python3 {HERE / 'relay.py'} "
                f"{world.registry.host.replace(':', ' ')}",
        "-kernel", str(image.dir / "vmlinux"), "-initrd", str(image.dir / "initrd.img"),
        "-append", "console=ttyS0 root=LABEL=root rw quiet mitigations=off",
        "-drive", f"file={overlay},if=virtio,format=qcow2",
        "-virtfs", f"local,path={REPO},mount_tag=src,security_model=none,readonly=on,id=src",
        "-virtfs", f"local,path={REPO / 'tests/system/guest'},mount_tag=guest,"
                   "security_model=none,readonly=on,id=guest",
        "-virtfs", f"local,path={share},mount_tag=harness,security_model=none,id=harness",
    ]  # fmt: skip
    return drive(cmd, workdir, share, scenario.name, scenario.boots, start)


@dataclass
class _Console:
    """What the console has shown so far (written by the reader thread, read by the driver)."""

    boots: int = 1
    boot_started: float = 0.0  # monotonic time the current boot began
    stepped: bool = False  # the current boot's step script has started
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=CONSOLE_TAIL))


def drive(
    cmd: list[str],
    workdir: Path,
    share: Path,
    name: str,
    expected_boots: int,
    start: float,
    boot_timeout: float = BOOT_TIMEOUT,
    stall_after: float = STALL_AFTER,
) -> VmResult:
    """Run the VM until it powers off (or `boot_timeout` per expected boot, plus one, passes):
    the console goes to workdir/console.log, timestamped; boots are counted from it; the
    verdict is the guest's single `RESULT` line in the share's results.log. A boot whose step
    script has not started `stall_after` seconds after the boot began is a stall: the VM is
    stopped there rather than at the overall limit, and the result names the boot."""
    console = open(workdir / "console.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")  # fmt: skip
    seen = _Console(boot_started=time.monotonic())

    def pump() -> None:
        assert proc.stdout
        for line in proc.stdout:
            console.write(f"[{time.monotonic() - start:6.1f}] {line}")
            console.flush()
            seen.tail.append(line.rstrip())
            if RESTART in line:
                seen.boots += 1
                seen.boot_started, seen.stepped = time.monotonic(), False
            elif STEP_UP.search(line):
                seen.stepped = True

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = time.monotonic() + boot_timeout * (expected_boots + 1)
    stalled, timed_out = 0, False
    while proc.poll() is None:
        now = time.monotonic()
        if not seen.stepped and now - seen.boot_started > stall_after:
            stalled = seen.boots
        timed_out = now > deadline
        if stalled or timed_out:
            proc.kill()  # only the qemu this harness started
            break
        time.sleep(0.5)
    proc.wait()
    reader.join(5)
    console.close()
    log = (share / "results.log").read_text() if (share / "results.log").exists() else ""
    results = [line.split("RESULT ", 1)[1] for line in log.splitlines() if "RESULT " in line]
    elapsed = time.monotonic() - start
    if stalled:
        detail = f"boot {stalled} stalled: no step {stall_after:.0f}s after it began"
    elif timed_out:
        detail = f"timed out; {log[-300:]!r}"
    elif results != ["pass"]:
        detail = "; ".join(results) or "no result"
    elif seen.boots != expected_boots:
        detail = f"expected {expected_boots} boots"
    else:
        return VmResult(name, True, seen.boots, elapsed)
    return VmResult(name, False, seen.boots, elapsed, detail, stalled, tuple(seen.tail))


def main() -> int:
    parser = argparse.ArgumentParser(prog="vm-tests/run.py", description=__doc__)
    parser.add_argument("-k", action="append", help="only scenarios whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep overlays, consoles, shares")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("the VM tier needs root")
        return 1
    selected = [s for s in SCENARIOS if not args.k or any(k in s.name for k in args.k)]
    total = time.monotonic()
    image = ensure_image()
    print(f"VM image: {image.dir} ({'built' if image.built else 'cached'}, {image.seconds:.1f}s)")
    return run_tier(
        "vm",
        "ima-vm-",
        [(s.name, s.needs_agent, lambda w, d, s=s: run_vm(image, w, s, d)) for s in selected],
        keep=args.keep,
        started=total,
    )


Runner = Callable[[World, Path], VmResult]


def run_once_more_after_a_first_boot_stall(runner: Runner, world: World, folder: Path) -> VmResult:
    """Run a scenario in `folder`; if its first boot stalled, report that and run it once more
    (the stalled run's files moved to `<folder>.stalled`). Before the first boot's step nothing
    of the agent's has run (its units load when the step starts), so a stall there is the
    emulator's; a stall in any later boot is a failure."""
    result = runner(world, folder)
    if result.stalled_boot != 1:
        return result
    report(result, "STALL")
    folder.rename(folder.with_name(f"{folder.name}.stalled"))
    result = runner(world, folder)
    result.detail = "; ".join(filter(None, [result.detail, "run again after a first-boot stall"]))
    return result


def report(result: VmResult, verdict: str) -> None:
    """The scenario's line; under a failure, the console's last lines (what CI keeps of it)."""
    print(f"{verdict} {result.name:<24} boots={result.boots} {result.seconds:6.1f}s"
          + (f"  {result.detail}" if result.detail else ""), flush=True)  # fmt: skip
    if not result.ok and result.console_tail:
        print("\n".join(f"    | {line}" for line in result.console_tail), flush=True)


def run_tier(
    label: str,
    prefix: str,
    scenarios: list[tuple[str, bool, Runner]],
    *,
    keep: bool,
    started: float,
    check: Callable[[World], None] = lambda world: None,
) -> int:
    """Start the registries and images (no nspawn here), run each (name, needs the agent,
    runner) in its own folder, print a line each, and close with `<label>: N passed, N
    failed`, the line CI counts. `check` vets the world before any VM starts."""
    host_mode, blocked = probe_agent()
    print(f"agent: {blocked}" if blocked else f"agent: runs as a unit with --host {host_mode}")
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    world = World(Path("/nonexistent"), workdir, host_mode=host_mode or "local")
    results = []
    try:
        world.start()
        check(world)
        for name, needs_agent, runner in scenarios:
            if needs_agent and blocked:
                result = VmResult(name, False, 0, 0.0, blocked)
            else:
                result = run_once_more_after_a_first_boot_stall(runner, world, workdir / name)
            results.append(result)
            report(result, "PASS" if result.ok else "FAIL")
    finally:
        world.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    passed = sum(r.ok for r in results)
    print(f"{passed}/{len(results)} passed in {time.monotonic() - started:.1f}s"
        + (f" (kept {workdir})" if keep else ""))  # fmt: skip
    print(f"{label}: {passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
