"""The allowlist writer against a hostile filesystem: symlinked parents and targets, hard
links, device nodes, FIFOs, sockets, `..`, relative, very long and non-UTF-8 names, and a
target or parent swapped for a symlink between the check and the write.

For every case: nothing changes outside the host root, nothing under it but the allowlisted
target changes, no temporary file is left, nothing blocks, and a refusal is a HostError whose
message names the path."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.policy import CERTS_DIR, KUBELET_CA, PULL_SECRET, SHADOW_PATH, Allowlist
from agent.errors import HostError, InputError
from agent.host.files import TMP_SUFFIX, RootedFiles, shown
from agent.model.ignition import Owner

ROOT = Owner(id=0)
IS_ROOT = os.geteuid() == 0
CA = CERTS_DIR + "registry.example:5000/ca.crt"  # allowlisted by prefix


# -- the world: a host root and a directory outside it ---------------------------------------
class World:
    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        self.outside = base / "outside"
        (self.root / "etc/kubernetes").mkdir(parents=True)
        (self.root / "etc/docker/certs.d/registry.example:5000").mkdir(parents=True)
        (self.root / "var/lib").mkdir(parents=True)
        (self.root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\ncore:x:1000:1000::/:\n")
        (self.root / "etc/group").write_text("root:x:0:\ncore:x:1000:\n")
        (self.root / "etc/shadow").write_bytes(b"root:*:1:0:::::\ncore:*:1:0:::::\n")
        (self.root / "etc/shadow").chmod(0o600)
        (self.root / "etc/private").mkdir()
        (self.root / "etc/private/key").write_text("inside, not on the allowlist")
        (self.outside / "dir").mkdir(parents=True)
        (self.outside / "victim").write_text("keep")
        (self.outside / "dir/victim").write_text("keep too")
        self.files = RootedFiles(self.root, Allowlist().allows, set_owner=IS_ROOT)

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def snapshot(self) -> dict[bytes, tuple[Any, ...]]:
        return {**snapshot(self.root, b"root/"), **snapshot(self.outside, b"outside/")}

    def write(self, path: str, data: bytes = b"new", mode: int = 0o644) -> None:
        self.files.write(path, data, mode=mode, user=ROOT, group=ROOT)


def snapshot(top: Path, prefix: bytes) -> dict[bytes, tuple[Any, ...]]:
    """Every entry under `top` (no link followed, no FIFO or device opened, no PATH_MAX limit):
    kind, permissions, owner, inode, and the bytes of a file or the target of a symlink."""
    out: dict[bytes, tuple[Any, ...]] = {}
    for where, dirs, names, dirfd in os.fwalk(os.fsencode(top), follow_symlinks=False):
        rel = os.path.relpath(where, os.fsencode(top))
        for name in dirs + names:
            info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            content: Any = None
            if stat.S_ISREG(info.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
                with os.fdopen(fd, "rb") as handle:
                    content = handle.read()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(name, dir_fd=dirfd)
            key = prefix + os.path.normpath(os.path.join(rel, name))
            out[key] = (info.st_mode, info.st_uid, info.st_gid, info.st_ino, info.st_rdev, content)
    return out


def changes(before: dict[bytes, Any], after: dict[bytes, Any]) -> set[bytes]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def rel(path: str) -> bytes:
    return b"root/" + os.fsencode(path.lstrip("/"))


def temp_files(world: World) -> list[bytes]:
    return [k for k in snapshot(world.root, b"") if k.endswith(TMP_SUFFIX.encode())]


class Hung(BaseException):
    """Not an OSError: the writer must not be able to turn it into a HostError."""


@contextlib.contextmanager
def no_hang(seconds: float = 5.0) -> Iterator[None]:
    """Fail instead of blocking forever (opening a FIFO waits for the other end)."""

    def hung(signum: int, frame: Any) -> None:
        raise Hung(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(world: World, call: Callable[[], Any], names: str) -> HostError | InputError:
    """`call` raises HostError (or InputError) naming `names`, and changed nothing."""
    before = world.snapshot()
    with no_hang(), pytest.raises((HostError, InputError)) as info:
        call()
    message = str(info.value)
    assert names in message or shown(names) in message or repr(names) in message, message
    assert changes(before, world.snapshot()) == set()
    assert temp_files(world) == []
    return info.value


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def make_device(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        cwd = os.getcwd()
        os.chdir(path.parent)  # a socket's path is limited to 108 bytes: bind a short one
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(path.name)
        finally:
            os.chdir(cwd)
    else:
        if not IS_ROOT:
            pytest.skip("device nodes need CAP_MKNOD")
        # /dev/null and /dev/loop0: harmless if a regression opened them (/dev/zero would be
        # read until memory ran out).
        mode, dev = (
            (stat.S_IFCHR, os.makedev(1, 3)) if kind == "chr" else (stat.S_IFBLK, os.makedev(7, 0))
        )
        try:
            os.mknod(path, mode | 0o600, dev)
        except PermissionError:
            pytest.skip("no CAP_MKNOD here")


# -- symlinks ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("link", "points_to", "path", "named"),
    [
        ("etc/kubernetes", "outside/dir", KUBELET_CA, "/etc/kubernetes"),
        ("var/lib/kubelet", "outside/dir", PULL_SECRET, "/var/lib/kubelet"),
        ("etc/docker/certs.d/evil", "outside/dir", CERTS_DIR + "evil/ca.crt", "certs.d/evil"),
        ("etc/docker/certs.d/evil", "root/etc/private", CERTS_DIR + "evil/key", "certs.d/evil"),
        ("etc/docker/certs.d/evil", "/", CERTS_DIR + "evil/tmp/x", "certs.d/evil"),
        ("etc/docker/certs.d/evil", "../../private", CERTS_DIR + "evil/key", "certs.d/evil"),
        ("etc/docker/certs.d/loop", "loop", CERTS_DIR + "loop/x", "certs.d/loop"),
    ],
)  # fmt: skip
def test_symlinked_parent_is_refused(
    world: World, link: str, points_to: str, path: str, named: str
) -> None:
    host_link = world.root / link
    if host_link.is_dir():
        host_link.rmdir()
    target = (
        points_to if points_to.startswith(("/", "..", "loop")) else world.root.parent / points_to
    )
    host_link.symlink_to(target)
    refused(world, lambda: world.write(path), named)
    refused(world, lambda: world.files.read(path), named)
    refused(world, lambda: world.files.delete(path), named)
    refused(world, lambda: world.files.mode_of(path), named)
    refused(world, lambda: world.files.list_dir(path), named)
    refused(world, lambda: world.files.ensure_dir(path, mode=0o700, user=ROOT, group=ROOT), named)
    if path.startswith(CERTS_DIR):
        refused(world, lambda: world.files.remove_dir(path), named)


@pytest.mark.parametrize("points_to", ["outside/victim", "outside/missing", "root/etc/passwd"])
def test_symlinked_target_is_refused_and_never_followed(world: World, points_to: str) -> None:
    target = world.root.parent / points_to
    world.host(KUBELET_CA).symlink_to(target)
    refused(world, lambda: world.write(KUBELET_CA), "not a regular file")
    refused(world, lambda: world.files.read(KUBELET_CA), KUBELET_CA)
    refused(world, lambda: world.files.ensure_dir(KUBELET_CA, mode=0o700, user=ROOT, group=ROOT),
            KUBELET_CA)  # fmt: skip
    assert world.files.mode_of(KUBELET_CA) is None
    assert not (world.outside / "missing").exists()
    # Deleting the allowlisted name removes the link, never what it points to.
    before = world.snapshot()
    world.files.delete(KUBELET_CA)
    assert changes(before, world.snapshot()) == {rel(KUBELET_CA)}
    assert (world.outside / "victim").read_text() == "keep"


def test_symlink_at_the_temporary_name_is_not_followed(world: World) -> None:
    tmp = world.host(f"/etc/kubernetes/.kubelet-ca.crt{TMP_SUFFIX}")
    tmp.symlink_to(world.outside / "victim")
    before = world.snapshot()
    world.write(KUBELET_CA, b"ca")
    assert changes(before, world.snapshot()) == {
        rel(KUBELET_CA),
        rel(str(tmp.relative_to(world.root))),
    }
    assert (world.outside / "victim").read_text() == "keep"
    assert world.host(KUBELET_CA).read_bytes() == b"ca"


def test_directory_at_the_temporary_name(world: World) -> None:
    world.host(f"/etc/kubernetes/.kubelet-ca.crt{TMP_SUFFIX}").mkdir()
    before = world.snapshot()
    with pytest.raises(HostError, match=f"cannot write {KUBELET_CA}: Is a directory"):
        world.write(KUBELET_CA)
    assert changes(before, world.snapshot()) == set()


# -- hard links ----------------------------------------------------------------------------------
@pytest.mark.parametrize("other", ["outside/victim", "root/etc/passwd", "root/etc/private/key"])
def test_hard_link_is_replaced_not_written_through(world: World, other: str) -> None:
    other_path = world.root.parent / other
    os.link(other_path, world.host(KUBELET_CA))
    kept = other_path.read_bytes()
    before = world.snapshot()
    world.write(KUBELET_CA, b"new ca")
    assert world.host(KUBELET_CA).read_bytes() == b"new ca"
    assert other_path.read_bytes() == kept
    assert other_path.stat().st_nlink == 1
    assert world.host(KUBELET_CA).stat().st_ino != other_path.stat().st_ino
    assert changes(before, world.snapshot()) == {rel(KUBELET_CA)}


def test_hard_linked_shadow_keeps_the_other_name(world: World) -> None:
    outside_copy = world.outside / "shadow-copy"
    os.link(world.host(SHADOW_PATH), outside_copy)
    world.files.set_password_hash("core", "$6$salt$hash")
    assert outside_copy.read_bytes() == b"root:*:1:0:::::\ncore:*:1:0:::::\n"
    assert world.host(SHADOW_PATH).read_bytes() == b"root:*:1:0:::::\ncore:$6$salt$hash:1:0:::::\n"


# -- special files -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "socket", "chr", "blk"])
def test_special_file_at_the_target(world: World, kind: str) -> None:
    make_device(world.host(KUBELET_CA), kind)
    refused(world, lambda: world.write(KUBELET_CA), KUBELET_CA)
    refused(world, lambda: world.files.read(KUBELET_CA), KUBELET_CA)
    refused(world, lambda: world.files.list_dir(KUBELET_CA), KUBELET_CA)
    refused(world, lambda: world.files.ensure_dir(KUBELET_CA, mode=0o700, user=ROOT, group=ROOT),
            KUBELET_CA)  # fmt: skip
    with no_hang():
        assert world.files.mode_of(KUBELET_CA) is None


@pytest.mark.parametrize("kind", ["fifo", "socket", "chr", "file"])
def test_special_file_as_a_parent(world: World, kind: str) -> None:
    parent = world.host(CERTS_DIR + "odd")
    if kind == "file":
        parent.write_text("a file, not a directory")
    else:
        make_device(parent, kind)
    path = CERTS_DIR + "odd/ca.crt"
    refused(world, lambda: world.write(path), "odd is a symlink or not a directory")
    refused(world, lambda: world.files.read(path), "odd")
    refused(world, lambda: world.files.delete(path), "odd")
    refused(world, lambda: world.files.remove_dir(CERTS_DIR + "odd"), "odd")


def test_fifo_as_shadow_does_not_block(world: World) -> None:
    world.host(SHADOW_PATH).unlink()
    os.mkfifo(world.host(SHADOW_PATH))
    refused(world, lambda: world.files.set_password_hash("core", "$6$x"), SHADOW_PATH)


def test_symlinked_shadow_is_refused(world: World) -> None:
    (world.outside / "shadow").write_bytes(b"core:*:1:0:::::\n")
    world.host(SHADOW_PATH).unlink()
    world.host(SHADOW_PATH).symlink_to(world.outside / "shadow")
    refused(world, lambda: world.files.set_password_hash("core", "$6$x"), SHADOW_PATH)


def test_directory_where_a_file_is_expected(world: World) -> None:
    world.host(KUBELET_CA).mkdir()
    (world.host(KUBELET_CA) / "inner").write_text("x")
    refused(world, lambda: world.write(KUBELET_CA), "not a regular file")
    refused(world, lambda: world.files.read(KUBELET_CA), "not a regular file")
    refused(world, lambda: world.files.delete(KUBELET_CA), "a directory")


def test_remove_dir_with_hostile_entries(world: World) -> None:
    folder = world.host(CERTS_DIR + "gone")
    folder.mkdir()
    (folder / "link").symlink_to(world.outside / "victim")
    (folder / "dirlink").symlink_to(world.outside / "dir")
    os.link(world.outside / "dir/victim", folder / "hard")
    os.mkfifo(folder / "fifo")
    (folder / os.fsdecode(b"\xff\xfe")).write_text("non-UTF-8 name")
    before = snapshot(world.outside, b"")
    with no_hang():
        world.files.remove_dir(CERTS_DIR + "gone")
    assert not folder.exists()
    assert snapshot(world.outside, b"") == before
    # Subdirectories go too, as the MCD's os.RemoveAll takes them, and a link in one is
    # still unlinked, never followed.
    (folder / "sub/deeper").mkdir(parents=True)
    (folder / "sub/deeper/link").symlink_to(world.outside / "dir")
    (folder / "sub/ca.crt").write_text("x")
    with no_hang():
        world.files.remove_dir(CERTS_DIR + "gone")
    assert not folder.exists()
    assert snapshot(world.outside, b"") == before


# -- path strings --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "relative path"),
        ("etc/shadow", "relative path"),
        ("./etc/shadow", "relative path"),
        ("certs.d/x", "relative path"),
        ("/", "not normalized"),
        ("//etc/shadow", "not normalized"),
        ("/etc/kubernetes/../shadow", "not normalized"),
        ("/etc/kubernetes/./kubelet-ca.crt", "not normalized"),
        (CERTS_DIR + "../../shadow", "not normalized"),
        (CERTS_DIR + "..", "not normalized"),
        ("/../etc/shadow", "not normalized"),
        (CERTS_DIR + "x/", "not normalized"),
        (CERTS_DIR + "a\0b", "not normalized"),
        (CERTS_DIR + "\ud800", "not encodable"),
        ("/etc/passwd", "not on the live allowlist"),
        ("/etc/private/key", "not on the live allowlist"),
        (CERTS_DIR.rstrip("/"), "not on the live allowlist"),
        ("/etc/" + os.fsdecode(b"\xff"), "not on the live allowlist"),
        ("/etc/kubernetes/kubelet-ca.crt\n/etc/shadow", "not on the live allowlist"),
    ],
)
def test_path_strings_are_refused(world: World, path: str, message: str) -> None:
    error = refused(world, lambda: world.write(path), message)
    assert shown(path) in str(error) or repr(path) in str(error)
    assert "\n" not in str(error)
    refused(world, lambda: world.files.delete(path), message)
    if "allowlist" not in message:  # reading is not limited to the allowlist
        refused(world, lambda: world.files.read(path), message)


def test_non_utf8_names_are_written_as_bytes(world: World) -> None:
    name = os.fsdecode(b"ca-\xff\xfe.crt")
    before = world.snapshot()
    world.write(CERTS_DIR + "registry.example:5000/" + name, b"ca")
    assert changes(before, world.snapshot()) == {rel(CA).replace(b"ca.crt", b"ca-\xff\xfe.crt")}
    assert world.files.list_dir(CERTS_DIR + "registry.example:5000") == [name]
    assert world.files.read(CERTS_DIR + "registry.example:5000/" + name) == b"ca"


def test_name_max(world: World) -> None:
    """A 255-byte name is written (its temporary sibling gets a short name); 256 is refused."""
    longest = CERTS_DIR + "n" * 255
    before = world.snapshot()
    world.write(longest, b"x")
    assert changes(before, world.snapshot()) == {rel(longest)}
    world.write(longest, b"y")  # replaced, and the temporary name was cleaned
    assert world.files.read(longest) == b"y" and temp_files(world) == []
    error = refused(world, lambda: world.write(CERTS_DIR + "n" * 256), "n" * 256)
    assert "name too long" in str(error).lower()
    refused(world, lambda: world.write(CERTS_DIR + "d" * 256 + "/ca.crt"), "d" * 256)
    multibyte = CERTS_DIR + "\u00e9" * 128  # 256 bytes in UTF-8
    refused(world, lambda: world.write(multibyte), multibyte)


def test_path_max(world: World) -> None:
    """Longer than PATH_MAX in all: each component is opened relative to its parent, so the
    path is written where it names, and nowhere else."""
    deep = CERTS_DIR + "/".join(["d" * 200] * 25) + "/ca.crt"
    assert len(deep) > 4096
    before = world.snapshot()
    world.write(deep, b"deep")
    assert world.files.read(deep) == b"deep"
    changed = changes(before, world.snapshot())
    assert rel(deep) in changed
    assert all(rel(deep).startswith(k) for k in changed)  # the file and its new parents


def test_owner_ids_out_of_range(world: World) -> None:
    for owner in (Owner(id=2**32), Owner(id=2**64), Owner(id=-1)):
        with pytest.raises(HostError, match="out of range"):
            world.files.write(KUBELET_CA, b"x", mode=0o644, user=owner, group=ROOT)
        with pytest.raises(HostError, match="out of range"):
            world.files.write(KUBELET_CA, b"x", mode=0o644, user=ROOT, group=owner)
    assert not world.host(KUBELET_CA).exists()


@pytest.mark.parametrize("password_hash", ["a:b", "a\nb", "a\0b", "\udcff", "\ud800"])
def test_hostile_password_hashes(world: World, password_hash: str) -> None:
    refused(world, lambda: world.files.set_password_hash("core", password_hash), "refusing")


def test_shadow_bytes_are_kept_exactly(world: World) -> None:
    """Only the hash field of the user changes: no re-encoding, no splitting at \\f or NEL."""
    other = b"bad\xff:*:1:0:::::\nodd\x0cline:*:1:0:::::\nnel\xc2\x85:*:1:0:::::\n"
    world.host(SHADOW_PATH).write_bytes(b"core:*:1:0:::::\n" + other)
    world.files.set_password_hash("core", "$6$new")
    assert world.host(SHADOW_PATH).read_bytes() == b"core:$6$new:1:0:::::\n" + other


# -- races: the target or a parent replaced by a symlink between the check and the write -------
def test_target_swapped_for_a_symlink_before_the_rename(world: World, monkeypatch) -> None:
    world.write(KUBELET_CA, b"old")
    real_rename = os.rename

    def swap_then_rename(src, dst, **kwargs):
        os.unlink(dst, dir_fd=kwargs["dst_dir_fd"])
        os.symlink(world.outside / "victim", dst, dir_fd=kwargs["dst_dir_fd"])
        return real_rename(src, dst, **kwargs)

    monkeypatch.setattr(os, "rename", swap_then_rename)
    world.write(KUBELET_CA, b"new")
    monkeypatch.undo()
    assert (world.outside / "victim").read_text() == "keep"
    assert not world.host(KUBELET_CA).is_symlink()
    assert world.host(KUBELET_CA).read_bytes() == b"new"
    assert temp_files(world) == []


def test_parent_swapped_for_a_symlink_after_it_was_opened(world: World, monkeypatch) -> None:
    """The write goes to the directory that was checked (held open), never through the link."""
    real_open = os.open
    parent = world.host("/etc/kubernetes")

    def swap_then_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and not parent.is_symlink():
            parent.rename(parent.with_name("kubernetes.moved"))
            parent.symlink_to(world.outside / "dir")
        return real_open(path, flags, *args, **kwargs)

    outside = snapshot(world.outside, b"")
    monkeypatch.setattr(os, "open", swap_then_open)
    world.write(KUBELET_CA, b"new")
    monkeypatch.undo()
    assert snapshot(world.outside, b"") == outside
    assert (world.root / "etc/kubernetes.moved/kubelet-ca.crt").read_bytes() == b"new"
    assert temp_files(world) == []


def test_rename_failure_leaves_no_temporary_file(world: World, monkeypatch) -> None:
    def fail(*args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "rename", fail)
    refused(world, lambda: world.write(KUBELET_CA), KUBELET_CA)
    monkeypatch.undo()
    assert not world.host(KUBELET_CA).exists()


def test_symlinks_swapped_in_while_writes_run(world: World) -> None:
    """A thread keeps replacing the target with a symlink to a file outside the root, and the
    parent with a symlink to a directory outside it; writes run meanwhile. Whatever each write
    does (written, refused), nothing outside the root ever changes."""
    folder = world.host(CERTS_DIR + "registry.example:5000")
    real = folder.with_name("real")
    target = folder / "ca.crt"
    outside = snapshot(world.outside, b"")
    stop = threading.Event()

    def swapper() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.symlink(world.outside / "victim", folder / "swap")
                os.rename(folder / "swap", target)  # the target is now a symlink
            try:
                os.rename(folder, real)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.symlink(world.outside / "dir", folder)  # the parent is now a symlink
                time.sleep(0)
                os.unlink(folder)
            while True:  # put the real one back, over any directory a write made meanwhile
                try:
                    os.rename(real, folder)
                    break
                except OSError:
                    with contextlib.suppress(OSError):
                        shutil.rmtree(folder)  # refuses a symlink: never reaches outside

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    outcomes = {"written": 0, "refused": 0}
    start = time.monotonic()
    try:
        with no_hang(20):
            # 1.5 s, longer (up to 10 s) on a loaded machine until both outcomes were seen.
            while time.monotonic() - start < 1.5 or (
                time.monotonic() - start < 10 and not all(outcomes.values())
            ):
                try:
                    world.write(CA, b"ca")
                    outcomes["written"] += 1
                except HostError as exc:
                    assert "registry.example:5000" in str(exc), exc
                    outcomes["refused"] += 1
                with contextlib.suppress(HostError):
                    world.files.read(CA)
    finally:
        stop.set()
        thread.join()
    assert snapshot(world.outside, b"") == outside
    assert outcomes["written"] and outcomes["refused"], outcomes
    for key in snapshot(world.root, b""):
        assert not key.endswith(TMP_SUFFIX.encode()), key
    assert sorted(os.listdir(world.root / "etc")) == sorted(
        ["docker", "group", "kubernetes", "passwd", "private", "shadow"]
    )


# -- any path string ---------------------------------------------------------------------------
_COMPONENTS = [
    "etc", "docker", "certs.d", "kubernetes", "kubelet-ca.crt", "var", "lib", "kubelet",
    "config.json", "shadow", "passwd", "private", "key", "..", ".", "", "evil", "loop", "file",
    "fifo", "ca.crt", "\udcff", "\ud800", "a\0b", "n" * 256, "x\ny", "registry.example:5000",
]  # fmt: skip
PATHS = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(_COMPONENTS) | st.text(max_size=6), max_size=6).map("/".join),
    st.lists(st.sampled_from(_COMPONENTS), max_size=6).map(lambda parts: "/" + "/".join(parts)),
    st.lists(st.sampled_from(_COMPONENTS), max_size=3).map(lambda p: CERTS_DIR + "/".join(p)),
)
ANY_PATH = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _hostile_world(base: Path) -> World:
    world = World(base)
    certs = world.host(CERTS_DIR)
    (certs / "evil").symlink_to(world.outside / "dir")
    (certs / "loop").symlink_to("loop")
    (certs / "file").write_text("a file")
    os.mkfifo(certs / "fifo")
    world.host("/etc/kubernetes/kubelet-ca.crt").symlink_to(world.outside / "victim")
    return world


@ANY_PATH
@given(PATHS, st.sampled_from(["write", "delete", "read", "ensure_dir", "remove_dir", "list"]))
def test_any_path_string(path: str, operation: str) -> None:
    """Refused with a HostError naming the path, or done at exactly that allowlisted path."""
    with tempfile.TemporaryDirectory() as tmp:
        world = _hostile_world(Path(tmp))
        files = world.files
        before = world.snapshot()
        call: Callable[[], Any] = {
            "write": lambda: world.write(path, b"payload"),
            "delete": lambda: files.delete(path),
            "read": lambda: files.read(path),
            "ensure_dir": lambda: files.ensure_dir(path, mode=0o700, user=ROOT, group=ROOT),
            "remove_dir": lambda: files.remove_dir(path),
            "list": lambda: files.list_dir(path),
        }[operation]
        try:
            with no_hang():
                call()
        except (HostError, InputError) as exc:
            message = str(exc)
            assert message.startswith(("refusing", "cannot")), message
            assert "\n" not in message
            done = False
        else:
            done = True
        after = world.snapshot()
        changed = changes(before, after)
        assert not {k for k in changed if k.startswith(b"outside/")}, changed
        assert temp_files(world) == []
        if not changed:
            return
        target = rel(path)  # something changed: the path was one the OS could take
        for key in changed:
            if key == target:  # ensure_dir: only the live-managed directories
                assert done, f"{operation} {path!r} failed but changed it"
                wanted = path.rstrip("/") + "/" if operation == "ensure_dir" else path
                assert Allowlist().allows(wanted), (operation, path)
            else:  # a parent directory made on the way (kept when a later step is refused)
                assert target.startswith(key + b"/"), (operation, path, key)
                assert key not in before and stat.S_ISDIR(after[key][0]), (operation, path, key)


@pytest.mark.parametrize("path", ["/etc", "/home/core", "/root/.ssh", "/var/lib/kubelet"])
def test_only_the_ssh_key_directories_are_created_or_chmodded(world: World, path: str) -> None:
    """ensure_dir sets a mode and an owner: only on the SSH key's parents, never on /etc."""
    before = world.snapshot()
    refused(world, lambda: world.files.ensure_dir(path, mode=0o700, user=ROOT, group=ROOT),
            "not a live-managed directory")  # fmt: skip
    assert world.snapshot() == before
    world.files.ensure_dir("/home/core/.ssh", mode=0o700, user=ROOT, group=ROOT)
    assert stat.S_IMODE(world.host("/home/core/.ssh").stat().st_mode) == 0o700
