"""A hosted cluster's InPlace NodePool driving real agent processes, as tests/scenarios/pool.py
drives a pool of the machine-config-controller: one simulated host per Node, provisioned as
Ignition leaves a host (the NodePool's first MachineConfig in
`/etc/mcs-machine-config-content.json`, with the other files of its payload), and one supervisor
per Node that restarts the agent after each simulated reboot (exit 3), counting boots.

The control plane is a `HostedBackend`: the stand-ins of HyperShift's in-place upgrader and
drainer on the project's loopback API server (`StandInHosted`, tests/scenarios/
hypershift_standin.py), or the kit's real `hypershift-inplace` (tests/conformance/hypershift.py).

An admin watch over the pool's Nodes records every change with its time (pool.py's `Sample`), from
which the checks are computed as the kit's `../shared/kit/lib/inplace-watch.py check` computes them:
the most Nodes selected at once (desiredConfig ≠ currentConfig, what the upgrader's capacity
counts), the most cordoned at once, reboots per Node."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.model.dataurl import decode_data_url
from standins.demo.loopback import make_host
from standins.demo.objects import machine_config
from standins.host.simulated import SimulatedHost
from standins.kube import FakeKube
from tests.scenarios.hypershift_payload import ignition
from tests.scenarios.hypershift_standin import (
    CURRENT,
    CURRENT_CONFIG,
    DESIRED,
    DESIRED_DRAIN,
    IN_PROGRESS_FALSE,
    LAST_APPLIED_DRAIN,
    NODE_POOL,
    STATE,
    Drainer,
    HostedNodePool,
    InPlaceUpgrader,
    Listing,
)
from tests.scenarios.pool import MccCluster, NodeHost, Sample
from tests.scenarios.rest import AdminClient, follow

# (node, its kubeconfig) -> the command to run as that Node's daemon
DaemonCommand = Callable[[NodeHost, Path], list[str]]


class HostedBackend(AdminClient):
    """An API server with HyperShift's InPlace controllers: what HostedPool needs of it."""

    controller = ""  # which controllers drive the NodePool, for the figures and the bench

    async def up(self) -> None:
        raise NotImplementedError

    async def down(self) -> None:
        raise NotImplementedError

    async def hcp_up(self, nodepool: str, nodes: int, max_unavailable: int) -> list[str]:
        """The NodePool as `hcp-up` makes it; returns its Node names."""
        raise NotImplementedError

    def node_kubeconfig(self, nodepool: str, node: str) -> Path:
        raise NotImplementedError

    async def set_target(self, nodepool: str, config: bytes | str | dict[str, Any], *,
                         hash: str | None = None,
                         release_version: str | None = None) -> str:  # fmt: skip
        """A new target config, as `hcp-target` sets it (Ignition bytes, a payload, or a
        MachineConfig / Ignition dict); returns the config-version hash."""
        raise NotImplementedError

    async def machineset(self, nodepool: str) -> dict[str, str]:
        """The MachineSet's annotations."""
        raise NotImplementedError

    async def machines(self, nodepool: str) -> dict[str, dict[str, str]]:
        """Each Machine's annotations, by Machine name."""
        raise NotImplementedError


HYPERSHIFT_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "hypershift" / "rbac.yaml"


@dataclass
class StandInHosted(HostedBackend):
    """The loopback API server with the upgrader (one per NodePool) and drainer stand-ins.
    `rbac`: a manifest applied for each NodePool beside the kit's grant (HYPERSHIFT_RBAC:
    what docs/install.md has the operator apply; None: the kit's grant only, as hcp-up
    makes it and the conformance tier runs). `listing`: the order the upgrader's cache lists
    the Machines in (hypershift_standin.InPlaceUpgrader)."""

    base: Path
    drain_delay: float = 0.05
    upgrader_delay: float = 0.01
    rbac: Path | None = None
    listing: Listing | None = None
    kube: FakeKube = field(default_factory=lambda: FakeKube(bookmark_interval=0.5))
    pools: dict[str, HostedNodePool] = field(default_factory=dict)
    upgraders: dict[str, InPlaceUpgrader] = field(default_factory=dict)
    drainer: Drainer | None = None

    controller = "stand-ins of HyperShift's inplaceupgrader and drainer"

    @property
    def url(self) -> str:
        return self.kube.url

    def admin_token(self) -> str:
        return self.kube.token_for()

    async def up(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        await self.kube.start()
        self.drainer = Drainer(self.kube, delay=self.drain_delay)
        self.drainer.start()

    async def hcp_up(self, nodepool: str, nodes: int, max_unavailable: int) -> list[str]:
        pool = HostedNodePool.create(self.kube, nodepool, nodes, self.base,
                                     max_unavailable=max_unavailable, rbac=self.rbac)  # fmt: skip
        self.pools[nodepool] = pool
        upgrader = InPlaceUpgrader(self.kube, pool, delay=self.upgrader_delay,
                                   listing=self.listing)  # fmt: skip
        self.upgraders[nodepool] = upgrader
        upgrader.start()
        return list(pool.nodes)

    def node_kubeconfig(self, nodepool: str, node: str) -> Path:
        return self.pools[nodepool].kubeconfig(node)

    async def set_target(self, nodepool: str, config: bytes | str | dict[str, Any], *,
                         hash: str | None = None,
                         release_version: str | None = None) -> str:  # fmt: skip
        return self.upgraders[nodepool].set_target(config, hash=hash,
                                                   release_version=release_version)  # fmt: skip

    async def machineset(self, nodepool: str) -> dict[str, str]:
        return dict(self.upgraders[nodepool].machineset.annotations)

    async def machines(self, nodepool: str) -> dict[str, dict[str, str]]:
        return {m.name: dict(m.annotations) for m in self.upgraders[nodepool].machines.values()}

    async def down(self) -> None:
        for upgrader in self.upgraders.values():
            await upgrader.stop()
        if self.drainer is not None:
            await self.drainer.stop()
        await self.close_session()
        await self.kube.stop()


def provision(sim: SimulatedHost, machine_config_doc: dict[str, Any]) -> None:
    """What Ignition leaves on a host from the NodePool's payload at its first boot: every
    storage file of the MCS's Ignition for `machine_config_doc`, including
    /etc/mcs-machine-config-content.json and node-annotations.json (units and users are not
    written: the scenarios' first configs have none)."""
    for f in ignition(machine_config_doc)["storage"]["files"]:
        target = sim.root / f["path"].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(decode_data_url(f["contents"]["source"]))
        target.chmod(f.get("mode", 0o644))


@dataclass
class HostedPool:
    backend: HostedBackend
    base: Path
    nodepool: str
    initial: dict[str, Any] = field(default_factory=dict)  # the MachineConfig hosts booted
    nodes: dict[str, NodeHost] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    agent_args: list[str] = field(default_factory=list)  # added to every agent's command
    logs: bool = False  # each agent's info log into BASE/logs/NODE.log (JSON lines)
    daemon_command: DaemonCommand | None = None  # instead of the agent (harness tests)
    targets: dict[str, float] = field(default_factory=dict)  # hash -> when it was set
    # Seconds a simulated reboot keeps the node down before its agent starts again (as
    # pool.py's MccCluster): a real reboot takes a while; 0 restarts it at once.
    reboot_seconds: float = 0.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # The same as a pool's: they only read `nodes`, `samples`, `base`.
    stop_agents = MccCluster.stop_agents
    log_path = MccCluster.log_path
    api_requests = MccCluster.api_requests
    first = MccCluster.first
    wait_annotation = MccCluster.wait_annotation
    wait_file = staticmethod(MccCluster.wait_file)

    @classmethod
    async def create(cls, base: Path, nodes: int = 3, *, max_unavailable: int = 1,
                     nodepool: str = "np", os_image: str | None = None,
                     initial: dict[str, Any] | None = None, agent_args: list[str] | None = None,
                     logs: bool = False, daemon_command: DaemonCommand | None = None,
                     backend: HostedBackend | None = None,
                     reboot_seconds: float = 0.0) -> HostedPool:  # fmt: skip
        """The NodePool on `backend` (default: the stand-ins on a new loopback server), its
        hosts booted on v1 and provisioned with `initial` (default: a MachineConfig with
        osImageURL `os_image`, default v1 by digest, and nothing else). Agents are not started
        (`start_agents`); `close` stops everything."""
        backend = backend or StandInHosted(base / "cluster")
        await backend.up()
        pool = cls(backend, base, nodepool, agent_args=list(agent_args or []), logs=logs,
                   daemon_command=daemon_command, reboot_seconds=reboot_seconds)  # fmt: skip
        try:
            await pool._prepare(nodes, max_unavailable, os_image, initial)
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _prepare(self, nodes: int, max_unavailable: int, os_image: str | None,
                       initial: dict[str, Any] | None) -> None:  # fmt: skip
        names = await self.backend.hcp_up(self.nodepool, nodes, max_unavailable)
        for name in names:
            sim, images = make_host(self.base / name)
            self.nodes[name] = NodeHost(name, sim, images)
        v1 = next(iter(self.nodes.values())).images["v1"]
        self.initial = initial or machine_config("initial", image=os_image or v1, version="3.5.0")
        for node in self.nodes.values():
            provision(node.sim, self.initial)
        selector = {"labelSelector": f"{NODE_POOL}={self.nodepool}"}
        self._tasks.append(asyncio.create_task(follow(self.backend, "/api/v1/nodes", selector,
                                                      self._sample)))  # fmt: skip

    @property
    def images(self) -> dict[str, str]:
        """The images every host can pull (the same digests on each: make_host)."""
        return next(iter(self.nodes.values())).images

    @property
    def standin(self) -> StandInHosted:
        """The stand-in backend, for what only it can do (faults on its API server, pausing
        its controllers)."""
        assert isinstance(self.backend, StandInHosted), "only the stand-ins run in-process"
        return self.backend

    @property
    def kube(self) -> FakeKube:
        return self.standin.kube

    @property
    def upgrader(self) -> InPlaceUpgrader:
        return self.standin.upgraders[self.nodepool]

    @property
    def drainer(self) -> Drainer:
        assert self.standin.drainer is not None
        return self.standin.drainer

    def kubeconfig(self, node: str) -> Path:
        return self.backend.node_kubeconfig(self.nodepool, node)

    # -- the node daemons -----------------------------------------------------------------------
    def command(self, node: NodeHost) -> list[str]:
        kubeconfig = self.kubeconfig(node.name)
        if self.daemon_command is not None:
            return self.daemon_command(node, kubeconfig)
        level = "info" if self.logs else "warning"
        return [sys.executable, "-m", "agent", "--log-level", level, "run",
                "--source", "hypershift", "--host", f"simulated:{node.sim.base}",
                "--listen", "", "--kubeconfig", str(kubeconfig), "--node-name", node.name,
                *self.agent_args]  # fmt: skip

    def start_agents(self) -> None:
        for node in self.nodes.values():
            node.task = asyncio.create_task(self._supervise(node))

    async def _supervise(self, node: NodeHost) -> None:
        """Run the daemon; after a simulated reboot (exit 3) start it again, as systemd would."""
        while True:
            node.starts += 1
            log = None
            if self.logs:
                (self.base / "logs").mkdir(exist_ok=True)
                log = open(self.log_path(node.name), "ab")  # noqa: SIM115 (closed below)
            try:
                node.proc = await asyncio.create_subprocess_exec(*self.command(node), stderr=log)
                rc = await node.proc.wait()
            finally:
                if log is not None:
                    log.close()
            if rc != 3:
                node.bad_exits.append(rc)
                return
            if self.reboot_seconds > 0:
                await asyncio.sleep(self.reboot_seconds)

    # -- the control plane ----------------------------------------------------------------------
    async def set_target(self, config: bytes | str | dict[str, Any], *, hash: str | None = None,
                         release_version: str | None = None) -> str:  # fmt: skip
        """Plays hcp-target; returns the hash, and keeps when it was set in `targets`."""
        at = time.monotonic()
        h = await self.backend.set_target(self.nodepool, config, hash=hash,
                                          release_version=release_version)  # fmt: skip
        self.targets.setdefault(h, at)
        return h

    async def machineset(self) -> dict[str, str]:
        return await self.backend.machineset(self.nodepool)

    async def machines(self) -> dict[str, dict[str, str]]:
        return await self.backend.machines(self.nodepool)

    async def _wait_machineset(self, predicate: Callable[[dict[str, str]], bool], what: str,
                               timeout: float) -> dict[str, str]:  # fmt: skip
        ms: dict[str, str] = {}
        try:
            async with asyncio.timeout(timeout):
                while True:
                    ms = await self.machineset()
                    if predicate(ms):
                        return ms
                    dead = {n.name: n.bad_exits for n in self.nodes.values() if n.bad_exits}
                    assert not dead, f"a node daemon exited while waiting for {what}: {dead}"
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"NodePool not {what} after {timeout} s: MachineSet {ms}; "
                                 f"Nodes {self.latest()}") from None  # fmt: skip

    async def wait_complete(self, hash: str, timeout: float = 60.0) -> float:
        """Until the MachineSet's current config version is `hash`; returns when (monotonic)."""
        await self._wait_machineset(lambda ms: ms.get(CURRENT) == hash, f"at {hash}", timeout)
        at = time.monotonic()
        await self._watch_caught_up(hash)
        return at

    async def _watch_caught_up(self, hash: str, timeout: float = 30.0) -> None:
        """Until the Node watch's latest sample of every Node is Done at `hash` with its drain
        answered, as the upgrader saw them. The MachineSet is read with a GET and the Nodes
        through a watch: under load the GET can see the upgrader's verdict before the watch
        delivers the last Node's change, and the checks that follow read the samples."""

        def done(s: Sample) -> bool:
            a = s.annotations
            return (a.get(CURRENT_CONFIG) == hash and a.get(STATE) == "Done"
                    and a.get(DESIRED_DRAIN) == a.get(LAST_APPLIED_DRAIN))  # fmt: skip

        try:
            async with asyncio.timeout(timeout):
                while True:
                    latest = {s.node: s for s in self.samples}
                    if all(n in latest and done(latest[n]) for n in self.nodes):
                        return
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"the Node watch never showed every Node Done at {hash}: "
                                 f"{self.latest()}") from None  # fmt: skip

    async def wait_degraded(self, message: str = "", timeout: float = 60.0) -> str:
        """Until the MachineSet says a Node is degraded (with `message` in it); returns it."""
        ms = await self._wait_machineset(lambda ms: message in ms.get(IN_PROGRESS_FALSE, "\0"),
                                         f"degraded ({message!r})", timeout)  # fmt: skip
        return ms[IN_PROGRESS_FALSE]

    # -- observing -------------------------------------------------------------------------------
    async def _sample(self, node: dict[str, Any]) -> None:
        self.samples.append(Sample(time.monotonic(), node["metadata"]["name"],
                                   dict(node["metadata"].get("annotations") or {}),
                                   bool(node.get("spec", {}).get("unschedulable"))))  # fmt: skip

    def latest(self) -> dict[str, dict[str, str]]:
        """Each Node's annotations as last seen (keys without the MCO prefix)."""
        seen: dict[str, Sample] = {s.node: s for s in self.samples}
        prefix = DESIRED[: -len("desiredConfig")]
        return {n: {k.removeprefix(prefix): v for k, v in s.annotations.items()
                    if k.startswith(prefix)} for n, s in seen.items()}  # fmt: skip

    def _most(self, counts: Callable[[Sample], bool], after: float) -> int:
        latest: dict[str, Sample] = {}
        worst = 0
        for s in self.samples:
            latest[s.node] = s
            if s.at >= after:
                worst = max(worst, sum(1 for x in latest.values() if counts(x)))
        return worst

    def most_selected(self, hash: str | None = None, after: float = 0.0) -> int:
        """The most Nodes selected at once since `after`: desiredConfig ≠ currentConfig (the
        upgrader's capacity count), and desiredConfig = `hash` when given (inplace-watch's
        count)."""

        def selected(s: Sample) -> bool:
            a = s.annotations
            desired = a.get(DESIRED, "")
            return desired != a.get(CURRENT_CONFIG, "") and hash in (None, desired)

        return self._most(selected, after)

    def most_cordoned(self, after: float = 0.0) -> int:
        return self._most(lambda s: s.unschedulable, after)

    def reboots(self) -> dict[str, int]:
        return {name: node.reboots() for name, node in self.nodes.items()}

    def boots(self) -> dict[str, int]:
        """How many times each Node's daemon was started (1 + its reboots, when all went well)."""
        return {name: node.starts for name, node in self.nodes.items()}

    def states(self) -> dict[str, list[str]]:
        """Each Node's `state` values in the order they were seen, repeats folded."""
        out: dict[str, list[str]] = {}
        for s in self.samples:
            state = s.annotations.get(STATE)
            seq = out.setdefault(s.node, [])
            if state is not None and (not seq or seq[-1] != state):
                seq.append(state)
        return out

    async def close(self) -> None:
        await self.stop_agents()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.backend.down()
