"""Desired state from a MachineConfig document on disk, noticed when it changes."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from agent.core.desired import Desired
from agent.errors import InputError
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import parse_machine_config


def load_desired(path: Path, image_override: str | None = None) -> Desired:
    """Read PATH; the target image is the override if given, else `spec.osImageURL`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    except ValueError:  # a NUL in the path
        raise InputError("cannot read: not a valid path", source=repr(str(path))) from None
    try:
        config = parse_machine_config(data, default_name=path.stem)
    except InputError as exc:
        raise exc.located(str(path)) from None
    target: ImageRef | None = None
    text, field = (image_override, "--image") if image_override else (config.os_image_url, "")
    if text:
        try:
            target = parse_image_ref(text)
        except InputError as exc:
            raise InputError(
                exc.message, source=str(path), field=field or "spec.osImageURL"
            ) from None
    return Desired(config, data, target)


@dataclass
class FileWatch:
    """Tells when a file changed. A stat() per interval: the file is one small document, and
    this works the same on every filesystem, including bind mounts into pods."""

    path: Path
    interval: float = 1.0

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def mark(self) -> tuple[int, int, int] | None:
        return self._signature()

    async def changed_since(
        self, seen: tuple[int, int, int] | None, timeout: float | None = None
    ) -> bool:
        """Wait until the file differs from `seen`; False when `timeout` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._signature() == seen:
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(self.interval)
        return True
