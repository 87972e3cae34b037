"""The scenarios' primitives on the project's loopback API server (standins/kube)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from standins.demo.loopback import Cluster, make_host
from standins.kube import Change, FakeKube, Rule, service_account_rules
from tests.scenarios.harness import DEFAULT_ANNOTATIONS, Harness, logged, wait_logged

P = "machineconfiguration.openshift.io/"
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"
MCO_NS = "openshift-machine-config-operator"
AGENT_SA = "image-mode-agent"


def agent_rules(rbac: Path = RBAC) -> list[Rule]:
    """What deploy/rbac.yaml grants the agent's service account, as the conformance harness
    applies it for real (namespaced Role and resourceNames included)."""
    return service_account_rules(yaml.safe_load_all(rbac.read_text()), MCO_NS, AGENT_SA)


def annotation_tracker(key: str, values: list[str]) -> Callable[[Change], None]:
    """A store hook that appends every value the Node annotation `key` takes, as the server
    stores it (a value written again unchanged is not a change: see the request log)."""

    def hook(change: Change) -> None:
        if change.rt.plural != "nodes" or change.obj is None:
            return
        new = (change.obj["metadata"].get("annotations") or {}).get(key)
        old = ((change.old or {}).get("metadata", {}).get("annotations") or {}).get(key)
        if new != old and new:
            values.append(new)

    return hook


@dataclass
class LoggedAgent:
    """An agent process of a loopback `Cluster` whose stderr (JSON lines) is kept in a file."""

    proc: asyncio.subprocess.Process
    log: Path

    def logged(self, *texts: str) -> int:
        return logged(self.log, *texts)

    async def wait_logged(self, *texts: str, count: int = 1, timeout: float = 30.0) -> None:
        await wait_logged(self.log, *texts, count=count, timeout=timeout, proc=self.proc)


async def start_logged(cluster: Cluster, *extra: str, level: str = "warning") -> LoggedAgent:
    """`cluster.start_agent(*extra)`, logging at `level` into a file of its own (the waits
    for what the agent logged read it)."""
    log = cluster.base / f"agent-{len(cluster.procs)}.log"
    with open(log, "wb") as stderr:  # the child keeps its own copy
        proc = await cluster.start_agent(*extra, log_level=level, stderr=stderr)
    return LoggedAgent(proc, log)


# What the agent writes, by the store's plural: every version is kept for the canary check.
AGENT_WRITES = {"nodes": "Node", "events": "Event", "machineconfignodes": "MachineConfigNode"}


@dataclass
class FakeHarness(Harness):
    kube: FakeKube = field(default_factory=FakeKube)
    _drains: list[str] = field(default_factory=list)

    @classmethod
    async def create(cls, base: Path, *, annotations: dict[str, str] | None = None) -> FakeHarness:
        kube = FakeKube(bookmark_interval=0.5)
        await kube.start()
        sim, images = make_host(base)
        h = cls(base, sim, images, kube=kube, counts_requests=True)
        kube.add_hook(annotation_tracker(P + "desiredDrain", h._drains))
        kube.add_hook(h._record_write)
        await h.add_config("rendered-worker-1", "v1", keys=["ssh-ed25519 AAAA-one"])
        kube.put({"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": h.node, "annotations": (
                      DEFAULT_ANNOTATIONS if annotations is None else annotations)},
                  "spec": {}})  # fmt: skip
        kube.write_kubeconfig(base / "node.kubeconfig", kube.node_identity(h.node))
        sa = kube.service_account(MCO_NS, AGENT_SA, agent_rules())
        kube.write_kubeconfig(base / "sa.kubeconfig", sa)
        return h

    def _record_write(self, change: Change) -> None:
        kind = AGENT_WRITES.get(change.rt.plural)
        if kind is not None and change.obj is not None:
            self.saw(kind, change.obj)

    async def agent_objects(self) -> dict[str, list[dict[str, Any]]]:
        return {kind: self.kube.list(plural) for plural, kind in AGENT_WRITES.items()}

    async def put(self, obj: dict[str, Any]) -> None:
        self.kube.put(obj)

    async def delete(self, kind: str, name: str) -> None:
        self.kube.delete(kind, name)

    async def node_object(self) -> dict[str, Any] | None:
        return self.kube.try_get("Node", self.node)

    async def patch_annotations(self, values: dict[str, str | None]) -> None:
        self.kube.patch_annotations("Node", self.node, values)

    async def event_reasons(self) -> list[str]:
        return [e["reason"] for e in self.kube.list("events", "default")]

    async def enable_drain_controller(self) -> None:
        self.kube.enable_drain_controller(delay=0.2)

    def drain_values(self) -> list[str]:
        return self._drains

    async def restart_api_server(self, downtime: float) -> None:
        await self.kube.restart(downtime=downtime)

    async def expire_watches(self) -> None:
        await self.kube.wait_for_watches(1, "nodes")
        self.kube.expire_history()
        assert self.kube.inject_watch_error(410, resource="nodes") >= 1

    def agent_kubeconfigs(self) -> tuple[Path, Path]:
        return self.base / "sa.kubeconfig", self.base / "node.kubeconfig"

    async def close_server(self) -> None:
        await self.kube.stop()

    def node_writes(self) -> int:
        return self.kube.count_requests(verb="patch", resource="nodes")

    def event_writes(self) -> int:
        return self.kube.count_requests(verb="create", resource="events")
