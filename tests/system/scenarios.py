"""The system tier's scenarios. Each gets a fresh machine (an overlay of the cached rootfs) and
raises on the first expectation that does not hold; `boots` is counted by the machine."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from standins.bootc_releases import features_of
from tests.system.drift_scenarios import config_drift, mcd_takeover
from tests.system.machine import Machine, MachineError
from tests.system.rootfs import REPO
from tests.system.world import (
    AGENT_STATE,
    AGENT_UNIT,
    KEY_A,
    KEY_B,
    STANDIN_STATE,
    Image,
    World,
)

AGENT_TIMEOUT = 90  # seconds for the agent to settle after a change (staging included)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[World, Machine], None]
    needs_agent: bool = True
    doc: str = ""
    # The machine's lower tree when not the cached rootfs (e.g. a built bootc image's root).
    lower: Callable[[World], Path] | None = None
    # The bootc release the machine's stand-in speaks (None: the newest, its default).
    persona: str | None = None


# ---- helpers --------------------------------------------------------------------------------


def expect(ok: object, what: str) -> None:
    if not ok:
        raise MachineError(what)


def bootc_status(m: Machine) -> dict:
    return json.loads(m.sh("bootc status --format json --format-version 1").stdout)


def booted_digest(m: Machine) -> str | None:
    state = m.read_json(f"{STANDIN_STATE}/state.json") or {}
    return (state.get("booted") or {}).get("digest")


def agent_status(m: Machine) -> dict:
    return m.read_json(f"{AGENT_STATE}/status.json") or {}


def wait_state(m: Machine, state: str, what: str, timeout: float = AGENT_TIMEOUT, **match) -> dict:
    """Until the agent's status.json says `state` (and each `match` key contains its text)."""

    def ok() -> dict | None:
        s = agent_status(m)
        if s.get("state") != state:
            return None
        if all(text in str(s.get(k) or "") for k, text in match.items()):
            return s
        return None

    try:
        return m.wait_for(ok, timeout, what)  # type: ignore[return-value]
    except MachineError as exc:
        raise MachineError(f"{exc}; last agent status: {agent_status(m)}") from None


def settle_done(m: Machine, image: Image) -> dict:
    return wait_state(m, "Done", f"Done on {image.tag}", currentImage=image.digest)


def no_more_boots(m: Machine, boots: int, seconds: float = 3) -> None:
    """Nothing reboots behind our back once settled."""
    time.sleep(seconds)
    expect(m.boots == boots, f"expected {boots} boot(s), the machine booted {m.boots} times")


def fetches(m: Machine) -> list[dict]:
    """The stand-in bootc's fetched.log: one line per fetch (a stage's pull or a pre-pull), with
    whether the registry was contacted and the bytes it had to download."""
    text = m.read(f"{STANDIN_STATE}/fetched.log") or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def expect_bootc_announced(m: Machine) -> None:
    """The agent's status names the machine's bootc release (the stand-in's persona) and the
    pre-stage path that release allows: download-only from 1.16.10, else the pre-pull."""
    if m.persona is None:
        return
    bootc = agent_status(m).get("bootc") or {}
    want = "download-only" if "switch-download-only" in features_of(m.persona) else "pre-pull"
    expect(bootc.get("version") == m.persona and bootc.get("prestage") == want,
           f"status.json bootc is {bootc}, the host has bootc {m.persona} ({want})")  # fmt: skip


def start_managed(w: World, m: Machine, image: Image) -> None:
    w.boot_into(m, image)
    w.install_agent(m, image)
    m.start()
    m.wait_booted(1)
    settle_done(m, image)


# ---- scenarios --------------------------------------------------------------------------------


def platform(w: World, m: Machine) -> None:
    """Harness proof without the agent: PID 1, bus, boot IDs across a reboot, the registry from
    inside, the stand-in bootc pulling by digest, a missing manifest and an auth failure."""
    v1, v2 = w.images["v1"], w.images["v2"]
    w.boot_into(m, v1)
    m.start()
    first = m.wait_booted(1)
    m.wait_system_up()
    expect(m.sh("cat /proc/1/comm").stdout.strip() == "systemd", "PID 1 is not systemd")
    m.sh("test -S /run/dbus/system_bus_socket && busctl --system status >/dev/null")
    expect(m.read("/usr/lib/testos-release") == "VERSION=v1\n", "v1's files not applied at boot")
    digest = m.sh(f"skopeo inspect --format '{{{{.Digest}}}}' docker://{v2.name}:v2").stdout
    expect(digest.strip() == v2.digest, f"registry digest {digest!r} != pushed {v2.digest}")

    missing = m.sh(f"bootc switch {w.images['missing'].pinned}", check=False)
    expect(missing.returncode == 1, f"switch to a missing image exited {missing.returncode}")
    expect("manifest unknown" in missing.stderr, f"no 'manifest unknown': {missing.stderr}")
    auth = w.images["auth-v2"]
    denied = m.sh(f"bootc switch {auth.pinned}", check=False)
    unauthorized = re.search(r"unauthorized|authentication required", denied.stderr, re.I)
    expect(denied.returncode == 1 and unauthorized, f"no auth failure: {denied.stderr}")
    expect(bootc_status(m)["status"]["staged"] is None, "a failed switch left a staged image")

    m.sh(f"bootc switch --transport registry {v2.pinned}")
    staged = bootc_status(m)["status"]["staged"]
    expect(staged and staged["image"]["imageDigest"] == v2.digest, f"v2 not staged: {staged}")
    m.sh("systemctl reboot --no-block")
    second = m.wait_booted(2)
    expect(m.exit_codes[:1] == [133], f"reboot exit codes {m.exit_codes}")
    expect(second["bootId"] != first["bootId"], "the boot ID did not change across the reboot")
    expect(second["event"] == "booted-staged", f"second boot: {second}")
    m.wait_system_up()
    st = bootc_status(m)["status"]
    expect(st["booted"]["image"]["imageDigest"] == v2.digest, "v2 is not booted after reboot")
    expect(st["rollback"]["image"]["imageDigest"] == v1.digest, "v1 is not the rollback")
    expect(m.read("/usr/lib/testos-release") == "VERSION=v2\n", "v2's files not applied")

    # A pull secret where bootc looks for one makes the auth registry pull work.
    m.sh(f"mkdir -p /run/ostree && cat > /run/ostree/auth.json <<'EOF'\n"
         f"{(w.workdir / 'auth.json').read_text()}\nEOF")  # fmt: skip
    m.sh(f"bootc switch {auth.pinned}")
    m.stop()
    expect(m.boots == 2, f"expected 2 boots, got {m.boots}")


def standin_bootloader(w: World, m: Machine) -> None:
    """The stand-in's boot semantics the agent relies on, across real container reboots: a
    locked (--download-only) stage is dropped by a plain reboot, `upgrade --from-downloaded`
    unlocks it, a marked boot falls back, `rollback` is a toggle, and a masked reboot.target
    holds a reboot request back (crash-recovery uses that)."""
    v1, v2 = w.images["v1"], w.images["v2"]
    w.boot_into(m, v1)
    m.start()
    m.wait_booted(1)
    m.wait_system_up()

    def booted() -> str:
        return bootc_status(m)["status"]["booted"]["image"]["imageDigest"]

    def reboot(boot: int) -> dict:
        m.sh("systemctl reboot --no-block")
        record = m.wait_booted(boot)
        m.wait_system_up()
        return record

    m.sh(f"bootc switch --download-only {v2.pinned}")
    staged = bootc_status(m)["status"]["staged"]
    expect(staged and staged["downloadOnly"], f"not staged download-only: {staged}")
    expect(reboot(2)["event"] == "discarded-locked", "a locked stage was not discarded")
    expect(booted() == v1.digest, "a locked stage was booted")

    m.sh(f"bootc switch --download-only {v2.pinned} && bootc upgrade --from-downloaded")
    expect(reboot(3)["event"] == "booted-staged" and booted() == v2.digest, "unlock: no v2")

    m.sh(f"bootc switch {v1.pinned}")
    m.write(f"{STANDIN_STATE}/fail-next-boot", "")
    expect(reboot(4)["event"] == "fell-back" and booted() == v2.digest, "no fallback")

    m.sh("bootc rollback")
    expect(bootc_status(m)["status"]["rollbackQueued"], "rollback not queued")
    m.sh("bootc rollback")  # a toggle: back to the default order
    expect(not bootc_status(m)["status"]["rollbackQueued"], "rollback is not a toggle")
    m.sh("bootc rollback")
    expect(reboot(5)["event"] == "rolled-back" and booted() == v1.digest, "rollback: no v1")
    expect(m.read("/usr/lib/testos-release") == "VERSION=v1\n", "v1's files not back")

    m.sh("systemctl mask --runtime reboot.target")
    held = m.sh("systemctl reboot --no-block", check=False)
    expect(held.returncode != 0, "a masked reboot.target did not hold the reboot back")
    time.sleep(1)
    expect(m.boots == 5 and m.running, f"rebooted anyway: boots={m.boots}")
    m.sh("systemctl unmask --runtime reboot.target")
    m.stop()
    expect(m.exit_codes == [133] * 4 + [0], f"exit codes {m.exit_codes}")


def live_ssh_key(w: World, m: Machine) -> None:
    """An SSH key change is written live: no stage, no reboot."""
    v1 = w.images["v1"]
    start_managed(w, m, v1)
    path = "/home/core/.ssh/authorized_keys.d/ignition"
    m.wait_for(lambda: KEY_A in (m.read(path) or ""), 10, "key A written")
    w.set_desired(m, v1, KEY_B)
    m.wait_for(lambda: (m.read(path) or "").strip() == KEY_B, AGENT_TIMEOUT, "key B written")
    wait_state(m, "Done", "Done after the key change", currentConfig=KEY_B[-6:])
    info = m.path(path).stat()
    expect(stat.S_IMODE(info.st_mode) == 0o600, f"mode {oct(info.st_mode)}")
    core_uid = int(m.sh("id -u core").stdout)
    expect(info.st_uid == core_uid, f"owner uid {info.st_uid}, core is {core_uid}")
    expect(bootc_status(m)["status"]["staged"] is None, "something was staged for a key change")
    no_more_boots(m, 1)


def image_update(w: World, m: Machine) -> None:
    """v1 → v2: staged, exactly one reboot, verified before boot-complete, committed; the agent
    names the host's bootc release, and v2's blobs came from the registry once."""
    v1, v2 = w.images["v1"], w.images["v2"]
    start_managed(w, m, v1)
    expect_bootc_announced(m)
    w.set_desired(m, v2)
    m.wait_booted(2, AGENT_TIMEOUT)
    settle_done(m, v2)
    expect(booted_digest(m) == v2.digest, "v2 is not the booted deployment")
    m.wait_system_up()
    verify = m.sh("systemctl show -p ActiveState,Result image-mode-agent-verify.service").stdout
    expect("Result=success" in verify, f"verify unit: {verify}")
    m.sh("systemctl is-active boot-complete.target")
    pulls = [f for f in fetches(m) if f["ref"] == v2.pinned and f["bytes"] > 0]
    expect(len(pulls) == 1, f"v2 was downloaded {len(pulls)} times: {fetches(m)}")
    no_more_boots(m, 2)


def health_rollback(w: World, m: Machine) -> None:
    """v3 ships a required check that fails: rolled back to v1, the cause recorded, and v3's
    check is gone with it."""
    v1, v3 = w.images["v1"], w.images["v3"]
    start_managed(w, m, v1)
    w.set_desired(m, v3)
    m.wait_booted(3, AGENT_TIMEOUT * 2)
    status = wait_state(m, "Degraded", "Degraded after the rollback", reason="50-testos-health")
    expect("payments service did not start" in status["reason"], f"cause: {status['reason']}")
    expect(booted_digest(m) == v1.digest, "v1 is not booted after the rollback")
    expect(not m.path("/etc/image-mode-agent/check/required.d/50-testos-health").exists(),
           "v3's failing check survived the rollback")  # fmt: skip
    no_more_boots(m, 3, seconds=5)


def missing_image(w: World, m: Machine) -> None:
    """An image the registry does not have: Degraded with that reason, nothing disrupted."""
    v1, missing = w.images["v1"], w.images["missing"]
    start_managed(w, m, v1)
    w.set_desired(m, missing)
    status = wait_state(m, "Degraded", "Degraded for the missing image")
    expect(re.search(r"manifest unknown|image-missing|not found", status["reason"], re.I),
           f"reason does not say the image is missing: {status['reason']}")  # fmt: skip
    expect(bootc_status(m)["status"]["staged"] is None, "something was staged")
    expect(booted_digest(m) == v1.digest, "the booted image changed")
    no_more_boots(m, 1)


def crash_recovery(w: World, m: Machine) -> None:
    """SIGKILL while staging, and again right after the agent journaled the reboot (the
    reboot request held back by a runtime mask of reboot.target): one reboot in total."""
    v1, v2 = w.images["v1"], w.images["v2"]
    start_managed(w, m, v1)
    m.write(f"{STANDIN_STATE}/pull-delay", "6")
    m.sh("systemctl mask --runtime reboot.target")
    w.set_desired(m, v2)
    m.wait_for(lambda: m.path(f"{STANDIN_STATE}/pulling").exists(), AGENT_TIMEOUT, "staging")
    kill_agent(m)
    m.path(f"{STANDIN_STATE}/pull-delay").unlink()

    def journaled_reboot() -> bool:
        return (m.read_json(f"{AGENT_STATE}/journal.json") or {}).get("phase") == "rebooting"

    m.wait_for(journaled_reboot, AGENT_TIMEOUT, "the agent to journal the reboot")
    expect(m.boots == 1, "rebooted although reboot.target was masked")
    # The held reboot request may already have failed and the agent be in its restart delay.
    m.wait_for(
        lambda: m.sh(f"systemctl show -p MainPID --value {AGENT_UNIT}").stdout.strip() != "0",
        30,
        "the agent to be running again",
    )
    kill_agent(m)
    m.sh("systemctl unmask --runtime reboot.target")
    m.wait_booted(2, AGENT_TIMEOUT)
    settle_done(m, v2)
    no_more_boots(m, 2)


def kill_agent(m: Machine) -> None:
    """SIGKILL the agent's main process only (a crash): a staging job the agent started as its
    own transient unit must survive it; systemd restarts the agent (Restart=)."""
    pid = m.sh(f"systemctl show -p MainPID --value {AGENT_UNIT}").stdout.strip()
    expect(pid not in ("", "0"), "the agent is not running: nothing to kill")
    m.sh(f"systemctl kill --kill-who=main --signal=SIGKILL {AGENT_UNIT}")


STANDARD_FIELDS = re.compile(
    r"^(_.*|__.*|MESSAGE|PRIORITY|SYSLOG_.*|CODE_(FILE|LINE|FUNC)|INVOCATION_ID|TID|ERRNO)$"
)


def journald_fields(w: World, m: Machine) -> None:
    """The agent logs to journald with its own structured fields, not only a MESSAGE line."""
    start_managed(w, m, w.images["v1"])
    entries = m.journal(f"_SYSTEMD_UNIT={AGENT_UNIT}")
    expect(entries, "no journal entries from the agent unit")
    custom = {k for e in entries for k in e if not STANDARD_FIELDS.match(k)}
    expect(custom, "the agent's journal entries carry no structured fields beyond MESSAGE; "
           f"sample: {entries[-1].get('MESSAGE', '')[:200]!r}")  # fmt: skip
    # The reconcile result itself is queryable: `journalctl STATE=Done` finds it.
    done = m.journal(f"_SYSTEMD_UNIT={AGENT_UNIT}", "STATE=Done")
    expect(done, f"no entry with STATE=Done (fields seen: {sorted(custom)})")


def timer_masked(w: World, m: Machine) -> None:
    """bootc's own update timer is masked on a host the agent manages (one driver only)."""
    start_managed(w, m, w.images["v1"])
    state = m.sh("systemctl is-enabled bootc-fetch-apply-updates.timer", check=False).stdout
    expect(state.strip() in ("masked", "masked-runtime"), f"timer is {state.strip()!r}")


SCENARIOS = [
    Scenario("platform", platform, needs_agent=False, doc=platform.__doc__ or ""),
    Scenario(
        "standin-bootloader",
        standin_bootloader,
        needs_agent=False,
        doc=standin_bootloader.__doc__ or "",
    ),
    Scenario("live-ssh-key", live_ssh_key),
    *(
        Scenario(
            f"image-update-{persona}", image_update, doc=image_update.__doc__ or "", persona=persona
        )
        for persona in ("1.12.0", "1.16.10")
    ),
    Scenario("health-rollback", health_rollback),
    Scenario("missing-image", missing_image),
    Scenario("crash-recovery", crash_recovery),
    Scenario("journald-fields", journald_fields),
    Scenario("timer-masked", timer_masked),
    Scenario("config-drift", config_drift, doc=config_drift.__doc__ or ""),
    Scenario("mcd-takeover", mcd_takeover, doc=mcd_takeover.__doc__ or ""),
]


def diagnostics(m: Machine) -> str:
    """For a failed agent scenario: the agent's last status and its last journal lines."""
    lines = [f"status.json: {agent_status(m)}"]
    for unit in (AGENT_UNIT, "image-mode-agent-verify.service"):
        for entry in m.journal(f"_SYSTEMD_UNIT={unit}", "-n", "8"):
            lines.append(f"  {unit}: {str(entry.get('MESSAGE', ''))[:300]}")
    return "\n".join(lines)


HOST_MODES = ("local", "system")  # the brief says `--host local`; the unit file says `system`


def probe_agent() -> tuple[str | None, str | None]:
    """(host mode the agent's CLI accepts, None) when it can run as a host service, else
    (None, why not). The mode goes into /etc/image-mode-agent/agent.env."""
    if os.environ.get("IMA_SYSTEM_AGENT_UNITS"):
        return "local", None
    units = REPO / "systemd"
    for unit in ("image-mode-agent.service", "image-mode-agent-verify.service"):
        if not (units / unit).exists():
            return None, f"needs --host local: systemd/{unit} is not in the repo yet"
    env = {**os.environ, "DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent"}
    mode = None
    for candidate in HOST_MODES:
        probe = subprocess.run(
            [
                "timeout",
                "30",
                str(REPO / ".venv/bin/python"),
                "-m",
                "agent",
                "run",
                "--source",
                "file:/nonexistent",
                "--host",
                candidate,
                "--once",
                "--dry-run",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        if "unknown host" not in probe.stderr and "invalid choice" not in probe.stderr:
            mode = candidate
            break
    if mode is None:
        return None, (
            "needs --host local: `image-mode-agent run --host local|system` is not implemented "
            "yet (the CLI answers 'unknown host')"
        )
    verify = subprocess.run(
        ["timeout", "30", str(REPO / ".venv/bin/python"), "-m", "agent", "verify", "--help"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    if verify.returncode != 0:
        return None, "needs --host local: `image-mode-agent verify` is not implemented yet"
    return mode, None


def agent_missing() -> str | None:
    """Why the agent cannot run as a host service yet, or None when it can."""
    return probe_agent()[1]
