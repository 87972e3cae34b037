"""The systemd adapter against a REAL `systemd --user` manager, plus dbus-fast stand-ins for
logind (Reboot, Inhibit) and for the parts of PID 1 a user manager of systemd 252 lacks
(SoftReboot, SoftRebootsCount).

systemd is not PID 1 on the machines the tests run on, so the manager runs in a private mount
namespace (`unshare -m --propagation private`) where a tmpfs on /run/systemd holds
/run/systemd/system (the user manager refuses to start without it), with private XDG dirs; its bus
is the session bus that its own dbus.socket provides at $XDG_RUNTIME_DIR/bus."""

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.annotations import DBusBool, DBusStr, DBusUInt32, DBusUnixFd
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface, dbus_method, dbus_property

from agent.core.trust import StageTrust
from agent.errors import HostError
from agent.host.ports import Progress
from agent.host.systemd import Notifier, Systemd, as_variant
from agent.model.sigpolicy import POLICY_PATH
from tests.test_bootc_adapter import D1, D2, NAME, STANDIN, StandinHost, ref

REPO = Path(__file__).resolve().parents[1]
SYSTEMD_BIN = next(
    (p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if os.path.exists(p)), None
)
# A tmpfs over /run/systemd exists only in the namespace; the host's /run is not touched.
# The manager's namespace sees /etc through an overlay whose upper layer is a tmpfs: what its
# units write there (a bind mount's mount point, say) stays out of this machine's /etc. The
# overlay carries a host policy.json, as every bootc host has one.
MANAGER_SCRIPT = """set -e
mount -t tmpfs tmpfs /run/systemd
mkdir -p /run/systemd/system
scratch=$1
mount -t tmpfs tmpfs "$scratch"
mkdir -p "$scratch/upper/containers" "$scratch/work"
printf '%s\\n' "$HOST_POLICY" > "$scratch/upper/containers/policy.json"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
exec "$0" --user --log-target=console --log-level=notice
"""
HOST_POLICY = '{"default": [{"type": "insecureAcceptAnything"}]}'


@dataclass
class UserManager:
    address: str
    base: Path
    pid: int

    @property
    def config_units(self) -> Path:
        return self.base / "home/.config/systemd/user"

    @property
    def data_units(self) -> Path:
        return self.base / "home/.local/share/systemd/user"

    def client(self, **kwargs: object) -> Systemd:
        return Systemd(self.address, poll_interval=0.2, **kwargs)  # type: ignore[arg-type]


def _manager_running(address: str) -> bool:
    probe = subprocess.run(
        ["busctl", f"--address={address}", "get-property", "org.freedesktop.systemd1",
         "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager", "SystemState"],
        capture_output=True, text=True, timeout=5,
    )  # fmt: skip
    return probe.returncode == 0 and '"running"' in probe.stdout


@pytest.fixture(scope="module")
def user_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserManager]:
    if SYSTEMD_BIN is None or shutil.which("unshare") is None or shutil.which("busctl") is None:
        pytest.fail("needs /lib/systemd/systemd, unshare and busctl (Debian: systemd, util-linux)")
    base = tmp_path_factory.mktemp("usermgr")
    runtime = base / "xdg"
    runtime.mkdir(mode=0o700)
    env = {
        "HOME": str(base / "home"),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(base / "home/.config"),
        "XDG_DATA_HOME": str(base / "home/.local/share"),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus",
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        "HOST_POLICY": HOST_POLICY,
    }
    (base / "etc-overlay").mkdir()
    for folder in ("home/.config/systemd/user", "home/.local/share/systemd/user"):
        (base / folder).mkdir(parents=True)
    log = open(base / "manager.log", "wb")  # noqa: SIM115 - lives as long as the manager
    proc = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", MANAGER_SCRIPT, SYSTEMD_BIN,
         str(base / "etc-overlay")],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    address = env["DBUS_SESSION_BUS_ADDRESS"]
    deadline = time.monotonic() + 15
    while not ((runtime / "bus").exists() and _manager_running(address)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"systemd --user did not start: {(base / 'manager.log').read_text()}")
        time.sleep(0.05)
    yield UserManager(address, base, proc.pid)
    # The Popen pid IS the manager (sh execs it); SIGTERM makes a user manager stop its
    # units (dbus.service included) and exit; the namespace and its tmpfs go with it.
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture
async def systemd(user_manager: UserManager) -> AsyncIterator[Systemd]:
    client = user_manager.client()
    async with client:
        yield client


# -- stand-ins for logind and a newer PID 1 --------------------------------------------------
class FakeLogind(ServiceInterface):
    def __init__(self) -> None:
        super().__init__("org.freedesktop.login1.Manager")
        self.reboots: list[bool] = []
        self.inhibits: list[tuple[str, str, str, str]] = []
        self.read_ends: list[int] = []
        self.write_ends: list[int] = []  # logind's copies; closed once sent

    @dbus_method()
    def Reboot(self, interactive: DBusBool) -> None:
        self.reboots.append(interactive)

    @dbus_method()
    def Inhibit(self, what: DBusStr, who: DBusStr, why: DBusStr, mode: DBusStr) -> DBusUnixFd:
        self.inhibits.append((what, who, why, mode))
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        self.read_ends.append(read_end)
        self.write_ends.append(write_end)
        return write_end


class FakeSystemdManager(ServiceInterface):
    """Just what a systemd >= 254 PID 1 adds for soft reboots."""

    def __init__(self) -> None:
        super().__init__("org.freedesktop.systemd1.Manager")
        self.soft_reboots: list[str] = []

    @dbus_method()
    def Subscribe(self) -> None:
        pass

    @dbus_method()
    def SoftReboot(self, new_root: DBusStr) -> None:
        self.soft_reboots.append(new_root)

    @dbus_property(access=PropertyAccess.READ)
    def SoftRebootsCount(self) -> DBusUInt32:
        return 3


async def _serve(address: str, name: str, path: str, iface: ServiceInterface) -> MessageBus:
    bus = MessageBus(bus_address=address, negotiate_unix_fd=True)
    await bus.connect()
    bus.export(path, iface)
    await bus.request_name(name)
    return bus


@pytest.fixture
async def logind(user_manager: UserManager) -> AsyncIterator[FakeLogind]:
    fake = FakeLogind()
    bus = await _serve(user_manager.address, "org.freedesktop.login1",
                       "/org/freedesktop/login1", fake)  # fmt: skip
    yield fake
    bus.disconnect()
    for fd in fake.read_ends:
        os.close(fd)


@pytest.fixture
def plain_bus(tmp_path: Path) -> Iterator[str]:
    """A bare private dbus-daemon, for a stand-in PID 1."""
    proc = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--print-address=1",
         f"--address=unix:path={tmp_path}/bus"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    yield proc.stdout.readline().strip()
    proc.terminate()
    proc.wait(timeout=10)


# -- units -------------------------------------------------------------------------------------
async def test_transient_service_result_and_exit_status(systemd: Systemd) -> None:
    await systemd.start_transient_service("ima-fail.service", ["/bin/sh", "-c", "exit 3"])
    state = await systemd.wait_unit_finished("ima-fail.service", timeout=10)
    assert (state.active_state, state.result, state.exec_main_status) == ("failed", "exit-code", 3)
    assert not state.ok
    await systemd.clear_unit("ima-fail.service")
    assert (await systemd.unit_state("ima-fail.service")).load_state == "not-found"

    await systemd.start_transient_service("ima-ok", ["true"], description="ok one")
    state = await systemd.wait_unit_finished("ima-ok", timeout=10)
    assert (state.active_state, state.sub_state, state.ok) == ("active", "exited", True)
    assert state.description == "ok one" and state.exec_main_status == 0
    await systemd.clear_unit("ima-ok")
    assert (await systemd.unit_state("ima-ok")).load_state == "not-found"


async def test_transient_service_is_found_by_name_not_started_twice_and_stops(
    user_manager: UserManager, systemd: Systemd
) -> None:
    await systemd.start_transient_service(
        "ima-long.service", ["/bin/sleep", "60"], env={"A": "1"}, description="long"
    )
    other = user_manager.client()  # another agent process
    async with other:
        state = await other.unit_state("ima-long.service")
        assert state.running and state.description == "long"
        with pytest.raises(HostError) as err:
            await other.start_transient_service("ima-long.service", ["/bin/sleep", "60"])
        assert err.value.kind == "exists"
        with pytest.raises(HostError) as err:
            await other.wait_unit_finished("ima-long.service", timeout=0.3)
        assert err.value.kind == "timeout"
        waiter = asyncio.create_task(other.wait_unit_finished("ima-long.service", timeout=10))
        await asyncio.sleep(0.1)
        assert await systemd.stop_unit("ima-long.service") == "done"
        finished = await waiter  # woken by PropertiesChanged, not the poll
        assert not finished.running


async def test_unit_jobs_daemon_reload_and_perform(
    user_manager: UserManager, systemd: Systemd, tmp_path: Path
) -> None:
    out = tmp_path / "demo.log"
    (user_manager.config_units / "ima-demo.service").write_text(
        "[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        f"ExecStart=/bin/sh -c 'echo start >> {out}'\n"
        f"ExecReload=/bin/sh -c 'echo reload >> {out}'\n"
    )
    (user_manager.config_units / "ima-broken.service").write_text(
        "[Service]\nType=oneshot\nExecStart=/bin/false\n"
    )
    await systemd.perform("daemon-reload")
    assert await systemd.start_unit("ima-demo.service") == "done"
    assert await systemd.reload_unit("ima-demo.service") == "done"
    await systemd.perform("restart ima-demo")  # a bare name completes to .service
    await systemd.perform("reload ima-demo.service")
    assert out.read_text().split() == ["start", "reload", "start", "reload"]
    assert await systemd.start_unit("ima-broken.service") == "failed"
    with pytest.raises(HostError) as err:
        await systemd.perform("restart ima-broken")
    assert err.value.kind == "unit" and "failed" in str(err.value)
    with pytest.raises(HostError) as err:
        await systemd.perform("frobnicate crio")
    assert err.value.kind == "input"
    assert await systemd.stop_unit("ima-demo.service") == "done"
    await systemd.clear_unit("ima-broken.service")


async def test_mask_stops_and_masks_the_bootc_update_timer(
    user_manager: UserManager, systemd: Systemd
) -> None:
    # Shipped by the OS (lower-priority vendor dir), active, as on a stock bootc host.
    (user_manager.data_units / "bootc-fetch-apply-updates.service").write_text(
        "[Service]\nType=oneshot\nExecStart=/bin/true\n"
    )
    (user_manager.data_units / "bootc-fetch-apply-updates.timer").write_text(
        "[Timer]\nOnActiveSec=1h\n"
    )
    await systemd.daemon_reload()
    assert await systemd.start_unit("bootc-fetch-apply-updates.timer") == "done"
    await systemd.mask_unit("bootc-fetch-apply-updates.timer")
    link = user_manager.config_units / "bootc-fetch-apply-updates.timer"
    assert link.is_symlink() and os.readlink(link) == "/dev/null"  # persistent, not runtime
    state = await systemd.unit_state("bootc-fetch-apply-updates.timer")
    # Stopped (a masked unit that is still active would keep firing); systemd 252 reports a
    # timer whose unit file vanished under it as failed rather than inactive.
    assert state.load_state == "masked" and state.active_state in ("inactive", "failed")
    await systemd.unmask_unit("bootc-fetch-apply-updates.timer")
    assert not link.exists()


async def test_update_ca_trust_runs_with_a_timeout(user_manager: UserManager) -> None:
    ok = user_manager.client(update_ca_trust=["/bin/true"])
    await ok.perform("update-ca-trust")  # no D-Bus needed
    bad = user_manager.client(update_ca_trust=["/bin/sh", "-c", "echo broken >&2; exit 2"])
    with pytest.raises(HostError) as err:
        await bad.perform("update-ca-trust")
    assert err.value.kind == "command" and "broken" in str(err.value)
    slow = user_manager.client(update_ca_trust=["/bin/sleep", "30"], command_timeout=0.3)
    with pytest.raises(HostError) as err:
        await slow.perform("update-ca-trust")
    assert err.value.kind == "timeout"


async def test_notify_ready_reaches_a_real_manager(systemd: Systemd) -> None:
    """A Type=notify service's start job finishes only when READY=1 arrives."""
    script = (
        "import time; from agent.host.systemd import Notifier; time.sleep(0.2); "
        "n = Notifier(); assert n.ready(status='up'); time.sleep(60)"
    )
    await systemd.start_transient_service(
        "ima-notify.service",
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(REPO)},
        properties={"Type": Variant("s", "notify")},
    )
    state = await systemd.unit_state("ima-notify.service")
    assert (state.active_state, state.sub_state) == ("active", "running")
    await systemd.stop_unit("ima-notify.service")


def test_notifier_datagrams_and_watchdog(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000"})
        assert notifier.enabled and notifier.watchdog_interval() == 10.0
        assert notifier.ready() and notifier.watchdog()
        assert sock.recv(100) == b"READY=1"
        assert sock.recv(100) == b"WATCHDOG=1"
    assert not Notifier({}).ready()
    other_pid = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1"})
    assert other_pid.watchdog_interval() is None


# -- boot, reboot, inhibitors --------------------------------------------------------------------
async def test_boot_id_and_soft_reboots_count_on_a_manager_without_it(systemd: Systemd) -> None:
    assert await systemd.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert await systemd.soft_reboots_count() == 0  # systemd 252 has no SoftRebootsCount


async def test_reboot_goes_to_logind(systemd: Systemd, logind: FakeLogind) -> None:
    await systemd.reboot()
    assert logind.reboots == [False]  # never interactive (no polkit prompt)
    await systemd.reboot(soft=True)  # 252 has no SoftReboot: a full reboot instead
    assert logind.reboots == [False, False]


async def test_soft_reboot_where_systemd_has_it(plain_bus: str) -> None:
    manager, logind = FakeSystemdManager(), FakeLogind()
    pid1 = await _serve(plain_bus, "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                        manager)  # fmt: skip
    login = await _serve(plain_bus, "org.freedesktop.login1", "/org/freedesktop/login1", logind)
    try:
        async with Systemd(plain_bus) as client:
            await client.reboot(soft=True)
            assert manager.soft_reboots == [""] and logind.reboots == []
            assert await client.soft_reboots_count() == 3
    finally:
        pid1.disconnect()
        login.disconnect()


async def test_shutdown_inhibitor_is_held_until_released(
    systemd: Systemd, logind: FakeLogind
) -> None:
    async with systemd.shutdown_delayed("image-mode-agent", "recording reboot") as lock:
        assert logind.inhibits == [("shutdown", "image-mode-agent", "recording reboot", "delay")]
        assert lock.fd is not None and os.fstat(lock.fd)
        for fd in logind.write_ends:  # the reply carried a duplicate; logind drops its own
            os.close(fd)
        with pytest.raises(BlockingIOError):  # a writer is still open: the lock is held
            os.read(logind.read_ends[0], 1)
    assert lock.fd is None
    # Ours is closed too: EOF, logind sees the lock gone.
    deadline = time.monotonic() + 5
    while True:
        try:
            assert os.read(logind.read_ends[0], 1) == b""
            break
        except BlockingIOError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)


# -- bootc staging as a transient unit -----------------------------------------------------------
@pytest.fixture
def standin(tmp_path: Path) -> StandinHost:
    state = tmp_path / "state"
    state.mkdir()
    host = StandinHost(state)
    host.bootc("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    host.bootc("internals", "standin-add-image", f"{NAME}@{D2}", "2.0", str(100 << 20))
    return host


async def test_stage_runs_in_a_named_unit_and_is_adopted_after_a_restart(
    user_manager: UserManager, standin: StandinHost, tmp_path: Path
) -> None:
    standin.configure(progress_delay=0.5)  # four steps: the stage runs for about 2 s
    first_bus = user_manager.client()
    first = standin.adapter(tmp_path, runner=first_bus)
    dying = asyncio.create_task(first.stage(ref(D2), locked=True))
    for _ in range(100):  # until the stage unit runs, however loaded the machine is
        if (await first_bus.unit_state("image-mode-agent-stage.service")).running:
            break
        await asyncio.sleep(0.02)
    assert not dying.done()
    dying.cancel()  # the agent dies mid-stage; the unit does not
    with pytest.raises(asyncio.CancelledError):
        await dying
    await first_bus.close()

    async with user_manager.client() as bus:
        state = await bus.unit_state("image-mode-agent-stage.service")
        assert state.running and state.description.endswith(f"{NAME}@{D2}")
        second = standin.adapter(tmp_path, runner=bus)
        seen: list[Progress] = []
        await second.stage(ref(D2), seen.append, locked=True)
        assert len(standin.verb_calls("switch")) == 1  # adopted, not started twice
        assert seen and seen[-1].step == "staging 3/4"
        status = await second.status()
        assert status.staged_digest == D2 and status.staged is not None
        assert status.staged.download_only
        gone = await bus.unit_state("image-mode-agent-stage.service")
        assert gone.load_state == "not-found"  # cleared: the name is free for the next stage


async def test_stage_failure_and_cancel_through_systemd(
    user_manager: UserManager, standin: StandinHost, tmp_path: Path
) -> None:
    async with user_manager.client() as bus:
        bootc = standin.adapter(tmp_path, runner=bus)
        standin.configure(fail={"switch": "registry-auth"})
        with pytest.raises(HostError) as err:
            await bootc.stage(ref(D2))
        assert err.value.kind == "registry-auth" and "unauthorized" in str(err.value)
        standin.configure(fail={}, progress_delay=0.3)
        staging = asyncio.create_task(bootc.stage(ref(D2)))
        await standin.wait_switches(2)  # the first, refused, is one
        await bootc.cancel_stage()  # StopUnit
        with pytest.raises(HostError) as err:
            await staging
        assert err.value.kind == "cancelled"
        standin.configure(progress_delay=0)
        assert (await bootc.status()).staged is None


async def _systemd_call(
    bus: MessageBus, path: str, iface: str, member: str, signature: str, body: list
) -> list:
    message = Message(destination="org.freedesktop.systemd1", path=path, interface=iface,
                      member=member, signature=signature, body=body)  # fmt: skip
    reply = await bus.call(message)
    assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
    return list(reply.body)


async def unit_properties(address: str, unit: str, iface: str) -> dict[str, object]:
    """`GetAll` of one interface of a loaded unit, read on a bus connection of its own (not
    through the adapter under test)."""
    bus = await MessageBus(bus_address=address).connect()
    try:
        manager = "org.freedesktop.systemd1.Manager"
        (path,) = await _systemd_call(bus, "/org/freedesktop/systemd1", manager, "GetUnit", "s",
                                      [unit])  # fmt: skip
        props = "org.freedesktop.DBus.Properties"
        (values,) = await _systemd_call(bus, path, props, "GetAll", "s", [iface])
        return {key: value.value for key, value in values.items()}
    finally:
        bus.disconnect()


async def test_stage_unit_runs_at_idle_io_and_low_cpu_weight(
    user_manager: UserManager, standin: StandinHost, tmp_path: Path
) -> None:
    """What systemd reports for the running stage unit: the priority came through as typed
    properties (the adapter passes plain values; the runner makes Variants of them)."""
    standin.configure(progress_delay=0.3)  # four steps: the unit runs for about 1.5 s
    async with user_manager.client() as bus:
        bootc = standin.adapter(tmp_path, runner=bus)
        staging = asyncio.create_task(bootc.stage(ref(D2), locked=True))
        unit = "image-mode-agent-stage.service"
        async with asyncio.timeout(10):
            while not (await bus.unit_state(unit)).running:
                await asyncio.sleep(0.02)
        service = await unit_properties(
            user_manager.address, unit, "org.freedesktop.systemd1.Service"
        )
        assert (service["IOSchedulingClass"], service["Nice"]) == (3, 10)
        assert (service["CPUWeight"], service["IOWeight"]) == (20, 10)
        pid = int(service["MainPID"])  # type: ignore[call-overload]
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10  # applied to the process itself
        await staging
        status = await bootc.status()
        assert status.staged_digest == D2 and status.staged is not None
        assert status.staged.download_only


async def test_plain_unit_properties_become_typed_variants(
    user_manager: UserManager, systemd: Systemd
) -> None:
    assert as_variant("Nice", 10) == Variant("i", 10)
    assert as_variant("IOSchedulingClass", 3) == Variant("i", 3)
    assert as_variant("CPUWeight", 20) == Variant("t", 20)
    assert as_variant("IOWeight", 10) == Variant("t", 10)
    given = Variant("s", "oneshot")
    assert as_variant("Type", given) is given
    assert as_variant("WhateverSystemdKnows", given) is given  # a Variant passes as is
    for name, value in (("CPUWeight", -1), ("Nice", "10"), ("IOWeight", True)):
        with pytest.raises(HostError) as err:
            as_variant(name, value)
        assert err.value.kind == "input" and name in str(err.value)
    with pytest.raises(HostError) as err:
        await systemd.start_transient_service(
            "ima-unknown.service", ["/bin/true"], properties={"MemoryMax": 1 << 30}
        )
    assert err.value.kind == "input"
    assert "MemoryMax" in str(err.value) and "Variant" in str(err.value)
    assert (await systemd.unit_state("ima-unknown.service")).load_state == "not-found"
    # Plain and typed together, on a real manager.
    await systemd.start_transient_service(
        "ima-plain.service", ["/bin/sleep", "30"],
        properties={"Nice": 5, "CPUWeight": 50, "Type": Variant("s", "simple")},
    )  # fmt: skip
    try:
        service = await unit_properties(
            user_manager.address, "ima-plain.service", "org.freedesktop.systemd1.Service"
        )
        assert (service["Nice"], service["CPUWeight"], service["Type"]) == (5, 50, "simple")
    finally:
        await systemd.stop_unit("ima-plain.service")
        await systemd.clear_unit("ima-plain.service")


def test_standin_is_executable() -> None:
    assert os.access(STANDIN, os.X_OK)


def test_bus_choice_defaults_to_system() -> None:
    assert Systemd()._bus_type == BusType.SYSTEM
    assert Systemd(system_bus=False)._bus_type == BusType.SESSION


async def test_a_stage_policy_is_mounted_for_the_stage_unit_only(
    user_manager: UserManager, standin: StandinHost, tmp_path: Path
) -> None:
    """OpenShift's policy (default insecureAcceptAnything) cannot be enforced by bootc as it
    is: the stage unit sees the stage policy at /etc/containers/policy.json through its own
    read-only bind mount, and the host's file is untouched."""
    # The host's file as the manager (and every unit but the stage) sees it.
    host_policy = Path(f"/proc/{user_manager.pid}/root") / POLICY_PATH.lstrip("/")
    before = host_policy.read_bytes()
    assert before == (HOST_POLICY + "\n").encode()
    stage_policy = b'{"default": [{"type": "reject"}]}\n'
    async with user_manager.client() as bus:
        bootc = standin.adapter(tmp_path, runner=bus)
        trust = StageTrust(enforce=True, scope="test", policy=stage_policy)
        await bootc.stage(ref(D2), trust=trust)
    starts = [e for e in standin.log() if e["phase"] == "start" and "--help" not in e["argv"]]
    (seen,) = [e for e in starts if e["argv"][0] == "switch"]
    assert "--enforce-container-sigpolicy" in seen["argv"]
    assert seen["policy"] == stage_policy.decode()
    assert host_policy.read_bytes() == before
    written = tmp_path / "run" / "image-mode-agent-stage.service.policy.json"
    assert written.stat().st_mode & 0o777 == 0o600
