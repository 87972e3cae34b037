"""Benchmark: rebootless update latency through the loopback API server.

    python bench/live_apply.py [--runs 50]

For each run: create a rendered MachineConfig that changes only core's SSH key, patch the
Node's desiredConfig, and time until a separate watcher (a real HTTP watch) sees state=Done with
the new currentConfig. The agent is the real process (`image-mode-agent run --source kube`) on a
simulated host. Prints median and p95 latency and the API requests the agent made per update
(reads and writes separately). Targets: median <= 50 ms, <= 6 writes per live update.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.cluster.kube import Kube, KubeError
from agent.cluster.watch import ObjectWatch
from agent.demo.loopback import Cluster, P

READS, WRITES = ("get", "list", "watch"), ("create", "update", "patch", "delete")


def agent_requests(cluster: Cluster, verbs: tuple[str, ...]) -> int:
    users = {
        f"system:node:{cluster.node}",
        "system:serviceaccount:openshift-machine-config-operator:machine-config-daemon",
    }
    return sum(1 for r in cluster.kube.requests if r.user in users and r.verb in verbs)  # fmt: skip


async def main(runs: int) -> int:
    cluster = await Cluster.create(Path(tempfile.mkdtemp(prefix="bench-live-")))
    watcher_api = Kube(__import__("kubernetes_asyncio").client.ApiClient(
        cluster.kube.client_configuration(cluster.kube.admin)))  # fmt: skip
    watcher = ObjectWatch(watcher_api, "/api/v1/nodes", cluster.node)
    watch_task = asyncio.create_task(watcher.run())
    try:
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-1")
        await asyncio.sleep(1.0)  # let the first start settle
        latencies, reads, writes = [], [], []
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
        latencies.sort()
        p95 = latencies[min(len(latencies) - 1, round(0.95 * len(latencies)) - 1)]
        print(f"runs: {runs}")
        median = statistics.median(latencies)
        print(f"desiredConfig patch -> Done visible to a watcher: median {median:.1f} ms, "
              f"p95 {p95:.1f} ms (target: median <= 50 ms)")  # fmt: skip
        print(f"agent API requests per update: reads median {statistics.median(reads):g} "
              f"(max {max(reads)}), writes median {statistics.median(writes):g} "
              f"(max {max(writes)}) (target <= 6 writes)")  # fmt: skip
        pid = cluster.procs[-1].pid
        rss = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))  # fmt: skip
        print(f"agent resident memory after the runs (cluster mode): {int(rss) / 1024:.1f} MiB")
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
    parser.add_argument("--runs", type=int, default=50)
    raise SystemExit(asyncio.run(main(parser.parse_args().runs)))
