"""End to end with the real machine-config-controller: its render, node and drain controllers
drive one agent per Node (simulated hosts booted on the cluster's osImageURL). The pool
scenarios (tests/scenarios/pool_rollouts.py) run here on the real controller and in the default
run on its stand-ins; the two below need controllers that have no stand-in (the kubelet-config
controller's render of a KubeletConfig, the template controller's observedGeneration)."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conformance.kit import MCO_NS, Kit, KitCluster
from tests.scenarios.pool import MccCluster, P, bootstrapped
from tests.scenarios.pool_rollouts import SCENARIOS, drains

pytestmark = [pytest.mark.asyncio, pytest.mark.peers("machine-config-controller")]
KUBELETCONFIG_PATH = "/apis/machineconfiguration.openshift.io/v1/kubeletconfigs"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
async def test_pool_scenario_on_the_real_controller(scenario, kit: Kit, tmp_path: Path,
                                                   figures: list[str]) -> None:  # fmt: skip
    await scenario(KitCluster(kit, tmp_path / "cluster"), tmp_path, figures)


async def test_kubeletconfig_refused_then_healed(kit: Kit, tmp_path: Path,
                                                figures: list[str]) -> None:  # fmt: skip
    cluster = KitCluster(kit, tmp_path / "cluster")
    async with bootstrapped(cluster, tmp_path, workers=1) as (mcc, r0):
        node = mcc.nodes["worker-0"]
        t = await mcc.apply({
            "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "KubeletConfig",
            "metadata": {"name": "max-pods"},
            "spec": {"machineConfigPoolSelector": {"matchLabels": {
                         "pools.operator.machineconfiguration.openshift.io/worker": ""}},
                     "kubeletConfig": {"maxPods": 300}},
        })  # fmt: skip
        r1 = await mcc.wait_new_rendered(r0)
        pool = await mcc.wait_degraded()
        figures.append(f"KubeletConfig: pool Degraded {time.monotonic() - t:.1f} s after its "
                       "creation (refused: image content)")  # fmt: skip
        annotations = (await mcc.node("worker-0"))["metadata"]["annotations"]
        assert annotations[P + "desiredConfig"] == r1
        assert annotations[P + "currentConfig"] == r0
        assert "need an image build" in annotations[P + "reason"]
        assert "/etc/kubernetes/kubelet.conf" in annotations[P + "reason"]
        messages = " ".join(c.get("message", "") for c in pool["status"]["conditions"])
        assert "need an image build" in messages
        assert node.reboots() == 0 and drains(mcc, "worker-0") == []

        t = time.monotonic()
        await mcc.delete(f"{KUBELETCONFIG_PATH}/max-pods")
        await mcc.wait_updated(r0)
        figures.append(f"KubeletConfig deleted: pool Updated again {time.monotonic() - t:.1f} s "
                       "later")  # fmt: skip
        annotations = (await mcc.node("worker-0"))["metadata"]["annotations"]
        assert annotations[P + "state"] == "Done" and annotations[P + "reason"] == ""
        assert node.reboots() == 0


def _ca(directory: Path, name: str) -> bytes:
    """A real self-signed CA certificate (PEM), as the kube-apiserver operator's signers are."""
    key, crt = directory / f"{name}.key", directory / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-subj", f"/CN={name}", "-days", "30", "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return crt.read_bytes()


def _kubeconfig(ca: bytes, user: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": "https://api-int.example:6443",
            "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": user, "user": {"client-certificate": f"/var/lib/{user}.crt"}}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
        "current-context": user,
    })  # fmt: skip


async def test_serving_ca_rotation_rewrites_the_kubeconfigs(kit: Kit, tmp_path: Path) -> None:
    """What the operator does when the kube-apiserver serving CA rotates (pkg/operator/sync.go
    syncControllerConfig): the bundle into ConfigMap kubeconfig-data, then the ControllerConfig
    annotation service-ca-rotate=true; the agent rewrites the CA data of both kubeconfigs and
    restarts the kubelet once, as the MCD's certificate writer does."""
    mcc = await MccCluster.create(KitCluster(kit, tmp_path / "cluster"), tmp_path, workers=1)
    try:
        node = mcc.nodes["worker-0"]
        old, new = _ca(tmp_path, "kube-apiserver-service-network-signer"), _ca(tmp_path, "next")
        files = {"etc/kubernetes/kubeconfig": _kubeconfig(old, "kubelet"),
                 "var/lib/kubelet/kubeconfig": _kubeconfig(old, "node")}  # fmt: skip
        for rel, text in files.items():
            (node.sim.root / rel).parent.mkdir(parents=True, exist_ok=True)
            (node.sim.root / rel).write_text(text)
            (node.sim.root / rel).chmod(0o600)
        mcc.start_agents()
        r0 = await mcc.wait_updated(mcc.bootstrap_config)
        rendered_before = await mcc.rendered_configs()
        await mcc.apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeconfig-data", "namespace": MCO_NS},
            "binaryData": {"ca-bundle.crt": base64.b64encode(old + new).decode()},
        })  # fmt: skip
        # The operator's one ControllerConfig update: the flag, and the new CA in the spec.
        await mcc.cluster.merge_patch(
            "/apis/machineconfiguration.openshift.io/v1/controllerconfigs/machine-config-controller",
            {"metadata": {"annotations": {P + "service-ca-rotate": "true"}},
             "spec": {"kubeAPIServerServingCAData": base64.b64encode(old + new).decode()}},
        )  # fmt: skip
        await mcc.wait_annotation("worker-0", P + "lastObservedServerCAAnnotation", "true")
        for rel, text in files.items():
            written = yaml.safe_load((node.sim.root / rel).read_text())
            expected = yaml.safe_load(text)
            data = written["clusters"][0]["cluster"].pop("certificate-authority-data")
            expected["clusters"][0]["cluster"].pop("certificate-authority-data")
            assert written == expected, rel  # nothing else changed
            pem = base64.b64decode(data)
            assert old.strip() in pem and new.strip() in pem, rel
            assert (node.sim.root / rel).stat().st_mode & 0o777 == 0o600, rel
        kubelet_ca = node.sim.root / "etc/kubernetes/kubelet-ca.crt"
        await mcc.wait_file(kubelet_ca, old + new)
        # The new CA is host-local content: no new rendered config, nothing to roll out. The
        # MCC's controllers requeue about every 5 s; a re-render would show within one period
        # after its template controller observed the new ControllerConfig.
        await mcc.wait_controller_config_observed()
        # A render that did not happen has no event to wait on: one period, after the evidence.
        await asyncio.sleep(6)
        assert await mcc.rendered_configs() == rendered_before
        assert await mcc.wait_updated() == r0
        units = [a["detail"] for a in node.sim.actions() if a["kind"] == "unit"]
        assert units.count("restart kubelet.service") == 1
        assert node.reboots() == 0
        annotations = (await mcc.node("worker-0"))["metadata"]["annotations"]
        assert annotations[P + "state"] == "Done"
    finally:
        await mcc.close()
