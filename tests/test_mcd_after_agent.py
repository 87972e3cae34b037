"""agent -> MCD -> agent: a node this agent updated, then the machine-config-daemon took back and
updated to a newer config, then this agent runs again. The MCD's on-disk config is the truth
(its own rule at every start, "disk is truth", `checkStateOnFirstRun`): the agent takes that
config as the current one, never its own older record, and never resumes an older update over
it. (The same round trip with the real agent process: tests/test_takeover.py.) See
https://github.com/openshift/machine-config-operator/blob/7ff337a4ffac8e7562692181178ede61e4b2eec5/pkg/daemon/daemon.go
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cluster.handover import McdRecord
from agent.core.desired import Desired
from agent.update.configstore import ConfigStore
from agent.update.engine import DONE, Engine
from agent.update.journal import Phase
from tests.simhost import Killed, World

SSH = "/home/core/.ssh/authorized_keys.d/ignition"


@pytest.fixture
def world(tmp_path: Path) -> World:
    world = World.create(tmp_path)
    world.images["v5"] = world.sim.add_image(f"{world.images['v1'].split('@')[0]}:v5-mcd",
                                             {"usr/lib/app/healthy": "yes"})  # fmt: skip
    return world


def engine(world: World, **kwargs) -> Engine:
    """The engine as cluster mode builds it: the MCD's on-disk config as the other record."""
    engine = world.engine(**kwargs)
    engine.configs.external = McdRecord(engine.host.files).config
    return engine


async def mcd_applies(world: World, desired: Desired, keys: str) -> None:
    """What the MCD does with the node back: reboots into the config's image, writes its
    files (`keys`: core's), then its on-disk config (MCO daemon.go storeCurrentConfigOnDisk)."""
    host = world.sim.host(lambda path: True)
    assert desired.target is not None
    await host.bootc.stage(desired.target)
    await host.system.reboot()
    world.sim.boot()
    (world.sim.root / SSH.lstrip("/")).write_text(keys)
    McdRecord(host.files).write(json.loads(desired.document), desired.document, None)


def test_the_store_names_another_record_only_when_it_differs_from_its_own(tmp_path: Path) -> None:
    doc = {"kind": "MachineConfig", "apiVersion": "machineconfiguration.openshift.io/v1",
           "metadata": {"name": "rendered-2"}, "spec": {"config": {}}}  # fmt: skip
    newer = {**doc, "metadata": {"name": "rendered-3"}}
    other: list[tuple[bytes, str]] = []
    store = ConfigStore(tmp_path, lambda: other[0] if other else None)
    other.append((json.dumps(newer).encode(), "/etc/machine-config-daemon/currentconfig"))
    assert store.external_differs() is None  # a first takeover: no record of its own
    assert store.current().name == "rendered-3"
    store.record_current(json.dumps(doc).encode())
    found = store.external_differs()
    assert found is not None and found[0].name == "rendered-3"
    assert found[1] == other[0][0]
    # The same config in another form (the MCD's metadata) is the same config.
    same = {**doc, "metadata": {"name": "rendered-2", "resourceVersion": "7"}}
    other[0] = (json.dumps(same).encode(), other[0][1])
    assert store.external_differs() is None


async def test_a_config_the_mcd_applied_after_the_agent_is_the_current_one(world: World) -> None:
    assert (await world.converge(world.desired("rendered-1", "v1", keys=["k1"]))).state == DONE
    assert (await world.converge(world.desired("rendered-2", "v2", keys=["k2"]))).state == DONE
    rec = world.engine().journal.load()
    assert (rec.current_name, rec.current_image) == ("rendered-2", world.images["v2"])
    newer = world.desired("rendered-3", "v5", keys=["k3"])
    await mcd_applies(world, newer, "k3\n")
    reboots, stages = world.reboots(), world.sim.stages(world.digest("v2"))

    agent = engine(world)
    outcome = await agent.reconcile(newer)
    assert (outcome.state, outcome.current_config) == (DONE, "rendered-3")
    assert world.reboots() == reboots and world.booted() == world.digest("v5")
    assert world.read(SSH) == b"k3\n"
    rec = agent.journal.load()
    # The MCD's config, with no image of this journal's (the MCD's record names it).
    assert (rec.phase, rec.current_name, rec.current_image) == (Phase.IDLE, "rendered-3", None)
    assert agent.configs.current() == newer.config
    assert agent.configs.external_differs() is None  # recorded as the agent's own too
    assert any("rendered-3 was applied after this agent last ran here" in e
               for e in world.events)  # fmt: skip
    assert world.sim.stages(world.digest("v2")) == stages  # its own image: never again
    # ...and the next update is planned from it.
    assert (await world.converge(world.desired("rendered-4", "v5", keys=["k4"]))).state == DONE
    assert world.read(SSH) == b"k4\n" and world.reboots() == reboots


async def test_an_update_left_in_flight_is_dropped_not_resumed_over_the_mcds(
    world: World,
) -> None:
    assert (await world.converge(world.desired("rendered-1", "v1", keys=["k1"]))).state == DONE
    older = world.desired("rendered-2", "v2", keys=["k2"])

    def kill(label: str) -> None:
        if label == "journal:staging":
            raise Killed(label)

    with pytest.raises(Killed):  # stopped mid-update; then the MCD got the node
        await world.engine(checkpoint=kill).reconcile(older)
    newer = world.desired("rendered-3", "v5", keys=["k3"])
    await mcd_applies(world, newer, "k3\n")
    reboots = world.reboots()

    agent = engine(world)
    outcome = await agent.reconcile(newer)
    assert (outcome.state, outcome.current_config) == (DONE, "rendered-3")
    # No stage of rendered-2's image, no reboot: the node stays on what the MCD applied.
    assert world.reboots() == reboots and world.booted() == world.digest("v5")
    assert world.sim.stages(world.digest("v2")) == []
    assert agent.configs.pending() is None
    assert any("the update to rendered-2 left in flight is dropped" in e for e in world.events)


async def test_the_agents_own_commit_cut_off_between_the_records_is_finished(
    world: World,
) -> None:
    # The agent writes the MCD's record just before its own: cut off between the two, the
    # MCD's names the pending config, which is this agent's own update, not the MCD's.
    assert (await world.converge(world.desired("rendered-1", "v1", keys=["k1"]))).state == DONE
    desired = world.desired("rendered-2", "v1", keys=["k2"])
    first = engine(world)

    def hand_back_then_die(name: str, document: bytes) -> None:
        McdRecord(first.host.files).write(json.loads(document), document, None)
        raise Killed("between the records")

    first.hooks.committing = hand_back_then_die
    with pytest.raises(Killed):
        await first.reconcile(desired)
    assert first.journal.load().phase == Phase.COMMITTING
    agent = engine(world)
    assert agent.follow_external() is None
    outcome = await agent.reconcile(desired)
    assert (outcome.state, outcome.current_config) == (DONE, "rendered-2")
    assert not any("was applied after this agent" in e for e in world.events)
