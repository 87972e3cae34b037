"""What a cluster scenario needs from an API server, written once: the simulated host, the
agent process and the waits are shared; each server (the project's fakekube, the real
kube-apiserver from the kit) supplies the few primitives below."""

from __future__ import annotations

import abc
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.demo.loopback import P, stop_processes
from agent.demo.objects import machine_config
from agent.host.simulated import SimulatedHost

Annotations = dict[str, str]
DEFAULT_ANNOTATIONS = {P + "currentConfig": "rendered-worker-1",
                       P + "desiredConfig": "rendered-worker-1", P + "state": "Done"}  # fmt: skip


@dataclass
class Harness(abc.ABC):
    """One Node served by one API server, its simulated host, and the agent processes."""

    base: Path
    sim: SimulatedHost
    images: dict[str, str]
    node: str = "worker-0"
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    # Whether the server can count the agent's requests exactly (only the fake can).
    counts_requests: bool = False

    # -- what each server supplies ------------------------------------------------------------
    @abc.abstractmethod
    async def put(self, obj: dict[str, Any]) -> None:
        """Create or replace a cluster-scoped object, as an admin."""

    @abc.abstractmethod
    async def delete(self, kind: str, name: str) -> None: ...

    @abc.abstractmethod
    async def node_object(self) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    async def patch_annotations(self, values: dict[str, str | None]) -> None: ...

    @abc.abstractmethod
    async def event_reasons(self) -> list[str]: ...

    @abc.abstractmethod
    async def enable_drain_controller(self) -> None:
        """Something answers desiredDrain as the MCO's drain controller does."""

    @abc.abstractmethod
    def drain_values(self) -> list[str]:
        """Every value desiredDrain took, in order."""

    @abc.abstractmethod
    async def restart_api_server(self, downtime: float) -> None: ...

    @abc.abstractmethod
    async def expire_watches(self) -> None:
        """End the agent's watches so that resuming from its last resourceVersion is 410."""

    @abc.abstractmethod
    def agent_kubeconfigs(self) -> tuple[Path, Path]:
        """(service account, node identity)."""

    @abc.abstractmethod
    async def close_server(self) -> None: ...

    # -- shared ---------------------------------------------------------------------------------
    async def add_config(self, name: str, image: str, **kwargs: Any) -> None:
        await self.put(machine_config(name=name, image=self.images.get(image, image), **kwargs))

    async def set_desired(self, name: str, **extra: str | None) -> None:
        await self.patch_annotations({P + "desiredConfig": name, **extra})

    async def annotations(self) -> Annotations:
        node = await self.node_object()
        return (node or {}).get("metadata", {}).get("annotations") or {}

    async def wait_node(self, predicate: Callable[[dict[str, Any]], bool],
                        timeout: float = 30.0, what: str = "") -> dict[str, Any]:  # fmt: skip
        node: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        node = await self.node_object()
                    except Exception:  # the server may be restarting: keep asking
                        node = None
                    if node is not None and predicate(node):
                        return node
                    if self.procs and self.procs[-1].returncode is not None:
                        raise AssertionError(
                            f"the agent exited ({self.procs[-1].returncode}) "
                            f"while waiting for {what or predicate}"
                        )
                    await asyncio.sleep(0.1)
        except TimeoutError:
            annotations = (node or {}).get("metadata", {}).get("annotations")
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}; "
                                 f"annotations: {annotations}") from None  # fmt: skip

    async def wait_annotations(self, predicate: Callable[[Annotations], bool],
                               timeout: float = 30.0, what: str = "") -> Annotations:  # fmt: skip
        node = await self.wait_node(
            lambda n: predicate(n["metadata"].get("annotations") or {}), timeout, what
        )
        return node["metadata"]["annotations"]

    async def wait_done(self, config: str, timeout: float = 30.0) -> Annotations:
        return await self.wait_annotations(
            lambda a: a.get(P + "currentConfig") == config and a.get(P + "state") == "Done",
            timeout, f"{config} Done",
        )  # fmt: skip

    async def start_agent(self, *extra: str) -> asyncio.subprocess.Process:
        sa, node = self.agent_kubeconfigs()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source", "kube",
            "--host", f"simulated:{self.sim.base}", "--listen", "",
            "--kubeconfig", str(sa), "--node-kubeconfig", str(node), "--node-name", self.node,
            *extra,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def exits(self, timeout: float = 60.0) -> int:
        return await asyncio.wait_for(self.procs[-1].wait(), timeout)

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    async def close(self) -> None:
        await stop_processes(self.procs)
        await self.close_server()
