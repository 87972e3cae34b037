"""Shared by every test: the default run leaves out the conformance tier (it needs the kit and
has its own command, tests/conformance/run.sh, which sets IMAGE_MODE_AGENT_TIER=conformance),
and no test leaves structlog configured for the next one."""

import os

import pytest
import structlog

collect_ignore = [] if os.environ.get("IMAGE_MODE_AGENT_TIER") == "conformance" else ["conformance"]


@pytest.fixture(autouse=True)
def _fresh_structlog():
    # A test that configures logging binds structlog to the stream pytest captured for it;
    # printing there after pytest closed it would fail a later test.
    yield
    structlog.reset_defaults()
