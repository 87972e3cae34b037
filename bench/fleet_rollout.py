"""Benchmark: measured pool rollouts of the three pre-staging strategies against the model.

    python bench/fleet_rollout.py [--nodes 6 --nodes 20] [--strategy off --strategy today ...]
                                  [--repeat 1] [--json PATH] [--pull-seconds 3] [--links 2]
                                  [--reboot 5] [--jitter 10] [--max-unavailable 1]

The model is bench/fleet_model.py; the issue asks for it to be checked against measured runs.

Each run: a fresh loopback cluster with the stand-ins of the machine-config-controller (as
`bench/rollout.py --controller standin`), N worker Nodes, one simulated host and one real agent
process per Node (restarted after each simulated reboot once `--reboot` seconds have passed, as a
machine takes a while to come back), pool maxUnavailable m. Every host pulls through one shared
simulated registry (standins/host/simulated.py, `set_shared_link`): the new image is S = 128 MiB,
each pull is capped at b = S / `--pull-seconds`, and all pulls running at once share
B = `--links` x b. Once the pool is Updated at its first config the agents are restarted (fresh
request counters), then a MachineConfig changes osImageURL. Strategies, interleaved, each run on
a fresh cluster:

- `off`: `--prestage off`: every node pulls at its turn.
- `today`: `--prestage pool --prestage-slots unbounded --prestage-jitter J`: every node pre-pulls
  after a random delay up to J, nothing bounds how many at once.
- `bounded`: `--prestage pool --prestage-slots auto`: K = m lanes (Leases) in the controller's
  order (the agent's default).

Measured per run, from t0 = the MachineConfig's creation: the rollout (t0 → pool Updated); the
first pull (t0 → the end of the pull of the node the controller picked first, from the registry's
pull log); the most pulls and pre-pulls at once (a pull is the node's turn pull when it starts
after the node's desiredConfig changed, a pre-pull otherwise); the registry's bytes (its load
over time: min(n b, B) with n pulls running); the per-node time (median seconds between
successive Nodes' Done); each node's disruption D_k = (desiredConfig → Done) - its turn pull's
seconds; the gap from what frees a slot (t0, or a Node's Done) to the controller's next pick; the
API requests per agent per rollout (reads, writes; summed over its process lives, as
bench/rollout.py counts them).

The model (bench/fleet_model.py, `simulate`) gets the same N, m, S, B, b, J and K, and two
figures measured in the `off` runs at that N, never per strategy: D = the median D_k (there D_k
is the node's window minus its own pull) and the pick delay = the median gap to a pick;
lease_delay 0. `today` draws its jitter at random: the model replays each run's own draws (the
start of each node's pre-pull, from the registry's log; a node whose turn came first never
pre-pulls), and the mean over `--seeds` seeds is printed beside it. Checks: each measured
rollout and first pull within 15 % of the model's; the three strategies in the model's order (by
median rollout); never more than m Nodes unavailable. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fleet_model, a script beside this one

from fleet_model import Fleet, Outcome, lower_bound, simulate

from standins.host.registry import pull_records
from tests.scenarios.pool import MccCluster, P, bootstrapped, machine_config
from tests.scenarios.standin import StandInCluster
from tests.simhost import IMAGE

STRATEGIES = ("off", "today", "bounded")
IMAGE_FILES = {"usr/lib/app/healthy": "yes"}  # the hosts' own images carry this one file
IMAGE_BYTES = 64 * 1024 * 1024 * (1 + len(IMAGE_FILES))  # the simulated image's size
TOLERANCE = 0.15
# A pull that starts this soon before the admin watch shows the node's turn is the turn's own:
# the agent's watch may deliver the change a moment before ours does.
TURN_SLACK = 0.25


@dataclass(frozen=True)
class Settings:
    pull_seconds: float  # S / b
    links: float  # B / b
    reboot: float  # seconds a simulated reboot keeps a node down
    jitter: float  # J
    max_unavailable: int  # m
    slots: str  # the bounded agents' --prestage-slots

    @property
    def link_bps(self) -> float:
        return IMAGE_BYTES / self.pull_seconds

    @property
    def registry_bps(self) -> float:
        return self.links * self.link_bps

    def agent_args(self, strategy: str) -> list[str]:
        if strategy == "off":
            return ["--prestage", "off"]
        if strategy == "today":
            return ["--prestage", "pool", "--prestage-slots", "unbounded",
                    "--prestage-jitter", f"{self.jitter:g}"]  # fmt: skip
        return ["--prestage", "pool", "--prestage-slots", self.slots]


@dataclass
class Pull:
    host: str
    start: float  # seconds from t0
    end: float  # seconds from t0 (the rollout's end when the log has none)
    outcome: str
    fetched: int
    turn: bool = False


@dataclass
class Measured:
    nodes: int
    strategy: str
    repeat: int
    rollout: float
    first_pull: float
    peak_pulls: int
    peak_prepulls: int
    registry_bytes: float
    per_node: float  # median seconds between successive Nodes' Done
    disruption: float  # median D_k
    pick_gap: float  # median seconds from a freed slot to the next pick
    most_unavailable: int
    reads: list[int]  # per agent
    writes: list[int]
    pulls_per_host: dict[str, int]
    order: list[str]  # the Nodes in the order the controller picked them
    windows: dict[str, float]  # desiredConfig → Done
    prepulls: dict[str, float]  # when each node's pre-pull started (a node with none: absent)
    series: list[tuple[float, float]] = field(default_factory=list)  # (t, registry bytes/s)
    wall: float = 0.0  # the run's own seconds, bootstrap included


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def started(mcc: MccCluster, node: str) -> int:
    """How many of the node's agent lives got through their start-up (each validates the
    on-disk state once, before it lists and watches)."""
    path = mcc.log_path(node)
    return path.read_text().count('"validated on-disk state"') if path.exists() else 0


def read_pulls(shared: Path, digest: str, t0: float, until: float) -> list[Pull]:
    """The pulls of `digest` in the shared registry's log, times relative to t0 (a pull with
    no end, its process killed, is counted as running until `until`, also relative)."""
    return [Pull(r.host, r.start - t0, until if r.end is None else r.end - t0,
                 r.outcome or "running", r.fetched)
            for r in pull_records(shared, digest)]  # fmt: skip


def sweep(pulls: list[Pull]) -> list[tuple[float, int]]:
    """(t, pulls running from t on), one step per change; an end before a start at one instant."""
    edges = sorted([(p.start, 1) for p in pulls] + [(p.end, -1) for p in pulls],
                   key=lambda e: (e[0], e[1]))  # fmt: skip
    steps: list[tuple[float, int]] = []
    running = 0
    for at, change in edges:
        running += change
        if steps and steps[-1][0] == at:
            steps[-1] = (at, running)
        else:
            steps.append((at, running))
    return steps


def registry_load(steps: list[tuple[float, int]], settings: Settings) -> list[tuple[float, float]]:
    """Bytes per second the registry serves: each of n pulls gets min(b, B / n)."""
    return [(at, min(n * settings.link_bps, settings.registry_bps)) for at, n in steps]


def integral(series: list[tuple[float, float]]) -> float:
    """The bytes served: each rate holds until the next step."""
    return sum(rate * (until - at) for (at, rate), (until, _) in itertools.pairwise(series))


async def one_rollout(n: int, strategy: str, repeat: int, settings: Settings,
                      keep: bool) -> Measured:  # fmt: skip
    began = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix=f"bench-fleet-{strategy}-{n}-"))
    shared = base / "registry"
    cluster = StandInCluster(base / "cluster")
    args = settings.agent_args(strategy)
    m = settings.max_unavailable
    try:
        async with bootstrapped(cluster, base, n, agent_args=args, logs=True,
                                reboot_seconds=settings.reboot) as (mcc, first):  # fmt: skip
            if m != 1:
                await cluster.merge_patch("/apis/machineconfiguration.openshift.io/v1/"
                                          "machineconfigpools/worker",
                                          {"spec": {"maxUnavailable": m}})  # fmt: skip
            image = ""
            for name, node in mcc.nodes.items():  # one manifest on every host: one digest
                image = node.sim.add_image(f"{IMAGE}:fleet", IMAGE_FILES)
                node.sim.set_shared_link(shared, registry_bps=settings.registry_bps,
                                         link_bps=settings.link_bps, host=name)  # fmt: skip
            digest = image.split("@")[1]
            await mcc.stop_agents()  # fresh processes: their request counts start here
            lives_before = {name: len(mcc.api_requests(name)) for name in mcc.nodes}
            lives = {name: started(mcc, name) for name in mcc.nodes}
            mcc.start_agents()
            # Every agent through its start-up before the change (20 of them on 2 cores take
            # a while), then a few seconds for their first pass: list, watch, nothing to do.
            async with asyncio.timeout(180):
                while any(started(mcc, k) <= v for k, v in lives.items()):
                    await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)
            progress(f"N={n} {strategy} #{repeat + 1}: osImageURL changes")
            t0 = await mcc.apply(machine_config("99-worker-fleet-os", os_image=image))
            target = await mcc.wait_new_rendered(first)
            timeout = n * (2 * settings.pull_seconds + settings.reboot + 60) + 120
            ticker = asyncio.create_task(report_progress(mcc, target, t0, n, strategy))
            try:
                await mcc.wait_updated(target, timeout=timeout)
            finally:
                ticker.cancel()
            rollout = time.monotonic() - t0
            progress(f"N={n} {strategy} #{repeat + 1}: pool Updated after {rollout:.1f} s")
            measured = measure(mcc, settings, n, strategy, repeat, target, digest, t0, rollout,
                               shared)  # fmt: skip
            await mcc.stop_agents()  # their exit lines carry the last counts
            for name in mcc.nodes:
                lives = mcc.api_requests(name)[lives_before[name] :]
                measured.reads.append(sum(x["reads"] + x["node_reads"] for x in lives))
                measured.writes.append(sum(x["writes"] + x["node_writes"] for x in lives))
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    measured.wall = time.monotonic() - began
    return measured


async def report_progress(mcc: MccCluster, target: str, t0: float, n: int,
                          strategy: str) -> None:  # fmt: skip
    def done(a: dict[str, str]) -> bool:
        return a.get(P + "currentConfig") == target and a.get(P + "state") == "Done"

    while True:
        await asyncio.sleep(20)
        count = sum(1 for name in mcc.nodes if mcc.first(name, done, t0) is not None)
        progress(f"N={n} {strategy}: {count}/{n} Nodes Done after "
                 f"{time.monotonic() - t0:.0f} s")  # fmt: skip


def measure(mcc: MccCluster, settings: Settings, n: int, strategy: str, repeat: int,
            target: str, digest: str, t0: float, rollout: float,
            shared: Path) -> Measured:  # fmt: skip
    def done_at(a: dict[str, str]) -> bool:
        return a.get(P + "currentConfig") == target and a.get(P + "state") == "Done"

    picks, dones = {}, {}
    for name in mcc.nodes:
        pick = mcc.first(name, lambda a: a.get(P + "desiredConfig") == target, t0)
        done = mcc.first(name, done_at, t0)
        assert pick is not None and done is not None, f"{name}: no turn or no Done seen"
        picks[name], dones[name] = pick - t0, done - t0
    pulls = read_pulls(shared, digest, t0, rollout)
    for pull in pulls:
        pull.turn = pull.start >= picks[pull.host] - TURN_SLACK
    steps = sweep(pulls)
    pre_steps = sweep([p for p in pulls if not p.turn])
    order = sorted(mcc.nodes, key=lambda k: picks[k])
    first = order[0]
    first_ends = [p.end for p in pulls if p.host == first and p.outcome == "done"]
    windows = {k: dones[k] - picks[k] for k in mcc.nodes}
    turn_pull = {k: sum(p.end - p.start for p in pulls if p.host == k and p.turn)
                 for k in mcc.nodes}  # fmt: skip
    # A pick's cause: t0 for the first m, else the latest Done before it (a slot freed).
    gaps = []
    for j, name in enumerate(order):
        before = [d for d in dones.values() if d <= picks[name]]
        cause = 0.0 if j < settings.max_unavailable or not before else max(before)
        gaps.append(picks[name] - cause)
    series = registry_load(steps, settings)
    finished = sorted(dones.values())
    return Measured(
        nodes=n,
        strategy=strategy,
        repeat=repeat,
        rollout=rollout,
        first_pull=max(first_ends) if first_ends else math.nan,
        peak_pulls=max((c for _, c in steps), default=0),
        peak_prepulls=max((c for _, c in pre_steps), default=0),
        registry_bytes=integral(series),
        per_node=statistics.median(b - a for a, b in itertools.pairwise(finished)),
        disruption=statistics.median(windows[k] - turn_pull[k] for k in mcc.nodes),
        pick_gap=statistics.median(gaps),
        most_unavailable=mcc.most_unavailable(t0),
        reads=[],
        writes=[],
        pulls_per_host={k: sum(1 for p in pulls if p.host == k) for k in mcc.nodes},
        order=order,
        windows=windows,
        prepulls={p.host: p.start for p in reversed(pulls) if not p.turn},
        series=series,
    )


@dataclass
class Modelled:
    rollout: float
    first_pull: float
    peak_pulls: float
    peak_prepulls: float
    registry_bytes: float
    lower_bound: float


def model(fleet: Fleet, strategy: str, seeds: int, run: Measured | None = None) -> Modelled:
    """The model's figures; for `today` (whose jitter is random) the model replaying `run`'s
    own delays, or without a run the mean over seeds 0..seeds-1."""
    fleets = [fleet]
    if strategy == "today" and run is not None:
        fleets = [replace(fleet, delays=tuple(run.prepulls.get(node, math.inf)
                                              for node in run.order))]  # fmt: skip
    elif strategy == "today":
        fleets = [replace(fleet, seed=s) for s in range(seeds)]
    outs: list[Outcome] = [simulate(f, strategy) for f in fleets]
    return Modelled(
        rollout=statistics.fmean(o.rollout for o in outs),
        first_pull=statistics.fmean(o.first_pull for o in outs),
        peak_pulls=statistics.fmean(o.peak_pulls for o in outs),
        peak_prepulls=statistics.fmean(o.peak_prepulls for o in outs),
        registry_bytes=statistics.fmean(o.registry_bytes for o in outs),
        lower_bound=lower_bound(fleet),
    )


def within(measured: float, modelled: float) -> bool:
    return abs(measured - modelled) <= TOLERANCE * modelled


def pct(measured: float, modelled: float) -> str:
    return f"{100 * (measured - modelled) / modelled:+.1f}%"


def spread(values: list[int]) -> str:
    """Per agent: the median and the range."""
    if not values:
        return "-"
    return f"{statistics.median(values):g} ({min(values)}-{max(values)})"


def count(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def report(runs: list[Measured], settings: Settings, sizes: list[int], strategies: list[str],
           seeds: int) -> tuple[list[tuple[str, bool]], dict[str, Any]]:  # fmt: skip
    """Print the table and the checks; returns the checks and the model's side for --json."""
    checks: list[tuple[str, bool]] = []
    models: dict[str, Any] = {}
    head = (f"{'N':>3} {'strategy':<8} {'rollout s':>9} {'model':>7} {'diff':>7}  "
            f"{'1st pull s':>10} {'model':>6} {'diff':>7}  {'peak pulls':>10} {'peak pre':>8}  "
            f"{'per node':>8} {'D_k':>5}  {'API reads/agent':>15} "
            f"{'writes/agent':>12}")  # fmt: skip
    print(f"S = {IMAGE_BYTES} B, b = {settings.link_bps:.0f} B/s (S/b = "
          f"{settings.pull_seconds:g} s), B = {settings.registry_bps:.0f} B/s "
          f"({settings.links:g} b), m = {settings.max_unavailable}, J = {settings.jitter:g} s, "
          f"reboot {settings.reboot:g} s, bounded --prestage-slots {settings.slots}")  # fmt: skip
    for n in sizes:
        mine = [r for r in runs if r.nodes == n]
        off = [r for r in mine if r.strategy == "off"]
        if not off:
            print(f"N={n}: no `off` run to calibrate the model from")
            continue
        # The model's two measured inputs, from the `off` runs only (never per strategy).
        disruption = statistics.median(r.disruption for r in off)
        pick_delay = statistics.median(r.pick_gap for r in off)
        slots = None if settings.slots == "auto" else int(settings.slots)
        fleet = Fleet(nodes=n, max_unavailable=settings.max_unavailable,
                      image_bytes=IMAGE_BYTES, registry_bps=settings.registry_bps,
                      link_bps=settings.link_bps, disruption=disruption, slots=slots,
                      jitter=settings.jitter, seed=0, lease_delay=0.0,
                      pick_delay=pick_delay)  # fmt: skip
        print(f"\nN={n}: model calibrated from the off run(s): D = {disruption:.2f} s (median "
              f"of (desiredConfig → Done) - the node's pull), pick delay = {pick_delay:.2f} s "
              f"(median freed slot → next pick); lower bound "
              f"{lower_bound(fleet):.1f} s")  # fmt: skip
        checks.append((f"N={n}: D = {disruption:.2f} s >= 2 S/b = "
                       f"{2 * settings.pull_seconds:g} s (the setting the comparison needs)",
                       disruption >= 2 * settings.pull_seconds))  # fmt: skip
        print(head)
        medians: dict[str, float] = {}
        predicted: dict[str, float] = {}
        for strategy in strategies:
            these = [r for r in mine if r.strategy == strategy]
            if not these:
                continue
            mean = model(fleet, strategy, seeds)
            models[f"{n}/{strategy}"] = {"fleet": asdict(fleet), **asdict(mean)}
            predicted[strategy] = mean.rollout
            medians[strategy] = statistics.median(r.rollout for r in these)
            if strategy == "today":
                print(f"    (today: the model replays each run's own jitter draws; the mean "
                      f"over {seeds} seeds: rollout {mean.rollout:.1f} s, first pull "
                      f"{mean.first_pull:.1f} s)")  # fmt: skip
            for r in these:
                expect = model(fleet, strategy, seeds, r)
                peaks = f"{r.peak_pulls}/{count(expect.peak_pulls)}"
                pre = f"{r.peak_prepulls}/{count(expect.peak_prepulls)}"
                print(f"{n:>3} {strategy:<8} {r.rollout:>9.1f} {expect.rollout:>7.1f} "
                      f"{pct(r.rollout, expect.rollout):>7}  {r.first_pull:>10.1f} "
                      f"{expect.first_pull:>6.1f} {pct(r.first_pull, expect.first_pull):>7}  "
                      f"{peaks:>10} {pre:>8}  {r.per_node:>8.2f} {r.disruption:>5.2f}  "
                      f"{spread(r.reads):>15} {spread(r.writes):>12}")  # fmt: skip
                tag = f"N={n} {strategy} #{r.repeat + 1}"
                checks.append((f"{tag}: rollout {r.rollout:.1f} s within 15 % of the model's "
                               f"{expect.rollout:.1f} s ({pct(r.rollout, expect.rollout)})",
                               within(r.rollout, expect.rollout)))  # fmt: skip
                checks.append((f"{tag}: first pull {r.first_pull:.1f} s within 15 % of the "
                               f"model's {expect.first_pull:.1f} s "
                               f"({pct(r.first_pull, expect.first_pull)})",
                               within(r.first_pull, expect.first_pull)))  # fmt: skip
                checks.append((f"{tag}: at most m = {settings.max_unavailable} Node(s) "
                               f"unavailable ({r.most_unavailable})",
                               r.most_unavailable <= settings.max_unavailable))  # fmt: skip
        if len(medians) > 1:
            seen = sorted(medians, key=lambda s: medians[s])
            modelled = sorted(predicted, key=lambda s: predicted[s])
            checks.append((f"N={n}: ordering by rollout, measured {' < '.join(seen)} "
                           f"({', '.join(f'{medians[s]:.1f}' for s in seen)} s), model "
                           f"{' < '.join(modelled)} "
                           f"({', '.join(f'{predicted[s]:.1f}' for s in modelled)} s)",
                           seen == modelled))  # fmt: skip
    print()
    for text, ok in checks:
        print(f"{'met   ' if ok else 'MISSED'}  {text}")
    return checks, models


async def main(options: argparse.Namespace) -> int:
    started = time.monotonic()
    settings = Settings(options.pull_seconds, options.links, options.reboot, options.jitter,
                        options.max_unavailable, options.slots)  # fmt: skip
    strategies = [s for s in STRATEGIES if s in (options.strategy or STRATEGIES)]
    if "off" not in strategies:
        strategies.insert(0, "off")  # the model is calibrated from it
    sizes = sorted(set(options.nodes or [6, 20]))
    runs: list[Measured] = []
    # Interleaved (every size and strategy, then again): a slower stretch of the machine
    # weighs on every strategy alike.
    for k in range(options.repeat):
        for n in sizes:
            for strategy in strategies:
                progress(f"N={n} {strategy} #{k + 1}: fresh cluster")
                runs.append(await one_rollout(n, strategy, k, settings, options.keep))
    checks, models = report(runs, settings, sizes, strategies, options.seeds)
    total = time.monotonic() - started
    print(f"total {total:.0f} s for {len(runs)} rollouts")
    if options.json:
        Path(options.json).write_text(json.dumps({
            "settings": {**asdict(settings), "image_bytes": IMAGE_BYTES,
                         "link_bps": settings.link_bps, "registry_bps": settings.registry_bps,
                         "seeds": options.seeds},
            "runs": [asdict(r) for r in runs],
            "model": models,
            "checks": [{"check": text, "met": ok} for text, ok in checks],
            "seconds": total,
        }, indent=1))  # fmt: skip
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, action="append", help="N (repeatable; 6 and 20)")
    parser.add_argument("--strategy", action="append", choices=STRATEGIES,
                        help="repeatable; default all three (off is always run)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="runs of each size and strategy")
    parser.add_argument("--max-unavailable", type=int, default=1, help="the pool's m")
    parser.add_argument("--pull-seconds", type=float, default=3.0,
                        help="S/b: one pull alone (b = the image's size / this)")  # fmt: skip
    parser.add_argument("--links", type=float, default=2.0, help="B/b: the registry's budget")
    parser.add_argument("--reboot", type=float, default=5.0,
                        help="seconds a simulated reboot keeps a node down")  # fmt: skip
    parser.add_argument("--jitter", type=float, default=10.0, help="J: today's jitter, seconds")
    parser.add_argument("--slots", default="auto", help="bounded: --prestage-slots (auto: m)")
    parser.add_argument("--seeds", type=int, default=20, help="model seeds averaged for today")
    parser.add_argument("--json", help="save the runs, the model's figures and the checks")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    parsed = parser.parse_args()
    parsed.repeat = max(1, parsed.repeat)
    sys.exit(asyncio.run(main(parsed)))
