"""Logs: journald fields under systemd; JSON lines otherwise; secrets never logged."""

from __future__ import annotations

import json

import structlog

from agent.observe.logging import JournalLogger, configure_logging, journal_field


def test_journal_field_names() -> None:
    assert journal_field("state") == "STATE"
    assert journal_field("current-config") == "CURRENT_CONFIG"
    assert journal_field("message") == "IMAGE_MODE_AGENT_MESSAGE"
    assert journal_field("_pid") == "PID"


def test_journal_logger_sends_structured_fields() -> None:
    sent: list[dict] = []
    logger = JournalLogger(lambda **fields: sent.append(fields))
    logger.msg(event="reconciled", level="warning", state="Done", phase="idle")
    assert sent == [
        {
            "MESSAGE": "reconciled state=Done phase=idle",
            "PRIORITY": "4",
            "SYSLOG_IDENTIFIER": "image-mode-agent",
            "STATE": "Done",
            "PHASE": "idle",
        }
    ]


def test_json_lines_when_not_a_tty(capsys) -> None:
    configure_logging("info", json_lines=True)
    structlog.get_logger("t").info("hello", path="/etc/x")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert (line["event"], line["path"], line["level"]) == ("hello", "/etc/x", "info")


async def test_secret_contents_never_reach_logs_events_or_reasons(tmp_path) -> None:
    from structlog.testing import capture_logs

    from tests.builders import ign_file
    from tests.simhost import World

    world = World.create(tmp_path)
    secret = '{"auths":{"quay.io":{"auth":"c3VwZXJzZWNyZXQ="}}}'
    with capture_logs() as logs:
        engine = world.engine()
        desired = world.desired(
            "r1", "v2", files=[ign_file("/var/lib/kubelet/config.json", secret)]
        )
        outcome = await world.converge(desired)
    assert outcome.state == "Done"
    assert (world.sim.root / "run/ostree/auth.json").read_text() == secret
    text = json.dumps(logs) + json.dumps(list(engine.hooks.events)) + outcome.reason
    text += (world.sim.root / "var/lib/image-mode-agent/journal.json").read_text()
    text += (world.sim.base / "actions.log").read_text()
    assert "c3VwZXJzZWNyZXQ=" not in text
    assert any(e.get("path") == "/var/lib/kubelet/config.json" for e in logs)
