"""The shared cluster scenarios (tests/scenarios/cluster.py) on the loopback API server; the
conformance tier runs the same definitions on the real kube-apiserver."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.cluster import SCENARIOS, Scenario
from tests.scenarios.fake import FakeHarness

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_fakekube(scenario: Scenario, tmp_path: Path) -> None:
    harness = await FakeHarness.create(tmp_path, annotations=scenario.annotations)
    try:
        await scenario.run(harness)
    finally:
        await harness.close()
