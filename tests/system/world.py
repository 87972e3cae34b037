"""What every scenario shares in one run: the rootfs, the registries, the test images, and the
steps that turn a fresh machine into an agent-managed bootc host."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import secrets_canary as canary
from tests.system import oci
from tests.system.machine import STANDIN_STATE, Machine
from tests.system.registry import Registry, free_port
from tests.system.rootfs import REPO

IMAGE_REPO = "testos"
DESIRED = "/etc/image-mode-agent/desired.yaml"
AGENT_ENV = "/etc/image-mode-agent/agent.env"
AGENT_STATE = "/var/lib/image-mode-agent"
AGENT_UNIT = "image-mode-agent.service"
VERIFY_UNIT = "image-mode-agent-verify.service"
KEY_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA test-a"
KEY_B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB test-b"
MULTI = "multi"  # the tag of the two-platform index; its instances are images["multi-<arch>"]
MULTI_ARCHES = ("amd64", "arm64")
FAILING_CHECK = "#!/bin/sh\necho 'testos v3: payments service did not start'\nexit 1\n"


UNIT_SUFFIXES = (".service", ".target", ".timer", ".path", ".socket")
SELFTEST_LIB = "/usr/local/lib/image-mode-agent-selftest"


def agent_units_dir() -> Path:
    """The repo's systemd/ units, or IMA_SYSTEM_AGENT_UNITS: another set, e.g. the harness
    self-test's fake (tests/system/selftest, whose .py files go to SELFTEST_LIB). Never in CI."""
    override = os.environ.get("IMA_SYSTEM_AGENT_UNITS")
    return Path(override) if override else REPO / "systemd"


@dataclass(frozen=True)
class Image:
    name: str  # registry/repo
    tag: str
    digest: str

    @property
    def pinned(self) -> str:
        return f"{self.name}@{self.digest}"


def image_files(version: str) -> dict[str, tuple[str, int]]:
    return {
        "usr/lib/testos-release": (f"VERSION={version}\n", 0o644),
        "usr/lib/os-release": (f"NAME=testos\nID=testos\nVERSION_ID={version}\n", 0o644),
    }


@dataclass
class World:
    rootfs: Path
    workdir: Path
    keep: bool = False
    registry: Registry | None = None
    auth_registry: Registry | None = None
    images: dict[str, Image] = field(default_factory=dict)
    host_mode: str = "local"  # `--host` value the agent's CLI accepts (scenarios.probe_agent)
    cleanups: list[Callable[[], None]] = field(default_factory=list)  # run by stop(), last first
    # What scenarios build once per run and share (e.g. the signed images), by name.
    built: dict[str, Any] = field(default_factory=dict)

    def start(self) -> World:
        self.registry = Registry(self.workdir / "registry").start()
        # The canary credentials (tests/secrets_canary.py): every desired state's pull secret
        # carries them, so the agent's secrets check sees real, working credentials.
        self.auth_registry = Registry(
            self.workdir / "auth-registry",
            user=canary.REGISTRY_USER,
            password=canary.REGISTRY_PASSWORD,
        ).start()
        layout = self.workdir / "oci"
        name = f"{self.registry.host}/{IMAGE_REPO}"
        for version in ("v1", "v2", "v3"):
            files = image_files(version)
            if version == "v3":  # ships an admin health check that fails: must be rolled back
                files["etc/image-mode-agent/check/required.d/50-testos-health"] = (
                    FAILING_CHECK,
                    0o755,
                )
            oci.write_image(layout, version, version, files)
            digest = oci.push(layout, version, f"{name}:{version}")
            self.images[version] = Image(name, version, digest)
        # A two-platform OCI index (linux/amd64 + linux/arm64), pushed with `skopeo copy --all`:
        # a tag that names a manifest list resolves to this host's instance (ChooseInstance).
        index, instances = oci.write_index(
            layout, MULTI, MULTI, {arch: image_files(f"{MULTI}-{arch}") for arch in MULTI_ARCHES}
        )
        served = oci.push(layout, MULTI, f"{name}:{MULTI}", all_images=True)
        assert served == index, f"the registry serves {served} for the index {index}"
        self.images[MULTI] = Image(name, MULTI, index)
        for arch, digest in instances.items():
            self.images[f"{MULTI}-{arch}"] = Image(name, MULTI, digest)
        auth = self.auth_registry.authfile(self.workdir / "auth.json")
        auth_name = f"{self.auth_registry.host}/{IMAGE_REPO}"
        digest = oci.push(layout, "v2", f"{auth_name}:v2", authfile=auth)
        self.images["auth-v2"] = Image(auth_name, "v2", digest)
        # Never pushed: the registry answers "manifest unknown" for it.
        absent = "sha256:" + hashlib.sha256(b"never pushed").hexdigest()
        self.images["missing"] = Image(name, "missing", absent)
        return self

    def stop(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()
        for reg in (self.registry, self.auth_registry):
            if reg:
                reg.stop()

    # ---- machines -----------------------------------------------------------------------------

    def machine(self, name: str, lower: Path | None = None, persona: str | None = None) -> Machine:
        """A machine over the cached rootfs, or over `lower`: a built image's root that ships
        the agent itself (its /usr/bin/image-mode-agent is then kept). `persona`: the bootc
        release its stand-in speaks (the state dir's `persona` file); None: the newest."""
        # The hostname doubles as nspawn's machine name (its /run/systemd/nspawn/propagate/ dir):
        # unique per run, so two runs on one host never collide.
        # (nspawn accepts only hostname characters: no "_", which mkdtemp names may hold.)
        unique = f"{name}-{hashlib.sha256(str(self.workdir).encode()).hexdigest()[:6]}"
        machine = Machine(lower or self.rootfs, self.workdir / "machines" / name, unique, persona)
        machine.create(agent_link=lower is None)
        assert self.registry and self.auth_registry
        # Plain HTTP on loopback, as containers-image's registries.conf allows (bootc reads it).
        conf = "".join(
            f'[[registry]]\nlocation = "{reg.host}"\ninsecure = true\n\n'
            for reg in (self.registry, self.auth_registry)
        )
        machine.write("/etc/containers/registries.conf.d/50-system-tier.conf", conf)
        return machine

    def boot_into(self, machine: Machine, image: Image) -> None:
        """Make `image` the booted deployment of a not-yet-started machine (as an install
        would): the stand-in's state plus the image in its local store."""
        store = machine.path(f"{STANDIN_STATE}/store")
        store.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["timeout", "60", "skopeo", "copy", "--quiet", "--src-tls-verify=false",
             f"docker://{image.pinned}", f"oci:{store}:{image.digest[7:]}"],
            check=True,
        )  # fmt: skip
        slot = {
            "ref": image.pinned,
            "name": image.name,
            "digest": image.digest,
            "version": image.tag,
            "timestamp": "2026-01-01T00:00:00Z",
            "architecture": "amd64",
        }
        state = {"booted": slot, "staged": None, "rollback": None, "rollbackQueued": False}
        machine.write(f"{STANDIN_STATE}/state.json", json.dumps(state, indent=2))

    def install_agent(self, machine: Machine, image: Image, key: str = KEY_A) -> None:
        """The repo's units, enabled with the host's `systemctl --root` (no bus needed), and a
        desired-state document matching what the machine boots."""
        for unit in sorted(agent_units_dir().glob("*")):
            if unit.suffix in UNIT_SUFFIXES and unit.is_symlink():  # a mask: -> /dev/null
                machine.symlink(f"/etc/systemd/system/{unit.name}", os.readlink(unit))
            elif unit.suffix in UNIT_SUFFIXES:
                machine.write(f"/etc/systemd/system/{unit.name}", unit.read_text())
            elif unit.suffix == ".py" and agent_units_dir() != REPO / "systemd":
                machine.write(f"{SELFTEST_LIB}/{unit.name}", unit.read_text())
        for unit in (AGENT_UNIT, VERIFY_UNIT):
            subprocess.run(
                ["timeout", "30", "systemctl", f"--root={machine.root}", "enable", unit],
                check=True, capture_output=True,
            )  # fmt: skip
        self.configure_agent(machine, image, key)

    def configure_agent(self, machine: Machine, image: Image, key: str = KEY_A) -> None:
        """File mode: the unit takes its arguments from agent.env (IMAGE_MODE_AGENT_ARGS), the
        desired state from desired.yaml. The endpoints get a port of their own: machines share
        the host's network, and two runs on one host must not scrape each other's agent."""
        args = f"--source file:{DESIRED} --host {self.host_mode} --listen 127.0.0.1:{free_port()}"
        machine.write(AGENT_ENV, f'IMAGE_MODE_AGENT_ARGS="{args}"\n')
        self.set_desired(machine, image, key)

    def set_desired(
        self,
        machine: Machine,
        image: Image,
        key: str = KEY_A,
        name: str = "",
        *,
        files: Sequence[dict[str, Any]] = (),
    ) -> None:
        """desired.yaml: `image`, core's SSH `key`, and `files` (Ignition `storage.files`
        entries); always with the canary secrets (tests/secrets_canary.py): the pull secret
        for the auth registry (real credentials: pulls from it work) and core's password
        hash, which tests/system/secrets.py looks for in everything the agent emitted."""
        assert self.auth_registry is not None
        doc = {
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfig",
            "metadata": {"name": name or f"rendered-worker-{image.tag}-{key[-6:]}"},
            "spec": {
                "osImageURL": image.pinned,
                "config": {
                    "ignition": {"version": "3.4.0"},
                    "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [key]}]},
                    "storage": {"files": [dict(f) for f in files]},
                },
            },
        }
        doc = canary.with_canary_secrets(doc, self.auth_registry.host)
        machine.write(DESIRED, json.dumps(doc, indent=1), mode=0o600)  # it holds secrets

    def destroy(self, machine: Machine) -> None:
        machine.destroy(keep=self.keep)


def cleanup(workdir: Path, keep: bool) -> None:
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
