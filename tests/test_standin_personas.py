"""The stand-in bootc (standins/bin/bootc) speaks every release in PERSONAS as
docs/bootc-releases.md records it: its `--help` gives the agent exactly the
capabilities `features_of(version)` implies, its status has only that release's fields, its
refusals are that release's, and the hidden pre-pull fills a repository that a later switch of
the same reference fetches nothing from, until a stage prunes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.model.bootc_caps import (
    LIST_ARGS,
    PULL_PROBE_ARGS,
    REPO,
    from_help,
    listed,
    parse_version,
    pull_imgref,
)
from standins.bootc_releases import DEFAULT_PERSONA, PERSONAS, features_of
from standins.capabilities import release_capabilities

STANDIN = Path(__file__).parents[1] / "standins" / "bin" / "bootc"
OSTREE = Path(__file__).parents[1] / "standins" / "bin" / "ostree"
NAME = "quay.io/example/os"
D1, D2, D3 = ("sha256:" + c * 64 for c in "123")
# What does not depend on the release runs on the oldest and the newest.
ENDS = pytest.mark.parametrize("host", [PERSONAS[0], DEFAULT_PERSONA], indirect=True)


@dataclass
class Run:
    code: int
    out: str
    err: str


class Host:
    """One stand-in host at one persona (config.json "version")."""

    def __init__(self, state: Path, version: str) -> None:
        self.state = state
        self.version = version
        state.mkdir(parents=True, exist_ok=True)
        self.configure(version=version)

    @property
    def env(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {**os.environ, "STANDIN_BOOTC_STATE": str(self.state), "PATH": path}

    def configure(self, **values: object) -> None:
        path = self.state / "config.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**current, **values}))

    def run(self, *args: str, tool: Path = STANDIN, **kwargs: object) -> Run:
        done = subprocess.run(
            [str(tool), *args], env=self.env, capture_output=True, text=True, timeout=30, **kwargs
        )  # type: ignore[call-overload]
        return Run(done.returncode, done.stdout, done.stderr)

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.code == 0, (args, result)
        return result.out

    def status(self) -> dict:
        return json.loads(self.ok("status", "--format", "json"))["status"]

    def fetched(self, verb: str | None = None) -> list[dict]:
        path = self.state / "fetched.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [e for e in map(json.loads, lines) if verb is None or e["verb"] == verb]

    def files(self) -> dict[str, str]:
        """The state the stand-in keeps, but its call log."""
        return {p.name: p.read_text() for p in self.state.iterdir() if p.name != "calls.log"}

    def pull(self, ref: str, *, signed: bool = False) -> Run:
        imgref = pull_imgref(ref, signed=signed)
        return self.run("internals", "ostree-container", "image", "pull", "--quiet", REPO, imgref)

    def stored(self) -> list[str]:
        return self.ok(*LIST_ARGS).split()


def seeded(state: Path, version: str) -> Host:
    """Booted from NAME@D1; D2 (300 MiB) and D3 (100 MiB) in the registry. Written as the
    stand-in's `standin-seed` and `standin-add-image` write it (checked below), without their
    three process starts per test."""
    h = Host(state, version)
    booted = {"image": f"{NAME}@{D1}", "digest": D1, "version": "1.0", "locked": False,
              "softRebootCapable": False}  # fmt: skip
    host_state = {"booted": booted, "staged": None, "rollback": None, "rollbackQueued": False,
                  "boots": 1}  # fmt: skip
    (state / "host.json").write_text(json.dumps(host_state))
    sizes = ((D1, "1.0", 64 << 20), (D2, "2.0", 300 << 20), (D3, "3.0", 100 << 20))
    images = {f"{NAME}@{d}": {"version": v, "bytes": n} for d, v, n in sizes}
    tags = {f"{NAME}:stable": D2}
    (state / "registry.json").write_text(json.dumps({"images": images, "tags": tags}))
    return h


@pytest.fixture(params=PERSONAS)
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Host:
    return seeded(tmp_path / "state", request.param)


def test_the_seed_helpers_write_what_the_fixture_writes(tmp_path: Path) -> None:
    h = Host(tmp_path / "helpers", DEFAULT_PERSONA)
    h.ok("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    for digest, version, size in ((D2, "2.0", 300 << 20), (D3, "3.0", 100 << 20)):
        h.ok("internals", "standin-add-image", f"{NAME}@{digest}", version, str(size))
    h.ok("internals", "standin-tag", f"{NAME}:stable", D2)
    written = seeded(tmp_path / "fixture", DEFAULT_PERSONA)
    for name in ("host.json", "registry.json"):
        assert json.loads((h.state / name).read_text()) == json.loads(
            (written.state / name).read_text()
        )


def has(host: Host, feature: str) -> bool:
    return feature in features_of(host.version)


# -- capabilities ------------------------------------------------------------------------------
def test_help_gives_exactly_the_capabilities_of_the_release(host: Host) -> None:
    """The probes the agent runs (bootc_caps: --help, the hidden flag and verb by clap's exit
    code, ostree's verb), for real against the stand-ins."""
    caps = from_help(
        host.ok("switch", "--help"),
        host.ok("upgrade", "--help"),
        progress_fd=host.run("switch", "--progress-fd", "3", "--help").code == 0,
        image_pull=host.run(*PULL_PROBE_ARGS).code == 0,
        lock_finalization=host.run("admin", "lock-finalization", "--help", tool=OSTREE).code == 0,
        version=parse_version(host.ok("--version")),
    )
    assert caps == release_capabilities(host.version)
    assert host.ok("--version") == f"bootc {host.version}\n"
    rollback = host.ok("rollback", "--help")
    assert ("--soft-reboot" in rollback) == has(host, "soft-reboot")


def test_the_stand_in_ostree_answers_only_the_probe(tmp_path: Path) -> None:
    h = Host(tmp_path / "state", DEFAULT_PERSONA)
    assert h.run("admin", "lock-finalization", "-h", tool=OSTREE).code == 0
    for argv in (["admin", "status"], ["admin", "lock-finalization"], []):
        result = h.run(*argv, tool=OSTREE)
        assert result.code == 1 and result.err.startswith("error: ")


def test_the_persona_comes_from_config_then_the_environment_then_the_newest(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "STANDIN_BOOTC_STATE": str(state)}
    env.pop("STANDIN_BOOTC_VERSION", None)

    def version(**extra: str) -> str:
        return subprocess.run([sys.executable, str(STANDIN), "--version"], env={**env, **extra},
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    assert version() == f"bootc {DEFAULT_PERSONA}\n"
    assert version(STANDIN_BOOTC_VERSION="1.12.0") == "bootc 1.12.0\n"
    (state / "config.json").write_text(json.dumps({"version": "1.6.0"}))
    assert version(STANDIN_BOOTC_VERSION="1.12.0") == "bootc 1.6.0\n"  # config wins


def test_an_unknown_persona_is_a_clear_error(tmp_path: Path) -> None:
    h = Host(tmp_path / "state", "1.7.3")
    result = h.run("status", "--format", "json")
    assert result.code == 1
    assert "unknown bootc persona '1.7.3'" in result.err and ", ".join(PERSONAS) in result.err


def test_the_stand_in_needs_no_installed_package(tmp_path: Path) -> None:
    """It loads the release table by path: no site-packages, no repository on sys.path."""
    env = {"STANDIN_BOOTC_STATE": str(tmp_path), "STANDIN_BOOTC_VERSION": "1.15.0"}
    done = subprocess.run([sys.executable, "-I", "-S", str(STANDIN), "--version"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout == "bootc 1.15.0\n"


# -- status ------------------------------------------------------------------------------------
def test_status_has_exactly_the_fields_of_the_release(host: Host) -> None:
    """Absent, not false (docs/bootc-releases.md §4)."""
    host.ok("switch", "--transport", "registry", f"{NAME}@{D2}")
    status = host.status()
    for slot in ("booted", "staged"):
        entry = status[slot]
        assert ("softRebootCapable" in entry) == has(host, "status-soft-reboot-capable")
        assert ("downloadOnly" in entry) == has(host, "status-download-only")
        assert {"image", "cachedUpdate", "incompatible", "pinned"} <= set(entry)


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "feature"),
    [
        (["switch", "--download-only", f"{NAME}@{D2}"], "switch-download-only"),
        (["switch", "--from-downloaded"], "switch-from-downloaded"),
        (["upgrade", "--download-only"], "upgrade-download-only"),
        (["upgrade", "--from-downloaded"], "upgrade-from-downloaded"),
        (["upgrade", "--check", "--tag", "stable"], "upgrade-tag"),
        (["upgrade", "--soft-reboot", "auto"], "soft-reboot"),
        (["switch", "--soft-reboot=auto", f"{NAME}@{D2}"], "soft-reboot"),
    ],
)
def test_a_flag_the_release_lacks_is_refused_by_clap(
    host: Host, argv: list[str], feature: str
) -> None:
    """Exit 2 before anything runs (docs/bootc-releases.md §12); accepted where the release has
    it."""
    if argv[1:] == ["--from-downloaded"]:
        host.ok("switch", f"{NAME}@{D2}")  # something staged to apply
    before = host.files()
    result = host.run(*argv)
    if has(host, feature):
        assert result.code == 0, result
    else:
        assert result.code == 2 and "unexpected argument" in result.err
        assert host.files() == before  # nothing ran


@ENDS
def test_clap_conflicts(host: Host) -> None:
    checks = [("--check", "--soft-reboot", "auto")] if has(host, "soft-reboot") else []
    if has(host, "upgrade-download-only"):
        checks += [("--download-only", "--check"), ("--from-downloaded", "--download-only")]
    for argv in checks:
        result = host.run("upgrade", *argv)
        assert result.code == 2 and "cannot be used with" in result.err
    if has(host, "switch-from-downloaded"):
        assert host.run("switch", "--from-downloaded", f"{NAME}@{D2}").code == 2
    assert host.run("switch").code == 2  # a target is required
    if has(host, "soft-reboot"):
        assert host.run("upgrade", "--soft-reboot", "maybe").code == 2


def test_check_of_a_digest_pinned_spec_asks_no_registry(host: Host) -> None:
    """`No changes in: docker://NAME@D` without a registry lookup (docs/bootc-releases.md §11):
    it holds with the registry gone; it never sees a tag move."""
    (host.state / "registry.json").unlink()
    assert host.ok("upgrade", "--check") == f"No changes in: docker://{NAME}@{D1}\n"
    assert host.fetched() == []


def test_upgrade_download_only_locks_an_unchanged_staged_deployment(host: Host) -> None:
    """The lock of a stage that is already the spec (docs/bootc-releases.md §9): the spec is the
    staged digest, the pull short-circuits, `staged_unchanged` locks it; a plain upgrade unlocks
    it again. 1.6 has no such flag."""
    host.ok("switch", f"{NAME}@{D2}")
    if not has(host, "upgrade-download-only"):
        assert host.run("upgrade", "--download-only").code == 2
        assert "Staged update present, not changed." in host.ok("upgrade")
        return
    assert host.status()["staged"]["downloadOnly"] is False
    out = host.ok("upgrade", "--download-only")
    assert "Image downloaded, but will not be applied on reboot" in out
    assert host.status()["staged"]["downloadOnly"] is True
    assert host.fetched("upgrade")[-1] == {**host.fetched("upgrade")[-1], "bytes": 0,
                                           "registry": False}  # fmt: skip
    assert "Staged update present, not changed\n" in host.ok("upgrade", "--download-only")
    assert "Staged deployment will now be applied on reboot" in host.ok("upgrade")
    assert host.status()["staged"]["downloadOnly"] is False


def test_upgrade_download_only_with_nothing_staged_stages_nothing(host: Host) -> None:
    if not has(host, "upgrade-download-only"):  # before 1.12: clap refuses the flag
        assert host.run("upgrade", "--download-only").code == 2
        return
    assert host.ok("upgrade", "--download-only").endswith("No update available.\n")
    assert host.status()["staged"] is None


def test_a_required_soft_reboot_bails_on_an_incapable_deployment(host: Host) -> None:
    """`required` bails, `auto` falls back silently (docs/bootc-releases.md §10); the stage
    stays."""
    result = host.run("switch", "--soft-reboot", "required", f"{NAME}@{D2}")
    if not has(host, "soft-reboot"):  # before 1.7: clap refuses the flag, nothing is staged
        assert result.code == 2 and host.status()["staged"] is None
        return
    assert result.code == 1
    assert "Soft reboot was required but staged deployment is not soft-reboot capable" in (
        result.err
    )
    assert host.status()["staged"]["image"]["imageDigest"] == D2
    host.ok("switch", "--soft-reboot", "auto", f"{NAME}@{D3}")
    state = json.loads((host.state / "host.json").read_text())
    assert "softRebootPrepared" not in state


def test_switch_download_only_never_prepares_a_soft_reboot(host: Host) -> None:
    """PR #2342 returns before any soft-reboot handling (docs/bootc-releases.md §9, §10)."""
    host.configure(soft_reboot_capable=True)
    if not has(host, "switch-download-only"):  # before 1.16.10: clap refuses the flag
        assert host.run("switch", "--download-only", f"{NAME}@{D2}").code == 2
        return
    host.ok("switch", "--download-only", "--soft-reboot", "required", f"{NAME}@{D2}")
    host.ok("internals", "standin-reboot")
    assert host.status()["booted"]["image"]["imageDigest"] == D1  # discarded


def test_upgrade_download_only_with_a_soft_reboot_runs_the_locked_image(host: Host) -> None:
    """The hazard of docs/bootc-releases.md §10, modelled so that tests can show the agent never
    walks into it: the nextroot is prepared for the locked deployment, and the next reboot
    runs it."""
    host.configure(soft_reboot_capable=True)
    host.ok("switch", f"{NAME}@{D2}")
    if not has(host, "upgrade-download-only"):  # before 1.12: the hazard cannot be reached
        assert host.run("upgrade", "--download-only", "--soft-reboot", "auto").code == 2
        return
    host.ok("upgrade", "--download-only", "--soft-reboot", "auto")
    assert host.status()["staged"]["downloadOnly"] is True
    host.ok("internals", "standin-reboot")
    state = json.loads((host.state / "host.json").read_text())
    assert state["booted"]["digest"] == D2 and state["lastBoot"] == "soft-into-locked"


def host_json(host: Host) -> dict:
    return json.loads((host.state / "host.json").read_text())


def test_a_soft_reboot_with_nothing_prepared_re_enters_the_same_root(host: Host) -> None:
    """systemd's soft reboot with no /run/nextroot re-executes the same root: the staged
    deployment stays staged (still locked, where it was), and only a full reboot boots it."""
    host.configure(soft_reboot_capable=True)
    host.ok("switch", f"{NAME}@{D2}")  # no --soft-reboot: nothing prepared
    locked = has(host, "upgrade-download-only")
    if locked:
        host.ok("upgrade", "--download-only")
    host.ok("internals", "standin-reboot", "--soft")
    state = host_json(host)
    assert (state["booted"]["digest"], state["staged"]["digest"]) == (D1, D2)
    assert (state["staged"]["locked"], state["lastBoot"], state["softReboots"]) == (
        locked, "soft-same-root", 1)  # fmt: skip
    host.ok("internals", "standin-reboot")  # `systemctl reboot`: nothing prepared, a full one
    state = host_json(host)
    assert state["booted"]["digest"] == (D1 if locked else D2) and state["lastBoot"] == "full"


def test_a_prepared_soft_reboot_is_entered_and_cleared_as_ostree_does(host: Host) -> None:
    """A stage, a rollback that drops the staged deployment, `ostree admin prepare-soft-reboot
    --reset` and a full reboot (logind's, the agent's) clear /run/nextroot; a soft reboot enters
    it."""
    host.configure(soft_reboot_capable=True)
    if not has(host, "soft-reboot"):
        assert host.run("switch", "--soft-reboot", "auto", f"{NAME}@{D2}").code == 2
        return
    host.ok("switch", "--soft-reboot", "auto", f"{NAME}@{D2}")
    assert host_json(host)["softRebootPrepared"] == "staged"
    host.ok("switch", f"{NAME}@{D3}")  # staging resets it
    assert "softRebootPrepared" not in host_json(host)
    host.ok("upgrade", "--soft-reboot", "auto")  # staged unchanged: prepared for it
    assert host_json(host)["softRebootPrepared"] == "staged"
    assert host.run("admin", "prepare-soft-reboot", "--reset", tool=OSTREE).code == 0
    assert "softRebootPrepared" not in host_json(host)
    host.ok("upgrade", "--soft-reboot", "auto")
    host.ok("internals", "standin-reboot", "--full")  # lost with /run; the bootloader boots D3
    state = host_json(host)
    assert (state["booted"]["digest"], state["lastBoot"]) == (D3, "full")
    assert "softRebootPrepared" not in state and "softReboots" not in state
    host.ok("switch", "--soft-reboot", "auto", f"{NAME}@{D2}")
    host.ok("rollback")  # drops the staged deployment, and what was prepared for it
    assert "softRebootPrepared" not in host_json(host)
    host.ok("rollback")  # (a toggle)
    if has(host, "upgrade-from-downloaded"):  # the agent's turn: prepared, then entered
        host.ok("switch", f"{NAME}@{D2}")
        host.ok("upgrade", "--from-downloaded", "--soft-reboot", "auto")
        host.ok("internals", "standin-reboot", "--soft")
        state = host_json(host)
        assert (state["booted"]["digest"], state["lastBoot"], state["softReboots"]) == (
            D2, "soft", 1)  # fmt: skip


def test_a_soft_reboot_of_the_rollback_consults_the_rollback_entry(host: Host) -> None:
    host.configure(soft_reboot_capable=True)
    host.ok("switch", f"{NAME}@{D2}")
    host.ok("internals", "standin-reboot")  # D2 booted, D1 the rollback (not capable)
    result = host.run("rollback", "--soft-reboot", "required")
    if not has(host, "soft-reboot"):  # before 1.7: clap refuses the flag
        assert result.code == 2 and not host.status()["rollbackQueued"]
        return
    assert result.code == 1 and "rollback deployment is not soft-reboot capable" in result.err
    assert host.status()["rollbackQueued"] is True


def test_podman_is_needed_where_the_release_needs_it(host: Host) -> None:
    """docs/bootc-releases.md §5: before the pull from 1.12, for --check from 1.15.1, at the cleanup
    after a stage on 1.6 (the stage is written, the call fails)."""
    host.configure(podman=False)
    switch = host.run("switch", f"{NAME}@{D2}")
    assert switch.code == 1 and "podman" in switch.err
    staged = host.status()["staged"]
    if has(host, "podman-for-stage-pull"):
        assert staged is None and host.fetched() == []
    else:
        assert staged["image"]["imageDigest"] == D2
    assert (host.run("upgrade", "--check").code == 1) == has(host, "podman-for-check")
    # the pull needs no podman (docs/bootc-releases.md §6)
    assert host.pull(f"{NAME}@{D3}").code == 0


# -- the hidden pre-pull and the repository ----------------------------------------------------
def progress_events(host: Host, *argv: str) -> list[dict]:
    """Run `bootc ARGV --progress-fd 3` with fd 3 on a file: the events it wrote."""
    out = host.state / "progress.jsonl"
    done = subprocess.run(
        ["/bin/sh", "-c", 'exec "$@" --progress-fd 3 3>"$0"', str(out), str(STANDIN), *argv],
        env=host.env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_pre_pull_stages_nothing_and_the_switch_fetches_nothing(host: Host) -> None:
    """Pull, list, switch of the identical `NAME@D` (docs/bootc-releases.md §7): the switch
    finds it stored, contacts no registry and reports no byte progress at all, only `No changes
    in NAME@D => D`, then deploys."""
    ref = f"{NAME}@{D2}"
    pulled = host.pull(ref)
    assert pulled.code == 0 and pulled.out.startswith("layers already present: 0;")
    assert host.status()["staged"] is None  # nothing staged
    assert listed("\n".join(host.stored()), ref)
    assert host.fetched() == [{**host.fetched()[0], "verb": "pull", "ref": ref, "digest": D2,
                               "bytes": 300 << 20, "registry": True}]  # fmt: skip
    again = host.pull(ref)  # idempotent, and local (docs/bootc-releases.md §8)
    assert again.out.startswith(f"No changes in ostree-unverified-registry:{ref} => ")
    assert host.fetched()[-1]["registry"] is False and host.fetched()[-1]["bytes"] == 0

    events = progress_events(host, "switch", "--transport", "registry", ref)
    assert [e for e in events if e["type"] == "ProgressBytes"] == []
    assert [e["task"] for e in events] == ["staging"] * 4
    (turn,) = host.fetched("switch")
    assert (turn["ref"], turn["bytes"], turn["registry"]) == (ref, 0, False)
    assert host.status()["staged"]["image"]["imageDigest"] == D2
    assert sorted(host.stored()) == [f"docker://{NAME}@{d}" for d in (D1, D2)]


def test_a_stage_prunes_what_no_deployment_uses(host: Host) -> None:
    """Any stage prunes undeployed images (docs/bootc-releases.md §8); a reboot does not."""
    assert host.pull(f"{NAME}@{D2}").code == 0
    host.ok("internals", "standin-reboot")
    assert f"docker://{NAME}@{D2}" in host.stored()  # a reboot prunes nothing
    host.ok("switch", f"{NAME}@{D3}")
    assert sorted(host.stored()) == [f"docker://{NAME}@{d}" for d in (D1, D3)]
    host.ok("switch", f"{NAME}@{D2}")  # pulled again, in full
    assert host.fetched("switch")[-1]["bytes"] == 300 << 20
    assert sorted(host.stored()) == [f"docker://{NAME}@{d}" for d in (D1, D2)]  # D3 replaced
    assert host.pull(f"{NAME}@{D3}").code == 0
    host.ok("internals", "cleanup")
    assert f"docker://{NAME}@{D3}" not in host.stored()


@ENDS
def test_a_pre_pull_under_another_reference_costs_a_manifest_not_the_layers(host: Host) -> None:
    """Keyed by the exact string (docs/bootc-releases.md §7): `NAME:v2@D` is not
    `NAME@D`, so the switch asks the registry, but finds every layer."""
    assert host.pull(f"{NAME}:v2@{D2}").code == 0
    events = progress_events(host, "switch", f"{NAME}@{D2}")
    (turn,) = host.fetched("switch")
    assert (turn["bytes"], turn["registry"]) == (0, True)
    pulled = [e for e in events if e["type"] == "ProgressBytes"]
    assert pulled and all(e["bytesCached"] == e["bytes"] == e["bytesTotal"] for e in pulled)


@ENDS
def test_the_pull_takes_the_repository_path_as_given(host: Host, tmp_path: Path) -> None:
    repo = tmp_path / "no" / "such" / "repo"
    args = ("internals", "ostree-container", "image")
    result = host.run(*args, "pull", str(repo), f"ostree-unverified-image:docker://{NAME}@{D2}")
    assert result.code == 0 and not repo.exists() and not (tmp_path / "no").exists()
    assert f"docker://{NAME}@{D2}" in host.ok(*args, "list", "--repo", str(repo)).split()
    assert host.run(*args, "list").code == 2  # --repo is required
    assert host.run(*args, "pull", "--help").code == 0
    assert host.run(*args, "pull", REPO, "ostree-unverified-image:oci:/tmp/x").code == 1
    for bad in (f"{NAME}@{D2}", "oci:/tmp/x"):  # not an ostree image reference: clap's
        assert host.run(*args, "pull", REPO, bad).code == 2


@ENDS
def test_a_signed_pull_is_refused_as_the_policy_would(host: Host) -> None:
    """The signed form verifies while it fetches; what is stored already is not verified again
    (docs/bootc-releases.md §7), exactly as bootc: the agent must pull signed."""
    host.configure(unsigned=[NAME])
    refused = host.pull(f"{NAME}@{D2}", signed=True)
    assert refused.code == 1 and "Source image rejected: A signature was required" in refused.err
    assert f"docker://{NAME}@{D2}" not in host.stored()
    switch = host.run("switch", "--enforce-container-sigpolicy", f"{NAME}@{D2}")
    assert switch.code == 1 and "Source image rejected" in switch.err
    assert host.pull(f"{NAME}@{D2}").code == 0  # unverified: stored
    assert host.pull(f"{NAME}@{D2}", signed=True).code == 0  # present: nothing verified
    host.ok("switch", "--enforce-container-sigpolicy", f"{NAME}@{D2}")
    assert host.fetched("switch")[-1]["registry"] is False
