"""The pool scenarios (tests/scenarios/pool_rollouts.py) on the project's loopback API server,
driven by the stand-ins of the machine-config-controller's render, node and drain controllers
(standins/kube); the conformance tier runs the same definitions on the real controller. The
pre-pull scenarios (timed pulls through the shared simulated registry) are in the rollout tier
(`tests/rollouts.sh`), out of the default run for their time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.pool_rollouts import (
    SCENARIOS,
    TIMED_PULLS,
    tied_nodes_picked_out_of_name_order_leave_the_queue,
)
from tests.scenarios.standin import StandInCluster

pytestmark = pytest.mark.asyncio


def _param(scenario):
    marks = [pytest.mark.rollout] if scenario in TIMED_PULLS else []
    return pytest.param(scenario, id=scenario.__name__, marks=marks)


@pytest.mark.parametrize("scenario", [_param(s) for s in SCENARIOS])
async def test_pool_scenario_on_the_standins(scenario, tmp_path: Path) -> None:
    figures: list[str] = []
    await scenario(StandInCluster(tmp_path / "cluster"), tmp_path, figures)
    assert figures  # each scenario measured what it reports


@pytest.mark.rollout
async def test_tied_nodes_picked_out_of_name_order_on_the_standins(tmp_path: Path) -> None:
    """Stand-ins only: the node controller's order among tied Nodes is steered."""
    figures: list[str] = []
    await tied_nodes_picked_out_of_name_order_leave_the_queue(
        StandInCluster(tmp_path / "cluster"), tmp_path, figures
    )
    assert figures
