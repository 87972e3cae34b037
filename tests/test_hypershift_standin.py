"""The HyperShift InPlace stand-ins (tests/scenarios/hypershift_standin.py) hold the contract
the kit's README observed on the real upgrader and drainer ("The contract, as observed"),
driven by a small node daemon like the kit's `fake-inplace-daemon`; then the harness
(tests/scenarios/hostedpool.py) with a fake daemon process in place of the agent."""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from standins.demo.objects import machine_config
from standins.kube import Change, FakeKube
from tests.scenarios import hypershift_payload as hp
from tests.scenarios import hypershift_standin as hs
from tests.scenarios.hostedpool import HostedPool
from tests.scenarios.hypershift_standin import (
    CURRENT,
    CURRENT_CONFIG,
    DESIRED,
    DESIRED_DRAIN,
    IN_PROGRESS_FALSE,
    IN_PROGRESS_TRUE,
    LAST_APPLIED_DRAIN,
    MCA,
    RELEASE_VERSION,
    STATE,
    Drainer,
    HostedNodePool,
    InPlaceUpgrader,
    annotations,
)

IMG1 = "quay.example/os/node@sha256:" + "1" * 64
IMG2 = "quay.example/os/node@sha256:" + "2" * 64


def mc(tag: str, image: str = IMG1, key: str = "ssh-ed25519 AAAA one") -> dict[str, Any]:
    files = [{"path": "/etc/kit-selftest", "mode": 420, "contents": {"source": f"data:,{tag}"}}]
    return machine_config(f"rendered-master-{tag}", image=image, files=files, keys=[key],
                          version="3.5.0")  # fmt: skip


# -- the node side, played in process ---------------------------------------------------------


def patch(kube: FakeKube, node: str, **values: str) -> None:
    kube.patch_annotations("nodes", node, {MCA + k: v for k, v in values.items()})


async def until(kube: FakeKube, node: str, predicate, timeout: float = 5.0) -> dict[str, str]:
    obj = await kube.wait_for("nodes", node, lambda n: predicate(annotations(n)), timeout=timeout)
    return annotations(obj)


async def finish(kube: FakeKube, node: str, h: str, *, drain: bool = True) -> None:
    """What the MCD writes for one update: drain request, then one Done patch, each answered."""
    if drain:
        patch(kube, node, state="Working", reason="", desiredDrain=f"drain-{h}")
        await until(kube, node, lambda a: a.get(LAST_APPLIED_DRAIN) == f"drain-{h}")
    patch(kube, node, currentConfig=h, state="Done", reason="", desiredDrain=f"uncordon-{h}")
    await until(kube, node, lambda a: a.get(LAST_APPLIED_DRAIN) == f"uncordon-{h}")


class FakeDaemon:
    """The kit's fake-inplace-daemon in process: wait desiredConfig ≠ currentConfig, read the
    ConfigMap until its hash is it, decode it, drain, report Done; again."""

    def __init__(self, kube: FakeKube, pool: HostedNodePool, node: str, *,
                 hold: asyncio.Event | None = None) -> None:  # fmt: skip
        self.kube, self.pool, self.node, self.hold = kube, pool, node, hold
        self.decoded: list[dict[str, Any]] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        kube, ns = self.kube, self.pool.upgrade_namespace
        while True:
            a = await until(kube, self.node, lambda a: a.get(DESIRED, a.get(CURRENT_CONFIG))
                            != a.get(CURRENT_CONFIG), timeout=3600)  # fmt: skip
            h = a[DESIRED]
            cm = await kube.wait_for("configmaps", self.pool.configmap,
                                     lambda c, h=h: bool(c) and c["data"]["hash"] == h, ns,
                                     3600)  # fmt: skip
            self.decoded.append(hp.payload_machine_config(cm["data"]["config"]))
            patch(kube, self.node, state="Working", reason="", desiredDrain=f"drain-{h}")
            await until(kube, self.node, lambda a, h=h: a.get(LAST_APPLIED_DRAIN) == f"drain-{h}",
                        timeout=3600)  # fmt: skip
            if self.hold is not None:
                await self.hold.wait()
            patch(kube, self.node, currentConfig=h, state="Done", reason="",
                  desiredDrain=f"uncordon-{h}")  # fmt: skip

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class Recorder:
    """Every committed write, in order: (plural, type, name, object)."""

    def __init__(self, kube: FakeKube) -> None:
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []
        kube.add_hook(self)

    def __call__(self, change: Change) -> None:
        self.events.append((change.rt.plural, change.type, change.obj["metadata"]["name"],
                            copy.deepcopy(change.obj)))  # fmt: skip

    def index(self, predicate) -> int:
        return next(i for i, e in enumerate(self.events) if predicate(*e))

    def most_at_once(self, counts) -> int:
        """The most Nodes for which `counts(annotations)` held at the same time."""
        latest: dict[str, dict[str, str]] = {}
        worst = 0
        for plural, _, name, obj in self.events:
            if plural == "nodes":
                latest[name] = annotations(obj)
                worst = max(worst, sum(1 for a in latest.values() if counts(a)))
        return worst

    def most_cordoned(self) -> int:
        latest: dict[str, bool] = {}
        worst = 0
        for plural, _, name, obj in self.events:
            if plural == "nodes":
                latest[name] = bool(obj.get("spec", {}).get("unschedulable"))
                worst = max(worst, sum(latest.values()))
        return worst

    def pods(self) -> tuple[list[str], int]:
        """Pods created in order, and the most that existed at once."""
        made, live, worst = [], set(), 0
        for plural, kind, name, _ in self.events:
            if plural == "pods":
                if kind == "ADDED":
                    made.append(name)
                    live.add(name)
                elif kind == "DELETED":
                    live.discard(name)
                worst = max(worst, len(live))
        return made, worst


def updating(a: dict[str, str]) -> bool:
    return a.get(CURRENT_CONFIG, "") != a.get(DESIRED, "")


class Stand:
    def __init__(self, kube: FakeKube, pools: list[HostedNodePool],
                 upgraders: list[InPlaceUpgrader], drainer: Drainer) -> None:  # fmt: skip
        self.kube, self.pools, self.upgraders, self.drainer = kube, pools, upgraders, drainer
        self.pool, self.upgrader = pools[0], upgraders[0]
        self.daemons: list[FakeDaemon] = []

    def daemons_for(self, *nodes: str, hold: asyncio.Event | None = None) -> list[FakeDaemon]:
        made = [FakeDaemon(self.kube, p, n, hold=hold)
                for p in self.pools for n in p.nodes if not nodes or n in nodes]  # fmt: skip
        self.daemons += made
        return made

    def node(self, name: str) -> dict[str, str]:
        return annotations(self.kube.get("nodes", name))

    def pods(self) -> set[str]:
        return {p["metadata"]["name"]
                for p in self.kube.list("pods", self.pool.upgrade_namespace)}  # fmt: skip


async def stand(tmp_path: Path, *pools: tuple[str, int, int]) -> Stand:
    kube = FakeKube(bookmark_interval=0.5)
    await kube.start()
    made = [HostedNodePool.create(kube, name, n, tmp_path, max_unavailable=k)
            for name, n, k in pools]  # fmt: skip
    upgraders = [InPlaceUpgrader(kube, p, delay=0.005) for p in made]
    drainer = Drainer(kube, delay=0.005, retry_period=0.1, drain_timeout=0.3, evict_retry=0.05)
    for u in upgraders:
        u.start()
    drainer.start()
    return Stand(kube, made, upgraders, drainer)


async def close(s: Stand) -> None:
    for d in s.daemons:
        await d.stop()
    for u in s.upgraders:
        await u.stop()
    await s.drainer.stop()
    await s.kube.stop()


# -- the payload --------------------------------------------------------------------------------


def test_payload_is_the_mcs_ignition_gzipped_in_base64() -> None:
    doc = mc("r1")
    payload = hp.encode_payload(doc)
    assert payload == hp.encode_payload(doc)  # no time in the gzip header
    raw = gzip.decompress(base64.b64decode(payload))
    ign = json.loads(raw)
    assert ign["ignition"]["version"] == "3.5.0"
    files = hp.ignition_files(ign)
    assert set(files) == {"/etc/kit-selftest", hp.MCS_CONTENT, hp.NODE_ANNOTATIONS,
                          hp.ENCAPSULATED}  # fmt: skip
    sources = {f["path"]: f["contents"]["source"] for f in ign["storage"]["files"]}
    assert sources[hp.MCS_CONTENT].startswith("data:,%7B")  # URL-encoded, as the kit's
    assert json.loads(files[hp.MCS_CONTENT]) == doc == hp.payload_machine_config(payload)
    seeded = json.loads(files[hp.NODE_ANNOTATIONS])
    rendered = "rendered-master-r1"
    assert seeded == {MCA + "currentConfig": rendered, MCA + "desiredConfig": rendered,
                      MCA + "state": "Done"}  # fmt: skip
    assert json.loads(files[hp.ENCAPSULATED])["spec"]["config"] == {
        "ignition": {"version": "3.5.0"}}  # fmt: skip
    # Not yet a rendered name: one is made, as the MCS serves the rendered config.
    named = hp.payload_machine_config(hp.encode_payload(machine_config("99-x", image=IMG1)))
    assert named["metadata"]["name"].startswith("rendered-master-")
    assert len(named["metadata"]["name"]) == len("rendered-master-") + 32


def test_config_hash_is_fnv32a_of_the_ignition_and_the_release_as_hcp_target() -> None:
    assert hp.fnv32a(b"") == "811c9dc5" and hp.fnv32a(b"a") == "e40c292c"  # FNV-1a vectors
    raw = hp.ignition_bytes(mc("r1"))
    assert hp.config_hash(raw, "4.22.0-0.kit") == hp.fnv32a(raw + b"\0" + b"4.22.0-0.kit")
    assert hp.config_hash(raw, "4.22.0-0.kit") != hp.config_hash(raw, "4.22.1-0.kit")
    # A target given as bytes, as a payload or as a MachineConfig is the same Ignition.
    forms = (raw, hp.encode_ignition(raw), mc("r1"))
    assert {hp.target_ignition(form) for form in forms} == {raw}
    with pytest.raises(ValueError, match="not an Ignition config"):
        hp.target_ignition(b'{"kind": "MachineConfig"}')


# -- the pure rules ---------------------------------------------------------------------------


def node(name: str, current: str = "", desired: str = "") -> dict[str, Any]:
    notes = {k: v for k, v in ((CURRENT_CONFIG, current), (DESIRED, desired)) if v}
    return {"metadata": {"name": name, "annotations": notes}}


def test_selection_rules_and_the_slicing_bug() -> None:
    fresh = [node(f"n{k}") for k in range(3)]
    assert [n["metadata"]["name"] for n in hs.nodes_to_upgrade(fresh, "T", 1)] == ["n0"]
    assert len(hs.nodes_to_upgrade(fresh, "T", 2)) == 2
    # One in flight to an older target: re-aimed, and it takes the only slot.
    flight = [node("n0", "A", "B"), node("n1", "A", "A"), node("n2", "A", "A")]
    assert [n["metadata"]["name"] for n in hs.nodes_to_upgrade(flight, "T", 1)] == ["n0"]
    # Two done within one reconcile, one candidate, capacity 2: out of range (Go cap 1).
    done = [node("n0", "T", "T"), node("n1", "T", "T"), node("n2", "A", "A")]
    with pytest.raises(hs.UpstreamPanic, match=r"slice bounds out of range \[:2\] with "
                                               r"capacity 1"):  # fmt: skip
        hs.nodes_to_upgrade(done, "T", 2)
    # Three candidates (Go cap 4), capacity 4: a nil Node after the real ones.
    many = [node(f"n{k}", "A", "A") for k in range(3)] + [node("n3", "T", "T")]
    picked = hs.available_candidates(many, "T", 4)
    assert picked[3] is None and len(picked) == 4


# -- the stand-ins on the loopback server -------------------------------------------------------


async def test_hosted_node_pool_as_hcp_up_makes_it(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 2, 1))
    try:
        n0 = s.kube.get("nodes", "np-0")
        assert n0["metadata"]["labels"][hs.NODE_POOL] == "np"
        assert n0["metadata"]["annotations"][hs.CAPI + "machine"] == "np-machine-0"
        assert not [k for k in n0["metadata"]["annotations"] if k.startswith(MCA)]
        assert n0["status"]["conditions"][0]["type"] == "Ready"
        assert s.upgrader.target == s.upgrader.current == hp.fnv32a(b"kit-initial:np")
        cfg = yaml.safe_load(s.pool.kubeconfig("np-0").read_text())
        headers = {"Authorization": "Bearer " + cfg["users"][0]["user"]["token"]}
        async with aiohttp.ClientSession(s.kube.url, headers=headers) as http:

            async def status(method: str, path: str, body: Any = None) -> int:
                ct = {"Content-Type": "application/merge-patch+json"}
                async with http.request(method, path, json=body, headers=ct) as resp:
                    return resp.status

            assert await status("GET", "/api/v1/nodes/np-0") == 200
            assert await status("GET", "/api/v1/nodes/np-1") == 403
            assert await status("PATCH", "/api/v1/nodes/np-1", {"metadata": {}}) == 403
            # Allowed, not there yet (the upgrader writes it at the first rollout).
            assert await status("GET", "/api/v1/namespaces/np-upgrade/configmaps/np-upgrade") \
                == 404  # fmt: skip
            assert await status("GET", "/api/v1/namespaces/np-upgrade/configmaps") == 200
            assert await status("GET", "/api/v1/namespaces/default/configmaps") == 403
    finally:
        await close(s)


async def test_rollouts_one_node_at_a_time(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 3, 1))
    rec = Recorder(s.kube)
    try:
        s.daemons_for()
        h1 = s.upgrader.set_target(mc("r1"))
        await s.upgrader.completed(h1, timeout=10)
        # The ConfigMap (payload as is) before the first desiredConfig.
        first_cm = rec.index(lambda p, k, n, o: p == "configmaps")
        first_pick = rec.index(lambda p, k, n, o: p == "nodes" and DESIRED in annotations(o))
        assert first_cm < first_pick
        cm = s.kube.get("configmaps", "np-upgrade", "np-upgrade")
        assert cm["data"] == {"config": s.upgrader.secrets[f"token-np-{h1}"].data["payload"],
                              "hash": h1}  # fmt: skip
        assert cm["metadata"]["labels"] == {hs.MANAGED: "true"}
        ns_labels = s.kube.get("namespaces", "np-upgrade")["metadata"]["labels"]
        assert ns_labels["pod-security.kubernetes.io/enforce"] == "privileged"
        assert rec.most_at_once(updating) == 1
        # Cordoned only from the drainer's answer to drain-<h> until it answers uncordon-<h>.
        for plural, _, name, obj in rec.events:
            if plural == "nodes" and obj.get("spec", {}).get("unschedulable"):
                a = annotations(obj)
                assert a[DESIRED_DRAIN] == f"drain-{h1}" or (
                    a[DESIRED_DRAIN] == f"uncordon-{h1}"
                    and a.get(LAST_APPLIED_DRAIN) == f"drain-{h1}"), name  # fmt: skip
        assert rec.most_cordoned() == 1
        # First rollout: every Node gets a pod at once (no state yet), all deleted at the end.
        made, worst = rec.pods()
        assert sorted(made) == [f"machine-config-daemon-np-{k}" for k in range(3)]
        assert worst == 3 and s.pods() == set()
        ms = s.upgrader.machineset.annotations
        assert ms[CURRENT] == h1 and IN_PROGRESS_TRUE not in ms and IN_PROGRESS_FALSE not in ms
        # release-version on the Machines finished while in progress: all but the last.
        versions = [m.annotations.get(RELEASE_VERSION) for m in s.upgrader.machines.values()]
        assert versions.count("4.22.0-0.kit") == 2 and versions.count(None) == 1
        for k in range(3):
            a = s.node(f"np-{k}")
            settled = (h1, "Done", f"uncordon-{h1}")
            assert (a[CURRENT_CONFIG], a[STATE], a[LAST_APPLIED_DRAIN]) == settled
            assert not s.kube.get("nodes", f"np-{k}")["spec"].get("unschedulable")
        # Second rollout: a pod only for the Node selected, when it is selected.
        mark = len(rec.events)
        h2 = s.upgrader.set_target(mc("r2"), release_version="4.22.1-0.kit")
        await s.upgrader.completed(h2, timeout=10)
        latest: dict[str, dict[str, str]] = {}
        for plural, kind, name, obj in rec.events[mark:]:
            if plural == "nodes":
                latest[name] = annotations(obj)
            elif plural == "pods" and kind == "ADDED":
                owner = name.removeprefix("machine-config-daemon-")
                assert latest[owner][DESIRED] == h2 and updating(latest[owner]), name
        assert rec.most_at_once(updating) == 1
        assert [d.decoded[-1]["metadata"]["name"] for d in s.daemons] == ["rendered-master-r2"] * 3
    finally:
        await close(s)


async def test_never_more_than_max_unavailable(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 4, 2))
    rec = Recorder(s.kube)
    try:
        h = s.upgrader.set_target(mc("r1"))
        await s.upgrader.idle()
        picked = [n for n in s.pool.nodes if s.node(n).get(DESIRED) == h]
        assert len(picked) == 2
        # Both finish within one reconcile: two candidates left, both taken.
        await asyncio.gather(*(finish(s.kube, n, h) for n in picked))
        await s.upgrader.idle()
        rest = [n for n in s.pool.nodes if n not in picked]
        assert all(s.node(n).get(DESIRED) == h for n in rest)
        await asyncio.gather(*(finish(s.kube, n, h) for n in rest))
        await s.upgrader.completed(h, timeout=5)
        assert rec.most_at_once(updating) == 2 and s.upgrader.panics == 0
    finally:
        await close(s)


async def test_degraded_node_halts_the_pool_until_it_reports_done(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 3, 1))
    try:
        h = s.upgrader.set_target(mc("r1"))
        a = await until(s.kube, "np-0", lambda a: a.get(DESIRED) == h)
        assert a.get(DESIRED) == h and s.node("np-1").get(DESIRED) is None
        patch(s.kube, "np-0", state="Degraded", reason="boom")
        ms = s.upgrader.machineset.annotations
        async with asyncio.timeout(2):
            while IN_PROGRESS_FALSE not in ms:
                await asyncio.sleep(0.005)
        rec = Recorder(s.kube)
        await asyncio.sleep(0.3)
        assert ms[IN_PROGRESS_FALSE] == "Node np-0 in nodepool degraded: boom"
        assert IN_PROGRESS_TRUE not in ms and ms[CURRENT] != h
        expected = ("degraded node np-0 found, cannot progress in-place upgrade. Degraded "
                    "reason: boom")  # fmt: skip
        assert s.upgrader.errors.count(expected) >= 3  # retried with backoff
        assert [e for e in rec.events if e[0] == "pods"] == []  # pods left alone
        assert [n for n in s.pool.nodes if s.node(n).get(DESIRED) == h] == ["np-0"]
        # The daemon retries and reports Done: the rollout goes on at once.
        s.daemons_for()
        await finish(s.kube, "np-0", h)
        await s.upgrader.completed(h, timeout=10)
        assert IN_PROGRESS_FALSE not in ms
    finally:
        await close(s)


async def test_target_changed_mid_rollout(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 3, 1))
    try:
        h1 = s.upgrader.set_target(mc("r1"))
        await until(s.kube, "np-0", lambda a: a.get(DESIRED) == h1)
        patch(s.kube, "np-0", state="Working", reason="", desiredDrain=f"drain-{h1}")
        await until(s.kube, "np-0", lambda a: a.get(LAST_APPLIED_DRAIN) == f"drain-{h1}")
        uid = s.kube.get("configmaps", "np-upgrade", "np-upgrade")["metadata"]["uid"]
        h2 = s.upgrader.set_target(mc("r2", image=IMG2))
        # The Node in flight to the old target is re-aimed; nothing else is picked.
        await until(s.kube, "np-0", lambda a: a.get(DESIRED) == h2)
        await s.upgrader.idle()
        assert [s.node(n).get(DESIRED) for n in ("np-1", "np-2")] == [None, None]
        cm = s.kube.get("configmaps", "np-upgrade", "np-upgrade")
        assert cm["metadata"]["uid"] == uid and cm["data"]["hash"] == h2  # in place
        s.daemons_for()
        await s.upgrader.completed(h2, timeout=10)
        assert all(s.node(n)[CURRENT_CONFIG] == h2 for n in s.pool.nodes)
        assert all(d.decoded[-1]["spec"]["osImageURL"] == IMG2 for d in s.daemons)
        assert [t for _, t in s.upgrader.selected].count(h1) == 1
    finally:
        await close(s)


async def test_getavailablecandidates_bug_stalls_the_rollout(tmp_path: Path) -> None:
    """The kit's selftest-hypershift case: 3 Nodes, maxUnavailable 2, both selected Nodes
    finish while the upgrader is stopped; it panics at every reconcile from then on."""
    s = await stand(tmp_path, ("mu2", 3, 2))
    try:
        h = s.upgrader.set_target(mc("r1"))
        await s.upgrader.idle()
        picked = [n for n in s.pool.nodes if s.node(n).get(DESIRED) == h]
        assert picked == ["mu2-0", "mu2-1"]
        await s.upgrader.stop()
        await asyncio.gather(*(finish(s.kube, n, h) for n in picked))
        s.upgrader.start()
        async with asyncio.timeout(3):
            while s.upgrader.panics < 4:
                await asyncio.sleep(0.01)
        assert s.upgrader.errors[-1] == "runtime error: slice bounds out of range [:2] with " \
            "capacity 1"  # fmt: skip
        ms = s.upgrader.machineset.annotations
        assert ms[IN_PROGRESS_TRUE].endswith("Total Nodes: 3. Upgraded: 2") and ms[CURRENT] != h
        assert s.node("mu2-2").get(DESIRED) is None
        assert s.pods() >= {"machine-config-daemon-mu2-0", "machine-config-daemon-mu2-1"}
    finally:
        await close(s)


async def test_drainer_evicts_bound_pods_and_retries(tmp_path: Path) -> None:
    s = await stand(tmp_path, ("np", 1, 1))
    try:

        def pod(name: str, **meta: Any) -> dict[str, Any]:
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": "default", "labels": {"app": "x"},
                                 **meta}, "spec": {"nodeName": "np-0"}}  # fmt: skip

        s.kube.put(pod("app"))
        s.kube.put(pod("ds", ownerReferences=[{"kind": "DaemonSet", "name": "d", "uid": "u",
                                               "apiVersion": "apps/v1"}]))  # fmt: skip
        mcd = pod("machine-config-daemon-np-0")
        mcd["metadata"]["namespace"] = "np-upgrade"
        s.kube.put(mcd)
        s.kube.put({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": "block", "namespace": "default"},
                    "spec": {"maxUnavailable": 0,
                             "selector": {"matchLabels": {"app": "x", "pdb": "yes"}}}})  # fmt: skip
        s.kube.patch_labels("pods", "app", {"pdb": "yes"}, "default")
        patch(s.kube, "np-0", desiredDrain="drain-h")
        async with asyncio.timeout(3):
            while not s.drainer.failures:
                await asyncio.sleep(0.01)
        assert "global timeout reached" in s.drainer.failures[0][1]
        assert s.kube.get("nodes", "np-0")["spec"]["unschedulable"] is True
        assert LAST_APPLIED_DRAIN not in s.node("np-0")
        s.kube.patch_labels("pods", "app", {"pdb": None}, "default")  # the PDB lets go
        await until(s.kube, "np-0", lambda a: a.get(LAST_APPLIED_DRAIN) == "drain-h")
        assert s.drainer.evicted == [("default", "app")]
        left = {p["metadata"]["name"] for p in s.kube.list("pods")}
        assert left == {"ds", "machine-config-daemon-np-0"}
        patch(s.kube, "np-0", desiredDrain="uncordon-h")
        await until(s.kube, "np-0", lambda a: a.get(LAST_APPLIED_DRAIN) == "uncordon-h")
        assert not s.kube.get("nodes", "np-0")["spec"].get("unschedulable")
        patch(s.kube, "np-0", desiredDrain="bogus")
        async with asyncio.timeout(2):
            while "unknown drain verb" not in s.drainer.failures[-1][1]:
                await asyncio.sleep(0.01)
        assert s.node("np-0")[LAST_APPLIED_DRAIN] == "uncordon-h"
    finally:
        await close(s)


async def test_two_pools_on_one_server_and_clean_stops(tmp_path: Path) -> None:
    before = asyncio.all_tasks()
    s = await stand(tmp_path, ("a", 2, 1), ("b", 2, 1))
    try:
        s.daemons_for()
        ha = s.upgraders[0].set_target(mc("ra"))
        hb = s.upgraders[1].set_target(mc("rb"))
        await asyncio.gather(s.upgraders[0].completed(ha, 10), s.upgraders[1].completed(hb, 10))
        assert {n for n, _ in s.upgraders[0].selected} == {"a-0", "a-1"}
        assert {n for n, _ in s.upgraders[1].selected} == {"b-0", "b-1"}
        assert s.kube.get("configmaps", "b-upgrade", "b-upgrade")["data"]["hash"] == hb
    finally:
        await close(s)
    assert asyncio.all_tasks() - before == set()


# -- the harness, with a fake daemon process in place of the agent ------------------------------

# The node side as the kit's fake-inplace-daemon plays it, over HTTP as the Node's identity,
# plus a simulated reboot (exit 3) when the image changes; standard library and the simulated
# host only, so that it starts fast.
FAKE_DAEMON = r"""
import asyncio, base64, gzip, json, sys, time, urllib.parse, urllib.request
from pathlib import Path
from standins.host.simulated import SimulatedHost, SimulatedSystem
server, token, node, host = sys.argv[1:5]
M = "machineconfiguration.openshift.io/"
sim = SimulatedHost(Path(host))
sim.boot()
applied_path = sim.root / "etc/mcd-currentconfig.json"

def call(method, path, body=None):
    req = urllib.request.Request(server + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token,
                 "Content-Type": "application/merge-patch+json"})
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)

def ann():
    return call("GET", "/api/v1/nodes/" + node)["metadata"].get("annotations") or {}

def patch(**kv):
    call("PATCH", "/api/v1/nodes/" + node,
         {"metadata": {"annotations": {M + k: v for k, v in kv.items()}}})

def payload_machine_config(payload):
    ign = json.loads(gzip.decompress(base64.b64decode(payload)))
    for f in ign["storage"]["files"]:
        if f["path"] == "/etc/mcs-machine-config-content.json":
            return json.loads(urllib.parse.unquote(f["contents"]["source"][len("data:,"):]))

def until(pred):
    while not pred(ann()):
        time.sleep(0.02)

me = call("GET", "/api/v1/nodes/" + node)
pool = me["metadata"]["labels"]["hypershift.openshift.io/nodePool"]
while True:
    a = ann()
    d = a.get(M + "desiredConfig")
    if not d or d == a.get(M + "currentConfig"):
        time.sleep(0.02)
        continue
    cm = call("GET", f"/api/v1/namespaces/{pool}-upgrade/configmaps/{pool}-upgrade")
    if cm["data"]["hash"] != d:
        time.sleep(0.02)
        continue
    want = payload_machine_config(cm["data"]["config"])
    provisioned = sim.root / "etc/mcs-machine-config-content.json"
    have = json.loads((applied_path if applied_path.exists() else provisioned).read_text())
    if have != want:
        patch(state="Working", reason="", desiredDrain="drain-" + d)
        until(lambda a: a.get(M + "lastAppliedDrain") == "drain-" + d)
        applied_path.write_text(json.dumps(want))
        if want["spec"].get("osImageURL") != have["spec"].get("osImageURL"):
            asyncio.run(SimulatedSystem(sim).reboot())
            sys.exit(3)
    patch(currentConfig=d, state="Done", reason="", desiredDrain="uncordon-" + d)
    until(lambda a: a.get(M + "lastAppliedDrain") == "uncordon-" + d)
"""


def fake_daemon(node, kubeconfig: Path) -> list[str]:
    cfg = yaml.safe_load(kubeconfig.read_text())
    return [sys.executable, "-c", FAKE_DAEMON, cfg["clusters"][0]["cluster"]["server"],
            cfg["users"][0]["user"]["token"], node.name, str(node.sim.base)]  # fmt: skip


async def test_harness_drives_node_daemons_through_an_image_rollout(tmp_path: Path) -> None:
    pool = await HostedPool.create(tmp_path, 3, max_unavailable=1, daemon_command=fake_daemon)
    try:
        host = pool.nodes["np-0"].sim.root
        on_disk = json.loads((host / "etc/mcs-machine-config-content.json").read_text())
        assert on_disk["spec"]["osImageURL"] == pool.images["v1"]
        seeded = json.loads((host / "etc/machine-config-daemon/node-annotations.json").read_text())
        assert seeded[MCA + "currentConfig"].startswith("rendered-master-")
        pool.start_agents()
        target = machine_config("rendered-master-v2", image=pool.images["v2"], version="3.5.0")
        h = await pool.set_target(target)
        await pool.wait_complete(h, timeout=30)
        assert pool.most_selected(h) == 1 and pool.most_selected() == 1
        assert pool.most_cordoned() == 1
        assert pool.reboots() == {f"np-{k}": 1 for k in range(3)}
        assert pool.boots() == {f"np-{k}": 2 for k in range(3)}
        assert all(seq[-1] == "Done" for seq in pool.states().values())
        assert (await pool.machineset())[CURRENT] == h
        assert sum(RELEASE_VERSION in m for m in (await pool.machines()).values()) == 2
    finally:
        await pool.close()
