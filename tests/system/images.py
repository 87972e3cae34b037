"""The repository's container images (containerfiles/), built the way a person would build them:
a context folder of wheels (+ systemd/), `podman build --build-arg BASE=…`.

No registry outside 127.0.0.1 is reachable, so the bases are built here: a minimal Debian
Python (mmdebstrap, cached as a tarball under a hash of its build script) for the DaemonSet
image, and the system tier's own rootfs for the bootc layer. Both are imported into the private
podman storage once per key. The dependency wheels are cached under a hash of pyproject's
dependency list; the agent's own wheel is rebuilt every run (it changes with every commit)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.system.machine import MachineError
from tests.system.podman import import_tarball, import_tree, podman, prune_refs
from tests.system.rootfs import REPO, cache_dir, mirror, requirements

HERE = Path(__file__).resolve().parent
CONTAINERFILES = REPO / "containerfiles"
PYBASE_SCRIPT = HERE / "build-pybase.sh"
PYBASE_REF = "localhost/ima-system-pybase"
ROOTFS_REF = "localhost/ima-system-rootfs"
# Both bases run Debian 12's CPython 3.11 on x86_64 (glibc 2.36): the wheels are picked for that
# interpreter, whatever Python the host's venv has (pip 23 does not widen a manylinux_2_36 tag
# to the older ones by itself, so both common tags are named).
WHEEL_TARGET = ("--python-version", "3.11", "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux_2_28_x86_64")  # fmt: skip
# What the agent's wheel is built from: the repository minus top-level folders a wheel never
# contains (and caches anywhere).
NOT_IN_WHEEL = {".git", ".venv", "build", ".hypothesis", "tests", "vm-tests", "bench", "docs",
                "deploy", "containerfiles"}  # fmt: skip


@dataclass(frozen=True)
class Built:
    ref: str
    seconds: float


def _run(cmd: list[str], timeout: int, what: str) -> subprocess.CompletedProcess:
    result = subprocess.run(["timeout", str(timeout), *cmd], capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise MachineError(f"{what} failed ({result.returncode}):\n{tail}")
    return result


def _locked(name: str):
    """A build lock in the cache: two concurrent runs must not build the same thing twice."""
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    lock = open(base / f".{name}.lock", "w")  # noqa: SIM115 - closed by the caller's `with`
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def dependency_wheels() -> Path:
    """The agent's dependencies as wheels for the bases' Python, downloaded once per key."""
    reqs = requirements()
    key = hashlib.sha256((reqs + " ".join(WHEEL_TARGET)).encode()).hexdigest()[:16]
    out = cache_dir() / f"wheels-{key}"
    with _locked("wheels"):
        if not (out / ".complete").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            (out / "requirements.txt").write_text(reqs)
            _run([str(REPO / ".venv/bin/pip"), "download", "-q", "--only-binary=:all:",
                  *WHEEL_TARGET, "-d", str(out), "-r", str(out / "requirements.txt")],
                 600, "pip download of the agent's dependencies")  # fmt: skip
            (out / ".complete").touch()
            for old in cache_dir().glob("wheels-*"):
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
    return out


def _not_in_wheel(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == REPO
    return {
        n for n in names
        if (top and (n in NOT_IN_WHEEL or n.endswith(".egg-info")))
        or n == "__pycache__" or n.endswith("_cache")
    }  # fmt: skip


def build_context(workdir: Path) -> Path:
    """workdir/ctx: wheels/ (the agent's fresh wheel + the cached dependency wheels) and copies
    of the repo's systemd/ (symlinks kept: the timer mask is one) and docs/. The agent's wheel
    is built from a copy of the repo, so no build/ or egg-info lands in the checkout."""
    ctx = workdir / "ctx"
    if (ctx / "wheels").is_dir():
        return ctx  # one context per run, shared by both images
    src = workdir / "agent-src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_not_in_wheel)
    wheels = ctx / "wheels"
    wheels.mkdir(parents=True)
    _run([str(REPO / ".venv/bin/pip"), "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
         300, "pip wheel of the agent")  # fmt: skip
    for dep in dependency_wheels().glob("*.whl"):
        shutil.copy2(dep, wheels)
    shutil.copytree(REPO / "systemd", ctx / "systemd", symlinks=True)
    shutil.copytree(REPO / "docs", ctx / "docs")
    shutil.rmtree(src)
    return ctx


def python_base(log=print) -> str:
    """The minimal Debian python3 + venv base (cached tarball, imported once)."""
    key = hashlib.sha256(PYBASE_SCRIPT.read_bytes()).hexdigest()[:16]
    tarball = cache_dir() / f"pybase-{key}.tar"
    ref = f"{PYBASE_REF}:{key}"
    with _locked("pybase"):
        if not tarball.exists():
            log(f"building the Debian python base {key} (cold, ~20 s)")
            _run([str(PYBASE_SCRIPT), str(tarball), mirror()], 1000, "build-pybase.sh")
            for old in cache_dir().glob("pybase-*.tar"):
                if old != tarball:
                    old.unlink()
        import_tarball(tarball, ref)
        prune_refs(PYBASE_REF, keep=ref)
    return ref


def rootfs_base(rootfs: Path) -> str:
    """The system tier's own rootfs as a podman image (imported once per rootfs key: ~30 s)."""
    ref = f"{ROOTFS_REF}:{rootfs.parent.name.removeprefix('rootfs-')}"
    with _locked("rootfs-image"):
        import_tree(rootfs, ref)
        prune_refs(ROOTFS_REF, keep=ref)
    return ref


def build(containerfile: str, tag: str, ctx: Path, base: str, *args: str) -> Built:
    """`podman build` offline (--network=none: the install must need no index)."""
    start = time.monotonic()
    # --layers=false: one commit per stage instead of one per instruction (each is a full copy
    # of the tree on vfs), and no layer cache that could serve a stale agent.
    podman("build", "--network=none", "--layers=false", "-q",
           "-f", str(CONTAINERFILES / containerfile), "-t", tag,
           "--build-arg", f"BASE={base}", *args, str(ctx), timeout=600)  # fmt: skip
    return Built(tag, time.monotonic() - start)


def mount_image(ref: str) -> Path:
    """The image's root filesystem as a directory (vfs: its layer directory, no copy)."""
    return Path(podman("image", "mount", ref, timeout=60).stdout.strip())


def unmount_image(ref: str) -> None:
    podman("image", "unmount", ref, timeout=60, check=False)


def remove_image(ref: str) -> None:
    """Per-run images go again (400+ MB each on vfs); dangling build stages with them."""
    podman("rmi", "-f", ref, timeout=120, check=False)
    podman("image", "prune", "-f", timeout=120, check=False)
