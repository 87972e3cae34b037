"""Benchmark: rebootless update latency through the loopback API server.

    python bench/live_apply.py [--runs 50]

For each run: create a rendered MachineConfig that changes only core's SSH key, patch the
Node's desiredConfig, and time until a separate watcher (a real HTTP watch) sees state=Done with
the new currentConfig. The agent is the real process (`image-mode-agent run --source kube`) on a
simulated host. Prints median and p95 latency and the API requests the agent made per update
(reads and writes separately). Targets: median <= 50 ms, <= 6 writes per live update.

Then the agent's resident memory (VmRSS, read after each update): in cluster mode, and in file
mode (`image-mode-agent run --source file:PATH --host simulated:DIR`, HTTP endpoints on) through
`--file-runs` SSH-key-only updates of PATH. Targets: cluster mode <= 60 MiB, file mode <= 45 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.cluster.kube import Kube, KubeError
from agent.cluster.kubeclient import ApiClient
from agent.cluster.watch import ObjectWatch
from standins.demo.loopback import Cluster, P, make_host
from standins.demo.objects import machine_config

READS, WRITES = ("get", "list", "watch"), ("create", "update", "patch", "delete")


def agent_requests(cluster: Cluster, verbs: tuple[str, ...]) -> int:
    users = {
        f"system:node:{cluster.node}",
        "system:serviceaccount:openshift-machine-config-operator:machine-config-daemon",
    }
    return sum(1 for r in cluster.kube.requests if r.user in users and r.verb in verbs)  # fmt: skip


def vmrss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def rss_line(mode: str, samples: list[float], target: float) -> str:
    return (f"agent resident memory ({mode}): {samples[-1]:.1f} MiB after the last update "
            f"(median over the {len(samples)} updates {statistics.median(samples):.1f}, "
            f"max {max(samples):.1f}) (target <= {target:g} MiB)")  # fmt: skip


async def file_mode_rss(updates: int) -> list[float]:
    """The agent in file mode on a fresh simulated host: wait for Done, then rewrite its
    MachineConfig `updates` times with a new SSH key (live updates), reading VmRSS after each."""
    base = Path(tempfile.mkdtemp(prefix="bench-live-file-"))
    sim, images = make_host(base)
    desired = base / "mc.json"

    def write(name: str, key: str) -> None:
        doc = machine_config(name=name, image=images["v1"], keys=[key])
        tmp = desired.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(desired)

    async def wait_done(name: str, timeout: float = 30.0) -> None:
        status = sim.root / "var/lib/image-mode-agent/status.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                doc = json.loads(status.read_text())
            except (OSError, ValueError):
                doc = {}
            if doc.get("currentConfig") == name and doc.get("state") == "Done":
                return
            await asyncio.sleep(0.01)
        raise TimeoutError(f"file mode: {name} not Done after {timeout:g} s")

    write("rendered-file-0", "ssh-ed25519 AAAA-file-0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "--log-level", "warning", "run",
        "--source", f"file:{desired}", "--host", f"simulated:{sim.base}",
        "--poll-interval", "0.05", "--listen", "127.0.0.1:0",
    )  # fmt: skip
    try:
        await wait_done("rendered-file-0")
        samples = []
        for i in range(1, updates + 1):
            write(f"rendered-file-{i}", f"ssh-ed25519 AAAA-file-{i}")
            await wait_done(f"rendered-file-{i}")
            samples.append(vmrss_mib(proc.pid))
        return samples
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def main(runs: int, file_runs: int) -> int:
    cluster = await Cluster.create(Path(tempfile.mkdtemp(prefix="bench-live-")))
    watcher_api = Kube(ApiClient(cluster.kube.client_configuration(cluster.kube.admin)))
    watcher = ObjectWatch(watcher_api, "/api/v1/nodes", cluster.node)
    watch_task = asyncio.create_task(watcher.run())
    try:
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-1")
        await asyncio.sleep(1.0)  # let the first start settle
        latencies, reads, writes, rss = [], [], [], []
        for i in range(runs):
            name = f"rendered-worker-b{i}"
            cluster.add_config(name, "v1", keys=[f"ssh-ed25519 AAAA-bench-{i}"])
            r0, w0 = agent_requests(cluster, READS), agent_requests(cluster, WRITES)
            start = time.perf_counter()
            cluster.set_desired(name)
            await watcher.wait_for(
                lambda n, name=name: (
                    bool(n)
                    and (n["metadata"].get("annotations") or {}).get(P + "currentConfig") == name
                    and n["metadata"]["annotations"].get(P + "state") == "Done"
                ),
                timeout=30,
            )
            latencies.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0.2)  # trailing requests (events) belong to this update
            reads.append(agent_requests(cluster, READS) - r0)
            writes.append(agent_requests(cluster, WRITES) - w0)
            rss.append(vmrss_mib(cluster.procs[-1].pid))
        latencies.sort()
        p95 = latencies[min(len(latencies) - 1, round(0.95 * len(latencies)) - 1)]
        print(f"runs: {runs}")
        median = statistics.median(latencies)
        print(f"desiredConfig patch -> Done visible to a watcher: median {median:.1f} ms, "
              f"p95 {p95:.1f} ms (target: median <= 50 ms)")  # fmt: skip
        print(f"agent API requests per update: reads median {statistics.median(reads):g} "
              f"(max {max(reads)}), writes median {statistics.median(writes):g} "
              f"(max {max(writes)}) (target <= 6 writes)")  # fmt: skip
        print(rss_line("cluster mode", rss, 60))
        print(rss_line("file mode", await file_mode_rss(file_runs), 45))
        return 0
    except (TimeoutError, KubeError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        watch_task.cancel()
        await asyncio.gather(watch_task, return_exceptions=True)
        await watcher_api.close()
        await cluster.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="cluster-mode updates (default 50)")
    parser.add_argument("--file-runs", type=int, default=10,
                        help="file-mode updates for its memory figure (default 10)")  # fmt: skip
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.runs, args.file_runs)))
