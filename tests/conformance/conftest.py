"""The kit is found and unpacked once per run; without it every test fails with the reason
(the tier's runner checks first and reports the tier as not run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.kit import KitMissing, locate_kit, unpack


@pytest.fixture(scope="session")
def kit() -> Path:
    try:
        path = locate_kit()
        unpack(path)
    except KitMissing as exc:
        pytest.fail(f"conformance kit missing: {exc}", pytrace=False)
    return path


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
