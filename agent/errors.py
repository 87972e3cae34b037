"""Error types shared by the pure core and the shell, and how a parser's crash becomes one."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
# What a parser may raise on a shape it did not expect, beside its own InputError: reported as
# unusable input, never allowed to end the agent.
PARSE_FAULTS = (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


class InputError(ValueError):
    """A document that cannot be parsed; names the source and the field at fault."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        where = ": ".join(part for part in (self.source, self.field) if part)
        return f"{where}: {self.message}" if where else self.message

    def located(self, source: str) -> InputError:
        """The same error, attributed to a file."""
        return InputError(self.message, source=source, field=self.field)


class HostError(RuntimeError):
    """A host side effect failed; `kind` lets status reporting give a distinct reason."""

    def __init__(self, message: str, *, kind: str = "other") -> None:
        self.kind = kind
        super().__init__(message)


def describe_fault(exc: BaseException) -> str:
    """What failed and where (`TypeError in agent/model/ignition.py:120`), never the message:
    that may quote the content, and secret contents never reach a reason or a log."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    parts = Path(frames[-1].filename).parts
    shown = "/".join(parts[parts.index("agent") :] if "agent" in parts else parts[-1:])
    return f"{type(exc).__name__} in {shown}:{frames[-1].lineno}"


def fault_frames(exc: BaseException) -> str:
    """The traceback of `exc` without its message (see `describe_fault`), for the log."""
    return "".join(traceback.format_tb(exc.__traceback__)) + type(exc).__name__


def parsing(parse: Callable[..., T], *args: Any, source: str = "") -> T:
    """`parse(*args)`; a crash on a shape it did not expect is an InputError too, attributed
    to `source` and naming the fault, never quoting the content."""
    try:
        return parse(*args)
    except InputError:
        raise
    except PARSE_FAULTS as exc:
        raise InputError(f"unexpected content ({describe_fault(exc)})", source=source) from None
