"""A pre-pull lane's Lease: what it says, and whether this node may take it now (pure).

One `coordination.k8s.io/v1` Lease per lane and pool (`image-mode-prepull-<pool>-<lane>`):
`spec.holderIdentity` is the node pulling through it, renewed every third of
`leaseDurationSeconds`; annotations say which rollout it serves (`target`), the holder's rank,
and `passed`, the ranks of that lane through (written as ranges, `0-4,7`): their pull is over,
their turn came (the controller picked them, possibly before the order said: they left the
queue and pull at their turn), or they were skipped. A set and not a high-water mark: a rank
picked out of order is through while lower ones still wait, and each node waits exactly for
the lower ranks of its lane still waiting when it listed them (`Queue.before`). A holder that
stops renewing loses it: expiry is judged from when this node last saw the record change, not
from the holder's clock (client-go's leader election does the same), so clock skew between
nodes cannot hand a slot to two holders."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from agent.cluster.pull_order import Queue

GROUP = "image-mode.openshift.io/"
TARGET, HOLDER_RANK, PASSED = GROUP + "target", GROUP + "holder-rank", GROUP + "passed"
POOL_LABEL = GROUP + "prepull-pool"


def lease_name(pool: str, lane: int) -> str:
    return f"image-mode-prepull-{pool}-{lane}"


def micro_time(at: datetime | None = None) -> str:
    """metav1.MicroTime as the API server formats it."""
    return (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _int(text: Any, default: int) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def parse_ranks(text: Any) -> frozenset[int]:
    """`passed` as written (`0-4,7`); what cannot be read counts as nothing through (its
    nodes are waited for, then skipped: never a lane handed out twice)."""
    ranks: set[int] = set()
    for part in str(text or "").split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            continue
        ranks.update(range(int(low), int(high if dash else low) + 1))
    return frozenset(ranks)


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks as ranges: a lane passed in order stays one short range (`0-41`)."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


@dataclass(frozen=True)
class LaneRecord:
    """The parts of a lane's Lease the decisions read."""

    holder: str | None
    renewed: str | None  # spec.renewTime as written
    duration: int
    transitions: int
    target: str | None
    holder_rank: int | None
    passed: frozenset[int]  # the ranks through for this record's target

    @classmethod
    def of(cls, lease: Mapping[str, Any] | None) -> LaneRecord | None:
        if not lease:
            return None
        spec = lease.get("spec") or {}
        notes = (lease.get("metadata") or {}).get("annotations") or {}
        rank = notes.get(HOLDER_RANK)
        return cls(
            holder=spec.get("holderIdentity") or None,
            renewed=spec.get("renewTime"),
            duration=max(1, _int(spec.get("leaseDurationSeconds"), 1)),
            transitions=_int(spec.get("leaseTransitions"), 0),
            target=notes.get(TARGET),
            holder_rank=None if rank is None else _int(rank, -1),
            passed=parse_ranks(notes.get(PASSED)),
        )

    def passed_for(self, target: str) -> frozenset[int]:
        """The ranks through for `target`; a record of another rollout counts as none."""
        return self.passed if self.target == target else frozenset()

    @property
    def seen_as(self) -> tuple[str | None, str | None]:
        """What must change for a waiter to count the holder as alive."""
        return (self.holder, self.renewed)


class Verdict(StrEnum):
    TAKE = "take"
    MINE = "mine"  # held by this node already (a restart while it held it)
    WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    why: str
    # TAKE: the ranks the taker writes through with its hold (the ones it skipped, or the
    # silent holder it took over from), so that the nodes after it do not wait for them again.
    through: frozenset[int] = field(default_factory=frozenset)


def blocking(record: LaneRecord | None, queue: Queue) -> list[int]:
    """The lower ranks of the lane this node still waits for: waiting at its list, and not
    through since (pulled, picked, or skipped), lowest first."""
    passed = frozenset() if record is None else record.passed_for(queue.target)
    return [rank for rank, _ in queue.before if rank not in passed]


def as_read_by(record: LaneRecord | None, me: str, target: str) -> LaneRecord | None:
    """The record as this node's pre-pull for `target` reads it. Its own hold for another
    rollout (a release it wrote that its watch has not brought yet, or one lost at a crash)
    holds nothing: nobody else holds the lane, and it is not this rollout's to keep, so the
    order decides as for a free lane."""
    if record is not None and record.holder == me and record.target != target:
        return dataclasses.replace(record, holder=None)
    return record


def decide(
    record: LaneRecord | None, me: str, queue: Queue, *, expired: bool, skip: bool
) -> Decision:
    """Whether this node may take its lane to pre-pull: the lane must be free (or its holder's
    lease expired) and every lower rank of the lane that still waited when this node listed
    them must be through: pulled, picked by the controller (its turn came: it left the queue),
    or waited for `skip` long (it is down, or runs no bounded pre-pull)."""
    record = as_read_by(record, me, queue.target)
    if record is not None and record.holder == me:
        return Decision(Verdict.MINE, "this node holds the lane")
    if record is not None and record.holder is not None and not expired:
        rank = "" if record.holder_rank is None else f" (rank {record.holder_rank})"
        return Decision(Verdict.WAIT, f"lane {queue.lane} is held by {record.holder}{rank}")
    ahead = blocking(record, queue)
    if not ahead:
        after = f" after {queue.predecessor}" if queue.predecessor is not None else ""
        return Decision(Verdict.TAKE, f"lane free{after}")
    nearest = queue.name_of(ahead[-1])
    if skip:
        return Decision(Verdict.TAKE, f"lane free; {nearest} did not take it in time: "
                        "skipped", frozenset(ahead))  # fmt: skip
    if (
        expired
        and record is not None
        and record.target == queue.target
        and (record.holder_rank is not None and record.holder_rank >= ahead[-1])
    ):
        # The last of them (or a later node) held it and fell silent: it is not coming back
        # before its lease would; its pull is over as far as the lane is concerned.
        gone = frozenset([*ahead, record.holder_rank])
        return Decision(Verdict.TAKE, f"taken over from {record.holder}: its lease expired", gone)
    return Decision(Verdict.WAIT, f"waiting for {nearest} (rank {ahead[-1]}) to pull first")


def turn_may_take(record: LaneRecord | None, me: str, *, expired: bool) -> bool:
    """At its turn a node takes its lane when it is free, whatever the order says: the turn
    never waits for a slot, it only keeps a pre-pull from starting beside its own pull."""
    return record is None or record.holder in (None, me) or expired


def taken(
    lease: Mapping[str, Any] | None, record: LaneRecord | None, *, name: str, namespace: str,
    pool: str, me: str, queue: Queue, duration: int, now: str,
    through: frozenset[int] = frozenset(),
) -> dict[str, Any]:  # fmt: skip
    """The Lease to write to hold the lane (create when `lease` is None, else update it),
    with `through` (Decision.through) added to the ranks through."""
    body = _copy(lease) or {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace, "labels": {POOL_LABEL: pool}},
        "spec": {},
    }
    spec = body.setdefault("spec", {})
    notes = body["metadata"].setdefault("annotations", {})
    changed = record is None or record.holder != me
    passed = frozenset() if record is None else record.passed_for(queue.target)
    spec.update(holderIdentity=me, leaseDurationSeconds=duration, renewTime=now)
    if changed:
        spec["acquireTime"] = now
        spec["leaseTransitions"] = (record.transitions if record else 0) + (record is not None)
    notes.update({TARGET: queue.target, HOLDER_RANK: str(queue.rank),
                  PASSED: format_ranks(passed | through)})  # fmt: skip
    return body


def renewed(lease: Mapping[str, Any], now: str) -> dict[str, Any]:
    body = _copy(lease)
    body.setdefault("spec", {})["renewTime"] = now
    return body


def released(
    lease: Mapping[str, Any], me: str, queue: Queue, *, passed: bool
) -> dict[str, Any] | None:
    """The Lease with this node's hold given up and, when it is through (its pull is over,
    or its turn came without the lane), its rank added to the ranks through; None when there
    is nothing to change."""
    body = _copy(lease)
    record = LaneRecord.of(body)
    assert record is not None
    changed = False
    if record.holder == me:
        body["spec"].pop("holderIdentity", None)
        body["spec"].pop("renewTime", None)
        changed = True
    # Another rollout's record is taken over only when nobody holds it for that rollout.
    ours = record.target == queue.target or record.holder in (None, me)
    through = record.passed_for(queue.target)
    if passed and ours and queue.rank not in through:
        notes = body["metadata"].setdefault("annotations", {})
        notes.update({TARGET: queue.target, PASSED: format_ranks(through | {queue.rank})})
        changed = True
    return body if changed else None


def _copy(lease: Mapping[str, Any] | None) -> dict[str, Any]:
    if lease is None:
        return {}
    body = {k: v for k, v in lease.items() if k != "status"}
    meta = dict(body.get("metadata") or {})
    if "annotations" in meta:
        meta["annotations"] = dict(meta["annotations"] or {})
    meta.pop("managedFields", None)
    body["metadata"] = meta
    body["spec"] = dict(body.get("spec") or {})
    return body
