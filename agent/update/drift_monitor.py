"""The config drift monitor: inotify on the parent directories of what a validation checked,
and a call back (debounced) when a tracked path in them changes, so the caller validates again
within a second of an edit instead of at its next start (the MCD's config drift monitor,
docs/mco-protocol.md §10).

Tracked: the files the live part writes, the unit names in systemd's unit directories (a mask
or an enablement link appearing or going) and the image's own /etc files (those /usr/etc
ships). Events on other names in the same directories are ignored; lost events (a queue
overflow) and a watched directory that goes away count as a change. The caller stops the
monitor while an update runs, so the agent's own writes are never taken for drift."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

import structlog

from agent.core.validate import Expectations
from agent.errors import HostError
from agent.host.inotify import DirectoryWatch, DirEvent
from agent.model.etc_drift import ignored

UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system")
_LINK_DIRS = (".wants", ".requires")


def image_etc_files(root: Path, ignore: Iterable[str], skip: Iterable[str]) -> list[str]:
    """The /etc paths the booted image ships (its /usr/etc, as ostree keeps the defaults),
    less the ignored ones and `skip`."""
    base = root / "usr/etc"
    patterns, skipped = tuple(ignore), frozenset(skip)
    found = []
    for folder, dirs, files in os.walk(base):  # never follows a link out of the tree
        for name in (*files, *(d for d in dirs if (Path(folder) / d).is_symlink())):
            path = "/etc/" + str(Path(folder, name).relative_to(base))
            if path not in skipped and not ignored(path, patterns):
                found.append(path)
    return sorted(found)


class DriftMonitor:
    def __init__(self, root: Path, on_change: Callable[[], None], *,
                 debounce: float = 0.05) -> None:  # fmt: skip
        self.root = Path(root)
        self.on_change = on_change
        self.debounce = debounce
        self._task: asyncio.Task[None] | None = None
        self._fire: asyncio.TimerHandle | None = None
        self._names: dict[Path, set[str]] = {}
        self._units: frozenset[str] = frozenset()
        self.log = structlog.get_logger("drift")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def start(self, expected: Expectations, etc_files: Iterable[str] = ()) -> None:
        """Watch what `expected` and `etc_files` name (restarting a running monitor)."""
        self.stop_now()
        names: dict[Path, set[str]] = {}
        for path in (*expected.paths, *etc_files):
            pure = PurePosixPath(path)
            names.setdefault(self._host(str(pure.parent)), set()).add(pure.name)
        self._units = frozenset(u.name for u in expected.units)
        if self._units:
            for folder in UNIT_DIRS:
                names.setdefault(self._host(folder), set())
        self._names = names
        # Armed before this returns, so a change made while the caller validates is seen.
        watch = DirectoryWatch()
        try:
            armed = self._arm(watch)
        except HostError as exc:  # a watch limit: say so, and keep validating at each pass
            watch.close()
            self.log.warning("config drift monitor not started", error=str(exc))
            return
        self.log.info("config drift monitor started", directories=armed)
        self._task = asyncio.create_task(self._run(watch), name="drift-monitor")

    def stop_now(self) -> None:
        if self._fire is not None:
            self._fire.cancel()
            self._fire = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        task = self._task
        self.stop_now()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _arm(self, watch: DirectoryWatch) -> int:
        armed = 0
        for folder in list(self._names):
            armed += watch.add(folder)
            if self._units and str(folder).endswith(UNIT_DIRS):
                for entry in _subdirs(folder):
                    if entry.name.endswith(_LINK_DIRS) and watch.add(entry):
                        self._names.setdefault(entry, set())
        return armed

    def _tracked(self, event: DirEvent) -> bool:
        if event.overflow or event.gone:
            return True
        if event.name in self._units:
            return True
        return event.name in self._names.get(event.directory, ())

    async def _run(self, watch: DirectoryWatch) -> None:
        with watch:
            async for event in watch.events():
                if event.is_dir and event.name.endswith(_LINK_DIRS) and self._units:
                    # A new `.wants/` directory: `systemctl enable` makes one on demand.
                    watch.add(event.directory / event.name)
                    self._names.setdefault(event.directory / event.name, set())
                if self._tracked(event):
                    self._schedule()

    def _schedule(self) -> None:
        if self._fire is None:
            loop = asyncio.get_running_loop()
            self._fire = loop.call_later(self.debounce, self._fired)

    def _fired(self) -> None:
        self._fire = None
        self.on_change()


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [entry for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return []
