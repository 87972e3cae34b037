"""A host in a directory: every port backed by files, for the demo, dry runs and tests.

Layout of DIR:
  root/            the host's filesystem (etc/passwd, /etc/kubernetes, ...), laid out as ostree
                   does: /home -> var/home, /root -> var/roothome
  host.json        the bootc deployments (booted/staged/rollback), boot ID, pending reboot,
                   injected faults (next boot fails, disk full, reboot or rollback refused)
  registry.json    the images this host can pull, by digest, and where each tag points
  layers.json      the image layers fetched so far, by digest (ostree's layer cache)
  actions.log      one JSON line per unit action, command, layer pulled and reboot, in order

It speaks one bootc release (`bootc_version` in host.json, default the newest persona of
standins/bootc_releases.py), with that release's capabilities and status fields: from 1.16.10 a
stage asked to be locked is `switch --download-only` and `unlock_staged()` (`bootc upgrade
--from-downloaded`) arms it; a stage not asked to be locked, and every stage before 1.16.10 (a
locked one is refused there), is an ordinary staged deployment; and `pull()` (the
hidden `internals ostree-container image pull`) fetches an image into the repository without
staging it. An image is LAYERS layers; a fetched layer stays cached, so a cancelled pull
resumes where it stopped, until a stage completes: every stage prunes the images no deployment
uses (ostree-ext's prune at the end of bootc's stage, bootc-versions.md §3). A stage of an image
whose layers are all cached fetches nothing and contacts no registry (§2).

A reboot only marks the host; `boot()` (run when the next agent process starts, as a machine
boots before its services) makes an unlocked staged deployment the booted one, discards a
locked one, or falls back to the old one when the image or the host was marked to fail that
boot. A soft reboot enters the staged deployment only where bootc prepared /run/nextroot for
it (`--soft-reboot auto` on `upgrade --from-downloaded`, from 1.12, as the agent asks at its
turn; or the hazard of `upgrade --download-only --soft-reboot`, `prepare_soft_reboot`); with
nothing prepared it restarts userspace into the booted deployment again, as systemd does.
Every stage, a rollback that drops the staged deployment, `ostree admin prepare-soft-reboot
--reset` and any full reboot (/run is a tmpfs) clear what was prepared.

Signatures: an image may be `signed_by` key files (paths, as policy.json names them). A stage
told to enforce reads root/etc/containers/policy.json (or the stage's own policy) and answers
as containers/image does: refused before any layer is pulled, with its words.

Pull time: an image is 64 MiB x (1 + its files) bytes. Without a shared link a layer takes the
image's `pull_seconds` / LAYERS. With one (`set_shared_link`: registry.json `link`, set per
host), many hosts' pulls share one registry's bandwidth, across processes
(standins/host/registry.py), and `pull_seconds` is not used. Registry "down", a full disk
and cancellation act as without a link, between layers; a layer cut off mid-way is fetched
again from its start."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.trust import StageTrust, admitted
from agent.errors import HostError, InputError
from agent.host import bootc_errors
from agent.host.durable import read_json, write_json
from agent.host.files import RootedFiles
from agent.host.health import CheckRunner
from agent.host.ports import Host, Progress, ProgressCallback
from agent.model.bootc_caps import REPO, Capabilities, pull_imgref
from agent.model.bootc_check import check_argv
from agent.model.bootc_status import BootcHost, bootc_host_from_object
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.sigpolicy import POLICY_PATH, REJECT, parse_policy
from standins.bootc_releases import DEFAULT_PERSONA, features_of
from standins.capabilities import release_capabilities
from standins.host.etc_diff import simulated_config_diff
from standins.host.registry import LinkEntry, SharedLink
from standins.host.unit_files import unit_file_state

_PASSWD = "root:x:0:0:root:/root:/bin/bash\ncore:x:1000:1000:CoreOS Admin:/home/core:/bin/bash\n"
_GROUP = "root:x:0:\nwheel:x:10:core\ncore:x:1000:\n"
_SHADOW = "root:*:19000:0:99999:7:::\ncore:*:19000:0:99999:7:::\n"
LAYERS = 3


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class SimulatedHost:
    base: Path

    # -- paths ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def _state_path(self) -> Path:
        return self.base / "host.json"

    @property
    def _registry_path(self) -> Path:
        return self.base / "registry.json"

    @property
    def _layers_path(self) -> Path:
        return self.base / "layers.json"

    def _state(self) -> dict[str, Any]:
        state = read_json(self._state_path)
        if state is None:
            raise HostError(f"{self.base} is not a simulated host (no host.json)", kind="input")
        return state

    def _registry(self) -> dict[str, Any]:
        return read_json(self._registry_path) or {"images": {}}

    def log_action(self, kind: str, detail: str) -> None:
        line = json.dumps({"time": _now(), "kind": kind, "detail": detail})
        with open(self.base / "actions.log", "a") as handle:
            handle.write(line + "\n")

    def actions(self) -> list[dict[str, str]]:
        path = self.base / "actions.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def stages(self, digest: str) -> list[tuple[int, bool]]:
        """Every stage of `digest` asked for, in order: (bytes fetched, locked). The last one
        is the node's turn; any before it were pre-stages."""
        found = []
        for action in self.actions():
            if action["kind"] == "fetched" and action["detail"].startswith(digest + " "):
                _, fetched, lock = action["detail"].split()
                found.append((int(fetched), lock == "locked"))
        return found

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
        _features(bootc_version)
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
        registry["images"][digest] = {**manifest, "version": image.tag, "created": _now()}
        if image.tag:  # the tag moves to the newest image pushed under it
            registry.setdefault("tags", {})[f"{image.name}:{image.tag}"] = digest
        write_json(self._registry_path, registry)
        return str(image.with_digest(digest))

    @property
    def bootc_version(self) -> str:
        return str(self._state().get("bootc_version") or DEFAULT_PERSONA)

    def features(self) -> frozenset[str]:
        return _features(self.bootc_version)

    def set_bootc_version(self, version: str) -> None:
        """Install another bootc release (an OS update would bring one)."""
        _features(version)
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

    # -- the layer cache -----------------------------------------------------------------
    def cached_layers(self, digest: str) -> set[int]:
        """The layers (1..LAYERS) of `digest` on disk. A deployed image has all of them."""
        state = self._state()
        deployed = (state.get(slot) or {} for slot in ("booted", "staged", "rollback"))
        if any(slot.get("digest") == digest for slot in deployed):
            return set(range(1, LAYERS + 1))
        return set((read_json(self._layers_path) or {}).get(digest, []))

    def _cache_layer(self, digest: str, layer: int) -> None:
        cache = read_json(self._layers_path) or {}
        cache[digest] = sorted({*cache.get(digest, []), layer})
        write_json(self._layers_path, cache)

    def _prune(self, state: dict[str, Any]) -> None:
        """What ends every bootc stage: images no deployment uses leave the repository."""
        deployed = {(state.get(slot) or {}).get("digest") for slot in ("booted", "staged",
                                                                      "rollback")}  # fmt: skip
        cache = read_json(self._layers_path) or {}
        pruned = sorted(digest for digest in cache if digest not in deployed)
        if pruned:
            write_json(self._layers_path, {d: v for d, v in cache.items() if d in deployed})
            for digest in pruned:
                self.log_action("prune", digest)

    # -- booting -------------------------------------------------------------------------
    def _lay_image_files(self, old_digest: str | None, new_digest: str | None) -> None:
        """Boot the new image's files as ostree deploys them (what the real ostree VM tier
        showed): its /usr replaces the old one, and its /etc files land in /usr/etc and reach
        /etc through the 3-way merge: a file the host changed from the old image's default
        keeps the host's version, an unchanged or absent one takes the new image's, and one
        the new image no longer ships goes unless the host changed it. (A real rollback boots
        the old deployment's own /etc instead; for files the host never changed, the same.)"""
        images = self._registry()["images"]
        old = (images.get(old_digest) or {}).get("files", {})
        new = (images.get(new_digest) or {}).get("files", {})
        for rel, text in old.items():
            if rel in new:
                continue
            if rel.startswith("etc/"):
                (self.root / "usr" / rel).unlink(missing_ok=True)
                if self._text(rel) != text:
                    continue  # changed on the host: the merge keeps it
            (self.root / rel).unlink(missing_ok=True)
        for rel, text in new.items():
            if rel.startswith("etc/"):
                self._lay(f"usr/{rel}", text)
                if self._text(rel) not in (None, old.get(rel)):
                    continue  # changed on the host: the merge keeps the host's version
            self._lay(rel, text)

    def _text(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def _lay(self, rel: str, text: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if text.startswith("#!"):
            target.chmod(0o755)

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
                if staged.get("locked"):  # the §6 hazard: a locked deployment's userspace runs
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
        (>= 256) turns into a soft reboot when /run/nextroot is prepared (bootc-runtime.md §5).
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
        state = self._state()
        images = self._registry()["images"]
        features = _features(str(state.get("bootc_version") or DEFAULT_PERSONA))

        def cached(digest: str | None) -> dict[str, Any] | None:
            meta = images.get(digest or "")
            if meta is None:
                return None
            return {
                "image": {"image": f"{meta['name']}:{meta['tag']}", "transport": "registry"},
                "version": meta.get("version"),
                "timestamp": meta.get("created"),
                "imageDigest": digest,
                "architecture": "amd64",
            }

        def entry(slot: dict[str, Any] | None) -> dict[str, Any] | None:
            if slot is None:
                return None
            meta = images.get(slot["digest"], {})
            name = slot["ref"].split("@", 1)[0]
            return {
                "image": {
                    "image": {
                        "image": name,
                        "transport": "registry",
                        **({"signature": "containerPolicy"} if slot.get("enforced") else {}),
                    },
                    "version": meta.get("version"),
                    "timestamp": meta.get("created"),
                    "imageDigest": slot["digest"],
                    "architecture": "amd64",
                },
                "cachedUpdate": cached(slot.get("cached_update")),
                "incompatible": False,
                "pinned": False,
                # Each field only from the release that has it (bootc-versions.md table).
                **(
                    {
                        "softRebootCapable": bool(meta.get("soft_reboot_capable"))
                        and slot is state["staged"]
                    }
                    if "status-soft-reboot-capable" in features
                    else {}
                ),
                **(
                    {"downloadOnly": bool(slot.get("locked")) and slot is state["staged"]}
                    if "status-download-only" in features
                    else {}
                ),
                "store": "ostreeContainer",
                "ostree": {
                    "stateroot": "default",
                    "checksum": slot["digest"][7:],
                    "deploySerial": 0,
                },
            }

        spec_slot = state["staged"] or state["booted"]
        return {
            "apiVersion": "org.containers.bootc/v1",
            "kind": "BootcHost",
            "metadata": {"name": "host"},
            "spec": {
                "image": {"image": spec_slot["ref"].split("@", 1)[0], "transport": "registry"},
                "bootOrder": "rollback" if state["rollback_queued"] else "default",
            },
            "status": {
                "staged": entry(state["staged"]),
                "booted": entry(state["booted"]),
                "rollback": entry(state["rollback"]),
                "rollbackQueued": state["rollback_queued"],
                "type": "bootcHost",
            },
        }

    def host(self, is_allowed: Callable[[str], bool], check_timeout: float = 30.0) -> Host:
        return Host(
            root=self.root,
            files=RootedFiles(self.root, is_allowed, set_owner=os.geteuid() == 0),
            bootc=SimulatedBootc(self),
            system=SimulatedSystem(self),
            health=CheckRunner(self.root, check_timeout),
            reboot_ends_process=True,
        )


class SimulatedBootc:
    def __init__(self, sim: SimulatedHost) -> None:
        self.sim = sim

    async def status(self) -> BootcHost:
        return bootc_host_from_object(self.sim.status_document())

    async def capabilities(self) -> Capabilities:
        """What this release's `--help` lists (standins/capabilities.py)."""
        return release_capabilities(self.sim.bootc_version)

    def _image(self, image: ImageRef, verb: str) -> dict[str, Any]:
        meta = self.sim._registry()["images"].get(image.digest or "")
        if meta is None or meta["name"] != image.name:
            raise HostError(
                f"error: {verb}: Pulling: Creating importer: failed to invoke method "
                f"OpenImage: reading manifest {image.digest} in {image.name}: manifest unknown",
                kind="image-missing",
            )
        return meta

    def _present(self, digest: str) -> bool:
        return len(self.sim.cached_layers(digest)) == LAYERS

    async def stage(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        locked: bool = False,
        trust: StageTrust | None = None,
    ) -> int | None:
        """Pull the layers not cached yet (pull_seconds/LAYERS each, or through the shared
        link: the module's docstring), then stage as asked, as
        the real adapter does: `locked` is `switch --download-only` (from 1.16.10; refused
        before anything is pulled elsewhere), which an ordinary reboot discards; unlocked, a
        plain switch, which the next reboot boots. Returns the bytes fetched. Cancelling the
        awaiting task stops the pull; the layers fetched so far stay cached."""
        _, trust = admitted(image, trust, "stage")
        assert image.digest is not None
        caps = await self.capabilities()
        if locked and not caps.locked_staging:
            raise HostError(
                f"cannot stage {image} locked: {caps.who} has no `bootc switch --download-only`"
                " (with `bootc upgrade --from-downloaded`), so any reboot would boot the "
                "staged image",
                kind="unsupported",
            )
        meta = self._image(image, "Switching")
        # Stricter than bootc, whose digest short-circuit (store.rs:959-975) skips the check
        # for an image in the repository: that is why the agent pre-pulls signed.
        if trust.enforce:
            self._verify(image, meta, trust)
        staged = self.sim._state()["staged"]
        # An unverified one is pulled and verified again, as bootc does (its spec differs);
        # an unlocked one does not do for a locked stage.
        if (
            staged is not None
            and staged["digest"] == image.digest
            and (staged.get("enforced") or not trust.enforce)
            and (staged.get("locked") or not locked)
        ):
            self._log_fetched(image.digest, 0, locked)
            return 0
        fetched = await self._pull(image.digest, meta, on_progress, verb="stage", locked=locked)
        state = self.sim._state()
        # Every stage resets a prepared soft reboot ("Staging always resets soft reboot
        # state": https://github.com/ostreedev/ostree/blob/462046551181b14c91668eb5378a70ba18607ddd/src/libostree/ostree-sysroot-deploy.c#L3833):
        # only a later `--soft-reboot` prepares the new one.
        state.pop("nextroot", None)
        if state["booted"]["digest"] == image.digest:
            state["staged"] = None  # switching to the booted image drops a staged one
        else:
            state["staged"] = {"ref": str(image), "digest": image.digest, "locked": locked,
                               "enforced": trust.enforce}  # fmt: skip
        write_json(self.sim._state_path, state)
        flags = " --download-only" if locked else ""
        self.sim.log_action("bootc", f"switch --transport registry{flags} {image}")
        self._log_fetched(image.digest, fetched, locked)
        self.sim._prune(state)
        return fetched

    def _log_fetched(self, digest: str, fetched: int, locked: bool) -> None:
        """One line per stage asked for: what it fetched from the registry and whether it was
        locked (`fetched DIGEST BYTES locked|unlocked`). A node's turn is the last stage of
        its digest (`SimulatedHost.stages`); a pre-stage comes before it."""
        self.sim.log_action("fetched", f"{digest} {fetched} {'locked' if locked else 'unlocked'}")

    async def pull(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        trust: StageTrust | None = None,
    ) -> None:
        """The hidden `internals ostree-container image pull` into the repository: the layers
        not cached yet, verified first when signed; nothing staged, nothing pruned."""
        _, trust = admitted(image, trust, "pre-pull")
        assert image.digest is not None
        caps = await self.capabilities()
        if not caps.image_pull:
            raise HostError(f"cannot pre-pull {image}: {caps.who} has no `bootc internals "
                            "ostree-container image pull`", kind="unsupported")  # fmt: skip
        meta = self._image(image, "Pulling")
        if trust.enforce:
            self._verify(image, meta, trust)
        await self._pull(image.digest, meta, on_progress, verb="pull")
        imgref = pull_imgref(str(image.with_digest(image.digest)), signed=trust.enforce)
        pull = "internals ostree-container image pull --quiet"
        self.sim.log_action("bootc", f"{pull} {REPO} {imgref}")

    async def prune(self) -> None:
        self.sim._prune(self.sim._state())
        self.sim.log_action("bootc", "internals cleanup")

    async def pulled(self, image: ImageRef) -> bool:
        return image.digest is not None and self._present(image.digest)

    def _verify(self, image: ImageRef, meta: dict[str, Any], trust: StageTrust) -> None:
        """containers/image's verdict under the policy the stage sees."""
        path = self.sim.root / POLICY_PATH.lstrip("/")
        data = trust.policy if trust.policy is not None else _read_bytes(path)
        prefix = "error: Switching: Pulling: Creating importer: "
        try:
            policy = parse_policy(data or b"")
        except InputError as exc:
            raise HostError(f"{prefix}invalid policy: {exc}", kind="signature") from None
        if policy.default_insecure:
            raise HostError(
                f"{prefix}containers-policy.json specifies a default of `insecureAcceptAnything`; "
                "refusing usage",
                kind="signature",
            )
        rule = policy.rule_for(image)
        rejected = f"{prefix}failed to invoke method OpenImage: Source image rejected: "
        if rule.verdict == REJECT:
            raise HostError(f"{rejected}Running image docker://{image} is rejected by policy.",
                            kind="signature")  # fmt: skip
        signatures = set(meta.get("signed_by", ()))
        for requirement in rule.requirements:
            if requirement.type not in ("signedBy", "sigstoreSigned"):
                continue
            if not signatures:
                raise HostError(f"{rejected}A signature was required, but no signature exists",
                                kind="signature")  # fmt: skip
            if not signatures & set(requirement.key_paths):
                raise HostError(
                    f"{rejected}Invalid GPG signature: no signature by a key in "
                    f"{', '.join(requirement.key_paths) or requirement.key}",
                    kind="signature",
                )

    async def _pull(
        self,
        digest: str,
        meta: dict[str, Any],
        on_progress: ProgressCallback | None,
        *,
        verb: str,
        locked: bool = False,
    ) -> int:
        """Fetch the layers not cached; returns the bytes fetched."""
        total = 64 * 1024 * 1024 * (1 + len(meta["files"]))
        cached = self.sim.cached_layers(digest)
        missing = [layer for layer in range(1, LAYERS + 1) if layer not in cached]
        seconds = float(meta.get("pull_seconds", 0)) / LAYERS
        at_start = total * len(cached) // LAYERS
        if on_progress and not missing:  # all cached: one report that it is complete
            on_progress(Progress(done_bytes=total, total_bytes=total, step="pulling",
                                 cached_bytes=total))  # fmt: skip
        link = SharedLink.of(self.sim._registry().get("link"))
        entry: LinkEntry | None = None
        outcome = "failed"
        layers_done = 0
        try:
            for layer in missing:
                if self.sim._registry().get("down"):
                    raise HostError(
                        f"error: Switching: Pulling: Importing: fetching {digest} layer "
                        f"{layer}: connection refused",
                        kind="other",
                    )
                if self.sim._state().get("disk_full"):
                    raise HostError(
                        f"error: Switching: Pulling: Importing: Unpacking {digest} layer "
                        f"{layer}/{LAYERS}: writing object: No space left on device (os error 28)",
                        kind="disk-space",
                    )
                if link is None:
                    await asyncio.sleep(seconds)
                else:
                    if entry is None:  # registered only once there is something to fetch
                        entry = link.join(digest, verb, locked, layer, len(missing),
                                          total * len(missing) // LAYERS)  # fmt: skip
                    await link.transfer(total / LAYERS)
                self.sim._cache_layer(digest, layer)
                self.sim.log_action("pull", f"{digest}  layer {layer}/{LAYERS}")
                cached.add(layer)
                layers_done += 1
                if on_progress:
                    done = total * len(cached) // LAYERS
                    on_progress(Progress(done_bytes=done, total_bytes=total, step="pulling",
                                         cached_bytes=at_start))  # fmt: skip
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"  # the layers fetched so far stay cached
            raise
        finally:
            if link is not None and entry is not None:
                link.leave(entry, outcome, total * layers_done // LAYERS)
        return total * len(missing) // LAYERS

    async def check_update(self, image: ImageRef) -> str:
        """`bootc upgrade --check [--tag TAG]`: where the tag points in registry.json, with
        bootc's limits (model/bootc_check.py); the booted entry's cachedUpdate records it.
        Where this release cannot check that tag (no `--tag` before 1.15, once the spec is
        pinned by digest), the agent's own resolver asks the registry (`skopeo inspect
        --raw`, host/skopeo.py): logged as that."""
        state = self.sim._state()
        spec = (state["staged"] or state["booted"])["ref"]
        caps = await self.capabilities()
        try:
            args = ["bootc", *check_argv(spec, image, caps.upgrade_tag)]
        except HostError as exc:
            if exc.kind != "unsupported":
                raise
            args = ["skopeo", "inspect", "--raw", f"docker://{image}"]
        registry = self.sim._registry()
        if registry.get("down"):
            raise HostError(
                f"error: Upgrading: Creating importer: failed to invoke method OpenImage: "
                f"pinging container registry {image.registry}: connection refused",
                kind="other",
            )
        digest = registry.get("tags", {}).get(f"{image.name}:{image.tag}")
        if digest is None:
            raise HostError(
                f"error: Upgrading: Creating importer: failed to invoke method OpenImage: "
                f"reading manifest {image.tag} in {image.name}: manifest unknown",
                kind="image-missing",
            )
        state["booted"]["cached_update"] = digest if digest != state["booted"]["digest"] else None
        write_json(self.sim._state_path, state)
        self.sim.log_action(args[0], " ".join(args[1:]))
        return str(digest)

    async def cancel_stage(self) -> None:
        """Nothing runs in the background here: a pull is stopped by cancelling the task that
        awaits stage(), and the layer cache keeps what it fetched."""

    async def unlock_staged(self, *, soft: bool = False) -> bool:
        """As the real adapter asks this release's bootc (host/bootc.py): `bootc upgrade
        --from-downloaded` (>= 1.12) where the staged deployment is locked, and with `soft`
        where the staged entry is softRebootCapable, `--soft-reboot auto`, which prepares
        /run/nextroot for it (it unlocks nothing else): only then does a soft reboot
        enter it (`SimulatedHost.boot`). Before 1.12 nothing is asked: nothing staged is
        locked, and no soft reboot is prepared. Returns whether bootc was asked. See
        https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/cli.rs#L1241-L1257
        """
        caps = await self.capabilities()
        status = await self.status()
        state = self.sim._state()
        staged = state["staged"]
        if staged is None or status.staged is None:
            raise HostError("error: Upgrading: No staged deployment found", kind="no-staged")
        want_soft = soft and caps.soft_reboot_at_turn and status.staged.soft_reboot_capable
        if not (staged.get("locked") or want_soft) or not caps.upgrade_from_downloaded:
            return False
        staged["locked"] = False
        if want_soft:
            state["nextroot"] = "staged"
        write_json(self.sim._state_path, state)
        flags = " --soft-reboot auto" if want_soft else ""
        self.sim.log_action("bootc", f"upgrade --from-downloaded{flags}")
        return True

    async def config_diff(self) -> str:
        """What ostree would print for this host: root/usr/etc holds the booted image's /etc
        defaults, as `_lay_image_files` lays them."""
        return await asyncio.to_thread(simulated_config_diff, self.sim.root)

    async def rollback(self) -> None:
        state = self.sim._state()
        if state.get("rollback_fails"):
            raise bootc_errors.failure(
                "bootc rollback",
                "error: Rollback: Writing bootloader entries: Read-only file system (os error 30)",
                1,
            )
        if not state.get("rollback"):
            raise HostError("error: No rollback available", kind="rollback")
        state["staged"] = None
        # ostree clears a soft reboot into a deployment it drops:
        # https://github.com/ostreedev/ostree/blob/462046551181b14c91668eb5378a70ba18607ddd/src/libostree/ostree-sysroot-deploy.c#L2893-L2907
        state.pop("nextroot", None)
        state["rollback_queued"] = not state["rollback_queued"]
        write_json(self.sim._state_path, state)
        self.sim.log_action("bootc", "rollback")


class SimulatedSystem:
    def __init__(self, sim: SimulatedHost) -> None:
        self.sim = sim

    async def boot_id(self) -> str:
        return str(self.sim._state()["boot_id"])

    async def soft_reboots_count(self) -> int:
        return int(self.sim._state().get("soft_reboots", 0))

    async def perform(self, action: str) -> None:
        self.sim.log_action("unit", action)

    async def unit_file_state(self, name: str) -> str:
        return unit_file_state(self.sim.root, name)

    async def reboot(self, *, soft: bool = False) -> None:
        state = self.sim._state()
        if state.get("reboot_fails"):
            self.sim.log_action("reboot-refused", "soft-reboot" if soft else "reboot")
            # What host/systemd.py raises for a D-Bus error reply (a DBusCallError).
            raise HostError(
                "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired: Interactive "
                "authentication required.",
                kind="systemd",
            )
        state["reboot_pending"] = "soft" if soft else "hard"
        write_json(self.sim._state_path, state)
        self.sim.log_action("reboot", "soft-reboot" if soft else "reboot")


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _features(version: str) -> frozenset[str]:
    try:
        return features_of(version)
    except ValueError as exc:
        raise HostError(f"simulated bootc: {exc}", kind="input") from None


def _prepared(state: dict[str, Any], nextroot: str | None) -> bool:
    """Whether /run/nextroot (`nextroot`) holds a staged deployment to enter."""
    return nextroot == "staged" and state.get("staged") is not None
