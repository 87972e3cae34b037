"""Following a tag with `bootc upgrade --check` (pure): which command asks bootc where a tag
points, and what its answer means.

bootc (crates/lib/src/cli.rs `upgrade`) checks the host's spec image, or with `--tag TAG`
(bootc >= 1.15) the same repository under another tag. It prints `Update available for: REF`
then `  Version: V` and `  Digest: sha256:...` when the tag's manifest differs from the one
stored under that name, and `No changes in: REF` when it is the same; exit 0 either way. With
a stored image under that name it also records the manifest as `status.booted.cachedUpdate`.
The agent stages digests (`name@sha256:...`), so the spec loses its tag and the check names
the tag explicitly."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import HostError, InputError
from agent.model.bootc_status import BootcHost
from agent.model.imageref import ImageRef, parse_image_ref

_DIGEST_LINE = re.compile(r"^\s*Digest:\s*(sha256:[0-9a-f]{64})\s*$", re.M)
_VERSION_LINE = re.compile(r"^\s*Version:\s*(\S.*?)\s*$", re.M)
_UPDATE = re.compile(r"^Update available for:", re.M)
_UNCHANGED = re.compile(r"^No changes in:", re.M)


@dataclass(frozen=True)
class CheckAnswer:
    digest: str | None  # the tag's manifest digest when bootc printed one
    version: str | None = None
    unchanged: bool = False  # "No changes in": the tag points at the image stored under it


def check_argv(spec_image: str | None, followed: ImageRef, has_tag_flag: bool) -> list[str]:
    """The `bootc upgrade --check` arguments that ask where `followed` points; HostError kind
    `unsupported` when this bootc cannot tell (another repository, or no `--tag`)."""
    if followed.tag is None or followed.digest is not None:
        raise HostError(f"{followed} is not a tag to follow", kind="input")
    try:
        spec = parse_image_ref(spec_image) if spec_image else None
    except InputError:
        spec = None
    if spec is None:
        raise HostError(
            f"cannot follow {followed}: bootc reports no image this host was installed from "
            f"(spec.image {spec_image!r}); move it once with `bootc switch {followed}`",
            kind="unsupported",
        )
    if spec.name != followed.name:
        raise HostError(
            f"cannot follow {followed}: bootc checks for updates only in the repository the "
            f"host runs ({spec.name}); move it once with `bootc switch {followed}`",
            kind="unsupported",
        )
    if spec.tag == followed.tag and spec.digest is None:
        return ["upgrade", "--check"]
    if not has_tag_flag:
        raise HostError(
            f"cannot follow {followed}: the host's spec is {spec_image} and this bootc has no "
            "`bootc upgrade --tag` (bootc >= 1.15) to check another tag of it",
            kind="unsupported",
        )
    return ["upgrade", "--check", "--tag", followed.tag]


def parse_check_output(text: str) -> CheckAnswer:
    """What `bootc upgrade --check` printed on stdout; InputError for anything else."""
    if _UPDATE.search(text):
        digest = _DIGEST_LINE.search(text)
        if digest is None:
            raise InputError("bootc upgrade --check named an update but printed no digest")
        version = _VERSION_LINE.search(text)
        return CheckAnswer(digest.group(1), version.group(1) if version else None)
    if _UNCHANGED.search(text):
        return CheckAnswer(None, unchanged=True)
    first = text.strip().splitlines()[0][:200] if text.strip() else "(nothing)"
    raise InputError(f"unexpected output of bootc upgrade --check: {first}")


def unchanged_digest(status: BootcHost, followed: ImageRef) -> str | None:
    """After "No changes in": the tag points at the image stored under its name, i.e. the
    staged or booted deployment whose image is exactly `followed` (else None)."""
    for entry in (status.staged, status.booted):
        if entry is not None and entry.image is not None and entry.image.image == str(followed):
            return entry.image.digest
    return None
