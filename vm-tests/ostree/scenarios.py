"""The ostree VM tier: `vm-tests/ostree/run.sh [-k NAME]... [--keep]` (root; README.md here).

The agent and its real units on a Debian 12 host whose OS is an ostree deployment, booted by
SeaBIOS → extlinux → the entry ostree wrote (no `-kernel`: the bootloader picks the deployment),
with a bootc-compatible CLI on real ostree (guest/bootc). Staging is `ostree admin deploy
--stage --lock-finalization`, finalization and the /etc 3-way merge happen at shutdown in
ostree-finalize-staged.service, and a rollback boots the other deployment by its order.
The images are the system tier's, served by its loopback registry, reached from the guest at
10.0.2.100:5000 (slirp guestfwd, restrict=on: no other network)."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
import urllib.parse
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent), str(HERE)]

import run as vm  # noqa: E402  (vm-tests/run.py: the qemu driver and seed helpers)
from disk import GUEST_REGISTRY, Disk, ensure_disk  # noqa: E402

from agent.model.bootc_caps import pull_argv  # noqa: E402
from standins.bootc_releases import DEFAULT_PERSONA, features_of  # noqa: E402
from tests.system.rootfs import REPO  # noqa: E402
from tests.system.world import AGENT_ENV, DESIRED, KEY_A, World  # noqa: E402

CERT = "/etc/kubernetes/kubelet-ca.crt"  # on the live allowlist, no follow-up action
CERT_V1 = "-----BEGIN CERTIFICATE-----\nkubelet-ca one\n-----END CERTIFICATE-----\n"
CERT_V2 = "-----BEGIN CERTIFICATE-----\nkubelet-ca two\n-----END CERTIFICATE-----\n"
SETTINGS_DIR = "/etc/image-mode-agent/config.d"
STATE = "/var/lib/ostree-bootc"  # the guest bootc's state dir (persona, pull-delay, fetched.log)
SETTINGS = f"{SETTINGS_DIR}/50-ostree-tier.toml"
# Seconds per expected boot (plus one spare): a boot through the bootloader is 25-45 s under
# TCG, and an agent boot adds its start-up, the verifier, and staging (pull, commit, deploy).
BOOT_TIMEOUT = 300
# Through the bootloader a boot reached its step in 21-83 s (the slowest: after a finalization).
STALL_AFTER = 240


@dataclass(frozen=True)
class Scenario:
    name: str
    proves: str
    step: str  # the guest's step script; placeholders below
    boots: int
    next_image: str | None = "v2"  # the desired state the step switches to (None: no agent)
    follow: bool = False  # standalone mode: follow testos:v2, reboots held by a closed window
    persona: str | None = None  # the guest bootc's release (None: its default, the newest)


PERSONAS = ("1.12.0", "1.16.10")  # the releases the agent scenarios run on


def prepull(persona: str | None) -> bool:
    """Whether that bootc pre-stages by pre-pulling (it cannot stage locked)."""
    return "switch-download-only" not in features_of(persona or DEFAULT_PERSONA)


COMMON_V1 = """\
1) wait_agent Done {V1} || finish "fail: not Done on v1: $(agent_field reason)"
   [ "$(bootc --version)" = "bootc {PERSONA}" ] || finish "fail: $(bootc --version)"
   grep -q "{KEY}" /home/core/.ssh/authorized_keys.d/ignition || finish "fail: SSH key not written"
   [ "$(cat {CERT})" = "{CERT_V1}" ] || finish "fail: {CERT} not written live"
   ostree admin config-diff | grep -q "^A *kubernetes" \\
     || finish "fail: config-diff does not show the live cert: $(ostree admin config-diff)"
"""
# As bootc 1.12.0 (the disk's persona file), no agent: the real-ostree mechanics of the pre-pull
# (the agent's argv into the read-only /sysroot's repository: commits under image refs, nothing
# deployed), then as 1.16.10 (one command at a time) the locked stage, which finds v2 stored.
PLATFORM = """\
case $n in
1) [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest), not v1"
   [ "$(bootc --version)" = "bootc {PERSONA}" ] || finish "fail: $(bootc --version)"
   bootc switch {MISSING_REF} 2>/tmp/err && finish "fail: a missing image staged"
   grep -q "manifest unknown" /tmp/err || finish "fail: $(cat /tmp/err)"
   bootc switch --download-only {V2_REF} 2>/tmp/err; [ $? = 2 ] \\
     || finish "fail: bootc {PERSONA} took switch --download-only: $(cat /tmp/err)"
   sysroot_ro || finish "fail: /sysroot is not read-only: $(findmnt -no OPTIONS /sysroot)"
   bootc internals ostree-container image pull --quiet /sysroot/ostree/repo \\
     ostree-unverified-registry:{V2_REF} 2>/tmp/err \\
     && finish "fail: a pull wrote the read-only /sysroot"
   grep -qi "read-only file system" /tmp/err || finish "fail: not EROFS: $(cat /tmp/err)"
   log "refusals checked; pre-pulling v2 and v3"
   {PULL_V2} || finish "fail: the pre-pull of v2"
   {PULL_V3} || finish "fail: the pre-pull of v3"
   sysroot_ro || finish "fail: the pre-pull's remount leaked out of its mount namespace"
   [ -z "$(status_field staged digest)" ] || finish "fail: the pre-pull staged something"
   repo_lists {V2_REF} && repo_lists {V3_REF} \\
     || finish "fail: not stored: $(ostree refs --repo=/sysroot/ostree/repo ostree/container/image)"
   [ "$(ostree refs --repo=/sysroot/ostree/repo ostree/container/image | wc -l)" = 3 ] \\
     || finish "fail: image refs: $(ostree refs --repo=/sysroot/ostree/repo ostree/container/image)"
   [ "$(fetches 0 registry)" = 2 ] || finish "fail: pre-pulls: $(fetches 0)"
   log "pre-pulled: $(fetches 0)"
   mark=$(fetch_count)
   STANDIN_BOOTC_VERSION=1.16.10 bootc switch --download-only {V2_REF} \\
     || finish "fail: switch --download-only"
   [ "$(fetches $mark verbs)" = switch ] && [ "$(fetches $mark registry)" = 0 ] \\
     || finish "fail: the switch of the pre-pulled v2 went to the registry: $(fetches $mark)"
   [ "$(status_field staged digest)" = "{V2}" ] || finish "fail: v2 not staged"
   [ -e /run/ostree/staged-deployment-locked ] || finish "fail: not locked"
   bootc status --format json | grep -q '"downloadOnly": true' || finish "fail: not downloadOnly"
   repo_lists {V3_REF} && finish "fail: the stage did not prune the undeployed v3"
   repo_lists {V2_REF} && repo_lists {V1_REF} \\
     || finish "fail: the stage pruned a deployment's image"
   log "staged from the repository: $(fetches $mark)"
   bootc upgrade --from-downloaded || finish "fail: from-downloaded"
   [ ! -e /run/ostree/staged-deployment-locked ] || finish "fail: still locked"
   log staged; systemctl reboot --no-block ;;
2) [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest), not v2"
   grep -q VERSION=v2 /usr/lib/testos-release || finish "fail: v2's /usr not booted"
   [ "$(status_field rollback digest)" = "{V1}" ] || finish "fail: rollback is not v1"
   journalctl -b -1 | grep -q "Finalizing staged deployment" || finish "fail: not finalized"
   sysroot_ro || finish "fail: /sysroot is not read-only after the finalization"
   bootc rollback || finish "fail: rollback"
   bootc status --format json | grep -q '"rollbackQueued": true' || finish "fail: not queued"
   log "rollback queued"; systemctl reboot --no-block ;;
3) [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest) after rollback"
   [ "$checksum" = "$(sed -n 1p /var/lib/harness/booted.log | cut -d' ' -f2)" ] \\
     || finish "fail: not the first boot's deployment"
   grep -q VERSION=v1 /usr/lib/testos-release || finish "fail: v1's /usr not booted"
   finish pass ;;
*) finish "fail: boot $n" ;;
esac
"""
IMAGE_UPDATE = """\
case $n in
{COMMON_V1}   set_desired desired-next.yaml
   sleep 400; finish "fail: no reboot after v2 was desired ($(agent_field reason))" ;;
2) wait_agent Done {V2} || finish "fail: not Done on v2: $(agent_field reason)"
   [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest)"
   grep -q VERSION=v2 /usr/lib/testos-release || finish "fail: v2's /usr not booted"
   [ "$(status_field rollback digest)" = "{V1}" ] || finish "fail: rollback is not v1"
   journalctl -b -1 -o cat | grep -q "Copying /etc changes" || finish "fail: no /etc merge"
   grep -q "{KEY}" /home/core/.ssh/authorized_keys.d/ignition || finish "fail: SSH key lost"
   [ "$(cat {CERT})" = "{CERT_V2}" ] || finish "fail: live cert after the merge: $(cat {CERT})"
   # boot-complete ordering: the verifier ran, passed, and finished before the target
   verified=$(systemctl show -p ExecMainExitTimestampMonotonic --value image-mode-agent-verify)
   complete=$(systemctl show -p ActiveEnterTimestampMonotonic --value boot-complete.target)
   [ "$(systemctl show -p Result --value image-mode-agent-verify)" = success ] \\
     || finish "fail: the verifier did not succeed"
   [ "$verified" -gt 0 ] && [ "$verified" -le "$complete" ] \\
     || finish "fail: boot-complete.target ($complete) before the verifier ended ($verified)"
   log "verifier ended at $verified us, boot-complete.target at $complete us"
   finish pass ;;
*) finish "fail: boot $n: more reboots than one" ;;
esac
"""
HEALTH_ROLLBACK = """\
case $n in
{COMMON_V1}   set_desired desired-next.yaml
   sleep 400; finish "fail: no reboot after v3 was desired" ;;
2) sleep 400; finish "fail: no rollback reboot from v3 ($(agent_field reason))" ;;
3) wait_agent Degraded 50-testos-health || finish "fail: not Degraded: $(agent_field reason)"
   [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest)"
   first=$(sed -n 1p /var/lib/harness/boots.log | cut -d' ' -f2)
   now=$(sed -n 3p /var/lib/harness/boots.log | cut -d' ' -f2)
   [ "$first" = "$now" ] || finish "fail: deployment $now booted, not the first one ($first)"
   grep -q VERSION=v1 /usr/lib/testos-release || finish "fail: v1's /usr not booted"
   [ ! -e /etc/image-mode-agent/check/required.d/50-testos-health ] \\
     || finish "fail: v3's /etc check is still there"
   journalctl -b -1 -o cat | grep -q "Reached target.*Boot Completion" \\
     && finish "fail: boot-complete.target was reached on the failing v3 boot"
   [ "$(cat {CERT})" = "{CERT_V1}" ] || finish "fail: cert not reverted: $(cat {CERT})"
   sleep 60  # not retried: nothing staged again, still Degraded
   [ -z "$(status_field staged digest)" ] || finish "fail: restaged $(status_field staged digest)"
   [ "$(agent_field state)" = Degraded ] || finish "fail: $(agent_field state) after a minute"
   finish pass ;;
*) finish "fail: boot $n" ;;
esac
"""
# The agent is killed while its stage unit pulls (a short pull-delay makes the moment visible)
# and kept down until that unit has finished the locked deployment: the state between staging and
# the reboot, with no agent. Then it starts again, as systemd's Restart= would have started it.
AGENT_KILLED = """\
case $n in
{COMMON_V1}   mkdir -p {STATE}; rm -f {STATE}/pulling; echo 5 > {STATE}/pull-delay
   set_desired desired-next.yaml
   wait_file {STATE}/pulling || finish "fail: no pull started"
   systemctl kill -s KILL image-mode-agent.service; systemctl stop image-mode-agent.service
   rm -f {STATE}/pull-delay; log "agent killed while its stage unit pulls"
   wait_file /run/ostree/staged-deployment || finish "fail: nothing staged"
   # RemainAfterExit: the unit stays active (exited) for the agent to read; wait for the exit.
   while [ "$(systemctl show -p SubState --value image-mode-agent-stage.service)" = running ]; do
     sleep 0.5
   done
   [ -e /run/ostree/staged-deployment-locked ] || finish "fail: the staged deployment is unlocked"
   status_field staged checksum > /var/lib/harness/staged-checksum
   echo written-after-staging > /etc/harness-after-staging  # merged at shutdown?
   log "staged and locked with no agent; agent started again"
   systemctl start --no-block image-mode-agent.service
   sleep 400; finish "fail: no reboot after the agent restarted ($(agent_field reason))" ;;
2) wait_agent Done {V2} || finish "fail: not Done on v2: $(agent_field reason)"
   [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest)"
   if [ "$checksum" = "$(cat /var/lib/harness/staged-checksum)" ]; then
     log "the locked deployment survived the kill and was booted"
   else
     log "restaged after the kill"
   fi
   # ostree merges /etc when it finalizes, at shutdown: a write after staging still lands.
   [ "$(cat /etc/harness-after-staging)" = written-after-staging ] \
     || finish "fail: an /etc write made after staging did not reach the new deployment"
   [ "$(cat {CERT})" = "{CERT_V2}" ] || finish "fail: live cert after the merge: $(cat {CERT})"
   finish pass ;;
*) finish "fail: boot $n: more reboots than one" ;;
esac
"""
# Standalone mode (`--source image:REG/testos:v2`), the periodic strategy's only window days
# away: the agent pre-stages v2 the best way the persona's bootc can (1.16.10: staged locked;
# 1.12.0: pre-pulled into the repository, nothing staged) and holds the reboot, which is where a
# pre-staged image waits on a real host. Someone else reboots. Then the window opens (settings
# replaced, the agent restarted): the turn fetches nothing.
FOREIGN_REBOOT = """\
case $n in
1) wait_agent Working "reboot held" || finish "fail: no held pre-stage: $(agent_field reason)"
   [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest)"
   [ "$(bootc --version)" = "bootc {PERSONA}" ] || finish "fail: $(bootc --version)"
   if [ {PREPULL} = 1 ]; then
     [ -z "$(status_field staged digest)" ] \\
       || finish "fail: bootc {PERSONA} staged $(status_field staged digest)"
     repo_lists {V2_REF} || finish "fail: v2 is not in the repository"
     [ "$(fetches 0 verbs)" = pull ] && [ "$(fetches 0 registry)" = 1 ] \\
       || finish "fail: not one pre-pull from the registry: $(fetches 0)"
     sysroot_ro || finish "fail: /sysroot is not read-only after the pre-pull"
   else
     [ "$(status_field staged digest)" = "{V2}" ] || finish "fail: v2 not pre-staged"
     [ -e /run/ostree/staged-deployment-locked ] || finish "fail: the pre-stage is not locked"
   fi
   log "pre-staged: $(fetches 0)"
   grep -q "{KEY}" /home/core/.ssh/authorized_keys.d/ignition || finish "fail: SSH key not written"
   log "someone else reboots"; systemctl reboot --no-block
   sleep 400; finish "fail: the foreign reboot did not happen" ;;
2) [ "$(booted_digest)" = "{V1}" ] || finish "fail: booted $(booted_digest), not v1"
   first=$(sed -n 1p /var/lib/harness/boots.log | cut -d' ' -f2)
   [ "$first" = "$(sed -n 2p /var/lib/harness/boots.log | cut -d' ' -f2)" ] \\
     || finish "fail: the reboot did not boot the same deployment"
   if [ {PREPULL} = 0 ]; then
     journalctl -b -1 -o cat \\
       | grep -q "Not finalizing; found /run/ostree/staged-deployment-locked" \\
       || finish "fail: ostree did not drop the locked deployment at the reboot"
   fi
   # status.json still says what the last boot ended with: wait for this boot's pre-stage.
   i=0
   until journalctl -b -u image-mode-agent -o cat | grep -q "reboot held"; do
     [ $i -ge 300 ] && finish "fail: the agent did not pre-stage v2 again: $(agent_field reason)"
     sleep 2; i=$((i + 2))
   done
   if [ {PREPULL} = 1 ]; then
     [ -z "$(status_field staged digest)" ] || finish "fail: staged $(status_field staged digest)"
     repo_lists {V2_REF} || finish "fail: the reboot pruned the pre-pulled v2"
   else
     journalctl -b -u image-mode-agent -o cat | grep -q "pre-staged .*{V2}" \\
       || finish "fail: held without pre-staging v2 again in this boot"
     [ "$(status_field staged digest)" = "{V2}" ] || finish "fail: v2 not pre-staged again"
     [ -e /run/ostree/staged-deployment-locked ] || finish "fail: the new pre-stage is not locked"
   fi
   # The reboot dropped no image: pre-staging again took v2's commit, not the registry.
   [ "$(fetches 0 boot)" = 0 ] || finish "fail: fetched again after the reboot: $(fetches 0)"
   wait_agent Working "reboot held" || finish "fail: not held again: $(agent_field reason)"
   fetch_count > /var/lib/harness/fetch-mark
   log "the window opens: $(fetches 0)"
   cp $H/settings-open.toml {SETTINGS}; systemctl restart image-mode-agent.service
   sleep 400; finish "fail: no reboot once the window opened ($(agent_field reason))" ;;
3) wait_agent Done {V2} || finish "fail: not Done on v2: $(agent_field reason)"
   [ "$(booted_digest)" = "{V2}" ] || finish "fail: booted $(booted_digest)"
   [ "$(status_field rollback digest)" = "{V1}" ] || finish "fail: rollback is not v1"
   mark=$(cat /var/lib/harness/fetch-mark)
   [ "$(fetches $mark registry)" = 0 ] || finish "fail: the turn fetched: $(fetches $mark)"
   if [ {PREPULL} = 1 ]; then
     [ "$(fetches $mark verbs)" = switch ] || finish "fail: the turn: $(fetches $mark)"
     journalctl -b -1 -u image-mode-agent -o cat | grep -q "nothing fetched" \\
       || finish "fail: the agent did not say its turn fetched nothing"
   fi
   log "the turn: $(fetches $mark)"
   finish pass ;;
*) finish "fail: boot $n: the agent rebooted outside its window" ;;
esac
"""
SCENARIOS = [
    Scenario(
        "platform-ostree",
        "no agent, as bootc 1.12.0: the pre-pull into the read-only /sysroot's repository "
        "(EROFS without the remount; commits under image refs, nothing deployed), then as "
        "1.16.10 a locked stage that takes v2's commit (no registry) and prunes v3's; a missing "
        "image refused, unlock, finalize at shutdown, rollback by deployment order",
        PLATFORM,
        3,
        next_image=None,
        persona="1.12.0",
    ),
    *(
        Scenario(
            f"image-update-ostree-{persona}",
            f"bootc {persona}: v1 -> v2 with one reboot, the /etc merge keeps the live key and "
            "cert, the verifier ends before boot-complete.target",
            IMAGE_UPDATE,
            2,
            persona=persona,
        )
        for persona in PERSONAS
    ),
    Scenario(
        "health-rollback-ostree",
        "v3's required check fails: the first deployment and "
        "its /etc boot again, Degraded, not retried",
        HEALTH_ROLLBACK,
        3,
        "v3",
    ),
    Scenario(
        "agent-killed-ostree",
        "the agent killed while staging and down until the locked deployment is complete: "
        "started again, one reboot into v2; an /etc write made after staging reaches it",
        AGENT_KILLED,
        2,
    ),
    *(
        Scenario(
            f"foreign-reboot-ostree-{persona}",
            f"bootc {persona}, following a tag, v2 pre-staged "
            + ("by a pre-pull (nothing staged)" if prepull(persona) else "locked")
            + " and held by a closed window; someone else reboots: the same deployment boots, "
            "the agent pre-stages v2 again from the repository; the window opens: one reboot "
            "into v2, nothing fetched at the turn",
            FOREIGN_REBOOT,
            3,
            follow=True,
            persona=persona,
        )
        for persona in PERSONAS
    ),
]


def window(start: datetime, minutes: int) -> str:
    """Periodic settings with one window (UTC, the guest's clock) opening at `start`."""
    return (
        '[updates]\nstrategy = "periodic"\n\n[updates.periodic]\ntime_zone = "UTC"\n\n'
        f'[[updates.periodic.window]]\ndays = ["{start:%a}"]\nstart_time = "{start:%H:%M}"\n'
        f"length_minutes = {minutes}\n"
    )


def closed_window() -> str:
    """Periodic settings whose only window opens three days from now."""
    return window(datetime.now(UTC) + timedelta(days=3), 60)


def open_window() -> str:
    """Periodic settings whose window opened five minutes ago and lasts two hours: the
    scenario's turn falls into it."""
    return window(datetime.now(UTC) - timedelta(minutes=5), 120)


def cert_file(text: str) -> dict:
    source = "data:," + urllib.parse.quote(text)
    return {"path": CERT, "mode": 0o644, "overwrite": True, "contents": {"source": source}}


def seed(world: World, share: Path, scenario: Scenario) -> None:
    """The files the first boot copies into the host (harness-seed.service)."""
    s = share / "seed"
    images = {k: vm.guest_image(v) for k, v in world.images.items()}
    conf = s / "etc/containers/registries.conf.d/50-vm-tier.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f'[[registry]]\nlocation = "{GUEST_REGISTRY}"\ninsecure = true\n')
    if scenario.next_image:
        vm.seed_agent_units(s)
        desired = s / DESIRED.lstrip("/")
        desired.parent.mkdir(parents=True, exist_ok=True)
        desired.write_text(vm.desired_doc(images["v1"], (cert_file(CERT_V1),)))
        os.chmod(desired, 0o600)
        args = f"--source file:{DESIRED} --host {world.host_mode}"
        if scenario.follow:
            args = (
                f"--source image:{images['v2'].name}:v2 --host {world.host_mode} --check-interval"
                f" 5 --settings-dir {SETTINGS_DIR} --config file:{DESIRED}"
            )
            settings = s / SETTINGS.lstrip("/")
            settings.parent.mkdir(parents=True)
            settings.write_text(closed_window())
            (share / "settings-open.toml").write_text(open_window())
        (s / AGENT_ENV.lstrip("/")).write_text(f'IMAGE_MODE_AGENT_ARGS="{args}"\n')
        next_doc = vm.desired_doc(images[scenario.next_image], (cert_file(CERT_V2),))
        (share / "desired-next.yaml").write_text(next_doc)
    if scenario.persona:
        persona = s / STATE.lstrip("/") / "persona"
        persona.parent.mkdir(parents=True, exist_ok=True)
        persona.write_text(scenario.persona + "\n")

    def pull(image: str) -> str:  # the agent's pre-pull argv, as the step runs it
        return shlex.join(pull_argv("bootc", images[image].pinned, signed=False))

    step = scenario.step.replace("{COMMON_V1}", COMMON_V1)
    for key, value in {
        "{V1}": images["v1"].digest, "{V2}": images["v2"].digest, "{V3}": images["v3"].digest,
        "{V2_REF}": images["v2"].pinned, "{MISSING_REF}": images["missing"].pinned,
        "{V1_REF}": images["v1"].pinned, "{V3_REF}": images["v3"].pinned,
        "{PULL_V2}": pull("v2"), "{PULL_V3}": pull("v3"), "{SETTINGS}": SETTINGS,
        "{PERSONA}": scenario.persona or DEFAULT_PERSONA,
        "{PREPULL}": "1" if prepull(scenario.persona) else "0",
        "{KEY}": KEY_A.split()[1], "{CERT}": CERT, "{STATE}": STATE,
        "{CERT_V1}": CERT_V1.rstrip("\n"), "{CERT_V2}": CERT_V2.rstrip("\n"),
    }.items():  # fmt: skip
        step = step.replace(key, value)
    # The share is the guest's /var/mnt/harness; guest/run-step.sh sources the step script there.
    (share / "step.sh").write_text(step)
    shutil.copy(HERE / "guest/run-step.sh", share / "run-step")


def run_scenario(disk: Disk, world: World, scenario: Scenario, workdir: Path) -> vm.VmResult:
    start = time.monotonic()
    share = workdir / "harness"
    share.mkdir(parents=True)
    seed(world, share, scenario)
    overlay = workdir / "overlay.qcow2"
    vm.subprocess.run(["timeout", "30", "qemu-img", "create", "-q", "-f", "qcow2", "-b",
                       str(disk.image), "-F", "raw", str(overlay)], check=True)  # fmt: skip
    assert world.registry
    cmd = [
        "qemu-system-x86_64", "-accel", "tcg", "-m", "2048", "-smp", "2", "-nographic",
        "-nic", f"user,model=virtio-net-pci,restrict=on,"
                f"guestfwd=tcp:{GUEST_REGISTRY}-cmd:/usr/bin/python3 {vm.HERE / 'relay.py'} "
                f"{world.registry.host.replace(':', ' ')}",
        # No -kernel: SeaBIOS boots the disk's MBR, extlinux reads the config ostree wrote.
        "-drive", f"file={overlay},if=virtio,format=qcow2",
        "-virtfs", f"local,path={REPO},mount_tag=src,security_model=none,readonly=on,id=src",
        "-virtfs", f"local,path={share},mount_tag=harness,security_model=none,id=harness",
    ]  # fmt: skip
    return vm.drive(
        cmd, workdir, share, scenario.name, scenario.boots, start, BOOT_TIMEOUT, STALL_AFTER
    )


def main() -> int:
    parser = argparse.ArgumentParser(prog="vm-tests/ostree/run.sh", description=__doc__)
    parser.add_argument("-k", action="append", help="only scenarios whose name contains this")
    parser.add_argument("--keep", action="store_true", help="keep overlays, consoles, shares")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args()
    selected = [s for s in SCENARIOS if not args.k or any(k in s.name for k in args.k)]
    if args.list:
        for s in selected:
            print(f"{s.name:<24} {s.boots} boots  {s.proves}")
        return 0
    if os.geteuid() != 0:
        print("the ostree VM tier needs root")
        return 1
    total = time.monotonic()
    disk = ensure_disk()
    print(f"ostree disk: {disk.dir} ({'built' if disk.built else 'cached'}, {disk.seconds:.1f}s)")

    def same_v1(world: World) -> None:
        if world.images["v1"].digest != disk.v1_digest:
            raise RuntimeError(f"the registry's v1 is {world.images['v1'].digest}, the disk's "
                               f"{disk.v1_digest}: the disk is stale")  # fmt: skip

    return vm.run_tier(
        "ostree-vm",
        "ima-ostree-",
        [
            (s.name, s.next_image is not None, lambda w, d, s=s: run_scenario(disk, w, s, d))
            for s in selected
        ],
        keep=args.keep,
        started=total,
        check=same_v1,
    )


if __name__ == "__main__":
    sys.exit(main())
