"""End to end with HyperShift's real in-place upgrader and drainer (the kit's
`hypershift-inplace`, started by `hcp-up`): the NodePool scenarios
(tests/scenarios/nodepool_rollouts.py) run here on the real controllers and in the default run
on their stand-ins (tests/test_hypershift_scenarios.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.hypershift import KitHosted
from tests.conformance.kit import Kit
from tests.scenarios.nodepool_rollouts import SCENARIOS

pytestmark = [pytest.mark.asyncio, pytest.mark.peers("hypershift-inplace")]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
async def test_nodepool_scenario_on_the_real_upgrader(scenario, kit: Kit, tmp_path: Path) -> None:
    await scenario(KitHosted(kit, tmp_path / "cluster"), tmp_path)
