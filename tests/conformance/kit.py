"""The conformance kit (`../shared/kit`): where it is, the peer binaries the user supplied, and
one real cluster (etcd + kube-apiserver, optionally the machine-config-controller) per test, each in
its own RUN DIR on its own ports. Only the PIDs the kit's scripts record in that RUN DIR are
ever signalled."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conformance import peers
from tests.scenarios.backend import MCO_NS, PoolBackend
from tests.scenarios.rest import put_object

KIT_ENV = "IMAGE_MODE_AGENT_KIT"
HOW_TO_GET_IT = (
    f"set {KIT_ENV} to the conformance kit's folder (in this project's workspace: "
    "../shared/kit beside the repository; it holds cluster-up, mcc-up, crds/ and a README)"
)
MCA = "machineconfiguration.openshift.io"
SCRIPT_TIMEOUT = 180.0


class KitMissing(Exception):
    """The tier cannot run: says what is missing and how to get it; `found` is where each
    binary was found, when the kit itself was."""

    def __init__(self, message: str, found: dict[str, peers.Found] | None = None) -> None:
        super().__init__(message)
        self.found = found


@dataclass(frozen=True)
class Kit:
    """The kit's scripts (`path`) and one folder holding the peer binaries found (`bin`, the
    kit's KIT_BIN), with where each came from."""

    path: Path
    bin: Path
    found: dict[str, peers.Found]


def locate_kit() -> Path:
    value = os.environ.get(KIT_ENV)
    if not value:
        raise KitMissing(f"{KIT_ENV} is not set: {HOW_TO_GET_IT}")
    kit = Path(value).resolve()
    missing = [p for p in ("cluster-up", "mcc-up", "unpack", "crds") if not (kit / p).exists()]
    if missing:
        raise KitMissing(f"{KIT_ENV}={value} is not a conformance kit (no {', '.join(missing)}): "
                         f"{HOW_TO_GET_IT}")  # fmt: skip
    return kit


def prepare(kit: Path, folder: Path) -> Kit:
    """The binaries the user supplied (tests/conformance/peers.py: KIT_BIN, the kit's bin/,
    KUBEBUILDER_ASSETS, PATH), linked into `folder`. Without the ones every cluster needs,
    KitMissing names the first missing and what to do about it."""
    found = peers.find_all(os.environ, kit)
    reason = peers.why_not_run(found)
    if reason is not None:
        raise KitMissing(reason, found)
    return Kit(kit, peers.link_into(found, folder), found)


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def derived_port(port: int, k: int) -> int:
    """The kit's rule for etcd and MCC ports (PORT + k*10000, wrapped into 1024..65535)."""
    return (port + k * 10000 - 1024) % 64512 + 1024


def pick_port(rng: random.Random | None = None) -> int:
    """An API port whose derived ports are free too; 20000-29999 keeps all four below the
    usual ephemeral range's busiest part and apart from the system tier's registry."""
    rng = rng or random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        if all(_free(derived_port(port, k)) for k in range(4)):
            return port
    raise RuntimeError("no free port set for a kit cluster on 127.0.0.1")


async def _script(*argv: str, env: dict[str, str] | None = None, timeout: float = SCRIPT_TIMEOUT,
                  log: Path | None = None) -> str:  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{Path(argv[0]).name} timed out after {timeout:.0f} s") from None
    if log is not None:
        with log.open("ab") as f:
            f.write(err)
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-1500:]
        raise RuntimeError(f"{Path(argv[0]).name} failed ({proc.returncode}): {tail}")
    return out.decode()


@dataclass
class KitCluster(PoolBackend):
    """One real API server (and optionally the MCC) in RUN DIR `run` on `port`."""

    kit: Kit
    run: Path
    port: int = 0
    rendered: str = ""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def admin_token(self) -> str:
        return (self.run / "pki/admin.token").read_text().strip()

    def ca_file(self) -> Path:
        return self.run / "pki/ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run / "admin.kubeconfig"

    def node_kubeconfig(self, node: str) -> Path:
        return self.run / f"node-{node}.kubeconfig"

    @property
    def bin(self) -> Path:
        return self.kit.bin

    async def _kit_script(self, name: str, *args: str) -> str:
        """One of the kit's scripts on this cluster's RUN DIR, with the supplied binaries."""
        return await _script(str(self.kit.path / name), str(self.run), *args,
                             env={"KIT_BIN": str(self.kit.bin)},
                             log=self.run / "harness.log")  # fmt: skip

    async def up(self) -> None:
        self.run.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self.port = pick_port()
            try:
                await self._kit_script("cluster-up", str(self.port))
                return
            except RuntimeError as exc:
                if "in use" not in str(exc) or attempt == 2:
                    raise

    controller = "the machine-config-controller"

    async def apply_rbac(self, path: Path) -> None:
        """As an operator applies it."""
        await asyncio.to_thread(self.kubectl, "apply", "-f", str(path))

    async def add_kubelet_config(self, name: str, kubelet_config: dict[str, Any]) -> None:
        """The real kubelet-config controller renders it into 99-worker-generated-kubelet."""
        await put_object(self, {
            "apiVersion": f"{MCA}/v1", "kind": "KubeletConfig", "metadata": {"name": name},
            "spec": {"machineConfigPoolSelector": {"matchLabels": {
                         f"pools.operator.{MCA}/worker": ""}},
                     "kubeletConfig": kubelet_config},
        })  # fmt: skip

    async def delete_kubelet_config(self, name: str) -> None:
        await self.call("DELETE", f"/apis/{MCA}/v1/kubeletconfigs/{name}")

    async def controller_config_seen(self, timeout: float = 60.0) -> None:
        """Until the template controller has processed the ControllerConfig's spec."""
        path = f"/apis/{MCA}/v1/controllerconfigs/machine-config-controller"
        async with asyncio.timeout(timeout):
            while True:
                cc = await self.call("GET", path)
                if cc.get("status", {}).get("observedGeneration") == cc["metadata"]["generation"]:
                    return
                await asyncio.sleep(0.2)

    async def mcc_up(self, workers: int, os_image: str) -> str:
        out = await self._kit_script("mcc-up", "--workers", str(workers), "--os-image", os_image)
        self.rendered = out.strip().splitlines()[-1]
        return self.rendered

    async def down(self) -> None:
        await self.close_session()
        if (self.run / "kit.env").exists():
            await self._kit_script("cluster-down")

    async def kill_apiserver(self) -> None:
        """SIGKILL the API server this cluster started (its PID file), as a crash would."""
        pid_file = self.run / "kube-apiserver.pid"
        pid = int(pid_file.read_text())
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        if Path(exe).name != "kube-apiserver":
            raise RuntimeError(f"pid {pid} is not this cluster's kube-apiserver ({exe})")
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            await asyncio.sleep(0.05)
        await self.close_session()

    async def start_apiserver(self) -> None:
        """After kill_apiserver: the kit restarts a cluster only when all of it is down, so
        etcd is stopped too (its data is kept) and both start again on the same ports."""
        await self._kit_script("cluster-down")
        await self._kit_script("cluster-up", str(self.port))

    def kubectl(self, *args: str, kubeconfig: Path | None = None, stdin: str | None = None,
                timeout: float = 60.0) -> str:  # fmt: skip
        out = subprocess.run(
            [str(self.bin / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig),
             "--cache-dir", str(self.run / "kubectl-cache"), *args],
            input=stdin, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    async def token_for(self, service_account: str, namespace: str = MCO_NS,
                        seconds: int = 7200) -> str:  # fmt: skip
        """A service-account token from the TokenRequest API, as a projected token would be."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds}}  # fmt: skip
        return (await self.call("POST", path, body))["status"]["token"]
