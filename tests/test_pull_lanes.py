"""Bounded, turn-aware pre-pulls: the controller's order (pure), the lane Lease's rules (pure),
and several nodes' lanes against the loopback API server in one process, with the service
account's RBAC from deploy/rbac.yaml: the order kept, the bound never exceeded, a holder
killed mid-pull taken over, a silent holder told it lost the lane, the turn never waiting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.cluster.kube import Kube
from agent.cluster.kubeclient import ApiClient
from agent.cluster.lane_lease import (
    HOLDER_RANK,
    PASSED,
    TARGET,
    LaneRecord,
    Verdict,
    decide,
    format_ranks,
    lease_name,
    parse_ranks,
    released,
    taken,
    turn_may_take,
)
from agent.cluster.pool import PoolError
from agent.cluster.pull_lanes import LaneLost, PullLane
from agent.cluster.pull_order import (
    Queue,
    label_selector,
    max_unavailable,
    order_key,
    pool_members,
    queue_of,
    slots_for,
)
from agent.hypershift.order import MACHINE_ANNOTATION, listing_key, nodepool_members
from agent.hypershift.order import slots_for as nodepool_slots
from standins.kube import FakeKube, pool_rules
from tests.scenarios.backend import MCO_NS
from tests.scenarios.fake import AGENT_SA, agent_rules
from tests.scenarios.harness import until

P = "machineconfiguration.openshift.io/"
WORKER = {"node-role.kubernetes.io/worker": ""}
POOLS = [
    {"metadata": {"name": "worker"},
     "spec": {"nodeSelector": {"matchLabels": WORKER}, "maxUnavailable": 1}},
    {"metadata": {"name": "infra"},
     "spec": {"nodeSelector": {"matchLabels": {"node-role.kubernetes.io/infra": ""}}}},
]  # fmt: skip


def node(name: str, created: str, zone: str | None = None, current: str = "r1",
         extra: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    labels = {**WORKER, **(extra or {})}
    if zone is not None:
        labels["topology.kubernetes.io/zone"] = zone
    return {"metadata": {"name": name, "creationTimestamp": created, "labels": labels,
                         "annotations": {P + "currentConfig": current,
                                         P + "desiredConfig": current, P + "state": "Done"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


# -- the controller's order (pure) -----------------------------------------------------------
NODES = [
    node("n-late-b", "2026-01-03T00:00:00Z", zone="b"),
    node("n-none-old", "2026-01-01T00:00:00Z"),
    node("n-early-b", "2026-01-01T00:00:00Z", zone="b"),
    node("n-a", "2026-01-05T00:00:00Z", zone="a"),
    node("n-none-new", "2026-01-09T00:00:00Z"),
    node("n-tie-2", "2026-01-02T00:00:00Z", zone="b"),
    node("n-tie-1", "2026-01-02T00:00:00Z", zone="b"),
]


def names(nodes: list[dict[str, Any]]) -> list[str]:
    return [n["metadata"]["name"] for n in nodes]


def test_order_is_zone_then_age_then_the_nodes_without_a_zone() -> None:
    assert names(sorted(NODES, key=order_key)) == [
        "n-a", "n-early-b", "n-tie-1", "n-tie-2", "n-late-b", "n-none-old", "n-none-new",
    ]  # fmt: skip


def test_order_is_the_controller_stand_ins_pick_order() -> None:
    """The stand-in follows sortNodeList (standins/kube/pool_rules.py); where ages tie, Go's
    unstable sort has no order, and the name is the agent's guess, so the tie is left out here."""
    untied = [n for n in NODES if n["metadata"]["name"] != "n-tie-2"]
    assert names(sorted(untied, key=order_key)) == names(pool_rules.sort_candidates(untied))


def test_members_follow_the_primary_pool_rule() -> None:
    infra = node("n-infra", "2026-01-01T00:00:00Z", extra={"node-role.kubernetes.io/infra": ""})
    both = node("n-two", "2026-01-01T00:00:00Z",
                extra={"node-role.kubernetes.io/infra": "", "x": ""})  # fmt: skip
    pools = [*POOLS, {"metadata": {"name": "x"},
                      "spec": {"nodeSelector": {"matchLabels": {"x": ""}}}}]  # fmt: skip
    members = pool_members("worker", [*NODES, infra, both], pools)
    assert names(members) == names(NODES)  # infra's Node is infra's; two custom pools: none
    assert names(pool_members("infra", [infra], pools)) == ["n-infra"]


@pytest.mark.parametrize(
    ("value", "members", "expected"),
    [(None, 10, 1), (3, 10, 3), (0, 10, 1), ("10%", 1000, 100), ("10%", 9, 1), ("25%", 10, 2),
     ("100%", 6, 6)],
)  # fmt: skip
def test_max_unavailable_as_the_controller_resolves_it(value, members, expected) -> None:
    pool = {"spec": {"maxUnavailable": value}}
    assert max_unavailable(pool, members) == expected
    assert pool_rules.max_unavailable(pool, members) == expected  # the stand-in agrees


@pytest.mark.parametrize("value", ["ten", "10 %", 1.5, True])
def test_max_unavailable_refuses_what_the_controller_refuses(value) -> None:
    with pytest.raises(PoolError, match="maxUnavailable"):
        max_unavailable({"spec": {"maxUnavailable": value}}, 10)


def test_slots() -> None:
    pool = {"spec": {"maxUnavailable": "10%"}}
    assert slots_for("auto", pool, 200) == 20
    assert slots_for("3", pool, 200) == 3


def test_label_selector_is_the_equality_part() -> None:
    assert label_selector({"matchLabels": {"b": "2", "a": ""}}) == "a=,b=2"
    assert label_selector({"matchExpressions": [{"key": "a", "operator": "Exists"}]}) == ""
    assert label_selector(None) == ""


def test_queue_rank_lane_and_predecessor() -> None:
    ordered = names(sorted(NODES, key=order_key))
    queue = queue_of("n-late-b", NODES, "r2", lanes=2)
    assert queue is not None
    assert (queue.rank, queue.lane, queue.members) == (ordered.index("n-late-b"), 0, 7)
    assert queue.predecessor == ordered[2] and queue.predecessor_rank == 2
    assert queue.before == ((0, ordered[0]), (2, ordered[2]))  # every lower rank of its lane
    first = queue_of("n-a", NODES, "r2", lanes=2)
    assert first is not None and (first.rank, first.predecessor) == (0, None)
    assert queue_of("elsewhere", NODES, "r2", lanes=2) is None


def test_a_predecessor_already_at_the_target_is_skipped() -> None:
    done = [node("a", "2026-01-01T00:00:00Z", current="r2"),
            node("b", "2026-01-02T00:00:00Z", current="r2"),
            node("c", "2026-01-03T00:00:00Z")]  # fmt: skip
    queue = queue_of("c", done, "r2", lanes=1)
    assert queue is not None and (queue.rank, queue.predecessor) == (2, None)


def picked(name: str, created: str, target: str = "r2") -> dict[str, Any]:
    """A Node the controller has picked for `target` (its turn came; not done yet)."""
    chosen = node(name, created)
    chosen["metadata"]["annotations"][P + "desiredConfig"] = target
    return chosen


def test_a_picked_predecessor_counts_until_its_turn_says_on_the_lane() -> None:
    """A node the controller picked takes its lane at its turn if it is free (no pre-pull runs
    beside a turn), or leaves the queue, marked through on the lane: a list cannot tell which,
    so it is waited for until the lane says (lane rules below)."""
    members = [node("a", "2026-01-01T00:00:00Z"), picked("b", "2026-01-02T00:00:00Z"),
               node("c", "2026-01-03T00:00:00Z")]  # fmt: skip
    queue = queue_of("c", members, "r2", lanes=1)
    assert queue is not None and (queue.rank, queue.predecessor) == (2, "b")
    assert queue.before == ((0, "a"), (1, "b"))


def test_a_tie_is_ranked_by_name_a_guess_the_lane_corrects() -> None:
    """Nodes created in the same second tie in the controller's sort (Go's sort.Slice is not
    stable); the name is the agent's guess. If the controller picks t-b before t-a, t-b marks
    itself through at its turn, and t-c then waits for t-a only."""
    tied = [node("t-b", "2026-01-01T00:00:00Z"), node("t-a", "2026-01-01T00:00:00Z"),
            node("t-c", "2026-01-01T00:00:00Z")]  # fmt: skip
    assert names(sorted(tied, key=order_key)) == ["t-a", "t-b", "t-c"]
    queue = queue_of("t-c", tied, "r2", lanes=1)
    assert queue is not None and queue.before == ((0, "t-a"), (1, "t-b"))
    lane = record("t-a", holder_rank=0, passed=(1,))  # t-a pre-pulls; t-b's turn: through
    assert "held by t-a" in decide(lane, "t-c", queue, expired=False, skip=False).why
    after = record(passed=(0, 1))  # t-a is through too
    assert decide(after, "t-c", queue, expired=False, skip=False).verdict == Verdict.TAKE


def test_a_nodepool_is_ranked_in_the_upgraders_listing_order() -> None:
    """HyperShift: by Machine name (the upgrader lists Machines, then their Nodes), Nodes with
    no Machine last; members by the NodePool label; auto = 1 lane (maxUnavailable is not
    readable from the guest)."""

    def hosted(name: str, machine: str | None, pool: str = "np") -> dict[str, Any]:
        notes = {MACHINE_ANNOTATION: machine} if machine else {}
        return {"metadata": {"name": name, "labels": {"hypershift.openshift.io/nodePool": pool},
                             "annotations": notes}}  # fmt: skip

    nodes = [hosted("z-node", "np-machine-0"), hosted("a-node", "np-machine-2"),
             hosted("m-node", "np-machine-1"), hosted("loose", None),
             hosted("other", "other-machine-0", pool="other")]  # fmt: skip
    members = nodepool_members(nodes, "hypershift.openshift.io/nodePool", "np")
    assert names(sorted(members, key=listing_key)) == ["z-node", "m-node", "a-node", "loose"]
    queue = queue_of("a-node", members, "h2", lanes=nodepool_slots("auto"), key=listing_key)
    assert queue is not None and queue.rank == 2 and queue.lanes == 1
    assert queue.before == ((0, "z-node"), (1, "m-node"))
    assert nodepool_slots("3") == 3


# -- the lane's rules (pure) -----------------------------------------------------------------
# Rank 5 of lane 1 (K = 2): ranks 1 (o) and 3 (p) of its lane still waited when it listed them.
Q = Queue("r2", rank=5, lanes=2, predecessor="p", predecessor_rank=3, members=10,
          before=((1, "o"), (3, "p")))  # fmt: skip


def record(holder: str | None = None, target: str | None = "r2", passed: tuple[int, ...] = (),
           holder_rank: int | None = None) -> LaneRecord:  # fmt: skip
    return LaneRecord(holder, "t" if holder else None, 30, 0, target, holder_rank,
                      frozenset(passed))  # fmt: skip


@pytest.mark.parametrize(
    ("rec", "expired", "skip", "verdict", "words", "through"),
    [
        (None, False, False, Verdict.WAIT, "waiting for p (rank 3)", ()),
        (record(passed=(1, 3)), False, False, Verdict.TAKE, "lane free after p", ()),
        (record(passed=(1,)), False, False, Verdict.WAIT, "waiting for p (rank 3)", ()),
        # p was picked (its turn marked it through) while o still waits: o is next, not me.
        (record(passed=(3,)), False, False, Verdict.WAIT, "waiting for o (rank 1)", ()),
        (record(passed=(1,)), False, True, Verdict.TAKE, "p did not take it in time", (3,)),
        (record("p", holder_rank=3), False, False, Verdict.WAIT, "held by p (rank 3)", ()),
        (record("p", holder_rank=3), True, False, Verdict.TAKE, "its lease expired", (1, 3)),
        (record("older", holder_rank=1), True, False, Verdict.WAIT, "waiting for p", ()),
        (record("me"), False, False, Verdict.MINE, "holds", ()),
        # Its own hold for the last rollout (a release its watch has not brought yet): the
        # order decides, never "mine" (a pre-pull would start beside the lane's rightful one).
        (record("me", target="r1"), False, False, Verdict.WAIT, "waiting for p (rank 3)", ()),
        (record(target="r1", passed=(1, 3, 9)), False, False, Verdict.WAIT, "waiting for p", ()),
    ],
)  # fmt: skip
def test_decide(rec, expired, skip, verdict, words, through) -> None:
    decision = decide(rec, "me", Q, expired=expired, skip=skip)
    assert decision.verdict == verdict and words in decision.why
    assert decision.through == frozenset(through)  # written with the hold: not waited again


def test_the_first_of_a_lane_takes_it_free_or_from_another_rollout() -> None:
    first = Queue("r2", 1, 2, None, None, 10)
    assert decide(None, "me", first, expired=False, skip=False).verdict == Verdict.TAKE
    stale = record(target="r1", passed=(7,))
    assert decide(stale, "me", first, expired=False, skip=False).verdict == Verdict.TAKE
    own = record("me", target="r1", holder_rank=4)  # its own hold of the last rollout
    assert decide(own, "me", first, expired=False, skip=False).verdict == Verdict.TAKE


@pytest.mark.parametrize(
    ("ranks", "text"),
    [((), ""), ((5,), "5"), ((0, 1, 2, 3), "0-3"), ((7, 0, 2, 1, 9, 10), "0-2,7,9-10")],
)
def test_ranks_through_are_written_as_ranges(ranks, text) -> None:
    assert format_ranks(ranks) == text
    assert parse_ranks(text) == frozenset(ranks)


def test_ranks_that_cannot_be_read_count_as_none_through() -> None:
    """A value it cannot read (or the high-water mark `-1` of an older agent) holds nobody's
    lane twice: its nodes are waited for, then skipped."""
    assert parse_ranks("-1") == frozenset() and parse_ranks(None) == frozenset()
    assert parse_ranks("x,3,4-a, 6 ,") == frozenset({3, 6})


def test_the_turn_takes_a_free_lane_whatever_the_order() -> None:
    assert turn_may_take(None, "me", expired=False)
    assert turn_may_take(record(), "me", expired=False)
    assert turn_may_take(record("me"), "me", expired=False)
    assert turn_may_take(record("other"), "me", expired=True)
    assert not turn_may_take(record("other"), "me", expired=False)


def test_lease_bodies() -> None:
    body = taken(None, None, name="image-mode-prepull-worker-1", namespace=MCO_NS,
                 pool="worker", me="me", queue=Q, duration=30,
                 now="2026-12-04T00:00:00.000000Z")  # fmt: skip
    assert body["spec"] == {"holderIdentity": "me", "leaseDurationSeconds": 30,
                            "renewTime": "2026-12-04T00:00:00.000000Z",
                            "acquireTime": "2026-12-04T00:00:00.000000Z",
                            "leaseTransitions": 0}  # fmt: skip
    notes = body["metadata"]["annotations"]
    assert notes == {TARGET: "r2", HOLDER_RANK: "5", PASSED: ""}
    again = taken({**body, "metadata": {**body["metadata"], "resourceVersion": "7"}},
                  LaneRecord.of(body), name="x", namespace=MCO_NS, pool="worker", me="other",
                  queue=Q, duration=30, now="later")  # fmt: skip
    assert again["spec"]["leaseTransitions"] == 1 and again["metadata"]["resourceVersion"] == "7"
    done = released(body, "me", Q, passed=True)
    assert done is not None and "holderIdentity" not in done["spec"]
    assert done["metadata"]["annotations"][PASSED] == "5"
    assert released(done, "me", Q, passed=True) is None  # nothing left to change
    cancelled = released(body, "me", Q, passed=False)
    assert cancelled is not None and cancelled["metadata"]["annotations"][PASSED] == ""
    # A skip (or a takeover) writes the ranks it stopped waiting for with its hold.
    skipping = taken(None, None, name="x", namespace=MCO_NS, pool="worker", me="me", queue=Q,
                     duration=30, now="t", through=frozenset({1, 3}))  # fmt: skip
    assert skipping["metadata"]["annotations"][PASSED] == "1,3"
    through = released(skipping, "me", Q, passed=True)
    assert through is not None and through["metadata"]["annotations"][PASSED] == "1,3,5"
    # A turn while another node holds the lane: out of the queue, the hold untouched.
    held = {**body, "spec": {**body["spec"], "holderIdentity": "p"}}
    out = released(held, "o", Queue("r2", 1, 2, None, None, 10), passed=True)
    assert out is not None and out["spec"]["holderIdentity"] == "p"
    assert out["metadata"]["annotations"][PASSED] == "1"
    # Another node's live hold of another rollout is not relabelled by a mark.
    foreign = {**body, "metadata": {**body["metadata"], "annotations": {TARGET: "r1"}},
               "spec": {**body["spec"], "holderIdentity": "other"}}  # fmt: skip
    assert released(foreign, "me", Q, passed=True) is None


# -- several nodes' lanes on the loopback API server ----------------------------------------
class Fleet:
    """Pool members, each with its PullLane over the service account's own client."""

    def __init__(self, kube: FakeKube, api: Kube, members: list[dict[str, Any]], lanes: int,
                 duration: int = 1, skip_after: float = 30.0) -> None:  # fmt: skip
        self.kube, self.api = kube, api
        self.lanes = {
            n["metadata"]["name"]: PullLane(
                api, namespace=MCO_NS, pool="worker", me=n["metadata"]["name"],
                queue=queue_of(n["metadata"]["name"], members, "r2", lanes),  # type: ignore[arg-type]
                duration=duration, skip_after=skip_after)
            for n in members
        }  # fmt: skip
        self.holding: set[str] = set()
        self.most = 0
        self.order: list[str] = []

    def holders(self) -> list[str | None]:
        return [(lease.get("spec") or {}).get("holderIdentity")
                for lease in self.kube.list("leases", namespace=MCO_NS)]  # fmt: skip

    async def pull(self, name: str, seconds: float) -> None:
        """Pre-pull through the node's lane: wait, hold (renewed) while pulling, pass on."""
        lane = self.lanes[name]
        await lane.acquire()
        self.holding.add(name)
        self.order.append(name)
        self.most = max(self.most, len(self.holding), sum(1 for h in self.holders() if h))
        keeper = asyncio.create_task(lane.keep())
        await asyncio.sleep(seconds)
        keeper.cancel()
        self.holding.discard(name)
        await lane.release(passed=True)

    async def close(self) -> None:
        for lane in self.lanes.values():
            await lane.close()


@contextlib.asynccontextmanager
async def loopback() -> AsyncIterator[tuple[FakeKube, Kube]]:
    kube = FakeKube()
    await kube.start()
    sa = kube.service_account(MCO_NS, AGENT_SA, agent_rules())  # deploy/rbac.yaml's grants
    api = Kube(ApiClient(kube.client_configuration(sa)), timeout=10)
    try:
        yield kube, api
    finally:
        await api.close()
        await kube.stop()


def lane_of(api: Kube, me: str, members: list[dict[str, Any]], duration: int = 5) -> PullLane:
    queue = queue_of(me, members, "r2", 1)
    assert queue is not None
    return PullLane(api, namespace=MCO_NS, pool="worker", me=me, queue=queue, duration=duration)


def pool_of(count: int) -> list[dict[str, Any]]:
    return [node(f"w{i}", f"2026-01-0{i + 1}T00:00:00Z") for i in range(count)]


async def test_prepulls_run_in_the_controllers_order_at_most_k_at_once() -> None:
    async with loopback() as (kube, api):
        members = pool_of(6)
        fleet = Fleet(kube, api, members, lanes=2)
        # Started in reverse order: the lanes still serve the ranks in the controller's order.
        tasks = [asyncio.create_task(fleet.pull(f"w{i}", 0.4)) for i in reversed(range(6))]
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert fleet.most <= 2
        assert fleet.order.index("w0") < fleet.order.index("w2") < fleet.order.index("w4")
        assert fleet.order.index("w1") < fleet.order.index("w3") < fleet.order.index("w5")
        leases = {x["metadata"]["name"]: x for x in kube.list("leases", namespace=MCO_NS)}
        assert sorted(leases) == [lease_name("worker", 0), lease_name("worker", 1)]
        assert [x["metadata"]["annotations"][PASSED] for x in leases.values()] == \
            ["0,2,4", "1,3,5"]  # fmt: skip
        assert fleet.holders() == [None, None]  # every lane given back
        await fleet.close()


async def test_two_nodes_racing_for_one_free_lane_never_both_hold_it() -> None:
    async with loopback() as (kube, api):
        members = pool_of(2)
        # Both first in their lane's order (one lane, and the first one already at target
        # in the second node's eyes): both may take it; the resourceVersion decides.
        at_target = [members[0], node("w1", "2026-01-02T00:00:00Z")]
        at_target[0] = {**members[0], "metadata": {**members[0]["metadata"], "annotations": {
            P + "currentConfig": "r2"}}}  # fmt: skip
        a = lane_of(api, "w0", members)
        b = lane_of(api, "w1", at_target)
        assert b.queue.predecessor is None and a.queue.predecessor is None
        first = await asyncio.wait(
            [asyncio.create_task(a.acquire()), asyncio.create_task(b.acquire())],
            return_when=asyncio.FIRST_COMPLETED, timeout=10)  # fmt: skip
        done, pending = first
        assert len(done) == 1 and len(pending) == 1
        await asyncio.sleep(0.5)  # the loser saw the winner's record, and waits
        assert not next(iter(pending)).done()
        assert sum(1 for h in [lease["spec"].get("holderIdentity") for lease in
                               kube.list("leases", namespace=MCO_NS)] if h) == 1  # fmt: skip
        for task in pending:
            task.cancel()
        await a.close()
        await b.close()


async def test_a_holder_killed_mid_pull_is_taken_over_when_its_lease_runs_out() -> None:
    async with loopback() as (kube, api):
        members = pool_of(2)
        fleet = Fleet(kube, api, members, lanes=1, duration=1)
        first, second = fleet.lanes["w0"], fleet.lanes["w1"]
        await first.acquire()
        keeper = asyncio.create_task(first.keep())
        waiting = asyncio.create_task(second.acquire())
        await asyncio.sleep(1.5)  # renewed meanwhile: the successor keeps waiting
        assert not waiting.done()
        keeper.cancel()  # killed: no renewal, no release
        why = await asyncio.wait_for(waiting, 10)
        assert "taken over from w0: its lease expired" in why
        (lease,) = kube.list("leases", namespace=MCO_NS)
        assert lease["spec"]["holderIdentity"] == "w1" and lease["spec"]["leaseTransitions"] == 1
        await fleet.close()


async def test_a_holder_that_fell_silent_learns_it_lost_the_lane() -> None:
    async with loopback() as (kube, api):
        members = pool_of(2)
        fleet = Fleet(kube, api, members, lanes=1, duration=1)
        first, second = fleet.lanes["w0"], fleet.lanes["w1"]
        await first.acquire()
        await asyncio.wait_for(second.acquire(), 10)  # w0 never renewed: taken over
        with pytest.raises(LaneLost, match="held by w1"):
            await asyncio.wait_for(first.keep(), 10)  # its first renewal finds out
        await fleet.close()


async def test_the_turn_never_waits_for_its_lane() -> None:
    async with loopback() as (kube, api):
        members = pool_of(2)
        fleet = Fleet(kube, api, members, lanes=1, duration=30)
        await fleet.lanes["w0"].acquire()
        turn = fleet.lanes["w1"]
        before = (api.counter.reads, api.counter.writes)
        assert await asyncio.wait_for(turn.try_take(), 2) is False  # held: no wait
        assert (api.counter.reads - before[0], api.counter.writes - before[1]) == (1, 0)
        await fleet.lanes["w0"].release(passed=False)
        assert await turn.try_take() is True  # free: taken, whatever the order says
        (lease,) = kube.list("leases", namespace=MCO_NS)
        assert lease["spec"]["holderIdentity"] == "w1"
        await fleet.close()


async def test_a_predecessor_that_never_comes_is_skipped() -> None:
    async with loopback() as (kube, api):
        members = pool_of(2)
        fleet = Fleet(kube, api, members, lanes=1, skip_after=1.0)
        why = await asyncio.wait_for(fleet.lanes["w1"].acquire(), 10)
        assert "w0 did not take it in time: skipped" in why
        await fleet.close()


async def test_a_lane_waits_for_the_watch_not_a_poll() -> None:
    """While w1 waits for w0's pull, its lane costs no requests beyond its watch."""
    async with loopback() as (kube, api):
        fleet = Fleet(kube, api, pool_of(2), lanes=1, duration=30)
        await fleet.lanes["w0"].acquire()
        waiting = asyncio.create_task(fleet.lanes["w1"].acquire())
        await until(lambda: fleet.lanes["w1"]._watch is not None)
        await asyncio.sleep(0.3)
        before = (api.counter.reads, api.counter.writes)
        await asyncio.sleep(1.0)
        assert (api.counter.reads, api.counter.writes) == before
        await fleet.lanes["w0"].release(passed=True)
        assert await asyncio.wait_for(waiting, 5) == "lane free after w0"
        await fleet.close()


async def test_a_node_picked_while_queued_leaves_the_queue_and_the_lane_passes_at_once() -> None:
    """w0 pre-pulls, w1 and w2 wait; the controller picks w1 (its turn: it leaves the queue,
    as the pre-stager's turn does when another node holds the lane). When w0 is through the
    lane goes to w2 at once, while w1 is still pulling at its turn."""
    async with loopback() as (kube, api):
        fleet = Fleet(kube, api, pool_of(3), lanes=1, duration=30)
        await fleet.lanes["w0"].acquire()
        waiting = asyncio.create_task(fleet.lanes["w2"].acquire())
        turn = fleet.lanes["w1"]
        assert await turn.try_take() is False  # held by w0: the turn does not wait
        await turn.release(passed=True)  # out of its queue
        (lease,) = kube.list("leases", namespace=MCO_NS)
        assert lease["spec"]["holderIdentity"] == "w0"  # w0's hold untouched
        assert lease["metadata"]["annotations"][PASSED] == "1"
        await asyncio.sleep(0.3)
        assert not waiting.done()  # w0 still holds it
        await fleet.lanes["w0"].release(passed=True)
        assert await asyncio.wait_for(waiting, 5) == "lane free after w1"
        (lease,) = kube.list("leases", namespace=MCO_NS)
        assert lease["spec"]["holderIdentity"] == "w2"
        assert lease["metadata"]["annotations"][PASSED] == "0-1"
        await fleet.close()


async def test_a_skipped_node_is_not_waited_for_again() -> None:
    """w2 skips w0 and w1 (never came); its hold writes them through, so w3 waits for w2 only."""
    async with loopback() as (kube, api):
        fleet = Fleet(kube, api, pool_of(4), lanes=1, skip_after=0.5)
        why = await asyncio.wait_for(fleet.lanes["w2"].acquire(), 10)
        assert "w1 did not take it in time: skipped" in why
        (lease,) = kube.list("leases", namespace=MCO_NS)
        assert lease["metadata"]["annotations"][PASSED] == "0-1"
        await fleet.lanes["w2"].release(passed=True)
        assert await asyncio.wait_for(fleet.lanes["w3"].acquire(), 5) == "lane free after w2"
        await fleet.close()
