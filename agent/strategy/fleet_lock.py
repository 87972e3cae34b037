"""The `fleet_lock` strategy, as Zincati's: before rebooting into a staged update the host takes
a slot of a remote counting semaphore (FleetLock `pre-reboot`), and once it runs the new image
it gives the slot back (`steady-state`). Protocol: Zincati's FleetLock protocol document,
https://github.com/coreos/zincati/blob/be76c4a/docs/development/fleetlock/protocol.md .

`base_url` names the directory holding the `v1/` endpoints, as in Zincati's documented form
`http://example.com/fleet_lock/`. Zincati resolves the endpoint as a relative URL reference, so
there a base without the trailing slash loses its last segment; here it is treated as if it had
one (`.../fleet_lock` → `.../fleet_lock/v1/pre-reboot`), which is what the protocol's own
example means. `${group}` in the base is replaced by the reboot group; no other variable is
expanded (Zincati's templates leave the node id out too, and its basearch, platform and stream
have no counterpart here), and any other `${...}` is refused rather than sent as is.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from yarl import URL

from agent.core.backoff import backoff
from agent.errors import InputError
from agent.strategy.base import Decision
from agent.strategy.identity import DEFAULT_GROUP, read_node_id, validate_group

PRE_REBOOT = "pre-reboot"
STEADY_STATE = "steady-state"
REQUEST_FAILED = "client_failed_request"  # Zincati's kind when no HTTP answer came back
# A server MUST keep `kind` low-cardinality; one that does not could still flood the metric
# labels, so a kind of another shape is not trusted and past this many distinct kinds the
# counters say "other".
_KIND = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_KINDS = 16
_BODY_LIMIT = 64 * 1024
_VALUE_LIMIT = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_TEMPLATE = re.compile(r"\$\{([^}]*)\}")


@dataclass(frozen=True)
class LockResult:
    """One FleetLock call's outcome; a failure carries the protocol's kind and value."""

    api: str
    ok: bool
    status: int | None = None  # None when no HTTP answer arrived
    kind: str = ""
    value: str = ""

    def explain(self) -> str:
        answer = f"HTTP {self.status}" if self.status is not None else "no answer"
        return f"{self.value} ({self.kind}, {answer})"


def expand_base_url(template: str, group: str) -> URL:
    """The FleetLock base URL from its configured form: `${group}` replaced, a trailing slash
    ensured, and only http(s) with a host, without query or fragment (joining drops them)."""
    field = "fleet_lock.base_url"
    if not template:
        raise InputError("empty: the fleet_lock strategy needs a lock manager", field=field)
    unknown = sorted({name for name in _TEMPLATE.findall(template) if name != "group"})
    if unknown:
        raise InputError(f"unknown variable(s) {', '.join(unknown)}; only ${{group}} is "
                         "supported", field=field)  # fmt: skip
    try:
        url = URL(template.replace("${group}", validate_group(group)))
    except ValueError:
        raise InputError("not a URL", field=field) from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError("must be an http:// or https:// URL with a host", field=field)
    if url.query_string or url.fragment:
        raise InputError("must not have a query or a fragment", field=field)
    return url if url.path.endswith("/") else url.with_path(url.path + "/")


def redacted(url: URL) -> str:
    """The URL without user or password, for status, logs and reasons."""
    return str(url.with_user(None))


class FleetLockClient:
    """The client side of FleetLock. Its calls never raise on server or network faults: they
    answer a LockResult. A session passed in stays the caller's; one made here is closed by
    `aclose()`."""

    def __init__(
        self,
        base_url: str,
        node_id: str,
        group: str,
        *,
        timeout: float = 60.0,
        session: aiohttp.ClientSession | None = None,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
    ) -> None:
        self.base_url = expand_base_url(base_url, group)  # validates the group too
        self.node_id = node_id
        self.group = group
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None
        self._factory = session_factory or aiohttp.ClientSession
        self._body = {"client_params": {"id": node_id, "group": self.group}}

    def endpoint(self, api: str) -> URL:
        return self.base_url.join(URL(f"v1/{api}"))

    async def pre_reboot(self) -> LockResult:
        """RecursiveLock: take (or confirm holding) a reboot slot."""
        return await self._call(PRE_REBOOT)

    async def steady_state(self) -> LockResult:
        """UnlockIfHeld: give back this node's slot, if it holds one."""
        return await self._call(STEADY_STATE)

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None

    async def _call(self, api: str) -> LockResult:
        if self._session is None:
            # Made on first use, inside the running loop that will use it.
            self._session = self._factory()
        try:
            async with self._session.post(
                self.endpoint(api),
                json=self._body,
                headers={"fleet-lock-protocol": "true"},
                # The header guards against redirects; following one would defeat it.
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                if response.status == 200:
                    return LockResult(api, ok=True, status=200)
                body = await response.content.read(_BODY_LIMIT)
                return _failure(api, response.status, body)
        except TimeoutError:
            return LockResult(api, False, None, REQUEST_FAILED,
                              f"no answer within {self.timeout:g} s")  # fmt: skip
        except (aiohttp.ClientError, OSError) as exc:
            return LockResult(api, False, None, REQUEST_FAILED, self._scrub(exc))

    def _scrub(self, exc: BaseException) -> str:
        text = _printable(str(exc)) or type(exc).__name__
        if self.base_url.password:
            text = text.replace(self.base_url.password, "***")
        return text


def _failure(api: str, status: int, body: bytes) -> LockResult:
    """A non-200 answer: the server's `{"kind", "value"}` if it sent one we can trust, else
    Zincati's `generic_http_<code>`."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    kind = error.get("kind") if isinstance(error, dict) else None
    if isinstance(kind, str) and _KIND.fullmatch(kind) and isinstance(error.get("value"), str):
        return LockResult(api, False, status, kind, _printable(error["value"]))
    return LockResult(api, False, status, f"generic_http_{status}",
                      "(unknown/generic server error)")  # fmt: skip


def _printable(text: str) -> str:
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= _VALUE_LIMIT else text[: _VALUE_LIMIT - 1] + "…"


class FleetLockStrategy:
    """Reboot only while holding a FleetLock slot; steady once the slot is given back.

    `requests` (per api) and `errors` (per api and kind) count for the caller to export as
    Prometheus metrics (Zincati's `zincati_strategy_fleet_lock_{requests,errors}_total`)."""

    name = "fleet_lock"

    def __init__(
        self,
        client: FleetLockClient,
        *,
        backoff_initial: float = 1.0,
        backoff_max: float = 300.0,
        backoff_jitter: float = 1.0,
    ) -> None:
        self.client = client
        self.requests: Counter[str] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[str] = Counter()  # consecutive failures, per api
        self.last: dict[str, LockResult] = {}
        self._backoff = (backoff_initial, backoff_max, backoff_jitter)

    @classmethod
    def from_config(
        cls,
        base_url: str,
        *,
        group: str = DEFAULT_GROUP,
        node_uuid: str | None = None,
        root: Path = Path("/"),
        timeout: float = 60.0,
        **backoff: float,
    ) -> FleetLockStrategy:
        """From the configuration values; raises InputError naming the field at fault."""
        group = validate_group(group or DEFAULT_GROUP)
        client = FleetLockClient(base_url, read_node_id(root, node_uuid), group, timeout=timeout)
        return cls(client, **backoff)

    async def can_finalize(self) -> Decision:
        result = await self._request(PRE_REBOOT)
        where = f"{redacted(self.client.base_url)} (group {self.client.group})"
        if result.ok:
            return Decision(allowed=True, lock_held=True,
                            reason=f"reboot slot acquired from {where}")  # fmt: skip
        return Decision(allowed=False, lock_held=False,
                        reason=f"lock-manager pre-reboot failure: {result.explain()}",
                        retry_after=self.backoff(PRE_REBOOT))  # fmt: skip

    async def report_steady(self) -> bool:
        return (await self._request(STEADY_STATE)).ok  # the caller's loop paces the retries

    def backoff(self, api: str) -> float:
        """Seconds to wait before calling `api` again: grows with its consecutive failures,
        with jitter so a fleet refused together does not come back together; capped."""
        initial, cap, jitter = self._backoff
        return backoff(self.failures[api], initial, cap, jitter)

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "baseUrl": redacted(self.client.base_url),
            "group": self.client.group,
            "nodeId": self.client.node_id,
        }

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _request(self, api: str) -> LockResult:
        self.requests[api] += 1
        result = await (self.client.pre_reboot() if api == PRE_REBOOT
                        else self.client.steady_state())  # fmt: skip
        self.last[api] = result
        if result.ok:
            self.failures[api] = 0
            return result
        self.failures[api] += 1
        self.errors[(api, self._kind_label(result.kind))] += 1
        structlog.get_logger("fleet_lock").warning(
            f"lock-manager {api} failure", kind=result.kind, value=result.value,
            status=result.status, failures=self.failures[api],
            base_url=redacted(self.client.base_url))  # fmt: skip
        return result

    def _kind_label(self, kind: str) -> str:
        known = {k for _, k in self.errors}
        return kind if kind in known or len(known) < MAX_KINDS else "other"
