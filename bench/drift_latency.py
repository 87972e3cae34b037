"""Benchmark: how long a change on the host takes to be reported as drift, and to heal.

    python bench/drift_latency.py [--runs 10]

The real agent process in cluster mode (`image-mode-agent run --source kube`) on a simulated
host whose directories real inotify watches, against the loopback API server. For each kind
of drift (a key's content replaced as an editor saves, its mode, the key deleted, a unit
enabled by hand, an image file under /etc edited) and each run: make the change, time until a
watcher of the Node sees `state=Degraded` with the finding, put it right, time until `Done`.
Prints the median, p90 and max of each, per kind. The issue's bar: reported within a second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.core.policy import SSH_KEYS_PATH
from standins.demo.loopback import Cluster, P

KEY = "ssh-ed25519 AAAA-bench"
UNITS = [{"name": "debug.service", "enabled": False}]
CHRONY = "server time.example iburst\n"


def prepare(cluster: Cluster) -> None:
    root = cluster.sim.root
    for rel in ("usr/etc/chrony.conf", "etc/chrony.conf"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(CHRONY)
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    (units / "debug.service").write_text("[Service]\nExecStart=/bin/true\n[Install]\n"
                                         "WantedBy=multi-user.target\n")  # fmt: skip
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True, exist_ok=True)


def kinds(root: Path) -> dict[str, tuple]:
    keys = root / SSH_KEYS_PATH.lstrip("/")
    link = root / "etc/systemd/system/multi-user.target.wants/debug.service"
    chrony = root / "etc/chrony.conf"

    def replace(text: str) -> None:
        tmp = keys.with_name("ignition.swp")
        tmp.write_text(text)
        tmp.chmod(0o600)
        os.chown(tmp, 1000, 1000)
        tmp.replace(keys)

    def put_back() -> None:
        keys.write_text(f"{KEY}\n")
        keys.chmod(0o600)
        os.chown(keys, 1000, 1000)

    return {
        "key content": (lambda: replace("ssh-ed25519 OTHER\n"), lambda: replace(f"{KEY}\n")),
        "key mode": (lambda: keys.chmod(0o644), lambda: keys.chmod(0o600)),
        "key deleted": (keys.unlink, put_back),
        "unit enabled": (
            lambda: link.symlink_to("/usr/lib/systemd/system/debug.service"),
            link.unlink,
        ),
        "/etc image file": (
            lambda: chrony.write_text("server other.example\n"),
            lambda: chrony.write_text(CHRONY),
        ),
    }


async def timed(cluster: Cluster, action, want_degraded: bool) -> float:
    def reached(a: dict) -> bool:
        degraded = a.get(P + "state") == "Degraded"
        return degraded if want_degraded else a.get(P + "state") == "Done"

    start = time.perf_counter()
    action()
    while not reached(cluster.annotations()):
        await asyncio.sleep(0.002)
        if time.perf_counter() - start > 30:
            raise SystemExit("no answer within 30 s")
    return time.perf_counter() - start


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"median {statistics.median(ordered) * 1000:6.0f} ms   p90 {p90 * 1000:6.0f} ms   "
            f"max {ordered[-1] * 1000:6.0f} ms")  # fmt: skip


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = await Cluster.create(Path(tmp))
        try:
            cluster.add_config("rendered-worker-1", "v1", keys=[KEY], units=UNITS)
            prepare(cluster)
            await cluster.start_agent(log_level="error")
            await cluster.wait_done("rendered-worker-1")
            keys = cluster.sim.root / SSH_KEYS_PATH.lstrip("/")
            while not keys.exists():  # the first start writes the live part
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the check after it, and the monitor
            print(f"{runs} runs per kind; from the change to the Node's state, as a watcher "
                  "of the API server sees it")  # fmt: skip
            for name, (change, restore) in kinds(cluster.sim.root).items():
                found, healed = [], []
                for _ in range(runs):
                    found.append(await timed(cluster, change, True))
                    healed.append(await timed(cluster, restore, False))
                    await asyncio.sleep(0.2)  # the check after the heal re-arms the monitor
                print(f"{name:16} reported: {summary(found)}")
                print(f"{'':16} healed:   {summary(healed)}")
        finally:
            await cluster.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))
