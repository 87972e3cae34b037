"""The cluster integration scenarios, defined once and run against both API servers: the
project's fakekube (tests/test_cluster_scenarios.py, the default run) and the real
kube-apiserver from the conformance kit (tests/conformance/test_real_apiserver.py). Checks
that need exact request counts run only where the server can count (`counts_requests`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.model.mcd_disk import CURRENT_CONFIG_PATH
from standins.demo.objects import machine_config
from tests import secrets_canary as canary
from tests.scenarios import mcd_node
from tests.scenarios.harness import Harness, P


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Harness], Awaitable[None]]
    annotations: dict[str, str] | None = None  # the Node's at creation; None: bootstrapped


async def live_ssh_key(h: Harness) -> None:
    await h.start_agent()
    # The agent's first pass ends with its own Done patch (it adds reason="").
    await h.wait_annotations(lambda a: a.get(P + "reason") == "", what="first Done")
    if h.counts_requests:
        writes_before, events_before = h.node_writes(), h.event_writes()
    await h.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    await h.set_desired("rendered-worker-2")
    annotations = await h.wait_done("rendered-worker-2")
    key = (h.sim.root / "home/core/.ssh/authorized_keys.d/ignition").read_text()
    assert key == "ssh-ed25519 AAAA-two\n"
    assert P + "desiredDrain" not in annotations
    assert annotations[P + "reason"] == ""
    assert h.reboots() == 0
    if h.counts_requests:
        node_writes = h.node_writes() - writes_before
        assert node_writes == 2  # Working, then the one Done patch
        assert node_writes + h.event_writes() - events_before <= 6
    reasons = await h.event_reasons()
    assert "SkipReboot" in reasons and "NodeDone" in reasons
    assert not (await h.node_object())["spec"].get("unschedulable")


async def image_update_through_drain(h: Harness) -> None:
    await h.enable_drain_controller()
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.add_config("rendered-worker-2", "v2", keys=["ssh-ed25519 AAAA-two"])
    await h.set_desired("rendered-worker-2", **{P + "desiredImage": h.images["v2"]})
    assert await h.exits() == 3  # the simulated reboot ends the process
    annotations = await h.annotations()
    assert annotations[P + "post-config-action"] == "Rebooting"
    assert annotations[P + "lastAppliedDrain"] == "drain-rendered-worker-2"
    assert annotations[P + "state"] == "Working"
    assert (await h.node_object())["spec"].get("unschedulable") is True
    await h.start_agent()
    annotations = await h.wait_done("rendered-worker-2")
    assert annotations[P + "currentImage"] == h.images["v2"]
    assert P + "post-config-action" not in annotations
    annotations = await h.wait_annotations(
        lambda a: a.get(P + "lastAppliedDrain") == "uncordon-rendered-worker-2", what="uncordon"
    )
    assert h.drain_values() == ["drain-rendered-worker-2", "uncordon-rendered-worker-2"]
    assert h.booted() == h.images["v2"].split("@")[1]
    assert h.reboots() == 1
    assert not (await h.node_object())["spec"].get("unschedulable")
    assert {"OSUpdateStaged", "Drain", "Reboot", "NodeDone"} <= set(await h.event_reasons())


async def bad_image_rolled_back(h: Harness) -> None:
    await h.enable_drain_controller()
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.add_config("rendered-worker-2", "bad")
    await h.set_desired("rendered-worker-2", **{P + "desiredImage": h.images["bad"]})
    assert await h.exits() == 3  # into the bad image
    await h.start_agent()
    assert await h.exits() == 3  # its check fails: rollback
    await h.start_agent()
    annotations = await h.wait_annotations(lambda a: a.get(P + "state") == "Degraded",
                                           what="Degraded")  # fmt: skip
    reason = annotations[P + "reason"]
    assert "rolled back to" in reason and "required health check failed" in reason
    assert "app unhealthy (no)" in reason
    assert annotations[P + "currentConfig"] == "rendered-worker-1"
    assert h.booted() == h.images["v1"].split("@")[1]
    assert h.reboots() == 2
    # Back on its last good config, the node is given back (the MCD would leave it cordoned).
    await h.wait_annotations(
        lambda a: a.get(P + "lastAppliedDrain") == "uncordon-rendered-worker-1", what="uncordon"
    )
    assert "FailedToReconcile" in await h.event_reasons()


async def refused_change_is_unreconcilable(h: Harness) -> None:
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.add_config("rendered-worker-2", "v1", fips=True)
    await h.set_desired("rendered-worker-2")
    annotations = await h.wait_annotations(lambda a: a.get(P + "state") == "Unreconcilable",
                                           what="Unreconcilable")  # fmt: skip
    assert annotations[P + "reason"].startswith(
        "can't reconcile config rendered-worker-1 with rendered-worker-2: "
    )
    assert "FIPS" in annotations[P + "reason"]
    assert h.reboots() == 0


async def missing_rendered_config_heals(h: Harness) -> None:
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.set_desired("rendered-worker-9")
    annotations = await h.wait_annotations(
        lambda a: "rendered-worker-9 not found" in a.get(P + "reason", ""), what="not found"
    )
    assert annotations[P + "state"] == "Degraded"
    await h.add_config("rendered-worker-9", "v1", keys=["ssh-ed25519 AAAA-nine"])
    await h.wait_done("rendered-worker-9")


CURRENT_IS_0 = {P + "currentConfig": "rendered-worker-0", P + "desiredConfig": "rendered-worker-1",
                P + "state": "Done"}  # fmt: skip


async def unusable_current_config_heals(h: Harness) -> None:
    """The Node's currentConfig names a MachineConfig the agent cannot parse (the baseline it
    adopts when the host records none): Degraded, naming it and the field, the agent still
    running and acting on nothing; once the MachineConfig is replaced, the update goes on."""
    await h.add_config("rendered-worker-0", "v1", version="banana")  # the schema allows it
    await h.start_agent()
    annotations = await h.wait_annotations(lambda a: a.get(P + "state") == "Degraded",
                                           what="Degraded")  # fmt: skip
    assert annotations[P + "reason"].startswith(
        "cannot use machineconfig rendered-worker-0: spec.config.ignition.version: "
    ), annotations[P + "reason"]
    assert "banana" in annotations[P + "reason"]
    if h.counts_requests:
        writes = h.node_writes()
    # Its report came back on its Node watch and brought one more pass, which says so again
    # (it may have already). That pass logs before it would write, and a write would bring
    # the next pass at once: half a second more shows a loop.
    await h.wait_logged("input not usable", count=2)
    await asyncio.sleep(0.5)
    assert h.procs[-1].returncode is None  # no exit 2, no restart loop
    if h.counts_requests:
        assert h.node_writes() == writes  # said once: no retry loop writing the Node
    assert not (h.sim.root / "home/core/.ssh/authorized_keys.d/ignition").exists()
    await h.add_config("rendered-worker-0", "v1", keys=["ssh-ed25519 AAAA-zero"])
    annotations = await h.wait_done("rendered-worker-1")
    assert annotations[P + "reason"] == ""
    key = (h.sim.root / "home/core/.ssh/authorized_keys.d/ignition").read_text()
    assert key == "ssh-ed25519 AAAA-one\n"
    assert h.reboots() == 0
    assert h.procs[-1].returncode is None


async def first_boot_seeds_annotations(h: Harness) -> None:
    seed = h.sim.root / "etc/machine-config-daemon/node-annotations.json"
    seed.parent.mkdir(parents=True)
    seed.write_text(json.dumps({
        P + "currentConfig": "rendered-worker-1", P + "desiredConfig": "rendered-worker-1",
        P + "state": "Done",
    }))  # fmt: skip
    await h.start_agent()
    annotations = await h.wait_done("rendered-worker-1")
    assert annotations[P + "desiredConfig"] == "rendered-worker-1"
    assert h.reboots() == 0


async def api_server_restarted_mid_update(h: Harness) -> None:
    await h.enable_drain_controller()
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.add_config("rendered-worker-2", "slow")  # a 4 s pull
    await h.set_desired("rendered-worker-2")
    await h.wait_annotations(lambda a: a.get(P + "state") == "Working", what="Working")
    await h.restart_api_server(downtime=2.0)
    # API faults never stop the agent: the only exit is the reboot (which may come before the
    # restart returns: the agent can use a server that does not answer /readyz yet).
    assert await h.exits(timeout=90) == 3  # staged, drained, rebooted: once
    await h.start_agent()
    await h.wait_done("rendered-worker-2", timeout=60)
    assert h.drain_values() == ["drain-rendered-worker-2", "uncordon-rendered-worker-2"]
    assert h.reboots() == 1


async def watch_expiry_relists(h: Harness) -> None:
    await h.start_agent()
    await h.wait_done("rendered-worker-1")
    await h.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
    await h.expire_watches()
    await h.set_desired("rendered-worker-2")
    await h.wait_done("rendered-worker-2", timeout=60)
    assert h.procs[-1].returncode is None


async def mcd_takeover_then_image_update(h: Harness) -> None:
    """A node as the MCD leaves it: validated, Done with nothing written and no reboot; then
    watched (a key's mode changed by hand is drift); then an image update, after which the
    MCD's files hold the new config."""
    root = h.sim.root
    rendered = canary.with_canary_secrets(machine_config(
        name="rendered-worker-1", image=h.images["v1"], keys=["ssh-ed25519 AAAA-one"]))  # fmt: skip
    mcd_node.prepare(root, rendered, ["ssh-ed25519 AAAA-one"],
                     files={canary.PULL_SECRET_PATH: canary.pull_secret()})  # fmt: skip
    before = mcd_node.snapshot(root)
    writes = h.node_writes() if h.counts_requests else 0
    await h.start_agent()
    await h.wait_logged("config drift monitor started")
    await h.wait_done("rendered-worker-1")
    assert mcd_node.snapshot(root) == before  # not one file written, moved or touched
    assert h.reboots() == 0
    if h.counts_requests:
        assert h.node_writes() == writes  # the Node said Done already
    keys = root / "home/core/.ssh/authorized_keys.d/ignition"
    keys.chmod(0o644)
    await h.wait_annotations(lambda a: "mode mismatch for file" in a.get(P + "reason", ""),
                             what="the drift reported")  # fmt: skip
    assert "ConfigDriftDetected" in await h.event_reasons()
    keys.chmod(0o600)
    await h.wait_done("rendered-worker-1")
    await h.enable_drain_controller()
    await h.add_config("rendered-worker-2", "v2", keys=["ssh-ed25519 AAAA-two"])
    await h.set_desired("rendered-worker-2")
    assert await h.exits() == 3
    await h.start_agent()
    await h.wait_done("rendered-worker-2")
    assert h.reboots() == 1 and h.booted() == h.images["v2"].split("@")[1]
    written = json.loads((root / CURRENT_CONFIG_PATH.lstrip("/")).read_bytes())
    assert written["metadata"]["name"] == "rendered-worker-2"
    assert written["spec"]["osImageURL"] == h.images["v2"]


SCENARIOS = (
    Scenario("live_ssh_key", live_ssh_key),
    Scenario("image_update_through_drain", image_update_through_drain),
    Scenario("bad_image_rolled_back", bad_image_rolled_back),
    Scenario("refused_change_is_unreconcilable", refused_change_is_unreconcilable),
    Scenario("missing_rendered_config_heals", missing_rendered_config_heals),
    Scenario("unusable_current_config_heals", unusable_current_config_heals, CURRENT_IS_0),
    Scenario("first_boot_seeds_annotations", first_boot_seeds_annotations, annotations={}),
    Scenario("api_server_restarted_mid_update", api_server_restarted_mid_update),
    Scenario("watch_expiry_relists", watch_expiry_relists),
    Scenario(
        "mcd_takeover_then_image_update",
        mcd_takeover_then_image_update,
        mcd_node.done_annotations("rendered-worker-1"),
    ),
)
