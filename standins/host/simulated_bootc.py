"""The simulated bootc: what `bootc status` prints for a simulated host, and its verbs.

It speaks one bootc release (`bootc_version` in host.json, default the newest persona of
standins/bootc_releases.py), with that release's capabilities and status fields: from 1.16.10 a
stage asked to be locked is `switch --download-only` and `unlock_staged()` (`bootc upgrade
--from-downloaded`) arms it; a stage not asked to be locked, and every stage before 1.16.10 (a
locked one is refused there), is an ordinary staged deployment; and `pull()` (the
hidden `internals ostree-container image pull`) fetches an image into the repository without
staging it. Layers already cached are not fetched again, so a cancelled pull resumes where it
stopped; a stage whose image is wholly cached fetches nothing and asks no registry, as bootc
returns early for a digest it already holds (bootc v1.16.9,
https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/ostree-ext/src/container/store.rs#L959-L975).

Signatures: an image may be `signed_by` key files (paths, as policy.json names them). A stage
told to enforce reads root/etc/containers/policy.json (or the stage's own policy) and answers
as containers/image does: refused before any layer is pulled, with its words.

Pull time: an image is 64 MiB x (1 + its files) bytes. Without a shared link a layer takes the
image's `pull_seconds` / LAYERS. With one (`SimulatedHost.set_shared_link`: registry.json
`link`, set per host), many hosts' pulls share one registry's bandwidth, across processes
(standins/host/registry.py), and `pull_seconds` is not used. Registry "down", a full disk
and cancellation act as without a link, between layers; a layer cut off mid-way is fetched
again from its start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.core.trust import StageTrust, admitted
from agent.errors import HostError, InputError
from agent.host import bootc_errors
from agent.host.durable import write_json
from agent.host.ports import Progress, ProgressCallback
from agent.model.bootc_caps import REPO, Capabilities, pull_imgref
from agent.model.bootc_check import check_argv
from agent.model.bootc_status import BootcHost, bootc_host_from_object
from agent.model.imageref import ImageRef
from agent.model.sigpolicy import POLICY_PATH, REJECT, parse_policy
from standins.bootc_releases import DEFAULT_PERSONA
from standins.capabilities import release_capabilities
from standins.host.etc_diff import simulated_config_diff
from standins.host.registry import LinkEntry, SharedLink
from standins.host.state import LAYERS, HostState, release_features


def status_document(sim: HostState) -> dict[str, Any]:
    """The host as `bootc status --format json` prints it (org.containers.bootc/v1)."""
    state = sim._state()
    images = sim._registry()["images"]
    features = release_features(str(state.get("bootc_version") or DEFAULT_PERSONA))

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
            # Each field only from the release that has it (standins/bootc_releases.py
            # FEATURES, which cites bootc's source for each).
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


class SimulatedBootc:
    """The `bootc` port of a simulated host, speaking the host's bootc release."""

    def __init__(self, sim: HostState) -> None:
        self.sim = sim

    async def status(self) -> BootcHost:
        return bootc_host_from_object(status_document(self.sim))

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
        # Stricter than bootc, whose digest short-circuit skips the check for an image in the
        # repository (bootc v1.16.9 crates/ostree-ext/src/container/store.rs lines 959-975:
        # https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/ostree-ext/src/container/store.rs#L959-L975):
        # that is why the agent pre-pulls signed.
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
        bootc's limits (agent/model/bootc_check.py); the booted entry's cachedUpdate records it.
        Where this release cannot check that tag (no `--tag` before 1.15, once the spec is
        pinned by digest), the agent's own resolver asks the registry (`skopeo inspect
        --raw`, agent/host/skopeo.py): logged as that."""
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
        """As the real adapter asks this release's bootc (agent/host/bootc.py): `bootc upgrade
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


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
