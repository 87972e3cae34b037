"""structlog setup: native journald fields under systemd (with the optional systemd-python),
console lines on a TTY, JSON lines otherwise (pods)."""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

import structlog

_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
_FIELD = re.compile(r"[^A-Z0-9_]")


def journal_field(key: str) -> str:
    """journald field names are upper-case letters, digits and underscores, not starting with
    an underscore (those are trusted fields journald sets itself)."""
    name = _FIELD.sub("_", key.upper()).lstrip("_")
    return f"IMAGE_MODE_AGENT_{name}" if name in ("MESSAGE", "PRIORITY", "") else name


class JournalLogger:
    """A structlog logger that sends each event to journald with its keys as fields."""

    def __init__(self, send: Any) -> None:
        self._send = send

    def msg(self, **event: Any) -> None:
        message = str(event.pop("event", ""))
        level = str(event.pop("level", "info"))
        fields = {journal_field(k): str(v) for k, v in event.items()}
        # The fields are for queries (journalctl STATE=Degraded); people read MESSAGE.
        details = " ".join(f"{k}={v}" for k, v in event.items())
        self._send(MESSAGE=f"{message} {details}".rstrip(), PRIORITY=str(_PRIORITY.get(level, 6)),
                   SYSLOG_IDENTIFIER="image-mode-agent", **fields)  # fmt: skip

    info = debug = warning = error = critical = exception = msg


def _journal_send() -> Any | None:
    """`systemd.journal.send` when stderr is connected to the journal (JOURNAL_STREAM names
    it) and systemd-python is installed; else None."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(x) for x in stream.split(":"))
        info = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return None
    if (info.st_dev, info.st_ino) != (device, inode):
        return None
    try:
        from systemd import journal  # the optional extra: image-mode-agent[journald]
    except ImportError:
        return None
    return journal.send


def configure_logging(level: str = "info", *, json_lines: bool | None = None) -> None:
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
    ]
    send = _journal_send() if json_lines is None else None
    if send is not None:
        factory: Any = lambda *args: JournalLogger(send)  # noqa: E731
        processors.append(lambda logger, name, event: event)  # the dict goes to JournalLogger
    else:
        if json_lines is None:
            json_lines = not sys.stderr.isatty()
        processors.append(structlog.processors.TimeStamper(fmt="iso", utc=True))
        processors.append(
            structlog.processors.JSONRenderer()
            if json_lines
            else structlog.dev.ConsoleRenderer(colors=False)
        )
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
