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
