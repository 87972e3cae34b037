"""The real bootc adapter: the BootcPort over the `bootc` CLI.

- Short calls (`status`, `rollback`, `upgrade --from-downloaded`, `upgrade --check`, `--help`
  probes) run as child processes (behind `command_prefix`, e.g. `nsenter -t 1 -m -u -i -n -p
  --`, in a pod).
- Staging (`bootc switch`) and pre-pulls run in the named stage unit, at low priority, with their
  progress read from a file (stage_unit.py): a restarted agent adopts the run instead of
  starting a second one, and `cancel_stage()` stops it.
- A digest already staged is not staged again (`bootc switch` to the staged spec is a no-op
  anyway, but only after taking the sysroot lock and starting a unit).
- bootc waits for the sysroot lock forever: every call here is serialized by one asyncio.Lock per
  adapter and has a deadline; a deadline hit while bootc said "Waiting for sysroot lock" is kind
  `lock` (bootc_errors.py reads bootc's stderr).
- Never `--apply` (the agent journals its intent, then reboots itself), never
  `--mutate-in-place`.
- Registry credentials: bootc reads /run/ostree/auth.json. The files port writes it (policy
  mirrors the pull secret there, 0600), so this adapter does not.
- Signatures (core/trust.py decides): `--enforce-container-sigpolicy` makes bootc verify the
  image against the host's /etc/containers/policy.json (and registries.d) before it pulls a
  layer. A stage policy (the host's with its default made `reject`) is bind-mounted read-only
  over /etc/containers/policy.json in the stage unit's own mount namespace, never on the host."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.trust import StageTrust, admitted
from agent.errors import HostError, InputError
from agent.host import bootc_errors
from agent.host.ports import Progress, ProgressCallback, TagResolving
from agent.host.stage_unit import STAGE_PRIORITY, STAGE_UNIT, StageUnit, progress_from_event
from agent.host.units import ProcessUnitRunner, UnitRunner, run_process
from agent.model.bootc_caps import (
    LIST_ARGS,
    PULL_PROBE_ARGS,
    Capabilities,
    from_help,
    listed,
    parse_version,
    pull_argv,
)
from agent.model.bootc_check import check_argv, parse_check_output, unchanged_digest
from agent.model.bootc_status import BootcHost, parse_bootc_status
from agent.model.imageref import ImageRef

# Callers import the stage unit's names from here too: they are part of the adapter's API.
__all__ = ["STAGE_PRIORITY", "STAGE_UNIT", "Bootc", "BootcTimeouts", "progress_from_event"]
_FORBIDDEN = frozenset({"--apply", "--mutate-in-place"})


@dataclass(frozen=True)
class BootcTimeouts:
    """Seconds per call. bootc itself never gives up on a lock, so these are the only bound."""

    status: float = 120.0
    probe: float = 30.0
    stage: float = 3600.0
    unlock: float = 300.0
    rollback: float = 300.0
    check: float = 300.0  # `upgrade --check` fetches a manifest and a config
    pull: float = 3600.0  # a pre-pull fetches the whole image, as a stage does
    config_diff: float = 60.0  # `ostree admin config-diff` reads /etc and /usr/etc


class Bootc:
    """BootcPort over the bootc CLI.

    `runner` runs the staging command as a named unit (pass the `Systemd` adapter on a host);
    without one, a `ProcessUnitRunner` runs it as a child process behind `command_prefix`.
    `run_dir` is where the stage command's stderr/progress files live, as the command sees it;
    the agent reads them under `host_root` (the host's `/` as mounted in a pod)."""

    def __init__(
        self,
        *,
        bootc: str = "bootc",
        command_prefix: Sequence[str] = (),
        runner: UnitRunner | None = None,
        timeouts: BootcTimeouts | None = None,
        run_dir: Path = Path("/run/image-mode-agent"),
        host_root: Path = Path("/"),
        env: Mapping[str, str] | None = None,
        unit: str = STAGE_UNIT,
        progress_poll: float = 0.2,
        ostree: str = "ostree",
        resolver: TagResolving | None = None,
    ) -> None:
        self.bootc = bootc
        self.ostree = ostree
        self.resolver = resolver
        self._prefix = list(command_prefix)
        self.timeouts = timeouts or BootcTimeouts()
        self._env = dict(env or {})
        self._stage = StageUnit(
            runner or ProcessUnitRunner(command_prefix),
            unit=unit,
            run_dir=run_dir,
            host_root=host_root,
            env=self._env,
            progress_poll=progress_poll,
        )
        self._lock = asyncio.Lock()
        self._caps: Capabilities | None = None

    @property
    def runner(self) -> UnitRunner:
        """What runs the stage unit (the `Systemd` adapter on a host)."""
        return self._stage.runner

    @property
    def unit(self) -> str:
        """The stage unit's name."""
        return self._stage.unit

    # -- plumbing --------------------------------------------------------------------------
    def _direct_env(self) -> dict[str, str]:
        # bootc refuses to run when it thinks it is in a container (`container` is set by
        # podman/CRI-O); through nsenter it acts on the host, so drop it.
        env = {k: v for k, v in os.environ.items() if k != "container"}
        env.update(self._env)
        return env

    async def _run(self, args: Sequence[str], timeout: float, what: str) -> bytes:
        if _FORBIDDEN.intersection(args):
            raise HostError(f"refusing to run bootc with {sorted(_FORBIDDEN)}", kind="input")
        result = await run_process([*self._prefix, self.bootc, *args], timeout, self._direct_env())
        stderr = result.stderr.decode(errors="replace")
        if result.status is None:
            raise bootc_errors.timed_out(what, stderr, timeout)
        if result.status != 0:
            raise bootc_errors.failure(what, stderr, result.status)
        return result.stdout

    async def _accepts(self, args: Sequence[str], program: str | None = None) -> tuple[bool, str]:
        """Whether `program` (bootc) parses `args` (exit 0), and what it printed; a program
        that is not installed accepts nothing."""
        argv = [*self._prefix, program or self.bootc, *args]
        try:
            result = await run_process(argv, self.timeouts.probe, self._direct_env())
        except FileNotFoundError:
            return False, ""
        if result.status is None:
            raise HostError(f"{argv[len(self._prefix)]} {' '.join(args)} timed out", kind="timeout")
        return result.status == 0, result.stdout.decode(errors="replace")

    async def capabilities(self) -> Capabilities:
        """Probe once per adapter, from `--help`: what this bootc can do is read from the flags
        it lists, never inferred from its version number (the flags the agent relies on are
        plain options bootc's `--help` shows, e.g. `upgrade`'s in
        https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/cli.rs#L98-L133).
        Hidden flags and verbs are probed by parse: clap rejects an unknown argument before it
        reaches `--help`."""
        if self._caps is None:
            _, version = await self._accepts(["--version"])
            _, switch_help = await self._accepts(["switch", "--help"])
            _, upgrade_help = await self._accepts(["upgrade", "--help"])
            progress = "--progress-fd" in switch_help
            if not progress:
                progress, _ = await self._accepts(["switch", "--progress-fd", "3", "--help"])
            image_pull, _ = await self._accepts(PULL_PROBE_ARGS)
            lock, _ = await self._accepts(
                ["admin", "lock-finalization", "--help"], program=self.ostree
            )
            self._caps = from_help(
                switch_help,
                upgrade_help,
                progress_fd=progress,
                image_pull=image_pull,
                lock_finalization=lock,
                version=parse_version(version),
            )
        return self._caps

    # -- the port ----------------------------------------------------------------------------
    async def _status(self) -> BootcHost:
        out = await self._run(
            ["status", "--format", "json", "--format-version", "1"],
            self.timeouts.status,
            "bootc status",
        )
        try:
            return parse_bootc_status(out)  # never more than an InputError, however hostile
        except InputError as exc:
            raise HostError(f"unreadable bootc status: {exc}", kind="other") from None

    async def status(self) -> BootcHost:
        async with self._lock:
            return await self._status()

    async def rollback(self) -> None:
        """Queue the rollback deployment. `bootc rollback` is a toggle, so it runs only when
        no rollback is queued yet; it discards a staged deployment (bootc's own semantics)."""
        async with self._lock:
            host = await self._status()
            if host.rollback_queued:
                return
            if host.rollback is None:
                raise HostError("no rollback deployment to roll back to", kind="rollback")
            try:
                await self._run(["rollback"], self.timeouts.rollback, "bootc rollback")
            except HostError as exc:
                if "No rollback available" in str(exc):
                    raise HostError(str(exc), kind="rollback") from None
                raise

    async def check_update(self, image: ImageRef) -> str:
        """`bootc upgrade --check [--tag TAG]`: the digest the tag points to (bootc resolves
        it with the host's registries.conf, mirrors and credentials, as it will pull it).
        Where bootc cannot check that tag (no `upgrade --tag` before 1.15, or another
        repository than the spec's), the resolver asks the registry as bootc would
        (host/skopeo.py): the same digest, for the same tag."""
        async with self._lock:
            caps = await self.capabilities()
            host = await self._status()
            try:
                args = check_argv(host.spec_image, image, caps.upgrade_tag)
            except HostError as exc:
                if exc.kind != "unsupported" or self.resolver is None:
                    raise
                return await self.resolver.resolve(image)
            out = await self._run(args, self.timeouts.check, "bootc " + " ".join(args))
            try:
                answer = parse_check_output(out.decode(errors="replace"))
            except InputError as exc:
                raise HostError(str(exc), kind="other") from None
            if answer.digest is not None:
                return answer.digest
            digest = unchanged_digest(await self._status(), image)
            if digest is None:
                raise HostError(
                    f"bootc found no change in {image} but no deployment of it", kind="other"
                )
            return digest

    async def unlock_staged(self, *, soft: bool = False) -> bool:
        """At the reboot slot: let the next boot apply a download-only (locked) staged
        deployment (`bootc upgrade --from-downloaded`), and with `soft` prepare a soft reboot
        where bootc can (`--soft-reboot auto` falls back to a full reboot). Returns whether
        anything was asked of bootc; an unlocked staged deployment needs nothing. bootc
        before 1.12 has no `--from-downloaded`: nothing it staged is locked, and the soft
        reboot it cannot prepare is not asked for (`Capabilities.soft_reboot_at_turn`)."""
        async with self._lock:
            caps = await self.capabilities()
            host = await self._status()
            if host.staged is None:
                raise HostError("no staged deployment to apply", kind="no-staged")
            want_soft = soft and caps.soft_reboot_at_turn and host.staged.soft_reboot_capable
            if not (host.staged.download_only or want_soft) or not caps.upgrade_from_downloaded:
                return False
            args = ["upgrade", "--from-downloaded"]
            if want_soft:
                args += ["--soft-reboot", "auto"]
            await self._run(args, self.timeouts.unlock, "bootc upgrade --from-downloaded")
            return True

    async def stage(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        locked: bool = False,
        trust: StageTrust | None = None,
    ) -> int | None:
        """`bootc switch --transport registry NAME@DIGEST` in the stage unit, at low priority;
        nothing when that digest is staged already (and locked, if `locked`). `locked` is
        `--download-only`, so a plain reboot discards the deployment instead of booting it:
        kind `unsupported` where this bootc cannot, before anything is pulled, and an error
        if bootc staged it unlocked all the same. Unlocked, any reboot boots it. `trust`: see
        the module's docstring; a refusal or a policy this bootc cannot enforce is kind
        `signature`, before anything runs. Returns the bytes fetched, from bootc's progress
        events (`bytes - bytesCached`): 0 when it reported no pull (the image was in the
        repository: bootc finds the digest stored and returns before it opens the image,
        https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/ostree-ext/src/container/store.rs#L959-L975),
        None without `--progress-fd`."""
        ref, trust = admitted(image, trust, "stage")
        async with self._lock:
            caps = await self.capabilities()
            if trust.enforce and not caps.sigpolicy:
                raise HostError(
                    f"cannot verify {ref}: {caps.who} has no `bootc switch "
                    "--enforce-container-sigpolicy`",
                    kind="signature",
                )
            self._stage.check_bind(ref, trust)
            if locked and not caps.locked_staging:
                raise HostError(
                    f"cannot stage {ref} locked: {caps.who} has no `bootc switch "
                    "--download-only` (with `bootc upgrade --from-downloaded`), so any reboot "
                    "would boot the staged image",
                    kind="unsupported",
                )
            digest = image.digest or ""
            settled = await self._settled_status()
            if settled is not None and _staged_as_asked(settled, digest, trust.enforce, locked):
                return 0
            if locked and settled is not None and _same_spec_unlocked(settled, ref, trust.enforce):
                # A switch to the spec staged is a no-op ("Image specification is unchanged"):
                # lock what is staged instead. bootc >= 1.12 `upgrade --download-only` with the
                # spec unchanged only locks the staged deployment:
                # https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/cli.rs#L1325-L1340
                await self._run(["upgrade", "--download-only"], self.timeouts.unlock,
                                "bootc upgrade --download-only")  # fmt: skip
                if (await self._status()).staged_locked(digest):
                    return 0
            argv = [self.bootc, "switch", "--transport", "registry"]
            if trust.enforce:
                argv.append("--enforce-container-sigpolicy")
            if locked:
                argv.append("--download-only")
            if caps.progress_fd:
                argv += ["--progress-fd", "3"]
            argv.append(ref)
            description = await self._stage.start_or_adopt(ref, argv, trust)
            await self._stage.follow(description, on_progress if caps.progress_fd else None,
                                     "bootc switch", self.timeouts.stage)  # fmt: skip
            if locked and not (await self._status()).staged_locked(digest):
                raise HostError(
                    f"bootc staged {ref} but not locked (download-only): any reboot would boot "
                    "it; the next stage replaces it",
                    kind="other",
                )
            return self._stage.fetched() if caps.progress_fd else None

    async def pull(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        trust: StageTrust | None = None,
    ) -> None:
        """Pre-pull `NAME@DIGEST` into /sysroot/ostree/repo with the hidden ostree-ext pull
        (model/bootc_caps.py pull_argv), in the stage unit at the stage's priority: staged
        nothing, so any reboot is harmless. Signed (`ostree-image-signed:`) when the stage
        enforces the policy, under the same stage policy mount. It takes no sysroot lock, so
        it runs under this adapter's lock like every bootc call. Checked afterwards: a pull
        that exited 0 and stored nothing is an error."""
        ref, trust = admitted(image, trust, "pre-pull")
        async with self._lock:
            caps = await self.capabilities()
            if not caps.image_pull:
                raise HostError(
                    f"cannot pre-pull {ref}: {caps.who} has no `bootc internals "
                    "ostree-container image pull`",
                    kind="unsupported",
                )
            self._stage.check_bind(ref, trust)
            await self._not_a_list(image, ref)
            if on_progress is not None:
                on_progress(Progress(step="pre-pulling"))
            argv = pull_argv(self.bootc, ref, signed=trust.enforce)
            description = await self._stage.start_or_adopt(ref, argv, trust, verb="pre-pull")
            await self._stage.follow(description, None, "bootc internals ostree-container pull",
                                     self.timeouts.pull)  # fmt: skip
            if not await self._pulled(ref):
                raise HostError(
                    f"pre-pull of {ref} ended but the repository does not list it", kind="other"
                )

    async def _not_a_list(self, image: ImageRef, ref: str) -> None:
        """A manifest list's digest cannot be pre-pulled usefully: bootc records the image it
        pulls under the instance's digest (the one skopeo picks from the list), and it skips
        the fetch only when that recorded digest is the one asked for, so the turn's switch of
        the list's digest asks the registry again and imports anew
        (https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/ostree-ext/src/container/store.rs#L959-L1011);
        and the booted digest is the instance's. Refused with the digest to pin instead."""
        if self.resolver is None or image.digest is None:
            return
        instance = await self.resolver.instance(image)
        if instance != image.digest:
            raise HostError(
                f"not pre-pulling {ref}: it names a manifest list, and bootc records this "
                f"host's instance {instance}; pin the image to {image.name}@{instance}",
                kind="unsupported",
            )

    async def pulled(self, image: ImageRef) -> bool:
        if image.digest is None:
            return False
        async with self._lock:
            return await self._pulled(str(image.with_digest(image.digest)))

    async def prune(self) -> None:
        async with self._lock:
            await self._run(
                ["internals", "cleanup"], self.timeouts.unlock, "bootc internals cleanup"
            )

    async def _pulled(self, ref: str) -> bool:
        out = await self._run(LIST_ARGS, self.timeouts.status, "bootc internals image list")
        return listed(out.decode(errors="replace"), ref)

    async def _settled_status(self) -> BootcHost | None:
        """bootc's status, when no stage unit runs; None while one does: it may be replacing
        the staged deployment (a newer target), or be ours to adopt and follow."""
        if await self._stage.running():
            return None
        return await self._status()

    async def config_diff(self) -> str:
        """`ostree admin config-diff` of the booted deployment, run where bootc runs (behind
        the same prefix), so it sees the host's /etc. Kind `unsupported` with no ostree."""
        argv = [*self._prefix, self.ostree, "admin", "config-diff"]
        # GLib prints names as they are only under a UTF-8 locale (under C: `?` or
        # "[Invalid UTF-8]"); model/etc_drift.py reads the bytes back.
        env = {**self._direct_env(), "LC_ALL": "C.UTF-8"}
        try:
            result = await run_process(argv, self.timeouts.config_diff, env)
        except FileNotFoundError:
            raise HostError(f"no {self.ostree} on this host", kind="unsupported") from None
        stderr = result.stderr.decode(errors="replace").strip()
        if result.status is None:
            raise HostError(f"ostree admin config-diff timed out after "
                            f"{self.timeouts.config_diff:.0f} s", kind="timeout")  # fmt: skip
        if result.status != 0:
            raise HostError(f"ostree admin config-diff failed (exit {result.status}): "
                            f"{stderr[-300:]}", kind="other")  # fmt: skip
        return result.stdout.decode(errors="surrogateescape")

    async def cancel_stage(self) -> None:
        """Stop a running stage unit (the waiting `stage()` then raises kind `cancelled`)."""
        await self._stage.cancel()


def _staged_as_asked(status: BootcHost, digest: str, enforce: bool, locked: bool) -> bool:
    """Whether `digest` is staged, verified and locked as a stage asks. A deployment staged
    unverified does not do for a stage that must verify: bootc's spec includes the signature
    source, so that switch pulls and verifies again. Nor does an unlocked one for a locked
    stage."""
    staged = status.staged
    if staged is None or staged.image is None or staged.image.digest != digest:
        return False
    if locked and not status.staged_locked(digest):
        return False
    return staged.image.policy_enforced or not enforce


def _same_spec_unlocked(status: BootcHost, ref: str, enforce: bool) -> bool:
    """Whether `ref` is staged unlocked as the whole spec a switch to it would set: that
    switch would change nothing, so only `upgrade --download-only` can lock it."""
    staged = status.staged
    return (
        staged is not None
        and staged.image is not None
        and not staged.download_only
        and staged.image.image == ref
        and staged.image.policy_enforced == enforce
    )
