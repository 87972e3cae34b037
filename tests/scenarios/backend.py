"""What a pool's cluster must offer the pool scenarios (tests/scenarios/pool.py MccCluster): an
API server with a pool controller, real (tests/conformance/kit.py KitCluster) or stand-in
(tests/scenarios/standin.py StandInCluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.scenarios.rest import AdminClient

MCO_NS = "openshift-machine-config-operator"


class PoolBackend(AdminClient):
    """An API server with a pool controller: what MccCluster needs of it."""

    controller = ""  # which controller drives the pool, for the figures and the bench

    async def up(self) -> None:
        raise NotImplementedError

    async def down(self) -> None:
        raise NotImplementedError

    async def mcc_up(self, workers: int, os_image: str) -> str:
        """Pools, ControllerConfig, Nodes worker-0..N-1 and the controller; returns the
        worker pool's first rendered config."""
        raise NotImplementedError

    async def apply_rbac(self, path: Path) -> None:
        """deploy/rbac.yaml, as an operator applies it."""
        raise NotImplementedError

    async def token_for(self, service_account: str, namespace: str = MCO_NS) -> str:
        raise NotImplementedError

    def node_kubeconfig(self, node: str) -> Path:
        raise NotImplementedError

    # A change that should cause no render has no event to wait on: the scenarios wait this
    # long after the controllers have seen it (the real ones requeue about every 5 s).
    requeue_period = 6.0

    async def add_kubelet_config(self, name: str, kubelet_config: dict[str, Any]) -> None:
        """A KubeletConfig for the worker pool, and what its controller makes of it."""
        raise NotImplementedError

    async def delete_kubelet_config(self, name: str) -> None:
        raise NotImplementedError

    async def controller_config_seen(self, timeout: float = 60.0) -> None:
        """Until the controllers have processed the ControllerConfig's spec."""
        raise NotImplementedError
