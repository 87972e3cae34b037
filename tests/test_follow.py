"""Standalone mode: a simulated host follows a tag (agent/follow/agent.py), one process life at
a time, with a scripted strategy so every gate answer is exact."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.app.runtime import exit_code
from agent.core.backoff import backoff
from agent.core.policy import Allowlist
from agent.follow.agent import HELD, FollowAgent, FollowOptions
from agent.host.ports import Host
from agent.model.imageref import parse_image_ref
from agent.observe.metrics import Metrics
from agent.strategy.base import Decision
from agent.update.engine import DEGRADED, DONE, REBOOTING, Engine, Outcome
from standins.host.simulated import SimulatedHost
from tests.builders import machine_config

IMAGE = "quay.example/os/node"
TAG = f"{IMAGE}:stable"
CHECK = '#!/bin/sh\ngrep -qx yes "$IMAGE_MODE_AGENT_ROOT/usr/lib/app/healthy"\n'


@dataclass
class Scripted:
    """A strategy that answers from a script (the last answer repeats) and counts calls."""

    answers: list[bool] = field(default_factory=lambda: [True])
    steady_answers: list[bool] = field(default_factory=lambda: [True])
    asked: int = 0
    steady_reports: int = 0
    name: str = "scripted"

    async def report_steady(self) -> bool:
        self.steady_reports += 1
        return self.steady_answers.pop(0) if len(self.steady_answers) > 1 else \
            self.steady_answers[0]  # fmt: skip

    async def can_finalize(self) -> Decision:
        self.asked += 1
        allowed = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return Decision(allowed, "scripted yes" if allowed else "scripted no", retry_after=7.0)

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}


Report = Callable[[Host, Engine], Callable[[Outcome, dict[str, Any]], None]]


@dataclass
class Fleet:
    """One simulated host following TAG; `life()` is the next agent process."""

    base: Path
    strategy: Any = field(default_factory=Scripted)
    live_config: Path | None = None
    reports: list[tuple[Outcome, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sim = SimulatedHost.create(self.base / "host", f"{IMAGE}:stable",
                                        {"usr/lib/app/healthy": "yes"})  # fmt: skip
        check = self.sim.root / "etc/image-mode-agent/check/required.d/50-app"
        check.parent.mkdir(parents=True)
        check.write_text(CHECK)
        check.chmod(0o755)

    def push(self, healthy: bool = True, name: str = "build") -> str:
        """A new image under the tag; returns its digest."""
        text = "yes" if healthy else "no"
        ref = self.sim.add_image(TAG, {"usr/lib/app/healthy": text, "usr/lib/build": name})
        return ref.split("@")[1]

    def life(self, report: Report | None = None, **options: Any) -> FollowAgent:
        """The next agent process; `report(host, engine)` makes its reporter (default: one
        that appends to `reports`)."""
        self.sim.boot()  # a new process starts after any pending reboot
        allowlist = Allowlist()
        host = self.sim.host(allowlist.allows)
        engine = Engine(host)
        opts = FollowOptions(parse_image_ref(TAG), interval=60, live_config=self.live_config,
                             **options)  # fmt: skip
        reporter = report(host, engine) if report else \
            (lambda outcome, extra: self.reports.append((outcome, extra)))  # fmt: skip
        return FollowAgent(host, engine, self.strategy, opts, reporter, Metrics())

    async def tick(self, **options: Any) -> Outcome:
        outcome, _ = await self.life(**options).tick()
        return outcome

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    def staged(self) -> dict[str, Any] | None:
        return self.sim.status_document()["status"]["staged"]

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def switches(self) -> list[str]:
        return [a["detail"] for a in self.sim.actions()
                if a["kind"] == "bootc" and a["detail"].startswith("switch")]  # fmt: skip


async def test_up_to_date_host_checks_the_tag_and_changes_nothing(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    outcome = await fleet.tick()
    assert outcome.state == DONE
    assert fleet.reboots() == 0 and fleet.switches() == []
    assert fleet.strategy.asked == 0  # no update: the strategy is not asked
    checks = [a["detail"] for a in fleet.sim.actions() if a["detail"].startswith("upgrade")]
    assert checks == ["upgrade --check"]  # the spec is the tag itself
    follow = fleet.reports[-1][1]["follow"]
    assert follow["image"] == TAG and follow["latestDigest"] == fleet.booted()


async def test_new_digest_is_prestaged_rebooted_into_verified_and_committed(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path)
    new = fleet.push()
    outcome = await fleet.tick()
    assert outcome.state == REBOOTING
    staged_once = [f"switch --transport registry --download-only {IMAGE}@{new}"]
    assert fleet.switches() == staged_once
    assert fleet.strategy.asked == 1
    steady_before = fleet.strategy.steady_reports
    outcome = await fleet.tick()  # the next boot: verified, committed, steady reported
    assert outcome.state == DONE, outcome.reason
    assert fleet.booted() == new and fleet.reboots() == 1
    assert fleet.strategy.steady_reports == steady_before + 1
    # cachedUpdate: bootc recorded the tag's digest against the booted deployment
    assert fleet.sim.status_document()["status"]["booted"]["cachedUpdate"] is None
    outcome = await fleet.tick()
    assert outcome.state == DONE and fleet.reboots() == 1  # nothing new: no second reboot


async def test_held_reboot_keeps_the_image_staged_and_locked(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, Scripted(answers=[False, False, True]))
    new = fleet.push()
    agent = fleet.life()
    outcome, wait = await agent.tick()
    assert outcome.state == HELD and "reboot held: scripted no" in outcome.reason
    assert wait == 7.0  # the strategy's retry_after
    staged = fleet.staged()
    assert staged is not None and staged["downloadOnly"] is True  # no plain reboot applies it
    assert staged["image"]["imageDigest"] == new and fleet.reboots() == 0
    outcome, _ = await agent.tick()  # held again: nothing pulled or staged twice
    assert outcome.state == HELD and len(fleet.switches()) == 1 and fleet.reboots() == 0
    assert fleet.reports[-1][1]["follow"]["decision"]["allowed"] is False
    outcome, _ = await agent.tick()
    assert outcome.state == REBOOTING and len(fleet.switches()) == 1
    await fleet.tick()
    assert fleet.booted() == new


async def test_a_reboot_while_held_boots_the_running_image(tmp_path: Path) -> None:
    """Someone reboots the host while the strategy holds the update: the pre-stage was asked
    for locked, so the host comes back on its image; when the strategy allows, one reboot."""
    fleet = Fleet(tmp_path, Scripted(answers=[False, True]))
    before = fleet.booted()
    new = fleet.push()
    assert (await fleet.tick()).state == HELD
    assert [locked for _, locked in fleet.sim.stages(new)] == [True]
    await fleet.sim.host(lambda path: True).system.reboot()  # not the agent's
    assert fleet.sim.boot() and fleet.booted() == before
    assert (await fleet.tick()).state == REBOOTING  # pre-staged again, locked; then the turn
    assert fleet.sim.stages(new)[1:] == [(0, True), (0, True)]  # the layers stayed cached
    assert (await fleet.tick()).state == DONE
    assert (fleet.booted(), fleet.reboots()) == (new, 2)


async def test_newer_digest_while_held_replaces_the_staged_one(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, Scripted(answers=[False]))
    first = fleet.push(name="one")
    agent = fleet.life()
    assert (await agent.tick())[0].state == HELD
    second = fleet.push(name="two")
    assert (await agent.tick())[0].state == HELD
    assert fleet.staged()["image"]["imageDigest"] == second
    assert [s.rsplit("@")[1] for s in fleet.switches()] == [first, second]
    assert fleet.reboots() == 0


async def test_bad_digest_is_rolled_back_and_never_staged_again(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    good = fleet.booted()
    bad = fleet.push(healthy=False)
    outcome = await fleet.tick()
    assert outcome.state == REBOOTING
    for _ in range(3):  # boot of the bad image: checks fail, roll back, reboot
        outcome = await fleet.tick()
        if outcome.state != REBOOTING:
            break
    assert outcome.state == DEGRADED and fleet.booted() == good
    reboots, switches = fleet.reboots(), len(fleet.switches())
    for _ in range(2):  # the tag still points at the bad digest
        outcome = await fleet.tick()
        assert outcome.state == DEGRADED
        assert f"points to {bad}, which failed on this host before" in outcome.reason
    assert fleet.reboots() == reboots and len(fleet.switches()) == switches
    fixed = fleet.push(name="fixed")  # the next digest is taken
    assert (await fleet.tick()).state == REBOOTING
    assert (await fleet.tick()).state == DONE and fleet.booted() == fixed
    assert exit_code(Outcome(DEGRADED)) == 4


async def test_failed_check_still_applies_live_config(tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    fleet = Fleet(tmp_path, live_config=live)
    doc = machine_config(name="keys", keys=["ssh-ed25519 AAAA one"], image=None)
    live.write_text(json.dumps(doc))
    fleet.sim.set_registry_down(True)
    outcome = await fleet.tick()
    assert outcome.state == DEGRADED and outcome.retryable
    assert outcome.reason.startswith(f"cannot check {TAG}")
    keys = fleet.sim.root / "home/core/.ssh/authorized_keys.d/ignition"
    assert keys.read_text().strip() == "ssh-ed25519 AAAA one"
    assert fleet.reboots() == 0
    fleet.sim.set_registry_down(False)
    assert (await fleet.tick()).state == DONE


async def test_live_config_applies_while_a_reboot_is_held(tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    live.write_text(json.dumps(machine_config(name="one", keys=["ssh-ed25519 AAAA one"],
                                              image=None)))  # fmt: skip
    fleet = Fleet(tmp_path, Scripted(answers=[False]), live_config=live)
    new = fleet.push()
    agent = fleet.life()
    assert (await agent.tick())[0].state == HELD
    live.write_text(json.dumps(machine_config(name="two", keys=["ssh-ed25519 AAAA two"],
                                              image=None)))  # fmt: skip
    outcome, _ = await agent.tick()
    assert outcome.state == HELD and fleet.reboots() == 0
    keys = fleet.sim.root / "home/core/.ssh/authorized_keys.d/ignition"
    assert keys.read_text().strip() == "ssh-ed25519 AAAA two"  # not held with the reboot
    assert fleet.staged()["image"]["imageDigest"] == new


async def test_failed_prestage_asks_nothing_and_retries(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    new = fleet.push()
    fleet.sim.set_disk_full(True)
    agent = fleet.life()
    outcome, wait = await agent.tick()
    assert outcome.state == DEGRADED and outcome.retryable
    assert outcome.reason.startswith(f"pre-staging {IMAGE}@{new} failed (disk-space)")
    assert fleet.strategy.asked == 0 and fleet.reboots() == 0 and wait <= 66
    fleet.sim.set_disk_full(False)
    assert (await agent.tick())[0].state == REBOOTING


async def test_steady_state_must_be_accepted_before_checking(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, Scripted(steady_answers=[False, True]))
    fleet.push()
    agent = fleet.life()
    outcome, wait = await agent.tick()
    assert outcome.state == HELD and "accept that this host is steady" in outcome.reason
    assert not [a for a in fleet.sim.actions() if a["detail"].startswith("upgrade")]
    assert 0 < wait <= 60
    outcome, _ = await agent.tick()
    assert outcome.state == REBOOTING


async def test_dry_run_plans_without_staging_or_asking(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.push()
    outcome = await fleet.tick(dry_run=True)
    assert outcome.plan is not None and outcome.plan.verdict == "image"
    assert "strategy decides when to reboot" in outcome.reason
    assert fleet.switches() == [] and fleet.strategy.asked == 0 and fleet.reboots() == 0


def test_backoff_grows_and_is_capped() -> None:
    waits = [backoff(n, 5.0, 60.0) for n in range(1, 10)]
    assert 5.0 <= waits[0] <= 10.0
    assert all(w <= 65.0 for w in waits) and max(waits) >= 60.0
