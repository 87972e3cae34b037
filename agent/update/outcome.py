"""What an engine pass returns and how a caller observes one: the states, Outcome, Hooks."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.core.desired import Desired
from agent.core.plan import Plan
from agent.host.ports import Progress

DONE, WORKING, REBOOTING = "Done", "Working", "Rebooting"
DEGRADED, UNRECONCILABLE = "Degraded", "Unreconcilable"


@dataclass(frozen=True)
class Outcome:
    state: str  # Done | Rebooting | Degraded | Unreconcilable | Working (dry run)
    reason: str = ""
    plan: Plan | None = None
    current_config: str | None = None
    current_image: str | None = None
    retryable: bool = False  # a Degraded that may heal by trying again (registry, disk...)


@dataclass
class Hooks:
    """Points where a caller observes the engine. `checkpoint` runs after every journal write
    and side effect (tests kill the engine there); `before_disruption` runs once, after
    staging and before the reboot (cluster mode drains there)."""

    checkpoint: Callable[[str], None] = lambda label: None
    progress: Callable[[Progress], None] = lambda progress: None
    before_disruption: Callable[[Desired], object] | None = None
    events: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # recent, for people
    # (kind, text) for counters: staged, stage-failed, reboot-failed, committed, rolled-back,
    # degraded; `seconds` is the update's duration when it ends.
    notice: Callable[[str, str, float | None], None] = lambda kind, text, seconds: None
    # (config name, document) just before an update's config becomes the current one: cluster
    # mode keeps the MCD's on-disk config current there (a coroutine is awaited).
    committing: Callable[[str, bytes], object] | None = None
