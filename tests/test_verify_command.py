"""`image-mode-agent verify`, the boot-time verifier, as the verify unit runs it; and the
cluster-mode Node Ready check."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent.cluster.kube import Kube
from agent.cluster.ready import node_ready_check
from standins.kube import FakeKube
from tests.builders import machine_config
from tests.scenarios.harness import until
from tests.test_cli import agent, host, run_once, write  # noqa: F401


def test_verify_commits_a_good_boot(tmp_path: Path, host) -> None:  # noqa: F811
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    assert agent("verify", "--host", f"simulated:{sim}").stdout.startswith(
        "verify: no update was waiting"
    )
    write(desired, machine_config(name="r2", keys=["k"], image=images["v2"]))
    assert run_once(sim, desired).returncode == 3
    done = agent("verify", "--host", f"simulated:{sim}")
    assert (done.returncode, done.stdout.strip()) == (0, "verify: Done")
    assert run_once(sim, desired).returncode == 0


def test_verify_rejects_a_bad_boot(tmp_path: Path, host) -> None:  # noqa: F811
    sim, images = host
    bad = agent("sim", "add-image", str(sim), "quay.example/os/node:bad",
                "--file", "usr/lib/app/healthy=no").stdout.strip()  # fmt: skip
    check = sim / "root/etc/image-mode-agent/check/required.d/50-app"
    check.parent.mkdir(parents=True)
    check.write_text('#!/bin/sh\ngrep -qx yes "$IMAGE_MODE_AGENT_ROOT/usr/lib/app/healthy"\n')
    check.chmod(0o755)
    desired = write(tmp_path / "mc.json", machine_config(keys=["k"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    write(desired, machine_config(name="r2", keys=["k"], image=bad))
    assert run_once(sim, desired).returncode == 3
    rejected = agent("verify", "--host", f"simulated:{sim}")
    assert rejected.returncode == 1  # boot-complete.target is not reached
    assert rejected.stdout.startswith("verify: Rebooting: rolling back from")
    after = agent("verify", "--host", f"simulated:{sim}")
    assert after.returncode == 0 and "verify: Degraded: rolled back to" in after.stdout
    booted = json.loads((sim / "host.json").read_text())["booted"]["digest"]
    assert booted in images["v1"]


async def test_node_ready_check(tmp_path: Path) -> None:
    kube = FakeKube()
    await kube.start()
    try:
        kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                  "status": {"conditions": [{"type": "Ready", "status": "False",
                                             "reason": "KubeletNotReady"}]}})  # fmt: skip
        kube.write_kubeconfig(tmp_path / "kc", kube.node_identity("n1"))
        client = await Kube.connect(str(tmp_path / "kc"))
        try:
            failed = await node_ready_check(client, "n1", deadline=0.5)
            assert not failed.ok and "Ready=False KubeletNotReady" in failed.detail

            def watches() -> int:
                return kube.count_requests(verb="watch", resource="nodes", status=200)

            before = watches()

            async def becomes_ready() -> None:
                # Once the next check watches: it listed the Node, Ready=False, and waits.
                await until(lambda: watches() > before, what="the check's watch")
                kube.patch_status("Node", "n1", {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"}]})  # fmt: skip

            flip = asyncio.create_task(becomes_ready())
            passed = await node_ready_check(client, "n1", deadline=10)
            await flip
            assert passed.ok
        finally:
            await client.close()
    finally:
        await kube.stop()
