"""Optional pytest entry to the system tier: `pytest tests/system/pytest_system.py`.

Not named test_*.py on purpose: the default `pytest` run must not boot containers (CI runs
`tests/system/run.sh` as its own step). Scenarios that need the agent's real-host mode fail with
the same "needs --host local" reason the runner prints."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.__main__ import TOOLS, run_one
from tests.system.image_scenarios import ALL_SCENARIOS as SCENARIOS
from tests.system.rootfs import ensure_rootfs
from tests.system.scenarios import Scenario, probe_agent
from tests.system.world import World, cleanup

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(t) is None for t in TOOLS),
    reason="the system tier needs root and tests/system/setup-host.sh's tools",
)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    rootfs = ensure_rootfs()
    workdir = Path(tempfile.mkdtemp(prefix="ima-system-"))
    w = World(rootfs.path, workdir, host_mode=probe_agent()[0] or "local").start()
    try:
        yield w
    finally:
        w.stop()
        cleanup(workdir, keep=False)


@pytest.fixture(scope="module")
def blocked() -> str | None:
    return probe_agent()[1]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(world: World, blocked: str | None, scenario: Scenario) -> None:
    result = run_one(world, scenario, blocked)
    assert result.ok, result.detail
