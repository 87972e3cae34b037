"""HyperShift mode, one node in process: the payload decoder on every bad input, the pre-stage
decision, and the agent against the loopback API server with the Node and the upgrade
ConfigMap written by the test as the upgrader writes them (the whole NodePool, driven by the
upgrader's stand-in, is tests/test_hypershift_scenarios.py)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.app.cli import main as cli_main
from agent.app.runtime import open_host
from agent.cluster.annotations import NodeView
from agent.cluster.kube import Kube
from agent.cluster.prestage import Act
from agent.cluster.prestager import PrestageOptions
from agent.core.policy import Allowlist
from agent.errors import InputError
from agent.hypershift.agent import HypershiftAgent, HypershiftOptions, refusal_reason
from agent.hypershift.target import decide
from agent.model.hypershift import payload_from_configmap
from standins.demo.loopback import make_host
from standins.host.simulated import SimulatedHost
from standins.kube import FakeKube
from standins.kube.auth import Rule
from tests.builders import ign_file, machine_config
from tests.scenarios.hypershift_payload import encode_ignition, encode_payload

P = "machineconfiguration.openshift.io/"
NS = CM = "np-upgrade"
NODE = "np-0"


def configmap(config: str, config_hash: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CM, "namespace": NS}, "data": {"config": config,
                                                                 "hash": config_hash}}  # fmt: skip


# -- the payload ------------------------------------------------------------------------------
def test_a_payload_decodes_to_its_machine_config_named_by_the_hash() -> None:
    mc = machine_config("rendered-worker-9", keys=["ssh-ed25519 AAAA"])
    payload = payload_from_configmap(configmap(encode_payload(mc), "0a1b2c3d"))
    document = json.loads(payload.document)
    assert payload.hash == "0a1b2c3d"
    assert document["metadata"] == {"name": "0a1b2c3d"}
    assert document["spec"] == mc["spec"]


def _ignition(files: list[dict[str, Any]]) -> str:
    doc = {"ignition": {"version": "3.5.0"}, "storage": {"files": files}}
    return encode_ignition(json.dumps(doc).encode())


MC_FILE = "/etc/mcs-machine-config-content.json"
BAD_PAYLOADS = {
    "not base64": ("%%%", "data.config", "not base64"),
    "not gzip": (base64.b64encode(b"plain").decode(), "data.config", "gzip"),
    "not JSON": (base64.b64encode(gzip.compress(b"{")).decode(), "data.config", "invalid"),
    "no ignition": (encode_ignition(b'{"storage": {}}'), "data.config", "not an Ignition"),
    "no MC file": (_ignition([]), "data.config: storage.files", "no file"),
    "two MC files": (_ignition([ign_file(MC_FILE, "{}"), ign_file(MC_FILE, "{}")]),
                     "data.config: storage.files", "more than one"),
    "bad data URL": (_ignition([{"path": MC_FILE, "contents": {"source": "https://x/y"}}]),
                     "contents", "unsupported source scheme"),
    "not a MachineConfig": (_ignition([ign_file(MC_FILE, '{"kind": "Pod"}')]),
                            "contents", "not a MachineConfig"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_PAYLOADS)
def test_a_bad_payload_names_the_field(case: str) -> None:
    text, field_part, message = BAD_PAYLOADS[case]
    with pytest.raises(InputError) as caught:
        payload_from_configmap(configmap(text, "0a1b2c3d"))
    assert field_part in caught.value.field and message in caught.value.message


@pytest.mark.parametrize("value", ["", "a b", "drain-x/y", "x" * 64, 7])
def test_a_hash_that_is_no_token_is_refused(value: object) -> None:
    with pytest.raises(InputError, match="not a config-version hash") as caught:
        payload_from_configmap({"data": {"config": "x", "hash": value}})
    assert caught.value.field == "data.hash"


def test_a_gzip_bomb_is_refused_not_expanded() -> None:
    bomb = base64.b64encode(gzip.compress(b"\0" * (300 << 20))).decode()
    with pytest.raises(InputError, match="expand beyond"):
        payload_from_configmap(configmap(bomb, "0a1b2c3d"))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200), st.one_of(st.none(), st.text(max_size=20), st.integers()))
def test_any_configmap_data_is_a_payload_or_an_input_error(text: str, value: object) -> None:
    with contextlib.suppress(InputError):
        payload_from_configmap({"data": {"config": text, "hash": value}})


def test_a_refusal_tells_the_nodepool_operator_what_to_do() -> None:
    reason = refusal_reason("0a1b2c3d", "files changed outside the live allowlist: /etc/x; "
                            "these changes are image content and need an image build: build "
                            "an OS image that contains them and set osImageURL to its "
                            "digest-pinned reference")  # fmt: skip
    assert reason.startswith("NodePool config 0a1b2c3d cannot be applied in place; files changed")
    assert "MachineConfig in the NodePool's spec.config" in reason
    assert "set osImageURL to" not in reason


# -- the pre-stage decision -------------------------------------------------------------------
def _node(**annotations: str) -> NodeView:
    return NodeView(NODE, {P + k: v for k, v in annotations.items()})


@pytest.mark.parametrize(
    ("node", "target", "idle", "act"),
    [
        (_node(), "h2", True, Act.STAGE),  # never updated in place: no annotations at all
        (_node(currentConfig="h1", desiredConfig="h1", state="Done"), "h2", True, Act.STAGE),
        (_node(currentConfig="h1", desiredConfig="h1", state="Done"), "h2", False, Act.WAIT),
        (_node(currentConfig="h1", desiredConfig="h1", state="Degraded"), "h2", True, Act.WAIT),
        (_node(currentConfig="h1", desiredConfig="h0", state="Working"), "h2", True, Act.WAIT),
        (_node(currentConfig="h1", desiredConfig="h2", state="Done"), "h2", True, Act.HANDOVER),
        (_node(currentConfig="h2", desiredConfig="h2", state="Done"), "h2", True, Act.DROP),
        (_node(currentConfig="h1", desiredConfig="h1"), None, True, Act.DROP),
    ],
)
def test_prestage_decision(node: NodeView, target: str | None, idle: bool, act: Act) -> None:
    assert decide(node, target, idle).act == act


# -- one agent in process ---------------------------------------------------------------------
@dataclass
class Hosted:
    """The loopback server with one NodePool Node, its upgrade namespace and the grant the
    kit's hcp-up gives nodes there; a simulated host provisioned from `initial`; a drainer
    that acknowledges every request; the agent, restarted after each simulated reboot."""

    base: Path
    kube: FakeKube
    sim: SimulatedHost
    images: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)
    starts: int = 0
    drains: list[str] = field(default_factory=list)
    agent: HypershiftAgent | None = None
    checkpoint: Any = None
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def annotations(self) -> dict[str, str]:
        meta = self.kube.get("Node", NODE)["metadata"]
        return {
            k[len(P) :]: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(P)
        }

    def publish(self, mc: dict[str, Any], config_hash: str, *, select: bool = True) -> None:
        """The upgrader: the ConfigMap first, then the Node's desiredConfig."""
        self.kube.put(configmap(encode_payload(mc), config_hash))
        if select:
            self.kube.patch_annotations("Node", NODE, {P + "desiredConfig": config_hash})

    async def until(self, predicate: Any, timeout: float = 15.0) -> dict[str, str]:
        def ok(node: dict[str, Any] | None) -> bool:
            annotations = (node or {}).get("metadata", {}).get("annotations") or {}
            return predicate({k[len(P) :]: v for k, v in annotations.items() if k.startswith(P)})

        await self.kube.wait_for("Node", NODE, ok, timeout=timeout)
        return self.annotations()

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def node_patches(self) -> list[dict[str, Any]]:
        return [r.json()["metadata"]["annotations"] for r in self.kube.requests
                if (r.verb, r.resource, r.name) == ("patch", "nodes", NODE)
                and r.user == f"system:node:{NODE}"]  # fmt: skip

    async def _drainer(self) -> None:
        while True:
            a = self.annotations()
            if a.get("desiredDrain") and a["desiredDrain"] != a.get("lastAppliedDrain"):
                self.drains.append(a["desiredDrain"])
                cordon = a["desiredDrain"].startswith("drain-")
                self.kube.mutate("Node", NODE, lambda n, c=cordon: n.setdefault("spec", {}).update(
                    unschedulable=c or None))  # fmt: skip
                self.kube.patch_annotations("Node", NODE, {P + "lastAppliedDrain":
                                                           a["desiredDrain"]})  # fmt: skip
            await asyncio.sleep(0.02)

    async def _supervise(self) -> None:
        while True:
            self.starts += 1
            api = await Kube.connect(str(self.base / "node.kubeconfig"))
            host = await open_host(f"simulated:{self.sim.base}", Allowlist())
            options = HypershiftOptions(NODE, **{"prestage": PrestageOptions(jitter=0.05),
                                                 "probe_window": 0.5, **self.options})  # fmt: skip
            self.agent = HypershiftAgent(api, host, Allowlist(), options)
            if self.checkpoint is not None:
                self.agent.engine.hooks.checkpoint = self.checkpoint
            try:
                code = await self.agent.run()
            finally:
                await api.close()
            assert code == 3  # a simulated reboot: start again, as systemd would

    def start(self, drainer: bool = True) -> asyncio.Task:
        if drainer:
            self._tasks.append(asyncio.create_task(self._drainer()))
        task = asyncio.create_task(self._supervise())
        self._tasks.append(task)
        return task

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


INITIAL_KEYS = ["ssh-ed25519 AAAA-initial"]


@pytest.fixture
async def hosted(tmp_path: Path) -> AsyncIterator[Hosted]:
    kube = FakeKube(bookmark_interval=0.5)
    await kube.start()
    kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    kube.put({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": NODE, "labels": {"hypershift.openshift.io/nodePool": "np"}},
              "spec": {}, "status": {}})  # fmt: skip
    rules = [Rule(verb, "", "configmaps", namespace=NS) for verb in ("get", "list", "watch")]
    kube.write_kubeconfig(tmp_path / "node.kubeconfig", kube.node_identity(NODE, rules))
    sim, images = make_host(tmp_path)
    initial = machine_config("rendered-master-0", image=images["v1"], keys=INITIAL_KEYS)
    (sim.root / "etc/mcs-machine-config-content.json").write_text(json.dumps(initial))
    world = Hosted(tmp_path, kube, sim, images)
    try:
        yield world
    finally:
        await world.stop()
        await kube.stop()


async def test_live_only_payload_one_done_patch_no_drain_no_reboot(hosted: Hosted) -> None:
    hosted.start()
    keys = ["ssh-ed25519 AAAA-new"]
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=keys), "0000aaaa")
    done = await hosted.until(lambda a: a.get("lastAppliedDrain") == "uncordon-0000aaaa")
    assert done["state"] == "Done" and done["reason"] == "" and done["currentConfig"] == "0000aaaa"
    assert hosted.drains == ["uncordon-0000aaaa"] and hosted.reboots() == 0
    last = hosted.node_patches()[-1]
    assert last == {P + "state": "Done", P + "reason": "", P + "currentConfig": "0000aaaa",
                    P + "desiredDrain": "uncordon-0000aaaa"}  # fmt: skip
    assert not any(k.endswith(("Image", "post-config-action")) for p in hosted.node_patches()
                   for k in p)  # fmt: skip
    ssh = hosted.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
    assert ssh.read_text() == keys[0] + "\n"
    # The MCD's record of what the node runs, for an MCD started here later.
    record = json.loads((hosted.sim.root / "etc/mcd-currentconfig.json").read_text())
    assert record["spec"]["config"]["passwd"]["users"][0]["sshAuthorizedKeys"] == keys


async def test_image_payload_asks_for_a_drain_reboots_once_and_reports_done(
    hosted: Hosted,
) -> None:
    hosted.options["prestage"] = PrestageOptions(mode="off")
    hosted.start()
    hosted.publish(machine_config("x", image=hosted.images["v2"], keys=INITIAL_KEYS), "0000bbbb")
    done = await hosted.until(lambda a: a.get("lastAppliedDrain") == "uncordon-0000bbbb")
    assert done["state"] == "Done" and done["currentConfig"] == "0000bbbb"
    assert hosted.reboots() == 1
    booted = hosted.sim.status_document()["status"]["booted"]["image"]["imageDigest"]
    assert booted == hosted.images["v2"].split("@")[1]
    drain = next(p for p in hosted.node_patches() if P + "desiredDrain" in p)
    assert drain == {P + "state": "Working", P + "reason": "",
                     P + "desiredDrain": "drain-0000bbbb"}  # fmt: skip
    # Staged before the drain was asked for: the disruption starts with the image on disk.
    kinds = [a["kind"] for a in hosted.sim.actions()]
    assert kinds.index("bootc") < kinds.index("reboot")
    assert hosted.drains[:2] == ["drain-0000bbbb", "uncordon-0000bbbb"]


async def test_the_target_is_prestaged_from_the_configmap_and_the_turn_fetches_nothing(
    hosted: Hosted,
) -> None:
    hosted.start()
    mc = machine_config("x", image=hosted.images["v2"], keys=INITIAL_KEYS)
    hosted.publish(mc, "0000cccc", select=False)  # published, the node not picked yet
    v2 = hosted.images["v2"].split("@")[1]
    for _ in range(200):
        if hosted.sim.stages(v2):  # not picked yet: any stage is a pre-stage
            break
        await asyncio.sleep(0.05)
    assert hosted.annotations() == {}  # nothing written while it pre-staged
    hosted.kube.patch_annotations("Node", NODE, {P + "desiredConfig": "0000cccc"})
    await hosted.until(lambda a: a.get("currentConfig") == "0000cccc")
    (prestaged, prestage_locked), *turns = hosted.sim.stages(v2)
    assert prestaged > 0 and prestage_locked  # the pre-stage fetched it, locked
    assert turns and all(fetched == 0 for fetched, _ in turns)
    assert hosted.reboots() == 1


async def test_a_stale_configmap_is_never_applied(hosted: Hosted) -> None:
    """desiredConfig names a target the ConfigMap does not hold yet: nothing happens until it
    does (a kubelet-mounted copy lags; the MCD may apply the stale one)."""
    hosted.start()
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=["ssh-ed25519 A-old"]),
                   "0000dddd", select=False)  # fmt: skip
    hosted.kube.patch_annotations("Node", NODE, {P + "desiredConfig": "0000eeee"})
    await asyncio.sleep(1.0)
    assert "currentConfig" not in hosted.annotations() and hosted.node_patches() == []
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=["ssh-ed25519 A-new"]),
                   "0000eeee")  # fmt: skip
    await hosted.until(lambda a: a.get("currentConfig") == "0000eeee")
    ssh = hosted.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
    assert ssh.read_text() == "ssh-ed25519 A-new\n"


async def test_refused_payload_is_degraded_never_unreconcilable_and_heals_with_the_next(
    hosted: Hosted,
) -> None:
    hosted.options["refused_retry"] = 0.5
    hosted.start()
    image_content = machine_config("x", image=hosted.images["v1"], keys=INITIAL_KEYS,
                                   files=[ign_file("/etc/chrony.conf", "pool x")])  # fmt: skip
    hosted.publish(image_content, "0000ffff")
    degraded = await hosted.until(lambda a: a.get("state") == "Degraded")
    assert degraded["reason"].startswith("NodePool config 0000ffff cannot be applied in place")
    assert (
        "/etc/chrony.conf" in degraded["reason"] and "NodePool's spec.config" in degraded["reason"]
    )
    # The agent lifts its Degraded now and then so that the halted upgrader can publish a fix.
    await hosted.until(lambda a: a.get("state") == "Working", timeout=5)
    await hosted.until(lambda a: a.get("state") == "Degraded", timeout=5)
    await hosted.until(lambda a: a.get("state") == "Working", timeout=5)
    await hosted.until(lambda a: a.get("state") == "Degraded", timeout=5)
    # Each lift is an Event of its own, which says why the Degraded cleared and comes back.
    lifts = sorted(e["message"] for e in hosted.kube.list("events", "default")
                   if e["reason"] == "RefusalLifted")  # fmt: skip
    assert [m.split(":")[0] for m in lifts[:2]] == ["Lift 1", "Lift 2"]
    assert lifts[0].startswith(
        "Lift 1: Degraded lifted for 0.5 s so that the in-place upgrader, halted by the refused "
        "target 0000ffff, can publish a new one; Degraded again after it unless the target "
        "changes, and lifted again every 0.5 s (--refused-retry). Refused: NodePool config "
        "0000ffff cannot be applied in place"
    )
    states = {p.get(P + "state") for p in hosted.node_patches()}
    assert "Unreconcilable" not in states and hosted.reboots() == 0 and hosted.drains == []
    fixed = machine_config("x", image=hosted.images["v2"], keys=INITIAL_KEYS,
                           files=[ign_file("/etc/chrony.conf", "pool x")])  # fmt: skip
    # As the upgrader moves a node in flight to a new target (getAlreadyUnavailableCandidates).
    hosted.publish(fixed, "00001111")
    done = await hosted.until(lambda a: a.get("currentConfig") == "00001111", timeout=20)
    assert done["state"] == "Done" and done["reason"] == "" and hosted.reboots() == 1


async def test_an_unusable_configmap_is_degraded_with_its_field_then_heals(
    hosted: Hosted,
) -> None:
    hosted.start()
    hosted.kube.put(configmap("%%% not base64", "00002222"))
    hosted.kube.patch_annotations("Node", NODE, {P + "desiredConfig": "00002222"})
    degraded = await hosted.until(lambda a: a.get("state") == "Degraded")
    assert degraded["reason"] == ("cannot use configmap np-upgrade/np-upgrade: data.config: "
                                  "not base64")  # fmt: skip
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=INITIAL_KEYS), "00002222")
    await hosted.until(lambda a: a.get("currentConfig") == "00002222" and a["state"] == "Done")


async def test_a_node_without_the_nodepool_label_is_degraded_until_labelled(
    hosted: Hosted,
) -> None:
    hosted.kube.mutate("Node", NODE, lambda n: n["metadata"].pop("labels"))
    hosted.start()
    degraded = await hosted.until(lambda a: a.get("state") == "Degraded")
    assert "no label hypershift.openshift.io/nodePool" in degraded["reason"]
    assert "--upgrade-namespace" in degraded["reason"]
    hosted.kube.mutate("Node", NODE, lambda n: n["metadata"].update(
        labels={"hypershift.openshift.io/nodePool": "np"}))  # fmt: skip
    await hosted.until(lambda a: "state" not in a and "reason" not in a)  # as before
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=INITIAL_KEYS), "00003333")
    await hosted.until(lambda a: a.get("currentConfig") == "00003333")


async def test_the_mcd_current_config_is_the_baseline_and_node_annotations_are_not_seeded(
    hosted: Hosted,
) -> None:
    """A node an MCD pod updated before: /etc/mcd-currentconfig.json wins over the provisioning
    file, and node-annotations.json (rendered-… names) is never copied onto the Node."""
    root = hosted.sim.root
    chrony = [ign_file("/etc/chrony.conf", "pool x")]
    updated = machine_config("rendered-master-1", image=hosted.images["v1"], keys=INITIAL_KEYS,
                             files=chrony)  # fmt: skip
    (root / "etc/mcd-currentconfig.json").write_text(json.dumps(updated))
    seed = root / "etc/machine-config-daemon/node-annotations.json"
    seed.parent.mkdir(parents=True, exist_ok=True)
    seed.write_text(json.dumps({P + "currentConfig": "rendered-master-0", P + "state": "Done"}))
    hosted.kube.patch_annotations("Node", NODE, {P + "currentConfig": "00004444",
                                                 P + "desiredConfig": "00004444",
                                                 P + "state": "Done"})  # fmt: skip
    hosted.start()
    # The same files as the MCD's record plus a key: live. Against the provisioning file the
    # chrony.conf would be new image content, and refused.
    hosted.publish(machine_config("x", image=hosted.images["v1"], keys=["ssh-ed25519 B"],
                                  files=chrony), "00005555")  # fmt: skip
    done = await hosted.until(lambda a: a.get("currentConfig") == "00005555")
    assert done["state"] == "Done"
    assert not any("rendered-" in v for p in hosted.node_patches() for v in p.values() if v)


async def test_a_drain_never_acknowledged_is_degraded_with_failed_to_drain_and_no_reboot(
    hosted: Hosted,
) -> None:
    hosted.options.update(drain_timeout=0.5, prestage=PrestageOptions(mode="off"))
    hosted.start(drainer=False)
    hosted.publish(machine_config("x", image=hosted.images["v2"], keys=INITIAL_KEYS), "00006666")
    degraded = await hosted.until(lambda a: a.get("state") == "Degraded")
    assert degraded["reason"] == ("failed to drain node: no acknowledgement of drain-00006666 "
                                  "after 0.5s")  # fmt: skip
    assert hosted.reboots() == 0
    for _ in range(100):  # the Event follows the annotation
        if any(e["reason"] == "FailedToDrain"
               for e in hosted.kube.list("events", "default", None, None)):  # fmt: skip
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("no FailedToDrain Event")
    hosted._tasks.append(asyncio.create_task(hosted._drainer()))  # the drainer is back
    await hosted.until(lambda a: a.get("currentConfig") == "00006666", timeout=30)
    assert hosted.reboots() == 1


async def test_a_bad_image_is_rolled_back_uncordoned_and_holds_the_nodepool(
    hosted: Hosted,
) -> None:
    hosted.options["prestage"] = PrestageOptions(mode="off")
    hosted.start()
    hosted.publish(machine_config("x", image=hosted.images["bad"], keys=INITIAL_KEYS), "00007777")
    degraded = await hosted.until(
        lambda a: a.get("state") == "Degraded" and a.get("lastAppliedDrain") == "uncordon-00007777"
    )
    assert degraded["reason"].startswith("rolled back to ")
    assert "required health check failed" in degraded["reason"]
    assert "currentConfig" not in degraded and hosted.reboots() == 2  # into it, and back
    booted = hosted.sim.status_document()["status"]["booted"]["image"]["imageDigest"]
    assert booted == hosted.images["v1"].split("@")[1]
    assert not hosted.kube.get("Node", NODE)["spec"].get("unschedulable")
    await asyncio.sleep(1.0)  # no retry of the failed digest: no third reboot, still Degraded
    assert hosted.reboots() == 2 and hosted.annotations()["state"] == "Degraded"


async def test_dry_run_plans_and_writes_nothing(hosted: Hosted) -> None:
    hosted.options.update(dry_run=True)
    hosted.start()
    hosted.publish(machine_config("x", image=hosted.images["v2"], keys=["ssh-ed25519 D"]),
                   "00008888")  # fmt: skip
    await asyncio.sleep(1.5)
    assert hosted.node_patches() == [] and hosted.reboots() == 0
    assert not (hosted.sim.root / "var/lib/image-mode-agent/current-config").exists()
    assert not any(a["kind"] == "bootc" for a in hosted.sim.actions())


class Killed(BaseException):
    """Not an Exception: nothing in the agent catches it, as nothing outlives a SIGKILL."""


@pytest.mark.parametrize("kind", ["live", "image"])
async def test_killed_at_every_journaled_step_converges_with_one_reboot_at_most(
    tmp_path: Path, kind: str
) -> None:
    """The agent dies at each engine checkpoint in turn (as a SIGKILL would leave the host)
    and is started again: every run ends Done on the payload, files whole, the image booted
    once."""
    labels: list[str] = []

    async def run(index: int | None) -> Hosted:
        kube = FakeKube(bookmark_interval=0.5)
        await kube.start()
        base = tmp_path / f"run-{index}"
        base.mkdir()
        kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"hypershift.openshift.io/nodePool": "np"}}})  # fmt: skip
        rules = [Rule(v, "", "configmaps", namespace=NS) for v in ("get", "list", "watch")]
        kube.write_kubeconfig(base / "node.kubeconfig", kube.node_identity(NODE, rules))
        sim, images = make_host(base)
        initial = machine_config("m", image=images["v1"], keys=INITIAL_KEYS)
        (sim.root / "etc/mcs-machine-config-content.json").write_text(json.dumps(initial))
        world = Hosted(base, kube, sim, images, options={"prestage": PrestageOptions(mode="off")})
        seen = 0

        def checkpoint(label: str) -> None:
            nonlocal seen
            if index is None:
                labels.append(label)
            seen += 1
            if seen - 1 == index:
                raise Killed(label)

        world.checkpoint = checkpoint
        supervisor = world.start()
        image = images["v2"] if kind == "image" else images["v1"]
        world.publish(machine_config("x", image=image, keys=["ssh-ed25519 K"]), "0000abcd")
        try:
            while True:
                done = asyncio.ensure_future(world.until(
                    lambda a: a.get("currentConfig") == "0000abcd", timeout=30))  # fmt: skip
                await asyncio.wait({done, supervisor}, return_when=asyncio.FIRST_COMPLETED)
                if done.done():
                    done.result()
                    break
                done.cancel()
                assert isinstance(supervisor.exception(), Killed)
                world._tasks.remove(supervisor)
                supervisor = world.start(drainer=False)  # started again by systemd
                world.checkpoint = None
        finally:
            await world.stop()
            await kube.stop()
        return world

    reference = await run(None)
    assert len(labels) >= (6 if kind == "image" else 3)
    for index, label in enumerate(labels):
        world = await run(index)
        where = f"killed at {label} (#{index})"
        assert world.annotations()["state"] == "Done", where
        assert world.reboots() == (1 if kind == "image" else 0), where
        ssh = world.sim.root / "var/home/core/.ssh/authorized_keys.d/ignition"
        assert ssh.read_text() == "ssh-ed25519 K\n", where
    assert reference.reboots() == (1 if kind == "image" else 0)


def test_cli_refuses_a_hypershift_run_without_a_node_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    SimulatedHost.create(tmp_path / "host", "quay.example/os/node:v1", {})
    code = cli_main(["run", "--source", "hypershift", "--host", f"simulated:{tmp_path / 'host'}",
                     "--listen", ""])  # fmt: skip
    assert code != 0 and "--node-name" in capsys.readouterr().err


def test_cli_refuses_a_refused_retry_that_is_not_positive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SimulatedHost.create(tmp_path / "host", "quay.example/os/node:v1", {})
    code = cli_main(["run", "--source", "hypershift", "--host", f"simulated:{tmp_path / 'host'}",
                     "--node-name", NODE, "--refused-retry", "0", "--listen", ""])  # fmt: skip
    assert code != 0 and "--refused-retry" in capsys.readouterr().err
