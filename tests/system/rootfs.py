"""The cached Debian root filesystem every system scenario boots from.

Rebuilt only when its inputs change: the build script, the package list and the agent's Python
dependencies (pyproject.toml). The agent's source is bind-mounted, never baked in."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_SCRIPT = HERE / "build-rootfs.sh"
PACKAGES = HERE / "packages.txt"
DEFAULT_CACHE = Path("/var/cache/image-mode-agent-tests")


def cache_dir() -> Path:
    return Path(os.environ.get("IMA_SYSTEM_CACHE", str(DEFAULT_CACHE)))


def requirements() -> str:
    """The agent's runtime dependencies, one a line (what the container's venv installs)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return "".join(f"{dep}\n" for dep in sorted(project["dependencies"]))


def mirror() -> str:
    """The Debian mirror apt on this machine already uses (no other network is reachable)."""
    if url := os.environ.get("IMA_SYSTEM_MIRROR"):
        return url
    for src in sorted(Path("/etc/apt").glob("sources.list.d/*.sources")):
        for line in src.read_text().splitlines():
            if line.startswith("URIs:") and "debian.org/debian" in line and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def input_key() -> str:
    digest = hashlib.sha256()
    for part in (BUILD_SCRIPT.read_bytes(), PACKAGES.read_bytes(), requirements().encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Rootfs:
    path: Path  # the root directory (read-only lower layer for every machine)
    built: bool  # built by this call (cold) rather than found in the cache
    seconds: float


def ensure_rootfs(log=print) -> Rootfs:
    """The cached rootfs for the current inputs, building it under a lock when missing (two
    concurrent runs must not build the same tree twice)."""
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    key = input_key()
    out = base / f"rootfs-{key}"
    start = time.monotonic()
    with open(base / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "root").is_dir():
            return Rootfs(out / "root", False, time.monotonic() - start)
        log(f"building rootfs {key} (cold, ~1-2 min) in {out}")
        out.mkdir(exist_ok=True)
        req = out / "requirements.txt"
        req.write_text(requirements())
        proc = subprocess.run(
            ["timeout", "1500", str(BUILD_SCRIPT), str(out), str(PACKAGES), str(req), mirror()],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            (out / "build.log").write_text(proc.stdout + proc.stderr)
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise RuntimeError(f"rootfs build failed ({proc.returncode}):\n{tail}")
        _prune(base, keep=out)
        return Rootfs(out / "root", True, time.monotonic() - start)


def _prune(base: Path, keep: Path) -> None:
    """Old rootfs trees are 400+ MB each: keep only the current one."""
    for old in base.glob("rootfs-*"):
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
