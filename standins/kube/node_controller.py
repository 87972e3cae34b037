"""A stand-in for the machine-config-controller's node controller on the loopback server, for
the tests and the rollout benchmark when no real controller binary was supplied.

On every change to Nodes, MachineConfigPools or MachineConfigNodes it syncs each pool as the
real one's syncMachineConfigPool does (rules in pool_rules.py, each citing the controller's
code): the UpdateInProgress:PreferNoSchedule taint on the pool's Nodes that are not at its
config, `desiredConfig` (and no `desiredImage`) on the candidates the pool's maxUnavailable
leaves room for, MachineConfigNode `spec.configVersion.desired` for them, then the pool's
status (counts, configuration, Updated/Updating/NodeDegraded/Degraded). It writes through the
in-process store, as the drain controller stand-in does, after `delay` seconds (the real one
batches events; it set desiredConfig 5-10 s after a MachineConfig was created, render
included). Not written: the controller's Events on the pool.

`listing` orders the Nodes as the real controller's lister hands them over (its informer's
cache, in no fixed order); the candidates' sort (pool_rules.sort_candidates, by zone and age) is
stable here, so `listing` decides among Nodes that tie, as Go's unstable sort.Slice of the
lister's Nodes does there. Default: by name, the order the store lists them in."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import pool_rules
from .errors import ApiError
from .reconciler import Reconciler

if TYPE_CHECKING:
    from .store_api import StoreApi

WATCHED = frozenset({"nodes", "machineconfigpools", "machineconfignodes"})


class NodeController(Reconciler):
    watched = WATCHED

    def __init__(
        self,
        kube: StoreApi,
        *,
        delay: float = 0.0,
        listing: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
    ) -> None:
        super().__init__(kube, delay=delay)
        self.listing = listing
        self.targeted: list[tuple[str, str]] = []  # (node, config) in the order they were set

    def sync(self) -> None:
        """One pass over every pool, as the real workers would make one per pool key."""
        pools = self.kube.list("machineconfigpools")
        for pool in pools:
            if not pool_rules.target(pool):
                continue  # unconfigured: the renderer has not named a config yet
            name = pool["metadata"]["name"]
            members = pool_rules.nodes_for_pool(pool, pools, self.kube.list("nodes"))
            if self.listing is not None:
                members = self.listing(members)
            if not (pool.get("spec") or {}).get("paused"):
                for node in members:
                    self._taint(node, pool_rules.needs_taint(node, pool))
                for node in pool_rules.candidates(pool, members):
                    self._target(node["metadata"]["name"], pool_rules.target(pool))
            self._status(name)

    def _taint(self, node: dict[str, Any], wanted: bool) -> None:
        taint = pool_rules.UPDATE_IN_PROGRESS_TAINT

        def ours(t: dict[str, Any]) -> bool:
            return t.get("key") == taint["key"] and t.get("effect") == taint["effect"]

        if any(ours(t) for t in (node.get("spec") or {}).get("taints") or []) == wanted:
            return

        def edit(obj: dict[str, Any]) -> None:
            kept = [t for t in obj.setdefault("spec", {}).get("taints") or [] if not ours(t)]
            obj["spec"]["taints"] = [*kept, dict(taint)] if wanted else kept
            if not obj["spec"]["taints"]:
                del obj["spec"]["taints"]

        with contextlib.suppress(ApiError):  # the Node went away meanwhile
            self.kube.mutate("nodes", node["metadata"]["name"], edit)

    def _target(self, node: str, config: str) -> None:
        with contextlib.suppress(ApiError):
            aim = {pool_rules.DESIRED: config, pool_rules.DESIRED_IMAGE: None}
            self.kube.patch_annotations("nodes", node, aim)
            self.targeted.append((node, config))
        if self.kube.try_get("machineconfignodes", node) is not None:

            def desired(mcn: dict[str, Any]) -> None:
                mcn.setdefault("spec", {}).setdefault("configVersion", {})["desired"] = config

            with contextlib.suppress(ApiError):
                self.kube.mutate("machineconfignodes", node, desired)

    def _status(self, name: str) -> None:
        pool = self.kube.try_get("machineconfigpools", name)
        if pool is None:
            return
        pools = self.kube.list("machineconfigpools")
        members = pool_rules.nodes_for_pool(pool, pools, self.kube.list("nodes"))
        mcns = {m["metadata"]["name"]: m for m in self.kube.list("machineconfignodes")}
        status = pool_rules.pool_status(pool, members, mcns)
        if status == pool.get("status"):
            return

        def replace(obj: dict[str, Any]) -> None:
            obj["status"] = status

        with contextlib.suppress(ApiError):
            self.kube.mutate("machineconfigpools", name, replace, subresource="status")
