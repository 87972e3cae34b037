"""Directory change events from Linux inotify, for the config drift monitor.

The drift monitor watches the parent directories of a few dozen managed files and re-validates
when something in them changes; watching directories rather than files is what lets it see an
atomic replace (a rename over the target) and a file that is deleted and put back. This uses
the standard library only (ctypes for the three syscalls, `loop.add_reader` for readiness), as
the issue asks: "a small, maintained library only if the standard library cannot".
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import HostError

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000

WATCH_MASK = (IN_CREATE | IN_DELETE | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM
              | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)  # fmt: skip
_GONE = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF
_HEADER = struct.Struct("=iIII")  # wd, mask, cookie, len: native order, no padding
# The kernel returns whole events only, each at most 16 + NAME_MAX + 1 bytes: 64 KiB drains
# a busy queue in a few reads and can never be too small (EINVAL).
_READ_SIZE = 65536


@dataclass(frozen=True)
class DirEvent:
    """One change in `directory`; `name` is the entry it concerns ("" for the directory)."""

    directory: Path
    name: str
    mask: int

    @property
    def overflow(self) -> bool:  # events were lost: the caller must re-check everything
        return bool(self.mask & IN_Q_OVERFLOW)

    @property
    def gone(self) -> bool:  # deleted, moved away or unmounted: no longer watched
        return bool(self.mask & _GONE)

    @property
    def is_dir(self) -> bool:  # the entry `name` is a directory
        return bool(self.mask & IN_ISDIR)


def parse_events(buffer: bytes) -> list[tuple[int, int, int, str]]:
    """`(wd, mask, cookie, name)` for each `struct inotify_event` in one read's buffer."""
    events: list[tuple[int, int, int, str]] = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        wd, mask, cookie, length = _HEADER.unpack_from(buffer, offset)
        offset += _HEADER.size
        raw = buffer[offset : offset + length].split(b"\0", 1)[0]  # NUL-padded to alignment
        offset += length
        # fsdecode: a name that is not UTF-8 survives as surrogates and still maps back to
        # the same bytes with os.fsencode.
        events.append((wd, mask, cookie, os.fsdecode(raw)))
    return events


def _load_libc() -> Any:
    # A CDLL of its own per watch: the argtypes set here are not shared with other users.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # the reader can fire again before the waiting task has run
        waiter.set_result(None)


class DirectoryWatch:
    """One inotify instance watching directories; one consumer of `events()` at a time."""

    def __init__(self) -> None:
        self._libc: Any = None
        self._fd = -1
        self._closed = False
        self._paths: dict[int, Path] = {}  # wd -> directory
        self._wds: dict[Path, int] = {}  # directory -> wd
        self._waiter: asyncio.Future[None] | None = None

    def open(self) -> None:
        if self._closed:
            raise ValueError("DirectoryWatch is closed")
        if self._fd >= 0:
            return
        self._libc = _load_libc()
        # IN_NONBLOCK and IN_CLOEXEC are the O_ flags, whose values differ between arches.
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            if err == errno.EMFILE:
                raise HostError("too many inotify instances (fs.inotify.max_user_instances) "
                                "or open files", kind="inotify")  # fmt: skip
            raise HostError(f"inotify_init1: {os.strerror(err)}", kind="inotify")
        self._fd = fd

    def add(self, directory: Path) -> bool:
        """Watch `directory`; False when it does not exist or is not a directory."""
        self.open()
        directory = Path(directory)
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                return False
            if err == errno.ENOSPC:
                raise HostError(f"cannot watch {directory}: inotify watch limit reached "
                                "(fs.inotify.max_user_watches)", kind="inotify")  # fmt: skip
            raise HostError(f"cannot watch {directory}: {os.strerror(err)}", kind="inotify")
        # The same wd back means the same directory (again, or under another name); a new wd
        # for a known name means the name now holds another directory: drop the stale watch.
        if self._paths.get(wd, directory) != directory:
            self._wds.pop(self._paths[wd], None)
        stale = self._wds.get(directory)
        if stale is not None and stale != wd:
            self._drop(stale)
        self._paths[wd] = directory
        self._wds[directory] = wd
        return True

    def remove(self, directory: Path) -> None:
        if (wd := self._wds.get(Path(directory))) is not None:
            self._drop(wd)

    @property
    def watched(self) -> set[Path]:
        return set(self._wds)

    async def events(self) -> AsyncIterator[DirEvent]:
        """Events as they come, until `close()`."""
        if self._closed:
            return
        self.open()
        while self._fd >= 0:
            try:
                buffer = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                await self._readable()
                continue
            for wd, mask, _cookie, name in parse_events(buffer):
                if self._fd < 0:  # closed while the consumer handled an earlier event
                    return
                event = self._translate(wd, mask, name)
                if event is not None:
                    yield event

    def close(self) -> None:
        self._closed = True
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        if self._waiter is not None:
            # Unregister before closing, so the selector never holds a dead (or reused) fd;
            # then wake the waiting task, which finds the watch closed and returns.
            self._waiter.get_loop().remove_reader(fd)
            _wake(self._waiter)
        os.close(fd)
        self._paths.clear()
        self._wds.clear()

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def _readable(self) -> None:
        # The reader is registered only while waiting: level-triggered, it would otherwise
        # fire on every loop iteration while the consumer is busy with the events it has.
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        fd = self._fd
        loop.add_reader(fd, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if self._fd == fd:  # close() has already unregistered it otherwise
                loop.remove_reader(fd)

    def _translate(self, wd: int, mask: int, name: str) -> DirEvent | None:
        if wd == -1:  # IN_Q_OVERFLOW belongs to no watch
            return DirEvent(Path(""), name, mask)
        directory = self._paths.get(wd)
        if directory is None:  # removed, or already reported gone: the rest is its tail
            return None
        if mask & _GONE:
            # Forget it now, so a caller may add the directory again at once. After a move
            # the kernel would go on watching the moved directory under its old name.
            self._drop(wd)
        return DirEvent(directory, name, mask)

    def _drop(self, wd: int) -> None:
        directory = self._paths.pop(wd, None)
        if directory is not None and self._wds.get(directory) == wd:
            del self._wds[directory]
        if self._fd >= 0:
            # EINVAL when the kernel has dropped it already (deleted, IN_IGNORED): nothing to
            # undo. wds are allocated cyclically, so this one is not another watch's yet.
            self._libc.inotify_rm_watch(self._fd, wd)
