"""Atomic, symlink-safe writes of allowlisted files under a host root.

Every path component is opened with O_NOFOLLOW relative to its parent's descriptor, so a
symlink planted anywhere in the path cannot redirect a write; the file itself is written to a
temporary sibling, fsynced, renamed over the target, and the directory is fsynced.

The only symlinks followed are ostree's own layout links, each at its place with its target and
owned by root (or by the user running the agent, for a host laid out in a folder): on an
ostree or bootc host `/home -> var/home`, `/root -> var/roothome`, `/usr/local ->
../var/usrlocal` and the like (OSTREE_LINKS), through which the MCD writes `/home/core/.ssh/...`."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.core.validate import FileFacts
from agent.errors import HostError
from agent.model.ignition import MAX_ID, Owner

TMP_SUFFIX = ".image-mode-agent.tmp"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NAME_MAX = 255
# ostree's layout links, which ostree-based images ship in their read-only root (FCOS, RHCOS,
# the bootc base images; the ostree VM tier's disk the same): where each is, and its target.
OSTREE_LINKS = {
    "/home": "var/home", "/root": "var/roothome", "/opt": "var/opt", "/srv": "var/srv",
    "/mnt": "var/mnt", "/media": "run/media", "/usr/local": "../var/usrlocal",
}  # fmt: skip


def shown(path: str) -> str:
    """A path as messages print it: as is, or quoted and escaped when it holds control
    characters or bytes that are not UTF-8 (a log line or an annotation must stay one line)."""
    try:
        path.encode()
    except UnicodeEncodeError:
        return repr(path)
    return path if path.isprintable() else repr(path)


def split_path(path: str) -> list[str]:
    """Components of an absolute, normalized path; refuses anything that could escape."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise HostError(f"refusing relative path {path!r}", kind="path")
    parts = path.split("/")[1:]
    if not parts or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise HostError(f"refusing path {path!r}: not normalized", kind="path")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:  # a lone surrogate that does not stand for an undecodable byte
        raise HostError(f"refusing path {path!r}: not encodable", kind="path") from None
    return parts


def _temp_name(name: str) -> str:
    """The temporary sibling a write goes to first; a long name gets a short, stable one."""
    tmp = f".{name}{TMP_SUFFIX}"
    if len(os.fsencode(tmp)) <= _NAME_MAX:
        return tmp
    return f".{hashlib.sha256(os.fsencode(name)).hexdigest()}{TMP_SUFFIX}"


def _checked_id(ident: int, what: str) -> int:
    if not 0 <= ident <= MAX_ID:
        raise HostError(f"{what} id out of range (0 to {MAX_ID})", kind="owner")
    return ident


@contextlib.contextmanager
def _io_errors(action: str, path: str, *, absent_ok: bool = False) -> Iterator[None]:
    """An OSError the port does not handle itself, as a HostError naming the path;
    FileNotFoundError passes through when the caller treats "absent" as an answer."""
    try:
        yield
    except FileNotFoundError:
        if absent_ok:
            raise
        raise HostError(f"cannot {action} {shown(path)}: not found", kind="path") from None
    except OSError as exc:
        raise HostError(
            f"cannot {action} {shown(path)}: {exc.strerror or exc}", kind="path"
        ) from None


def _lookup(db: Path, name: str, what: str) -> int:
    try:
        for line in db.read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[0] == name:
                return _checked_id(int(fields[2]), what)
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot read {db}: {exc}", kind="owner") from None
    raise HostError(f"unknown {what} {name!r} (not in {db})", kind="owner")


class RootedFiles:
    """The files port over a host root directory (`/` on a real host)."""

    def __init__(self, root: Path, is_allowed: Callable[[str], bool], *,
                 set_owner: bool = True) -> None:  # fmt: skip
        self.root = Path(root)
        self._is_allowed = is_allowed
        # False only for a host laid out in a folder by an unprivileged user (the demo from a plain
        # `pip install`, the DaemonSet image's non-root default): owners are still looked up,
        # so an unknown user fails as on a real host, but not set.
        self._set_owner = set_owner

    # -- ownership -----------------------------------------------------------------------
    def _uid(self, owner: Owner) -> int:
        if owner.id is not None:
            return _checked_id(owner.id, "user")
        return _lookup(self.root / "etc/passwd", owner.name, "user") if owner.name else 0

    def _gid(self, owner: Owner) -> int:
        if owner.id is not None:
            return _checked_id(owner.id, "group")
        return _lookup(self.root / "etc/group", owner.name, "group") if owner.name else 0

    # -- directory walking ---------------------------------------------------------------
    @staticmethod
    def _refused(path: str, where: str) -> HostError:
        return HostError(
            f"refusing {shown(path)}: {shown(where)} is a symlink or not a directory", kind="path"
        )

    @staticmethod
    def _layout_link(dirfd: int, name: str, where: str) -> str | None:
        """The target of `name` (at `where`) when it is one of ostree's layout links; None for
        any other symlink or file."""
        expected = OSTREE_LINKS.get(where)
        if expected is None:
            return None
        try:
            link = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=dirfd)
        except OSError:
            return None
        if not stat.S_ISLNK(link.st_mode) or link.st_uid not in (0, os.geteuid()):
            return None
        return target if target in (expected, "/" + expected.lstrip("./")) else None

    @contextlib.contextmanager
    def _parent(self, path: str, create: bool, dir_mode: int = 0o755) -> Iterator[tuple[int, str]]:
        """The open directory holding `path`'s last component, and that component's name."""
        parts = split_path(path)
        # The walk's open directories, root first: `..` in a followed link pops one, never the
        # root itself.
        stack = [os.open(self.root, _DIR_FLAGS)]
        # (component, the path so far as shown, whether it may be a layout link)
        todo = [(part, "/" + "/".join(parts[: i + 1]), True) for i, part in enumerate(parts[:-1])]
        try:
            while todo:
                part, where, may_link = todo.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=stack[-1])
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):  # made since: opened below
                        os.mkdir(part, dir_mode, dir_fd=stack[-1])
                    try:
                        child = os.open(part, _DIR_FLAGS, dir_fd=stack[-1])
                    except OSError as exc:
                        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                            raise self._refused(path, where) from None
                        raise
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    target = self._layout_link(stack[-1], part, where) if may_link else None
                    if target is None:
                        raise self._refused(path, where) from None
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                    # A target's own components are never layout links (no chains, no loops).
                    todo[:0] = [(p, f"{where} -> {target}", False) for p in target.split("/")]
                    continue
                stack.append(child)
            yield stack[-1], parts[-1]
        finally:
            for fd in stack:
                os.close(fd)

    def _check_allowed(self, path: str) -> None:
        split_path(path)
        if not self._is_allowed(path):
            raise HostError(f"refusing {shown(path)}: not on the live allowlist", kind="path")

    @staticmethod
    def _existing_kind(dirfd: int, name: str) -> int | None:
        try:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    # -- the port ------------------------------------------------------------------------
    def _same_file(self, dirfd: int, name: str, contents: bytes, mode: int, uid: int,
                   gid: int) -> bool:  # fmt: skip
        """Whether the regular file `name` holds `contents` with `mode` (and the owner, where
        writes set one) already. Opened without following a link or waiting on a FIFO."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dirfd)  # fmt: skip
        except OSError:
            return False
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode:
                return False
            if self._set_owner and (info.st_uid, info.st_gid) != (uid, gid):
                return False
            if info.st_size != len(contents):
                return False
            os.set_blocking(fd, True)
            return handle.read() == contents

    def write(self, path: str, contents: bytes, *, mode: int, user: Owner, group: Owner) -> bool:
        """Write `path` atomically; False, touching nothing, when its bytes, mode and owner
        match already: a write that changes nothing still wakes inotify watchers (the drift
        monitor) and moves the mtime an auditor reads."""
        self._check_allowed(path)
        uid, gid = self._uid(user), self._gid(group)
        with _io_errors("write", path), self._parent(path, create=True) as (dirfd, name):
            existing = self._existing_kind(dirfd, name)
            if existing is not None and not stat.S_ISREG(existing):
                raise HostError(
                    f"refusing {shown(path)}: exists and is not a regular file", kind="path"
                )
            if existing is not None and self._same_file(dirfd, name, contents, mode, uid, gid):
                return False
            tmp = _temp_name(name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dirfd)  # left by a crash mid-write
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                dir_fd=dirfd,
            )  # fmt: skip
            try:
                if self._set_owner:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
                view = memoryview(contents)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                os.close(fd)
                fd = -1
                os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dirfd)
                raise
            os.fsync(dirfd)
        return True

    def ensure_dir(self, path: str, *, mode: int, user: Owner, group: Owner) -> None:
        split_path(path)
        if not self._is_allowed(path.rstrip("/") + "/"):
            raise HostError(f"refusing {shown(path)}: not a live-managed directory", kind="path")
        uid, gid = self._uid(user), self._gid(group)
        with (
            _io_errors("create the directory", path),
            self._parent(path, create=True) as (dirfd, name),
        ):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=dirfd)
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
            except OSError as exc:
                raise HostError(
                    f"refusing {shown(path)}: a symlink or not a directory", kind="path"
                ) from (exc)
            try:
                info = os.fstat(fd)
                if self._set_owner and (info.st_uid, info.st_gid) != (uid, gid):
                    os.fchown(fd, uid, gid)
                if stat.S_IMODE(info.st_mode) != mode:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.fsync(dirfd)

    def delete(self, path: str) -> bool:
        """Remove the file at `path`; False when there is none."""
        self._check_allowed(path)
        try:
            with (
                _io_errors("delete", path, absent_ok=True),
                self._parent(path, create=False) as (dirfd, name),
            ):
                existing = self._existing_kind(dirfd, name)
                if existing is None:
                    return False
                if stat.S_ISDIR(existing):
                    raise HostError(f"refusing to delete {shown(path)}: a directory", kind="path")
                os.unlink(name, dir_fd=dirfd)
                os.fsync(dirfd)
                return True
        except FileNotFoundError:
            return False

    def read(self, path: str) -> bytes | None:
        try:
            with self._parent(path, create=False) as (dirfd, name):
                # Neither open a device nor wait on a FIFO for a writer: look first, then open
                # without blocking and look again at what was opened.
                kind = self._existing_kind(dirfd, name)
                if kind is not None and not stat.S_ISREG(kind) and not stat.S_ISLNK(kind):
                    raise HostError(
                        f"refusing to read {shown(path)}: not a regular file", kind="path"
                    )
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                fd = os.open(name, flags, dir_fd=dirfd)
                with os.fdopen(fd, "rb") as handle:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        raise HostError(
                            f"refusing to read {shown(path)}: not a regular file", kind="path"
                        )
                    os.set_blocking(fd, True)
                    return handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise HostError(f"refusing to read {shown(path)}: a symlink", kind="path") from None
            raise HostError(
                f"cannot read {shown(path)}: {exc.strerror or exc}", kind="path"
            ) from None

    def mode_of(self, path: str) -> int | None:
        """Permission bits of an existing regular file, None when absent."""
        kind = self.inspect_kind(path)
        return stat.S_IMODE(kind) if kind is not None and stat.S_ISREG(kind) else None

    def inspect_kind(self, path: str) -> int | None:
        """lstat's st_mode of `path` (a link is not followed), None when absent; nothing is
        opened or read."""
        try:
            with (
                _io_errors("inspect", path, absent_ok=True),
                self._parent(path, create=False) as (dirfd, name),
            ):
                return self._existing_kind(dirfd, name)
        except FileNotFoundError:
            return None

    def inspect(self, path: str) -> FileFacts | None:
        """A path as lstat sees it (a symlink is not followed), with a regular file's bytes;
        None when absent. For on-disk validation: nothing is opened but a regular file, and a
        symlink or a file where one of the path's directories should be is a HostError."""
        try:
            with (
                _io_errors("inspect", path, absent_ok=True),
                self._parent(path, create=False) as (dirfd, name),
            ):
                info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        contents = self.read(path) if stat.S_ISREG(info.st_mode) else None
        return FileFacts(info.st_mode, info.st_uid, info.st_gid, contents)

    def owner_ids(self, user: Owner, group: Owner) -> tuple[int, int] | None:
        """The numeric owner a write with `user` and `group` gives; None where writes set no
        owner (a host laid out in a folder, run unprivileged)."""
        return (self._uid(user), self._gid(group)) if self._set_owner else None

    def list_dir(self, path: str) -> list[str]:
        """Names in a directory (symlink-safe), empty when it does not exist."""
        try:
            with self._parent(path, create=False) as (dirfd, name):
                fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
                try:
                    return sorted(os.listdir(fd))
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise HostError(
                    f"refusing {shown(path)}: a symlink or not a directory", kind="path"
                ) from None
            raise HostError(
                f"cannot list {shown(path)}: {exc.strerror or exc}", kind="path"
            ) from None

    def remove_dir(self, path: str) -> None:
        """Remove an allowlisted directory and everything in it, as `os.RemoveAll` does for
        the MCD: files and links are unlinked, never followed; subdirectories go the same way."""
        self._check_allowed(path)
        for name in self.list_dir(path):
            child = f"{path}/{name}"
            facts = self.inspect_kind(child)
            if facts is not None and stat.S_ISDIR(facts):
                self.remove_dir(child)
            else:
                self.delete(child)
        try:
            with (
                _io_errors("remove", path, absent_ok=True),
                self._parent(path, create=False) as (dirfd, name),
            ):
                os.rmdir(name, dir_fd=dirfd)
                os.fsync(dirfd)
        except FileNotFoundError:
            return

    def set_password_hash(self, user: str, password_hash: str) -> bool:
        """Replace the hash field of `user` in /etc/shadow, as `usermod -p` does; False, with
        nothing written, when it is that hash already."""
        if any(c in password_hash for c in ":\n\0"):
            raise HostError(
                "refusing a password hash containing ':', a newline or a NUL", kind="input"
            )
        try:
            new_hash, name = password_hash.encode(), user.encode()
        except UnicodeEncodeError:
            raise HostError(
                "refusing a password hash or user that is not Unicode", kind="input"
            ) from None
        shadow = self.read("/etc/shadow")
        if shadow is None:
            raise HostError("cannot set the password: /etc/shadow does not exist", kind="owner")
        # Bytes, split on newlines only: the file is not ours to re-encode or re-split.
        lines = shadow.split(b"\n")
        for i, line in enumerate(lines):
            fields = line.split(b":")
            if fields[0] == name and len(fields) > 1:
                fields[1] = new_hash
                lines[i] = b":".join(fields)
                break
        else:
            raise HostError(
                f"cannot set the password: no user {user!r} in /etc/shadow", kind="owner"
            )
        with (
            _io_errors("inspect", "/etc/shadow"),
            self._parent("/etc/shadow", create=False) as (dirfd, entry),
        ):
            info = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
        text = b"\n".join(lines)
        return self.write(
            "/etc/shadow",
            text if text.endswith(b"\n") else text + b"\n",
            mode=stat.S_IMODE(info.st_mode),
            user=Owner(id=info.st_uid),
            group=Owner(id=info.st_gid),
        )
