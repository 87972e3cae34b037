"""A host in a directory: every port backed by files, for the demo, dry runs and tests.

`SimulatedHost` is the directory (state.py lays it out) with its setup and injected faults,
and what happens between two runs of the agent: a reboot. Its ports are the simulated bootc
(simulated_bootc.py, which speaks one bootc release) and system (simulated_system.py).

A reboot only marks the host; `boot()` (run when the next agent process starts, as a machine
boots before its services) makes an unlocked staged deployment the booted one, discards a
locked one, or falls back to the old one when the image or the host was marked to fail that
boot. A soft reboot enters the staged deployment only where bootc prepared /run/nextroot for
it (`--soft-reboot auto` on `upgrade --from-downloaded`, from 1.12, as the agent asks at its
turn; or the hazard of `upgrade --download-only --soft-reboot`, `prepare_soft_reboot`); with
nothing prepared it restarts userspace into the booted deployment again, as systemd does.
Every stage, a rollback that drops the staged deployment, `ostree admin prepare-soft-reboot
--reset` and any full reboot (/run is a tmpfs) clear what was prepared."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import HostError
from agent.host.durable import write_json
from agent.host.files import RootedFiles
from agent.host.health import CheckRunner
from agent.host.ports import Host
from agent.model.imageref import parse_image_ref
from standins.bootc_releases import DEFAULT_PERSONA
from standins.host.simulated_bootc import SimulatedBootc, status_document
from standins.host.simulated_system import SimulatedSystem
from standins.host.state import LAYERS, HostState, release_features, utc_now

# Where tests import them from: the host, its two ports, and how many layers an image has.
__all__ = ["LAYERS", "SimulatedBootc", "SimulatedHost", "SimulatedSystem"]

_PASSWD = "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/home/core:/bin/bash\n"
_GROUP = "root:x:0:\nwheel:x:10:core\ncore:x:1000:\n"
_SHADOW = "root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\n"


class SimulatedHost(HostState):
    """A simulated host: set up, given faults, rebooted, and handed to the agent as a `Host`."""

    # -- setup ---------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        base: Path,
        image: str,
        files: dict[str, str] | None = None,
        *,
        bootc_version: str = DEFAULT_PERSONA,
    ) -> SimulatedHost:
        """A new host booted into `image` (added to its registry), its bootc that release."""
        base = Path(base)
        parse_image_ref(image)  # a bad reference fails before anything is written
        release_features(bootc_version)
        if (base / "host.json").exists():
            raise HostError(f"{base} already holds a simulated host", kind="input")
        sim = cls(base)
        # /usr/etc: where ostree keeps the image's /etc defaults (the 3-way merge's base).
        for folder, perm in (("etc", 0o755), ("usr/etc", 0o755), ("run", 0o755),
                             ("var/home/core", 0o700), ("var/lib", 0o755),
                             ("var/roothome", 0o700)):  # fmt: skip
            (sim.root / folder).mkdir(parents=True, exist_ok=True)
            (sim.root / folder).chmod(perm)
        # ostree's layout, as on every bootc host: the homes live in /var, shared by all
        # deployments, behind links in the read-only root (what the real ostree VM tier boots).
        (sim.root / "home").symlink_to("var/home")
        (sim.root / "root").symlink_to("var/roothome")
        (sim.root / "etc/passwd").write_text(_PASSWD)
        (sim.root / "etc/group").write_text(_GROUP)
        (sim.root / "etc/shadow").write_text(_SHADOW)
        (sim.root / "etc/shadow").chmod(0o000)
        (sim.root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")  # a FleetLock id
        pinned = sim.add_image(image, files or {})
        digest = parse_image_ref(pinned).digest
        write_json(
            sim._state_path,
            {
                "boot_id": str(uuid.uuid4()),
                "boots": 1,
                "reboot_pending": None,
                "booted": {"ref": image, "digest": digest},
                "staged": None,
                "rollback": None,
                "rollback_queued": False,
                "fail_next_boot": False,
                "bootc_version": bootc_version,
            },
        )
        sim._lay_image_files(None, digest)
        sim.log_action("boot", f"booted {pinned}")
        return sim

    def add_image(
        self,
        ref: str,
        files: dict[str, str],
        *,
        boot_fails: bool = False,
        pull_seconds: float = 0.0,
        soft_reboot_capable: bool = False,
        signed_by: tuple[str, ...] = (),
    ) -> str:
        """Put an image into the registry; returns its digest-pinned reference.
        `soft_reboot_capable`: staged, it may be entered by a soft reboot (same kernel).
        `signed_by`: the key files (as policy.json names them) whose signatures it carries.
        A `ref` pinned by digest keeps that digest (a host booted on a config's osImageURL,
        say a real controller's rendered config); otherwise the digest is the manifest's."""
        image = parse_image_ref(ref)
        manifest = {"name": image.name, "tag": image.tag, "files": files, "boot_fails": boot_fails}
        if signed_by:
            manifest["signed_by"] = list(signed_by)
        if pull_seconds:
            manifest["pull_seconds"] = pull_seconds
        if soft_reboot_capable:
            manifest["soft_reboot_capable"] = True
        digest = image.digest or (
            "sha256:" + hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        )
        registry = self._registry()
        registry["images"][digest] = {**manifest, "version": image.tag, "created": utc_now()}
        if image.tag:  # the tag moves to the newest image pushed under it
            registry.setdefault("tags", {})[f"{image.name}:{image.tag}"] = digest
        write_json(self._registry_path, registry)
        return str(image.with_digest(digest))

    def set_bootc_version(self, version: str) -> None:
        """Install another bootc release (an OS update would bring one)."""
        release_features(version)
        state = self._state()
        state["bootc_version"] = version
        write_json(self._state_path, state)

    def set_next_boot_fails(self, fails: bool = True) -> None:
        state = self._state()
        state["fail_next_boot"] = fails
        write_json(self._state_path, state)

    def set_disk_full(self, full: bool = True) -> None:
        """While set, a stage fails (kind `disk-space`) at the first layer it still has to
        fetch; an image whose layers are all cached stages as usual."""
        state = self._state()
        state["disk_full"] = full
        write_json(self._state_path, state)

    def set_reboot_fails(self, fails: bool = True) -> None:
        """While set, a reboot request fails as logind refuses one that polkit does not allow
        (kind `systemd`), and the host keeps running: no reboot is pending, and the request is
        logged as `reboot-refused` (never as a `reboot`)."""
        state = self._state()
        state["reboot_fails"] = fails
        write_json(self._state_path, state)

    def set_rollback_fails(self, fails: bool = True) -> None:
        """While set, `bootc rollback` fails (kind `other`, as bootc_errors classifies bootc's
        words) and nothing is queued."""
        state = self._state()
        state["rollback_fails"] = fails
        write_json(self._state_path, state)

    def set_shared_link(
        self,
        directory: Path | None,
        *,
        registry_bps: float = 0.0,
        link_bps: float = 0.0,
        host: str | None = None,
    ) -> None:
        """Pull through a registry shared with every host naming the same `directory`:
        `registry_bps` shared by all pulls running at once, each capped at `link_bps`; `host`
        names this host in the directory's pulls.log (default: its directory). None: back to
        each image's `pull_seconds`."""
        registry = self._registry()
        if directory is None:
            registry.pop("link", None)
        else:
            if registry_bps <= 0 or link_bps <= 0:
                raise HostError("a shared link needs registry_bps and link_bps > 0", kind="input")
            (Path(directory) / "active").mkdir(parents=True, exist_ok=True)
            registry["link"] = {"dir": str(directory), "registry_bps": float(registry_bps),
                                "link_bps": float(link_bps),
                                "host": host or str(self.base)}  # fmt: skip
        write_json(self._registry_path, registry)

    def set_registry_down(self, down: bool = True) -> None:
        """While set, the registry answers nothing: checks of a tag and pulls of a layer not
        cached yet fail (kind `other`, as a refused connection is)."""
        registry = self._registry()
        registry["down"] = down
        write_json(self._registry_path, registry)

    def boot(self) -> bool:
        """Complete a pending reboot, if any; returns whether the host booted.

        A full reboot boots by the bootloader: a queued rollback, else an unlocked staged
        deployment (unless its boot fails), while a locked one is discarded; /run is a tmpfs,
        so a prepared soft reboot (`nextroot`) is lost. A soft reboot restarts userspace on
        the same kernel (same boot ID, SoftRebootsCount + 1) into /run/nextroot when bootc
        prepared it (`nextroot`, see `SimulatedBootc.unlock_staged`): the staged deployment's
        userspace, locked or not (ostree's `deployment_set_soft_reboot` does not check the
        lock: https://github.com/ostreedev/ostree/blob/46204655/src/libostree/ostree-sysroot-deploy.c#L4452-L4508).
        With nothing prepared, systemd re-executes the same root: the
        booted deployment again, the staged one still staged (and still locked if it was; an
        unlocked one may be finalized at that shutdown, which changes nothing here: the next
        full reboot boots it either way), and the node needs a full reboot to boot it."""
        state = self._state()
        if not state.get("reboot_pending"):
            return False
        soft = state["reboot_pending"] == "soft"
        nextroot = state.pop("nextroot", None)  # consumed by a soft reboot, lost at a full one
        if soft and not _prepared(state, nextroot):
            state.update(soft_reboots=state.get("soft_reboots", 0) + 1, boots=state["boots"] + 1,
                         reboot_pending=None)  # fmt: skip
            write_json(self._state_path, state)
            booted = state["booted"]
            ref = booted["ref"] if "@" in booted["ref"] else f"{booted['ref']}@{booted['digest']}"
            self.log_action("boot", f"soft reboot with nothing prepared: booted again {ref}")
            return True
        images = self._registry()["images"]
        old = state["booted"]
        note = "booted"
        if state.get("rollback_queued") and state.get("rollback"):
            state["booted"], state["rollback"] = state["rollback"], state["booted"]
            state["staged"] = None
            note = "booted rollback"
        elif (state.get("staged") or {}).get("locked") and not soft:
            # Download-only: not finalized at shutdown, so this boot drops it; its layers stay
            # cached (until a GC, which is not modelled).
            note = f"staged deployment {state['staged']['ref']} discarded (download-only); booted"
            state["staged"] = None
        elif state.get("staged"):
            staged = state["staged"]
            if state.get("fail_next_boot") or images.get(staged["digest"], {}).get("boot_fails"):
                # The new deployment never reaches boot-complete; the bootloader falls back.
                state["staged"] = None
                note = f"boot of {staged['ref']} failed; bootloader fell back"
            else:
                # prepare_soft_reboot's hazard: the userspace of a locked deployment runs.
                if staged.get("locked"):
                    note = "soft reboot into the locked (download-only) staged deployment; booted"
                state["rollback"], state["booted"], state["staged"] = old, staged, None
        state.update(
            # A soft reboot restarts userspace on the same kernel: same boot ID, and systemd
            # counts it in SoftRebootsCount.
            boot_id=state["boot_id"] if soft else str(uuid.uuid4()),
            soft_reboots=state.get("soft_reboots", 0) + (1 if soft else 0),
            boots=state["boots"] + 1,
            reboot_pending=None,
            rollback_queued=False,
            fail_next_boot=False,
        )
        write_json(self._state_path, state)
        self._lay_image_files(old["digest"], state["booted"]["digest"])
        booted = state["booted"]
        ref = booted["ref"] if "@" in booted["ref"] else f"{booted['ref']}@{booted['digest']}"
        self.log_action("boot", f"{note} {ref}")
        return True

    def soft_reboot_prepared(self) -> str | None:
        """What /run/nextroot holds: "staged" (bootc prepared a soft reboot into the staged
        deployment), or None. (The agent never soft-reboots into a rollback: not modelled.)"""
        return self._state().get("nextroot")

    def prepare_soft_reboot(self) -> bool:
        """What `bootc upgrade --download-only --soft-reboot=auto` does beside locking (and any
        `--soft-reboot=auto` an admin passes): /run/nextroot prepared for the staged deployment,
        locked or not (the hazard the agent never creates), where this release has
        `--soft-reboot` and the entry is softRebootCapable. Returns whether it was prepared
        (`auto` falls back silently). See
        https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/cli.rs#L1386-L1393
        """
        state = self._state()
        staged = state.get("staged")
        meta = self._registry()["images"].get((staged or {}).get("digest", ""), {})
        if "soft-reboot" not in self.features() or not meta.get("soft_reboot_capable"):
            return False
        state["nextroot"] = "staged"
        write_json(self._state_path, state)
        self.log_action("bootc", "upgrade --download-only --soft-reboot auto")
        return True

    def reset_soft_reboot(self) -> None:
        """`ostree admin prepare-soft-reboot --reset`: /run/nextroot cleared."""
        state = self._state()
        if state.pop("nextroot", None) is not None:
            write_json(self._state_path, state)
        self.log_action("ostree", "admin prepare-soft-reboot --reset")

    def systemctl_reboot(self) -> None:
        """A reboot someone else asks for (an admin, kured): `systemctl reboot`, which systemd
        (>= 256) turns into a soft reboot when /run/nextroot is prepared (systemctl(1), `reboot`:
        https://www.freedesktop.org/software/systemd/man/latest/systemctl.html).
        The agent's own reboot goes through logind's Reboot, which never does
        (SimulatedSystem.reboot)."""
        state = self._state()
        soft = _prepared(state, state.get("nextroot"))
        state["reboot_pending"] = "soft" if soft else "hard"
        write_json(self._state_path, state)
        self.log_action("reboot", "soft-reboot" if soft else "reboot")

    # -- ports ---------------------------------------------------------------------------
    def status_document(self) -> dict[str, Any]:
        """The host as `bootc status --format json` prints it (org.containers.bootc/v1)."""
        return status_document(self)

    def host(self, is_allowed: Callable[[str], bool], check_timeout: float = 30.0) -> Host:
        return Host(
            root=self.root,
            files=RootedFiles(self.root, is_allowed, set_owner=os.geteuid() == 0),
            bootc=SimulatedBootc(self),
            system=SimulatedSystem(self),
            health=CheckRunner(self.root, check_timeout),
            reboot_ends_process=True,
        )


def _prepared(state: dict[str, Any], nextroot: str | None) -> bool:
    """Whether /run/nextroot (`nextroot`) holds a staged deployment to enter."""
    return nextroot == "staged" and state.get("staged") is not None
