"""The inotify directory watch, on real directories: what the drift monitor relies on seeing."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.errors import HostError
from agent.host import inotify
from agent.host.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    DirectoryWatch,
    DirEvent,
    parse_events,
)

Done = Callable[[list[DirEvent]], bool]


async def collect(watch: DirectoryWatch, done: Done) -> list[DirEvent]:
    """Events until `done(seen)`, failing the test after 5 s rather than hanging."""
    seen: list[DirEvent] = []

    async def run() -> list[DirEvent]:
        async with aclosing(watch.events()) as events:
            async for event in events:
                seen.append(event)
                if done(seen):
                    return seen
        raise AssertionError(f"iteration ended early: {seen}")

    return await asyncio.wait_for(run(), 5)


def saw(name: str, flag: int) -> Done:
    return lambda seen: any(e.name == name and e.mask & flag for e in seen)


@pytest.fixture
def watch():
    with DirectoryWatch() as w:
        yield w


async def test_new_file_reports_create_and_close_write(tmp_path: Path, watch) -> None:
    assert watch.add(tmp_path)
    (tmp_path / "a.conf").write_text("x=1\n")
    seen = await collect(watch, saw("a.conf", IN_CLOSE_WRITE))
    assert saw("a.conf", IN_CREATE)(seen)
    assert {e.directory for e in seen} == {tmp_path}
    assert not any(e.is_dir or e.gone or e.overflow for e in seen)


async def test_atomic_replace_reports_moved_to_with_the_target_name(tmp_path, watch) -> None:
    (tmp_path / "a.conf").write_text("old\n")
    assert watch.add(tmp_path)
    (tmp_path / ".a.conf.tmp").write_text("new\n")
    os.rename(tmp_path / ".a.conf.tmp", tmp_path / "a.conf")
    seen = await collect(watch, saw("a.conf", IN_MOVED_TO))
    assert saw(".a.conf.tmp", IN_MOVED_FROM)(seen)


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        pytest.param(lambda f, away: os.chmod(f, 0o600), IN_ATTRIB, id="chmod"),
        pytest.param(lambda f, away: os.utime(f), IN_ATTRIB, id="touch"),
        pytest.param(lambda f, away: os.unlink(f), IN_DELETE, id="delete"),
        pytest.param(lambda f, away: os.rename(f, away / "a.conf"), IN_MOVED_FROM, id="rename"),
    ],
)
async def test_changes_to_an_existing_file(tmp_path: Path, watch, change, flag) -> None:
    watched, away = tmp_path / "etc", tmp_path / "elsewhere"
    watched.mkdir()
    away.mkdir()
    (watched / "a.conf").write_text("x=1\n")
    assert watch.add(watched)
    change(watched / "a.conf", away)
    seen = await collect(watch, saw("a.conf", flag))
    assert seen[-1].directory == watched


async def test_a_new_subdirectory_is_dir(tmp_path: Path, watch) -> None:
    assert watch.add(tmp_path)
    (tmp_path / "sub").mkdir()
    seen = await collect(watch, saw("sub", IN_CREATE))
    assert seen[-1].is_dir


def test_add_is_false_for_a_missing_directory_or_a_file(tmp_path: Path, watch) -> None:
    (tmp_path / "file").write_text("")
    assert watch.add(tmp_path / "missing") is False
    assert watch.add(tmp_path / "file") is False
    assert watch.watched == set()
    assert watch.add(tmp_path) and watch.add(tmp_path)  # twice is harmless
    assert watch.watched == {tmp_path}


async def test_a_deleted_directory_is_gone_and_can_be_watched_again(tmp_path, watch) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    assert watch.add(etc)
    etc.rmdir()
    seen = await collect(watch, lambda seen: any(e.gone for e in seen))
    assert [e.directory for e in seen if e.gone] == [etc]
    assert watch.watched == set()
    etc.mkdir()
    assert watch.add(etc)
    (etc / "a.conf").write_text("")
    seen = await collect(watch, saw("a.conf", IN_CLOSE_WRITE))
    assert {e.directory for e in seen} == {etc}
    assert not any(e.gone for e in seen)  # the old watch's IN_IGNORED, queued first, is dropped


async def test_remove_stops_one_directory_only(tmp_path: Path, watch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    assert watch.add(one) and watch.add(two)
    watch.remove(one)
    watch.remove(one)  # not watched any more: no error
    watch.remove(tmp_path / "never")
    assert watch.watched == {two}
    (one / "a.conf").write_text("")
    (two / "b.conf").write_text("")  # queued after a.conf's events, had there been any
    seen = await collect(watch, saw("b.conf", IN_CLOSE_WRITE))
    assert {e.directory for e in seen} == {two}
    assert not any(e.gone for e in seen)  # the IN_IGNORED for `one` is not reported


async def test_two_watches_are_independent(tmp_path: Path) -> None:
    with DirectoryWatch() as first, DirectoryWatch() as second:
        assert first.add(tmp_path) and second.add(tmp_path)
        (tmp_path / "a.conf").write_text("")
        for w in (first, second):
            await collect(w, saw("a.conf", IN_CLOSE_WRITE))
        first.close()
        assert second.watched == {tmp_path}
        (tmp_path / "b.conf").write_text("")
        await collect(second, saw("b.conf", IN_CLOSE_WRITE))


async def test_close_from_another_task_ends_iteration(tmp_path: Path) -> None:
    watch = DirectoryWatch()
    assert watch.add(tmp_path)
    first = asyncio.Event()
    seen: list[DirEvent] = []

    async def consume() -> None:
        async for event in watch.events():
            seen.append(event)
            first.set()

    task = asyncio.create_task(consume())
    (tmp_path / "a.conf").write_text("")
    await asyncio.wait_for(first.wait(), 5)
    await asyncio.sleep(0.05)  # let it drain the queue and block waiting for readiness
    watch.close()
    watch.close()  # idempotent
    await asyncio.wait_for(task, 5)
    assert seen and task.exception() is None
    async for _ in watch.events():  # a closed watch yields nothing
        raise AssertionError("event from a closed watch")


async def test_overflow_is_yielded_and_unknown_watches_are_dropped(
    tmp_path: Path, watch, monkeypatch
) -> None:
    real = inotify.parse_events
    extras = [(-1, IN_Q_OVERFLOW, 0, ""), (987654, IN_CREATE, 0, "stray")]
    monkeypatch.setattr(inotify, "parse_events", lambda buffer: extras + real(buffer))
    assert watch.add(tmp_path)
    (tmp_path / "a.conf").write_text("")
    seen = await collect(watch, saw("a.conf", IN_CLOSE_WRITE))
    assert seen[0] == DirEvent(Path(""), "", IN_Q_OVERFLOW) and seen[0].overflow
    assert "stray" not in {e.name for e in seen}


def record(wd: int, mask: int, name: bytes, size: int, cookie: int = 0) -> bytes:
    return struct.pack("=iIII", wd, mask, cookie, size) + name.ljust(size, b"\0")


def test_parse_events_reads_every_record() -> None:
    buffer = (
        record(1, IN_CREATE, b"a.conf", 16)
        + record(2, IN_IGNORED, b"", 0)
        + record(1, IN_MOVED_TO | IN_ISDIR, b"caf\xff", 16, cookie=7)
        + record(-1, IN_Q_OVERFLOW, b"", 0)
    )
    assert parse_events(buffer) == [
        (1, IN_CREATE, 0, "a.conf"),
        (2, IN_IGNORED, 0, ""),
        (1, IN_MOVED_TO | IN_ISDIR, 7, "caf\udcff"),
        (-1, IN_Q_OVERFLOW, 0, ""),
    ]
    assert os.fsencode(parse_events(buffer)[2][3]) == b"caf\xff"
    assert parse_events(b"") == []


def test_event_properties() -> None:
    assert DirEvent(Path(""), "", IN_Q_OVERFLOW).overflow
    assert DirEvent(Path("/etc"), "", IN_IGNORED).gone
    assert DirEvent(Path("/etc"), "d", IN_CREATE | IN_ISDIR).is_dir
    plain = DirEvent(Path("/etc"), "f", IN_CREATE)
    assert not (plain.overflow or plain.gone or plain.is_dir)


def failing(err: int) -> Callable[..., int]:
    def call(*args: object) -> int:
        ctypes.set_errno(err)  # what the use_errno call returns through ctypes.get_errno()
        return -1

    return call


@pytest.mark.parametrize(
    ("err", "named"),
    [(errno.ENOSPC, "fs.inotify.max_user_watches"), (errno.EACCES, os.strerror(errno.EACCES))],
)
def test_add_watch_failures_raise_host_error(tmp_path, monkeypatch, watch, err, named) -> None:
    watch.open()
    monkeypatch.setattr(watch._libc, "inotify_add_watch", failing(err))
    with pytest.raises(HostError, match=named) as raised:
        watch.add(tmp_path)
    assert raised.value.kind == "inotify" and str(tmp_path) in str(raised.value)
    assert watch.watched == set()


def test_too_many_instances_names_the_limit(tmp_path: Path, monkeypatch) -> None:
    fake = SimpleNamespace(inotify_init1=failing(errno.EMFILE))
    monkeypatch.setattr(inotify, "_load_libc", lambda: fake)
    with pytest.raises(HostError, match=r"fs\.inotify\.max_user_instances") as raised:
        DirectoryWatch().add(tmp_path)
    assert raised.value.kind == "inotify"
