"""`ostree admin config-diff` for a simulated host: what a real host's ostree would print.

On an ostree or bootc host /etc survives updates by a 3-way merge (the old deployment's
/usr/etc, the live /etc, the new /usr/etc), so a file the image ships can stay different from
the image forever; the agent reports that image-content drift and never fixes it. A real host
answers `ostree admin config-diff`; a simulated host (root/usr/etc the image's defaults,
root/etc the live /etc) has no ostree, so this module computes the same text from the same two
trees, and the agent parses both with `agent.model.etc_drift.parse_config_diff`.

It follows ostree 2022.7 (src/libostree/ostree-diff.c `ostree_diff_dirs`, `ostree_diff_print`;
config-diff passes OSTREE_DIFF_FLAGS_IGNORE_XATTRS) and the GLib enumerator it walks with:

- An entry of both trees whose type differs (file, directory, symlink, other) is `M` and is not
  descended into. One of the same type is `M` when ostree's checksum differs: uid, gid and the
  whole st_mode; a symlink's target; a regular file's bytes. A directory's own uid, gid or mode
  makes it `M`; what it holds is compared entry by entry below it. xattrs, mtimes and rdev are
  not compared.
- An entry only in /usr/etc is `D`, its contents are not listed; one only in /etc is `A`, and
  so is everything under it when it is a directory.
- Every `M` line, then every `D`, then every `A`, each `"%c    %s\\n"` with the path relative to
  /etc. Within a letter, the order of a depth-first walk of /usr/etc, one directory at a time in
  GLib's order (see `_entries`); an `A` is found in the walk of /etc that follows each
  directory's walk of /usr/etc, so additions inside a subdirectory come before those of its
  parent directory.

The output is what ostree prints under a UTF-8 locale (GLib prints names as they are); a name
that is not UTF-8 comes back as `os.fsdecode` gives it. No symlink is followed: every step is
an O_NOFOLLOW open relative to its parent's descriptor, and a FIFO or device is never opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from agent.errors import HostError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# GLib's local enumerator reads a directory this many entries at a time and sorts each batch.
_GLIB_CHUNK = 1000
_READ = 1 << 16


def simulated_config_diff(root: Path) -> str:
    """The text `ostree admin config-diff` prints for a host whose root is `root`: the
    differences between root/usr/etc (the booted image's defaults) and root/etc (the live
    /etc); no root/usr/etc is an image that ships no /etc file. HostError kind `path` when a
    directory on the way is a symlink or not a directory, `other` when root/etc is missing or
    a tree cannot be read (ostree fails then too)."""
    modified: list[str] = []
    removed: list[str] = []
    added: list[str] = []
    try:
        with contextlib.ExitStack() as opened:
            # `root` is the caller's own path: followed. Nothing below it is.
            top = opened.enter_context(_opened_dir(os.fspath(root), follow=True))
            live = opened.enter_context(_opened_dir("etc", top))
            try:
                usr = opened.enter_context(_opened_dir("usr", top))
                image: int | None = opened.enter_context(_opened_dir("etc", usr))
            except FileNotFoundError:
                image = None
            if image is None:
                # An image that ships no /etc file: a simulated host lays no root/usr/etc then
                # (a real deployment always has one). Its /etc is empty, so all of /etc is `A`.
                _add_dir(live, "", added)
            else:
                _diff_dirs(image, live, "", modified, removed, added)
    except OSError as exc:
        # ELOOP is O_NOFOLLOW meeting a symlink: refused, as the agent refuses one on a write.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HostError(f"refusing to compare {root}/usr/etc with {root}/etc: a symlink or "
                            f"not a directory ({exc})", kind="path") from exc  # fmt: skip
        raise HostError(f"cannot compare {root}/usr/etc with {root}/etc: {exc}") from exc
    lines = [f"M    {p}\n" for p in modified]
    lines += [f"D    {p}\n" for p in removed]
    lines += [f"A    {p}\n" for p in added]
    return "".join(lines)


@contextlib.contextmanager
def _opened_dir(name: str, parent: int | None = None, follow: bool = False) -> Iterator[int]:
    """A directory's descriptor, relative to `parent` when given; O_NOFOLLOW unless `follow`."""
    fd = os.open(name, _DIR_FLAGS & ~os.O_NOFOLLOW if follow else _DIR_FLAGS, dir_fd=parent)
    try:
        yield fd
    finally:
        os.close(fd)


def _diff_dirs(a: int, b: int, rel: str, modified: list[str], removed: list[str],
               added: list[str]) -> None:  # fmt: skip
    """ostree_diff_dirs_with_options: walk `a` (the image's), then `b` (the live one)."""
    for name, a_st in _entries(a):
        b_st = _lstat(name, b)
        if b_st is None:
            removed.append(rel + name)
            continue
        if _kind(a_st.st_mode) != _kind(b_st.st_mode):
            modified.append(rel + name)
            continue
        if _differs(name, a, a_st, b, b_st):
            modified.append(rel + name)
        if stat.S_ISDIR(a_st.st_mode):
            with _opened_dir(name, a) as child_a, _opened_dir(name, b) as child_b:
                _diff_dirs(child_a, child_b, f"{rel}{name}/", modified, removed, added)
    for name, b_st in _entries(b):
        if _lstat(name, a) is None:
            added.append(rel + name)
            if stat.S_ISDIR(b_st.st_mode):
                with _opened_dir(name, b) as child:
                    _add_dir(child, f"{rel}{name}/", added)


def _add_dir(d: int, rel: str, added: list[str]) -> None:
    """diff_add_dir_recurse: everything under an added directory, depth first."""
    for name, st in _entries(d):
        added.append(rel + name)
        if stat.S_ISDIR(st.st_mode):
            with _opened_dir(name, d) as child:
                _add_dir(child, f"{rel}{name}/", added)


def _entries(d: int) -> Iterator[tuple[str, os.stat_result]]:
    """A directory's entries in the order GLib's local GFileEnumerator returns them (gio
    glocalfileenumerator.c `next_file_helper`): readdir order, `_GLIB_CHUNK` entries at a
    time, each batch sorted by inode number; with their lstat."""
    with os.scandir(d) as scan:
        found = [(entry.name, entry.inode()) for entry in scan]
    for start in range(0, len(found), _GLIB_CHUNK):
        for name, _ in _glibc_msort(found[start : start + _GLIB_CHUNK]):
            st = _lstat(name, d)
            if st is not None:  # gone since the readdir: GLib skips it too
                yield name, st


def _by_inode(a: tuple[str, int], b: tuple[str, int]) -> int:
    """GLib's `sort_by_inode`: `a->inode - b->inode` on `long`, returned as an `int`. The
    truncation to 32 bits is kept, as it orders inodes far apart (XFS, btrfs) differently."""
    diff = (a[1] - b[1]) & 0xFFFFFFFF
    return diff - (1 << 32) if diff & 0x80000000 else diff


def _glibc_msort(items: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """glibc's qsort (2.36, stdlib/msort.c `msort_with_tmp`): a top-down merge sort that
    keeps the left element on ties. Spelled out, not `sorted`, because `_by_inode` is not a
    consistent order when inodes are far apart, and then only the same algorithm agrees."""
    if len(items) <= 1:
        return items
    half = len(items) // 2
    left, right = _glibc_msort(items[:half]), _glibc_msort(items[half:])
    merged: list[tuple[str, int]] = []
    i = j = 0
    while i < len(left) and j < len(right):
        if _by_inode(left[i], right[j]) <= 0:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            j += 1
    return merged + left[i:] + right[j:]


def _lstat(name: str, d: int) -> os.stat_result | None:
    """The entry's lstat, or None when it does not exist (GLib's G_IO_ERROR_NOT_FOUND)."""
    try:
        return os.stat(name, dir_fd=d, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    """GLib's GFileType: FIFOs, sockets and devices are all "special"."""
    if stat.S_ISREG(mode):
        return "regular"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return "special"
    return "unknown"


def _differs(name: str, a: int, a_st: os.stat_result, b: int, b_st: os.stat_result) -> bool:
    """Whether ostree's checksums of two entries of the same type differ: the header (uid,
    gid, st_mode, a symlink's target; xattrs ignored by config-diff, rdev written as 0) and a
    regular file's bytes."""
    if (a_st.st_uid, a_st.st_gid, a_st.st_mode) != (b_st.st_uid, b_st.st_gid, b_st.st_mode):
        return True
    if stat.S_ISLNK(a_st.st_mode):
        return os.readlink(name, dir_fd=a) != os.readlink(name, dir_fd=b)
    if stat.S_ISREG(a_st.st_mode):
        return a_st.st_size != b_st.st_size or not _same_bytes(name, a, b)
    return False


def _same_bytes(name: str, a: int, b: int) -> bool:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    with (
        os.fdopen(os.open(name, flags, dir_fd=a), "rb") as file_a,
        os.fdopen(os.open(name, flags, dir_fd=b), "rb") as file_b,
    ):
        while True:
            chunk_a, chunk_b = file_a.read(_READ), file_b.read(_READ)
            if chunk_a != chunk_b:
                return False
            if not chunk_a:
                return True
