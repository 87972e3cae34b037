"""The pool scenarios, defined once and run on both pool backends: the stand-ins of the
machine-config-controller on the project's loopback API server (tests/test_pool_scenarios.py,
the default run) and the real controller on the kit's kube-apiserver
(tests/conformance/test_mcc.py). Each takes a backend not started yet, a folder of its own and
a list to append its measured figures to. After SCENARIOS, the ones only the stand-ins can
run (they steer the controller)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import subprocess
import time
from pathlib import Path

import yaml

from standins.host.registry import PullRecord, SharedLink, pull_records
from standins.kube import NodeController
from tests.scenarios.backend import MCO_NS, PoolBackend
from tests.scenarios.mcd_node import OS_UNITS
from tests.scenarios.pool import MC_PATH, MCN_COLUMNS, MccCluster, P, bootstrapped, machine_config
from tests.scenarios.standin import StandInCluster


def updated_at(config: str):
    """The MachineConfigNode row of a Node done with `config`: Updated, and every other phase
    reset to False, as the MCD's upgrade monitor leaves it."""

    def check(row: dict) -> bool:
        others = [row[k] for k in MCN_COLUMNS if k != "Updated"]
        return (row["Updated"] == "True" and row["CurrentConfig"] == config
                and row["DesiredConfig"] == config and row["PoolName"] == "worker"
                and all(v == "False" for v in others))  # fmt: skip

    return check


def drains(mcc: MccCluster, node: str, key: str = "desiredDrain") -> list[str]:
    """Every value the annotation took on the Node, in order."""
    values: list[str] = []
    for s in mcc.samples:
        value = s.annotations.get(P + key)
        if s.node == node and value and (not values or values[-1] != value):
            values.append(value)
    return values


async def bootstrap_ssh_key_then_image_update(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    mcc = await MccCluster.create(cluster, base, workers=1)
    try:
        node = mcc.nodes["worker-0"]
        t = time.monotonic()
        mcc.start_agents()
        r0 = await mcc.wait_updated(mcc.bootstrap_config)
        figures.append(f"bootstrap: pool Updated {time.monotonic() - t:.1f} s after the agent "
                       "started (first-boot annotations from node-annotations.json)")  # fmt: skip

        # An SSH key: live, no drain, no reboot.
        t = await mcc.apply(machine_config("99-worker-ssh", keys=["ssh-ed25519 AAAA-conf"]))
        r1 = await mcc.wait_new_rendered(r0)
        await mcc.wait_updated(r1)
        total, share = time.monotonic() - t, mcc.agent_share("worker-0", r1, t)
        figures.append(
            f"ssh-key MachineConfig: pool Updated {total:.1f} s after its creation; "
            f"agent share (desiredConfig seen -> Done) {share * 1000:.0f} ms"
        )
        keys = node.sim.root / "home/core/.ssh/authorized_keys.d/ignition"
        assert keys.read_text() == "ssh-ed25519 AAAA-conf\n"
        assert node.reboots() == 0 and drains(mcc, "worker-0") == []
        await mcc.wait_mcn("worker-0", updated_at(r1), f"Updated at {r1}")
        start = len(mcc.mcn_rows["worker-0"])

        # A new osImageURL: staged, drained by the real drain controller, one reboot.
        t = await mcc.apply(machine_config("99-worker-os", os_image=node.images["v2"]))
        r2 = await mcc.wait_new_rendered(r1)
        await mcc.wait_updated(r2)
        total, share = time.monotonic() - t, mcc.agent_share("worker-0", r2, t)
        waits = mcc.drain_controller_wait("worker-0", r2, t)
        figures.append(
            f"osImageURL MachineConfig: pool Updated {total:.1f} s after its "
            f"creation; agent share {share:.1f} s, of which {waits:.1f} s waiting for "
            "the drain controller's drain and uncordon (staging, one reboot)"
        )
        assert node.booted() == node.images["v2"].split("@")[1]
        assert node.reboots() == 1 and node.starts == 2
        assert drains(mcc, "worker-0") == [f"drain-{r2}", f"uncordon-{r2}"]
        assert drains(mcc, "worker-0", "lastAppliedDrain") == [f"drain-{r2}", f"uncordon-{r2}"]
        assert any(s.unschedulable for s in mcc.samples if s.node == "worker-0")
        final = await mcc.node("worker-0")
        assert not final["spec"].get("unschedulable")
        assert final["metadata"]["annotations"][P + "state"] == "Done"
        assert keys.read_text() == "ssh-ed25519 AAAA-conf\n"
        # The MachineConfigNode through the update, as `oc get machineconfignode` shows it.
        await mcc.wait_mcn("worker-0", updated_at(r2), f"Updated at {r2}")
        rows = mcc.mcn_rows["worker-0"][start:]
        assert any(r["Updated"] == "False" and r["UpdatePrepared"] == "True" for r in rows)
        assert any(r["UpdateExecuted"] == "Unknown" for r in rows), rows
        assert any(r["Drained"] == "True" for r in rows)
        rebooted = [r["RebootedNode"] for r in rows if r["RebootedNode"] != "False"]
        assert rebooted[:1] == ["Unknown"] and "True" in rebooted
        assert any(r["Resumed"] == "True" for r in rows)
        assert any(r["UpdateComplete"] == "True" and r["Uncordoned"] == "True" for r in rows)
    finally:
        await mcc.close()


async def bad_image_rolled_back_then_healed(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    async with bootstrapped(cluster, base, workers=1) as (mcc, r0):
        node = mcc.nodes["worker-0"]
        t = await mcc.apply(machine_config("99-worker-os", os_image=node.images["bad"]))
        r1 = await mcc.wait_new_rendered(r0)
        pool = await mcc.wait_degraded("rolled back")
        figures.append(
            f"bad image: pool Degraded {time.monotonic() - t:.1f} s after the "
            "MachineConfig (staged, drained, booted, check failed, rolled back)"
        )
        annotations = (await mcc.node("worker-0"))["metadata"]["annotations"]
        assert annotations[P + "currentConfig"] == r0
        assert "rolled back to" in annotations[P + "reason"]
        assert node.booted() == node.images["v1"].split("@")[1]
        assert node.reboots() == 2
        messages = " ".join(c.get("message", "") for c in pool["status"]["conditions"])
        assert "rolled back" in messages
        await mcc.wait_mcn("worker-0", lambda r: r["NodeDegraded"] == "True", "NodeDegraded")

        t = time.monotonic()
        await mcc.delete(f"{MC_PATH}/99-worker-os")
        await mcc.wait_updated(r0)
        figures.append(f"bad image MachineConfig deleted: pool Updated again "
                       f"{time.monotonic() - t:.1f} s later")  # fmt: skip
        final = await mcc.node("worker-0")
        assert final["metadata"]["annotations"][P + "state"] == "Done"
        assert not final["spec"].get("unschedulable")
        assert node.reboots() == 2  # healing the pool needed no further reboot
        assert drains(mcc, "worker-0")[:2] == [f"drain-{r1}", f"uncordon-{r0}"]
        await mcc.wait_mcn("worker-0", updated_at(r0), f"Updated at {r0} again")


async def three_nodes_roll_one_at_a_time(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    async with bootstrapped(cluster, base, workers=3) as (mcc, r0):
        image = mcc.nodes["worker-0"].images["v2"]
        t = await mcc.apply(machine_config("99-worker-os", os_image=image))
        r1 = await mcc.wait_new_rendered(r0)
        await mcc.wait_updated(r1, timeout=300)
        total = time.monotonic() - t
        shares = [mcc.agent_share(n, r1, t) for n in sorted(mcc.nodes)]
        waits = [mcc.drain_controller_wait(n, r1, t) for n in sorted(mcc.nodes)]
        figures.append(f"3-node pool, maxUnavailable 1, image update: pool Updated {total:.1f} s "
                       "after the MachineConfig; agent shares "
                       + ", ".join(f"{s:.1f}" for s in shares) + " s (drain controller waits "
                       + ", ".join(f"{w:.1f}" for w in waits) + " s)")  # fmt: skip
        assert mcc.most_unavailable(after=t) == 1
        for name, node in mcc.nodes.items():
            assert node.booted() == image.split("@")[1], name
            assert node.reboots() == 1, name
            await mcc.wait_mcn(name, updated_at(r1), f"Updated at {r1}")
        # One at a time: each Node's update window ends before the next one's starts.
        windows = sorted(
            (mcc.first(n, lambda a: a.get(P + "desiredConfig") == r1, t),
             mcc.first(n, lambda a: a.get(P + "currentConfig") == r1
                       and a.get(P + "state") == "Done", t))
            for n in mcc.nodes
        )  # fmt: skip
        for (_, end), (start, _) in itertools.pairwise(windows):
            assert end <= start


async def pool_target_prestaged_before_each_nodes_turn(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    # Unbounded (every node pulls at once): a turn here lasts about a second, shorter than a
    # pull, so a bounded pre-pull could not finish ahead of the next turn (the bounded order
    # has its own scenario, with reboots that take longer than a pull).
    async with bootstrapped(cluster, base, workers=3, agent_args=[
            "--prestage-slots", "unbounded", "--prestage-jitter", "0"]) as (mcc, r0):  # fmt: skip
        image = mcc.nodes["worker-0"].images["slow"]  # each host's pull takes 4 s
        digest = image.split("@")[1]
        t = await mcc.apply(machine_config("99-worker-os", os_image=image))
        r1 = await mcc.wait_new_rendered(r0)

        async def staged_at_turn(name: str) -> bool:
            """Whether the host held the image staged when the controller picked its Node."""
            await mcc.wait_annotation(name, P + "desiredConfig", r1, timeout=300)
            staged = mcc.nodes[name].sim.status_document()["status"]["staged"] or {}
            staged_digest = (staged.get("image") or {}).get("imageDigest")
            return staged_digest == digest and staged.get("downloadOnly") is True

        found = await asyncio.gather(*(staged_at_turn(n) for n in sorted(mcc.nodes)))
        await mcc.wait_updated(r1, timeout=300)
        total = time.monotonic() - t
        shares = [mcc.agent_share(n, r1, t) for n in sorted(mcc.nodes)]
        figures.append(f"3-node pool, pre-staged image (4 s pulls): pool Updated {total:.1f} s "
                       "after the MachineConfig; unavailable windows "
                       + ", ".join(f"{s:.1f}" for s in shares) + " s")  # fmt: skip
        # The first Node's turn comes with the pool's new target; the others found it staged.
        assert sum(found) >= len(mcc.nodes) - 1, found
        assert mcc.most_unavailable(after=t) == 1
        for name, node in mcc.nodes.items():
            pulls = [a for a in node.sim.actions() if a["kind"] == "pull" and digest in a["detail"]]
            assert len(pulls) == 3, (name, pulls)  # three layers, each fetched once
            assert node.booted() == digest and node.reboots() == 1, name
            await mcc.wait_mcn(name, updated_at(r1), f"Updated at {r1}")


LANE_FILES = {**OS_UNITS, "usr/lib/app/healthy": "yes"}  # the OS's units, as every image
LANE_IMAGE_BYTES = 64 * 1024 * 1024 * (1 + len(LANE_FILES))  # the simulated image's size


async def lanes_image(mcc: MccCluster, base: Path, pull_seconds: float) -> tuple[str, Path]:
    """One new image on every host, pulled through one shared registry (each pull
    `pull_seconds` alone, ten at once before they slow each other), and the Nodes' zones the
    reverse of their names, so that the controller's order is not the names' (worker-N-1
    first). Returns the image and the registry's folder (its pulls.log)."""
    shared = base / "registry"
    image = ""
    for name, node in mcc.nodes.items():
        image = node.sim.add_image("quay.io/example/os:lanes", LANE_FILES)  # one digest on all
        link = LANE_IMAGE_BYTES / pull_seconds
        node.sim.set_shared_link(shared, registry_bps=10 * link, link_bps=link, host=name)
        zone = chr(ord("a") + len(mcc.nodes) - 1 - int(name.rsplit("-", 1)[1]))
        await mcc.cluster.merge_patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": {
            "topology.kubernetes.io/zone": zone}}})  # fmt: skip
    return image, shared


def merged_pulls(shared: Path, digest: str) -> list[PullRecord]:
    """Each host's pull of `digest` in the registry's log, by its start. A pre-pull that the
    turn adopts is stopped and resumed at once by the simulated bootc (its layers kept): one
    pull from the first start to the last end. Any other stop would be a pull lost."""
    merged: dict[str, PullRecord] = {}
    for r in pull_records(shared, digest):
        before = merged.get(r.host)
        if before is not None:
            assert before.outcome == "cancelled" and before.end is not None, (before, r)
            assert r.start - before.end < 0.5, (before, r)  # resumed by the turn
            r = dataclasses.replace(r, start=before.start, fetched=before.fetched + r.fetched)
        merged[r.host] = r
    assert all(r.outcome == "done" for r in merged.values()), merged
    return sorted(merged.values(), key=lambda r: r.start)


async def lanes_released(mcc: MccCluster) -> list[dict]:
    leases = await mcc.cluster.call(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{MCO_NS}/leases")  # fmt: skip
    lanes = [x for x in leases["items"] if x["metadata"]["name"].startswith("image-mode-")]
    assert lanes and not any(x["spec"].get("holderIdentity") for x in lanes), lanes
    return lanes


async def pool_prepulls_one_lane_in_the_controllers_order(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    """The default bound (K = maxUnavailable = 1 lane): the pre-pulls run one at a time, in
    the order the controller picks the Nodes, each before its Node's turn."""
    # Reboots (3 s) longer than a pull (2 s): a pre-pull fits behind each turn.
    workers = 4
    async with bootstrapped(cluster, base, workers=workers, logs=True,
                            reboot_seconds=3.0) as (mcc, r0):  # fmt: skip
        image, shared = await lanes_image(mcc, base, pull_seconds=2.0)
        digest = image.split("@")[1]
        t = await mcc.apply(machine_config("99-worker-os", os_image=image))
        r1 = await mcc.wait_new_rendered(r0)
        await mcc.wait_updated(r1, timeout=300)
        total = time.monotonic() - t

        picks = {n: mcc.first(n, lambda a: a.get(P + "desiredConfig") == r1, t)
                 for n in mcc.nodes}  # fmt: skip
        order = sorted(mcc.nodes, key=lambda n: picks[n] or 0.0)
        assert order == [f"worker-{k}" for k in reversed(range(workers))], picks  # by zone
        pulls = pull_records(shared, digest)
        assert [p.host for p in pulls] == order, pulls  # one pull each, in pick order
        assert all(p.outcome == "done" for p in pulls), pulls
        for before, after in itertools.pairwise(pulls):
            assert before.end <= after.start + 0.1  # one lane: never two pulls at once
        for p in pulls[1:]:
            assert p.end <= picks[p.host], p  # every later Node's image was there in time
        assert len(await lanes_released(mcc)) == 1
        assert mcc.most_unavailable(after=t) == 1
        for name, node in mcc.nodes.items():
            assert node.booted() == digest and node.reboots() == 1, name
        figures.append(f"{workers}-node pool, one pre-pull lane (2 s pulls, 3 s reboots): pool "
                       f"Updated {total:.1f} s after the MachineConfig; pulls in pick order "
                       + ", ".join(order))  # fmt: skip


async def pool_prepull_holder_killed_mid_pull_is_taken_over(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    """The lane's holder killed in the middle of its pre-pull (SIGKILL: no renewal, no
    release): the next Node of the lane takes it over once the lease has run out, and the
    killed Node, started again, is updated like the others."""
    async with bootstrapped(cluster, base, workers=3, logs=True, reboot_seconds=5.0,
                            agent_args=["--prestage-lease-seconds", "3"]) as (mcc, r0):  # fmt: skip
        image, shared = await lanes_image(mcc, base, pull_seconds=4.0)
        digest = image.split("@")[1]
        victim, heir = "worker-1", "worker-0"  # ranks 1 and 2 (worker-2 is first, by zone)
        t = await mcc.apply(machine_config("99-worker-os", os_image=image))
        r1 = await mcc.wait_new_rendered(r0)
        async with asyncio.timeout(120):
            while not any(p.host == victim for p in pull_records(shared, digest)):
                await asyncio.sleep(0.1)
        assert (await mcc.node(victim))["metadata"]["annotations"][P + "desiredConfig"] == r0
        await mcc.kill_agent(victim)  # mid-pre-pull, holding the lane
        killed = time.monotonic()
        async with asyncio.timeout(60):
            while f"taken over from {victim}: its lease expired" not in \
                    mcc.log_path(heir).read_text():  # fmt: skip
                await asyncio.sleep(0.1)
        taken = time.monotonic() - killed
        mcc.start_agent(victim)
        await mcc.wait_updated(r1, timeout=300)
        total = time.monotonic() - t

        # One lease (3 s) after the last renewal the heir saw (renewals every second), and soon.
        assert 2.0 <= taken <= 10.0, taken
        pulls = pull_records(shared, digest)
        cut = [p for p in pulls if p.host == victim and p.end is None]
        assert len(cut) == 1, pulls  # the killed pull left no end line
        heirs = [p for p in pulls if p.host == heir]
        assert heirs and heirs[0].start >= killed + 2.0, heirs  # only after the takeover
        await lanes_released(mcc)
        assert mcc.most_unavailable(after=t) == 1
        for name, node in mcc.nodes.items():
            assert node.booted() == digest and node.reboots() == 1, name
        figures.append(f"3-node pool, the lane's holder killed mid-pre-pull (4 s pulls, 3 s "
                       f"leases): taken over {taken:.1f} s after the kill; pool Updated "
                       f"{total:.1f} s after the MachineConfig")  # fmt: skip


async def kubelet_config_refused_then_healed(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    async with bootstrapped(cluster, base, workers=1) as (mcc, r0):
        node = mcc.nodes["worker-0"]
        t = time.monotonic()
        await cluster.add_kubelet_config("max-pods", {"maxPods": 300})
        r1 = await mcc.wait_new_rendered(r0)
        pool = await mcc.wait_degraded("need an image build")
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
        await cluster.delete_kubelet_config("max-pods")
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


async def serving_ca_rotation_rewrites_the_kubeconfigs(
    cluster: PoolBackend, base: Path, figures: list[str]
) -> None:
    """What the operator does when the kube-apiserver serving CA rotates (pkg/operator/sync.go
    syncControllerConfig): the bundle into ConfigMap kubeconfig-data, then the ControllerConfig
    annotation service-ca-rotate=true; the agent rewrites the CA data of both kubeconfigs and
    restarts the kubelet once, as the MCD's certificate writer does."""
    mcc = await MccCluster.create(cluster, base, workers=1)
    try:
        node = mcc.nodes["worker-0"]
        old, new = _ca(base, "kube-apiserver-service-network-signer"), _ca(base, "next")
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
        rotated = time.monotonic()
        await mcc.wait_annotation("worker-0", P + "lastObservedServerCAAnnotation", "true")
        took = time.monotonic() - rotated
        figures.append(f"serving-CA rotation: the agent acknowledged it {took:.1f} s after the "
                       "ControllerConfig changed")  # fmt: skip
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
        # The new CA is host-local content: no new rendered config, nothing to roll out. A
        # re-render would show within one requeue period after the controllers saw the new
        # ControllerConfig; one that did not happen has no event to wait on.
        await cluster.controller_config_seen()
        await asyncio.sleep(cluster.requeue_period)
        assert await mcc.rendered_configs() == rendered_before
        assert await mcc.wait_updated() == r0
        units = [a["detail"] for a in node.sim.actions() if a["kind"] == "unit"]
        assert units.count("restart kubelet.service") == 1
        assert node.reboots() == 0
        annotations = (await mcc.node("worker-0"))["metadata"]["annotations"]
        assert annotations[P + "state"] == "Done"
    finally:
        await mcc.close()


SCENARIOS = (
    bootstrap_ssh_key_then_image_update,
    bad_image_rolled_back_then_healed,
    three_nodes_roll_one_at_a_time,
    pool_target_prestaged_before_each_nodes_turn,
    pool_prepulls_one_lane_in_the_controllers_order,
    pool_prepull_holder_killed_mid_pull_is_taken_over,
    kubelet_config_refused_then_healed,
    serving_ca_rotation_rewrites_the_kubeconfigs,
)
# Pools whose pre-pulls take seconds through the shared simulated registry, so that their order
# and overlap can be measured: the stand-ins run them in the rollout tier (tests/rollouts.sh).
TIMED_PULLS = (
    pool_target_prestaged_before_each_nodes_turn,
    pool_prepulls_one_lane_in_the_controllers_order,
    pool_prepull_holder_killed_mid_pull_is_taken_over,
)


async def tied_nodes_picked_out_of_name_order_leave_the_queue(
    cluster: StandInCluster, base: Path, figures: list[str]
) -> None:
    """Four Nodes created in the same second (a MachineSet scale-up) tie in the controller's
    sort: the agents guess their order by name, and the controller (the stand-in's lister
    order, the device for Go's unstable sort here) picks worker-0, worker-2, worker-1,
    worker-3. worker-2 is picked while worker-1 pre-pulls through the one lane and worker-3
    waits: it leaves the queue at its turn, and the lane goes to worker-3 as soon as worker-1 is
    through, while worker-2 still pulls. Stand-ins only: the real controller's tie cannot be
    steered. The pool is paused (it still publishes its target) until worker-1's pre-pull has
    run a second, so that the first pick comes during it; worker-1's pull is then held (the
    shared registry's hold file) until worker-2 is picked, however long worker-0's turn takes
    on a loaded machine."""
    picked = ["worker-0", "worker-2", "worker-1", "worker-3"]
    pools = "/apis/machineconfiguration.openshift.io/v1/machineconfigpools/worker"
    # Pulls (6 s) longer than a turn's drain, reboot (2 s) and restart, so that worker-2's turn
    # comes while worker-1 still pre-pulls; shorter than three of them, so that worker-3's
    # pre-pull is over by its turn.
    async with bootstrapped(cluster, base, workers=4, logs=True,
                            reboot_seconds=2.0) as (mcc, r0):  # fmt: skip
        for name in mcc.nodes:  # one second for all four, as a scale-up makes them

            def created(node: dict) -> None:
                node["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"

            cluster.kube.mutate("nodes", name, created)
        controller = next(c for c in cluster.controllers if isinstance(c, NodeController))
        controller.listing = lambda nodes: sorted(
            nodes, key=lambda n: picked.index(n["metadata"]["name"])
        )
        shared = base / "registry"
        image = ""
        for name, node in mcc.nodes.items():
            image = node.sim.add_image("quay.io/example/os:tied", LANE_FILES)
            link = LANE_IMAGE_BYTES / 6.0
            node.sim.set_shared_link(shared, registry_bps=10 * link, link_bps=link, host=name)
        digest = image.split("@")[1]
        await mcc.cluster.merge_patch(pools, {"spec": {"paused": True}})
        t = await mcc.apply(machine_config("99-worker-os", os_image=image))
        r1 = await mcc.wait_new_rendered(r0)
        async with asyncio.timeout(60):
            while not any(r.host == "worker-1" for r in pull_records(shared, digest)):
                await asyncio.sleep(0.05)
        # A sixth of worker-1's pre-pull, then it waits for worker-2's pick: the lane is still
        # worker-1's at that pick however long worker-0's turn takes on a loaded machine.
        await asyncio.sleep(1.0)
        hold = SharedLink(shared, 0, 0, "worker-1").hold_path("worker-1")
        hold.touch()
        await mcc.cluster.merge_patch(pools, {"spec": {"paused": False}})
        await mcc.wait_annotation("worker-2", P + "desiredConfig", r1, timeout=120)
        hold.unlink()
        await mcc.wait_updated(r1, timeout=300)
        total = time.monotonic() - t

        picks = {n: mcc.first(n, lambda a: a.get(P + "desiredConfig") == r1, t) or 0.0
                 for n in mcc.nodes}  # fmt: skip
        assert sorted(mcc.nodes, key=lambda n: picks[n]) == picked, picks
        records = {r.host: r for r in merged_pulls(shared, digest)}
        assert sorted(records) == sorted(mcc.nodes), records  # one pull each
        ends = {name: r.end or 0.0 for name, r in records.items()}
        turn, holder, after = records["worker-2"], records["worker-1"], records["worker-3"]
        assert turn.start >= picks["worker-2"], (turn, picks)  # pulled at its turn ...
        assert holder.start < picks["worker-2"] < ends["worker-1"], (holder, picks)  # ... queued
        assert ends["worker-1"] - 0.2 <= after.start < ends["worker-2"] - 0.3, records
        for name in ("worker-1", "worker-3"):
            assert ends[name] <= picks[name], (name, records, picks)  # pulled before its turn
        log = mcc.log_path("worker-2").read_text()
        assert "turn pulls without its lane (another node holds it); out of its queue" in log
        (lane,) = await lanes_released(mcc)
        assert lane["metadata"]["annotations"]["image-mode.openshift.io/passed"] == "0-3"
        assert mcc.most_unavailable(after=t) == 1
        ahead = ends["worker-2"] - after.start
        figures.append(f"4 tied Nodes picked {', '.join(picked)} (6 s pulls): worker-3's "
                       f"pre-pull began {ahead:.1f} s before worker-2's turn pull ended; pool "
                       f"Updated {total:.1f} s after the MachineConfig")  # fmt: skip
