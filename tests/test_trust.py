"""Signed OS images only: the policy lookup (agent/model/sigpolicy.py), the staging decision
(agent/core/trust.py), and the engine refusing before any disruption on the simulated host.

The same with real GPG signatures, skopeo and systemd is the system tier's `signed-images`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.policy import Allowlist, LivePolicy
from agent.core.trust import changes_trust, stage_trust, trust_paths
from agent.errors import InputError
from agent.model.imageref import parse_image_ref
from agent.model.sigpolicy import POLICY_PATH, docker_scopes, parse_policy
from agent.update.engine import DEGRADED, DONE, Engine, Hooks
from agent.update.journal import Phase
from tests.builders import ign_file
from tests.simhost import World

IMAGE = parse_image_ref("quay.example/os/node@sha256:" + "a" * 64)
KEY = "/etc/machine-config-daemon/no-reboot/containers-gpg.pub"
OTHER_KEY = "/etc/pki/other.gpg"
ACCEPT = [{"type": "insecureAcceptAnything"}]
REJECT = [{"type": "reject"}]
SIGNED = [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": KEY}]


def docker_policy(default, scopes: dict) -> bytes:
    return json.dumps({"default": default, "transports": {"docker": scopes}}).encode()


# -- lookup ---------------------------------------------------------------------------------------
def test_scopes_most_specific_first() -> None:
    ref = parse_image_ref("a.b.example.com:5000/ns/os@sha256:" + "1" * 64)
    assert docker_scopes(ref) == [
        "a.b.example.com:5000/ns/os@sha256:" + "1" * 64,
        "a.b.example.com:5000/ns/os",
        "a.b.example.com:5000/ns",
        "a.b.example.com:5000",
        "*.b.example.com:5000",
        "*.example.com:5000",
        "*.com:5000",
        "",
    ]


@pytest.mark.parametrize(
    ("scopes", "expected"),
    [
        ({}, "default"),
        ({"": SIGNED}, 'transports.docker[""]'),
        ({"quay.example": REJECT, "quay.example/os": SIGNED},
         'transports.docker["quay.example/os"]'),
        ({"quay.example/os/node": SIGNED, "quay.example": REJECT},
         'transports.docker["quay.example/os/node"]'),
        ({f"quay.example/os/node@{IMAGE.digest}": ACCEPT, "quay.example/os/node": REJECT},
         f'transports.docker["quay.example/os/node@{IMAGE.digest}"]'),
        ({"other.example/os/node": REJECT}, "default"),
    ],
)  # fmt: skip
def test_the_most_specific_scope_governs(scopes: dict, expected: str) -> None:
    rule = parse_policy(docker_policy(ACCEPT, scopes)).rule_for(IMAGE)
    assert rule.scope == expected


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        (b"{", ""),
        (b"[]", ""),
        (b"{}", "default"),
        (b'{"default": []}', "default"),
        (b'{"default": [{"type": "trustMe"}]}', "default[0].type"),
        (b'{"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}', "default[0]"),
        (b'{"default": [{"type": "reject"}], "transports": []}', "transports"),
        (b'{"default": [{"type": "reject"}], "transports": {"docker": {"q.io": "x"}}}',
         'transports.docker["q.io"]'),
    ],
)  # fmt: skip
def test_a_policy_containers_image_would_reject_is_an_input_error(doc: bytes, field: str) -> None:
    with pytest.raises(InputError) as err:
        parse_policy(doc)
    assert err.value.source == POLICY_PATH and err.value.field == field


# -- the staging decision ----------------------------------------------------------------------
def test_no_policy_file_stages_unverified() -> None:
    trust = stage_trust(None, IMAGE)
    assert (trust.enforce, trust.policy, trust.refusal) == (False, None, None)
    assert "no /etc/containers/policy.json" in trust.scope


def test_a_broken_policy_refuses_naming_the_field() -> None:
    trust = stage_trust(b'{"default": [{"type": "trustMe"}]}', IMAGE)
    assert trust.refusal is not None and "default[0].type" in trust.refusal
    assert "trustMe" in trust.refusal


def test_a_rejecting_scope_refuses() -> None:
    trust = stage_trust(docker_policy(ACCEPT, {"quay.example/os": REJECT}), IMAGE)
    assert trust.refusal is not None
    assert 'transports.docker["quay.example/os"]: reject' in trust.refusal


def test_signatures_required_with_a_strict_default_are_enforced_on_the_host_policy() -> None:
    trust = stage_trust(docker_policy(REJECT, {"quay.example/os": SIGNED}), IMAGE)
    assert trust.enforce and trust.policy is None and trust.refusal is None
    assert f'transports.docker["quay.example/os"]: signedBy GPGKeys {KEY}' in trust.scope


def test_signatures_required_under_openshifts_insecure_default_get_a_stage_policy() -> None:
    """OpenShift's policy.json: default insecureAcceptAnything, scoped sigstoreSigned from a
    ClusterImagePolicy. bootc refuses to enforce that default, so the stage gets the same
    policy with a `reject` default: the image's own scope is untouched."""
    host = {
        "default": ACCEPT,
        "transports": {
            "docker": {"quay.example/os": [{"type": "sigstoreSigned", "keyData": "LS0t"}]},
            "docker-daemon": {"": ACCEPT},
        },
    }
    trust = stage_trust(json.dumps(host).encode(), IMAGE)
    assert trust.enforce and trust.policy is not None
    stage = json.loads(trust.policy)
    assert stage == {**host, "default": REJECT}
    assert parse_policy(trust.policy).rule_for(IMAGE).requirements == (
        parse_policy(json.dumps(host).encode()).rule_for(IMAGE).requirements
    )


def test_nobody_asks_for_a_signature() -> None:
    trust = stage_trust(docker_policy(ACCEPT, {}), IMAGE)
    assert (trust.enforce, trust.policy, trust.refusal) == (False, None, None)
    assert "default: insecureAcceptAnything" in trust.scope


def test_an_accepting_scope_under_a_strict_default_is_still_enforced() -> None:
    trust = stage_trust(docker_policy(REJECT, {"quay.example": ACCEPT}), IMAGE)
    assert trust.enforce and trust.policy is None


def test_trust_files_include_the_keys_the_policy_names() -> None:
    host = docker_policy(ACCEPT, {"q.io": [{"type": "signedBy", "keyType": "GPGKeys",
                                            "keyPaths": [OTHER_KEY, "/etc/k2"]}]})  # fmt: skip
    assert {OTHER_KEY, "/etc/k2", POLICY_PATH} <= set(trust_paths(host))
    assert changes_trust(["/etc/ssh/x", OTHER_KEY], host) == OTHER_KEY
    assert changes_trust(["/etc/containers/registries.d/sigstore.yaml"], None) is not None
    assert changes_trust(["/var/lib/kubelet/config.json"], host) is None


# -- the engine on the simulated host ------------------------------------------------------------
# policy.json, registries.d and the key are live content here, as OpenShift's default
# NodeDisruptionPolicy makes them (with "Reload crio.service"; None keeps the log simple).
NDP = LivePolicy(files={POLICY_PATH: (), "/etc/containers/registries.d": (), KEY: ()})
STRICT = docker_policy(ACCEPT, {"quay.example/os": SIGNED})
RELAXED = docker_policy(ACCEPT, {"quay.example/os": ACCEPT})


@dataclass
class TrustWorld(World):
    """The engine world with the trust files live and the drains counted."""

    drains: int = 0

    def engine(self, checkpoint=None, **kwargs) -> Engine:
        self.sim.boot()
        allowlist = Allowlist(NDP)
        hooks = Hooks(checkpoint=checkpoint or (lambda label: None), before_disruption=self.drain)
        return Engine(self.sim.host(allowlist.allows), policy=NDP, hooks=hooks, **kwargs)

    def drain(self, desired) -> None:
        self.drains += 1


@pytest.fixture
def world(tmp_path: Path) -> TrustWorld:
    base = World.create(tmp_path)
    world = TrustWorld(base.base, base.sim, base.images)
    image, healthy = "quay.example/os/node", {"usr/lib/app/healthy": "yes"}
    add = world.sim.add_image
    world.images["signed"] = add(f"{image}:signed", healthy, signed_by=(KEY,))
    world.images["other"] = add(f"{image}:other", healthy, signed_by=(OTHER_KEY,))
    world.images["unsigned"] = add(f"{image}:unsigned", healthy)
    return world


def trust_files(policy_json: bytes) -> list[dict]:
    return [ign_file(POLICY_PATH, policy_json.decode()), ign_file(KEY, "public key")]


async def settle(world: TrustWorld, name: str, image: str, policy_json: bytes):
    desired = world.desired(name, image, files=trust_files(policy_json))
    return await world.converge(desired)


async def test_a_signed_image_updates_with_one_reboot(world: TrustWorld) -> None:
    assert (await settle(world, "rendered-1", "v1", STRICT)).state == DONE
    outcome = await settle(world, "rendered-2", "signed", STRICT)
    assert outcome.state == DONE
    assert world.booted() == world.digest("signed")
    assert (world.reboots(), world.drains) == (1, 1)


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("unsigned", "A signature was required, but no signature exists"),
        ("other", f"no signature by a key in {KEY}"),
    ],
)
async def test_an_image_the_policy_refuses_is_never_staged(
    world: TrustWorld, image: str, words: str
) -> None:
    assert (await settle(world, "rendered-1", "v1", STRICT)).state == DONE
    outcome = await settle(world, "rendered-2", image, STRICT)
    assert outcome.state == DEGRADED
    assert outcome.reason.startswith(f"staging {world.images[image]} refused by the signature")
    assert f'transports.docker["quay.example/os"]: signedBy GPGKeys {KEY}' in outcome.reason
    assert words in outcome.reason
    assert (world.reboots(), world.drains) == (0, 0)
    assert world.sim.status_document()["status"]["staged"] is None
    assert not any(a["kind"] == "pull" for a in world.sim.actions())
    # The live part, the policy itself, was written before the refused stage.
    assert world.read(POLICY_PATH) == STRICT


async def test_a_live_policy_change_then_admits_the_refused_image(world: TrustWorld) -> None:
    assert (await settle(world, "rendered-1", "v1", STRICT)).state == DONE
    refused = await settle(world, "rendered-2", "unsigned", STRICT)
    assert refused.state == DEGRADED
    outcome = await settle(world, "rendered-3", "unsigned", RELAXED)
    assert outcome.state == DONE
    assert world.booted() == world.digest("unsigned")
    assert world.read(POLICY_PATH) == RELAXED
    assert world.reboots() == 1


async def test_a_tightened_policy_is_written_before_the_image_it_refuses(
    world: TrustWorld,
) -> None:
    """Booted under no policy at all; the new config brings the policy and an unsigned image
    in one step: the policy is live content, so it is in force for that image's stage."""
    assert (await settle(world, "rendered-1", "v1", RELAXED)).state == DONE
    outcome = await settle(world, "rendered-2", "unsigned", STRICT)
    assert outcome.state == DEGRADED and "no signature exists" in outcome.reason
    assert world.reboots() == 0


async def test_the_prestage_waits_for_a_new_policy(world: TrustWorld) -> None:
    assert (await settle(world, "rendered-1", "v1", RELAXED)).state == DONE
    engine = world.engine()
    desired = world.desired("rendered-2", "signed", files=trust_files(STRICT))
    result = await engine.prestage(desired)
    assert str(result).startswith(f"skipped: the update changes {POLICY_PATH}")
    assert world.sim.status_document()["status"]["staged"] is None
    # Same policy: pre-staged, verified.
    same = world.desired("rendered-2", "signed", files=trust_files(RELAXED))
    assert str(await engine.prestage(same)) == "staged"
    unsigned = world.desired("rendered-3", "unsigned", files=trust_files(RELAXED))
    assert str(await engine.prestage(unsigned)) == "staged"  # nobody asks for a signature


async def test_a_prestage_under_the_policy_in_force_is_refused_as_bootc_refuses(
    world: TrustWorld,
) -> None:
    assert (await settle(world, "rendered-1", "v1", STRICT)).state == DONE
    engine = world.engine()
    desired = world.desired("rendered-2", "unsigned", files=trust_files(STRICT))
    with pytest.raises(Exception) as err:
        await engine.prestage(desired)
    assert getattr(err.value, "kind", "") == "signature"
    assert engine.journal.load().phase == Phase.IDLE


async def test_an_image_prestaged_unverified_is_verified_at_the_turn(world: TrustWorld) -> None:
    """Pre-staged while nobody asked for a signature; the config that reaches the node then
    demands one: the staged deployment does not do, the stage verifies and refuses."""
    assert (await settle(world, "rendered-1", "v1", RELAXED)).state == DONE
    unsigned = world.desired("rendered-2", "unsigned", files=trust_files(RELAXED))
    assert str(await world.engine().prestage(unsigned)) == "staged"
    outcome = await settle(world, "rendered-3", "unsigned", STRICT)
    assert outcome.state == DEGRADED and "no signature exists" in outcome.reason
    assert (world.reboots(), world.drains) == (0, 0)
