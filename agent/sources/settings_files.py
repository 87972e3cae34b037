"""Standalone-mode settings from TOML drop-in directories, the way Zincati and systemd read
theirs: `*.toml` files from every directory, merged by file name, a later directory's file
replacing an earlier one of the same name, a symlink to /dev/null masking it."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.errors import InputError
from agent.model.settings import (
    FollowSettings,
    apply_overrides,
    check_settings,
    merge_fragments,
    parse_fragment,
    settings_from,
)

# Vendor defaults, then the administrator's, then the runtime's (not kept across reboots).
DEFAULT_DIRS = (
    "/usr/lib/image-mode-agent/config.d",
    "/etc/image-mode-agent/config.d",
    "/run/image-mode-agent/config.d",
)
SUFFIX = ".toml"
# A settings fragment is a few hundred bytes; the cap stops a mistaken path (a disk image, a
# log) from being read into memory whole.
MAX_FRAGMENT_BYTES = 1024 * 1024
_MASK = "/dev/null"


def find_fragments(dirs: Sequence[Path | str]) -> list[Path]:
    """The fragments to read, in merge order (by file name). A missing directory holds none;
    one that cannot be listed is an InputError, as reading without it could apply settings
    its files were meant to override."""
    chosen: dict[str, Path | None] = {}  # None: masked
    for directory in dirs:
        for name, path in _entries(Path(directory)):
            if _masks(path):
                chosen[name] = None
            elif _is_file(path):
                chosen[name] = path
    # Byte order, as Zincati and systemd sort, for names that are not UTF-8 too.
    return [chosen[name] for name in sorted(chosen, key=os.fsencode) if chosen[name] is not None]


def _entries(directory: Path) -> list[tuple[str, Path]]:
    try:
        with os.scandir(directory) as listing:
            names = [entry.name for entry in listing]
    except FileNotFoundError:
        return []
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InputError(f"cannot list directory: {reason}", source=str(directory)) from None
    # Hidden names are editors' and package managers' leftovers (.foo.toml.swp, .#foo.toml).
    return [(n, directory / n) for n in names if n.endswith(SUFFIX) and not n.startswith(".")]


def _masks(path: Path) -> bool:
    return path.is_symlink() and os.path.realpath(path) == _MASK


def _is_file(path: Path) -> bool:
    # Follows symlinks; a directory, a device or a dangling link is no fragment.
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise InputError(f"cannot inspect: {exc.strerror or exc}", source=str(path)) from None


def read_fragment(path: Path) -> bytes:
    """The bytes of one fragment; InputError naming it if it cannot be read, is no longer a
    regular file, or is larger than MAX_FRAGMENT_BYTES."""
    try:
        # O_NONBLOCK: a file swapped for a FIFO since it was listed must not hang the agent.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    with os.fdopen(fd, "rb") as file:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError("cannot read: not a regular file", source=str(path))
            data = file.read(MAX_FRAGMENT_BYTES + 1)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    if len(data) > MAX_FRAGMENT_BYTES:
        raise InputError(
            f"larger than {MAX_FRAGMENT_BYTES // 1024} KiB: not a settings fragment",
            source=str(path),
        )
    return data


def load_settings(dirs: Sequence[Path | str] = DEFAULT_DIRS, **overrides: Any) -> FollowSettings:
    """Settings from the fragments in `dirs`, then the command-line `overrides` (see
    `agent.model.settings.apply_overrides`), checked as a whole. Every fragment is read and
    parsed before any is used: one bad file is an InputError naming it, and nothing applies."""
    paths = find_fragments(dirs)
    parsed = [(str(path), parse_fragment(read_fragment(path), str(path))) for path in paths]
    settings = settings_from(merge_fragments(parsed), [source for source, _ in parsed])
    return check_settings(apply_overrides(settings, **overrides))
