"""The VM tier's cached disk + kernel + initrd (rebuilt only when the build inputs change)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.system.rootfs import REPO, cache_dir, mirror, requirements

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build-image.sh"
PACKAGES = HERE / "packages.txt"
# Files baked into the image: a change to any of them must rebuild it.
BAKED = (
    BUILD,
    PACKAGES,
    HERE / "guest/harness-seed.service",
    HERE / "guest/harness-step.service",
    REPO / "tests/system/guest/standin-bootc-boot.service",
    REPO / "tests/system/guest/bootc-fetch-apply-updates.timer",
    REPO / "tests/system/guest/bootc-fetch-apply-updates.service",
)


@dataclass(frozen=True)
class VmImage:
    dir: Path
    built: bool
    seconds: float

    @property
    def base(self) -> Path:
        return self.dir / "base.img"


def input_key() -> str:
    digest = hashlib.sha256(requirements().encode())
    for path in BAKED:
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def ensure_image(log=print) -> VmImage:
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    out = base / f"vm-{input_key()}"
    start = time.monotonic()
    with open(base / ".vm-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "base.img").exists():
            return VmImage(out, False, time.monotonic() - start)
        log(f"building VM image (cold, ~1.5 min) in {out}")
        out.mkdir(exist_ok=True)
        req = out / "requirements.txt"
        req.write_text(requirements())
        proc = subprocess.run(
            ["timeout", "1800", str(BUILD), str(out), str(PACKAGES), str(req), mirror()],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            (out / "build.log").write_text(proc.stdout + proc.stderr)
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise RuntimeError(f"VM image build failed ({proc.returncode}):\n{tail}")
        for old in base.glob("vm-*"):
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
        return VmImage(out, True, time.monotonic() - start)
