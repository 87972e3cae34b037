"""The kit and the peer binaries are found once per run; without them every test fails with the
reason (the tier's runner checks first and reports the tier as not run). A test marked
`peers(NAME, ...)` needs more than a cluster: when one of those binaries was not supplied it is
skipped as "not run: no NAME ...", which the runner lists by name and never counts as passed."""

from __future__ import annotations

import pytest

from tests.conformance import peers
from tests.conformance.kit import Kit, KitMissing, locate_kit, prepare


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "peers(*names): binaries a test needs beyond a cluster")


@pytest.fixture(scope="session")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    try:
        return prepare(locate_kit(), tmp_path_factory.mktemp("peers"))
    except KitMissing as exc:
        pytest.fail(f"conformance kit missing: {exc}", pytrace=False)


@pytest.fixture(autouse=True)
def _supplied_peers(request: pytest.FixtureRequest, kit: Kit) -> None:
    needed = tuple(name for mark in request.node.iter_markers("peers") for name in mark.args)
    reason = peers.why_not_run(kit.found, needed)
    if reason is not None:
        pytest.skip(peers.NOT_RUN + reason)


FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> list[str]:
    """Lines of measured figures, printed at the end of the run (the README quotes them)."""
    return request.config.stash.setdefault(FIGURES, [])


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("figures")
        for line in lines:
            terminalreporter.write_line(line)
