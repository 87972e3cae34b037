"""The NodePool scenarios (tests/scenarios/nodepool_rollouts.py) on the stand-ins of HyperShift's
in-place upgrader and drainer, on the loopback API server (tests/scenarios/hypershift_standin.py,
which mirror HyperShift's inplaceupgrader.go and drainer.go, docs/mco-protocol.md §15). The
same scenarios run on the real ones in tests/conformance/test_hypershift.py. The bounded
pre-pulls (timed pulls through the shared simulated registry) are in the rollout tier
(`tests/rollouts.sh`), out of the default run for their time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.hostedpool import HYPERSHIFT_RBAC, StandInHosted
from tests.scenarios.nodepool_rollouts import (
    BOUNDED,
    SCENARIOS,
    prestage_unbounded_without_the_role,
)

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
async def test_nodepool_scenario_on_the_standins(scenario, tmp_path: Path) -> None:
    await scenario(StandInHosted(tmp_path / "cluster"), tmp_path)


@pytest.mark.rollout
@pytest.mark.parametrize("scenario", BOUNDED, ids=[s.__name__ for s in BOUNDED])
async def test_bounded_prepulls_with_the_shipped_rbac(scenario, tmp_path: Path) -> None:
    """deploy/hypershift/rbac.yaml applied as docs/install.md says, enforced by the
    loopback server for group system:nodes (on top of the kit's ConfigMap grant)."""
    await scenario(StandInHosted(tmp_path / "cluster", rbac=HYPERSHIFT_RBAC), tmp_path)


@pytest.mark.rollout
async def test_without_the_prepull_role_the_prepulls_are_unbounded(tmp_path: Path) -> None:
    await prestage_unbounded_without_the_role(StandInHosted(tmp_path / "cluster"), tmp_path)
