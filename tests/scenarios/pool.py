"""A pool's controller driving real agent processes: one simulated host per Node booted on the
cluster's osImageURL and laid out from the pool's first rendered config as provisioning leaves
a node (`provision_hosts`: what the machine-config-server serves, laid out by Ignition), and
one supervisor per Node that restarts the agent after each simulated reboot (as systemd
would), counting boots. The controller is the real machine-config-controller
on the kit's kube-apiserver, or the stand-ins of its render, node and drain controllers on the
project's loopback API server: either is a `PoolBackend` (tests/scenarios/backend.py).

An admin watch over all Nodes records every change with its time, so a test can measure the
rollout (MachineConfig created → pool Updated) and each agent's share (desiredConfig seen →
Done written), and check how many Nodes were unavailable at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from standins.demo.loopback import make_host
from standins.host.simulated import SimulatedHost
from tests.scenarios.backend import MCO_NS, PoolBackend
from tests.scenarios.mcd_node import OS_UNITS, provision
from tests.scenarios.rest import AdminClient, follow, put_object

REPO = Path(__file__).resolve().parents[2]

P = "machineconfiguration.openshift.io/"
MC_PATH = "/apis/machineconfiguration.openshift.io/v1/machineconfigs"
CC_PATH = "/apis/machineconfiguration.openshift.io/v1/controllerconfigs"
POOL_PATH = "/apis/machineconfiguration.openshift.io/v1/machineconfigpools"
MCN_PATH = "/apis/machineconfiguration.openshift.io/v1/machineconfignodes"
MCN_COLUMNS = ("Updated", "UpdatePrepared", "UpdateExecuted", "UpdatePostActionComplete",
               "UpdateComplete", "Resumed", "AppliedFilesAndOS", "Cordoned", "Drained",
               "RebootedNode", "Uncordoned", "NodeDegraded")  # fmt: skip


@dataclass
class NodeHost:
    name: str
    sim: SimulatedHost
    images: dict[str, str]
    starts: int = 0
    bad_exits: list[int] = field(default_factory=list)
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]


@dataclass
class Sample:
    at: float
    node: str
    annotations: dict[str, str]
    unschedulable: bool

    def unavailable(self) -> bool:
        """As the node controller counts it (layered_node_state.go): not Done, or cordoned;
        a failing node (Degraded/Unreconcilable) is not counted."""
        a = self.annotations
        state = a.get(P + "state", "Done")
        done = a.get(P + "currentConfig") == a.get(P + "desiredConfig") and state == "Done"
        return self.unschedulable or (not done and state not in ("Degraded", "Unreconcilable"))


async def stop_agent(node: NodeHost, grace: float) -> None:
    """The node's supervisor first (no restart), then its agent: SIGTERM and `grace` seconds
    to end, else (or with no grace) SIGKILL. (HostedPool borrows the methods that call this.)"""
    if node.task is not None:
        node.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await node.task
        node.task = None
    if node.proc is None or node.proc.returncode is not None:
        return
    if grace > 0:
        node.proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(node.proc.wait(), grace)
            return
    node.proc.kill()
    await node.proc.wait()


@dataclass
class MccCluster:
    cluster: PoolBackend
    base: Path
    nodes: dict[str, NodeHost] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    mcn_rows: dict[str, list[dict[str, str | None]]] = field(default_factory=dict)
    agent_args: list[str] = field(default_factory=list)  # added to every agent's command
    logs: bool = False  # each agent's info log into BASE/logs/NODE.log (JSON lines)
    # Seconds a simulated reboot keeps the node down before its agent starts again (a real
    # reboot takes a while: firmware, kernel, kubelet); 0 restarts it at once.
    reboot_seconds: float = 0.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _bootstrap_config: str = ""

    @classmethod
    async def create(cls, cluster: PoolBackend, base: Path, workers: int = 1, *,
                     agent_args: list[str] | None = None, logs: bool = False,
                     reboot_seconds: float = 0.0) -> MccCluster:  # fmt: skip
        """`cluster` not started yet: started here, and stopped by `close`."""
        await cluster.up()
        mcc = cls(cluster, base, agent_args=list(agent_args or []), logs=logs,
                  reboot_seconds=reboot_seconds)  # fmt: skip
        try:
            await mcc._prepare(workers)
        except BaseException:
            await mcc.close()
            raise
        return mcc

    async def _prepare(self, workers: int) -> None:
        for k in range(workers):
            # Every image ships the OS's own units, which the rendered config enables without
            # contents (openvswitch.service, ...): the hosts are booted before it is rendered.
            sim, images = make_host(self.base / f"worker-{k}", os_files=OS_UNITS)
            self.nodes[f"worker-{k}"] = NodeHost(f"worker-{k}", sim, images)
        first = next(iter(self.nodes.values()))
        # The cluster's osImageURL is the image every host booted: no OS update at bootstrap.
        rendered = self._bootstrap_config = await self.cluster.mcc_up(workers, first.images["v1"])
        await self.cluster.apply_rbac(REPO / "deploy/rbac.yaml")
        token = await self.cluster.token_for("image-mode-agent")
        user = f"system:serviceaccount:{MCO_NS}:image-mode-agent"
        self.cluster.write_kubeconfig(self.base / "sa.kubeconfig", user, token)
        await provision_hosts(self.cluster, rendered, [n.sim for n in self.nodes.values()])
        for path, record in (("/api/v1/nodes", self._sample), (MCN_PATH, self._row)):
            self._tasks.append(asyncio.create_task(follow(self.cluster, path, {}, record)))

    @property
    def bootstrap_config(self) -> str:
        return self._bootstrap_config

    # -- the agents -------------------------------------------------------------------------
    def start_agents(self) -> None:
        for name in self.nodes:
            self.start_agent(name)

    def start_agent(self, name: str) -> None:
        """The node's agent under its supervisor (restarted after each simulated reboot)."""
        node = self.nodes[name]
        node.task = asyncio.create_task(self._supervise(node))

    async def kill_agent(self, name: str) -> None:
        """SIGKILL the node's agent (no clean-up of any kind) and leave it down."""
        await stop_agent(self.nodes[name], grace=0.0)

    async def stop_agents(self) -> None:
        """Stop every agent (SIGTERM, as systemd stops a service) and its supervisor."""
        for node in self.nodes.values():
            await stop_agent(node, grace=10.0)

    async def _supervise(self, node: NodeHost) -> None:
        """Run the agent; after a simulated reboot (exit 3) start it again, as systemd would."""
        while True:
            node.starts += 1
            log = None
            if self.logs:
                (self.base / "logs").mkdir(exist_ok=True)
                log = open(self.log_path(node.name), "ab")  # noqa: SIM115 (closed below)
            try:
                node.proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "agent", "--log-level", "info" if log else "warning",
                    "run", "--source", "kube", "--host", f"simulated:{node.sim.base}",
                    "--listen", "", "--kubeconfig", str(self.base / "sa.kubeconfig"),
                    "--node-kubeconfig", str(self.cluster.node_kubeconfig(node.name)),
                    "--node-name", node.name, *self.agent_args, stderr=log,
                )  # fmt: skip
                rc = await node.proc.wait()
            finally:
                if log is not None:
                    log.close()
            if rc != 3:
                node.bad_exits.append(rc)
                return
            if self.reboot_seconds > 0:
                await asyncio.sleep(self.reboot_seconds)

    def log_path(self, node: str) -> Path:
        return self.base / "logs" / f"{node}.log"

    def api_requests(self, node: str) -> list[dict[str, int]]:
        """What each finished agent process asked of the API server (its exit line), in
        order; needs `logs`."""
        lives = []
        path = self.log_path(node)
        for line in path.read_text().splitlines() if path.exists() else []:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "api requests":
                    lives.append({k: int(entry[k]) for k in ("reads", "writes", "node_reads",
                                                             "node_writes")})  # fmt: skip
        return lives

    # -- observing ------------------------------------------------------------------------------
    async def _row(self, mcn: dict[str, Any]) -> None:
        """The MachineConfigNode as `oc get machineconfignode` shows it (the CRD's printer
        columns), plus NodeDegraded."""
        conditions = {c["type"]: c["status"] for c in mcn.get("status", {}).get("conditions", [])}
        row = {"PoolName": mcn.get("spec", {}).get("pool", {}).get("name"),
               "DesiredConfig": mcn.get("spec", {}).get("configVersion", {}).get("desired"),
               "CurrentConfig": mcn.get("status", {}).get("configVersion", {}).get("current"),
               **{kind: conditions.get(kind) for kind in MCN_COLUMNS}}  # fmt: skip
        rows = self.mcn_rows.setdefault(mcn["metadata"]["name"], [])
        if not rows or rows[-1] != row:
            rows.append(row)

    async def _sample(self, node: dict[str, Any]) -> None:
        self.samples.append(Sample(time.monotonic(), node["metadata"]["name"],
                                   dict(node["metadata"].get("annotations") or {}),
                                   bool(node.get("spec", {}).get("unschedulable"))))  # fmt: skip

    def first(self, node: str, predicate, after: float = 0.0) -> float | None:
        for s in self.samples:
            if s.node == node and s.at >= after and predicate(s.annotations):
                return s.at
        return None

    def agent_share(self, node: str, config: str, after: float) -> float:
        """desiredConfig = config seen on the Node → currentConfig = config and Done."""
        seen = self.first(node, lambda a: a.get(P + "desiredConfig") == config, after)
        done = self.first(node, lambda a: a.get(P + "currentConfig") == config
                          and a.get(P + "state") == "Done", after)  # fmt: skip
        assert seen is not None and done is not None, f"{node}: no {config} Done after {after}"
        return done - seen

    def drain_controller_wait(self, node: str, config: str, after: float) -> float:
        """Time the agent spent waiting for the drain controller's answers during the update
        to `config` (drain and uncordon): request written → echo seen."""
        total = 0.0
        for verb in ("drain", "uncordon"):
            value = f"{verb}-{config}"
            asked = self.first(node, lambda a, v=value: a.get(P + "desiredDrain") == v, after)
            echoed = self.first(node, lambda a, v=value: a.get(P + "lastAppliedDrain") == v, after)
            if asked is not None and echoed is not None:
                total += echoed - asked
        return total

    def most_unavailable(self, after: float) -> int:
        """The largest number of Nodes unavailable at the same time since `after`."""
        latest: dict[str, Sample] = {}
        worst = 0
        for s in self.samples:
            latest[s.node] = s
            if s.at >= after:
                worst = max(worst, sum(1 for x in latest.values() if x.unavailable()))
        return worst

    async def pool(self, name: str = "worker") -> dict[str, Any]:
        return await self.cluster.call("GET", f"{POOL_PATH}/{name}")

    async def wait_pool(self, predicate, what: str, timeout: float = 180.0) -> dict[str, Any]:
        pool: dict[str, Any] = {}
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with contextlib.suppress(RuntimeError):
                        pool = await self.pool()
                        if predicate(pool):
                            return pool
                    dead = {n.name: n.bad_exits for n in self.nodes.values() if n.bad_exits}
                    assert not dead, f"an agent exited while waiting for {what}: {dead}"
                    await asyncio.sleep(0.25)
        except TimeoutError:
            status = pool.get("status", {})
            conditions = {c["type"]: (c["status"], c.get("message", "")[:300])
                          for c in status.get("conditions", [])}  # fmt: skip
            raise AssertionError(f"pool not {what} after {timeout} s: {conditions}") from None

    async def wait_updated(self, config: str | None = None, timeout: float = 180.0) -> str:
        """Pool Updated (every machine at the pool's rendered config); returns that config."""

        def updated(pool: dict[str, Any]) -> bool:
            status = pool.get("status", {})
            target = pool["spec"].get("configuration", {}).get("name")
            machines = len(self.nodes)
            return (
                (config is None or target == config)
                and status.get("configuration", {}).get("name") == target
                and status.get("updatedMachineCount") == status.get("machineCount") == machines
                and _condition(pool, "Updated") == "True"
            )

        pool = await self.wait_pool(updated, f"Updated at {config or 'its config'}", timeout)
        target = pool["spec"]["configuration"]["name"]
        await self._watch_caught_up(target)
        return target

    async def _watch_caught_up(self, config: str, timeout: float = 30.0) -> None:
        """Until the admin watch has a Done sample at `config` for every Node. The pool is read
        with a GET and the Nodes through a watch: under load the GET can see the controller's
        verdict before the watch delivers the last Node's change, and the figures and checks
        that follow read the samples."""

        def done(a: dict[str, str]) -> bool:
            return a.get(P + "currentConfig") == config and a.get(P + "state") == "Done"

        try:
            async with asyncio.timeout(timeout):
                while not all(
                    any(s.node == n and done(s.annotations) for s in reversed(self.samples))
                    for n in self.nodes
                ):
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(
                f"the Node watch never showed every Node Done at {config}"
            ) from None

    async def wait_degraded(self, message: str = "", timeout: float = 180.0) -> dict[str, Any]:
        """Until the pool is NodeDegraded with a degraded machine and, when given, `message`
        among its conditions' messages: the controller may first set the condition from the
        Node's state and add the reasons once the MachineConfigNode reports them."""

        def degraded(pool: dict[str, Any]) -> bool:
            messages = " ".join(c.get("message", "") for c in pool["status"].get("conditions", []))
            return (_condition(pool, "NodeDegraded") == "True"
                    and pool.get("status", {}).get("degradedMachineCount", 0) >= 1
                    and message in messages)  # fmt: skip

        return await self.wait_pool(degraded, f"Degraded ({message!r})", timeout)

    async def wait_new_rendered(self, old: str, timeout: float = 60.0) -> str:
        pool = await self.wait_pool(
            lambda p: p["spec"].get("configuration", {}).get("name") not in (None, old),
            f"rendering past {old}", timeout,
        )  # fmt: skip
        return pool["spec"]["configuration"]["name"]

    async def wait_annotation(self, node: str, key: str, value: str,
                              timeout: float = 60.0) -> None:  # fmt: skip
        """Until the Node's annotation has the value (the admin watch's samples)."""
        async with asyncio.timeout(timeout):
            while not any(s.node == node and s.annotations.get(key) == value
                          for s in self.samples):  # fmt: skip
                await asyncio.sleep(0.1)

    async def wait_mcn(self, node: str, predicate, what: str, timeout: float = 60.0) -> dict:
        """Until the Node's MachineConfigNode row satisfies the predicate; returns the row."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    rows = self.mcn_rows.get(node, [])
                    if rows and predicate(rows[-1]):
                        return rows[-1]
                    await asyncio.sleep(0.1)
        except TimeoutError:
            rows = self.mcn_rows.get(node, [])
            raise AssertionError(f"MachineConfigNode {node} not {what}: {rows[-1:]}") from None

    async def rendered_configs(self) -> set[str]:
        listed = await self.cluster.call("GET", MC_PATH)
        return {mc["metadata"]["name"] for mc in listed["items"]
                if mc["metadata"]["name"].startswith("rendered-")}  # fmt: skip

    @staticmethod
    async def wait_file(path: Path, contents: bytes, timeout: float = 60.0) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not (path.exists() and path.read_bytes().strip() == contents.strip()):
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(f"{path} does not hold the expected contents") from None

    async def node(self, name: str) -> dict[str, Any]:
        return await self.cluster.call("GET", f"/api/v1/nodes/{name}")

    async def apply(self, obj: dict[str, Any]) -> float:
        """Create an object; returns the time, for the rollout figure."""
        at = time.monotonic()
        await put_object(self.cluster, obj)
        return at

    async def delete(self, path: str) -> None:
        await self.cluster.call("DELETE", path)

    async def close(self) -> None:
        await self.stop_agents()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.cluster.down()


async def provision_hosts(cluster: AdminClient, rendered: str,
                          hosts: Iterable[SimulatedHost]) -> None:  # fmt: skip
    """Each host as a node provisioned into the pool is when its agent first starts: the
    rendered config and the ControllerConfig, read from the API server as the
    machine-config-server reads them, served and laid out by Ignition, the first boot's
    firstboot service done (tests/scenarios/mcd_node.py `provision`). The hosts must be booted
    on the config's osImageURL, their image shipping the units it enables without contents
    (OS_UNITS); else NotProvisionable names the unit."""
    config = await cluster.call("GET", f"{MC_PATH}/{rendered}")
    controller_config = await cluster.call("GET", f"{CC_PATH}/machine-config-controller")
    for sim in hosts:
        provision(sim.root, config, controller_config)


@contextlib.asynccontextmanager
async def bootstrapped(cluster: PoolBackend, base: Path, workers: int = 1, **options: Any):
    """A cluster whose agents run and whose pool is Updated at its first rendered config:
    yields (the cluster, that config), and stops everything afterwards. `options`: those of
    `MccCluster.create` (agent_args, logs, reboot_seconds)."""
    mcc = await MccCluster.create(cluster, base, workers, **options)
    try:
        mcc.start_agents()
        yield mcc, await mcc.wait_updated(mcc.bootstrap_config)
    finally:
        await mcc.close()


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("status")
    return None


def machine_config(name: str, *, keys: list[str] | None = None,
                   os_image: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A user MachineConfig for the worker pool, as an admin would write it."""
    config: dict[str, Any] = {"ignition": {"version": "3.5.0"}}
    if keys is not None:
        config["passwd"] = {"users": [{"name": "core", "sshAuthorizedKeys": keys}]}
    spec: dict[str, Any] = {"config": config}
    if os_image is not None:
        spec["osImageURL"] = os_image
    return {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
            "metadata": {"name": name, "labels": {P + "role": "worker"}}, "spec": spec}  # fmt: skip
