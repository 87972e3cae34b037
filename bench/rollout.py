"""Benchmark: a pool's OS image rollout, with pool-wide pre-staging (`--prestage pool`) and
without it (`--prestage off`), in one run; or, with `--bootc`, pre-staged on each bootc release.

    python bench/rollout.py [--nodes 6] [--pull 20 ...] [--controller auto|real|standin]
    python bench/rollout.py --bootc 1.12.0 --bootc 1.16.9 --bootc 1.16.10 [--repeat 3]
    python bench/rollout.py --hypershift [--nodes 6] [--pull 20] [--repeat 3] [--jitter J]
                            [--slots K] [--reboot R]

`--hypershift`: a hosted cluster's InPlace NodePool instead of a pool, on HyperShift's in-place
upgrader (bench/nodepool_rollout.py says how), its agents at their default pre-stage flags
unless `--jitter` or `--slots` is given; `--reboot R`: each simulated reboot keeps its node
down R s.

The pool is driven by the real machine-config-controller on the kit's kube-apiserver when the
peer binaries were supplied (KIT_BIN with kube-apiserver, etcd, kubectl and
machine-config-controller; tests/conformance/README.md), otherwise by the stand-ins of its
render, node and drain controllers on the project's loopback API server (standins/kube:
the node controller picks candidates as the real one does). The first line printed names the
controller used; `--controller real` fails without the binaries instead of falling back.

For each pull time P and each mode, a fresh cluster with N worker Nodes, one simulated host
and one real agent process per Node (restarted after each simulated reboot, as systemd would),
pool `maxUnavailable: 1`, pre-staging unbounded (`--prestage-slots unbounded`: each pull takes P s
however many run at once, so there is no registry to protect; bench/fleet_rollout.py measures the
bounded pre-pulls against a shared registry). Each host's pull of the new image takes P seconds.
Once the pool is Updated at its first config, the agents are restarted (fresh request
counters), then a MachineConfig changes osImageURL; the figure is the seconds from that
MachineConfig to the pool Updated at the new rendered config.

Printed per run: the rollout's seconds, each Node's unavailable window (desiredConfig set →
Done, as the controller counts it), the per-node time (median seconds between successive Nodes'
Done), the layers each host pulled, the most Nodes unavailable at once, and the API requests each
agent made (reads and writes, summed over its process lives from the restart to the end). Then
the ratio off/pool and the issue's two targets: ratio >= 1.7 at N=6, P=20, and the pre-staged
rollout <= P + N x (its own per-node time: those Nodes pulled nothing at their turn) + 15 s.

With `--bootc V` (repeatable), every simulated host speaks bootc release V
(standins/bootc_releases.py, docs/bootc-releases.md §2): 1.16.10 pre-stages locked
(`switch --download-only`), older releases pre-pull into the repository and stage at the turn.
Pre-staged rollouts only, `--repeat` times each; printed per release: the median rollout, the
bytes each Node's stage fetched at its turn (0 when the pre-stage or pre-pull held), and the
ratio to the last release given. Target (the issue's): 1.12.0
and 1.16.9 within 10 % of 1.16.10, and 0 bytes at every turn.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from standins.bootc_releases import DEFAULT_PERSONA, PERSONAS
from standins.host.simulated import SimulatedHost
from tests.conformance import peers
from tests.conformance.kit import Kit, KitCluster, KitMissing, locate_kit, prepare
from tests.scenarios.backend import PoolBackend
from tests.scenarios.pool import P, bootstrapped, machine_config
from tests.scenarios.standin import StandInCluster
from tests.simhost import IMAGE


@dataclass
class Run:
    pull: float
    mode: str
    seconds: float
    windows: dict[str, float]
    cadence: list[float]  # seconds between successive Nodes' Done, in rollout order
    pulls: dict[str, int]
    most_unavailable: int
    requests: dict[str, tuple[int, int]]  # node -> (reads, writes)
    turn_bytes: dict[str, tuple[bool, int]]  # node -> (pre-staged in time, bytes at its turn)
    bootc: str = DEFAULT_PERSONA


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def backend(kit: Kit | None, base: Path) -> PoolBackend:
    """A cluster not started yet: the real controller's when the binaries were supplied."""
    return KitCluster(kit, base / "cluster") if kit else StandInCluster(base / "cluster")


def find_real_controller(choice: str, folder: Path) -> tuple[Kit | None, str]:
    """The kit with every binary the real controller needs, or None and why not."""
    if choice == "standin":
        return None, "--controller standin"
    try:
        kit = prepare(locate_kit(), folder)
    except KitMissing as exc:
        return None, str(exc)
    reason = peers.why_not_run(kit.found, (peers.MCC,))
    return (None, reason) if reason else (kit, "")


async def one_rollout(kit: Kit | None, base: Path, nodes: int, pull: float, mode: str,
                      jitter: float, bootc: str = DEFAULT_PERSONA) -> Run:  # fmt: skip
    # Unbounded: here each pull takes P s however many run at once (no shared registry), so a
    # bound on concurrent pre-pulls could only queue them; bench/fleet_rollout.py measures the
    # bound against a registry whose bandwidth the pulls share.
    args = ["--prestage", mode, "--prestage-slots", "unbounded", "--prestage-jitter", str(jitter)]
    cluster = backend(kit, base)
    async with bootstrapped(cluster, base, nodes, agent_args=args, logs=True) as (mcc, first):
        image = ""
        for node in mcc.nodes.values():  # the same manifest on every host: the same digest
            files = {"usr/lib/app/healthy": "yes"}
            image = node.sim.add_image(f"{IMAGE}:bench-p{pull:g}", files, pull_seconds=pull)
            node.sim.set_bootc_version(bootc)  # read by the agents started below
        digest = image.split("@")[1]
        await mcc.stop_agents()  # fresh processes: their request counts start at the rollout
        lives_before = {name: len(mcc.api_requests(name)) for name in mcc.nodes}
        mcc.start_agents()
        await asyncio.sleep(3.0)  # the agents list, watch and find nothing to do
        progress(f"P={pull:g} s, --prestage {mode}: osImageURL changes")
        started = await mcc.apply(machine_config("99-worker-bench-os", os_image=image))
        target = await mcc.wait_new_rendered(first)
        await mcc.wait_updated(target, timeout=nodes * (pull + 90) + 120)
        seconds = time.monotonic() - started
        progress(f"P={pull:g} s, --prestage {mode}: pool Updated after {seconds:.1f} s")
        windows = {name: mcc.agent_share(name, target, started) for name in mcc.nodes}
        done = sorted(mcc.first(name, lambda a: a.get(P + "currentConfig") == target
                                and a.get(P + "state") == "Done", started) or 0.0
                      for name in mcc.nodes)  # fmt: skip
        cadence = [b - a for a, b in itertools.pairwise(done)]
        most = mcc.most_unavailable(started)
        await mcc.stop_agents()  # their exit lines carry the last counts
        requests = {}
        for name in mcc.nodes:
            lives = mcc.api_requests(name)[lives_before[name] :]
            reads = sum(life["reads"] + life["node_reads"] for life in lives)
            writes = sum(life["writes"] + life["node_writes"] for life in lives)
            requests[name] = (reads, writes)
        pulls = {
            name: sum(
                1 for a in node.sim.actions() if a["kind"] == "pull" and digest in a["detail"]
            )
            for name, node in mcc.nodes.items()
        }
        turn_bytes = {name: turn_fetched(node.sim, digest)
                      for name, node in mcc.nodes.items()}  # fmt: skip
        return Run(pull, mode, seconds, windows, cadence, pulls, most, requests, turn_bytes,
                   bootc)  # fmt: skip


def turn_fetched(sim: SimulatedHost, digest: str) -> tuple[bool, int]:
    """Whether a pre-stage or pre-pull of `digest` finished before the node's turn, and what
    the turn fetched: the digest's last stage, as the simulated bootc logs it."""
    stages = sim.stages(digest)
    if not stages:
        raise RuntimeError(f"no stage of {digest} logged: the node never took its turn")
    pulled = any(a["kind"] == "bootc" and a["detail"].startswith("internals")
                 and digest in a["detail"] for a in sim.actions())  # fmt: skip
    return len(stages) > 1 or pulled, stages[-1][0]


def report(run: Run) -> None:
    windows = sorted(run.windows.values())
    reads = [r for r, _ in run.requests.values()]
    writes = [w for _, w in run.requests.values()]
    print(f"bootc {run.bootc:<7}  P={run.pull:g} s  --prestage {run.mode:<4}  "
          f"rollout {run.seconds:6.1f} s  "
          f"windows median {statistics.median(windows):5.1f} s (min {windows[0]:.1f}, "
          f"max {windows[-1]:.1f})  per node {statistics.median(run.cadence):5.1f} s  "
          f"most unavailable {run.most_unavailable}  "
          f"layers pulled per host {sorted(set(run.pulls.values()))}  "
          f"API per agent: reads {min(reads)}-{max(reads)}, "
          f"writes {min(writes)}-{max(writes)}  "
          f"bytes at the turn of pre-staged nodes "
          f"{sorted({b for ahead, b in run.turn_bytes.values() if ahead})}, of the others "
          f"{sorted({b for ahead, b in run.turn_bytes.values() if not ahead})}")  # fmt: skip


async def per_release(kit: Kit | None, nodes: int, pull: float, jitter: float,
                      releases: list[str], repeat: int) -> bool:  # fmt: skip
    """Pre-staged rollouts per bootc release; whether the issue's targets were met."""
    runs: dict[str, list[Run]] = {release: [] for release in releases}
    # Interleaved (all releases, then again), so that a slower stretch of the machine weighs
    # on every release alike.
    for k in range(repeat):
        for release in releases:
            base = Path(tempfile.mkdtemp(prefix=f"bench-rollout-{release}-{k}-"))
            runs[release].append(await one_rollout(kit, base, nodes, pull, "pool", jitter,
                                                   release))  # fmt: skip
            report(runs[release][-1])
    medians = {r: statistics.median(run.seconds for run in runs[r]) for r in releases}
    # the bytes at the turn of the nodes pre-staged before it, and how many there were
    turn_bytes = {r: {b for run in runs[r] for held, b in run.turn_bytes.values() if held}
                  for r in releases}  # fmt: skip
    ahead = {r: sum(held for run in runs[r] for held, _ in run.turn_bytes.values())
             for r in releases}  # fmt: skip
    newest = releases[-1]
    ok = True
    for release in releases:
        ratio = medians[release] / medians[newest]
        within = release == newest or ratio <= 1.10
        zero = turn_bytes[release] == {0}  # and at least one node was pre-staged
        ok = ok and within and zero
        print(f"bootc {release:<7}  P={pull:g} s  N={nodes}  pre-staged rollout median of "
              f"{repeat}: {medians[release]:.1f} s  / {newest}'s = {ratio:.3f}  "
              f"{ahead[release]} of {repeat * nodes} nodes pre-staged before their turn, "
              f"which fetched {sorted(turn_bytes[release])} bytes  "
              f"{'met' if within and zero else 'MISSED'}")  # fmt: skip
    return ok


async def main(nodes: int, pulls: list[float], jitter: float, controller: str,
               releases: list[str], repeat: int) -> int:  # fmt: skip
    """The pools' runs (not --hypershift): their agents pre-stage unbounded, after `jitter`."""
    kit, why = find_real_controller(controller, Path(tempfile.mkdtemp(prefix="bench-peers-")))
    if kit is None and controller == "real":
        print(f"rollout: not run: {why}", file=sys.stderr)
        return 2
    used = (KitCluster if kit else StandInCluster).controller
    where = "the kit's kube-apiserver" if kit else f"the loopback API server ({why})"
    print(f"controller: {used}, on {where}", flush=True)
    failed = False
    for pull in pulls:
        if releases:
            failed = failed or not await per_release(kit, nodes, pull, jitter, releases, repeat)
            continue
        runs = {}
        for mode in ("pool", "off"):
            base = Path(tempfile.mkdtemp(prefix=f"bench-rollout-{mode}-"))
            runs[mode] = await one_rollout(kit, base, nodes, pull, mode, jitter)
            report(runs[mode])
        pool, off = runs["pool"], runs["off"]
        ratio = off.seconds / pool.seconds
        # The pool rollout's Nodes after the first found the image staged: their cadence is
        # the per-node time with no pull.
        bound = pull + nodes * statistics.median(pool.cadence) + 15
        print(f"P={pull:g} s  N={nodes}  off/pool = {off.seconds:.1f}/{pool.seconds:.1f} = "
              f"{ratio:.2f}  pool {pool.seconds:.1f} s vs bound P + N x per-node time + 15 = "
              f"{bound:.1f} s")  # fmt: skip
        if nodes == 6 and pull == 20:
            ok = ratio >= 1.7 and pool.seconds <= bound
            print(
                f"targets (N=6, P=20: ratio >= 1.7, within the bound): {'met' if ok else 'MISSED'}"
            )
            failed = failed or not ok
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--pull", type=float, action="append",
                        help="seconds each host's pull takes (repeatable; default 20)")  # fmt: skip
    parser.add_argument("--jitter", type=float,
                        help="--prestage-jitter of the agents (seconds; default 10 for a pool, "
                        "the agent's own for --hypershift)")  # fmt: skip
    parser.add_argument("--slots", help="--hypershift: --prestage-slots of the agents "
                        "(default: the agent's own, auto)")  # fmt: skip
    parser.add_argument("--reboot", type=float, default=0.0,
                        help="--hypershift: seconds a simulated reboot keeps its node "
                        "down")  # fmt: skip
    parser.add_argument("--controller", choices=("auto", "real", "standin"), default="auto",
                        help="auto: the real one when its binaries were supplied")  # fmt: skip
    parser.add_argument("--bootc", action="append", choices=PERSONAS,
                        help="pre-staged rollouts on this bootc release (repeatable; the last "
                        "one is the reference)")  # fmt: skip
    parser.add_argument(
        "--hypershift",
        action="store_true",
        help="a HyperShift InPlace NodePool instead (bench/nodepool_rollout.py)",
    )
    parser.add_argument("--repeat", type=int, default=1,
                        help="rollouts per release (--bootc), the median is compared")  # fmt: skip
    options = parser.parse_args()
    os.environ.setdefault("IMAGE_MODE_AGENT_KIT", str(Path(__file__).resolve().parents[2]
                                                      / "shared/kit"))  # fmt: skip
    if options.hypershift:
        from bench.nodepool_rollout import main as nodepool_main

        sys.exit(
            asyncio.run(
                nodepool_main(
                    options.nodes,
                    options.pull or [20.0],
                    options.jitter,
                    options.controller,
                    max(1, options.repeat),
                    options.slots,
                    options.reboot,
                )
            )
        )
    jitter = 10.0 if options.jitter is None else options.jitter
    sys.exit(asyncio.run(main(options.nodes, options.pull or [20.0], jitter,
                              options.controller, options.bootc or [],
                              max(1, options.repeat))))  # fmt: skip
