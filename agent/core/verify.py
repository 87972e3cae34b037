"""After a boot into a new image: did the update land and is the host healthy? (pure)

What proves a boot: a reboot must have happened (boot ID changed, or systemd's
SoftRebootsCount grew), the booted digest must be the target, and the required checks must
pass. A bounded number of boots may be tried (greenboot's MAX_BOOT_ATTEMPTS) before rolling back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.model.checks import CheckReport


class AfterBoot(StrEnum):
    NOT_REBOOTED = "not-rebooted"  # the reboot has not happened yet: ask for it (again)
    FELL_BACK = "fell-back"  # booted something other than the target: nothing to roll back
    COMMIT = "commit"
    RETRY_BOOT = "retry-boot"  # checks failed, attempts remain: boot the same deployment again
    ROLL_BACK = "roll-back"


@dataclass(frozen=True)
class BootFacts:
    boot_id_before: str | None
    boot_id_now: str
    booted_digest: str | None
    target_digest: str | None
    checks: CheckReport | None = None
    attempts: int = 0  # failed boots of the target so far
    max_attempts: int = 1
    soft_reboots_before: int | None = None
    soft_reboots_now: int | None = None


@dataclass(frozen=True)
class Verdict:
    decision: AfterBoot
    cause: str = ""
    warnings: tuple[str, ...] = ()


def rebooted(facts: BootFacts) -> bool:
    if facts.boot_id_before is None or facts.boot_id_now != facts.boot_id_before:
        return True
    before, now = facts.soft_reboots_before, facts.soft_reboots_now
    return before is not None and now is not None and now > before


def decide_after_boot(facts: BootFacts) -> Verdict:
    if not rebooted(facts):
        return Verdict(AfterBoot.NOT_REBOOTED, "the reboot has not happened yet")
    if facts.booted_digest != facts.target_digest:
        return Verdict(
            AfterBoot.FELL_BACK,
            f"booted {facts.booted_digest or 'no image'} instead of the target "
            f"{facts.target_digest}: the new deployment did not boot (finalize failure or "
            "bootloader fallback)",
        )
    checks = facts.checks or CheckReport()
    warnings = tuple(f"wanted check {r.name} failed: {r.detail}" for r in checks.failed_wanted)
    if checks.ok:
        return Verdict(AfterBoot.COMMIT, warnings=warnings)
    failed = "; ".join(f"{r.name}: {r.detail}" for r in checks.failed_required)
    cause = f"required health check failed on {facts.target_digest}: {failed}"
    if facts.attempts + 1 < facts.max_attempts:
        return Verdict(AfterBoot.RETRY_BOOT, cause, warnings)
    return Verdict(AfterBoot.ROLL_BACK, cause, warnings)
