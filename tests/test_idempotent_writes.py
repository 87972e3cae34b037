"""Writes that change nothing are not made, in every mode: the real agent process on a
simulated host whose files already hold what the config asks. A needless write wakes the drift
monitor, moves the mtime an auditor reads, and breaks the takeover's promise of no write."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from standins.demo.loopback import Cluster, make_host
from standins.demo.objects import machine_config
from tests.builders import ign_file
from tests.scenarios.harness import until
from tests.scenarios.mcd_node import changed, snapshot

pytestmark = pytest.mark.asyncio
KEY, NEW_KEY = "ssh-ed25519 AAAA-one", "ssh-ed25519 AAAA-two"
PULL = ign_file("/var/lib/kubelet/config.json", '{"auths":{}}', mode=0o600)
# What the agent keeps of its own: its state, and the MCD-compatible records it writes at
# the commit of an update (not when nothing was updated).
OWN = ("var/lib/image-mode-agent", "etc/machine-config-daemon")


async def test_cluster_mode_first_update_after_adopting_writes_only_the_changed_key(
    tmp_path: Path,
) -> None:
    cluster = await Cluster.create(tmp_path)
    try:
        cluster.add_config("rendered-worker-1", "v1", keys=[KEY], files=[PULL])
        cluster.add_config("rendered-worker-2", "v1", keys=[NEW_KEY], files=[PULL])
        await cluster.start_agent()
        # Committed: the MCD-compatible record is the commit's last write.
        committed = cluster.sim.root / "etc/machine-config-daemon/currentconfig"
        await until(committed.exists, what="rendered-worker-1 committed")
        cluster.procs[-1].terminate()
        await cluster.procs[-1].wait()
        # A node with no record of its config (neither the agent's nor the MCD's): the Node's
        # currentConfig is adopted, never validated here, so every live file is planned.
        for own in OWN:
            shutil.rmtree(cluster.sim.root / own)
        before = snapshot(cluster.sim.root, skip=OWN)

        cluster.set_desired("rendered-worker-2")
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-2")

        assert changed(before, snapshot(cluster.sim.root, skip=OWN)) == [
            "var/home/core/.ssh/authorized_keys.d/ignition"
        ]  # not the pull secret, its bootc copy, the kubelet CA
        assert cluster.reboots() == 0
    finally:
        await cluster.close()


async def test_file_mode_first_start_on_a_host_that_matches_writes_nothing(tmp_path: Path):
    sim, images = make_host(tmp_path)
    desired = tmp_path / "mc.json"
    desired.write_text(json.dumps(machine_config(keys=[KEY], files=[PULL], image=images["v1"])))
    status_path = sim.root / "var/lib/image-mode-agent/status.json"

    def status() -> dict:
        try:
            return json.loads(status_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    async def run_until_done() -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
            f"file:{desired}", "--host", f"simulated:{sim.base}", "--listen", "",
        )  # fmt: skip
        try:
            await until(lambda: status().get("state") == "Done"
                        and (status().get("validation") or {}).get("ok") is True)  # fmt: skip
        finally:
            proc.terminate()
            assert await proc.wait() == 0

    await run_until_done()  # the host now holds the config's key and pull secret
    shutil.rmtree(sim.root / "var/lib/image-mode-agent")  # a first start again
    before = snapshot(sim.root, skip=OWN)
    await run_until_done()
    assert changed(before, snapshot(sim.root, skip=OWN)) == []
    assert not [a for a in sim.actions() if a["kind"] == "reboot"]
