"""The ostree VM tier's cached disk: Debian 12 deployed by ostree, booted by extlinux, with the
test image v1 as its first deployment (rebuilt only when the build inputs change)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.system import oci
from tests.system.rootfs import cache_dir, mirror, requirements
from tests.system.world import image_files

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build-disk.sh"
PACKAGES = HERE / "packages.txt"
# Files baked into the disk: a change to any of them must rebuild it. The guest bootc runs from
# the repo's 9p share, but its import made the disk's v1 commit (under its image ref, on top of
# the base), so the disk follows it too.
BAKED = (
    BUILD,
    PACKAGES,
    HERE / "guest/harness-boot.service",
    HERE / "guest/harness-seed.service",
    HERE / "guest/harness-step.service",
    HERE / "guest/bootc",
)
GUEST_REGISTRY = "10.0.2.100:5000"
GUEST_IMAGE = f"{GUEST_REGISTRY}/testos"


@dataclass(frozen=True)
class Disk:
    dir: Path
    built: bool
    seconds: float
    v1_digest: str

    @property
    def image(self) -> Path:
        return self.dir / "disk.img"


def v1_layout(into: Path) -> str:
    """The system tier's image v1 as an OCI layout (reproducible: the registry serves the same
    digest); returns its digest."""
    return oci.write_image(into, "v1", "v1", image_files("v1"))


def input_key(v1_digest: str) -> str:
    digest = hashlib.sha256((requirements() + v1_digest).encode())
    for path in BAKED:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def ensure_disk(log=print) -> Disk:
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ima-ostree-v1-") as tmp:
        layout = Path(tmp) / "oci"
        v1 = v1_layout(layout)
        out = base / f"ostree-{input_key(v1)}"
        with open(base / ".ostree-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (out / "disk.img").exists():
                return Disk(out, False, time.monotonic() - start, v1)
            log(f"building the ostree disk (cold, ~3-5 min) in {out}")
            out.mkdir(exist_ok=True)
            req = out / "requirements.txt"
            req.write_text(requirements())
            cmd = ["timeout", "2400", str(BUILD), str(out), str(PACKAGES), str(req), mirror(),
                   str(layout), v1, GUEST_IMAGE]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            (out / "build.log").write_text(proc.stdout + proc.stderr)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
                raise RuntimeError(f"ostree disk build failed ({proc.returncode}):\n{tail}")
            for old in base.glob("ostree-*"):
                if old != out:
                    shutil.rmtree(old, ignore_errors=True)
            return Disk(out, True, time.monotonic() - start, v1)


if __name__ == "__main__":
    print(ensure_disk())
