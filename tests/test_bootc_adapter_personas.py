"""The real bootc adapter against the stand-in CLI speaking each bootc release: the capability
probe, the pre-pull (through its private mount namespace), the turn that fetches nothing after
it, tag checks with or without `upgrade --tag`, the prune, and soft reboots."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from agent.core.trust import StageTrust
from agent.errors import HostError
from agent.host.bootc import Bootc, BootcTimeouts
from agent.model.bootc_caps import REPO, prestage_path
from agent.model.imageref import ImageRef, parse_image_ref
from standins.bootc_releases import PERSONAS, features_of
from tests.test_bootc_adapter import D1, D2, NAME, STANDIN, StandinHost, ref

OSTREE = STANDIN.parent / "ostree"
PRE_PULLING = [v for v in PERSONAS if "switch-download-only" not in features_of(v)]
every = pytest.mark.parametrize("version", PERSONAS)


class FakeNamespace:
    """`unshare` and `mount` on PATH that log their argv: the remount must be asked for, in a
    new mount namespace, before the pull runs (a real remount of /sysroot is the VM tiers')."""

    def __init__(self, folder: Path, *, runs: bool = True) -> None:
        self.folder = folder
        folder.mkdir()
        self.log = folder / "log"
        # runs=False: an unshare that "succeeds" and runs nothing (a pull that stored nothing)
        run = 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"' if runs else "exit 0"
        self._script("unshare", run)
        self._script("mount", "exit 0")

    def _script(self, name: str, body: str) -> None:
        path = self.folder / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{self.log}"\n{body}\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def persona_host(tmp_path: Path, version: str) -> StandinHost:
    state = tmp_path / "state"
    state.mkdir()
    host = StandinHost(state)
    host.bootc("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    host.bootc("internals", "standin-add-image", f"{NAME}@{D2}", "2.0", str(300 << 20))
    host.configure(version=version)
    return host


def adapter(host: StandinHost, tmp_path: Path, namespace: FakeNamespace | None = None, **kw):
    env = dict(host.env)
    if namespace is not None:
        env["PATH"] = f"{namespace.folder}:{env['PATH']}"
    return host.adapter(tmp_path, env=env, ostree=str(OSTREE), **kw)


def fetched(host: StandinHost) -> list[dict]:
    path = host.state / "fetched.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@every
async def test_the_probe_finds_what_the_release_has(tmp_path: Path, version: str) -> None:
    host = persona_host(tmp_path, version)
    caps = await adapter(host, tmp_path).capabilities()
    has = features_of(version)
    assert caps.version == version
    assert caps.named() == {
        "switch-download-only": "switch-download-only" in has,
        "upgrade-download-only": "upgrade-download-only" in has,
        "switch-from-downloaded": "switch-from-downloaded" in has,
        "upgrade-from-downloaded": "upgrade-from-downloaded" in has,
        "upgrade-tag": "upgrade-tag" in has,
        "soft-reboot": "soft-reboot" in has,
        "sigpolicy": True,
        "image-pull": True,
        "lock-finalization": True,
        "progress-fd": True,
    }
    expected = "download-only" if "switch-download-only" in has else "pre-pull"
    assert prestage_path(caps).kind == expected


async def test_no_ostree_means_no_lock_finalization(tmp_path: Path) -> None:
    host = persona_host(tmp_path, "1.12.0")
    caps = await host.adapter(tmp_path, ostree=str(tmp_path / "no-such-ostree")).capabilities()
    assert caps.lock_finalization is False and caps.image_pull is True


@pytest.mark.parametrize("version", PRE_PULLING)
async def test_a_pre_pull_stages_nothing_and_the_turn_fetches_nothing(
    tmp_path: Path, version: str
) -> None:
    host = persona_host(tmp_path, version)
    namespace = FakeNamespace(tmp_path / "bin")
    bootc = adapter(host, tmp_path, namespace)
    image = ref(D2)
    assert not await bootc.pulled(image)
    await bootc.pull(image)
    assert namespace.lines() == [
        'unshare -m -- sh -c mount -o remount,rw /sysroot && exec "$@" image-mode-agent-pull '
        f"{STANDIN} internals ostree-container image pull --quiet {REPO} "
        f"ostree-unverified-registry:{NAME}@{D2}",
        "mount -o remount,rw /sysroot",
    ]
    assert (await bootc.status()).staged is None and await bootc.pulled(image)
    assert await bootc.stage(image) == 0  # from the repository: no layer fetched
    assert fetched(host)[-1]["bytes"] == 0 and fetched(host)[-1]["registry"] is False
    assert (await bootc.status()).staged_digest == D2
    with pytest.raises(HostError) as err:
        await bootc.stage(image, locked=True)
    assert err.value.kind == "unsupported" and f"bootc {version} has no" in str(err.value)


@pytest.mark.parametrize("version", PRE_PULLING)
async def test_a_stage_prunes_the_pre_pull_and_prune_does_too(tmp_path: Path, version: str) -> None:
    host = persona_host(tmp_path, version)
    host.bootc("internals", "standin-add-image", f"{NAME}@sha256:{'3' * 64}", "3.0")
    bootc = adapter(host, tmp_path, FakeNamespace(tmp_path / "bin"))
    await bootc.pull(ref(D2))
    await bootc.stage(ref("sha256:" + "3" * 64))  # another image: its stage prunes D2
    assert not await bootc.pulled(ref(D2))
    await bootc.pull(ref(D2))
    await bootc.prune()
    assert ["internals", "cleanup"] in host.calls()
    assert not await bootc.pulled(ref(D2))


@pytest.mark.parametrize("version", PRE_PULLING)
async def test_a_pull_under_an_enforced_policy_is_signed_and_refused_like_bootc(
    tmp_path: Path, version: str
) -> None:
    host = persona_host(tmp_path, version)
    host.configure(unsigned=[f"{NAME}@{D2}"])
    namespace = FakeNamespace(tmp_path / "bin")
    bootc = adapter(host, tmp_path, namespace)
    with pytest.raises(HostError) as err:
        await bootc.pull(ref(D2), trust=StageTrust(enforce=True))
    assert err.value.kind == "signature" and "A signature was required" in str(err.value)
    assert namespace.lines()[0].endswith(f"ostree-image-signed:docker://{NAME}@{D2}")
    assert not await bootc.pulled(ref(D2))


async def test_a_pull_that_stores_nothing_is_an_error(tmp_path: Path) -> None:
    host = persona_host(tmp_path, "1.12.0")
    bootc = adapter(host, tmp_path, FakeNamespace(tmp_path / "bin", runs=False))
    with pytest.raises(HostError, match="the repository does not list it"):
        await bootc.pull(ref(D2))


async def test_no_pull_verb_is_unsupported(tmp_path: Path) -> None:
    """A bootc the agent does not know (say a build without the ostree-ext CLI): the probe of
    the hidden verb fails, and pull() says so before running anything."""
    host = persona_host(tmp_path, "1.12.0")
    wrapper = tmp_path / "bootc-without-internals"
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = internals ] && exit 2\nexec {STANDIN} "$@"\n')
    wrapper.chmod(0o755)
    bootc = Bootc(bootc=str(wrapper), run_dir=tmp_path / "run", env=host.env,
                  ostree=str(OSTREE))  # fmt: skip
    caps = await bootc.capabilities()
    assert caps.image_pull is False and prestage_path(caps).kind == "none"
    with pytest.raises(HostError) as err:
        await bootc.pull(ref(D2))
    assert err.value.kind == "unsupported" and "internals ostree-container" in str(err.value)


class Resolver:
    """Answers every tag, and every pinned image's instance, with `digest`."""

    def __init__(self, digest: str) -> None:
        self.digest, self.asked = digest, []

    async def resolve(self, image: ImageRef) -> str:
        self.asked.append(str(image))
        return self.digest

    async def instance(self, image: ImageRef) -> str:
        self.asked.append(str(image))
        return self.digest


@every
async def test_a_tag_is_checked_by_bootc_with_tag_else_by_the_registry(
    tmp_path: Path, version: str
) -> None:
    host = persona_host(tmp_path, version)
    host.bootc("internals", "standin-tag", f"{NAME}:stable", D2)
    resolver = Resolver(D2)
    bootc = adapter(host, tmp_path, resolver=resolver)
    digest = await bootc.check_update(parse_image_ref(f"{NAME}:stable"))
    assert digest == D2
    checks = host.verb_calls("upgrade")
    if "upgrade-tag" in features_of(version):
        assert checks == [["upgrade", "--check", "--tag", "stable"]] and resolver.asked == []
    else:  # the host runs NAME@D1: bootc before 1.15 cannot ask about the tag
        assert checks == [] and resolver.asked == [f"{NAME}:stable"]


async def test_without_a_resolver_an_old_bootc_says_what_it_lacks(tmp_path: Path) -> None:
    host = persona_host(tmp_path, "1.12.0")
    with pytest.raises(HostError) as err:
        await adapter(host, tmp_path).check_update(parse_image_ref(f"{NAME}:stable"))
    assert err.value.kind == "unsupported" and "no `bootc upgrade --tag`" in str(err.value)


@every
async def test_a_soft_reboot_is_prepared_only_where_the_release_can(
    tmp_path: Path, version: str
) -> None:
    host = persona_host(tmp_path, version)
    host.configure(soft_reboot_capable=True)
    bootc = adapter(host, tmp_path)
    await bootc.stage(ref(D2))
    staged = (await bootc.status()).staged
    assert staged is not None
    asked = await bootc.unlock_staged(soft=True)
    has = features_of(version)
    unlocks = host.verb_calls("upgrade")
    prepares = {"upgrade-from-downloaded", "soft-reboot"} <= has
    assert (await bootc.capabilities()).soft_reboot_at_turn is prepares  # the engine's test
    if prepares:
        assert asked and unlocks == [["upgrade", "--from-downloaded", "--soft-reboot", "auto"]]
    else:  # 1.6: no --soft-reboot; 1.7-1.11: no --from-downloaded; nothing locked: nothing asked
        assert not asked and unlocks == []
    # A soft reboot now enters D2 only where bootc prepared it; elsewhere systemd would restart
    # userspace into D1 again, which is why the engine reboots fully there.
    host.bootc("internals", "standin-reboot", "--soft")
    state = json.loads((host.state / "host.json").read_text())
    assert (state["booted"]["digest"], state["lastBoot"]) == (
        (D2, "soft") if prepares else (D1, "soft-same-root"))  # fmt: skip


async def test_a_manifest_lists_digest_is_not_pre_pulled(tmp_path: Path) -> None:
    """bootc stores what it pulls under the instance's digest: a pre-pull under the list's
    would never be found at the turn. Refused, naming the digest to pin."""
    host = persona_host(tmp_path, "1.12.0")
    instance = "sha256:" + "9" * 64
    resolver = Resolver(instance)
    bootc = adapter(host, tmp_path, FakeNamespace(tmp_path / "bin"), resolver=resolver)
    with pytest.raises(HostError) as err:
        await bootc.pull(ref(D2))
    assert err.value.kind == "unsupported"
    assert f"pin the image to {NAME}@{instance}" in str(err.value)
    pulls = [c for c in host.verb_calls("internals") if c[1:3] == ["ostree-container", "image"]]
    assert resolver.asked == [f"{NAME}@{D2}"] and pulls == []
    await adapter(host, tmp_path, FakeNamespace(tmp_path / "bin2"),
                  resolver=Resolver(D2)).pull(ref(D2))  # fmt: skip
    assert await bootc.pulled(ref(D2))


async def test_a_pull_that_hangs_ends_at_its_own_deadline(tmp_path: Path) -> None:
    host = persona_host(tmp_path, "1.12.0")
    host.configure(fail={"pull": "lock-wait"})  # never finishes
    timeouts = BootcTimeouts(pull=1.0)
    bootc = adapter(host, tmp_path, FakeNamespace(tmp_path / "bin"), timeouts=timeouts)
    with pytest.raises(HostError) as err:
        await bootc.pull(ref(D2))
    assert err.value.kind in ("lock", "timeout")
    assert "bootc internals ostree-container pull timed out after 1s" in str(err.value)
    assert not (await bootc.runner.unit_state(bootc.unit)).running  # stopped, name free
