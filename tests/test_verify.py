"""The post-boot decision table: boot ID, soft-reboot count, booted digest, checks, attempts."""

from __future__ import annotations

import itertools

import pytest

from agent.core.verify import AfterBoot, BootFacts, decide_after_boot
from agent.model.checks import CheckReport, CheckResult

T, OTHER = "sha256:" + "1" * 64, "sha256:" + "2" * 64
PASS = CheckReport((CheckResult("a", True, True),))
FAIL = CheckReport((CheckResult("a", True, False, "exit 1: broken"),))
WARN = CheckReport((CheckResult("a", True, True), CheckResult("w", False, False, "meh")))


def expected(rebooted: bool, digest: str, checks: CheckReport, attempts: int, limit: int):
    if not rebooted:
        return AfterBoot.NOT_REBOOTED
    if digest != T:
        return AfterBoot.FELL_BACK
    if checks.ok:
        return AfterBoot.COMMIT
    return AfterBoot.RETRY_BOOT if attempts + 1 < limit else AfterBoot.ROLL_BACK


CASES = list(
    itertools.product(
        [
            ("b1", "b1", None, None),
            ("b1", "b2", None, None),
            ("b1", "b1", 0, 1),
            ("b1", "b1", 1, 1),
        ],
        [T, OTHER],
        [PASS, FAIL, WARN],
        [0, 1, 2],
        [1, 3],
    )
)


@pytest.mark.parametrize(("boot", "digest", "checks", "attempts", "limit"), CASES)
def test_every_combination(boot, digest, checks, attempts, limit) -> None:
    before, now, soft_before, soft_now = boot
    facts = BootFacts(before, now, digest, T, checks, attempts, limit, soft_before, soft_now)
    rebooted = before != now or (soft_now or 0) > (soft_before or 0)
    verdict = decide_after_boot(facts)
    assert verdict.decision == expected(rebooted, digest, checks, attempts, limit)
    if verdict.decision == AfterBoot.FELL_BACK:
        assert "did not boot" in verdict.cause and OTHER in verdict.cause
    if verdict.decision in (AfterBoot.ROLL_BACK, AfterBoot.RETRY_BOOT):
        assert verdict.cause == f"required health check failed on {T}: a: exit 1: broken"
    if verdict.decision == AfterBoot.COMMIT and checks is WARN:
        assert verdict.warnings == ("wanted check w failed: meh",)


def test_first_record_without_boot_id_counts_as_rebooted() -> None:
    assert decide_after_boot(BootFacts(None, "b", T, T, PASS)).decision == AfterBoot.COMMIT
