"""The shared cluster scenarios (tests/scenarios/cluster.py) on the real kube-apiserver and
etcd from the kit, with deploy/rbac.yaml as shipped and the kit's Node identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.real import RealHarness
from tests.scenarios.cluster import SCENARIOS, Scenario

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_real_apiserver(scenario: Scenario, kit: Path, tmp_path: Path) -> None:
    harness = await RealHarness.create(kit, tmp_path, annotations=scenario.annotations)
    try:
        await scenario.run(harness)
    finally:
        await harness.close()
