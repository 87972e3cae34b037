"""End to end with the real machine-config-controller: its render, node and drain controllers
drive one agent per Node (simulated hosts booted on the cluster's osImageURL). The pool
scenarios (tests/scenarios/pool_rollouts.py) run here on the real controller and in the default
run on its stand-ins (tests/test_pool_scenarios.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.kit import Kit, KitCluster
from tests.scenarios.pool_rollouts import SCENARIOS

pytestmark = [pytest.mark.asyncio, pytest.mark.peers("machine-config-controller")]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
async def test_pool_scenario_on_the_real_controller(scenario, kit: Kit, tmp_path: Path,
                                                   figures: list[str]) -> None:  # fmt: skip
    await scenario(KitCluster(kit, tmp_path / "cluster"), tmp_path, figures)
