"""Durable small files: temp file + fsync + rename + directory fsync.

A write that fails at any point before the rename (a short write, a full disk, an fsync
error) leaves the previous file whole and removes its temporary file: readers only ever see
the old document or the new one, never a part of either."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from agent.errors import HostError


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def write_record(path: Path, data: bytes, what: str) -> None:
    """`write_atomic` for the agent's own records (journal, recorded configs): a failure is
    HostError kind `journal` naming `what`, the file and the system's reason, so the pass
    reports Degraded and tries again, the previous record still in place."""
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise HostError(f"cannot write the {what} {path}: {exc.strerror or exc}",
                        kind="journal") from None  # fmt: skip


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any | None:
    """The JSON value in `path`, or None when the file does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return json.loads(data)
