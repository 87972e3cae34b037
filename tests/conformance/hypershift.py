"""HyperShift's real in-place upgrader and drainer as a `HostedBackend`
(tests/scenarios/hostedpool.py): the kit's `hypershift-inplace`, which `hcp-up` starts with the
NodePool's objects and `hcp-target` drives, on one kit cluster. The HyperShift scenarios written
against the stand-ins (`StandInHosted`) run on it unchanged.

Not run in this workspace (no peer binaries): tests/conformance/peers.py looks up
`hypershift-inplace` as it looks up the machine-config-controller, and a test marked
`peers("hypershift-inplace")` is listed as not run when nobody supplied it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conformance.kit import KitCluster, _script
from tests.scenarios.hostedpool import HostedBackend
from tests.scenarios.hypershift_payload import target_ignition
from tests.scenarios.hypershift_standin import CP_NAMESPACE

CAPI_PATH = f"/apis/cluster.x-k8s.io/v1beta1/namespaces/{CP_NAMESPACE}"


@dataclass
class KitHosted(KitCluster, HostedBackend):
    """`up`/`down` are KitCluster's (cluster-up; cluster-down also runs hcp-down). `hcp_up`
    adds node identities, which restarts the API server once (about 6 s): the harness starts
    its watch and the agents only after it."""

    targets: int = 0

    controller = "HyperShift's inplaceupgrader and drainer (the kit's hypershift-inplace)"

    async def hcp_up(self, nodepool: str, nodes: int, max_unavailable: int) -> list[str]:
        await self._kit_script("hcp-up", "--nodepool", nodepool, "--nodes", str(nodes),
                               "--max-unavailable", str(max_unavailable))  # fmt: skip
        return [f"{nodepool}-{k}" for k in range(nodes)]

    def node_kubeconfig(self, nodepool: str, node: str) -> Path:  # type: ignore[override]
        return self.run / f"node-{node}.kubeconfig"

    async def set_target(self, nodepool: str, config: bytes | str | dict[str, Any], *,
                         hash: str | None = None,
                         release_version: str | None = None) -> str:  # fmt: skip
        self.targets += 1
        ign = self.run / f"target-{self.targets}.ign"
        ign.write_bytes(target_ignition(config))
        args = ["--nodepool", nodepool, "--ignition", str(ign), *(["--hash", hash] if hash else [])]
        env = {"KIT_BIN": str(self.kit.bin)}
        if release_version:
            env["KIT_TARGET_RELEASE_VERSION"] = release_version
        out = await _script(str(self.kit.path / "hcp-target"), str(self.run), *args, env=env,
                            log=self.run / "harness.log")  # fmt: skip
        return out.strip().splitlines()[-1]

    async def machineset(self, nodepool: str) -> dict[str, str]:
        ms = await self.call("GET", f"{CAPI_PATH}/machinesets/{nodepool}")
        return ms["metadata"].get("annotations") or {}

    async def machines(self, nodepool: str) -> dict[str, dict[str, str]]:
        selector = {"labelSelector": f"cluster.x-k8s.io/set-name={nodepool}"}
        listed = await self.call("GET", f"{CAPI_PATH}/machines", params=selector)
        return {m["metadata"]["name"]: m["metadata"].get("annotations") or {}
                for m in listed["items"]}  # fmt: skip
