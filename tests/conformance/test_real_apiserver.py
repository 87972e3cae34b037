"""The shared cluster scenarios (tests/scenarios/cluster.py) on the real kube-apiserver and
etcd from the kit, with deploy/rbac.yaml as shipped and the kit's Node identity; each ends by
scanning what the agent emitted for the canary secrets in its configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conformance.kit import Kit
from tests.conformance.real import RealHarness
from tests.scenarios.cluster import SCENARIOS, Scenario
from tests.scenarios.harness import run_checked

pytestmark = pytest.mark.asyncio
MCNS = "/apis/machineconfiguration.openshift.io/v1/machineconfignodes"


class CheckedRealHarness(RealHarness):
    """RealHarness that keeps every Node version its watcher sees and lists what the agent
    writes, for the canary check."""

    async def _saw(self, node: dict[str, Any]) -> None:
        self.saw("Node", node)
        await super()._saw(node)

    async def agent_objects(self) -> dict[str, list[dict[str, Any]]]:
        node = await self.node_object()
        events = await self.cluster.call("GET", "/api/v1/events")
        mcns = await self.cluster.call("GET", MCNS)
        return {"Node": [node] if node else [], "Event": events["items"],
                "MachineConfigNode": mcns["items"]}  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_real_apiserver(scenario: Scenario, kit: Kit, tmp_path: Path) -> None:
    harness = await CheckedRealHarness.create(kit, tmp_path, annotations=scenario.annotations)
    await run_checked(harness, scenario.run, turn=SCENARIOS.index(scenario))
