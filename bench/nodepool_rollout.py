"""Benchmark (`bench/rollout.py --hypershift`): a hosted cluster's InPlace NodePool rolling out a
new OS image, with NodePool pre-staging (`--prestage pool`) and without it (`--prestage off`).

The NodePool is driven by HyperShift's real in-place upgrader and drainer (the kit's
`hypershift-inplace`) when their binaries were supplied (KIT_BIN with kube-apiserver, etcd,
kubectl and hypershift-inplace), otherwise by their stand-ins on the project's loopback API
server (tests/scenarios/hypershift_standin.py). For each pull time P and each mode: a fresh
NodePool of N Nodes, maxUnavailable 1, one simulated host and one real agent process per Node
(restarted after each simulated reboot, as systemd would); each host's pull of the new image
takes P seconds, however many pull at once (no shared registry). The figure is the seconds from
the new target (hcp-target) to the MachineSet's current config version = that target. Also
printed: each Node's window (desiredConfig → Done), the most Nodes selected at once, the bytes
each Node's turn fetched, the API requests per agent, and whether the pre-pulls were bounded
(no PrestageUnbounded Event).

The agents run with their default flags plus `--prestage MODE`: bounded pre-pulls, one lane
(`--prestage-slots auto`), in the upgrader's order. On the stand-ins the NodePool's nodes get
deploy/hypershift/rbac.yaml as docs/install.md applies it; the kit's `hcp-up` grants the
upgrade ConfigMap only, so on the real upgrader the agents fall back to the jitter (the Events
say so). `--jitter J` and `--slots K` pass `--prestage-jitter J` and `--prestage-slots K`;
`--reboot R` keeps each simulated reboot down R seconds before the agent starts again (default
0: a turn's drain and reboot then take about a second, far less than a real one)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from standins.demo.objects import machine_config
from tests.conformance import peers
from tests.conformance.hypershift import KitHosted
from tests.conformance.kit import Kit, KitMissing, locate_kit, prepare
from tests.scenarios.hostedpool import HYPERSHIFT_RBAC, HostedBackend, HostedPool, StandInHosted
from tests.simhost import IMAGE

P = "machineconfiguration.openshift.io/"


@dataclass
class Run:
    pull: float
    mode: str
    seconds: float
    windows: dict[str, float]
    most_selected: int
    turn_bytes: dict[str, list[int]]  # node -> bytes each stage at its turn fetched
    requests: dict[str, tuple[int, int]]  # node -> (reads, writes) over its process lives
    unbounded: int | None  # PrestageUnbounded Events (None: not read, on the kit)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def find_real_upgrader(choice: str, folder: Path) -> tuple[Kit | None, str]:
    if choice == "standin":
        return None, "--controller standin"
    try:
        kit = prepare(locate_kit(), folder)
    except KitMissing as exc:
        return None, str(exc)
    reason = peers.why_not_run(kit.found, (peers.HCP,))
    return (None, reason) if reason else (kit, "")


async def one_rollout(kit: Kit | None, base: Path, nodes: int, pull: float, mode: str,
                      jitter: float | None, slots: str | None = None,
                      reboot: float = 0.0) -> Run:  # fmt: skip
    backend: HostedBackend = KitHosted(kit, base / "cluster") if kit else StandInHosted(
        base / "cluster", rbac=HYPERSHIFT_RBAC)  # fmt: skip
    args = ["--prestage", mode]
    if jitter is not None:
        args += ["--prestage-jitter", f"{jitter:g}"]
    if slots is not None:
        args += ["--prestage-slots", slots]
    pool = await HostedPool.create(base, nodes=nodes, agent_args=args, logs=True,
                                   backend=backend, reboot_seconds=reboot)  # fmt: skip
    try:
        image = ""
        for node in pool.nodes.values():  # the same manifest on every host: the same digest
            image = node.sim.add_image(f"{IMAGE}:bench-p{pull:g}", {"usr/lib/app/healthy": "yes"},
                                       pull_seconds=pull)  # fmt: skip
        digest = image.split("@")[1]
        pool.start_agents()
        await asyncio.sleep(3.0)  # the agents list, watch and find nothing to do
        progress(f"P={pull:g} s, --prestage {mode}: the NodePool's target changes")
        started = time.monotonic()
        target = await pool.set_target(machine_config("bench", image=image, version="3.5.0"))
        done_at = await pool.wait_complete(target, timeout=nodes * (pull + 60) + 120)
        seconds = done_at - started
        progress(f"P={pull:g} s, --prestage {mode}: NodePool at {target} after {seconds:.1f} s")
        windows = {}
        for name in pool.nodes:
            seen = pool.first(name, lambda a: a.get(P + "desiredConfig") == target, started)
            done = pool.first(name, lambda a: a.get(P + "currentConfig") == target
                              and a.get(P + "state") == "Done", started)  # fmt: skip
            windows[name] = (done or 0.0) - (seen or 0.0)
        most = pool.most_selected(target, started)
        await pool.stop_agents()  # their exit lines carry the last counts
        requests = {}
        for name in pool.nodes:
            lives = pool.api_requests(name)
            requests[name] = (sum(life["reads"] for life in lives),
                              sum(life["writes"] for life in lives))  # fmt: skip
        turn_bytes = {}
        for name, node in pool.nodes.items():  # the turn is the digest's last stage
            turn_bytes[name] = [stages[-1][0]] if (stages := node.sim.stages(digest)) else []
        unbounded = None
        if isinstance(backend, StandInHosted):
            unbounded = sum(1 for e in backend.kube.list("events")
                            if e.get("reason") == "PrestageUnbounded")  # fmt: skip
        return Run(pull, mode, seconds, windows, most, turn_bytes, requests, unbounded)
    finally:
        await pool.close()


def report(run: Run) -> None:
    windows = sorted(run.windows.values())
    reads = [r for r, _ in run.requests.values()]
    writes = [w for _, w in run.requests.values()]
    fetched = sorted({b for turns in run.turn_bytes.values() for b in turns})
    zero = sum(1 for turns in run.turn_bytes.values() if turns and set(turns) == {0})
    print(f"P={run.pull:g} s  --prestage {run.mode:<4}  rollout {run.seconds:6.1f} s  "
          f"windows median {statistics.median(windows):5.1f} s (min {windows[0]:.1f}, max "
          f"{windows[-1]:.1f})  most selected {run.most_selected}  bytes fetched at the turns "
          f"{fetched} ({zero} of {len(run.turn_bytes)} Nodes fetched nothing)  API per agent: "
          f"reads {min(reads)}-{max(reads)}, writes {min(writes)}-{max(writes)}  "
          f"PrestageUnbounded Events {'-' if run.unbounded is None else run.unbounded}",
          flush=True)  # fmt: skip


async def main(nodes: int, pulls: list[float], jitter: float | None, controller: str,
               repeat: int, slots: str | None = None, reboot: float = 0.0) -> int:  # fmt: skip
    kit, why = find_real_upgrader(controller, Path(tempfile.mkdtemp(prefix="bench-peers-")))
    if kit is None and controller == "real":
        print(f"rollout: not run: {why}", file=sys.stderr)
        return 2
    used = (KitHosted if kit else StandInHosted).controller
    where = "the kit's kube-apiserver" if kit else f"the loopback API server ({why})"
    print(f"controller: {used}, on {where}", flush=True)
    flags = " ".join([*([f"--prestage-jitter {jitter:g}"] if jitter is not None else []),
                      *([f"--prestage-slots {slots}"] if slots else [])]) or "defaults"  # fmt: skip
    print(f"agents: --prestage pool|off, other pre-stage flags: {flags}; reboots {reboot:g} s",
          flush=True)  # fmt: skip
    for pull in pulls:
        runs: dict[str, list[Run]] = {"pool": [], "off": []}
        for k in range(repeat):  # interleaved: a slower stretch weighs on both alike
            for mode in ("pool", "off"):
                base = Path(tempfile.mkdtemp(prefix=f"bench-nodepool-{mode}-{k}-"))
                runs[mode].append(await one_rollout(kit, base, nodes, pull, mode, jitter,
                                                    slots, reboot))  # fmt: skip
                report(runs[mode][-1])
        pool = statistics.median(r.seconds for r in runs["pool"])
        off = statistics.median(r.seconds for r in runs["off"])
        ratios = sorted(o.seconds / p.seconds for o, p in zip(runs["off"], runs["pool"],
                                                               strict=True))  # fmt: skip
        print(f"P={pull:g} s  N={nodes}  maxUnavailable 1  medians of {repeat}: off {off:.1f} s, "
              f"pool {pool:.1f} s, off/pool = {off / pool:.2f} (each pair: "
              f"{', '.join(f'{r:.2f}' for r in ratios)})", flush=True)  # fmt: skip
    return 0
