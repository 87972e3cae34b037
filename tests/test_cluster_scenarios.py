"""The shared cluster scenarios (tests/scenarios/cluster.py) on the loopback API server; the
conformance tier runs the same definitions on the real kube-apiserver. Each runs with the
canary secrets in its configs and ends by scanning what the agent emitted for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.cluster import SCENARIOS, Scenario
from tests.scenarios.fake import FakeHarness
from tests.scenarios.harness import run_checked

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_fakekube(scenario: Scenario, tmp_path: Path) -> None:
    harness = await FakeHarness.create(tmp_path, annotations=scenario.annotations)
    await run_checked(harness, scenario.run, turn=SCENARIOS.index(scenario))
