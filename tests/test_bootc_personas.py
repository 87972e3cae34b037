"""Every bootc release the agent supports, on the simulated host: an image update, a pre-stage
held until the turn, a followed tag, signature enforcement and a rollback, each on every persona
(standins/bootc_releases.py), with the path the release allows (docs/bootc-releases.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.follow.agent import HELD
from agent.model.bootc_caps import REPO, Capabilities, prestage_path
from agent.model.imageref import parse_image_ref
from agent.model.sigpolicy import POLICY_PATH
from agent.update.engine import DEGRADED, DONE, REBOOTING
from standins.bootc_releases import PERSONAS, features_of
from tests.simhost import World
from tests.test_follow import IMAGE, TAG, Fleet, Scripted
from tests.test_trust import KEY, RELAXED, STRICT, TrustWorld, trust_files

EVERY = pytest.mark.parametrize("version", PERSONAS)
# The releases that pre-pull (no `switch --download-only`): what only they can show.
PRE_PULLING = [v for v in PERSONAS if "switch-download-only" not in features_of(v)]


def locks(version: str) -> bool:
    return "switch-download-only" in features_of(version)


def bootc_actions(sim, prefix: str = "") -> list[str]:
    return [a["detail"] for a in sim.actions()
            if a["kind"] == "bootc" and a["detail"].startswith(prefix)]  # fmt: skip


def pulls_of(sim, digest: str) -> int:
    return sum(1 for a in sim.actions() if a["kind"] == "pull" and a["detail"].startswith(digest))


def world_on(tmp_path: Path, version: str) -> World:
    world = World.create(tmp_path)
    world.sim.set_bootc_version(version)
    return world


@EVERY
async def test_an_image_update_reboots_once(tmp_path: Path, version: str) -> None:
    world = world_on(tmp_path, version)
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    outcome = await world.converge(world.desired("rendered-2", "v2"))
    assert (outcome.state, world.booted(), world.reboots()) == (DONE, world.digest("v2"), 1)
    flag = " --download-only" if locks(version) else ""
    assert bootc_actions(world.sim, "switch") == [
        f"switch --transport registry{flag} {world.images['v2']}"
    ]
    # Nothing pre-pulled: the turn fetched the whole image, and says how much.
    assert any("MiB fetched at the turn" in event for event in world.events)


@EVERY
async def test_the_status_has_only_the_fields_of_its_release(tmp_path: Path, version: str) -> None:
    world = world_on(tmp_path, version)
    booted = world.sim.status_document()["status"]["booted"]
    has = features_of(version)
    assert ("softRebootCapable" in booted) == ("status-soft-reboot-capable" in has)
    assert ("downloadOnly" in booted) == ("status-download-only" in has)


@EVERY
async def test_a_prestage_holds_until_the_turn_and_the_turn_fetches_nothing(
    tmp_path: Path, version: str
) -> None:
    world = world_on(tmp_path, version)
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    desired = world.desired("rendered-2", "v2")
    result = await world.engine().prestage(desired)
    status = world.sim.status_document()["status"]
    if locks(version):
        assert str(result) == "staged"
        assert status["staged"]["downloadOnly"] is True
    else:
        assert result.outcome == "pulled" and status["staged"] is None  # nothing staged
        assert result.note == (f"pre-staging unavailable: bootc {version} has no switch "
                               "--download-only" + ("" if "upgrade-from-downloaded" in
                               features_of(version) else " or upgrade --from-downloaded") +
                               "; pulling into the repository instead")  # fmt: skip
        image = world.images["v2"]
        assert bootc_actions(world.sim, "internals") == [
            f"internals ostree-container image pull --quiet {REPO} "
            f"ostree-unverified-registry:{image}"
        ]
        assert await world.engine().prestage(desired) == type(result)("already-pulled",
                                                                       result.note)  # fmt: skip
    # A reboot before the turn (kured, an admin) boots the running image, on every release.
    await world.engine().host.system.reboot()
    world.sim.boot()
    assert world.booted() == world.digest("v1")
    pulled = pulls_of(world.sim, world.digest("v2"))
    outcome = await world.converge(desired)
    assert (outcome.state, world.booted(), world.reboots()) == (DONE, world.digest("v2"), 2)
    assert pulls_of(world.sim, world.digest("v2")) == pulled  # no layer at the turn
    assert any("nothing fetched: the image was in the repository" in e for e in world.events)


@pytest.mark.parametrize("version", PRE_PULLING)
async def test_a_staging_in_between_prunes_the_pre_pull_and_it_is_pulled_again(
    tmp_path: Path, version: str
) -> None:
    world = world_on(tmp_path, version)
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    desired = world.desired("rendered-2", "v2")
    assert (await world.engine().prestage(desired)).outcome == "pulled"
    # An admin's `bootc switch` of another image: its stage prunes the pre-pulled one.
    engine = world.engine()
    await engine.host.bootc.stage(parse_image_ref(world.images["bad-check"]))
    assert not await engine.host.bootc.pulled(desired.target)
    assert (await engine.prestage(desired)).outcome == "pulled"
    assert pulls_of(world.sim, world.digest("v2")) == 6  # every layer twice


@EVERY
async def test_a_followed_tag_is_checked_the_way_the_release_can(
    tmp_path: Path, version: str
) -> None:
    """The first check asks bootc about its own spec (`upgrade --check`); once the host runs a
    digest, only `--tag` (1.15+) can ask bootc about the tag, else the agent asks the registry
    (skopeo, agent/host/skopeo.py). Both give the digest the tag points to."""
    fleet = Fleet(tmp_path, Scripted(answers=[False, True]))
    fleet.sim.set_bootc_version(version)
    first = fleet.push(name="one")
    held = await fleet.tick()
    assert held.state == HELD
    if locks(version):
        assert held.reason.startswith(f"staged {IMAGE}@{first}; reboot held")
    else:
        assert held.reason.startswith(f"pre-pulled {IMAGE}@{first}; reboot held: scripted no")
        assert "pre-staging unavailable" in held.reason
    assert (await fleet.tick()).state == REBOOTING
    assert (await fleet.tick()).state == DONE and fleet.booted() == first
    second = fleet.push(name="two")
    fleet.strategy.answers = [True]
    assert (await fleet.tick()).state == REBOOTING
    assert (await fleet.tick()).state == DONE and fleet.booted() == second
    checks = [a for a in fleet.sim.actions() if "--check" in a["detail"] or a["kind"] == "skopeo"]
    after_pin = [f"{a['kind']} {a['detail']}" for a in checks[2:]]
    if "upgrade-tag" in features_of(version):
        assert after_pin[0] == "bootc upgrade --check --tag stable"
    else:
        assert after_pin[0] == f"skopeo inspect --raw docker://{TAG}"
    assert fleet.reboots() == 2


@EVERY
async def test_signatures_are_enforced_and_the_pre_pull_verifies(
    tmp_path: Path, version: str
) -> None:
    base = World.create(tmp_path)
    base.sim.set_bootc_version(version)
    world = TrustWorld(base.base, base.sim, base.images)
    healthy = {"usr/lib/app/healthy": "yes"}
    world.images["signed"] = world.sim.add_image(f"{IMAGE}:signed", healthy, signed_by=(KEY,))
    world.images["unsigned"] = world.sim.add_image(f"{IMAGE}:unsigned", healthy)
    start = world.desired("rendered-1", "v1", files=trust_files(STRICT))
    assert (await world.converge(start)).state == DONE
    signed = world.desired("rendered-2", "signed", files=trust_files(STRICT))
    result = await world.engine().prestage(signed)
    if not locks(version):
        assert bootc_actions(world.sim, "internals")[-1].endswith(
            f"ostree-image-signed:docker://{world.images['signed']}"
        )
        assert result.outcome == "pulled"
    assert (await world.converge(signed)).state == DONE
    assert world.booted() == world.digest("signed") and world.reboots() == 1
    unsigned = world.desired("rendered-3", "unsigned", files=trust_files(STRICT))
    with pytest.raises(Exception, match="no signature exists"):
        await world.engine().prestage(unsigned)
    outcome = await world.converge(unsigned)
    assert outcome.state == DEGRADED and "no signature exists" in outcome.reason
    assert world.reboots() == 1


@pytest.mark.parametrize("version", PRE_PULLING)
async def test_an_image_pre_pulled_unverified_is_pruned_before_a_stage_that_verifies(
    tmp_path: Path, version: str
) -> None:

    base = World.create(tmp_path)
    base.sim.set_bootc_version(version)
    world = TrustWorld(base.base, base.sim, base.images)
    world.images["signed"] = world.sim.add_image(
        f"{IMAGE}:signed", {"usr/lib/app/healthy": "yes"}, signed_by=(KEY,)
    )
    assert (await world.converge(world.desired("r1", "v1", files=trust_files(RELAXED)))).state \
        == DONE  # fmt: skip
    relaxed = world.desired("r2", "signed", files=trust_files(RELAXED))
    assert (await world.engine().prestage(relaxed)).outcome == "pulled"
    strict = world.desired("r3", "signed", files=trust_files(STRICT))
    assert (await world.converge(strict)).state == DONE
    actions = bootc_actions(world.sim)
    assert actions[-2:] == ["internals cleanup",
                            f"switch --transport registry {world.images['signed']}"]  # fmt: skip
    assert pulls_of(world.sim, world.digest("signed")) == 6  # fetched again, and verified
    assert world.read(POLICY_PATH) == STRICT


@EVERY
async def test_a_bad_image_is_rolled_back(tmp_path: Path, version: str) -> None:
    world = world_on(tmp_path, version)
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    outcome = await world.converge(world.desired("rendered-2", "bad-check"))
    assert outcome.state == DEGRADED and "rolled back to" in outcome.reason
    assert world.booted() == world.digest("v1") and world.reboots() == 2


def prepares_soft_reboots(version: str) -> bool:
    """Whether the agent's turn on `version` has bootc prepare a soft reboot: `upgrade
    --from-downloaded --soft-reboot auto` (1.12 on). 1.6 has no `--soft-reboot`; 1.7-1.11 have
    it but nothing at the turn to prepare with (`--soft-reboot` from v1.7.0, `upgrade
    --from-downloaded` from v1.12.0:
    https://github.com/bootc-dev/bootc/blob/v1.12.0/crates/lib/src/cli.rs#L986-L1003)."""
    return {"soft-reboot", "upgrade-from-downloaded", "status-soft-reboot-capable"} <= (
        features_of(version)
    )


@EVERY
async def test_a_soft_reboot_capable_update_reboots_once_soft_only_where_bootc_prepares_it(
    tmp_path: Path, version: str
) -> None:
    """One reboot, into the target, on every release: soft where bootc prepared it, full
    elsewhere. The simulated host enters the staged deployment on a soft reboot only where
    bootc prepared /run/nextroot, so a soft reboot asked for in vain would leave the node on
    its old image here (the test below)."""
    world = world_on(tmp_path, version)
    soft = world.sim.add_image(f"{IMAGE}:soft", {"usr/lib/app/healthy": "yes"},
                               soft_reboot_capable=True)  # fmt: skip
    world.images["soft"] = soft
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    system = world.engine().host.system
    boot_id, soft_reboots = await system.boot_id(), await system.soft_reboots_count()
    outcome = await world.converge(world.desired("rendered-2", "soft"), soft_reboot=True)
    assert (outcome.state, world.booted(), world.reboots()) == (DONE, soft.split("@")[1], 1)
    prepared = prepares_soft_reboots(version)
    reboots = [a["detail"] for a in world.sim.actions() if a["kind"] == "reboot"]
    assert reboots == ["soft-reboot" if prepared else "reboot"]
    assert (await system.boot_id() == boot_id) is prepared
    assert await system.soft_reboots_count() == soft_reboots + prepared
    asked = ["upgrade --from-downloaded --soft-reboot auto"] if prepared else []
    assert bootc_actions(world.sim, "upgrade --from-downloaded") == asked
    unavailable = any("soft reboot unavailable" in event for event in world.events)
    assert unavailable is ("soft-reboot" in features_of(version) and not prepared)


async def test_a_soft_reboot_bootc_did_not_prepare_leaves_the_node_on_its_old_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the agent must not do on 1.7-1.11, and what the simulated host now shows: asked for
    anyway, a soft reboot restarts userspace into the same deployment (bootc prepared nothing),
    the update ends Degraded on the old image, and only a second, full reboot would boot it."""
    monkeypatch.setattr(Capabilities, "soft_reboot_at_turn",
                        property(lambda caps: caps.soft_reboot))  # fmt: skip
    world = world_on(tmp_path, "1.11.0")
    soft = world.sim.add_image(f"{IMAGE}:soft", {"usr/lib/app/healthy": "yes"},
                               soft_reboot_capable=True)  # fmt: skip
    assert (await world.converge(world.desired("rendered-1", "v1"))).state == DONE
    outcome = await world.converge(world.desired("rendered-2", soft), soft_reboot=True)
    assert outcome.state == DEGRADED and "instead of the target" in outcome.reason
    assert world.booted() == world.digest("v1") and world.reboots() == 1
    staged = world.sim.status_document()["status"]["staged"]
    assert staged["image"]["imageDigest"] == soft.split("@")[1]  # still staged, for a full one


@EVERY
async def test_the_engine_picks_the_path_the_release_has(tmp_path: Path, version: str) -> None:
    world = world_on(tmp_path, version)
    caps = await world.engine().host.bootc.capabilities()
    assert caps.version == version
    assert prestage_path(caps).kind == ("download-only" if locks(version) else "pre-pull")
    named = caps.named()
    assert named["upgrade-tag"] == ("upgrade-tag" in features_of(version))
    assert named["image-pull"] is True
