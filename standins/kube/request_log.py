"""The server's request log and injected faults: what tests read back, what they make fail."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """One HTTP request as seen by the server (status is filled in when known; for a watch,
    when the stream opens)."""

    method: str
    path: str
    query: dict[str, str]
    user: str | None = None
    status: int | None = None
    verb: str | None = None  # Kubernetes verb: get, list, watch, create, update, patch, delete
    resource: str | None = None  # plural, e.g. "nodes"
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    time: float = field(default_factory=time.time)
    # The raw body of a write (POST, PUT, PATCH, DELETE; b"" when it had none), as received:
    # a write that changed nothing leaves no trace in the store, only here.
    body: bytes | None = None

    def json(self) -> Any:
        """The body decoded as JSON; None for a read, an empty body or one that is not JSON."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass
class Fault:
    """A failure `FakeKube.fail_requests` injected: the Status the next `remaining` matching
    requests get (-1: every one)."""

    code: int
    reason: str
    message: str
    verb: str | None
    resource: str | None
    subresource: str | None
    name: str | None
    user: str | None
    remaining: int

    def matches(self, r: RequestRecord) -> bool:
        return (
            self.remaining != 0
            and self.verb in (None, r.verb)
            and self.resource in (None, r.resource)
            and self.subresource in (None, r.subresource)
            and self.name in (None, r.name)
            and self.user in (None, r.user)
        )
