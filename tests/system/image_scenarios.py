"""Scenarios for the repository's container images (containerfiles/): the DaemonSet pod's image
run with podman, and the bootc host-image layer booted as a machine."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tests.system import images
from tests.system.follow_scenarios import FOLLOW_SCENARIOS
from tests.system.layer_follow_scenarios import LAYER_FOLLOW_SCENARIOS
from tests.system.machine import Machine
from tests.system.persona_scenarios import PERSONA_SCENARIOS
from tests.system.podman import podman, require_tools
from tests.system.rootfs import REPO
from tests.system.scenarios import SCENARIOS, Scenario, expect, settle_done
from tests.system.trust_scenarios import TRUST_SCENARIOS
from tests.system.world import AGENT_UNIT, VERIFY_UNIT, World

HERE = Path(__file__).resolve().parent
FIXTURES = {  # mounted read-only into the pod's container
    "/fixtures/mco": REPO / "tests/fixtures/mco",
    "/fixtures/system": HERE / "fixtures",
}
CURRENT = "/fixtures/system/worker-no-ssh.yaml"
# The MCO's bootstrap MachineConfig that adds core's SSH key.
DESIRED_SSH = (
    "/fixtures/mco/controller_bootstrap_testdata_bootstrap_99_openshift-machineconfig_worker.yaml"
)
REQUIRED_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.source",
    "org.opencontainers.image.version",
    "org.opencontainers.image.licenses",
    "io.k8s.display-name",
    "io.k8s.description",
)
BOOTC_TIMER = "bootc-fetch-apply-updates.timer"


def run_tag(w: World, name: str) -> str:
    """Per-run image names: two concurrent runs share the podman storage, not their images."""
    return f"localhost/ima-system-{name}:{hashlib.sha256(str(w.workdir).encode()).hexdigest()[:8]}"


def agent_version(ctx: Path) -> str:
    """The version in the freshly built wheel's name (image_mode_agent-<version>-py3-….whl)."""
    wheel = next((ctx / "wheels").glob("image_mode_agent-*.whl"))
    return wheel.name.split("-")[1]


def build_image(w: World, containerfile: str, name: str, base: str) -> tuple[str, str]:
    """(tag, version) of `containerfile` built on `base` from this run's wheel context."""
    ctx = images.build_context(w.workdir)
    version = agent_version(ctx)
    tag = run_tag(w, name)
    w.cleanups.append(lambda: images.remove_image(tag))
    images.build(containerfile, tag, ctx, base, "--build-arg", f"VERSION={version}")
    return tag, version


def in_pod(tag: str, *args: str) -> str:
    """Run the image's ENTRYPOINT as its default user, fixtures mounted (no network needed)."""
    mounts = [f"-v={src}:{dest}:ro" for dest, src in FIXTURES.items()]
    return podman("run", "--rm", "--network=none", *mounts, tag, *args, timeout=60).stdout


def daemonset_image(w: World, m: Machine) -> None:
    """containerfiles/Containerfile on a local Debian python base: the wheel installs offline,
    `demo` (the cluster timeline on the packaged loopback API server), `--version` and `plan`
    (SSH-key change → live) run in it as a non-root default user, and
    the OCI/k8s labels are set, the version from the wheel."""
    require_tools("podman", "runc", "mmdebstrap")
    tag, version = build_image(w, "Containerfile", "daemonset", images.python_base())

    # The wheel alone runs the cluster demo: its loopback API server ships in the package.
    demo = in_pod(tag, "demo")
    expect("loopback API server at http://127.0.0.1:" in demo and "demo passed" in demo,
           f"demo in the image: {demo[-600:]!r}")  # fmt: skip
    out = in_pod(tag, "--version").strip()
    expect(out == f"image-mode-agent {version}", f"--version printed {out!r}, wheel is {version}")
    plan = json.loads(in_pod(tag, "plan", "--current", CURRENT, "--desired", DESIRED_SSH,
                             "--output", "json"))  # fmt: skip
    expect(plan["verdict"] == "live" and not plan["reboot"], f"plan: {plan}")
    paths = [step["path"] for step in plan["live"]]
    expect(paths == ["/home/core/.ssh/authorized_keys.d/ignition"], f"live steps: {plan['live']}")

    inspect = json.loads(podman("image", "inspect", tag, timeout=30).stdout)[0]
    labels = inspect.get("Labels") or {}
    missing = [k for k in REQUIRED_LABELS if not labels.get(k)]
    expect(not missing, f"labels missing: {missing} (have {sorted(labels)})")
    expect(labels["org.opencontainers.image.version"] == version, f"version label {labels}")
    expect(labels["org.opencontainers.image.licenses"] == "Apache-2.0", "licenses label")
    user = inspect["Config"].get("User", "")
    # The default user is not root: `--version` and `plan` above ran as it. (The DaemonSet
    # runs the pod as root itself.)
    expect(user not in ("", "0", "root", "0:0"), f"default USER is {user!r}: root")
    entry = inspect["Config"].get("Entrypoint") or []
    expect(entry and entry[0].endswith("image-mode-agent"), f"ENTRYPOINT {entry}")
    # Small: no pip in the venv, no wheels left behind (the build stage keeps both). Read from
    # the mounted image: every `podman run` on vfs copies the whole image (~8 s).
    root = images.mount_image(tag)
    try:
        for left in ("usr/lib/image-mode-agent/bin/pip", "tmp/wheels"):
            expect(not (root / left).exists(), f"the image still has /{left}")
        # An absolute link into the image: resolve it there, not on the host.
        link = os.readlink(root / "usr/bin/image-mode-agent")
        expect((root / link.lstrip("/")).is_file(), f"/usr/bin/image-mode-agent -> {link}: absent")
    finally:
        images.unmount_image(tag)


def bootc_image_root(w: World) -> Path:
    """containerfiles/Containerfile.bootc on the tier's own rootfs (imported into podman once
    per rootfs key), mounted: the machine boots its root filesystem as the lower layer."""
    require_tools("podman", "runc")
    tag, _ = build_image(w, "Containerfile.bootc", "bootc", images.rootfs_base(w.rootfs))
    root = images.mount_image(tag)
    w.cleanups.append(lambda: images.unmount_image(tag))
    return root


def bootc_layer(w: World, m: Machine) -> None:
    """The bootc layer as a booted host: the image ships the venv, /usr/bin/image-mode-agent,
    the units enabled by the preset and bootc's timer masked; booted, the agent runs from the
    image's venv, the verifier succeeds before boot-complete.target, the timer stays masked."""
    image = m.lower
    mask = image / "etc/systemd/system" / BOOTC_TIMER
    expect(mask.is_symlink() and os.readlink(mask) == "/dev/null", f"image: {BOOTC_TIMER} unmasked")
    for unit in (AGENT_UNIT, VERIFY_UNIT):
        expect((image / "usr/lib/systemd/system" / unit).is_file(), f"image: no {unit} in /usr")
    wants = image / "etc/systemd/system/multi-user.target.wants" / AGENT_UNIT
    expect(wants.is_symlink(), f"image: {AGENT_UNIT} not enabled")
    expect((image / "etc/systemd/system/boot-complete.target.requires" / VERIFY_UNIT).is_symlink(),
           f"image: {VERIFY_UNIT} not required by boot-complete.target")  # fmt: skip
    link = os.readlink(image / "usr/bin/image-mode-agent")
    expect("lib/image-mode-agent/bin/" in link, f"/usr/bin/image-mode-agent → {link}")
    guide = image / "usr/share/doc/image-mode-agent" / Path("docs/operate.md").name
    expect(guide.is_file(), "image: no /usr/share/doc/image-mode-agent/operate.md")

    v1 = w.images["v1"]
    w.boot_into(m, v1)
    w.configure_agent(m, v1)
    m.start()
    m.wait_booted(1)
    settle_done(m, v1)
    m.wait_system_up()
    show = "systemctl show -p ActiveState,Result,ActiveEnterTimestampMonotonic"
    verify = dict(kv.split("=", 1) for kv in m.sh(f"{show} {VERIFY_UNIT}").stdout.split())
    expect(verify["ActiveState"] == "active" and verify["Result"] == "success", f"{verify}")
    target = dict(kv.split("=", 1) for kv in m.sh(f"{show} boot-complete.target").stdout.split())
    expect(target["ActiveState"] == "active", f"boot-complete.target: {target}")
    expect(int(verify["ActiveEnterTimestampMonotonic"])
           <= int(target["ActiveEnterTimestampMonotonic"]),
           f"the verifier finished after boot-complete.target: {verify} {target}")  # fmt: skip
    m.sh(f"systemctl is-active {AGENT_UNIT}")
    docs = m.sh(f"systemctl show -p Documentation --value {AGENT_UNIT}").stdout
    expect("file:/usr/share/doc/image-mode-agent/operate.md" in docs, f"Documentation={docs}")
    pid = m.sh(f"systemctl show -p MainPID --value {AGENT_UNIT}").stdout.strip()
    cmdline = m.sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    expect("/usr/lib/image-mode-agent/bin/python" in cmdline, f"agent runs as {cmdline!r}")
    state = m.sh(f"systemctl is-enabled {BOOTC_TIMER}", check=False).stdout.strip()
    expect(state in ("masked", "masked-runtime"), f"{BOOTC_TIMER} is {state!r}")


IMAGE_SCENARIOS = [
    Scenario("daemonset-image", daemonset_image, False, daemonset_image.__doc__ or ""),
    Scenario("bootc-layer", bootc_layer, doc=bootc_layer.__doc__ or "", lower=bootc_image_root),
]
ALL_SCENARIOS = [
    *SCENARIOS,
    *PERSONA_SCENARIOS,
    *TRUST_SCENARIOS,
    *FOLLOW_SCENARIOS,
    *IMAGE_SCENARIOS,
    *LAYER_FOLLOW_SCENARIOS,
]
