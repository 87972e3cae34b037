"""Standalone mode on a real host: the agent follows a tag (`run --source image:REG/testos:stable`)
with `bootc upgrade --check --tag stable` (the stand-in answers as bootc >= 1.15 does), pre-stages
a new digest locked, asks the strategy from its TOML drop-ins, reboots when allowed, verifies the
boot, rolls a failing one back and never stages that digest again. The tag is moved on the real
registry with `skopeo copy`."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta

from agent.model.bootc_caps import REPO, listed
from standins.bootc_releases import features_of
from tests.system.machine import Machine, MachineError
from tests.system.registry import free_port
from tests.system.scenarios import (
    AGENT_TIMEOUT,
    Scenario,
    agent_status,
    bootc_status,
    booted_digest,
    expect,
    expect_bootc_announced,
    fetches,
    no_more_boots,
    wait_state,
)
from tests.system.world import AGENT_ENV, AGENT_UNIT, DESIRED, Image, World

TAG = "stable"
SETTINGS_DIR = "/etc/image-mode-agent/config.d"
SETTINGS = f"{SETTINGS_DIR}/50-system-tier.toml"
CHECK_INTERVAL = 2  # seconds between the agent's checks of the tag
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def move_tag(w: World, image: Image, tag: str = TAG) -> None:
    """Point `tag` at `image` on the registry (as a release pipeline would; `--all`: an index
    stays an index), and prove the registry serves the same manifest under it."""
    assert w.registry is not None
    dest = f"docker://{image.name}:{tag}"
    subprocess.run(
        ["timeout", "60", "skopeo", "copy", "--quiet", "--all", "--src-tls-verify=false",
         "--dest-tls-verify=false", f"docker://{image.pinned}", dest],
        check=True, capture_output=True,
    )  # fmt: skip
    digest = subprocess.run(
        ["timeout", "30", "skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
         dest],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    expect(digest == image.digest, f"{tag} serves {digest}, pushed {image.tag} is {image.digest}")


def follow_args(w: World, image: Image) -> str:
    """Standalone mode: follow the tag, settings from the drop-in directory only, and core's
    SSH key, the pull secret and the password hash (the canaries) from desired.yaml as the live
    config (`--config`: its osImageURL is ignored, the tag decides the image)."""
    return (
        f"--source image:{image.name}:{TAG} --host {w.host_mode} "
        f"--check-interval {CHECK_INTERVAL} --settings-dir {SETTINGS_DIR} "
        f"--config file:{DESIRED} --listen 127.0.0.1:{free_port()}"
    )


def window(start: datetime, length: int) -> str:
    """One `[[updates.periodic.window]]` opening at `start` (UTC; its own weekday, so a start
    before midnight keeps the day it falls on)."""
    return (
        "[[updates.periodic.window]]\n"
        f'days = ["{DAY_NAMES[start.weekday()]}"]\n'
        f'start_time = "{start:%H:%M}"\n'
        f"length_minutes = {length}\n"
    )


def periodic(*windows: str) -> str:
    return '[updates]\nstrategy = "periodic"\n\n[updates.periodic]\ntime_zone = "UTC"\n\n' + (
        "\n".join(windows)
    )


def start_following(w: World, m: Machine, settings: str) -> None:
    """A machine booted into v1 with the agent installed, switched to follow `stable` (pointing
    at v1), settled Done with v1 as the tag's latest digest."""
    v1 = w.images["v1"]
    move_tag(w, v1)
    w.boot_into(m, v1)
    w.install_agent(m, v1)  # the units, and desired.yaml (the live config with the canaries)
    m.write(AGENT_ENV, f'IMAGE_MODE_AGENT_ARGS="{follow_args(w, v1)}"\n')
    m.write(SETTINGS, settings)
    m.start()
    m.wait_booted(1)
    settle_followed(m, v1)


def settle_followed(m: Machine, image: Image, timeout: float = AGENT_TIMEOUT) -> dict:
    """Done, booted into `image`, and the tag's latest digest is `image`'s."""

    def ok() -> dict | None:
        s = agent_status(m)
        follow = s.get("follow") or {}
        if s.get("state") == "Done" and follow.get("latestDigest") == image.digest:
            return s
        return None

    try:
        status = m.wait_for(ok, timeout, f"Done following {TAG} on {image.tag}")
    except MachineError as exc:
        raise MachineError(f"{exc}; last agent status: {agent_status(m)}") from None
    expect(booted_digest(m) == image.digest, f"{image.tag} is not the booted deployment")
    return status  # type: ignore[return-value]


def restart_agent(m: Machine) -> None:
    m.sh(f"systemctl restart --no-block {AGENT_UNIT}")


def expect_boot(m: Machine, boot: int, event: str, image: Image,
                timeout: float = AGENT_TIMEOUT) -> None:  # fmt: skip
    """Wait for boot number `boot`; it must be `event` (booted-staged, rolled-back) into
    `image`."""
    m.wait_booted(boot, timeout)
    record = m.boot_records()[boot - 1]
    expect(record["event"] == event and record["booted"] == image.pinned,
           f"boot {boot} is not {event} into {image.tag}: {record}")  # fmt: skip


def follow_tag(w: World, m: Machine) -> None:
    """Immediate strategy: the tag moves to v2 → staged, one reboot, Done on v2 with the tag's
    digest in `follow.latestDigest`; then to v3 (a failing required check) → one reboot into
    v3, rolled back to v2, Degraded naming v3 as failed on this host before, and v3 is never
    staged again while the tag stays on it (no boot for several check intervals)."""
    v2, v3 = w.images["v2"], w.images["v3"]
    start_following(w, m, '[updates]\nstrategy = "immediate"\n')

    move_tag(w, v2)
    expect_boot(m, 2, "booted-staged", v2)
    status = settle_followed(m, v2)
    expect(status["follow"].get("image") == f"{v2.name}:{TAG}", f"follow: {status['follow']}")
    no_more_boots(m, 2)

    move_tag(w, v3)
    expect_boot(m, 3, "booted-staged", v3)
    expect_boot(m, 4, "rolled-back", v2, AGENT_TIMEOUT * 2)
    status = wait_state(m, "Degraded", "Degraded: v3 failed here before",
                        reason="which failed on this host before")  # fmt: skip
    expect(v3.digest in status["reason"], f"the reason does not name v3: {status['reason']}")
    expect(booted_digest(m) == v2.digest, "v2 is not booted after the rollback")
    expect(not m.path("/etc/image-mode-agent/check/required.d/50-testos-health").exists(),
           "v3's failing check survived the rollback")  # fmt: skip
    no_more_boots(m, 4, seconds=5 * CHECK_INTERVAL)
    status = agent_status(m)
    expect(status.get("state") == "Degraded" and "failed on this host before" in status["reason"],
           f"no longer Degraded for v3 after several checks: {status}")  # fmt: skip
    expect((status.get("follow") or {}).get("latestDigest") == v3.digest,
           f"follow.latestDigest is not v3's: {status.get('follow')}")  # fmt: skip
    expect(bootc_status(m)["status"]["staged"] is None, "v3 was staged again")


def follow_window(w: World, m: Machine) -> None:
    """Periodic strategy, its only window three days ahead: the tag moves to v2 → pre-staged
    the best way the host's bootc can: on 1.16.10 staged locked (download-only); on 1.12.0
    pre-pulled into /sysroot's repository with nothing staged (the agent resolved the tag with
    skopeo: 1.12 has no `upgrade --tag`); Working with "reboot held" and the next window's start,
    no reboot; the drop-in rewritten with a window open now and the agent restarted (settings
    are read at start) → one reboot into v2, Done, and nothing fetched at the turn (on 1.12.0:
    the turn's `switch` took the stored image and contacted no registry, and the agent says
    so)."""
    v2 = w.images["v2"]
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    later = now + timedelta(days=3)
    start_following(w, m, periodic(window(later, 60)))
    expect_bootc_announced(m)
    prepull = m.persona is not None and "switch-download-only" not in features_of(m.persona)

    move_tag(w, v2)
    status = wait_state(m, "Working", "the reboot held by the window", reason="reboot held")
    decision = (status.get("follow") or {}).get("decision") or {}
    expect(decision.get("allowed") is False, f"decision: {decision}")
    next_window = decision.get("nextWindow")
    expect(next_window, f"follow.decision.nextWindow not set: {decision}")
    opens = datetime.fromisoformat(str(next_window).replace("Z", "+00:00"))
    expect(abs((opens - later).total_seconds()) < 60,
           f"nextWindow {next_window} is not the window at {later.isoformat()}")  # fmt: skip
    staged = bootc_status(m)["status"]["staged"]
    if prepull:
        expect(staged is None, f"bootc {m.persona} cannot stage locked, yet staged: {staged}")
        expect(f"pre-pulled {v2.pinned}" in status["reason"], f"reason: {status['reason']}")
        stored = m.sh(f"bootc internals ostree-container image list --repo {REPO}").stdout
        expect(listed(stored, v2.pinned), f"v2 is not in the repository: {stored}")
        pulls = [f for f in fetches(m) if f["verb"] == "pull" and f["ref"] == v2.pinned]
        expect(pulls and pulls[0]["bytes"] > 0, f"no pre-pull of v2 fetched: {fetches(m)}")
    else:
        expect(staged and staged["image"]["imageDigest"] == v2.digest, f"v2 not staged: {staged}")
        expect(staged["downloadOnly"] is True, f"v2 staged unlocked: {staged}")
    no_more_boots(m, 1, seconds=5 * CHECK_INTERVAL)
    status = agent_status(m)
    expect(status.get("state") == "Working" and "reboot held" in str(status.get("reason")),
           f"the hold did not last: {status}")  # fmt: skip

    before = len(fetches(m))
    opened = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    m.write(SETTINGS, periodic(window(opened, 120)))
    restart_agent(m)
    expect_boot(m, 2, "booted-staged", v2)
    settle_followed(m, v2)
    turn = fetches(m)[before:]
    expect(all(not f["registry"] and f["bytes"] == 0 for f in turn),
           f"the turn fetched from the registry: {turn}")  # fmt: skip
    if prepull:
        expect([f["verb"] for f in turn] == ["switch"], f"the turn's fetches: {turn}")
        said = [e.get("MESSAGE", "") for e in m.journal(f"_SYSTEMD_UNIT={AGENT_UNIT}")]
        expect(any("nothing fetched" in str(text) for text in said),
               "the agent did not report that its turn fetched nothing")  # fmt: skip
    no_more_boots(m, 2)


FOLLOW_SCENARIOS = [
    Scenario("follow-tag", follow_tag, doc=follow_tag.__doc__ or ""),
    *(
        Scenario(
            f"follow-window-{persona}",
            follow_window,
            doc=follow_window.__doc__ or "",
            persona=persona,
        )
        for persona in ("1.12.0", "1.16.10")
    ),
]
