"""On-disk validation and the config drift monitor in cluster mode: the real agent process,
the loopback API server and a simulated host whose files real inotify watches.

Each kind of drift (a key's content, its mode, the key deleted, a unit enabled by hand, an
image file under /etc edited, another image booted) is reported Degraded with the MCD's words
and a `ConfigDriftDetected` Event, heals when the host is put right, and the force file
re-applies the config. The agent's own updates are never taken for drift. The latency from a
change to its report is measured by bench/drift_latency.py, not asserted here."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from agent.core.policy import FORCE_FILE, SSH_KEYS_PATH
from agent.model.imageref import parse_image_ref
from standins.demo.loopback import Cluster, P
from tests.scenarios.harness import free_port, until, wait_metric

pytestmark = pytest.mark.asyncio
KEY = "ssh-ed25519 AAAA-one"
CHRONY = "server time.example iburst\n"
UNITS = [{"name": "kubelet.service", "enabled": True}, {"name": "debug.service", "enabled": False}]
UNIT_FILE = "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"


class Drifting:
    """A Done node whose host holds rendered-worker-1 exactly: its key, its units' states and
    an /etc file the booted image ships; and the agent serving /status."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.root = cluster.sim.root
        self.port = free_port()
        self.states: list[str] = []
        self.state_since: dict[str, float] = {}  # when the Node last entered each state
        cluster.kube.add_hook(self._record_state)

    def _record_state(self, change) -> None:
        obj = getattr(change, "obj", None) or {}
        if obj.get("kind") == "Node":
            state = (obj.get("metadata", {}).get("annotations") or {}).get(P + "state")
            if state and (not self.states or self.states[-1] != state):
                self.states.append(state)
                self.state_since[state] = time.time()

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def lay_image_etc(self) -> None:
        for rel in ("usr/etc/chrony.conf", "etc/chrony.conf"):
            self.host(rel).parent.mkdir(parents=True, exist_ok=True)
            self.host(rel).write_text(CHRONY)
        units = self.host("usr/lib/systemd/system")
        units.mkdir(parents=True, exist_ok=True)
        for name in ("kubelet.service", "debug.service"):
            (units / name).write_text(UNIT_FILE)
        wants = self.host("etc/systemd/system/multi-user.target.wants")
        wants.mkdir(parents=True, exist_ok=True)
        (wants / "kubelet.service").symlink_to("/usr/lib/systemd/system/kubelet.service")

    async def start(self, *extra: str) -> None:
        await self.cluster.start_agent("--listen", f"127.0.0.1:{self.port}", *extra)

    async def status(self) -> dict:
        timeout = aiohttp.ClientTimeout(total=5)
        url = f"http://127.0.0.1:{self.port}/status"
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
            return await resp.json()

    async def validated(self, ok: bool = True, timeout: float = 20.0,
                        against: str = "rendered-worker-1") -> dict:  # fmt: skip
        """The last validation, once /status says it passed (or failed) against `against`."""
        seen: dict = {}

        async def check() -> bool:
            nonlocal seen
            try:
                seen = (await self.status()).get("validation") or {}
            except (aiohttp.ClientError, OSError):
                return False
            return seen.get("ok") is ok and seen.get("against") == against

        deadline = asyncio.get_running_loop().time() + timeout
        while not await check():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"validation never {'passed' if ok else 'failed'}: {seen}")
            await asyncio.sleep(0.05)
        return seen

    async def degraded(self, text: str) -> str:
        annotations = await self.cluster.wait_annotations(
            lambda a: a.get(P + "state") == "Degraded" and text in a.get(P + "reason", ""), 30
        )
        return annotations[P + "reason"]

    async def validated_then_stopped(self) -> None:
        """The agent started, Done and validated, then stopped: the next change is found at
        the next start."""
        await self.start()
        await self.cluster.wait_done("rendered-worker-1")
        await self.validated()
        self.cluster.procs[-1].terminate()
        await self.cluster.procs[-1].wait()

    def drift_events(self, message: str) -> list[dict]:
        reasons = {"ConfigDriftDetected", "PreflightConfigDriftCheckFailed"}
        return [e for e in self.cluster.kube.list("events", "default")
                if e["reason"] in reasons and e["message"] == message]  # fmt: skip

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.cluster.kube.list("events", "default") if e["reason"] == reason]


@pytest.fixture
async def drifting(tmp_path: Path):
    cluster = await Cluster.create(tmp_path)
    cluster.add_config("rendered-worker-1", "v1", keys=[KEY], units=UNITS)
    d = Drifting(cluster)
    d.lay_image_etc()
    yield d
    await cluster.close()


def replace_atomically(path: Path, text: str) -> None:
    """As an editor saves: a sibling written, then renamed over the file."""
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.chown(tmp, path.stat().st_uid, path.stat().st_gid)
    tmp.replace(path)


async def test_each_kind_of_drift_is_reported_and_heals_when_put_right(drifting: Drifting) -> None:
    d = drifting
    await d.start()
    await d.cluster.wait_done("rendered-worker-1")
    first = await d.validated()
    assert first["against"] == "rendered-worker-1" and first["findings"] == []
    keys = d.host(SSH_KEYS_PATH)
    original = keys.read_bytes()
    wants = d.host("etc/systemd/system/multi-user.target.wants")
    chrony = d.host("etc/chrony.conf")
    cases = [
        ("content", lambda: replace_atomically(keys, "ssh-ed25519 INTRUDER\n"),
         lambda: replace_atomically(keys, original.decode()),
         f'content mismatch for file "{SSH_KEYS_PATH}"'),
        ("mode", lambda: keys.chmod(0o644), lambda: keys.chmod(0o600),
         f'mode mismatch for file: "{SSH_KEYS_PATH}"; expected: -rw-------/384/0600; '
         "received: -rw-r--r--/420/0644"),
        ("deleted key", keys.unlink, lambda: restore(keys, original),
         f'could not stat file "{SSH_KEYS_PATH}"'),
        ("unit enabled by hand",
         lambda: (wants / "debug.service").symlink_to("/usr/lib/systemd/system/debug.service"),
         lambda: (wants / "debug.service").unlink(),
         'unit "debug.service" expected enabled=false, but systemd reports "enabled"'),
        ("unit disabled by hand", lambda: (wants / "kubelet.service").unlink(),
         lambda: (wants / "kubelet.service").symlink_to(
             "/usr/lib/systemd/system/kubelet.service"),
         'unit "kubelet.service" expected enabled=true, but systemd reports "disabled"'),
        ("image file under /etc", lambda: chrony.write_text("server evil.example\n"),
         lambda: chrony.write_text(CHRONY), 'file "/etc/chrony.conf" differs'),
        ("image file under /etc deleted", chrony.unlink, lambda: chrony.write_text(CHRONY),
         'file "/etc/chrony.conf" the booted image ships is missing'),
    ]  # fmt: skip
    for name, change, restore_it, text in cases:
        change()
        reason = await d.degraded(text)
        assert reason.startswith("unexpected on-disk state validating against rendered-worker-1: ")
        assert "INTRUDER" not in reason and "AAAA" not in reason  # never file contents
        # one Warning Event per finding, with the reason as its message: from the monitor,
        # or from the check before or after a pass's update when that one saw it first
        await until(lambda r=reason: len(d.drift_events(r)) == 1, what=name)
        assert (await d.validated(ok=False))["findings"][0]["text"].startswith(text[:20])
        restore_it()
        await d.cluster.wait_done("rendered-worker-1")
        await d.validated()
    assert d.cluster.reboots() == 0
    assert d.events("ConfigDriftDetected")  # the monitor saw some of them first
    assert d.events("OnDiskStateValidationFailed") == []
    assert d.cluster.procs[-1].returncode is None


def restore(path: Path, data: bytes) -> None:
    """Put a deleted key file back as the agent wrote it (0600, core's)."""
    path.write_bytes(data)
    path.chmod(0o600)
    os.chown(path, 1000, 1000)


async def test_drift_found_at_a_start_and_the_force_file_reapplies(drifting: Drifting) -> None:
    d = drifting
    await d.validated_then_stopped()
    d.host(SSH_KEYS_PATH).unlink()  # while no agent runs: found at the next start
    await d.start()
    await d.degraded(f'could not stat file "{SSH_KEYS_PATH}"')
    assert len(d.events("OnDiskStateValidationFailed")) == 1
    force = d.host(FORCE_FILE)
    force.parent.mkdir(parents=True, exist_ok=True)
    force.touch()
    # The monitor watches for the force file too: touching it is enough.
    await until(lambda: d.host(SSH_KEYS_PATH).exists(), what="the key written again")
    await d.cluster.wait_done("rendered-worker-1")
    assert d.host(SSH_KEYS_PATH).read_text() == f"{KEY}\n"
    await until(lambda: not force.exists(), what="the force file removed")
    await d.validated()
    assert d.cluster.reboots() == 0


async def test_the_agents_own_updates_are_never_drift(drifting: Drifting) -> None:
    d = drifting
    d.cluster.kube.enable_drain_controller(delay=0.1)
    await d.start()
    await d.cluster.wait_done("rendered-worker-1")
    await d.validated()
    # a live update of the watched key file, then an image update with a reboot
    d.cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"], units=UNITS)
    d.cluster.set_desired("rendered-worker-2")
    await d.cluster.wait_done("rendered-worker-2")
    await d.validated(against="rendered-worker-2")
    d.cluster.add_config("rendered-worker-3", "v2", keys=["ssh-ed25519 AAAA-three"], units=UNITS)
    d.cluster.set_desired("rendered-worker-3")
    await until(lambda: d.cluster.procs[-1].returncode == 3, what="the reboot")
    await d.start()
    await d.cluster.wait_done("rendered-worker-3")
    await d.validated(against="rendered-worker-3")
    assert d.events("ConfigDriftDetected") == []
    assert "Degraded" not in d.states, d.states
    assert d.cluster.reboots() == 1


async def test_another_image_booted_by_hand_is_drift_and_the_force_file_boots_back(
    drifting: Drifting,
) -> None:
    d = drifting
    await d.validated_then_stopped()
    # An administrator's `bootc switch` to v2 and a reboot, with the agent stopped.
    host = d.cluster.sim.host(lambda path: True)
    await host.bootc.stage(parse_image_ref(d.cluster.images["v2"]))
    await host.system.reboot()
    d.cluster.sim.boot()
    await d.start()
    reason = await d.degraded("expected target osImageURL")
    assert d.cluster.images["v1"].split("@")[1] in reason
    assert d.cluster.images["v2"].split("@")[1] in reason
    # The Degraded report wakes the agent's Node watch: that pass validates again and must
    # stop there too (it once took the node for an update ahead and booted v1 unforced).
    drift = 'image_mode_agent_validation_timestamp_seconds{result="drift"}'
    await wait_metric(d.port, drift, d.state_since["Degraded"])
    d.cluster.kube.enable_drain_controller(delay=0.1)  # the way back drains, as any update
    d.host(FORCE_FILE).touch()
    try:  # the reboot back
        assert await asyncio.wait_for(d.cluster.procs[-1].wait(), 30) == 3
    except TimeoutError:  # what the node and the drain controller show, for the CI log
        node = d.cluster.kube.get("Node", d.cluster.node)
        handled = d.cluster.kube.drain_controller.handled
        raise AssertionError(f"no reboot back in 30 s: {node['metadata']['annotations']}, "
                             f"drains answered {handled}") from None  # fmt: skip
    # The pass that booted back was the forced one: a pass woken by the agent's own Degraded
    # report once took that node for an update ahead and booted v1 without it (CI, 2026-12).
    assert not d.host(FORCE_FILE).exists()
    await d.start()
    await d.cluster.wait_done("rendered-worker-1")
    assert d.cluster.booted() == d.cluster.images["v1"].split("@")[1]
    await d.validated()


async def test_file_mode_validates_too_and_the_etc_ignore_flag(tmp_path: Path) -> None:
    """`run --source file:`: the same validation, monitor and force file; status.json says
    the last validation, and `--etc-drift-ignore` lets a host edit an image file."""
    import json
    import sys

    from standins.demo.loopback import make_host
    from standins.demo.objects import machine_config

    sim, images = make_host(tmp_path)
    root = sim.root
    for rel in ("usr/etc/chrony.conf", "etc/chrony.conf", "usr/etc/local.conf", "etc/local.conf"):
        (root / rel).write_text(CHRONY)
    desired = tmp_path / "mc.json"
    desired.write_text(json.dumps(machine_config(keys=[KEY], image=images["v1"])))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
        f"file:{desired}", "--host", f"simulated:{sim.base}", "--listen", "",
        "--etc-drift-ignore", "/etc/local.conf",
    )  # fmt: skip
    status_path = root / "var/lib/image-mode-agent/status.json"

    def status() -> dict:
        try:
            return json.loads(status_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def validated(ok: bool) -> bool:
        return (status().get("validation") or {}).get("ok") is ok

    try:
        await until(lambda: status().get("state") == "Done" and validated(True))
        (root / "etc/local.conf").write_text("mine\n")  # ignored by the flag
        keys = root / SSH_KEYS_PATH.lstrip("/")
        keys.chmod(0o640)
        await until(lambda: status().get("state") == "Degraded", what="the drift reported")
        reason = status()["reason"]
        assert reason == ("unexpected on-disk state validating against rendered-worker-1: mode "
                          f'mismatch for file: "{SSH_KEYS_PATH}"; expected: -rw-------/384/0600; '
                          "received: -rw-r-----/416/0640")  # fmt: skip
        (root / "etc/chrony.conf").write_text("server evil.example\n")
        await until(lambda: "/etc/chrony.conf" in status().get("reason", ""))
        (root / FORCE_FILE.lstrip("/")).touch()  # re-applies the live part: the key's mode
        await until(lambda: keys.stat().st_mode & 0o777 == 0o600, what="the key re-written")
        await until(lambda: not (root / FORCE_FILE.lstrip("/")).exists())
        # the image's file is reported, never rewritten: only its restore heals
        await until(
            lambda: (
                status()
                .get("reason", "")
                .endswith(
                    'file "/etc/chrony.conf" differs from the booted image\'s /usr/etc/chrony.conf'
                )
            )
        )
        (root / "etc/chrony.conf").write_text(CHRONY)
        await until(lambda: status().get("state") == "Done" and validated(True))
        assert (root / "etc/local.conf").read_text() == "mine\n"
    finally:
        proc.terminate()
        assert await proc.wait() == 0
    assert not [a for a in sim.actions() if a["kind"] == "reboot"]
