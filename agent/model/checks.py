"""Health-check results: what the checks said after a boot (the verifier decides on them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckResult:
    name: str
    required: bool
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class CheckReport:
    results: tuple[CheckResult, ...] = ()

    @property
    def failed_required(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.required and not r.ok)

    @property
    def failed_wanted(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if not r.required and not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failed_required
