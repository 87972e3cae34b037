"""The `immediate` strategy: finalize a staged update as soon as it is staged, as Zincati's."""

from __future__ import annotations

from typing import Any

from agent.strategy.base import Decision


class ImmediateStrategy:
    """No gate: the host reboots into each update once it is staged and verified."""

    name = "immediate"

    async def report_steady(self) -> bool:
        return True  # nothing is held, so there is nothing to release

    async def can_finalize(self) -> Decision:
        return Decision(True, "immediate strategy: reboot as soon as staged")

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.name}
