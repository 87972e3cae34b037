"""Bad input never stops the agent. In cluster and file mode, input it cannot use (the desired
or the current MachineConfig, ControllerConfig, MachineConfiguration, the first-boot
annotations, the desired file, a config recorded on the host) is reported Degraded with a reason
that names the object and the field, the process keeps running and watching, and it heals once
the input is fixed. Only the one-shot runs (`plan`, `run --once`, `run --dry-run`) exit 2.

The whole-cluster case of the issue (the Node's currentConfig unparsable) is a shared scenario,
tests/scenarios/cluster.py `unusable_current_config_heals`, run on both API servers."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.cluster.inputs import parsed
from agent.cluster.pool import PoolError, pools_for_node
from agent.cluster.watch import ObjectWatch
from agent.errors import HostError, InputError
from agent.update import configstore
from agent.update.configstore import ConfigStore
from agent.update.journal import Journal, Phase, Record
from standins.demo.loopback import Cluster, P
from standins.demo.objects import machine_config
from tests.fixtures_paths import CONTROLLER_CONFIG
from tests.scenarios.fake import LoggedAgent, start_logged
from tests.simhost import World

STATE = "var/lib/image-mode-agent"
SSH = "home/core/.ssh/authorized_keys.d/ignition"
BANANA = {"ignition": {"version": "banana"}}
# What the agent logs on every pass that stops at input it cannot use (agent/cluster/agent.py).
UNUSABLE = "input not usable"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await Cluster.create(tmp_path)
    yield c
    await c.close()


def degraded(*parts: str) -> Callable[[dict[str, str]], bool]:
    """The Node says Degraded with every one of `parts` in its reason."""

    def check(a: dict[str, str]) -> bool:
        return a.get(P + "state") == "Degraded" and all(p in a.get(P + "reason", "") for p in parts)

    return check


async def stays_put(cluster: Cluster, agent: LoggedAgent, failure: str) -> None:
    """The agent is still running and writes its Node no more: it waits for a change, it
    does not retry in a loop. The evidence first: its Degraded report came back on its Node
    watch and brought one more pass, which logged `failure` again (it may have already)."""
    writes = cluster.node_writes()
    await agent.wait_logged(failure, count=2)
    # That pass logs before it would write, and a write would bring the next pass at once:
    # half a second shows a loop.
    await asyncio.sleep(0.5)
    assert agent.proc.returncode is None, "the agent exited"
    assert cluster.node_writes() == writes, "the agent keeps writing its Node"


# -- cluster mode: the real agent process --------------------------------------------------------
async def test_unusable_desired_config_degrades_then_heals(cluster: Cluster) -> None:
    agent = await start_logged(cluster)
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v1", kernel_type="bogus")
    cluster.set_desired("rendered-worker-2")
    annotations = await cluster.wait_annotations(degraded("cannot use machineconfig"))
    assert annotations[P + "reason"].startswith(
        "cannot use machineconfig rendered-worker-2: spec.kernelType: "
    )
    await stays_put(cluster, agent, UNUSABLE)
    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    await cluster.wait_done("rendered-worker-2")
    assert (cluster.sim.root / SSH).read_text() == "ssh-ed25519 AAAA-two\n"
    assert cluster.procs[-1].returncode is None


async def test_unusable_desired_image_names_the_node_annotation(cluster: Cluster) -> None:
    agent = await start_logged(cluster)
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    cluster.set_desired("rendered-worker-2", **{P + "desiredImage": "not an image"})
    annotations = await cluster.wait_annotations(degraded("cannot use node worker-0"))
    assert annotations[P + "reason"].startswith(
        f"cannot use node worker-0: metadata.annotations[{P}desiredImage]: "
    )
    await stays_put(cluster, agent, UNUSABLE)
    cluster.set_desired("rendered-worker-2", **{P + "desiredImage": cluster.images["v1"]})
    await cluster.wait_done("rendered-worker-2")


async def test_unusable_controller_config_degrades_without_flapping_then_heals(
    cluster: Cluster,
) -> None:
    cc = yaml.safe_load(CONTROLLER_CONFIG.read_text())
    good = cc["spec"]["kubeAPIServerServingCAData"]
    cc["spec"]["kubeAPIServerServingCAData"] = "%%% not base64 %%%"
    cluster.kube.put(cc)
    agent = await start_logged(cluster)
    annotations = await cluster.wait_annotations(degraded("controllerconfig"))
    assert annotations[P + "reason"] == (
        "cannot use controllerconfig machine-config-controller: "
        "spec.kubeAPIServerServingCAData: invalid base64"
    )
    # Before, the pass went on after the report and said Working, then Done, then Degraded
    # again, on every pass: now it stops at the input it cannot use.
    await stays_put(cluster, agent, UNUSABLE)
    assert not (cluster.sim.root / "etc/kubernetes/kubelet-ca.crt").exists()
    cc["spec"]["kubeAPIServerServingCAData"] = good
    cluster.kube.put(cc)
    version = cluster.kube.get("controllerconfigs", "machine-config-controller")["metadata"][
        "resourceVersion"
    ]
    await cluster.wait_done("rendered-worker-1")
    annotations = await cluster.wait_annotations(
        lambda a: a.get(P + "lastSyncedControllerConfigResourceVersion") == version
    )
    assert annotations[P + "state"] == "Done"
    assert (cluster.sim.root / "etc/kubernetes/kubelet-ca.crt").read_text().startswith("-----")


async def test_an_update_in_flight_finishes_before_a_broken_controller_config_is_reported(
    cluster: Cluster,
) -> None:
    """Drained, staged and rebooting when the ControllerConfig breaks: the update is
    verified, committed and uncordoned all the same (never a node left cordoned); the next
    pass, idle, reports the ControllerConfig."""
    cluster.kube.enable_drain_controller()
    await cluster.start_agent()
    await cluster.wait_done("rendered-worker-1")
    cluster.add_config("rendered-worker-2", "v2")
    cluster.set_desired("rendered-worker-2")
    assert await asyncio.wait_for(cluster.procs[-1].wait(), 60) == 3  # the simulated reboot
    cc = yaml.safe_load(CONTROLLER_CONFIG.read_text())
    cc["spec"]["kubeAPIServerServingCAData"] = "%%% not base64 %%%"
    cluster.kube.put(cc)
    agent = await start_logged(cluster)
    annotations = await cluster.wait_annotations(degraded("controllerconfig"))
    assert annotations[P + "currentConfig"] == "rendered-worker-2"
    assert annotations[P + "desiredDrain"] == "uncordon-rendered-worker-2"
    assert annotations[P + "lastAppliedDrain"] == "uncordon-rendered-worker-2"
    assert cluster.reboots() == 1
    await stays_put(cluster, agent, UNUSABLE)


def _machine_configuration(files: Any) -> dict[str, Any]:
    return {
        "apiVersion": "operator.openshift.io/v1", "kind": "MachineConfiguration",
        "metadata": {"name": "cluster"},
        "status": {"observedGeneration": 1,
                   "nodeDisruptionPolicyStatus": {"clusterPolicies": {"files": files}}},
    }  # fmt: skip


async def test_unusable_machine_configuration_degrades_then_heals(cluster: Cluster) -> None:
    reload = {"type": "Reload", "reload": {"serviceName": "crio.service"}}
    cluster.kube.put(_machine_configuration([{"path": "etc/relative", "actions": [reload]}]))
    agent = await start_logged(cluster)
    annotations = await cluster.wait_annotations(degraded("machineconfiguration"))
    assert annotations[P + "reason"] == (
        "cannot use machineconfiguration cluster: "
        "status.nodeDisruptionPolicyStatus.clusterPolicies.files[0].path: "
        "expected an absolute path"
    )
    await stays_put(cluster, agent, UNUSABLE)
    assert not (cluster.sim.root / SSH).exists()  # nothing planned with a policy not asked for
    policy = [{"path": "/etc/containers/policy.json", "actions": [reload]}]
    cluster.kube.put(_machine_configuration(policy))
    await cluster.wait_done("rendered-worker-1")
    assert (cluster.sim.root / SSH).read_text() == "ssh-ed25519 AAAA-one\n"


async def test_corrupt_recorded_config_degrades_names_the_file_then_heals(
    cluster: Cluster,
) -> None:
    recorded = cluster.sim.root / STATE / "current-config"
    recorded.parent.mkdir(parents=True, exist_ok=True)
    corrupt = json.dumps(machine_config("rendered-worker-1") | {"spec": {"config": BANANA}})
    recorded.write_text(corrupt)
    agent = await start_logged(cluster)
    annotations = await cluster.wait_annotations(degraded("current-config"))
    reason = annotations[P + "reason"]
    assert reason.startswith(f"host error (journal): recorded config {recorded} is unreadable: ")
    assert "spec.config.ignition.version" in reason
    # Retried with backoff (2 s), logged each time, and no Working between.
    await stays_put(cluster, agent, "update failed; retrying")
    assert recorded.read_text() == corrupt  # kept as it was: never deleted or replaced
    recorded.unlink()  # the operator moves it away: planned from none, as a first start
    await cluster.wait_done("rendered-worker-1", timeout=30)  # retried with backoff
    assert (cluster.sim.root / SSH).read_text() == "ssh-ed25519 AAAA-one\n"
    assert json.loads(recorded.read_text())["metadata"]["name"] == "rendered-worker-1"


async def test_unusable_first_boot_annotations_degrade_then_heal(tmp_path: Path) -> None:
    c = await Cluster.create(tmp_path, annotations={})
    try:
        seed = c.sim.root / "etc/machine-config-daemon/node-annotations.json"
        seed.parent.mkdir(parents=True)
        seed.write_text("[]")
        agent = await start_logged(c)
        annotations = await c.wait_annotations(degraded("node-annotations.json"))
        assert annotations[P + "reason"] == (
            "cannot use /etc/machine-config-daemon/node-annotations.json: expected a JSON object"
        )
        await stays_put(c, agent, UNUSABLE)
        seed.write_text(json.dumps({P + "currentConfig": "rendered-worker-1",
                                    P + "desiredConfig": "rendered-worker-1",
                                    P + "state": "Done"}))  # fmt: skip
        await c.wait_done("rendered-worker-1", timeout=30)  # no watch on a host file: backoff
    finally:
        await c.close()


def _pool(configuration: Any) -> dict[str, Any]:
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
        "metadata": {"name": "worker"},
        "spec": {"nodeSelector": {"matchLabels": {"node-role.kubernetes.io/worker": ""}},
                 "configuration": configuration},
    }  # fmt: skip


async def test_unusable_pool_or_pool_target_is_not_prestaged_until_fixed(
    cluster: Cluster,
) -> None:
    """The pre-stager reads the pool and parses its target too: what it cannot use is logged,
    never the end of pre-staging (nor Degraded: the node's turn has not come)."""
    cluster.kube.put(_pool("not an object"))  # no schema on the loopback server
    node = cluster.kube.get("Node", cluster.node)
    node["metadata"]["labels"] = {"node-role.kubernetes.io/worker": ""}
    cluster.kube.put(node)
    cluster.add_config("rendered-worker-2", "v2", version="banana")
    agent = await start_logged(cluster, "--prestage-jitter", "0")
    await cluster.wait_done("rendered-worker-1")
    await agent.wait_logged("pre-stage check failed", "AttributeError")  # read the pool
    cluster.kube.put(_pool({"name": "rendered-worker-2"}))  # a pool, its target unusable
    await agent.wait_logged("pool target not usable", "rendered-worker-2", "banana")
    assert cluster.sim.status_document()["status"]["staged"] is None
    assert agent.proc.returncode is None
    cluster.add_config("rendered-worker-2", "v2")
    digest = cluster.images["v2"].split("@")[1]
    async with asyncio.timeout(20):
        while (cluster.sim.status_document()["status"]["staged"] or {}).get("image", {}).get(
            "imageDigest"
        ) != digest:
            await asyncio.sleep(0.1)
    assert cluster.annotations()[P + "state"] == "Done"


# -- file mode: the real agent process -----------------------------------------------------------
def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent", "--log-level", "warning", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.fixture
def sim(tmp_path: Path) -> tuple[Path, str]:
    base = tmp_path / "host"
    assert agent("sim", "create", str(base), "--image", "quay.example/os/node:v1").returncode == 0
    booted = json.loads((base / "host.json").read_text())["booted"]["digest"]
    return base, f"quay.example/os/node@{booted}"


def good_config(image: str, key: str = "k1") -> str:
    return json.dumps(machine_config("r1", image=image, keys=[key]))


def start(sim_dir: Path, desired: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", f"simulated:{sim_dir}", "--listen", "",
         "--poll-interval", "0.1"],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def wait_status(sim_dir: Path, proc: subprocess.Popen[bytes], predicate, timeout: float = 30):
    path = sim_dir / "root" / STATE / "status.json"
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the agent exited ({proc.returncode})"
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            status = None
        if status is not None and predicate(status):
            return status
        time.sleep(0.05)
    raise AssertionError(f"timed out; last status: {status}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_file_mode_unusable_desired_degrades_then_heals(tmp_path: Path, sim) -> None:
    sim_dir, image = sim
    desired = tmp_path / "desired.yaml"
    desired.write_text("kind: MachineConfig\nspec: {kernelType: bogus}\n")
    proc = start(sim_dir, desired)
    try:
        status = wait_status(sim_dir, proc, lambda s: s["state"] == "Degraded")
        assert status["reason"].startswith(f"cannot use the desired state: {desired}: ")
        assert "spec.kernelType" in status["reason"]
        # Still running and watching: it heals on the fix (wait_status fails if it exits).
        desired.write_text(good_config(image))
        status = wait_status(sim_dir, proc, lambda s: s["state"] == "Done")
        assert status["currentConfig"] == "r1"
        assert (sim_dir / "root" / SSH).read_text() == "k1\n"
    finally:
        stop(proc)


def test_file_mode_corrupt_recorded_config_degrades_keeps_it_then_heals(
    tmp_path: Path, sim
) -> None:
    sim_dir, image = sim
    desired = tmp_path / "desired.json"
    desired.write_text(good_config(image))
    once = agent("run", "--source", f"file:{desired}", "--host", f"simulated:{sim_dir}", "--once")
    assert once.returncode == 0, once.stderr
    recorded = sim_dir / "root" / STATE / "current-config"
    good = recorded.read_bytes()
    recorded.write_text("kind: MachineConfig\nspec: {config: {ignition: {version: banana}}}\n")
    proc = start(sim_dir, desired)
    try:
        status = wait_status(sim_dir, proc, lambda s: s["state"] == "Degraded")
        assert status["reason"].startswith(
            f"host error (journal): recorded config {recorded} is unreadable: "
            "spec.config.ignition.version: "
        )
        assert b"banana" in recorded.read_bytes()  # kept: never deleted or replaced
        # Still running: its next try (backoff) heals (wait_status fails if it exits).
        recorded.write_bytes(good)
        status = wait_status(sim_dir, proc, lambda s: s["state"] == "Done")
        assert status["currentConfig"] == "r1"
    finally:
        stop(proc)


@pytest.mark.parametrize("flags", [("--once",), ("--once", "--dry-run"), ("--dry-run",)])
def test_one_shot_runs_exit_2_with_one_line(tmp_path: Path, sim, flags: tuple[str, ...]) -> None:
    sim_dir, _ = sim
    desired = tmp_path / "desired.yaml"
    desired.write_text("kind: MachineConfig\nspec: {kernelType: bogus}\n")
    done = agent("run", "--source", f"file:{desired}", "--host", f"simulated:{sim_dir}",
                 "--listen", "", *flags)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"image-mode-agent: {desired}: spec.kernelType: ")
    status = sim_dir / "root" / STATE / "status.json"
    if "--dry-run" in flags:
        assert not status.exists()  # a dry run writes nothing
    else:
        assert json.loads(status.read_text())["state"] == "Degraded"


def test_plan_still_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(machine_config("x") | {"spec": {"config": BANANA}}))
    done = agent("plan", "--current", str(bad), "--desired", str(bad))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "spec.config.ignition.version" in done.stderr


# -- the parts, in process -----------------------------------------------------------------------
def test_recorded_config_unreadable_names_file_and_field_and_is_kept(tmp_path: Path) -> None:
    store = ConfigStore(tmp_path)
    store.current_path.write_text(json.dumps({"kind": "MachineConfig",
                                              "spec": {"config": BANANA}}))  # fmt: skip
    with pytest.raises(HostError) as err:
        store.current()
    assert err.value.kind == "journal"
    assert str(err.value).startswith(
        f"recorded config {store.current_path} is unreadable: spec.config.ignition.version: "
    )
    assert store.current_path.exists()
    with pytest.raises(HostError, match=f"recorded config {store.pending_path} is missing"):
        store.pending_document()
    store.pending_path.write_text("{")
    with pytest.raises(HostError, match=f"recorded config {store.pending_path} is unreadable"):
        store.pending_recorded()


def test_a_parser_crash_is_an_input_error_without_the_content(tmp_path: Path, monkeypatch) -> None:
    def crash(data: bytes, default_name: str = "") -> Any:
        raise TypeError("secret-value-123 is not hashable")

    monkeypatch.setattr(configstore, "parse_machine_config", crash)
    with pytest.raises(InputError) as err:
        configstore.parse_config(b"{}")
    assert err.value.message.startswith("unexpected content (TypeError in ")
    assert "secret-value-123" not in str(err.value)
    store = ConfigStore(tmp_path)
    store.current_path.write_text("{}")
    with pytest.raises(HostError, match="unexpected content"):
        store.current()


def test_parsed_names_the_object() -> None:
    def bad_field(_: object) -> None:
        raise InputError("expected a list", field="spec.x")

    def crash(_: object) -> None:
        raise AttributeError("'str' object has no attribute 'get'")

    with pytest.raises(InputError) as err:
        parsed("machineconfiguration cluster", bad_field, {})
    assert str(err.value) == "machineconfiguration cluster: spec.x: expected a list"
    with pytest.raises(InputError) as err:
        parsed("controllerconfig machine-config-controller", crash, {})
    assert str(err.value).startswith(
        "controllerconfig machine-config-controller: unexpected content (AttributeError in "
    )


async def test_engine_reports_an_unusable_pending_config_as_a_host_error(tmp_path: Path) -> None:
    world = World.create(tmp_path)
    engine = world.engine()
    Journal(engine.journal.path).save(Record(phase=Phase.APPLYING_LIVE, update_key="k",
                                             config_name="r2"))  # fmt: skip
    engine.configs.pending_path.write_text("kind: MachineConfig\nspec: {kernelType: bogus}\n")
    with pytest.raises(HostError) as err:
        await engine.reconcile(world.desired("r2", "v1"))
    assert str(err.value).startswith(
        f"recorded config {engine.configs.pending_path} is unreadable: spec.kernelType: "
    )
    engine.configs.pending_path.unlink()
    with pytest.raises(HostError, match="pending-config is missing"):
        await engine.reconcile(world.desired("r2", "v1"))


def test_malformed_pools_are_pool_errors_naming_the_pool() -> None:
    labels = {"node-role.kubernetes.io/worker": ""}
    for pool, field in (
        ({"metadata": {"name": "p"}, "spec": "oops"}, "spec"),
        ({"metadata": {"name": "p"}, "spec": {"nodeSelector": ["x"]}}, "spec.nodeSelector"),
        ({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchExpressions": [1]}}},
         "spec.nodeSelector"),
        ({"metadata": {"name": "p"}, "spec": {"nodeSelector": {"matchLabels": ["a"]}}},
         "spec.nodeSelector"),
    ):  # fmt: skip
        with pytest.raises(PoolError, match=f"machineconfigpool p: {field}"):
            pools_for_node("n", labels, [pool])


class _FlakyKube:
    """Answers that are not the JSON the API promises, then good ones."""

    def __init__(self) -> None:
        self.lists = 0
        self.good = {"metadata": {"name": "x", "resourceVersion": "7"}}

    async def get(self, path: str, **query: str) -> Any:
        self.lists += 1
        if self.lists == 1:
            return ["not", "a", "list", "answer"]
        return {"metadata": {"resourceVersion": "7"}, "items": [self.good]}

    async def watch(self, path: str, query: list[tuple[str, str]]) -> AsyncIterator[Any]:
        if self.lists == 2:
            yield "not an event"
        else:
            await asyncio.sleep(3600)


async def test_a_watch_outlives_malformed_answers() -> None:
    kube = _FlakyKube()
    watch = ObjectWatch(kube, "/apis/x", "x", max_backoff=0.1)  # type: ignore[arg-type]
    task = asyncio.create_task(watch.run())
    try:
        async with asyncio.timeout(10):
            while kube.lists < 3:  # listed again after the bad list and after the bad event
                await asyncio.sleep(0.05)
        assert watch.obj == kube.good
        assert not task.done()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_certificates_name_the_field_of_any_shape() -> None:
    from agent.cluster.certs import certificates

    for spec, field in (
        ("oops", "spec"),
        ({"imageRegistryBundleData": {"a": 1}}, "spec.imageRegistryBundleData"),
        ({"imageRegistryBundleUserData": ["x"]}, "spec.imageRegistryBundleUserData[0]"),
        ({"kubeAPIServerServingCAData": base64.b64encode(b"x").decode() + "!"},
         "spec.kubeAPIServerServingCAData"),
    ):  # fmt: skip
        with pytest.raises(InputError) as err:
            certificates({"spec": spec})
        assert err.value.field == field
