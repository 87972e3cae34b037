"""Podman with a private storage root and config under the system tier's cache.

Nothing is shared with other users of the machine, and every call has a timeout. The config is
the one that works on the machines the tests run on: vfs (no overlay-on-overlay), runc (crun refuses
this host's hybrid cgroups) and nofile/nproc limits of 1024 (root lacks CAP_SYS_RESOURCE, so
podman's default raise of RLIMIT_NOFILE fails)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.system.machine import MachineError
from tests.system.rootfs import cache_dir

STORAGE_CONF = """\
[storage]
driver = "vfs"
graphroot = "{root}/root"
runroot = "{root}/run"
"""

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{root}/tmp"
"""


def podman_home() -> Path:
    return cache_dir() / "podman"


def podman_env() -> dict[str, str]:
    """CONTAINERS_STORAGE_CONF / CONTAINERS_CONF for every call, written on first use."""
    home = podman_home()
    home.mkdir(parents=True, exist_ok=True)
    storage, containers = home / "storage.conf", home / "containers.conf"
    for path, text in ((storage, STORAGE_CONF), (containers, CONTAINERS_CONF)):
        content = text.format(root=home)
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
    return {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_CONF": str(containers),
    }


def require_tools(*tools: str) -> None:
    """A missing tool is a FAIL with the reason, never a skip."""
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise MachineError(
            f"missing host tools: {', '.join(missing)} (run tests/system/setup-host.sh)"
        )


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["timeout", str(int(timeout)), "podman", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, env=podman_env())
    if check and result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise MachineError(f"podman {' '.join(args[:3])}… exited {result.returncode}:\n{tail}")
    return result


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, timeout=30, check=False).returncode == 0


def import_tree(root: Path, ref: str, timeout: float = 300) -> None:
    """`podman import` a root directory (tar streamed from it) as `ref`, unless already there."""
    if image_exists(ref):
        return
    tar = subprocess.Popen(
        ["timeout", str(int(timeout)), "tar", "-C", str(root), "--numeric-owner", "-c", "."],
        stdout=subprocess.PIPE,
    )
    try:
        result = subprocess.run(
            ["timeout", str(int(timeout)), "podman", "import", "-q", "-", ref],
            stdin=tar.stdout, capture_output=True, text=True, env=podman_env(),
        )  # fmt: skip
    finally:
        assert tar.stdout
        tar.stdout.close()
        tar.wait()
    if result.returncode != 0 or tar.returncode != 0:
        raise MachineError(f"podman import {ref} failed: {result.stderr.strip()[-800:]}")


def import_tarball(tarball: Path, ref: str, timeout: float = 300) -> None:
    if not image_exists(ref):
        podman("import", "-q", str(tarball), ref, timeout=timeout)


def prune_refs(prefix: str, keep: str) -> None:
    """Drop older cached bases (`prefix:<key>`) so the private storage does not grow forever."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", timeout=30).stdout
    for ref in listed.split():
        if ref.startswith(prefix + ":") and ref != keep:
            podman("rmi", "-f", ref, timeout=60, check=False)
