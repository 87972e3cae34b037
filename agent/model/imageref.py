"""Container image references: `registry[:port]/path[:tag][@sha256:<64 hex>]`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import InputError

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REGISTRY = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9-]+)*(?::[0-9]+)?"
)
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# A registry host (253), a repository path (255), a tag (128) and a digest (71) fit well within.
MAX_LENGTH = 1024


@dataclass(frozen=True)
class ImageRef:
    registry: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.path}"

    def __str__(self) -> str:
        text = self.name
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.path, None, digest)

    def same_image(self, other: ImageRef | None) -> bool:
        """Two references name the same image: equal digests, or equal text when unpinned."""
        if other is None:
            return False
        if self.digest and other.digest:
            return self.digest == other.digest
        return str(self) == str(other)


def parse_image_ref(text: str) -> ImageRef:
    """Parse and validate a reference; raises InputError naming what is wrong."""
    if not isinstance(text, str) or not text:
        raise InputError("image reference is empty")
    if len(text) > MAX_LENGTH:
        raise InputError(
            f"image reference is too long ({len(text)} characters, at most {MAX_LENGTH})"
        )
    if any(ch.isspace() for ch in text):
        raise InputError(f"image reference {text!r} contains whitespace")
    rest, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise InputError(f"image reference {text!r}: digest must be sha256:<64 lowercase hex>")
    registry, slash, path = rest.partition("/")
    if not slash or not path:
        raise InputError(f"image reference {text!r}: expected registry[:port]/path")
    if not _REGISTRY.fullmatch(registry):
        raise InputError(f"image reference {text!r}: invalid registry {registry!r}")
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG.fullmatch(tag):
            raise InputError(f"image reference {text!r}: invalid tag {tag!r}")
    for component in path.split("/"):
        if not _PATH_COMPONENT.fullmatch(component):
            raise InputError(f"image reference {text!r}: invalid path component {component!r}")
    return ImageRef(registry, path, tag, digest or None)
