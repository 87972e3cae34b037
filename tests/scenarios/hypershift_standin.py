"""Stand-ins of HyperShift's InPlace controllers on the project's loopback API server
(standins/kube), for the HyperShift scenarios and the benchmark when the kit's real
`hypershift-inplace` is not there. They mirror the hosted-cluster-config-operator's
`inplaceupgrader` and `drainer` at openshift/hypershift 3ee9615567acffaf3e3ee25c2ca2942d650565cf
(`inplaceupgrader.go:N` and `drainer.go:N` below are lines of
https://github.com/openshift/hypershift/tree/3ee9615567acffaf3e3ee25c2ca2942d650565cf/control-plane-operator/hostedclusterconfigoperator/controllers
, in `inplaceupgrader/` and `drainer/`; the steps are those of docs/mco-protocol.md §15), and
as the kit's README observed them against the real ones ("The contract, as observed", "the
kit" below):

* `HostedNodePool`: what the kit's `hcp-up` makes on the hosted side ("What hcp-up creates"):
  Nodes `NP-0..NP-(N-1)` (Ready, CAPI annotations, label `hypershift.openshift.io/nodePool`, no
  `machineconfiguration.openshift.io/*` annotation), Namespace `NP-upgrade`, the node identities
  `system:node:NP-K` with the kit's grant to read ConfigMaps there (its RoleBinding
  `kit-node-read-upgrade-config`), one kubeconfig per Node. No ServiceAccount: the loopback
  server serves none and admits pods without one. With `rbac` (deploy/hypershift/rbac.yaml),
  the identities also get exactly what that file grants group system:nodes once NODEPOOL is
  replaced, as the loopback server's RBAC reads it (standins/kube/rbac.py): what an
  operator following docs/install.md adds to the kit's grant.
* `InPlaceUpgrader`: keeps the management side (MachineSet, Machines, token Secrets) in memory
  and plays `hcp-target` (`set_target`); reconciles on every change of its Nodes, as the real
  one does through nodeToMachineSet (inplaceupgrader.go, §15 steps 6-13). It takes
  the Machines in the order its cache lists them (`listing`; the real cache's is a Go map's,
  in no fixed order: the kit saw "selection order is the cache's, not the names'"); by default
  the Machines' order, NP-machine-0 first.
* `Drainer`: answers `desiredDrain` on any Node (drainer.go:46-154, §15 step 16).

Both write through the in-process store API (no identity, no admission), as the machine-config
stand-ins of standins/kube do, and run on the caller's event loop; `start()` and
`await stop()` leave no task behind. Several node pools may share one server: one
`InPlaceUpgrader` per pool, one `Drainer` per server (it acts on every Node, as the real one).

Known upstream bug, mirrored on purpose: `getAvailableCandidates` returns
`candidateNodes[:capacity]` with no bound by the number of candidates (inplaceupgrader.go:560-581,
§15 step 12; reproduced on the kit, README "Upstream bug observed"). When the free capacity
exceeds the capacity of Go's candidate slice (e.g. 3 Nodes, maxUnavailable 2, the first two
done within one reconcile) the reconcile panics after the MachineSet says "Upgraded: 2" and
before any Node is selected; controller-runtime recovers it and retries with backoff, so the
rollout is stuck for good. The stand-in raises `UpstreamPanic` there, counts it in `panics`, logs
it as the known bug and retries the same way. When the capacity lies between the number of
candidates and the slice's capacity, Go would return nil Nodes and the write of the first one
panics after the real candidates were selected: modelled so, by inference (never run).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from standins.kube import ApiError, Change, FakeKube, Identity, Rule, node_rules
from standins.kube.disruption import evict
from tests.scenarios.hypershift_payload import (
    config_hash,
    encode_ignition,
    fnv32a,
    target_ignition,
)

log = logging.getLogger(__name__)

HS = "hypershift.openshift.io/"
MCA = "machineconfiguration.openshift.io/"
CAPI = "cluster.x-k8s.io/"
TARGET = HS + "nodePoolTargetConfigVersion"
CURRENT = HS + "nodePoolCurrentConfigVersion"
IN_PROGRESS_TRUE = HS + "nodePoolUpgradeInProgressTrue"
IN_PROGRESS_FALSE = HS + "nodePoolUpgradeInProgressFalse"
MAX_UNAVAILABLE = HS + "nodePoolMaxUnavailable"
RELEASE_VERSION = HS + "release-version"
NODE_POOL = HS + "nodePool"  # Node label (the pool's name); MachineSet annotation (ns/name)
MANAGED = HS + "managed"  # the HCCO's label-enforcing client puts it on what it writes
DESIRED, CURRENT_CONFIG = MCA + "desiredConfig", MCA + "currentConfig"
STATE, REASON = MCA + "state", MCA + "reason"
DESIRED_DRAIN, LAST_APPLIED_DRAIN = MCA + "desiredDrain", MCA + "lastAppliedDrain"

# What hcp-up records by default (kit README "Scripts").
CP_NAMESPACE = "clusters-kit"
CLUSTER_NAMESPACE = "clusters"
INFRA_ID = "kit"
RELEASE_VERSION_DEFAULT = "4.22.0-0.kit"
RELEASE_IMAGE_DEFAULT = "registry.example.invalid/ocp/release@sha256:" + "1" * 64
MCO_IMAGE_DEFAULT = "registry.example.invalid/ocp/machine-config-operator@sha256:" + "2" * 64
NAMESPACE_LABELS = {
    "security.openshift.io/scc.podSecurityLabelSync": "false",
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/audit": "privileged",
    "pod-security.kubernetes.io/warn": "privileged",
    MANAGED: "true",
}
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "no kubelet: Ready set by the test"}  # fmt: skip


def annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def daemon_pod_name(node: str) -> str:
    return f"machine-config-daemon-{node}"


# -- the hosted side, as hcp-up makes it ---------------------------------------------------------


@dataclass
class HostedNodePool:
    """One InPlace NodePool's hosted side on a running FakeKube (see the module docstring)."""

    kube: FakeKube
    name: str
    nodes: list[str]
    base: Path
    max_unavailable: int = 1
    cp_namespace: str = CP_NAMESPACE
    infra_id: str = INFRA_ID
    rbac: tuple[dict[str, Any], ...] = ()  # RBAC documents applied for this NodePool

    @classmethod
    def create(cls, kube: FakeKube, name: str, nodes: int, base: Path, *,
               max_unavailable: int = 1, rbac: Path | None = None) -> HostedNodePool:  # fmt: skip
        """The server must be started: the kubeconfigs carry its port. The same pool twice
        is refused, as hcp-up refuses it. `rbac`: a manifest with NODEPOOL to replace (as
        deploy/hypershift/rbac.yaml's header says), applied beside the kit's grant."""
        if not kube.running:
            raise RuntimeError("start the FakeKube first: the node kubeconfigs carry its port")
        if kube.try_get("nodes", f"{name}-0") is not None:
            raise ValueError(f"nodepool {name} exists already")
        documents: tuple[dict[str, Any], ...] = ()
        if rbac is not None:
            text = Path(rbac).read_text().replace("NODEPOOL", name)
            documents = tuple(d for d in yaml.safe_load_all(text) if d)
        pool = cls(kube, name, [f"{name}-{k}" for k in range(nodes)], Path(base),
                   max_unavailable, rbac=documents)  # fmt: skip
        pool.base.mkdir(parents=True, exist_ok=True)
        kube.put({"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": pool.upgrade_namespace}})  # fmt: skip
        for k, node in enumerate(pool.nodes):
            kube.put(pool._node_object(k, node))
            kube.write_kubeconfig(pool.kubeconfig(node), pool.identity(node))
        return pool

    @property
    def upgrade_namespace(self) -> str:
        return f"{self.name}-upgrade"

    @property
    def configmap(self) -> str:
        return f"{self.name}-upgrade"

    def machine(self, node: str) -> str:
        return f"{self.name}-machine-{self.nodes.index(node)}"

    def node_rules(self, node: str = "") -> list[Rule]:
        """The kit's Role `kit-node-read-upgrade-config`, bound to group system:nodes, and
        what `rbac` grants the node's kubelet."""
        kit = [Rule(verb, "", "configmaps", namespace=self.upgrade_namespace)
               for verb in ("get", "list", "watch")]  # fmt: skip
        return [*kit, *(r for r in node_rules(self.rbac, node) if r not in kit)]

    def identity(self, node: str) -> Identity:
        return self.kube.node_identity(node, self.node_rules(node))

    def kubeconfig(self, node: str) -> Path:
        return self.base / f"node-{node}.kubeconfig"

    def _node_object(self, k: int, node: str) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "node-role.kubernetes.io/worker": "",
                  NODE_POOL: self.name}  # fmt: skip
        notes = {"volumes.kubernetes.io/controller-managed-attach-detach": "true",
                 CAPI + "machine": f"{self.name}-machine-{k}",
                 CAPI + "cluster-namespace": self.cp_namespace,
                 CAPI + "cluster-name": self.infra_id,
                 CAPI + "owner-kind": "MachineSet", CAPI + "owner-name": self.name}  # fmt: skip
        info = {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.32.0",
                "containerRuntimeVersion": "cri-o://kit", "osImage": "kit"}  # fmt: skip
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": labels, "annotations": notes},
                "spec": {}, "status": {"conditions": [dict(READY)], "nodeInfo": info}}  # fmt: skip


# -- a controller-runtime work queue, one key -----------------------------------------------------


class _KeyWorker:
    """One key of a controller-runtime work queue and its worker: events while a pass waits
    coalesce into it, events during a pass make one more; a pass returns seconds to requeue
    after (RequeueAfter) or None; a pass that raises comes back after `backoff(failures)`
    (AddRateLimited; Forget on success)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run: Callable[[], Awaitable[float | None]],
                 *, delay: float, backoff: Callable[[int], float]) -> None:  # fmt: skip
        self._loop = loop
        self._run = run
        self._delay = delay
        self._backoff = backoff
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False
        self.failures = 0
        self._task = loop.create_task(self._main())

    def add(self) -> None:
        self._wake.set()

    def _add_after(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._wake.set)

    @property
    def busy(self) -> bool:
        return self._busy or self._wake.is_set()

    async def _main(self) -> None:
        while True:
            await self._wake.wait()
            self._busy = True
            try:
                if self._delay:
                    await asyncio.sleep(self._delay)
                self._wake.clear()
                try:
                    again = await self._run()
                except Exception:  # the owner recorded it
                    self.failures += 1
                    again = self._backoff(self.failures)
                else:
                    self.failures = 0
                if again is not None:
                    self._add_after(again)
            finally:
                self._busy = False

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


# -- the in-place upgrader ---------------------------------------------------------------------


class ReconcileError(Exception):
    """An error the upgrader's Reconcile returns (controller-runtime retries with backoff)."""


class UpstreamPanic(ReconcileError):
    """A Go runtime panic in the real upgrader, which controller-runtime recovers and retries."""


@dataclass
class Machine:
    name: str
    node: str  # status.nodeRef.name
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class TokenSecret:
    """`token-<np>-<hash>` in the control-plane namespace (§15 step 3), values decoded."""

    name: str
    data: dict[str, str]
    annotations: dict[str, str]


@dataclass
class MachineSet:
    name: str
    namespace: str
    annotations: dict[str, str]
    replicas: int
    version: str  # spec.template.spec.version
    data_secret_name: str  # spec.template.spec.bootstrap.dataSecretName


# The order the upgrader's cache lists the Machines in.
Listing = Callable[[list[Machine]], list[Machine]]


def needs_upgrade(node: dict[str, Any], target: str) -> bool:
    """Not done with `target` (inplaceupgrader.go:708-724, §15 step 8)."""
    a = annotations(node)
    return (a.get(DESIRED_DRAIN, "") != a.get(LAST_APPLIED_DRAIN, "")
            or a.get(CURRENT_CONFIG, "") != target or a.get(STATE, "") != "Done")  # fmt: skip


def needs_pod(node: dict[str, Any]) -> bool:
    """Whether the Node gets an upgrade pod: not (current = desired, drain settled, Done)
    (inplaceupgrader.go:316-373, §15 step 13)."""
    a = annotations(node)
    settled = (a.get(CURRENT_CONFIG, "") == a.get(DESIRED, "")
               and a.get(DESIRED_DRAIN, "") == a.get(LAST_APPLIED_DRAIN, "")
               and a.get(STATE, "") == "Done")  # fmt: skip
    return not settled


def capacity(nodes: list[dict[str, Any]], max_unavailable: int) -> int:
    """maxUnavailable minus the Nodes with currentConfig ≠ desiredConfig (§15 step 12;
    only the annotations count: no readiness, no cordon)."""
    busy = sum(1 for n in nodes if _updating(n))
    return max_unavailable - busy


def _updating(node: dict[str, Any]) -> bool:
    a = annotations(node)
    return a.get(CURRENT_CONFIG, "") != a.get(DESIRED, "")


def _go_append_cap(length: int) -> int:
    """cap() of a Go slice of pointers grown by appending `length` items one at a time to nil:
    doubling from 1 while under 256 items (runtime.growslice); beyond that only an estimate."""
    cap = 1
    while cap < length:
        cap *= 2
    return cap


def available_candidates(nodes: list[dict[str, Any]], target: str,
                         free: int) -> list[dict[str, Any] | None]:  # fmt: skip
    """Nodes not aimed at `target` and not updating, the first `free` of them, with the
    upstream slicing bug (inplaceupgrader.go:560-581): None stands for a nil *Node."""
    if free < 1:
        return []
    found: list[dict[str, Any] | None] = [
        n for n in nodes
        if annotations(n).get(DESIRED, "") != target and not _updating(n)
    ]  # fmt: skip
    if not found:
        return []
    if free > len(found):
        cap = _go_append_cap(len(found))
        if free > cap:
            raise UpstreamPanic(
                f"runtime error: slice bounds out of range [:{free}] with capacity {cap}"
            )
        found += [None] * (free - len(found))
    return found[:free]


def already_unavailable(nodes: list[dict[str, Any]], target: str) -> list[dict[str, Any]]:
    """Nodes in flight to an older target: they are re-aimed at the new one (the daemon jumps
    to the latest ConfigMap; §15 step 12)."""
    return [n for n in nodes if _updating(n) and annotations(n).get(DESIRED, "") != target]


def nodes_to_upgrade(nodes: list[dict[str, Any]], target: str,
                     max_unavailable: int) -> list[dict[str, Any] | None]:  # fmt: skip
    free = capacity(nodes, max_unavailable)
    return [*available_candidates(nodes, target, free), *already_unavailable(nodes, target)]


class InPlaceUpgrader:
    """HyperShift's `inplaceupgrader` for one HostedNodePool (module docstring). The MachineSet,
    its Machines and the token Secrets live in this object (`machineset`, `machines`,
    `secrets`); `set_target` plays hcp-target. Counters: `reconciles`, `errors` (the message
    of each failed reconcile, in order), `panics`; `selected` lists (node, target) at each
    desiredConfig write that changed a Node.

    Timing: `delay` batches the events of one pass (the real one answered in 10-30 ms);
    `requeue_after` while a rollout runs (30 s), `payload_requeue` while the token Secret has no
    payload (5 s); failures back off from `backoff_base` doubling to `backoff_max`
    (controller-runtime's default per-item limiter: 5 ms to 1000 s)."""

    def __init__(self, kube: FakeKube, pool: HostedNodePool, *,
                 release_version: str = RELEASE_VERSION_DEFAULT,
                 release_image: str = RELEASE_IMAGE_DEFAULT,
                 mco_image: str = MCO_IMAGE_DEFAULT, delay: float = 0.01,
                 requeue_after: float = 30.0, payload_requeue: float = 5.0,
                 backoff_base: float = 0.005, backoff_max: float = 1000.0,
                 listing: Listing | None = None) -> None:  # fmt: skip
        self.kube = kube
        self.pool = pool
        self.listing = listing
        self.release_version = release_version
        self.release_image = release_image
        self.mco_image = mco_image
        self.delay = delay
        self.requeue_after = requeue_after
        self.payload_requeue = payload_requeue
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        # As hcp-up makes a new MachineSet: target = current, so nothing happens on it.
        initial = fnv32a(f"kit-initial:{pool.name}".encode())
        self.machineset = MachineSet(
            pool.name, pool.cp_namespace,
            {NODE_POOL: f"{CLUSTER_NAMESPACE}/{pool.name}",
             MAX_UNAVAILABLE: str(pool.max_unavailable), TARGET: initial, CURRENT: initial},
            len(pool.nodes), release_version, f"user-data-{pool.name}-{initial}",
        )  # fmt: skip
        self.machines = {pool.machine(n): Machine(pool.machine(n), n) for n in pool.nodes}
        self.secrets: dict[str, TokenSecret] = {}
        self.reconciles = 0
        self.errors: list[str] = []
        self.panics = 0
        self.selected: list[tuple[str, str]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: _KeyWorker | None = None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._worker is not None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin reconciling, with a first pass at once (a controller lists at start)."""
        if self._worker is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._worker = _KeyWorker(self._loop, self._pass, delay=self.delay, backoff=self._backoff)
        self.kube.add_hook(self._on_change)
        self._worker.add()

    async def stop(self) -> None:
        self.kube.remove_hook(self._on_change)
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.stop()

    def _backoff(self, failures: int) -> float:
        return min(self.backoff_base * 2 ** (failures - 1), self.backoff_max)

    def _poke(self) -> None:
        if self._worker is not None:
            self._worker.add()

    def _on_change(self, change: Change) -> None:
        # nodeToMachineSet: the Node's CAPI annotations name one of our Machines.
        if change.rt.plural != "nodes" or self._loop is None:
            return
        a = annotations(change.obj)
        machine = self.machines.get(a.get(CAPI + "machine", ""))
        if machine is None or a.get(CAPI + "cluster-namespace") != self.machineset.namespace:
            return
        with contextlib.suppress(RuntimeError):  # loop closed: nothing left to reconcile
            self._loop.call_soon_threadsafe(self._poke)

    # -- what the NodePool controller and the ignition server do (hcp-target) -----------------
    @property
    def target(self) -> str:
        return self.machineset.annotations[TARGET]

    @property
    def current(self) -> str:
        return self.machineset.annotations[CURRENT]

    def set_target(self, config: bytes | str | dict[str, Any], *, hash: str | None = None,
                   release_version: str | None = None,
                   release_image: str | None = None) -> str:  # fmt: skip
        """A new target config, as hcp-target writes it: the token Secret with the payload,
        then the MachineSet's target config version. `config`: Ignition bytes, a payload or a
        dict (hypershift_payload.target_ignition). Returns the hash (default FNV-32a of the
        Ignition bytes and the release version)."""
        version = release_version or self.release_version
        raw = target_ignition(config)
        # A payload is kept as given; anything else is compressed as hcp-target does.
        payload = config if isinstance(config, str) else encode_ignition(raw)
        h = hash or config_hash(raw, version)
        name = f"token-{self.pool.name}-{h}"
        self.secrets[name] = TokenSecret(
            name,
            {"token": str(uuid.uuid4()), "release": release_image or self.release_image,
             "release-version": version, "payload": payload, "reason": "AsExpected",
             "message": "Payload generated successfully"},
            {HS + "ignition-config": "true", HS + "node-pool-upgrade-type": "InPlace",
             NODE_POOL: f"{CLUSTER_NAMESPACE}/{self.pool.name}"},
        )  # fmt: skip
        self.machineset.annotations[TARGET] = h
        self.machineset.version = version
        self.machineset.data_secret_name = f"user-data-{self.pool.name}-{h}"
        self._poke()
        return h

    def set_max_unavailable(self, value: int | str) -> None:
        self.machineset.annotations[MAX_UNAVAILABLE] = str(value)
        self._poke()

    async def completed(self, hash: str, timeout: float | None = None) -> None:
        """Until the MachineSet's current config version is `hash` (the rollout's end)."""
        async with asyncio.timeout(timeout):
            while self.machineset.annotations.get(CURRENT) != hash:
                await asyncio.sleep(0.01)

    async def idle(self, timeout: float = 5.0) -> None:
        """Until no pass is running or queued (a timer due later does not count)."""
        async with asyncio.timeout(timeout):
            await asyncio.sleep(0)
            while self._worker is not None and self._worker.busy:
                await asyncio.sleep(0.005)

    # -- Reconcile ---------------------------------------------------------------------------
    async def _pass(self) -> float | None:
        self.reconciles += 1
        before = dict(self.machineset.annotations)
        try:
            return self._reconcile()
        except UpstreamPanic as exc:
            self.panics += 1
            self.errors.append(str(exc))
            log.warning("upgrader %s: Observed a panic: %s (known upstream bug: "
                        "getAvailableCandidates, inplaceupgrader.go:560-581)",
                        self.pool.name, exc)  # fmt: skip
            raise
        except ReconcileError as exc:
            self.errors.append(str(exc))
            log.info("upgrader %s: Reconciler error: %s", self.pool.name, exc)
            raise
        finally:
            if self.machineset.annotations != before:
                self._poke()  # it watches MachineSets: its own write comes back as an event

    def _reconcile(self) -> float | None:
        """One Reconcile (inplaceupgrader.go:80-165, then reconcileInPlaceUpgrade 178-297)."""
        ms = self.machineset.annotations
        target = ms.get(TARGET)
        if target is None or target == ms.get(CURRENT):
            return None
        secret = self.secrets.get(f"token-{self.pool.name}-{target}")
        if secret is None:
            raise ReconcileError(f'secrets "token-{self.pool.name}-{target}" not found')
        if "payload" not in secret.data:
            return self.payload_requeue
        release_version = secret.data.get("release-version")
        if not release_version:
            raise ReconcileError(f"token secret {secret.name} has no release-version")
        nodes = self._nodes()
        if not any(needs_upgrade(n, target) for n in nodes):
            self._delete_pods(nodes)
            ms[CURRENT] = target
            ms.pop(IN_PROGRESS_TRUE, None)
            ms.pop(IN_PROGRESS_FALSE, None)
            return None
        needing = 0
        for node in nodes:
            a = annotations(node)
            if a.get(STATE) == "Degraded":
                name, reason = node["metadata"]["name"], a.get(REASON, "")
                ms.pop(IN_PROGRESS_TRUE, None)
                ms[IN_PROGRESS_FALSE] = f"Node {name} in nodepool degraded: {reason}"
                raise ReconcileError(f"degraded node {name} found, cannot progress in-place "
                                     f"upgrade. Degraded reason: {reason}")  # fmt: skip
            needing += needs_upgrade(node, target)
        ms.pop(IN_PROGRESS_FALSE, None)
        ms[IN_PROGRESS_TRUE] = (
            f"Nodepool update in progress. Target Config version: {target}. "
            f"Total Nodes: {len(nodes)}. Upgraded: {len(nodes) - needing}"
        )
        by_node = {m.node: m for m in self.machines.values()}
        for node in nodes:
            if not needs_upgrade(node, target):
                by_node[node["metadata"]["name"]].annotations[RELEASE_VERSION] = release_version
        self._manifests(target, secret.data["payload"])
        try:
            max_unavailable = int(ms.get(MAX_UNAVAILABLE, "1"))
        except ValueError as exc:
            raise ReconcileError("error getting max unavailable count from MachineSet "
                                 f"annotation: {exc}") from None  # fmt: skip
        for node in nodes_to_upgrade(nodes, target, max_unavailable):
            if node is None:
                raise UpstreamPanic("runtime error: invalid memory address or nil pointer "
                                    "dereference")  # fmt: skip
            name = node["metadata"]["name"]
            if annotations(self.kube.try_get("nodes", name)).get(DESIRED) != target:
                self.kube.patch_annotations("nodes", name, {DESIRED: target})
                self.selected.append((name, target))
        self._reconcile_pods(nodes)
        return self.requeue_after

    def _nodes(self) -> list[dict[str, Any]]:
        """The Machines' nodeRefs, in the order the cache lists the Machines (`listing`)."""
        nodes = []
        machines = list(self.machines.values())
        for machine in self.listing(machines) if self.listing else machines:
            node = self.kube.try_get("nodes", machine.node)
            if node is None:
                raise ReconcileError(f'error getting node: nodes "{machine.node}" not found')
            nodes.append(node)
        return nodes

    def _manifests(self, target: str, payload: str) -> None:
        """Namespace labels, then ConfigMap {config: payload as is, hash: target}, updated in
        place (inplaceupgrader.go:583-625, 748-763). Written before any Node is selected."""
        ns = self.pool.upgrade_namespace
        if self.kube.try_get("namespaces", ns) is None:
            self.kube.put({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": ns, "labels": dict(NAMESPACE_LABELS)}})  # fmt: skip
        else:
            self.kube.patch_labels("namespaces", ns, dict(NAMESPACE_LABELS))
        data = {"config": payload, "hash": target}
        name = self.pool.configmap
        cm = self.kube.try_get("configmaps", name, ns)
        if cm is None:
            self.kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": ns,
                                        "labels": {MANAGED: "true"}},
                           "data": data})  # fmt: skip
        elif cm.get("data") != data:

            def edit(obj: dict[str, Any]) -> None:
                obj["data"] = data
                obj["metadata"].setdefault("labels", {})[MANAGED] = "true"

            self.kube.mutate("configmaps", name, edit, ns)

    def _reconcile_pods(self, nodes: list[dict[str, Any]]) -> None:
        ns = self.pool.upgrade_namespace
        for node in nodes:
            name = node["metadata"]["name"]
            pod = self.kube.try_get("pods", daemon_pod_name(name), ns)
            terminating = bool(pod and pod["metadata"].get("deletionTimestamp"))
            if not needs_pod(node):
                if pod is not None and not terminating:
                    self._delete_pod(name)  # idle on a Done node
                continue
            if pod is not None and not terminating and \
                    pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):  # fmt: skip
                self._delete_pod(name)  # so that it is made again (here: at once)
                pod = None
            if pod is None:
                self.kube.put(self._pod(name))

    def _delete_pods(self, nodes: list[dict[str, Any]]) -> None:
        for node in nodes:
            self._delete_pod(node["metadata"]["name"])

    def _delete_pod(self, node: str) -> None:
        with contextlib.suppress(ApiError):  # not found
            self.kube.delete("pods", daemon_pod_name(node), self.pool.upgrade_namespace)

    def _pod(self, node: str) -> dict[str, Any]:
        """createUpgradePod (inplaceupgrader.go:399-470, §15 step 13). No scheduler
        and no kubelet here: it stays Pending with no spec.nodeName, as on the kit."""
        mounts = [{"name": "rootfs", "mountPath": "/rootfs"},
                  {"name": "desired-config-mount",
                   "mountPath": "/rootfs/etc/machine-config-daemon-desired-config"}]  # fmt: skip
        container = {
            "name": "machine-config-daemon", "image": self.mco_image,
            "command": ["/usr/bin/machine-config-daemon"],
            "args": ["start", f"--node-name={node}", "--root-mount=/rootfs",
                     "--kubeconfig=/var/lib/kubelet/kubeconfig",
                     "--desired-configmap=/etc/machine-config-daemon-desired-config"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"privileged": True}, "volumeMounts": mounts,
        }  # fmt: skip
        volumes = [{"name": "rootfs", "hostPath": {"path": "/"}},
                   {"name": "desired-config-mount",
                    "configMap": {"name": self.pool.configmap}}]  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": daemon_pod_name(node),
                             "namespace": self.pool.upgrade_namespace,
                             "labels": {MANAGED: "true"}},
                "spec": {"containers": [container], "hostNetwork": True, "hostPID": True,
                         "tolerations": [{"operator": "Exists"}],
                         "nodeSelector": {"kubernetes.io/hostname": node},
                         "volumes": volumes, "restartPolicy": "OnFailure"},
                "status": {"phase": "Pending"}}  # fmt: skip


# -- the drainer -------------------------------------------------------------------------------


class DrainError(Exception):
    pass


class Drainer:
    """HyperShift's `drainer` (drainer.go:46-154, setup.go:29-34; §15 step 16): on any
    Node whose `desiredDrain` ≠ `lastAppliedDrain`, the word before the first `-`: `drain`
    cordons (spec.unschedulable=true) and evicts the pods bound to the Node (kubectl's drain
    helper: DaemonSet and mirror pods and `machine-config-daemon-<node>` skipped, a 429 retried
    every `evict_retry` s within `drain_timeout`); `uncordon` uncordons; anything else fails.
    Then `lastAppliedDrain` = the Node's `desiredDrain` as it reads it then (CreateOrUpdate
    reads the Node again). Each Node has its own worker (MaxConcurrentReconciles 10 there).

    `delay` before each pass (the real one answered in 10-30 ms). A failed pass is retried
    after `retry_period` (drainer.go: every minute). By controller-runtime's
    reconcileHandler, an error makes it ignore the returned RequeueAfter and back off from
    5 ms instead; each attempt lasts up to the helper's 90 s timeout when a PDB blocks, so the
    minute is the order of magnitude either way."""

    def __init__(self, kube: FakeKube, *, delay: float = 0.05, retry_period: float = 60.0,
                 drain_timeout: float = 90.0, evict_retry: float = 5.0) -> None:  # fmt: skip
        self.kube = kube
        self.delay = delay
        self.retry_period = retry_period
        self.drain_timeout = drain_timeout
        self.evict_retry = evict_retry
        self.handled: list[tuple[str, str]] = []  # (node, lastAppliedDrain written)
        self.failures: list[tuple[str, str]] = []  # (node, error)
        self.evicted: list[tuple[str, str]] = []  # (namespace, pod)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: dict[str, _KeyWorker] = {}
        self._active = False

    @property
    def active(self) -> bool:
        return self._active

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin reacting; requests made while stopped are picked up at once."""
        if self._active:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._active = True
        self.kube.add_hook(self._on_change)
        for node in self.kube.list("nodes"):
            if self._wanted(node):
                self._enqueue(node["metadata"]["name"])

    async def stop(self) -> None:
        self.kube.remove_hook(self._on_change)
        self._active = False
        workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            await worker.stop()

    async def idle(self, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            await asyncio.sleep(0)
            while any(w.busy for w in self._workers.values()):
                await asyncio.sleep(0.005)

    @staticmethod
    def _wanted(node: dict[str, Any] | None) -> bool:
        a = annotations(node)
        return a.get(DESIRED_DRAIN, "") != a.get(LAST_APPLIED_DRAIN, "")

    def _on_change(self, change: Change) -> None:
        if change.rt.plural != "nodes" or change.type == "DELETED" or self._loop is None:
            return
        if self._wanted(change.obj):
            with contextlib.suppress(RuntimeError):  # loop closed
                self._loop.call_soon_threadsafe(self._enqueue, change.obj["metadata"]["name"])

    def _enqueue(self, node: str) -> None:
        if not self._active:
            return
        worker = self._workers.get(node)
        if worker is None:
            assert self._loop is not None
            worker = self._workers[node] = _KeyWorker(
                self._loop, lambda: self._pass(node), delay=self.delay,
                backoff=lambda _: self.retry_period,
            )  # fmt: skip
        worker.add()

    async def _pass(self, name: str) -> float | None:
        node = self.kube.try_get("nodes", name)
        if not self._wanted(node):
            return None
        want = annotations(node).get(DESIRED_DRAIN, "")
        verb = want.split("-")[0]
        try:
            if verb == "uncordon":
                self._cordon(name, False)
            elif verb == "drain":
                self._cordon(name, True)
                await self._drain(name)
            else:
                raise DrainError(f"unknown drain verb in drain request {want}: {verb}")
        except DrainError as exc:
            self.failures.append((name, str(exc)))
            log.info("drainer: failed to drain node %s: %s", name, exc)
            raise
        with contextlib.suppress(ApiError):  # the Node went away meanwhile

            def echo(obj: dict[str, Any]) -> None:
                notes = obj["metadata"].setdefault("annotations", {})
                notes[LAST_APPLIED_DRAIN] = notes.get(DESIRED_DRAIN, "")
                self.handled.append((name, notes[LAST_APPLIED_DRAIN]))

            self.kube.mutate("nodes", name, echo)
        return None

    def _cordon(self, name: str, cordoned: bool) -> None:
        node = self.kube.try_get("nodes", name) or {}
        if bool(node.get("spec", {}).get("unschedulable")) != cordoned:
            self.kube.patch("nodes", name, {"spec": {"unschedulable": True if cordoned else None}})

    async def _drain(self, name: str) -> None:
        deadline = time.monotonic() + self.drain_timeout
        pods = [p for p in self.kube.list("pods", field_selector=f"spec.nodeName={name}")
                if p["metadata"]["name"] != daemon_pod_name(name) and not _skipped(p)]  # fmt: skip
        for pod in pods:
            ns, pname = pod["metadata"]["namespace"], pod["metadata"]["name"]
            while True:
                try:
                    evict(self.kube.store, self.kube.registry, ns, pname, None,
                          pods_vanish=self.kube.evicted_pods_vanish)  # fmt: skip
                    self.evicted.append((ns, pname))
                    break
                except ApiError as err:
                    if err.code == 404:
                        break
                    if err.code != 429:
                        raise DrainError(f"drain failed: error when evicting pods/{pname} -n "
                                         f"{ns}: {err}") from None  # fmt: skip
                if time.monotonic() >= deadline:
                    raise DrainError(f"drain failed: failed to drain node {name}: global "
                                     f"timeout reached: {self.drain_timeout:g}s")  # fmt: skip
                await asyncio.sleep(self.evict_retry)
        # The helper waits until the evicted pods are gone.
        uids = {p["metadata"].get("uid") for p in pods}
        selector = f"spec.nodeName={name}"
        while any(p["metadata"].get("uid") in uids
                  for p in self.kube.list("pods", field_selector=selector)):  # fmt: skip
            if time.monotonic() >= deadline:
                raise DrainError(f"drain failed: failed to drain node {name}: global timeout "
                                 f"reached: {self.drain_timeout:g}s")  # fmt: skip
            await asyncio.sleep(0.05)


def _skipped(pod: dict[str, Any]) -> bool:
    """IgnoreAllDaemonSets, and mirror pods (kubectl never deletes those)."""
    meta = pod["metadata"]
    return any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []) or (
        "kubernetes.io/config.mirror" in (meta.get("annotations") or {})
    )
