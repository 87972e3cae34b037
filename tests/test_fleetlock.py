"""The `fleet_lock` strategy and the node identity, against a FleetLock server on 127.0.0.1."""

from __future__ import annotations

import hmac
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from agent.errors import InputError
from agent.strategy.fleet_lock import (
    MAX_KINDS,
    PRE_REBOOT,
    STEADY_STATE,
    FleetLockClient,
    FleetLockStrategy,
    expand_base_url,
)
from agent.strategy.identity import (
    ZINCATI_APP_ID,
    node_id_from_machine_id,
    read_node_id,
    validate_group,
)
from tests.fleetlock_server import FleetLockServer

NODE_A = "e0f3745b108f471cbd4883c6fbed8cdd"
NODE_B = "c988d2509fdf4cdcbed39037c56406fb"


@pytest.fixture
async def server() -> AsyncIterator[FleetLockServer]:
    running = FleetLockServer(slots={"workers": 1, "infra": 2})
    async with running:
        yield running


def client(base: str, node: str = NODE_A, group: str = "workers", **kw: float) -> FleetLockClient:
    return FleetLockClient(base, node, group, **kw)


# -- identity -------------------------------------------------------------------------------

# Printed by `systemd-id128 machine-id --app-specific=de35106b6ec24688b63afddaa156679b` (systemd
# 252, Debian 12) on a machine whose /etc/machine-id held the first value.
SYSTEMD_VECTOR = ("3d1219c7c4c5404aaa1f6d2a48adfda4", "975228d46dc94622b9bbe16671e2b58d")


def reference_app_specific(machine_id: str, app_id: str) -> str:
    """systemd's algorithm written out again, on integers, to check the module against."""
    mac = hmac.new(bytes.fromhex(machine_id), bytes.fromhex(app_id), "sha256").digest()
    value = int.from_bytes(mac[:16], "big")
    value &= ~(0xF000 << 64) & ~(0xC000 << 48)  # clear version nibble and variant bits
    value |= (0x4000 << 64) | (0x8000 << 48)
    return f"{value:032x}"


def test_node_id_matches_a_vector_systemd_computed() -> None:
    machine_id, expected = SYSTEMD_VECTOR
    assert node_id_from_machine_id(machine_id) == expected
    assert reference_app_specific(machine_id, ZINCATI_APP_ID) == expected


@pytest.mark.parametrize("machine_id", ["0123456789abcdef0123456789abcdef", "f" * 32, NODE_B])
def test_node_id_is_the_app_specific_id(machine_id: str) -> None:
    derived = node_id_from_machine_id(machine_id)
    assert derived == reference_app_specific(machine_id, ZINCATI_APP_ID)
    assert derived[12] == "4" and derived[16] in "89ab"  # a UUID v4, as systemd stamps it
    assert derived != node_id_from_machine_id(machine_id, "00" * 16)
    assert node_id_from_machine_id(machine_id.upper()) == derived


def test_node_id_equals_systemd_on_this_machine() -> None:
    tool = shutil.which("systemd-id128")
    if tool is None or not Path("/etc/machine-id").is_file():
        pytest.skip("no systemd-id128 or /etc/machine-id here")
    run = subprocess.run([tool, "machine-id", f"--app-specific={ZINCATI_APP_ID}"],
                         capture_output=True, text=True, timeout=10)  # fmt: skip
    if run.returncode != 0:
        pytest.skip(f"systemd-id128 failed: {run.stderr.strip()}")
    assert read_node_id(Path("/")) == run.stdout.strip()


def write_machine_id(root: Path, content: str) -> Path:
    (root / "etc").mkdir(exist_ok=True)
    path = root / "etc" / "machine-id"
    path.write_text(content)
    return path


def test_read_node_id_from_a_root(tmp_path: Path) -> None:
    write_machine_id(tmp_path, SYSTEMD_VECTOR[0] + "\n")
    assert read_node_id(tmp_path) == SYSTEMD_VECTOR[1]


def test_missing_machine_id_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="missing") as caught:
        read_node_id(tmp_path)
    assert caught.value.source == str(tmp_path / "etc" / "machine-id")


@pytest.mark.parametrize(("content", "message"), [
    ("", "empty"), ("\n", "empty"), ("uninitialized\n", "not a machine id"),
    ("0" * 32 + "\n", "not a machine id"), ("abc\n", "not a machine id"),
    ("g" * 32 + "\n", "not a machine id"), (SYSTEMD_VECTOR[0] + "\n\n", "not a machine id"),
    ("3d1219c7-c4c5-404a-aa1f-6d2a48adfda4\n", "not a machine id"),
])  # fmt: skip
def test_malformed_machine_id_is_an_input_error(tmp_path: Path, content: str, message: str) -> None:
    path = write_machine_id(tmp_path, content)
    with pytest.raises(InputError, match=message) as caught:
        read_node_id(tmp_path)
    assert caught.value.source == str(path)


def test_configured_node_uuid_overrides_the_machine_id(tmp_path: Path) -> None:
    assert read_node_id(tmp_path, NODE_B.upper()) == NODE_B  # no machine-id needed
    write_machine_id(tmp_path, SYSTEMD_VECTOR[0])
    assert read_node_id(tmp_path, "") == SYSTEMD_VECTOR[1]  # empty means "not configured"


@pytest.mark.parametrize("bad", ["abc", NODE_B + "0", "c988d250-9fdf-4cdc-bed3-9037c56406fb",
                                 "z" * 32, NODE_B + "\n"])  # fmt: skip
def test_malformed_node_uuid_is_an_input_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InputError, match="32 hexadecimal") as caught:
        read_node_id(tmp_path, bad)
    assert caught.value.field == "identity.node_uuid"


@pytest.mark.parametrize("good", ["default", "worker", "01", "group-A", "infra.01", "example.com"])
def test_valid_groups(good: str) -> None:
    assert validate_group(good) == good


@pytest.mark.parametrize("bad", ["", "intránët", "a b", "workers\n", "a/b", "${group}"])
def test_invalid_groups(bad: str) -> None:
    with pytest.raises(InputError) as caught:
        validate_group(bad)
    assert caught.value.field == "identity.group"


# -- base URL -------------------------------------------------------------------------------


@pytest.mark.parametrize(("base", "expected"), [
    ("http://example.com/fleet_lock/", "http://example.com/fleet_lock/v1/pre-reboot"),
    ("http://example.com/fleet_lock", "http://example.com/fleet_lock/v1/pre-reboot"),
    ("https://example.com/base", "https://example.com/base/v1/pre-reboot"),
    ("http://fleet-lock.example.com:8080/", "http://fleet-lock.example.com:8080/v1/pre-reboot"),
    ("http://fleet-lock.example.com:8080", "http://fleet-lock.example.com:8080/v1/pre-reboot"),
    ("https://lock.example/${group}/", "https://lock.example/workers/v1/pre-reboot"),
])  # fmt: skip
def test_endpoints_sit_below_the_base_url(base: str, expected: str) -> None:
    assert str(client(base).endpoint(PRE_REBOOT)) == expected


@pytest.mark.parametrize(("base", "message"), [
    ("", "empty"), ("example.com/fleet_lock", "http"), ("ftp://example.com/", "http"),
    ("http://example.com/?token=x", "query"), ("http://example.com/#x", "fragment"),
    ("http://example.com/${node_uuid}/", "node_uuid"), ("http:///nohost", "host"),
])  # fmt: skip
def test_unusable_base_urls_are_input_errors(base: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as caught:
        expand_base_url(base, "workers")
    assert caught.value.field == "fleet_lock.base_url"


# -- client against the server --------------------------------------------------------------


async def test_lock_then_unlock(server: FleetLockServer) -> None:
    node = client(server.base_url)
    try:
        locked = await node.pre_reboot()
        assert (locked.ok, locked.status) == (True, 200)
        assert server.holders["workers"] == [NODE_A]
        unlocked = await node.steady_state()
        assert unlocked.ok and server.holders["workers"] == []
    finally:
        await node.aclose()
    assert [(r.api, r.id, r.group, r.status) for r in server.records] == [
        (PRE_REBOOT, NODE_A, "workers", 200), (STEADY_STATE, NODE_A, "workers", 200)]  # fmt: skip


async def test_lock_is_recursive(server: FleetLockServer) -> None:
    node = client(server.base_url)
    try:
        assert all([(await node.pre_reboot()).ok for _ in range(3)])
    finally:
        await node.aclose()
    assert server.holders["workers"] == [NODE_A]
    assert server.max_concurrent_holders["workers"] == 1


async def test_unlock_by_a_non_holder_succeeds_and_changes_nothing(server: FleetLockServer) -> None:
    a, b = client(server.base_url, NODE_A), client(server.base_url, NODE_B)
    try:
        assert (await a.pre_reboot()).ok
        assert (await b.steady_state()).ok
        assert server.holders["workers"] == [NODE_A]
    finally:
        await a.aclose()
        await b.aclose()


async def test_full_semaphore_then_granted_after_release(server: FleetLockServer) -> None:
    a, b = client(server.base_url, NODE_A), client(server.base_url, NODE_B)
    try:
        assert (await a.pre_reboot()).ok
        refused = await b.pre_reboot()
        assert (refused.ok, refused.status, refused.kind) == (
            False, 409, "failed_lock_semaphore_full")  # fmt: skip
        assert "semaphore currently full" in refused.value
        assert (await a.steady_state()).ok
        assert (await b.pre_reboot()).ok
    finally:
        await a.aclose()
        await b.aclose()
    assert server.holders["workers"] == [NODE_B]
    assert server.max_concurrent_holders["workers"] == 1


async def test_groups_have_their_own_slot_counts(server: FleetLockServer) -> None:
    nodes = [client(server.base_url, f"{n:032x}", "infra") for n in range(3)]
    try:
        results = [await node.pre_reboot() for node in nodes]
        other = client(server.base_url, NODE_A, "workers")
        assert (await other.pre_reboot()).ok
        await other.aclose()
    finally:
        for node in nodes:
            await node.aclose()
    assert [r.ok for r in results] == [True, True, False]
    assert server.max_concurrent_holders == {"infra": 2, "workers": 1}


@pytest.mark.parametrize(("headers", "body"), [
    ({}, {"client_params": {"id": NODE_A, "group": "workers"}}),
    ({"fleet-lock-protocol": "false"}, {"client_params": {"id": NODE_A, "group": "workers"}}),
    ({"fleet-lock-protocol": "true"}, "not json"),
    ({"fleet-lock-protocol": "true"}, {"client_params": {"group": "workers"}}),
    ({"fleet-lock-protocol": "true"}, {"client_params": {"id": NODE_A}}),
    ({"fleet-lock-protocol": "true"}, {"client_params": {"id": NODE_A, "group": "a b"}}),
    ({"fleet-lock-protocol": "true"}, {"id": NODE_A, "group": "workers"}),
])  # fmt: skip
async def test_server_refuses_requests_breaking_the_protocol(
    server: FleetLockServer, headers: dict[str, str], body: object
) -> None:
    payload = {"data": body} if isinstance(body, str) else {"json": body}
    async with (aiohttp.ClientSession() as session,
                session.post(server.base_url + "v1/pre-reboot", headers=headers,
                             **payload) as response):  # fmt: skip
        assert response.status == 400
        assert (await response.json())["kind"] == "failed_bad_request"
    assert server.holders["workers"] == []


async def test_server_fault_is_a_generic_http_failure_then_recovery(
    server: FleetLockServer,
) -> None:
    node = client(server.base_url)
    server.fail_next(2, status=500)
    try:
        first, second, third = [await node.pre_reboot() for _ in range(3)]
    finally:
        await node.aclose()
    assert (first.ok, first.status, first.kind) == (False, 500, "generic_http_500")
    assert second.kind == "generic_http_500" and third.ok


async def test_connection_refused_is_a_failed_request() -> None:
    async with FleetLockServer() as base:
        pass  # stopped: nothing listens on its port any more
    node = client(base)
    try:
        result = await node.pre_reboot()
    finally:
        await node.aclose()
    assert (result.ok, result.status, result.kind) == (False, None, "client_failed_request")
    assert result.value


async def test_redirects_are_not_followed(server: FleetLockServer) -> None:
    server.redirect_next(server.base_url + "v1/pre-reboot")
    node = client(server.base_url)
    try:
        result = await node.pre_reboot()
    finally:
        await node.aclose()
    assert (result.ok, result.status, result.kind) == (False, 307, "generic_http_307")
    assert [(r.api, r.status) for r in server.records] == [(PRE_REBOOT, 307)]
    assert server.holders["workers"] == []


async def test_timeout_is_honoured(server: FleetLockServer) -> None:
    server.delay = 0.6
    node = client(server.base_url, timeout=0.2)
    started = time.monotonic()
    try:
        result = await node.pre_reboot()
    finally:
        await node.aclose()
    assert time.monotonic() - started < 0.5
    assert (result.ok, result.kind) == (False, "client_failed_request")
    assert "0.2 s" in result.value


async def test_base_without_trailing_slash_and_templated_group() -> None:
    async with FleetLockServer(prefix="/locks/workers") as base:
        assert base.endswith("/locks/workers/")
        for configured in (base.rstrip("/"), base.replace("/workers/", "/${group}")):
            node = client(configured)
            try:
                assert (await node.pre_reboot()).ok
            finally:
                await node.aclose()


async def test_an_injected_session_stays_open(server: FleetLockServer) -> None:
    async with aiohttp.ClientSession() as session:
        node = FleetLockClient(server.base_url, NODE_A, "workers", session=session)
        assert (await node.pre_reboot()).ok
        await node.aclose()
        assert not session.closed


# -- strategy -------------------------------------------------------------------------------


def strategy(base: str, node: str = NODE_A, **backoff: float) -> FleetLockStrategy:
    return FleetLockStrategy(client(base, node), **backoff)


async def test_strategy_decisions_and_counters(server: FleetLockServer) -> None:
    a, b = strategy(server.base_url, NODE_A), strategy(server.base_url, NODE_B)
    try:
        granted = await a.can_finalize()
        assert (granted.allowed, granted.lock_held, granted.retry_after) == (True, True, None)
        assert granted.reason == f"reboot slot acquired from {server.base_url} (group workers)"
        refused = await b.can_finalize()
        assert (refused.allowed, refused.lock_held) == (False, False)
        assert refused.reason == ("lock-manager pre-reboot failure: semaphore currently full, "
                                  "all slots are locked already (failed_lock_semaphore_full, "
                                  "HTTP 409)")  # fmt: skip
        assert refused.retry_after is not None and refused.retry_after > 0
        assert await a.report_steady()
        assert (await b.can_finalize()).allowed
    finally:
        await a.aclose()
        await b.aclose()
    assert a.requests == {PRE_REBOOT: 1, STEADY_STATE: 1} and not a.errors
    assert b.requests == {PRE_REBOOT: 2}
    assert b.errors == {(PRE_REBOOT, "failed_lock_semaphore_full"): 1}


async def test_report_steady_failure_is_logged_and_counted(server: FleetLockServer) -> None:
    s = strategy(server.base_url)
    server.fail_next(1, status=503)
    try:
        with capture_logs() as logs:
            assert await s.report_steady() is False
        assert await s.report_steady() is True
    finally:
        await s.aclose()
    assert s.errors == {(STEADY_STATE, "generic_http_503"): 1}
    assert s.requests == {STEADY_STATE: 2}
    [event] = logs
    assert (event["kind"], event["status"], event["log_level"]) == (
        "generic_http_503", 503, "warning")  # fmt: skip
    assert event["value"] == "(unknown/generic server error)"


async def test_backoff_grows_with_failures_and_is_capped(server: FleetLockServer) -> None:
    s = strategy(server.base_url, backoff_initial=1.0, backoff_max=8.0, backoff_jitter=0.5)
    server.fail_next(6)
    try:
        waits = [(await s.can_finalize()).retry_after for _ in range(6)]
        assert (await s.can_finalize()).allowed
        assert s.failures[PRE_REBOOT] == 0
    finally:
        await s.aclose()
    bounds = [(1, 1.5), (2, 2.5), (4, 4.5), (8, 8), (8, 8), (8, 8)]
    assert all(low <= w <= high for w, (low, high) in zip(waits, bounds, strict=True)), waits
    # the streak ended: the next failure starts small again
    s.failures[PRE_REBOOT] = 1
    samples = {s.backoff(PRE_REBOOT) for _ in range(20)}
    assert len(samples) > 1 and all(1 <= w <= 1.5 for w in samples)  # jittered


def test_strategy_from_config(tmp_path: Path) -> None:
    write_machine_id(tmp_path, SYSTEMD_VECTOR[0] + "\n")
    s = FleetLockStrategy.from_config("https://ops:s3cret@lock.example/${group}", group="db-1",
                                      root=tmp_path)  # fmt: skip
    assert s.name == "fleet_lock"
    assert s.describe() == {"strategy": "fleet_lock", "baseUrl": "https://lock.example/db-1/",
                            "group": "db-1", "nodeId": SYSTEMD_VECTOR[1]}  # fmt: skip
    assert "s3cret" not in str(s.describe())
    overridden = FleetLockStrategy.from_config("http://lock.example/", node_uuid=NODE_B,
                                               root=tmp_path / "nowhere")  # fmt: skip
    assert overridden.describe()["nodeId"] == NODE_B
    assert overridden.describe()["group"] == "default"
    with pytest.raises(InputError) as caught:
        FleetLockStrategy.from_config("http://lock.example/", group="bad group", root=tmp_path)
    assert caught.value.field == "identity.group"


async def test_credentials_never_reach_reasons_or_logs(server: FleetLockServer) -> None:
    base = server.base_url.replace("http://", "http://ops:s3cret@")
    s = FleetLockStrategy(client(base))
    try:
        assert "s3cret" not in (await s.can_finalize()).reason
        server.fail_next(1)
        with capture_logs() as logs:
            decision = await s.can_finalize()
    finally:
        await s.aclose()
    assert "s3cret" not in decision.reason + str(logs)


async def test_a_hostile_server_cannot_flood_kinds_or_logs() -> None:
    count = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal count
        count += 1
        kind = "x" * 500 if count == 1 else f"kind_{count}"
        return web.json_response({"kind": kind, "value": "line\x1b[2J\n" * 200}, status=418)

    app = web.Application()
    app.router.add_post("/v1/pre-reboot", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    s = strategy(f"http://127.0.0.1:{runner.addresses[0][1]}/")
    try:
        first = await s.can_finalize()
        for _ in range(MAX_KINDS + 4):
            await s.can_finalize()
    finally:
        await s.aclose()
        await runner.cleanup()
    assert "generic_http_418" in first.reason  # an unbounded kind is not trusted
    assert len(first.reason) < 400 and "\x1b" not in first.reason
    assert len({kind for _, kind in s.errors}) == MAX_KINDS + 1  # the kinds, then "other"
    assert s.errors[(PRE_REBOOT, "other")] == 1 + MAX_KINDS + 4 - MAX_KINDS
