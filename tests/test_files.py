"""The files port: allowlist, atomic replace, symlink safety in every component, owners."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.core.policy import Allowlist
from agent.errors import HostError
from agent.host.files import TMP_SUFFIX, RootedFiles
from agent.model.ignition import Owner

ROOT_OWNER = Owner(id=0)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        "root:x:0:0::/root:/bin/sh\ncore:x:1000:1000::/home/core:/bin/sh\n"
    )
    (tmp_path / "etc/group").write_text("root:x:0:\ncore:x:1000:\n")
    return tmp_path


@pytest.fixture
def files(root: Path) -> RootedFiles:
    return RootedFiles(root, Allowlist().allows)


def write(files: RootedFiles, path: str, data: bytes = b"x", mode: int = 0o600) -> None:
    files.write(path, data, mode=mode, user=ROOT_OWNER, group=ROOT_OWNER)


def test_writes_with_mode_owner_and_parents(files: RootedFiles, root: Path) -> None:
    files.write("/var/lib/kubelet/config.json", b"{}", mode=0o600,
                user=Owner(name="core"), group=Owner(name="core"))  # fmt: skip
    info = (root / "var/lib/kubelet/config.json").stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert (info.st_uid, info.st_gid) == (1000, 1000)
    assert stat.S_IMODE((root / "var/lib/kubelet").stat().st_mode) == 0o755
    assert (root / "var/lib/kubelet/config.json").read_bytes() == b"{}"


def test_replaces_atomically_and_cleans_stale_temp(files: RootedFiles, root: Path) -> None:
    write(files, "/etc/kubernetes/kubelet-ca.crt", b"old")
    stale = root / f"etc/kubernetes/.kubelet-ca.crt{TMP_SUFFIX}"
    stale.write_bytes(b"half-written by a crash")
    inode = (root / "etc/kubernetes/kubelet-ca.crt").stat().st_ino
    write(files, "/etc/kubernetes/kubelet-ca.crt", b"new")
    assert (root / "etc/kubernetes/kubelet-ca.crt").read_bytes() == b"new"
    assert (root / "etc/kubernetes/kubelet-ca.crt").stat().st_ino != inode  # renamed over
    assert not stale.exists()
    assert sorted(os.listdir(root / "etc/kubernetes")) == ["kubelet-ca.crt"]


def test_crash_mid_write_leaves_old_contents(files: RootedFiles, root: Path, monkeypatch) -> None:
    write(files, "/etc/kubernetes/kubelet-ca.crt", b"old")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        write(files, "/etc/kubernetes/kubelet-ca.crt", b"new")
    monkeypatch.undo()
    assert (root / "etc/kubernetes/kubelet-ca.crt").read_bytes() == b"old"


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "/etc/random",
        "/var/lib/kubelet/other.json",
        "/home/core/.ssh/authorized_keys",
    ],
)
def test_refuses_paths_off_the_allowlist(files: RootedFiles, path: str) -> None:
    with pytest.raises(HostError, match="not on the live allowlist"):
        write(files, path)


@pytest.mark.parametrize("path", ["relative/path", "/etc/../etc/shadow", "/etc//x", "/etc/./x"])
def test_refuses_unnormalized_paths(files: RootedFiles, path: str) -> None:
    with pytest.raises(HostError, match="refusing"):
        write(files, path)


def test_symlinked_component_is_refused(files: RootedFiles, root: Path, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (root / "var/lib").mkdir(parents=True)
    (root / "var/lib/kubelet").symlink_to(outside)
    with pytest.raises(HostError, match="/var/lib/kubelet is a symlink"):
        write(files, "/var/lib/kubelet/config.json")
    assert list(outside.iterdir()) == []


def test_symlinked_root_component_is_refused(
    files: RootedFiles, root: Path, tmp_path_factory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (root / "home").symlink_to(outside)
    with pytest.raises(HostError, match="/home is a symlink"):
        files.ensure_dir("/home/core/.ssh", mode=0o700, user=ROOT_OWNER, group=ROOT_OWNER)
    assert list(outside.iterdir()) == []


def test_symlink_target_file_is_refused(files: RootedFiles, root: Path, tmp_path) -> None:
    (root / "etc/kubernetes").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (root / "etc/kubernetes/kubelet-ca.crt").symlink_to(victim)
    with pytest.raises(HostError, match="not a regular file"):
        write(files, "/etc/kubernetes/kubelet-ca.crt")
    assert victim.read_text() == "keep"


def test_device_file_is_refused(files: RootedFiles, root: Path) -> None:
    (root / "etc/kubernetes").mkdir()
    os.mkfifo(root / "etc/kubernetes/kubelet-ca.crt")
    with pytest.raises(HostError, match="not a regular file"):
        write(files, "/etc/kubernetes/kubelet-ca.crt")


def test_unknown_owner_name(files: RootedFiles) -> None:
    with pytest.raises(HostError, match="unknown user 'nobody-here'"):
        files.write("/etc/kubernetes/kubelet-ca.crt", b"x", mode=0o644,
                    user=Owner(name="nobody-here"), group=ROOT_OWNER)  # fmt: skip


def test_delete_and_read(files: RootedFiles, root: Path) -> None:
    write(files, "/var/lib/kubelet/config.json", b"s")
    assert files.read("/var/lib/kubelet/config.json") == b"s"
    files.delete("/var/lib/kubelet/config.json")
    assert files.read("/var/lib/kubelet/config.json") is None
    files.delete("/var/lib/kubelet/config.json")  # idempotent


def test_ensure_dir_fixes_mode_and_owner(files: RootedFiles, root: Path) -> None:
    (root / "home/core/.ssh").mkdir(parents=True, mode=0o777)
    files.ensure_dir("/home/core/.ssh", mode=0o700, user=Owner(name="core"),
                     group=Owner(name="core"))  # fmt: skip
    info = (root / "home/core/.ssh").stat()
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, 1000)


def test_set_password_hash(files: RootedFiles, root: Path) -> None:
    (root / "etc/shadow").write_text("root:*:1:0:::::\ncore:*:1:0:::::\n")
    (root / "etc/shadow").chmod(0o000)
    files.set_password_hash("core", "$6$salt$hash")
    assert (root / "etc/shadow").read_text().splitlines()[1].startswith("core:$6$salt$hash:")
    assert stat.S_IMODE((root / "etc/shadow").stat().st_mode) == 0o000
    with pytest.raises(HostError, match="no user 'bob'"):
        files.set_password_hash("bob", "x")
    with pytest.raises(HostError, match="containing ':'"):
        files.set_password_hash("core", "a:b")


# -- ostree's layout links (found booting a real ostree host: vm-tests/ostree) ------------------
SSH_KEYS = "/home/core/.ssh/authorized_keys.d/ignition"


def ostree_layout(root: Path, home: str = "var/home") -> None:
    """/home -> var/home and /usr/local -> ../var/usrlocal, as ostree lays out a bootc host."""
    (root / "var/home/core").mkdir(parents=True)
    (root / "var/usrlocal").mkdir()
    (root / "usr").mkdir()
    (root / "home").symlink_to(home)
    (root / "usr/local").symlink_to("../var/usrlocal")


def test_writes_through_ostree_home_link(files: RootedFiles, root: Path) -> None:
    ostree_layout(root)
    files.ensure_dir("/home/core/.ssh", mode=0o700, user=ROOT_OWNER, group=ROOT_OWNER)
    write(files, SSH_KEYS, b"ssh-ed25519 AAAA")
    assert (
        root / "var/home/core/.ssh/authorized_keys.d/ignition"
    ).read_bytes() == b"ssh-ed25519 AAAA"
    assert files.read(SSH_KEYS) == b"ssh-ed25519 AAAA"
    assert files.list_dir("/home/core/.ssh/authorized_keys.d") == ["ignition"]
    files.delete(SSH_KEYS)
    assert not (root / "var/home/core/.ssh/authorized_keys.d/ignition").exists()
    assert (root / "home").is_symlink()  # the link itself is never replaced


def test_absolute_layout_link_stays_inside_the_host_root(files: RootedFiles, root: Path) -> None:
    ostree_layout(root, home="/var/home")
    write(files, SSH_KEYS)
    assert (root / "var/home/core/.ssh/authorized_keys.d/ignition").exists()


def test_dotdot_in_a_layout_link_walks_the_physical_parent(root: Path) -> None:
    ostree_layout(root)
    files = RootedFiles(root, lambda path: True)
    write(files, "/usr/local/bin/tool")
    assert (root / "var/usrlocal/bin/tool").exists()


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("home", "var/lib"),  # a layout name with another target
        ("home", "/tmp"),
        ("home", "../var/home"),
        ("opt", "var/home"),  # a layout target under another name's place
    ],
)
def test_other_links_at_layout_places_are_refused(root: Path, link: str, target: str) -> None:
    files = RootedFiles(root, lambda path: True)
    (root / "var/home/core").mkdir(parents=True)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(target)
    with pytest.raises(HostError, match=f"/{link} is a symlink or not a directory"):
        write(files, f"/{link}/core/.ssh/authorized_keys.d/ignition")
    assert not list((root / "var/home/core").iterdir())


def test_layout_link_below_the_top_is_refused(root: Path) -> None:
    files = RootedFiles(root, lambda path: True)
    (root / "var/real").mkdir(parents=True)
    (root / "var/home").symlink_to("real")  # only /home is a layout link, not /var/home
    with pytest.raises(HostError, match="/var/home is a symlink"):
        write(files, "/var/home/core/.ssh/authorized_keys.d/ignition")


def test_link_in_a_layout_links_target_is_refused(
    files: RootedFiles, root: Path, tmp_path_factory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (root / "var").mkdir()
    (root / "var/home").symlink_to(outside)  # planted where the layout link points
    (root / "home").symlink_to("var/home")
    with pytest.raises(HostError, match="/home -> var/home is a symlink"):
        write(files, SSH_KEYS)
    assert list(outside.iterdir()) == []


def test_layout_link_owned_by_another_user_is_refused(
    files: RootedFiles, root: Path, monkeypatch
) -> None:
    ostree_layout(root)
    if os.geteuid() == 0:
        os.lchown(root / "home", 4321, 4321)
    else:  # the link is ours: make the agent someone else
        monkeypatch.setattr("agent.host.files.os.geteuid", lambda: os.getuid() + 1)
    with pytest.raises(HostError, match="/home is a symlink"):
        write(files, SSH_KEYS)


# -- writes that change nothing ---------------------------------------------------------------
def test_a_write_that_changes_nothing_touches_nothing(files: RootedFiles, root: Path) -> None:
    path = "/var/lib/kubelet/config.json"
    core = Owner(name="core")
    assert files.write(path, b"{}", mode=0o600, user=core, group=core) is True
    info = (root / path.lstrip("/")).stat()
    assert files.write(path, b"{}", mode=0o600, user=core, group=core) is False
    again = (root / path.lstrip("/")).stat()
    assert (again.st_ino, again.st_mtime_ns, again.st_ctime_ns) == (
        info.st_ino, info.st_mtime_ns, info.st_ctime_ns,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("contents", "mode", "owner"),
    [(b"[]", 0o600, "core"), (b"{}", 0o644, "core"), (b"{}", 0o600, "root")],
    ids=["bytes", "mode", "owner"],
)
def test_any_difference_is_written(files: RootedFiles, root: Path, contents: bytes, mode: int,
                                   owner: str) -> None:  # fmt: skip
    if owner != "core" and os.geteuid() != 0:
        pytest.skip("owners are set only by root")
    path = "/var/lib/kubelet/config.json"
    files.write(path, b"{}", mode=0o600, user=Owner(name="core"), group=Owner(name="core"))
    inode = (root / path.lstrip("/")).stat().st_ino
    assert files.write(path, contents, mode=mode, user=Owner(name=owner),
                       group=Owner(name=owner)) is True  # fmt: skip
    info = (root / path.lstrip("/")).stat()
    assert info.st_ino != inode  # replaced, atomically
    assert (stat.S_IMODE(info.st_mode), (root / path.lstrip("/")).read_bytes()) == (mode, contents)


def test_ensure_dir_and_delete_that_change_nothing(files: RootedFiles, root: Path) -> None:
    core = Owner(name="core")
    files.ensure_dir("/home/core/.ssh", mode=0o700, user=core, group=core)
    before = (root / "home/core/.ssh").stat().st_ctime_ns
    files.ensure_dir("/home/core/.ssh", mode=0o700, user=core, group=core)
    assert (root / "home/core/.ssh").stat().st_ctime_ns == before  # no chmod, no chown
    assert files.delete("/var/lib/kubelet/config.json") is False


def test_a_password_hash_already_set_is_not_written(files: RootedFiles, root: Path) -> None:
    (root / "etc/shadow").write_text("root:*:1::::::\ncore:$6$old:1::::::\n")
    (root / "etc/shadow").chmod(0o600)
    assert files.set_password_hash("core", "$6$new") is True
    mtime = (root / "etc/shadow").stat().st_mtime_ns
    assert files.set_password_hash("core", "$6$new") is False
    assert (root / "etc/shadow").stat().st_mtime_ns == mtime
