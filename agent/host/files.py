"""Atomic, symlink-safe writes of allowlisted files under a host root.

Every path component is opened with O_NOFOLLOW relative to its parent's descriptor, so a
symlink planted anywhere in the path cannot redirect a write; the file itself is written to a
temporary sibling, fsynced, renamed over the target, and the directory is fsynced."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.errors import HostError
from agent.model.ignition import Owner

TMP_SUFFIX = ".image-mode-agent.tmp"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split_path(path: str) -> list[str]:
    """Components of an absolute, normalized path; refuses anything that could escape."""
    if not path.startswith("/"):
        raise HostError(f"refusing relative path {path!r}", kind="path")
    parts = path.split("/")[1:]
    if not parts or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise HostError(f"refusing path {path!r}: not normalized", kind="path")
    return parts


def _lookup(db: Path, name: str, what: str) -> int:
    try:
        for line in db.read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 2 and fields[0] == name:
                return int(fields[2])
    except (OSError, ValueError) as exc:
        raise HostError(f"cannot read {db}: {exc}", kind="owner") from None
    raise HostError(f"unknown {what} {name!r} (not in {db})", kind="owner")


class RootedFiles:
    """The files port over a host root directory (`/` on a real host)."""

    def __init__(self, root: Path, is_allowed: Callable[[str], bool], *,
                 set_owner: bool = True) -> None:  # fmt: skip
        self.root = Path(root)
        self._is_allowed = is_allowed
        # False only for a simulated host run by an unprivileged user (the demo from a plain
        # `pip install`, the DaemonSet image's non-root default): owners are still looked up,
        # so an unknown user fails as on a real host, but not set.
        self._set_owner = set_owner

    # -- ownership -----------------------------------------------------------------------
    def _uid(self, owner: Owner) -> int:
        if owner.id is not None:
            return owner.id
        return _lookup(self.root / "etc/passwd", owner.name, "user") if owner.name else 0

    def _gid(self, owner: Owner) -> int:
        if owner.id is not None:
            return owner.id
        return _lookup(self.root / "etc/group", owner.name, "group") if owner.name else 0

    # -- directory walking ---------------------------------------------------------------
    @contextlib.contextmanager
    def _parent(self, path: str, create: bool, dir_mode: int = 0o755) -> Iterator[tuple[int, str]]:
        parts = split_path(path)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, dir_mode, dir_fd=fd)
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = "/" + "/".join(parts[: i + 1])
                        raise HostError(
                            f"refusing {path}: {where} is a symlink or not a directory",
                            kind="path",
                        ) from None
                    raise
                os.close(fd)
                fd = child
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _check_allowed(self, path: str) -> None:
        split_path(path)
        if not self._is_allowed(path):
            raise HostError(f"refusing {path}: not on the live allowlist", kind="path")

    @staticmethod
    def _existing_kind(dirfd: int, name: str) -> int | None:
        try:
            return os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None

    # -- the port ------------------------------------------------------------------------
    def write(self, path: str, contents: bytes, *, mode: int, user: Owner, group: Owner) -> None:
        self._check_allowed(path)
        uid, gid = self._uid(user), self._gid(group)
        with self._parent(path, create=True) as (dirfd, name):
            existing = self._existing_kind(dirfd, name)
            if existing is not None and not stat.S_ISREG(existing):
                raise HostError(f"refusing {path}: exists and is not a regular file", kind="path")
            tmp = f".{name}{TMP_SUFFIX}"
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
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dirfd)
                raise
            os.close(fd)
            os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
            os.fsync(dirfd)

    def ensure_dir(self, path: str, *, mode: int, user: Owner, group: Owner) -> None:
        split_path(path)
        uid, gid = self._uid(user), self._gid(group)
        with self._parent(path, create=True) as (dirfd, name):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=dirfd)
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
            except OSError as exc:
                raise HostError(
                    f"refusing {path}: a symlink or not a directory", kind="path"
                ) from (exc)
            try:
                if self._set_owner:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.fsync(dirfd)

    def delete(self, path: str) -> None:
        self._check_allowed(path)
        try:
            with self._parent(path, create=False) as (dirfd, name):
                existing = self._existing_kind(dirfd, name)
                if existing is None:
                    return
                if stat.S_ISDIR(existing):
                    raise HostError(f"refusing to delete {path}: a directory", kind="path")
                os.unlink(name, dir_fd=dirfd)
                os.fsync(dirfd)
        except FileNotFoundError:
            return

    def read(self, path: str) -> bytes | None:
        try:
            with self._parent(path, create=False) as (dirfd, name):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
                with os.fdopen(fd, "rb") as handle:
                    return handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise HostError(f"refusing to read {path}: a symlink", kind="path") from None
            raise

    def mode_of(self, path: str) -> int | None:
        """Permission bits of an existing regular file, None when absent."""
        try:
            with self._parent(path, create=False) as (dirfd, name):
                kind = self._existing_kind(dirfd, name)
        except FileNotFoundError:
            return None
        return stat.S_IMODE(kind) if kind is not None and stat.S_ISREG(kind) else None

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
                    f"refusing {path}: a symlink or not a directory", kind="path"
                ) from None
            raise

    def remove_dir(self, path: str) -> None:
        """Remove an allowlisted directory and the regular files in it."""
        self._check_allowed(path)
        for name in self.list_dir(path):
            self.delete(f"{path}/{name}")
        try:
            with self._parent(path, create=False) as (dirfd, name):
                os.rmdir(name, dir_fd=dirfd)
                os.fsync(dirfd)
        except FileNotFoundError:
            return

    def set_password_hash(self, user: str, password_hash: str) -> None:
        """Replace the hash field of `user` in /etc/shadow, as `usermod -p` does."""
        if ":" in password_hash or "\n" in password_hash:
            raise HostError("refusing a password hash containing ':' or a newline", kind="input")
        shadow = self.read("/etc/shadow")
        if shadow is None:
            raise HostError("cannot set the password: /etc/shadow does not exist", kind="owner")
        lines = shadow.decode().splitlines()
        for i, line in enumerate(lines):
            fields = line.split(":")
            if fields[0] == user and len(fields) > 1:
                fields[1] = password_hash
                lines[i] = ":".join(fields)
                break
        else:
            raise HostError(
                f"cannot set the password: no user {user!r} in /etc/shadow", kind="owner"
            )
        with self._parent("/etc/shadow", create=False) as (dirfd, name):
            info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        owner = Owner(id=info.st_uid)
        self.write(
            "/etc/shadow",
            ("\n".join(lines) + "\n").encode(),
            mode=stat.S_IMODE(info.st_mode),
            user=owner,
            group=Owner(id=info.st_gid),
        )
