"""The NodePool scenarios (tests/scenarios/nodepool_rollouts.py) on the stand-ins of HyperShift's
in-place upgrader and drainer, on the loopback API server (tests/scenarios/hypershift_standin.py,
which mirror inplaceupgrader.go and drainer.go as ../shared/reference/hypershift-inplace.md cites
them). The same scenarios run on the real ones in tests/conformance/test_hypershift.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.hostedpool import StandInHosted
from tests.scenarios.nodepool_rollouts import SCENARIOS

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
async def test_nodepool_scenario_on_the_standins(scenario, tmp_path: Path) -> None:
    await scenario(StandInHosted(tmp_path / "cluster"), tmp_path)
