"""The host ports the engine drives, as Protocols, and the bundle that carries them.

The real host (`host/bootc.py`, `host/systemd.py`) implements these, and so can anything
else the agent is pointed at (a host without a machine, a test double); the engine never
reaches a host any other way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.core.trust import StageTrust
from agent.core.validate import FileFacts
from agent.model.bootc_caps import Capabilities
from agent.model.bootc_status import BootcHost
from agent.model.checks import CheckReport
from agent.model.ignition import Owner
from agent.model.imageref import ImageRef


@dataclass(frozen=True)
class Progress:
    """Staging progress, from bootc's `--progress-fd` events."""

    done_bytes: int = 0
    total_bytes: int = 0
    step: str = ""
    cached_bytes: int = 0  # of done_bytes, what was in the repository already (not fetched)

    def render(self) -> str:
        if self.total_bytes:
            mib = 1024 * 1024
            return f"Staging image: {self.done_bytes // mib}/{self.total_bytes // mib} MiB"
        return f"Staging image: {self.step}" if self.step else "Staging image"


ProgressCallback = Callable[[Progress], None]


class FilesPort(Protocol):
    """Allowlisted, atomic, symlink-safe file writes under the host root. Synchronous: the
    engine runs it in a worker thread."""

    def write(self, path: str, contents: bytes, *, mode: int, user: Owner, group: Owner) -> bool:
        """Atomic write; False, with nothing touched, when bytes, mode and owner match."""
        ...

    def ensure_dir(self, path: str, *, mode: int, user: Owner, group: Owner) -> None: ...

    def delete(self, path: str) -> bool:
        """Remove a file; False when there was none."""
        ...

    def read(self, path: str) -> bytes | None: ...

    def set_password_hash(self, user: str, password_hash: str) -> bool:
        """Set `user`'s hash in /etc/shadow; False when it is that hash already."""
        ...

    def mode_of(self, path: str) -> int | None: ...

    def inspect_kind(self, path: str) -> int | None:
        """lstat's st_mode of `path`, None when absent; nothing is read."""
        ...

    def list_dir(self, path: str) -> list[str]: ...

    def remove_dir(self, path: str) -> None: ...

    def inspect(self, path: str) -> FileFacts | None:
        """lstat of `path` and a regular file's bytes, for on-disk validation; None: absent."""
        ...

    def owner_ids(self, user: Owner, group: Owner) -> tuple[int, int] | None:
        """The numeric owner a write gives; None where writes set no owner."""
        ...


class BootcPort(Protocol):
    async def status(self) -> BootcHost: ...

    async def capabilities(self) -> Capabilities:
        """What this host's bootc accepts (model/bootc_caps.py), probed once."""
        ...

    async def stage(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        locked: bool = False,
        trust: StageTrust | None = None,
    ) -> int | None:
        """Pull and stage `image` (digest-pinned) for the next boot; never applies it. Returns
        the bytes fetched from the registry (0 when the image was in the repository already,
        None when bootc did not say), at once when a deployment of that digest is staged
        already. Staging runs at low priority (idle I/O, low CPU weight). `locked`: the
        deployment is download-only (`--download-only`), so an ordinary reboot discards it
        instead of booting it; a bootc that cannot lock raises HostError kind `unsupported`
        before pulling anything. Unlocked, it is an ordinary staged deployment, which the next
        reboot of any kind boots: the caller says which it needs. `trust`
        (core/trust.py): verify the image's signatures against the host's policy; a refusal or
        a failed verification raises HostError kind `signature` before the image is staged."""
        ...

    async def pull(
        self,
        image: ImageRef,
        on_progress: ProgressCallback | None = None,
        *,
        trust: StageTrust | None = None,
    ) -> None:
        """Pre-pull: fetch `image` (digest-pinned) into the booted sysroot's repository and
        stage nothing, so no reboot of any kind can boot it; a later `stage()` of the same
        reference fetches no layer. HostError kind `unsupported` when this bootc cannot; `trust`
        as for stage() (the pull verifies what the stage would)."""
        ...

    async def prune(self) -> None:
        """Drop every image no deployment uses from the repository (`bootc internals
        cleanup`), so that the next stage fetches, and verifies, what it stages."""
        ...

    async def pulled(self, image: ImageRef) -> bool:
        """Whether `image` (digest-pinned) is in the repository now. Any staging prunes what no
        deployment uses, so a pre-pull is checked again before it is relied on."""
        ...

    async def check_update(self, image: ImageRef) -> str:
        """The digest the tag `image` points to now, as bootc would pull it (`bootc upgrade
        --check`; model/bootc_check.py). HostError kind `unsupported` when this bootc cannot
        check that tag; the registry's errors as stage() classifies them."""
        ...

    async def cancel_stage(self) -> None:
        """Stop a stage running in the background, if any (its stage() raises `cancelled`)."""
        ...

    async def rollback(self) -> None:
        """Queue the rollback deployment for the next boot (callers check `rollbackQueued`)."""
        ...

    async def unlock_staged(self, *, soft: bool = False) -> bool:
        """At the reboot slot: make a download-only staged deployment apply at the next boot
        (and prepare a soft reboot when `soft`). Returns whether bootc was asked anything."""
        ...

    async def config_diff(self) -> str:
        """What `ostree admin config-diff` prints for the booted deployment: the live /etc
        against the image's defaults in /usr/etc (model/etc_drift.py parses it). HostError
        kind `unsupported` where the host has no ostree to ask."""
        ...


class TagResolving(Protocol):
    async def resolve(self, image: ImageRef) -> str:
        """The per-architecture digest the tag `image` points to, as bootc would pull it."""
        ...

    async def instance(self, image: ImageRef) -> str:
        """The per-architecture digest of a digest-pinned `image` (itself unless it names a
        manifest list)."""
        ...


class SystemPort(Protocol):
    async def boot_id(self) -> str: ...

    async def perform(self, action: str) -> None:
        """A follow-up action as `Plan` renders it: `restart X`, `reload X`, `daemon-reload`,
        `update-ca-trust`."""
        ...

    async def reboot(self, *, soft: bool = False) -> None:
        """Ask for a reboot. Returns once it is requested; the process ends with the boot."""
        ...

    async def unit_file_state(self, name: str) -> str:
        """The unit file's state in `systemctl is-enabled`'s words (`enabled`, `disabled`,
        `masked`, `static`, ..., `not-found` for no such unit)."""
        ...


class HealthPort(Protocol):
    async def run_checks(self) -> CheckReport: ...


@dataclass
class Host:
    """Everything the engine may touch on one host."""

    root: Path
    files: FilesPort
    bootc: BootcPort
    system: SystemPort
    health: HealthPort
    state_dir: Path = field(default=Path())
    # On a host without a machine a reboot ends the agent process (its next start is the next
    # boot); on a real host the agent waits for the shutdown to stop it, so nothing restarts
    # it mid-reboot.
    reboot_ends_process: bool = False

    def __post_init__(self) -> None:
        if self.state_dir == Path():
            self.state_dir = self.root / "var/lib/image-mode-agent"
