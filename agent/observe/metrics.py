"""Prometheus metrics, per agent (a registry of its own: two agents in one process do not
share series). The MCD's `mcd_*` names where the meaning matches, so existing alerts
(MCDRebootError, MCDPivotError) keep working; `image_mode_agent_*` for the rest."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.host.ports import Progress


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.state = Gauge("mcd_state", "Time of the last state change, by state and reason",
                           ["state", "reason"], registry=r)  # fmt: skip
        self.update_state = Gauge("mcd_update_state", "Time of the last update result",
                                  ["config", "err"], registry=r)  # fmt: skip
        self.reboots_failed = Counter("mcd_reboots_failed", "Reboot requests that failed",
                                      registry=r)  # fmt: skip
        self.pivot_errors = Gauge("mcd_pivot_errors_total", "Staging failures since the last "
                                  "success (a gauge, as the MCD's)", registry=r)  # fmt: skip
        self.config_drift = Gauge("mcd_config_drift", "When the on-disk drift now reported "
                                  "was found (0: none)", registry=r)  # fmt: skip
        self.validated = Gauge("image_mode_agent_validation_timestamp_seconds", "When the "
                               "host was last validated against its current config, by result",
                               ["result"], registry=r)  # fmt: skip
        self.phase = Gauge("image_mode_agent_phase", "1 for the journal's current phase",
                           ["phase"], registry=r)  # fmt: skip
        self.staging_bytes = Gauge("image_mode_agent_staging_bytes", "Staging progress",
                                   ["kind"], registry=r)  # fmt: skip
        self.update_seconds = Histogram(
            "image_mode_agent_update_duration_seconds", "From the first step of an update to "
            "its end (a reboot in between included), by result", ["result"], registry=r,
            buckets=(0.05, 0.25, 1, 5, 30, 120, 600, 1800, 3600),
        )  # fmt: skip
        self.rollbacks = Counter("image_mode_agent_rollbacks", "Automatic rollbacks",
                                 registry=r)  # fmt: skip
        self.api_requests = Gauge("image_mode_agent_api_requests", "Kubernetes API requests "
                                  "made, by kind", ["kind"], registry=r)  # fmt: skip
        self.prestage_state = Gauge("image_mode_agent_prestage_state", "1 for the pool "
                                    "pre-stage's state (waiting, queued, staging, staged, failed, "
                                    "stopped, none)", ["state"], registry=r)  # fmt: skip
        self.prestage_bytes = Gauge("image_mode_agent_prestage_bytes", "Pool pre-stage "
                                    "progress", ["kind"], registry=r)  # fmt: skip
        self.prestage_failures = Counter("image_mode_agent_prestage_failures", "Pool "
                                         "pre-stages that failed, by error kind", ["kind"],
                                         registry=r)  # fmt: skip
        # Standalone mode (`--source image:`): the tag's checks and the strategy's answers,
        # after Zincati's zincati_updates_strategy_* and zincati_strategy_fleet_lock_*.
        self.follow_checks = Counter("image_mode_agent_follow_checks", "Checks of the "
                                     "followed tag, by result", ["result"], registry=r)  # fmt: skip
        self.follow_last_check = Gauge("image_mode_agent_follow_last_check_timestamp_seconds",
                                       "Time of the last successful check of the followed tag",
                                       registry=r)  # fmt: skip
        self.can_finalize = Counter("image_mode_agent_strategy_can_finalize_responses", "The "
                                    "strategy's answers to 'may this host reboot now?'",
                                    ["strategy", "allowed"], registry=r)  # fmt: skip
        self.next_window = Gauge("image_mode_agent_strategy_next_window_timestamp_seconds",
                                 "periodic: start of the next maintenance window while a "
                                 "reboot is held (0: none held)", registry=r)  # fmt: skip
        self.lock_held = Gauge("image_mode_agent_strategy_lock_held", "fleet_lock: 1 while "
                               "this host holds a reboot slot", registry=r)  # fmt: skip
        self.schedule_minutes = Gauge("image_mode_agent_strategy_periodic_schedule_length_minutes",
                                      "periodic: minutes a week in maintenance windows",
                                      registry=r)  # fmt: skip
        self.fleet_lock_requests = Counter("image_mode_agent_fleet_lock_requests", "Requests to "
                                           "the FleetLock server, by api", ["api"],
                                           registry=r)  # fmt: skip
        self.fleet_lock_errors = Counter("image_mode_agent_fleet_lock_errors", "Failed FleetLock "
                                         "requests, by api and the server's error kind",
                                         ["api", "kind"], registry=r)  # fmt: skip
        self.bootc_capability = Gauge("image_mode_agent_bootc_capability", "1 for what the "
                                      "host's bootc accepts, 0 for what it lacks (from its "
                                      "--help)", ["name"], registry=r)  # fmt: skip
        self.turn_fetched = Gauge("image_mode_agent_turn_fetched_bytes", "Bytes the last "
                                  "update's stage fetched at the node's turn (0 when a "
                                  "pre-stage or pre-pull held)", registry=r)  # fmt: skip
        self._fleet_lock_seen: dict[Any, int] = {}
        self._last_state: tuple[str, str] | None = None
        self._prestage: str | None = None
        self._phase: str | None = None

    def record_state(self, state: str, reason: str) -> None:
        key = (state, reason[:100])
        if key == self._last_state:
            return
        if self._last_state is not None:
            self.state.remove(*self._last_state)  # one series: the current state
        self.state.labels(*key).set(time.time())
        self._last_state = key

    @staticmethod
    def _one_hot(gauge: Gauge, old: str | None, new: str) -> str:
        """1 for `new`, 0 for the `old` label it replaces; returns `new`."""
        if new != old:
            if old is not None:
                gauge.labels(old).set(0)
            gauge.labels(new).set(1)
        return new

    def record_phase(self, phase: str) -> None:
        self._phase = self._one_hot(self.phase, self._phase, phase)

    def record_prestage(self, state: str) -> None:
        self._prestage = self._one_hot(self.prestage_state, self._prestage, state)

    def record_progress(self, progress: Progress) -> None:
        self.staging_bytes.labels("done").set(progress.done_bytes)
        self.staging_bytes.labels("total").set(progress.total_bytes)

    def record_capabilities(self, named: dict[str, bool]) -> None:
        for name, present in named.items():
            self.bootc_capability.labels(name).set(1 if present else 0)

    def record_follow_check(self, ok: bool) -> None:
        self.follow_checks.labels("ok" if ok else "error").inc()
        if ok:
            self.follow_last_check.set(time.time())

    def record_strategy(self, strategy: Any, decision: Any = None, steady: bool = False) -> None:
        """After a strategy was asked something: its answer (a decision, or `steady`: a steady
        report it accepted, so no slot is held), and its own request counters (fleet_lock
        keeps them per object, so two agents in a process stay apart)."""
        if decision is not None:
            self.can_finalize.labels(strategy.name, str(decision.allowed).lower()).inc()
            held = not decision.allowed and decision.next_window is not None
            self.next_window.set(decision.next_window.timestamp() if held else 0)
            if decision.lock_held is not None:
                self.lock_held.set(1 if decision.lock_held else 0)
        if steady:
            self.lock_held.set(0)
        minutes = strategy.describe().get("totalMinutes")
        if minutes is not None:
            self.schedule_minutes.set(minutes)
        for counter, source in (
            (self.fleet_lock_requests, getattr(strategy, "requests", None)),
            (self.fleet_lock_errors, getattr(strategy, "errors", None)),
        ):
            for key, total in (source or {}).items():
                labels = key if isinstance(key, tuple) else (key,)
                seen = self._fleet_lock_seen.get((counter, labels), 0)
                if total > seen:
                    counter.labels(*labels).inc(total - seen)
                    self._fleet_lock_seen[(counter, labels)] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def notice(self, kind: str, text: str, seconds: float | None) -> None:
        """The engine's notices (Hooks.notice) as counters and gauges."""
        now = time.time()
        match kind:
            case "staged":
                self.pivot_errors.set(0)
            case "stage-failed":
                self.pivot_errors.inc()
            case "reboot-failed":
                self.reboots_failed.inc()
            case "rolled-back":
                self.rollbacks.inc()
            case "turn-fetched":
                self.turn_fetched.set(int(text))
        if kind == "committed":
            self.update_state.labels(text, "").set(now)
        elif kind in ("rolled-back", "degraded"):
            self.update_state.labels("", text[:100]).set(now)
        if seconds is not None:
            self.update_seconds.labels(kind).observe(seconds)
