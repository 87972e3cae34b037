"""Where a tag points, as bootc would pull it, for hosts whose bootc has no `upgrade --tag`
(< 1.15; docs/bootc-releases.md §11).

`skopeo inspect --raw (--authfile F | --no-creds) docker://NAME:TAG` prints the tag's manifest
exactly as the registry serves it; agent/model/manifest.py turns it into the digest bootc
records as `imageDigest` (a list's instance for linux/<this machine>, never the list's own
digest: docs/bootc-releases.md §7, §11). Never `skopeo inspect`'s `.Digest`: that is the
top-level manifest's.

- Credentials: bootc reads the first existing of /run/ostree/auth.json, /etc/ostree/auth.json,
  /usr/lib/ostree/auth.json and otherwise goes anonymous; it never reads
  /run/containers/0/auth.json, ~/.docker/config.json or REGISTRY_AUTH_FILE
  (docs/bootc-releases.md §11). So does this: always `--authfile` or `--no-creds`. The files are
  looked up under `host_root` (the host's / as the agent sees it) and passed as host paths.
- Everything else (registries.conf mirrors, certs.d) is the host's as long as skopeo runs in
  the host's mount namespace: in a pod, pass `command_prefix` (nsenter), as for bootc.
- The platform: skopeo's containers/image wants its own GOARCH, and on ARM the variant from
  /proc/cpuinfo; `arch` overrides both (then `variant` is only what is given, as with
  containers/image's ArchitectureChoice)."""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.errors import HostError, InputError
from agent.host import bootc_errors
from agent.host.units import run_process
from agent.model.imageref import ImageRef
from agent.model.manifest import UnsupportedManifest, cpu_variant, go_arch, image_digest

# bootc's order (ostree-ext globals.rs): the first that exists wins.
AUTH_FILES = ("/run/ostree/auth.json", "/etc/ostree/auth.json", "/usr/lib/ostree/auth.json")
# nsenter (util-linux errexec) and shells exit 127 when the command is not there.
_NOT_FOUND = 127
_MAX_LINKS = 40


class TagResolver:
    """Resolve `NAME:TAG` to the digest bootc would stage for it on this host."""

    def __init__(
        self,
        *,
        skopeo: str = "skopeo",
        command_prefix: Sequence[str] = (),
        host_root: Path = Path("/"),
        arch: str | None = None,
        variant: str | None = None,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        cpuinfo: Path = Path("/proc/cpuinfo"),
    ) -> None:
        self.skopeo = skopeo
        self._prefix = list(command_prefix)
        self._host_root = Path(host_root)
        self._arch = arch
        self._variant = variant
        self.timeout = timeout
        self._env = dict(env or {})
        self._cpuinfo = Path(cpuinfo)

    def auth_file(self) -> str | None:
        """The host path of the auth file bootc would use, None for anonymous access."""
        for path in AUTH_FILES:
            if self._exists_on_host(path):
                return path
        return None

    def host_platform(self) -> tuple[str, str]:
        """(GOARCH, variant) that skopeo on this host matches a manifest list against."""
        if self._arch is not None:
            return self._arch, self._variant or ""
        try:
            arch, variant = go_arch(platform.machine())
        except InputError as exc:
            raise HostError(f"cannot resolve tags here: {exc}", kind="unsupported") from None
        if arch in ("arm", "arm64"):
            # Unreadable: containers/image would find no variant; the machine name's is close.
            with contextlib.suppress(OSError):
                variant = cpu_variant(self._cpuinfo.read_text(errors="replace"))
        return arch, variant if self._variant is None else self._variant

    def argv(self, image: ImageRef) -> list[str]:
        """The command that prints the tag's manifest."""
        auth = self.auth_file()
        creds = ["--authfile", auth] if auth else ["--no-creds"]
        return [*self._prefix, self.skopeo, "inspect", "--raw", *creds, f"docker://{image}"]

    async def resolve(self, image: ImageRef) -> str:
        """The `sha256:...` digest bootc would record as `imageDigest` if it pulled `image`
        (a tag) now. HostError kinds: `input` (not a tag), `registry-auth`, `image-missing`,
        `other` (from skopeo's stderr, as for bootc), `timeout`, `unsupported` (no instance
        for this platform, a manifest bootc cannot deploy, no skopeo)."""
        if image.tag is None or image.digest is not None:
            raise HostError(f"{image} is not a tag to resolve", kind="input")
        return await self._digest_of(image)

    async def instance(self, image: ImageRef) -> str:
        """For a digest-pinned `image`: the digest bootc records when it pulls it, which is
        the host architecture's instance when that digest names a manifest list or an OCI
        index (docs/bootc-releases.md §7, "Multi-arch images"), else the digest itself. Same
        HostError kinds as resolve()."""
        if image.digest is None:
            raise HostError(f"{image} is not pinned by digest", kind="input")
        return await self._digest_of(image.with_digest(image.digest))

    async def _digest_of(self, image: ImageRef) -> str:
        arch, variant = self.host_platform()
        argv = self.argv(image)
        what = f"skopeo inspect docker://{image}"
        try:
            result = await run_process(argv, self.timeout, {**os.environ, **self._env})
        except (FileNotFoundError, PermissionError) as exc:
            raise _no_skopeo(what, str(exc)) from None
        stderr = result.stderr.decode(errors="replace")
        if result.status is None:
            raise HostError(f"{what} timed out after {self.timeout:g}s", kind="timeout")
        if result.status == _NOT_FOUND:
            raise _no_skopeo(what, bootc_errors.error_lines(stderr))
        if result.status != 0:
            error = bootc_errors.failure(what, stderr, result.status)
            raise HostError(f"{what}: {error}", kind=error.kind)
        try:
            return image_digest(result.stdout, arch=arch, variant=variant)
        except UnsupportedManifest as exc:
            raise HostError(f"{image}: {exc}", kind="unsupported") from None
        except InputError as exc:
            raise HostError(f"{image}: unreadable manifest: {exc}", kind="other") from None

    def _exists_on_host(self, path: str) -> bool:
        """Whether `path` exists on the host. An absolute symlink (auth.json -> /run/...)
        points into the host's /, which is `host_root` here, not the agent's /."""
        local = self._host_root / path.lstrip("/")
        for _ in range(_MAX_LINKS):
            try:
                target = os.readlink(local)
            except OSError:  # not a link, or not there
                break
            base = self._host_root if target.startswith("/") else local.parent
            local = base / target.lstrip("/")
        try:
            return local.exists()
        except OSError:
            return True  # there but unreadable: bootc would fail on it too; let skopeo say so


def _no_skopeo(what: str, detail: str) -> HostError:
    return HostError(
        f"{what}: skopeo is not available ({detail}); bootc < 1.15 needs it to follow a tag",
        kind="unsupported",
    )
