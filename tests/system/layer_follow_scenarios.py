"""The bootc layer built to follow a tag out of the box (`Containerfile.bootc --build-arg
FOLLOW=REG/testos:stable`): the image's own settings drop-in names the tag and its unit drop-in
starts the agent with `--source image: --host local`, so the booted host follows the tag with no
agent.env. The tag is moved on the real registry with `skopeo copy`, as in follow_scenarios.

The machine's root is the podman-built image (as in `bootc-layer`), but the stand-in bootc's
booted deployment is the tier's small `testos:v1`: `stable` points at v1 first, so the agent
starts Done. (Pushing the 500 MB built image as the booted deployment would make the stand-in
remove its /usr files that v2 lacks when it boots v2, the agent's venv among them.)"""

from __future__ import annotations

from pathlib import Path

from tests.system import images
from tests.system.follow_scenarios import (
    CHECK_INTERVAL,
    TAG,
    expect_boot,
    move_tag,
    restart_agent,
    settle_followed,
)
from tests.system.machine import Machine
from tests.system.podman import require_tools
from tests.system.registry import free_port
from tests.system.scenarios import Scenario, expect, no_more_boots
from tests.system.world import AGENT_ENV, AGENT_UNIT, DESIRED, World

STRATEGY = "immediate"  # the agent's default, passed anyway so the build argument is exercised
IMAGE_SETTINGS = "usr/lib/image-mode-agent/config.d/50-follow.toml"
UNIT_DROPIN = f"usr/lib/systemd/system/{AGENT_UNIT}.d/10-follow.conf"
DROPIN_ARGS = "--source image: --host local"
# The machine's own drop-in: no `image` (that stays the image's), only what the harness needs:
# the live config carrying the canaries (the secrets check demands they arrive) and a short
# check interval (the default is 300 s). A later file name merges over 50-follow.toml.
LOCAL_SETTINGS = "/etc/image-mode-agent/config.d/60-system-tier.toml"


def followed_tag(w: World) -> str:
    """The tag as the machine reaches the registry (machines share the host's loopback)."""
    return f"{w.images['v1'].name}:{TAG}"


def follow_image_root(w: World) -> Path:
    """containerfiles/Containerfile.bootc with FOLLOW and STRATEGY on the tier's rootfs, mounted
    as the machine's lower layer (image_scenarios.build_image, plus the build arguments)."""
    # Imported here: image_scenarios imports this module for ALL_SCENARIOS.
    from tests.system.image_scenarios import agent_version, run_tag

    require_tools("podman", "runc")
    ctx = images.build_context(w.workdir)
    tag = run_tag(w, "bootc-follow")
    w.cleanups.append(lambda: images.remove_image(tag))
    images.build("Containerfile.bootc", tag, ctx, images.rootfs_base(w.rootfs),
                 "--build-arg", f"VERSION={agent_version(ctx)}",
                 "--build-arg", f"FOLLOW={followed_tag(w)}",
                 "--build-arg", f"STRATEGY={STRATEGY}")  # fmt: skip
    root = images.mount_image(tag)
    w.cleanups.append(lambda: images.unmount_image(tag))
    return root


def agent_argv(m: Machine) -> list[str]:
    """The agent unit's main process's argv; [] while it has none (e.g. mid-restart)."""
    pid = m.sh(f"systemctl show -p MainPID --value {AGENT_UNIT}").stdout.strip()
    if pid in ("", "0"):
        return []
    return m.sh(f"cat /proc/{pid}/cmdline", check=False).stdout.split("\0")[:-1]


def bootc_layer_follow(w: World, m: Machine) -> None:
    """`Containerfile.bootc --build-arg FOLLOW=REG/testos:stable --build-arg STRATEGY=immediate`:
    the image ships the `[follow]` settings drop-in in /usr/lib and the unit drop-in; booted
    with no agent.env, the agent runs `--source image: --host local` and follows the tag from
    the image's drop-in: Done on v1 (`stable` there first), then `stable` → v2: one reboot into
    v2, Done, `follow.latestDigest` = v2; an agent.env written afterwards overrides the unit
    drop-in's arguments (EnvironmentFile= over Environment=)."""
    v1, v2 = w.images["v1"], w.images["v2"]
    tag = followed_tag(w)
    image = m.lower
    settings = (image / IMAGE_SETTINGS).read_text() if (image / IMAGE_SETTINGS).is_file() else ""
    expect(f'[follow]\nimage = "{tag}"\n' in settings, f"/{IMAGE_SETTINGS}: {settings!r}")
    expect(f'[updates]\nstrategy = "{STRATEGY}"\n' in settings, f"/{IMAGE_SETTINGS}: {settings!r}")
    dropin = (image / UNIT_DROPIN).read_text() if (image / UNIT_DROPIN).is_file() else ""
    expect(f'[Service]\nEnvironment="IMAGE_MODE_AGENT_ARGS={DROPIN_ARGS}"\n' in dropin,
           f"/{UNIT_DROPIN}: {dropin!r}")  # fmt: skip
    expect(not (image / AGENT_ENV.lstrip("/")).exists(), f"the image ships {AGENT_ENV}")

    move_tag(w, v1)  # `stable` is the booted image: nothing to do at first
    w.boot_into(m, v1)
    w.set_desired(m, v1)  # the live config (canaries); its osImageURL is ignored when following
    m.write(LOCAL_SETTINGS, f'[follow]\nlive_config = "{DESIRED}"\n'
                            f"interval_secs = {CHECK_INTERVAL}\n")  # fmt: skip
    m.start()
    m.wait_booted(1)
    status = settle_followed(m, v1)
    expect(status["follow"].get("image") == tag, f"follow: {status['follow']}")
    expect(m.read(AGENT_ENV) is None, f"{AGENT_ENV} exists on the booted host")
    argv = agent_argv(m)
    expect(argv and argv[-5:] == ["run", *DROPIN_ARGS.split()], f"the agent runs as {argv}")
    expect("/usr/lib/image-mode-agent/bin/python" in argv[0], f"the agent runs as {argv}")
    dropins = m.sh(f"systemctl show -p DropInPaths --value {AGENT_UNIT}").stdout
    expect(f"/{UNIT_DROPIN}" in dropins.split(), f"{AGENT_UNIT} drop-ins: {dropins!r}")

    move_tag(w, v2)
    expect_boot(m, 2, "booted-staged", v2)
    status = settle_followed(m, v2)
    expect(status["follow"].get("image") == tag, f"follow: {status['follow']}")
    no_more_boots(m, 2)

    # agent.env overrides the unit drop-in: systemd.exec(5), EnvironmentFile= settings override
    # Environment= ones, wherever either is written. Same mode, its own --listen port (which
    # the secrets check then scrapes instead of the default 8797).
    listen = f"127.0.0.1:{free_port()}"
    m.write(AGENT_ENV, f'IMAGE_MODE_AGENT_ARGS="{DROPIN_ARGS} --listen {listen}"\n')
    restart_agent(m)
    m.wait_for(lambda: agent_argv(m)[-2:] == ["--listen", listen], 30,
               f"the agent restarted with agent.env's --listen {listen}")  # fmt: skip
    settle_followed(m, v2)
    no_more_boots(m, 2)


LAYER_FOLLOW_SCENARIOS = [
    Scenario(
        "bootc-layer-follow",
        bootc_layer_follow,
        doc=bootc_layer_follow.__doc__ or "",
        lower=follow_image_root,
    ),
]
