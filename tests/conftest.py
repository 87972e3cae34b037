"""Shared by every test: the default run leaves out the conformance tier (it needs the kit and
has its own command, tests/conformance/run.sh, which sets IMAGE_MODE_AGENT_TIER=conformance),
no test leaves structlog configured for the next one, and the agent's default port is taken
for the whole run."""

import errno
import os
import socket
from collections.abc import Iterator

import pytest
import structlog

collect_ignore = [] if os.environ.get("IMAGE_MODE_AGENT_TIER") == "conformance" else ["conformance"]


@pytest.fixture(autouse=True)
def _fresh_structlog():
    # A test that configures logging binds structlog to the stream pytest captured for it;
    # printing there after pytest closed it would fail a later test.
    yield
    structlog.reset_defaults()


# The agent's default --listen address. Something else may hold it on a developer's machine or
# in CI (another agent, a conformance run); the suite holds it itself so that every run proves
# no test depends on it being free or on the bind warning it causes.
DEFAULT_LISTEN = ("127.0.0.1", 8797)


@pytest.fixture(autouse=True, scope="session")
def _default_port_taken() -> Iterator[None]:
    with socket.socket() as holder:
        try:
            holder.bind(DEFAULT_LISTEN)
            holder.listen()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # Taken already: the condition this fixture sets up holds anyway.
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test that ran agent processes shows the end of each one's log: the agent runs
    in a temporary folder that is gone by the time a CI failure is read."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and call.when == "call" and tmp_path is not None:
        for path in sorted(tmp_path.glob("**/agent-*.log"))[-4:]:
            with open(path, "rb") as log:
                log.seek(max(0, path.stat().st_size - 12_000))
                tail = log.read().decode(errors="replace").splitlines()[-60:]
            report.sections.append((f"Captured {path.name} (last lines)", "\n".join(tail)))
    return report
