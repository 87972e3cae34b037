"""Model one pool rollout's image pulls and turns as a fluid simulation, to compare pre-staging.

    python bench/fleet_model.py [--nodes 10 --nodes 100 --nodes 1000] [--plot docs/fleet-model.png]
                                [--check] [--seeds 5] [--slots 20] [--image-gb 1.5] ...

The machine-config-controller updates a pool's N nodes at most m at a time (maxUnavailable), in
one fixed order (zone, age, name: the node's "rank" 0..N-1). It picks ranks 0..m-1 at t = 0 and,
each time a node is Done, the next rank. A node's turn lasts from its pick until Done: it needs
the OS image (S bytes) pulled, then the disruption D (drain + reboot). So Done = max(turn, pull
end) + D: a node already pulled loses only D, one still pulling waits for the rest of its pull,
one that has not started pulls at its turn.

All pulls share the registry's bandwidth B equally (processor sharing), each also capped by its
node's link b: every active pull runs at min(b, B / n_active). Rates change only at events (a
pull's start or end, a pick, a Done), so the model steps from event to event.

Strategies, i.e. when a node pulls:
- `off`: at its turn only.
- `today`: pool-wide pre-staging as the agent does it now. At t = 0 each node draws a delay,
  uniform in [0, J] (J = jitter), and starts its pull then, unless its turn came first. Nothing
  bounds how many pull at once.
- `bounded`: K lanes (default K = m). Lane j serves ranks j, j+K, j+2K, ... in that order and is
  held by one node at a time. A node pre-pulls (before its turn) only while holding its lane
  (rank mod K), which it takes when the lane is free and every lower rank of the lane is
  through: pulled, or picked while another node held the lane (its turn came: it left the
  queue, whether or not its pull is over). It releases the lane when its pull ends. At its turn
  a node that has not pulled and is not pulling takes its lane if free (whatever the order) and
  otherwise pulls without one: a turn never waits (counted in `oversubscribed`). A pre-pull
  starts `lease_delay` seconds after its node takes the lane (the lease's round trip); a turn
  pull starts at once.
- `naive` (not in the tables; the tie check compares it): the lanes as the agents ran them
  before they followed the picks. A lane recorded only the highest rank through (`passed`, a
  high-water mark, raised by every pull that ended, a turn's included), and a node took the
  free lane once that mark reached the rank before it in its lane. A node picked out of order
  raised the mark past ranks still waiting, and they all raced for the lane (the first write
  wins: drawn from `seed` here), so a later rank could pre-pull before an earlier one.

The ranks are the agents' prediction of the controller's order. Nodes created in the same
second tie in the controller's sort (Go's sort.Slice is not stable, and it sorts a cache's
listing), so the name that breaks the tie is a guess: `picks` is the order the controller
actually takes them in (default: the ranks'). `--check` includes such a tie case (TIE_CASE):
`naive` loses time to it and `bounded` does not.

Printed: per N, m and strategy the rollout, its ratio to `lower_bound`, the first node's pull,
and the most concurrent pulls and pre-pulls. `--check` holds `bounded` to its targets (rollout
within 5 % of the lower bound, first pull no later than `off`'s, at most K concurrent pulls,
and no time lost to TIE_CASE's tie, which `naive` loses);
`--plot PATH` draws the registry's load over time and the rollout ratio against N (matplotlib:
`pip install -e '.[bench]'`). Units: bytes, bytes/s, seconds; GB and MB are 10^9 and 10^6 bytes.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field, replace

STRATEGIES = ("off", "today", "bounded")
LANE_STRATEGIES = ("bounded", "naive")  # simulate() also takes "naive"

# The defaults: a 1.5 GB image, a registry serving 1 GB/s, 1 Gbit/s node links (125 MB/s), and
# five minutes of drain + reboot per node.
DEFAULT_IMAGE = 1.5e9
DEFAULT_REGISTRY = 1e9
DEFAULT_LINK = 125e6
DEFAULT_DISRUPTION = 300.0
DEFAULT_NODES = (10, 20, 50, 100, 200, 500, 1000)

# Pull states.
_NONE, _PULLING, _PULLED = 0, 1, 2
# Event kinds (the heap orders by time, then by push order).
_PICK, _DONE, _START = 0, 1, 2


@dataclass(frozen=True)
class Fleet:
    nodes: int  # N
    max_unavailable: int  # m (>= 1)
    image_bytes: float  # S
    registry_bps: float  # B
    link_bps: float  # b
    disruption: float  # D seconds (drain + reboot + whatever a turn costs besides its pull)
    slots: int | None = None  # K for "bounded"; None means K = m
    jitter: float = 60.0  # J for "today"
    seed: int = 0
    lease_delay: float = 0.0
    pick_delay: float = 0.0  # seconds from a node's Done (or t=0) to the controller's next pick
    # "today": each rank's delay before its pre-pull, instead of drawing them from `seed` (a
    # measured run's own draws, to compare that one run; inf: its turn came first)
    delays: tuple[float, ...] | None = None
    # The order the controller picks the ranks in (a permutation of 0..N-1); None: the ranks'.
    picks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.max_unavailable < 1:
            raise ValueError("nodes and max_unavailable must be >= 1")
        if self.slots is not None and self.slots < 1:
            raise ValueError("slots must be >= 1 (or None for slots = max_unavailable)")
        if min(self.image_bytes, self.registry_bps, self.link_bps) <= 0:
            raise ValueError("image_bytes, registry_bps and link_bps must be > 0")
        if min(self.disruption, self.jitter, self.lease_delay, self.pick_delay) < 0:
            raise ValueError("disruption, jitter, lease_delay and pick_delay must be >= 0")
        if self.delays is not None and (
            len(self.delays) != self.nodes or min(self.delays, default=0.0) < 0
        ):
            raise ValueError("delays: one per node, each >= 0")
        if self.picks is not None and sorted(self.picks) != list(range(self.nodes)):
            raise ValueError("picks: a permutation of the ranks 0..nodes-1")

    @property
    def lanes(self) -> int:
        """K: the lanes `bounded` uses."""
        return self.max_unavailable if self.slots is None else self.slots


@dataclass
class Outcome:
    strategy: str
    rollout: float  # seconds from t=0 to the last node Done
    first_pull: float  # seconds from t=0 until rank 0's pull completes
    peak_pulls: int  # most concurrent pulls (pre-pulls + turn pulls)
    peak_prepulls: int  # most concurrent pulls by nodes before their turn
    oversubscribed: int  # turn pulls that started without a lane ("bounded" only, else 0)
    done: list[float] = field(default_factory=list)  # each rank's Done time
    series: list[tuple[float, float]] = field(default_factory=list)  # (t, registry bytes/s)
    registry_bytes: float = 0.0  # total bytes served (= N*S)


def lower_bound(fleet: Fleet) -> float:
    """The rollout if every turn cost only D (+ pick_delay) after the first wave's pulls.

    max(S/b, m*S/B) + ceil(N/m) * (D + pick_delay), with m capped at N. With pick_delay = 0 it is
    a true bound for every strategy: ranks 0..m-1 all start pulling at t = 0 and, sharing equally,
    end together no sooner than max(S/b, m*S/B); each of the controller's m chains of turns starts
    with one of them, and one chain has ceil(N/m) turns of at least D each. With pick_delay > 0 it
    is the figure of a rollout that starts pulling at the first pick; pre-pulls that start before
    it can beat it.
    """
    n, m = fleet.nodes, min(fleet.max_unavailable, fleet.nodes)
    first = max(fleet.image_bytes / fleet.link_bps, m * fleet.image_bytes / fleet.registry_bps)
    return first + math.ceil(n / m) * (fleet.disruption + fleet.pick_delay)


def simulate(fleet: Fleet, strategy: str) -> Outcome:
    """Run one rollout of `fleet` under `strategy` (one of STRATEGIES, or "naive") to its
    last Done."""
    if strategy not in (*STRATEGIES, *LANE_STRATEGIES):
        raise ValueError(f"strategy must be one of {STRATEGIES} or 'naive', not {strategy!r}")
    n_nodes, m = fleet.nodes, fleet.max_unavailable
    size, link, registry = fleet.image_bytes, fleet.link_bps, fleet.registry_bps
    bounded = strategy in LANE_STRATEGIES
    follow = strategy == "bounded"  # a picked node leaves its lane's queue
    picks = list(fleet.picks) if fleet.picks is not None else list(range(n_nodes))
    k = fleet.lanes

    state = [_NONE] * n_nodes
    picked = [False] * n_nodes
    prepulling = [False] * n_nodes  # pulling and not yet picked: counted in n_pre
    done = [math.nan] * n_nodes
    # Every active pull runs at the same rate, so each has received the same bytes since it
    # started: track V, the bytes one pull has received since t = 0, and each pull's V at its
    # start. Pulls then end in the order they started (all need S), so a FIFO of (V at start,
    # rank) gives the next completion in O(1) instead of updating every pull at every event.
    pulls: deque[tuple[float, int]] = deque()
    served = 0.0  # V accrues per pull: bytes served = sum of len(pulls) * dV
    v = 0.0
    t = 0.0
    n_pre = 0
    peak_pulls = peak_pre = 0
    oversubscribed = 0
    first_pull = math.nan
    series: list[tuple[float, float]] = []
    events: list[tuple[float, int, int, int]] = []  # (time, push order, kind, rank)
    order = 0
    next_pick = min(m, n_nodes)  # index into `picks` of the controller's next pick
    n_done = 0
    # bounded: lane j's holder (or -1), and the lowest rank of the lane that may still need a pull.
    holder = [-1] * k
    lane_next = list(range(k))
    mark = [-1] * k  # naive: each lane's high-water mark
    race = random.Random(fleet.seed)  # naive: who wins a lane several nodes may take

    def push(at: float, kind: int, rank: int) -> None:
        nonlocal order
        heapq.heappush(events, (at, order, kind, rank))
        order += 1

    def start_pull(rank: int) -> None:
        nonlocal n_pre
        state[rank] = _PULLING
        pulls.append((v, rank))
        if not picked[rank]:
            prepulling[rank] = True
            n_pre += 1

    def advance_lane(lane: int) -> None:
        # A free lane goes to its lowest rank that is not through: pulled, or picked (its turn
        # came: it pulls at its turn, out of the queue, and holds nobody up).
        if holder[lane] >= 0:
            return
        if follow:
            rank = lane_next[lane]
            while rank < n_nodes and (state[rank] == _PULLED or picked[rank]):
                rank += k
            lane_next[lane] = rank
            if rank >= n_nodes:
                return
        else:  # naive: every waiting rank whose lane predecessor is within the mark races
            ready = [r for r in range(lane, n_nodes, k) if state[r] == _NONE
                     and not picked[r] and r - k <= mark[lane]]  # fmt: skip
            if not ready:
                return
            rank = ready[0] if len(ready) == 1 else race.choice(ready)
        holder[lane] = rank
        if fleet.lease_delay > 0:
            push(t + fleet.lease_delay, _START, rank)
        else:
            start_pull(rank)

    def pick(rank: int) -> None:
        nonlocal n_pre, oversubscribed
        picked[rank] = True
        if state[rank] == _PULLED:
            push(t + fleet.disruption, _DONE, rank)
        elif state[rank] == _PULLING:
            if prepulling[rank]:  # the rest of its pull is a turn pull now
                prepulling[rank] = False
                n_pre -= 1
        else:
            if bounded:
                lane = rank % k
                if holder[lane] < 0:
                    holder[lane] = rank
                elif holder[lane] != rank:  # a turn never waits for a lane
                    oversubscribed += 1
            start_pull(rank)  # its Done is pushed when the pull ends

    def complete(rank: int) -> None:
        nonlocal n_pre, first_pull
        state[rank] = _PULLED
        if prepulling[rank]:
            prepulling[rank] = False
            n_pre -= 1
        if rank == 0:
            first_pull = t
        if picked[rank]:
            push(t + fleet.disruption, _DONE, rank)
        if bounded:
            lane = rank % k
            mark[lane] = max(mark[lane], rank)
            if holder[lane] == rank:
                holder[lane] = -1
            # Also after a lane-less pull (naive: the mark moved).
            advance_lane(lane)

    for rank in picks[:next_pick]:
        push(fleet.pick_delay, _PICK, rank)
    if strategy == "today":
        rng = random.Random(fleet.seed)
        for rank in range(n_nodes):
            delay = rng.uniform(0.0, fleet.jitter) if fleet.delays is None else fleet.delays[rank]
            if math.isfinite(delay):
                push(delay, _START, rank)
    elif bounded:
        for lane in range(k):
            advance_lane(lane)

    # Completions within this many bytes of V end together (pulls that started at one instant
    # have the very same V at start; the slack only absorbs float rounding).
    slack = size * 1e-9
    while n_done < n_nodes:
        active = len(pulls)
        rate = min(link, registry / active) if active else 0.0
        t_pull = t + max(0.0, (pulls[0][0] + size - v) / rate) if active else math.inf
        t_event = events[0][0] if events else math.inf
        t_next = min(t_pull, t_event)
        if t_next == math.inf:
            raise RuntimeError(f"{strategy}: stuck at t={t} with {n_done}/{n_nodes} done")
        if t_next > t:
            # The state now holds over [t, t_next): count it, and record the registry's load.
            peak_pulls = max(peak_pulls, active)
            peak_pre = max(peak_pre, n_pre)
            load = active * rate
            if not series or series[-1][1] != load:
                series.append((t, load))
        # Landing V exactly on the head pull's end (rather than adding rate * dt) guarantees the
        # head completes below, even when dt is lost to rounding.
        v_next = pulls[0][0] + size if t_pull <= t_event else v + rate * (t_next - t)
        served += active * (v_next - v)
        v, t = v_next, t_next
        if t_pull <= t_event:
            while pulls and pulls[0][0] + size <= v + slack:
                complete(pulls.popleft()[1])
            continue
        _, _, kind, rank = heapq.heappop(events)
        if kind == _PICK:
            pick(rank)
        elif kind == _DONE:
            done[rank] = t
            n_done += 1
            if next_pick < n_nodes:
                push(t + fleet.pick_delay, _PICK, picks[next_pick])
                next_pick += 1
        elif state[rank] == _NONE:  # _START: a jittered or leased pre-pull, unless its turn came
            start_pull(rank)
    if series and series[-1][1] != 0.0:
        series.append((t, 0.0))
    return Outcome(
        strategy=strategy,
        rollout=max(done),
        first_pull=first_pull,
        peak_pulls=peak_pulls,
        peak_prepulls=peak_pre,
        oversubscribed=oversubscribed,
        done=done,
        series=series,
        registry_bytes=served,
    )


# --- command line ---------------------------------------------------------------------------


@dataclass
class Row:
    """One table line: an outcome, or the mean of `today`'s over several seeds."""

    fleet: Fleet
    strategy: str
    rollout: float
    first_pull: float
    peak_pulls: float
    peak_prepulls: float
    oversubscribed: float

    @property
    def ratio(self) -> float:
        return self.rollout / lower_bound(self.fleet)


def run(fleet: Fleet, strategy: str, seeds: int = 1) -> Row:
    """Simulate; for `today` with seeds > 1, the mean over seeds 0..seeds-1."""
    many = strategy == "today" and seeds > 1
    fleets = [replace(fleet, seed=s) for s in range(seeds)] if many else [fleet]
    outs = [simulate(f, strategy) for f in fleets]
    return Row(
        fleet=fleet,
        strategy=strategy,
        rollout=statistics.fmean(o.rollout for o in outs),
        first_pull=statistics.fmean(o.first_pull for o in outs),
        peak_pulls=statistics.fmean(o.peak_pulls for o in outs),
        peak_prepulls=statistics.fmean(o.peak_prepulls for o in outs),
        oversubscribed=statistics.fmean(o.oversubscribed for o in outs),
    )


def unavailabilities(nodes: int, given: list[int] | None) -> list[int]:
    """The m values to run for N nodes: as given, else 1 and 10 % of N."""
    return sorted(set(given or (1, max(1, nodes // 10))))


def _count(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def table(rows: list[Row]) -> str:
    head = f"{'N':>5} {'m':>4} {'K':>4}  {'strategy':<8} {'rollout s':>10} {'/bound':>7}"
    head += f" {'1st pull s':>10} {'peak pulls':>10} {'peak pre':>9}"
    lines = [head]
    for r in rows:
        f = r.fleet
        lines.append(
            f"{f.nodes:>5} {f.max_unavailable:>4} {f.lanes:>4}  {r.strategy:<8}"
            f" {r.rollout:>10.1f} {r.ratio:>7.3f} {r.first_pull:>10.1f}"
            f" {_count(r.peak_pulls):>10} {_count(r.peak_prepulls):>9}"
        )
    return "\n".join(lines)


def check(rows: list[Row]) -> list[tuple[str, bool]]:
    """The targets for `bounded`, one (description, passed) per target and case with N <= 1000."""
    by_case: dict[tuple[int, int], dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault((r.fleet.nodes, r.fleet.max_unavailable), {})[r.strategy] = r
    results = []
    for (n, m), case in by_case.items():
        if n > 1000 or "bounded" not in case or "off" not in case:
            continue
        b, off = case["bounded"], case["off"]
        k, bound = b.fleet.lanes, lower_bound(b.fleet)
        results += [
            (
                f"N={n} m={m}: bounded rollout {b.rollout:.1f} s <= 1.05 x bound {bound:.1f} s",
                b.rollout <= 1.05 * bound,
            ),
            (
                f"N={n} m={m}: bounded first pull {b.first_pull:.1f} s"
                f" <= off's {off.first_pull:.1f} s",
                b.first_pull <= off.first_pull + 1e-6,
            ),
            (
                f"N={n} m={m}: bounded peak pulls {_count(b.peak_pulls)} <= K={k}",
                b.peak_pulls <= k,
            ),
        ]
    return results


# The tie: a 13-Node pool (m = K = 1) whose first five Nodes came from one MachineSet scale-up,
# created in the same second: the agents guess their order by name (ranks 0-4), the controller
# picks them 4, 2, 3, 1, 0 (its sort is not stable), then the rest in order. The pull and turn
# are bench/fleet_rollout.py's (S = 128 MiB, S/b = 3 s, B = 2b, D = 6.2 s, the D its off runs
# measured), the size of the held-out rollout that lost time to a tie (86 s).
TIE_IMAGE = 128 * 2**20
TIE_CASE = Fleet(nodes=13, max_unavailable=1, image_bytes=TIE_IMAGE, registry_bps=2 * TIE_IMAGE / 3,
                 link_bps=TIE_IMAGE / 3, disruption=6.2,
                 picks=(4, 2, 3, 1, 0, *range(5, 13)))  # fmt: skip
TIE_DRAWS = 10  # naive: the lane races drawn from seeds 0..9


def tie_check(case: Fleet = TIE_CASE, draws: int = TIE_DRAWS) -> list[tuple[str, bool]]:
    """Following the picks loses no time to the tie (the rollout is the one with no tie); the
    naive lanes do (their mean over the races' draws is later)."""
    follow = simulate(case, "bounded").rollout
    untied = simulate(replace(case, picks=None), "bounded").rollout
    naive = [simulate(replace(case, seed=s), "naive").rollout for s in range(draws)]
    mean = statistics.fmean(naive)
    return [
        (f"tie (picks {list(case.picks or ())[:5]}...): bounded, following the picks, "
         f"{follow:.1f} s <= {untied:.1f} s with no tie", follow <= untied + 1e-6),
        (f"tie: naive lanes lose time: {mean:.1f} s mean of {draws} races (worst "
         f"{max(naive):.1f} s) > bounded's {follow:.1f} s", mean > follow + 0.5),
    ]  # fmt: skip


def plot(path: str, base: Fleet, nodes: list[int], seeds: int) -> None:
    """Two panels: (a) registry load over time, N=100, m=10; (b) rollout / bound against N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"off": "tab:gray", "today": "tab:red", "bounded": "tab:blue"}
    # `today` and `bounded` both keep the registry at B until every node has pulled, so the
    # curves overlap: distinct line styles, and a marker where each one's first node is pulled.
    styles = {"off": ("-", 3.0), "today": ("--", 1.6), "bounded": (":", 2.0)}
    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    case = replace(base, nodes=100, max_unavailable=10)
    outs = {strategy: simulate(case, strategy) for strategy in STRATEGIES}
    for strategy, out in outs.items():
        ts = [p[0] for p in out.series]
        rates = [p[1] / 1e9 for p in out.series]
        style, width = styles[strategy]
        ax_a.step(
            ts,
            rates,
            style,
            where="post",
            color=colors[strategy],
            lw=width,
            label=f"{strategy}: rollout {out.rollout:.0f} s, 1st pull {out.first_pull:.0f} s",
        )
        ax_a.axvline(out.first_pull, color=colors[strategy], lw=0.8, alpha=0.6)
    # The pre-pulls and off's first three waves, not the whole (mostly idle) rollout.
    last_prepull = max(outs[s].series[-1][0] for s in ("today", "bounded"))
    window = 1.15 * max(last_prepull, 2 * (outs["off"].first_pull + case.disruption))
    ax_a.set_xlim(0, min(window, max(out.rollout for out in outs.values())))
    ax_a.set_ylim(0, case.registry_bps / 1e9 * 1.25)
    ax_a.set_xlabel("time (s); thin lines: rank 0's pull done")
    ax_a.set_ylabel("registry load (GB/s)")
    ax_a.set_title(
        f"(a) registry load, N=100, m=10, K={case.lanes}, S={case.image_bytes / 1e9:g} GB,\n"
        f"B={case.registry_bps / 1e9:g} GB/s, b={case.link_bps / 1e6:g} MB/s, "
        f"D={case.disruption:g} s, J={case.jitter:g} s",
        fontsize=9,
    )
    ax_a.legend(fontsize=8)
    for tenth, style in ((False, "-"), (True, "--")):
        for strategy in STRATEGIES:
            xs, ys = [], []
            for n in nodes:
                m = max(1, n // 10) if tenth else 1
                xs.append(n)
                ys.append(run(replace(base, nodes=n, max_unavailable=m), strategy, seeds).ratio)
            ax_b.plot(
                xs,
                ys,
                style,
                marker="o",
                ms=3,
                color=colors[strategy],
                label=f"{strategy}, m={'N/10' if tenth else '1'}",
            )
    ax_b.set_xscale("log")
    ax_b.set_xlabel("nodes N")
    ax_b.set_ylabel("rollout / lower bound")
    lanes = "m" if base.slots is None else base.slots
    ax_b.set_title(f"(b) rollout / lower bound, m = 1 and m = N/10 (K = {lanes})", fontsize=9)
    ax_b.legend(fontsize=8)
    ax_b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="N (repeatable)")
    parser.add_argument(
        "--max-unavailable", type=int, action="append", help="m (repeatable; default 1 and N/10)"
    )
    parser.add_argument(
        "--image-gb", type=float, default=DEFAULT_IMAGE / 1e9, help="S in 10^9 bytes"
    )
    parser.add_argument(
        "--registry-gbps",
        type=float,
        default=DEFAULT_REGISTRY / 1e9,
        help="B in 10^9 bytes/s (bytes, not bits)",
    )
    parser.add_argument(
        "--link-mbps",
        type=float,
        default=DEFAULT_LINK / 1e6,
        help="b in 10^6 bytes/s (bytes, not bits: 125 = a 1 Gbit/s link)",
    )
    parser.add_argument("--disruption", type=float, default=DEFAULT_DISRUPTION, help="D seconds")
    parser.add_argument("--jitter", type=float, default=60.0, help="J seconds (today)")
    parser.add_argument("--slots", type=int, help="K lanes (bounded; default m)")
    parser.add_argument("--seed", type=int, default=0, help="today's seed (with --seeds 1)")
    parser.add_argument("--seeds", type=int, default=1, help="today: mean over seeds 0..N-1")
    parser.add_argument("--lease-delay", type=float, default=0.0, help="seconds")
    parser.add_argument("--pick-delay", type=float, default=0.0, help="seconds")
    parser.add_argument("--check", action="store_true", help="hold bounded to its targets")
    parser.add_argument("--plot", metavar="PATH", help="write the figure (PNG) to PATH")
    args = parser.parse_args(argv)

    base = Fleet(
        nodes=1,
        max_unavailable=1,
        image_bytes=args.image_gb * 1e9,
        registry_bps=args.registry_gbps * 1e9,
        link_bps=args.link_mbps * 1e6,
        disruption=args.disruption,
        slots=args.slots,
        jitter=args.jitter,
        seed=args.seed,
        lease_delay=args.lease_delay,
        pick_delay=args.pick_delay,
    )
    nodes = sorted(set(args.nodes or DEFAULT_NODES))
    started = time.perf_counter()
    rows = [
        run(replace(base, nodes=n, max_unavailable=m), strategy, args.seeds)
        for n in nodes
        for m in unavailabilities(n, args.max_unavailable)
        for strategy in STRATEGIES
    ]
    print(
        f"S={base.image_bytes:g} B, B={base.registry_bps:g} B/s, b={base.link_bps:g} B/s,"
        f" D={base.disruption:g} s, J={base.jitter:g} s, lease delay {base.lease_delay:g} s,"
        f" pick delay {base.pick_delay:g} s"
        + (f", today: mean of seeds 0..{args.seeds - 1}" if args.seeds > 1 else "")
    )
    print(table(rows))
    print(f"simulated {len(rows)} rollouts in {time.perf_counter() - started:.2f} s")

    status = 0
    if args.check:
        failed = []
        for text, ok in check(rows) + tie_check():
            print(f"{'PASS' if ok else 'FAIL'}  {text}")
            if not ok:
                failed.append(text)
        if failed:
            print(f"check: {len(failed)} target(s) failed: " + "; ".join(failed))
            status = 1
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib: pip install -e '.[bench]'", file=sys.stderr)
            return 2
        plot(args.plot, base, nodes, args.seeds)
        print(f"wrote {args.plot}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
