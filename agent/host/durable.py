"""Durable small files: temp file + fsync + rename + directory fsync."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def write_json(path: Path, value: Any) -> None:
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any | None:
    """The JSON value in `path`, or None when the file does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return json.loads(data)
