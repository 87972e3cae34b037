"""Taking a node over from the machine-config-daemon, and handing it back: the real agent
process, the loopback API server, a simulated host prepared as the MCD leaves one
(tests/scenarios/mcd_node.py says what that is)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from agent.core.policy import PULL_SECRET, SSH_KEYS_PATH
from agent.model.imageref import parse_image_ref
from agent.model.mcd_disk import CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH, on_disk_config
from standins.bootc_releases import PERSONAS
from standins.demo.loopback import IMAGE, Cluster, P
from tests.scenarios.harness import exits, until
from tests.scenarios.mcd_node import STATE_DIR, done_annotations, prepare, snapshot, write

pytestmark = pytest.mark.asyncio
SECRET = '{"auths":{"quay.example":{"auth":"dXNlcjpwYXNz"}}}'


async def mcd_node(tmp_path: Path, *, layered: bool = False, annotations: dict | None = None,
                   unschedulable: bool = False) -> Cluster:  # fmt: skip
    """A node as the MCD leaves it after applying rendered-worker-1."""
    cluster = await Cluster.create(
        tmp_path, annotations={**done_annotations("rendered-worker-1"), **(annotations or {})}
    )
    pull = {"path": PULL_SECRET, "mode": 0o600, "contents": {"source": "data:," + SECRET}}
    cluster.add_config("rendered-worker-1", "v1", keys=["ssh-ed25519 AAAA-one"], files=[pull])
    if layered:
        image = cluster.images["v1"]
        values = {P + "desiredImage": image, P + "currentImage": image}
        cluster.kube.patch_annotations("Node", cluster.node, values)
    if unschedulable:
        node = cluster.kube.get("Node", cluster.node)
        cluster.kube.put({**node, "spec": {**node.get("spec", {}), "unschedulable": True}})
    rendered = cluster.kube.get("MachineConfig", "rendered-worker-1")
    prepare(cluster.sim.root, rendered, ["ssh-ed25519 AAAA-one"],
            image=cluster.images["v1"] if layered else "", files={PULL_SECRET: SECRET})  # fmt: skip
    return cluster


@pytest.mark.parametrize("layered", [False, True], ids=["osImageURL", "desiredImage"])
async def test_a_node_the_mcd_left_done_is_taken_over_with_no_write_and_no_reboot(
    tmp_path: Path, layered: bool
) -> None:
    cluster = await mcd_node(tmp_path, layered=layered)
    try:
        before = snapshot(cluster.sim.root)
        writes_before = cluster.node_writes()
        await cluster.start_agent()
        await until(lambda: (cluster.sim.root / STATE_DIR / "journal.json").exists(),
                    what="the agent's first pass")  # fmt: skip
        await cluster.wait_done("rendered-worker-1")
        await until(lambda: any(e["reason"] == "NodeDone"
                                for e in cluster.kube.list("events", "default")))  # fmt: skip
        assert cluster.reboots() == 0
        assert snapshot(cluster.sim.root) == before  # not one file written, moved or touched
        assert cluster.node_writes() == writes_before  # the Node says Done already
        # The agent's own state: its journal, and no copy of the config (the MCD's is read).
        assert sorted(p.name for p in (cluster.sim.root / STATE_DIR).iterdir()) == ["journal.json"]
        reasons = [e["reason"] for e in cluster.kube.list("events", "default")]
        assert not {"OnDiskStateValidationFailed", "ConfigDriftDetected"} & set(reasons)
        # ...and watched from then on: a key's mode changed by hand is drift, until put back.
        keys = cluster.sim.root / SSH_KEYS_PATH.lstrip("/")
        keys.chmod(0o644)
        await cluster.wait_annotations(lambda a: "mode mismatch" in a.get(P + "reason", ""))
        keys.chmod(0o600)
        await cluster.wait_done("rendered-worker-1")

        # ...then an image update driven by the cluster, and the hand-back files after it.
        cluster.kube.enable_drain_controller(delay=0.1)
        cluster.add_config("rendered-worker-2", "v2", keys=["ssh-ed25519 AAAA-two"])
        extra = {P + "desiredImage": cluster.images["v2"]} if layered else {}
        cluster.set_desired("rendered-worker-2", **extra)
        assert await exits(cluster.procs[-1]) == 3
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-2")
        assert cluster.reboots() == 1
        assert cluster.booted() == cluster.images["v2"].split("@")[1]
        root = cluster.sim.root
        rendered = cluster.kube.get("MachineConfig", "rendered-worker-2")
        written = (root / CURRENT_CONFIG_PATH.lstrip("/")).read_bytes()
        assert written == on_disk_config(rendered)
        mcd_view = json.loads(written)  # as the MCD decodes it
        assert mcd_view["metadata"]["name"] == "rendered-worker-2"
        assert mcd_view["spec"]["osImageURL"] == cluster.images["v2"]
        assert mcd_view["spec"]["config"] == rendered["spec"]["config"]
        image = (root / CURRENT_IMAGE_PATH.lstrip("/")).read_text()
        assert image == (cluster.images["v2"] if layered else "")
        assert cluster.annotations().get(P + "currentImage") == (image or None)
        # currentconfig 0600, where the MCD writes 0644: it holds the pull secret.
        # currentimage 0644, as the MCD's: it names an image; whether the agent wrote it
        # (layered) or left the MCD's, which says the same already (empty: not layered).
        for path, mode in ((CURRENT_CONFIG_PATH, 0o600), (CURRENT_IMAGE_PATH, 0o644)):
            info = (root / path.lstrip("/")).stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid) == (mode, 0)
        assert (root / SSH_KEYS_PATH.lstrip("/")).read_text() == "ssh-ed25519 AAAA-two\n"
    finally:
        await cluster.close()


async def test_a_node_the_mcd_left_mid_update_is_finished(tmp_path: Path) -> None:
    # The MCD asked for the drain of rendered-worker-2 and was replaced before it wrote
    # anything else: the node is cordoned, Working, its on-disk config still rendered-worker-1.
    mid = {P + "desiredConfig": "rendered-worker-2", P + "state": "Working",
           P + "desiredDrain": "drain-rendered-worker-2",
           P + "lastAppliedDrain": "drain-rendered-worker-2"}  # fmt: skip
    cluster = await mcd_node(tmp_path, annotations=mid, unschedulable=True)
    try:
        cluster.add_config("rendered-worker-2", "v2", keys=["ssh-ed25519 AAAA-one"])
        cluster.kube.enable_drain_controller(delay=0.1)
        await cluster.start_agent()
        assert await exits(cluster.procs[-1]) == 3
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-2")
        await cluster.wait_annotations(
            lambda a: a.get(P + "lastAppliedDrain") == "uncordon-rendered-worker-2"
        )
        assert not cluster.kube.get("Node", cluster.node)["spec"].get("unschedulable")
        assert cluster.reboots() == 1
        assert cluster.booted() == cluster.images["v2"].split("@")[1]
        written = json.loads((cluster.sim.root / CURRENT_CONFIG_PATH.lstrip("/")).read_bytes())
        assert written["metadata"]["name"] == "rendered-worker-2"
    finally:
        await cluster.close()


async def test_the_mcds_file_wins_over_the_agents_own_record(tmp_path: Path) -> None:
    # Handed back, the MCD updated the node to rendered-worker-2; the agent's own record
    # still says rendered-worker-1. Taken over again, the MCD's file is the truth.
    cluster = await mcd_node(tmp_path)
    try:
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-1")
        await until(lambda: (cluster.sim.root / STATE_DIR / "journal.json").exists())
        cluster.procs[-1].terminate()
        await cluster.procs[-1].wait()
        cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-mcd"])
        root = cluster.sim.root
        mcd_written = on_disk_config(cluster.kube.get("MachineConfig", "rendered-worker-2"))
        write(root, CURRENT_CONFIG_PATH, mcd_written, 0o644)
        write(root, SSH_KEYS_PATH, "ssh-ed25519 AAAA-mcd\n", 0o600, uid=1000)
        cluster.kube.patch_annotations(
            "Node",
            cluster.node,
            {P + "currentConfig": "rendered-worker-2", P + "desiredConfig": "rendered-worker-2"},
        )
        before = snapshot(root)
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-2")
        await until(lambda: any(e["reason"] == "NodeDone" and "rendered-worker-2" in e["message"]
                                for e in cluster.kube.list("events", "default")))  # fmt: skip
        assert snapshot(root) == before and cluster.reboots() == 0
        reasons = [e["reason"] for e in cluster.kube.list("events", "default")]
        assert "OnDiskStateValidationFailed" not in reasons
    finally:
        await cluster.close()


@pytest.mark.parametrize("persona", PERSONAS)
async def test_the_takeover_validates_on_every_bootc_release(tmp_path: Path, persona: str) -> None:
    # The booted digest comes from each release's `bootc status` (its own schema fields).
    cluster = await mcd_node(tmp_path)
    try:
        cluster.sim.set_bootc_version(persona)
        before = snapshot(cluster.sim.root)
        await cluster.start_agent()
        await until(lambda: any(e["reason"] == "NodeDone"
                                for e in cluster.kube.list("events", "default")))  # fmt: skip
        assert snapshot(cluster.sim.root) == before and cluster.reboots() == 0
        # and watched from then on
        keys = cluster.sim.root / SSH_KEYS_PATH.lstrip("/")
        keys.chmod(0o644)
        await cluster.wait_annotations(lambda a: "mode mismatch" in a.get(P + "reason", ""))
        reasons = {e["reason"] for e in cluster.kube.list("events", "default")}
        assert "OnDiskStateValidationFailed" not in reasons
    finally:
        await cluster.close()


async def mcd_applies(cluster: Cluster, name: str, image: str, keys: list[str]) -> None:
    """The MCD, given the node back, applies `name` (image `image`) as it does: stages and
    reboots into the image, writes the config's files, then its on-disk config, then the
    Node's annotations (docs/mco-protocol.md §6, §8)."""
    host = cluster.sim.host(lambda path: True)
    await host.bootc.stage(parse_image_ref(image))
    await host.system.reboot()
    cluster.sim.boot()
    root = cluster.sim.root
    write(root, SSH_KEYS_PATH, "".join(f"{key}\n" for key in keys), 0o600, uid=1000)
    write(root, CURRENT_CONFIG_PATH, on_disk_config(cluster.kube.get("MachineConfig", name)),
          0o644)  # fmt: skip
    write(root, CURRENT_IMAGE_PATH, "", 0o644)
    cluster.kube.patch_annotations("Node", cluster.node, done_annotations(name))


async def test_a_node_the_mcd_updated_after_the_agent_is_not_rolled_back(tmp_path: Path) -> None:
    # agent -> MCD -> agent: the agent updated the node to rendered-worker-2 and recorded it
    # (its journal, its own current-config, the MCD's files); the MCD, given the node back,
    # updated it to rendered-worker-3 on another image. The agent, started again, must take
    # the MCD's newer record as the truth: no rollback to its own record, no write, no reboot,
    # and the Node's currentConfig stays rendered-worker-3.
    cluster = await mcd_node(tmp_path)
    try:
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-1")
        cluster.kube.enable_drain_controller(delay=0.1)
        cluster.add_config("rendered-worker-2", "v2", keys=["ssh-ed25519 AAAA-two"])
        cluster.set_desired("rendered-worker-2")
        assert await exits(cluster.procs[-1]) == 3
        await cluster.start_agent()
        await cluster.wait_done("rendered-worker-2")
        state = cluster.sim.root / STATE_DIR
        await until(lambda: (state / "current-config").exists(), what="the agent's record")
        cluster.procs[-1].terminate()
        await cluster.procs[-1].wait()
        journal = json.loads((state / "journal.json").read_text())
        assert journal["current_name"] == "rendered-worker-2"

        newer = cluster.sim.add_image(f"{IMAGE}:v5-mcd", {"usr/lib/app/healthy": "yes"})
        cluster.add_config("rendered-worker-3", newer, keys=["ssh-ed25519 AAAA-mcd"])
        await mcd_applies(cluster, "rendered-worker-3", newer, ["ssh-ed25519 AAAA-mcd"])
        reboots, writes = cluster.reboots(), cluster.node_writes()
        before = snapshot(cluster.sim.root)

        await cluster.start_agent()
        await until(lambda: any(e["reason"] == "NodeDone" and "rendered-worker-3" in e["message"]
                                for e in cluster.kube.list("events", "default")),
                    what="the agent's pass over rendered-worker-3")  # fmt: skip
        assert cluster.annotations()[P + "currentConfig"] == "rendered-worker-3"
        assert cluster.node_writes() == writes  # the Node said Done on rendered-worker-3 already
        assert cluster.reboots() == reboots and cluster.booted() == newer.split("@")[1]
        assert snapshot(cluster.sim.root) == before  # validated against the MCD's config
        reasons = {e["reason"] for e in cluster.kube.list("events", "default")}
        assert not {"OnDiskStateValidationFailed", "ConfigDriftDetected"} & reasons
        await until(lambda: json.loads((state / "journal.json").read_text())["current_name"]
                    == "rendered-worker-3", what="the journal naming the MCD's config")  # fmt: skip
    finally:
        await cluster.close()
