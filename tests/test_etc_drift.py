"""Image-content drift in /etc: parsing `ostree admin config-diff`, telling drift from the
host's own files, the reason text; and the simulated host's config-diff, checked against the
real ostree on a sysroot built here (ostree 2022.7, Debian 12's; .ci/run installs it)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import HostError, InputError
from agent.model.etc_drift import (
    DEFAULT_ETC_IGNORE,
    EtcChange,
    describe,
    image_drift,
    parse_config_diff,
)
from standins.host.etc_diff import simulated_config_diff

M, D, A = "M", "D", "A"

PARSE_CASES = [
    ("", ()),
    ("M    motd\n", (EtcChange(M, "/etc/motd"),)),
    ("D    chrony.conf\n", (EtcChange(D, "/etc/chrony.conf"),)),
    ("A    local.conf\n", (EtcChange(A, "/etc/local.conf"),)),
    ("M    sub\nM    ssh/sshd_config\nD    gone\nA    sub/new.conf\nA    newdir\n"
     "A    newdir/x\n",
     (EtcChange(M, "/etc/sub"), EtcChange(M, "/etc/ssh/sshd_config"), EtcChange(D, "/etc/gone"),
      EtcChange(A, "/etc/sub/new.conf"), EtcChange(A, "/etc/newdir"),
      EtcChange(A, "/etc/newdir/x"))),
    ("M    with space.conf\nA    two  spaces \n",
     (EtcChange(M, "/etc/with space.conf"), EtcChange(A, "/etc/two  spaces "))),
    # The path starts after exactly four spaces: a fifth one is the name's.
    ("M     leading\n", (EtcChange(M, "/etc/ leading"),)),
    ("M    café.conf\n", (EtcChange(M, "/etc/café.conf"),)),
    ("M    no-final-newline", (EtcChange(M, "/etc/no-final-newline"),)),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), PARSE_CASES)
def test_parse_config_diff(text: str, expected: tuple[EtcChange, ...]) -> None:
    assert parse_config_diff(text) == expected


MALFORMED = [
    ("X    motd\n", 1),
    ("m    motd\n", 1),
    ("M   three-spaces\n", 1),
    ("M\tmotd\n", 1),
    ("MM    motd\n", 1),
    ("M    \n", 1),
    ("M\n", 1),
    ("M    motd\n\nA    x\n", 2),  # a blank line is not an entry
    ("M    motd\nD    ok\nmodified: motd\n", 3),
    ("M    /etc/motd\n", 1),  # ostree prints the path relative to /etc
    ("M    a/../b\n", 1),
    ("M    a//b\n", 1),
    ("M    sub/\n", 1),
    ("A    x\n[Invalid UTF-8] M    caf\\xe9\n", 2),  # GLib under a non-UTF-8 locale
]


@pytest.mark.parametrize(("text", "line"), MALFORMED)
def test_a_malformed_line_is_an_input_error_naming_it(text: str, line: int) -> None:
    with pytest.raises(InputError) as caught:
        parse_config_diff(text)
    assert caught.value.field == f"line {line}"
    assert f"line {line}: " in str(caught.value)


def test_the_error_for_a_non_utf8_locale_says_what_to_do() -> None:
    with pytest.raises(InputError, match="UTF-8 locale"):
        parse_config_diff("[Invalid UTF-8] M    caf\\xe9\n")


CHANGES = (
    EtcChange(M, "/etc/motd"),
    EtcChange(A, "/etc/local.conf"),
    EtcChange(D, "/etc/chrony.conf"),
    EtcChange(M, "/etc/passwd"),
    EtcChange(M, "/etc/ssh/sshd_config"),
    EtcChange(M, "/etc/ssh/ssh_host_ed25519_key"),
    EtcChange(D, "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"),
    EtcChange(M, "/etc/kubernetes/kubelet-ca.crt"),
    EtcChange(M, "/etc/kubernetes/kubeconfig"),
    EtcChange(A, "/etc/machine-config-daemon/currentconfig"),
    EtcChange(M, "/etc/containers/registries.conf"),
)

DRIFT_CASES = [
    # The defaults: the host's own files go, an A is never drift, the rest stays in order.
    ({}, (EtcChange(M, "/etc/motd"), EtcChange(D, "/etc/chrony.conf"),
          EtcChange(M, "/etc/ssh/sshd_config"), EtcChange(M, "/etc/kubernetes/kubelet-ca.crt"),
          EtcChange(M, "/etc/containers/registries.conf"))),
    # The live-managed paths the caller passes go too, by exact path only.
    ({"also_ignored": ("/etc/kubernetes/kubelet-ca.crt", "/etc/containers")},
     (EtcChange(M, "/etc/motd"), EtcChange(D, "/etc/chrony.conf"),
      EtcChange(M, "/etc/ssh/sshd_config"), EtcChange(M, "/etc/containers/registries.conf"))),
    # No ignore list: only the A entries go.
    ({"ignore": ()}, tuple(c for c in CHANGES if c.kind != A)),
    # Globs: `*` crosses `/`.
    ({"ignore": ("/etc/ssh/*", "/etc/k*"), "also_ignored": ["/etc/motd"]},
     (EtcChange(D, "/etc/chrony.conf"), EtcChange(M, "/etc/passwd"),
      EtcChange(D, "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"),
      EtcChange(M, "/etc/containers/registries.conf"))),
]  # fmt: skip


@pytest.mark.parametrize(("options", "expected"), DRIFT_CASES)
def test_image_drift(options: dict, expected: tuple[EtcChange, ...]) -> None:
    assert image_drift(CHANGES, **options) == expected


def test_image_drift_takes_any_iterables() -> None:
    drift = image_drift(iter(CHANGES), ignore=iter(DEFAULT_ETC_IGNORE),
                        also_ignored=(p for p in ["/etc/motd"]))  # fmt: skip
    assert drift[0] == EtcChange(D, "/etc/chrony.conf")


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/etc/passwd-", "/etc/group", "/etc/group-", "/etc/shadow", "/etc/shadow-",
     "/etc/gshadow", "/etc/gshadow-", "/etc/subuid", "/etc/subuid-", "/etc/subgid",
     "/etc/subgid-", "/etc/machine-id", "/etc/hostname", "/etc/localtime", "/etc/adjtime",
     "/etc/resolv.conf", "/etc/.updated", "/etc/.pwd.lock", "/etc/ld.so.cache",
     "/etc/pki/ca-trust/extracted/openssl/ca-bundle.trust.crt", "/etc/ssh/ssh_host_rsa_key.pub",
     "/etc/machine-config-daemon/node-annotations.json", "/etc/image-mode-agent/agent.yaml",
     "/etc/image-mode-agent/check/required.d/10-x", "/etc/kubernetes/kubeconfig",
     "/etc/mco/proxy.env", "/etc/docker/certs.d/registry.example:5000/ca.crt"],
)  # fmt: skip
def test_default_ignore_covers_the_hosts_own_files(path: str) -> None:
    assert image_drift([EtcChange(M, path), EtcChange(D, path)]) == ()


@pytest.mark.parametrize(
    "path",
    ["/etc/passwdx", "/etc/ssh/sshd_config", "/etc/kubernetes/kubelet.conf", "/etc/pki/tls/x",
     "/etc/sub/etc/passwd", "/etc/hostname.d"],
)  # fmt: skip
def test_default_ignore_keeps_image_files(path: str) -> None:
    assert image_drift([EtcChange(M, path)]) == (EtcChange(M, path),)


def test_describe() -> None:
    assert describe(EtcChange(M, "/etc/foo")) == (
        'file "/etc/foo" differs from the booted image\'s /usr/etc/foo'
    )
    assert describe(EtcChange(D, "/etc/foo")) == 'file "/etc/foo" the booted image ships is missing'
    assert describe(EtcChange(M, "/etc/with space")) == (
        'file "/etc/with space" differs from the booted image\'s /usr/etc/with space'
    )


def test_describe_keeps_a_reason_on_one_printable_line() -> None:
    text = describe(EtcChange(M, "/etc/a\nb\udcff"))
    assert text.isprintable()
    assert "\\n" in text


# The simulated host's config-diff, on trees built by hand.


def _tree(root: Path) -> tuple[Path, Path]:
    image, live = root / "usr/etc", root / "etc"
    image.mkdir(parents=True)
    live.mkdir()
    return image, live


def test_simulated_config_diff_of_equal_trees_is_empty(tmp_path: Path) -> None:
    image, live = _tree(tmp_path)
    for tree in (image, live):
        (tree / "motd").write_text("hello\n")
        (tree / "sub").mkdir()
        (tree / "sub/link").symlink_to("../motd")
        os.mkfifo(tree / "fifo")  # never opened: that would block
    assert simulated_config_diff(tmp_path) == ""


def test_simulated_config_diff_follows_no_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub/secret").write_text("x")
    root = tmp_path / "root"
    image, live = _tree(root)
    (image / "sub").mkdir()
    (image / "sub/secret").write_text("x")
    (live / "sub").symlink_to(outside / "sub")  # the same content, through a symlink
    (live / "dirlink").symlink_to(outside)
    assert simulated_config_diff(root) == "M    sub\nA    dirlink\n"


@pytest.mark.parametrize("which", ["etc", "usr/etc", "usr"])
def test_simulated_config_diff_refuses_a_symlinked_tree(tmp_path: Path, which: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "etc").mkdir(parents=True)
    root = tmp_path / "root"
    _tree(root)
    target = root / which
    shutil.rmtree(target)
    target.symlink_to(elsewhere / "etc" if which != "usr" else elsewhere)
    with pytest.raises(HostError) as caught:
        simulated_config_diff(root)
    assert caught.value.kind == "path"


def test_simulated_config_diff_without_usr_etc_is_an_image_without_etc(tmp_path: Path) -> None:
    # A simulated host whose image ships no /etc file has no root/usr/etc: an empty one.
    (tmp_path / "etc/sub").mkdir(parents=True)
    (tmp_path / "etc/sub/x").write_text("x\n")
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    without = simulated_config_diff(tmp_path)
    assert sorted(without.splitlines()) == ["A    passwd", "A    sub", "A    sub/x"]
    (tmp_path / "usr/etc").mkdir(parents=True)
    assert simulated_config_diff(tmp_path) == without


def test_simulated_config_diff_without_etc_is_a_host_error(tmp_path: Path) -> None:
    (tmp_path / "usr/etc").mkdir(parents=True)
    with pytest.raises(HostError):
        simulated_config_diff(tmp_path)


# The real peer: ostree 2022.7 on a sysroot built in tmp_path.

OS = "testos"
BRANCH = "testos/v1"
CONF_D = 40  # /usr/etc/conf.d/f00..f39, every one edited on the host
MANY = 1050  # an added /etc/many: more entries than GLib reads and sorts at a time (1000)
# LC_ALL: GLib prints names as they are only under a UTF-8 locale (else `?` for what ASCII
# lacks). mutable-deployments: ostree sets no immutable bit, so pytest can remove the tree.
OSTREE_ENV = {**os.environ, "LC_ALL": "C.UTF-8", "OSTREE_SYSROOT_DEBUG": "mutable-deployments"}


def _ostree(*args: str) -> bytes:
    assert shutil.which("ostree"), "the real-peer test needs ostree (apt-get install ostree)"
    done = subprocess.run(["ostree", *args], capture_output=True, env=OSTREE_ENV, timeout=120)
    assert done.returncode == 0, f"ostree {' '.join(args)}: {done.stderr.decode(errors='replace')}"
    return done.stdout


@pytest.fixture
def tmpfs_dir() -> Iterator[Path]:
    """A directory on tmpfs for the sysroot's /boot. After writing the boot entries ostree
    freezes and thaws /boot's filesystem (FIFREEZE): in tmp_path, as root, that would freeze
    the filesystem this machine (or CI's host) runs on; tmpfs has no freeze, so ostree falls
    back to syncfs."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", "/dev/shm"], capture_output=True,
                          text=True, timeout=10).stdout.strip()  # fmt: skip
    assert kind == "tmpfs", (f"/dev/shm is {kind or 'missing'}, not tmpfs: refusing to let "
                             "ostree freeze another filesystem")  # fmt: skip
    path = Path(tempfile.mkdtemp(prefix="etc-drift-boot.", dir="/dev/shm"))
    yield path
    shutil.rmtree(path)


IMAGE_DIRS = ("sub", "gone", "perms", "linkdir", "conf.d")
IMAGE_FILES = {
    "motd": "image motd\n", "issue": "image issue\n", "chmodme": "c\n", "chownme": "o\n",
    "deleteme": "d\n", "becomesdir": "f\n", "run.sh": "#!/bin/sh\n", "with space.conf": "s\n",
    "café.conf": "utf-8\n", "dup1": "same\n", "dup2": "same\n", "sub/a.conf": "a\n",
    "sub/b.conf": "b\n", "gone/x": "x\n", "gone/y": "y\n", "perms/p": "p\n", "linkdir/l": "l\n",
    **{f"conf.d/f{i:02}": f"{i}\n" for i in range(CONF_D)},
}  # fmt: skip


def _write_tree(etc: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (etc / name).parent.mkdir(parents=True, exist_ok=True)
        (etc / name).write_text(text)
        (etc / name).chmod(0o755 if name.endswith(".sh") else 0o644)


def _seed_tree(tree: Path) -> None:
    """The image's file contents under other names, committed first. A deployment's /usr/etc
    holds hard links to the repository's objects, whose inodes ostree allocated in the order
    it read the committed directory; committed under the image's own names, that is about the
    order the deployment lists them in, and GLib's sort by inode would go unseen."""
    contents = list(IMAGE_FILES.items())
    random.Random(0).shuffle(contents)
    # The same name suffix keeps the script's mode (_write_tree), so its object too is seeded.
    _write_tree(tree / "usr/share/seed", {f"s{k}.sh" if name.endswith(".sh") else f"s{k}": text
                                          for k, (name, text) in enumerate(contents)})  # fmt: skip


def _image_tree(tree: Path) -> None:
    """An image: a fake kernel (ostree deploy wants one), os-release, and /usr/etc."""
    (tree / "usr/lib/modules/1.0").mkdir(parents=True)
    (tree / "usr/lib/modules/1.0/vmlinuz").write_text("not a kernel\n")
    (tree / "usr/lib/modules/1.0/initramfs.img").write_text("not an initramfs\n")
    (tree / "usr/lib/os-release").write_text(f"ID={OS}\nNAME={OS}\n")
    etc = tree / "usr/etc"
    for name in IMAGE_DIRS:
        (etc / name).mkdir(parents=True)
    _write_tree(etc, IMAGE_FILES)
    for name in (".", *IMAGE_DIRS):
        (etc / name).chmod(0o755)
    (etc / "link").symlink_to("motd")
    (etc / "owned-link").symlink_to("issue")


def _edit_live_etc(etc: Path) -> set[EtcChange]:
    """What a host does to its /etc; returns the entries config-diff must report."""
    (etc / "motd").write_text("edited motd\n")  # content
    (etc / "chmodme").chmod(0o600)  # mode only
    os.chown(etc / "chownme", 1000, 1000)  # owner only
    os.lchown(etc / "owned-link", 1000, 1000)  # a symlink's owner only
    (etc / "deleteme").unlink()
    (etc / "newfile").write_text("new\n")
    (etc / "becomesdir").unlink()  # file -> directory: one M, its contents not listed
    (etc / "becomesdir").mkdir()
    (etc / "becomesdir/inner").write_text("i\n")
    (etc / "link").unlink()  # a symlink's target
    (etc / "link").symlink_to("issue")
    (etc / "newdir/deeper").mkdir(parents=True)  # an added directory: it and all below it
    (etc / "newdir/x.conf").write_text("x\n")
    (etc / "newdir/deeper/y.conf").write_text("y\n")
    (etc / "sub/b.conf").write_text("b edited\n")
    (etc / "sub/c.conf").write_text("c\n")  # added inside a directory the image ships
    shutil.rmtree(etc / "gone")  # a removed directory: one D
    (etc / "perms").chmod(0o700)  # a directory's own mode
    shutil.rmtree(etc / "linkdir")  # directory -> symlink, leading out of the tree
    (etc / "linkdir").symlink_to("/usr")
    (etc / "with space.conf").write_text("s edited\n")
    (etc / "café.conf").write_text("utf-8 edited\n")
    (etc / "dup2").write_text("not the same\n")  # dup1 and dup2 are one inode in /usr/etc
    os.mkfifo(etc / "fifo")
    # Neither an mtime nor an xattr is compared (config-diff ignores xattrs).
    os.utime(etc / "issue", (0, 0))
    with contextlib.suppress(OSError):  # a filesystem without user xattrs: nothing to show
        os.setxattr(etc / "issue", "user.etc-drift-test", b"1")
    conf_d = [f"conf.d/f{i:02}" for i in range(CONF_D)]
    for name in conf_d:
        (etc / name).write_text("edited\n")
    (etc / "many").mkdir()
    many = [f"many/m{i:04}" for i in range(MANY)]
    for name in many:  # inodes in name order, listed in the directory's own order
        (etc / name).write_text("m\n")
    expected = {(M, p) for p in ("motd", "chmodme", "chownme", "owned-link", "becomesdir",
                                 "link", "sub/b.conf", "perms", "linkdir", "with space.conf",
                                 "café.conf", "dup2", *conf_d)}  # fmt: skip
    expected |= {(D, "deleteme"), (D, "gone")}
    expected |= {(A, p) for p in ("newfile", "newdir", "newdir/deeper", "newdir/deeper/y.conf",
                                  "newdir/x.conf", "sub/c.conf", "fifo", "many")}  # fmt: skip
    expected |= {(A, p) for p in many}
    return {EtcChange(kind, "/etc/" + rel) for kind, rel in expected}


def test_simulated_config_diff_prints_what_real_ostree_prints(tmp_path: Path,
                                                              tmpfs_dir: Path) -> None:  # fmt: skip
    sysroot, seed, tree = tmp_path / "sysroot", tmp_path / "seed", tmp_path / "tree"
    repo = f"--repo={sysroot}/ostree/repo"
    sysroot.mkdir()
    (sysroot / "boot").symlink_to(tmpfs_dir)
    _ostree("admin", "init-fs", str(sysroot))
    _ostree("admin", "os-init", f"--sysroot={sysroot}", OS)
    _ostree(repo, "config", "set", "core.fsync", "false")  # a scratch repository
    _seed_tree(seed)
    _ostree(repo, "commit", "--branch=seed", "--owner-uid=0", "--owner-gid=0", f"--tree=dir={seed}")
    _image_tree(tree)
    _ostree(repo, "commit", f"--branch={BRANCH}", "--owner-uid=0", "--owner-gid=0",
            f"--tree=dir={tree}")  # fmt: skip
    _ostree("admin", "deploy", f"--sysroot={sysroot}", f"--os={OS}", "--karg-none", BRANCH)
    [deployment] = (sysroot / "ostree/deploy" / OS / "deploy").glob("*.0")
    diff = ("admin", "config-diff", f"--sysroot={sysroot}", f"--os={OS}")
    assert _ostree(*diff) == b""  # a fresh deployment's /etc is a copy of /usr/etc
    assert simulated_config_diff(deployment) == ""

    expected = _edit_live_etc(deployment / "etc")
    real = _ostree(*diff).decode(errors="surrogateescape")

    changes = parse_config_diff(real)
    assert set(changes) == expected
    assert len(changes) == len(expected)
    kinds = [change.kind for change in changes]
    assert kinds == sorted(kinds, key="MDA".index)  # every M, then every D, then every A
    assert simulated_config_diff(deployment) == real
