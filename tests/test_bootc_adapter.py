"""The bootc adapter against the stand-in bootc (standins/bin/bootc), run as child processes.

The same adapter over a real systemd manager (transient unit, adoption) is in
test_systemd_adapter.py."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.core.trust import StageTrust
from agent.errors import HostError
from agent.host import bootc_errors
from agent.host.bootc import STAGE_PRIORITY, Bootc, BootcTimeouts, progress_from_event
from agent.host.ports import Progress
from agent.host.systemd import ProcessUnitRunner
from agent.model.bootc_status import parse_bootc_status
from agent.model.imageref import ImageRef, parse_image_ref
from tests.scenarios.harness import until

STANDIN = Path(__file__).parents[1] / "standins" / "bin" / "bootc"
NAME = "quay.io/example/os"
D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64


class StandinHost:
    def __init__(self, state: Path) -> None:
        self.state = state

    @property
    def env(self) -> dict[str, str]:
        # The stand-in is `#!/usr/bin/env python3`: put this interpreter first on PATH, as the
        # pyenv shim that may come first otherwise costs ~0.1 s per call.
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {"STANDIN_BOOTC_STATE": str(self.state), "PATH": path}

    def bootc(self, *args: str) -> str:
        result = subprocess.run(
            [str(STANDIN), *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def configure(self, **values: object) -> None:
        path = self.state / "config.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**current, **values}))

    def calls(self, phase: str = "start") -> list[list[str]]:
        lines = (self.state / "calls.log").read_text().splitlines()
        return [e["argv"] for e in map(json.loads, lines) if e["phase"] == phase]

    def log(self) -> list[dict]:
        return [json.loads(line) for line in (self.state / "calls.log").read_text().splitlines()]

    def verb_calls(self, verb: str) -> list[list[str]]:
        return [argv for argv in self.calls() if argv and argv[0] == verb and "--help" not in argv]

    async def wait_switches(self, count: int = 1) -> None:
        """Until bootc itself has started its `count`th switch: a stage is under way (its unit
        running is not enough under load)."""
        await until(lambda: len(self.verb_calls("switch")) >= count, 20, f"switch #{count}")

    def adapter(self, tmp: Path, **kwargs: object) -> Bootc:
        kwargs.setdefault("env", self.env)
        return Bootc(
            bootc=str(STANDIN),
            run_dir=tmp / "run",
            progress_poll=0.02,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
def host(tmp_path: Path) -> StandinHost:
    state = tmp_path / "state"
    state.mkdir()
    h = StandinHost(state)
    h.bootc("internals", "standin-seed", f"{NAME}@{D1}", "1.0")
    h.bootc("internals", "standin-add-image", f"{NAME}@{D2}", "2.0", str(300 << 20))
    return h


def ref(digest: str, tag: str = "") -> ImageRef:
    return parse_image_ref(f"{NAME}{':' + tag if tag else ''}@{digest}")


async def test_status_parses_json_v1(host: StandinHost, tmp_path: Path) -> None:
    status = await host.adapter(tmp_path).status()
    assert status.booted_digest == D1
    assert status.staged is None and status.rollback is None
    assert host.calls()[-1] == ["status", "--format", "json", "--format-version", "1"]


def test_standin_status_formats(host: StandinHost) -> None:
    """YAML when piped (bootc's default off a TTY), JSON on request; both parse the same."""
    yaml_text = host.bootc("status")
    assert yaml_text.startswith("apiVersion: org.containers.bootc/v1")
    from_yaml = parse_bootc_status(yaml_text.encode())
    from_json = parse_bootc_status(host.bootc("status", "--format", "json").encode())
    assert from_yaml == from_json and from_json.booted_digest == D1
    with pytest.raises(subprocess.CalledProcessError):
        host.bootc("status", "--format-version", "2")


async def test_capabilities_probed_once_including_hidden_progress_fd(
    host: StandinHost, tmp_path: Path
) -> None:
    bootc = host.adapter(tmp_path)
    caps = await bootc.capabilities()
    assert (caps.switch_download_only, caps.soft_reboot, caps.progress_fd) == (True, True, True)
    probes = len([c for c in host.calls() if "--help" in c])
    assert ["switch", "--progress-fd", "3", "--help"] in host.calls()  # hidden: probed by parse
    await bootc.stage(ref(D2))
    await bootc.capabilities()
    assert len([c for c in host.calls() if "--help" in c]) == probes


async def test_capabilities_of_bootc_without_switch_download_only(
    host: StandinHost, tmp_path: Path
) -> None:
    host.configure(switch_download_only=False, progress_fd_in_help=True)
    caps = await host.adapter(tmp_path).capabilities()
    assert caps.switch_download_only is False and caps.progress_fd is True
    assert not [c for c in host.calls() if c[:2] == ["switch", "--progress-fd"]]


async def test_stage_download_only_with_progress_then_unlock(
    host: StandinHost, tmp_path: Path
) -> None:
    bootc = host.adapter(tmp_path)
    seen: list[Progress] = []
    await bootc.stage(ref(D2, tag="v2"), seen.append, locked=True)
    (switch,) = host.verb_calls("switch")
    assert switch == [
        "switch", "--transport", "registry", "--download-only", "--progress-fd", "3",
        f"{NAME}@{D2}",
    ]  # fmt: skip
    status = await bootc.status()
    assert status.staged_digest == D2 and status.staged is not None
    assert status.staged.download_only
    pulled = [p for p in seen if p.total_bytes]
    assert pulled[-1].done_bytes == pulled[-1].total_bytes == 300 << 20
    assert pulled[-1].render() == "Staging image: 300/300 MiB"
    assert [p.done_bytes for p in pulled] == sorted(p.done_bytes for p in pulled)
    assert seen[-1].step == "staging 3/4"

    assert await bootc.unlock_staged() is True
    assert host.verb_calls("upgrade") == [["upgrade", "--from-downloaded"]]
    status = await bootc.status()
    assert status.staged is not None and not status.staged.download_only
    assert await bootc.unlock_staged() is False  # already armed: nothing asked of bootc
    assert not [c for c in host.calls() if "--apply" in c or "--mutate-in-place" in c]


async def test_unlock_prepares_a_soft_reboot_where_capable(
    host: StandinHost, tmp_path: Path
) -> None:
    host.configure(soft_reboot_capable=True)
    bootc = host.adapter(tmp_path)
    await bootc.stage(ref(D2), locked=True)
    assert await bootc.unlock_staged(soft=True) is True
    assert host.verb_calls("upgrade") == [["upgrade", "--from-downloaded", "--soft-reboot", "auto"]]


async def test_unlock_without_a_staged_deployment(host: StandinHost, tmp_path: Path) -> None:
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).unlock_staged()
    assert err.value.kind == "no-staged"


async def test_stage_plain_switch_where_download_only_is_missing(
    host: StandinHost, tmp_path: Path
) -> None:
    host.configure(switch_download_only=False)
    bootc = host.adapter(tmp_path)
    await bootc.stage(ref(D2))
    (switch,) = host.verb_calls("switch")
    assert "--download-only" not in switch
    status = await bootc.status()
    assert status.staged is not None and not status.staged.download_only
    assert await bootc.unlock_staged() is False


class RecordingRunner(ProcessUnitRunner):
    """The process runner, remembering the properties each unit was started with."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[tuple[str, dict[str, Any]]] = []

    async def start_transient_service(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        properties: Mapping[str, Any] | None = None,
        description: str = "",
    ) -> str:
        self.started.append((name, dict(properties or {})))
        return await super().start_transient_service(name, argv, env, properties, description)


async def test_stage_runs_at_low_priority(host: StandinHost, tmp_path: Path) -> None:
    runner = RecordingRunner()
    await host.adapter(tmp_path, runner=runner).stage(ref(D2))
    assert runner.started == [
        ("image-mode-agent-stage.service",
         {"IOSchedulingClass": 3, "IOWeight": 10, "CPUWeight": 20, "Nice": 10}),
    ]  # fmt: skip
    assert dict(STAGE_PRIORITY) == runner.started[0][1]


async def test_process_runner_applies_nice(tmp_path: Path) -> None:
    """Only Nice: the process group is reniced right after the spawn. The command waits for a
    go file, so what it reads is the priority after start_transient_service returned."""
    runner, out, go = ProcessUnitRunner(), tmp_path / "nice", tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.01; done; nice > {out}"
    base = os.getpriority(os.PRIO_PROCESS, 0)
    await runner.start_transient_service(
        "t.service", ["/bin/sh", "-c", script], properties=dict(STAGE_PRIORITY)
    )
    go.touch()
    state = await runner.wait_unit_finished("t.service", 10)
    assert state.ok and int(out.read_text()) == max(base, 10)  # absolute, as systemd's Nice=


async def test_a_staged_digest_is_not_staged_again(host: StandinHost, tmp_path: Path) -> None:
    runner = RecordingRunner()
    bootc = host.adapter(tmp_path, runner=runner)
    await bootc.stage(ref(D2), locked=True)
    await bootc.stage(ref(D2, tag="v2"))  # the same digest under a tag
    await bootc.stage(ref(D2), locked=True)  # locked already (download-only)
    assert len(host.verb_calls("switch")) == 1 and len(runner.started) == 1
    assert (await bootc.status()).staged_locked(D2)


async def test_a_locked_stage_locks_the_same_spec_staged_unlocked(
    host: StandinHost, tmp_path: Path
) -> None:
    """Staged unlocked (by hand, say): a locked stage of that spec cannot switch to it (bootc
    finds the spec unchanged), so it locks what is staged, pulling nothing again."""
    bootc = host.adapter(tmp_path)
    await bootc.stage(ref(D2))  # a plain switch: the next reboot would boot it
    assert not (await bootc.status()).staged_locked(D2)
    assert await bootc.stage(ref(D2), locked=True) == 0
    assert len(host.verb_calls("switch")) == 1
    assert host.verb_calls("upgrade") == [["upgrade", "--download-only"]]
    assert (await bootc.status()).staged_locked(D2)
    host.bootc("internals", "standin-reboot")  # an ordinary reboot discards it
    assert (await bootc.status()).booted_digest == D1


async def test_a_locked_stage_that_bootc_leaves_unlocked_is_an_error(
    host: StandinHost, tmp_path: Path
) -> None:
    """A bootc that stages without the lock it was asked for (here: one that drops the flag)
    fails the stage: the caller never takes an unlocked deployment for a locked one."""
    dropping = tmp_path / "bootc-dropping-the-lock"
    dropping.write_text("#!/bin/sh\nfor a; do shift; [ \"$a\" = --download-only ] || "
                        f"set -- \"$@\" \"$a\"; done\nexec {STANDIN} \"$@\"\n")  # fmt: skip
    dropping.chmod(0o755)
    bootc = Bootc(bootc=str(dropping), run_dir=tmp_path / "run", progress_poll=0.02,
                  env=host.env)  # fmt: skip
    with pytest.raises(HostError) as err:
        await bootc.stage(ref(D2), locked=True)
    assert "but not locked (download-only): any reboot would boot it" in str(err.value)


async def test_a_staged_digest_being_replaced_is_staged_again(
    host: StandinHost, tmp_path: Path
) -> None:
    """D2 is staged but a stage of D3 runs: it would replace D2, so a stage of D2 is no
    no-op; it supersedes the D3 stage, and bootc finds its spec unchanged."""
    host.bootc("internals", "standin-add-image", f"{NAME}@{D3}", "3.0")
    runner = ProcessUnitRunner()
    first, second = host.adapter(tmp_path, runner=runner), host.adapter(tmp_path, runner=runner)
    await first.stage(ref(D2))
    host.configure(progress_delay=1.0)  # D3 is still pulling when D2 comes, even under load
    newer = asyncio.create_task(first.stage(ref(D3)))
    await host.wait_switches(2)  # bootc itself has started on D3
    await second.stage(ref(D2))
    with pytest.raises(HostError) as err:
        await newer
    assert err.value.kind == "cancelled"
    assert [c[-1] for c in host.verb_calls("switch")] == [f"{NAME}@{d}" for d in (D2, D3, D2)]
    assert (await second.status()).staged_digest == D2


async def test_locked_stage_where_bootc_cannot_lock(host: StandinHost, tmp_path: Path) -> None:
    host.configure(switch_download_only=False)
    bootc = host.adapter(tmp_path)
    with pytest.raises(HostError) as err:
        await bootc.stage(ref(D2), locked=True)
    assert err.value.kind == "unsupported"
    assert "bootc switch --download-only" in str(err.value)
    assert host.verb_calls("switch") == [] and host.verb_calls("status") == []
    await bootc.stage(ref(D2))  # unlocked is still allowed: a plain switch
    assert (await bootc.status()).staged_digest == D2


async def test_locked_stage_is_download_only(host: StandinHost, tmp_path: Path) -> None:
    bootc = host.adapter(tmp_path)
    await bootc.stage(ref(D2), locked=True)
    (switch,) = host.verb_calls("switch")
    assert "--download-only" in switch
    status = await bootc.status()
    assert status.staged is not None and status.staged.download_only
    host.bootc("internals", "standin-reboot")  # an ordinary reboot: discarded
    status = await bootc.status()
    assert status.staged is None and status.booted_digest == D1


async def test_stage_refuses_unpinned(host: StandinHost, tmp_path: Path) -> None:
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).stage(parse_image_ref(f"{NAME}:latest"))
    assert err.value.kind == "input"


@pytest.mark.parametrize(
    ("fail", "kind", "text"),
    [
        (None, "image-missing", "manifest unknown"),
        ("registry-auth", "registry-auth", "unauthorized"),
        ("registry-denied", "registry-auth", "denied"),
        ("disk-space", "disk-space", "No space left on device"),
        ("other", "other", "configured failure"),
    ],
)
async def test_stage_failures_have_distinct_kinds(
    host: StandinHost, tmp_path: Path, fail: str | None, kind: str, text: str
) -> None:
    target = ref(D3)  # not in the registry
    if fail:
        host.configure(fail={"switch": fail})
        target = ref(D2)
    bootc = host.adapter(tmp_path)
    with pytest.raises(HostError) as err:
        await bootc.stage(target)
    assert err.value.kind == kind
    assert str(err.value).startswith("error: ") and text in str(err.value)
    assert "\n" not in str(err.value)
    assert (await bootc.status()).staged is None
    host.configure(fail={})
    await bootc.stage(ref(D2))  # the failed unit was cleared: the name is free again
    assert (await bootc.status()).staged_digest == D2


async def test_lock_held_by_another_transaction_times_out_as_lock(
    host: StandinHost, tmp_path: Path
) -> None:
    bootc = host.adapter(tmp_path, timeouts=BootcTimeouts(status=0.5, stage=0.5))
    await bootc.capabilities()
    fd = os.open(host.state / "sysroot.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # like rpm-ostreed holding the sysroot lock
    try:
        with pytest.raises(HostError) as err:
            await bootc.status()
        assert err.value.kind == "lock" and "sysroot lock" in str(err.value)
        with pytest.raises(HostError) as err:
            await bootc.stage(ref(D2))
        assert err.value.kind == "lock"
    finally:
        os.close(fd)
    await bootc.stage(ref(D2))  # the stopped unit left nothing behind
    assert (await bootc.status()).staged_digest == D2


async def test_configured_lock_wait_is_a_lock_error(host: StandinHost, tmp_path: Path) -> None:
    host.configure(fail={"status": "lock-wait"})
    bootc = host.adapter(tmp_path, timeouts=BootcTimeouts(status=0.5))
    with pytest.raises(HostError) as err:
        await bootc.status()
    assert err.value.kind == "lock"


async def test_slow_stage_without_lock_is_a_timeout(host: StandinHost, tmp_path: Path) -> None:
    host.configure(progress_delay=2.0)
    bootc = host.adapter(tmp_path, timeouts=BootcTimeouts(stage=0.5))
    with pytest.raises(HostError) as err:
        await bootc.stage(ref(D2))
    assert err.value.kind == "timeout"
    host.configure(progress_delay=0)
    assert (await bootc.status()).staged is None


async def test_calls_are_serialized_per_adapter(host: StandinHost, tmp_path: Path) -> None:
    host.configure(progress_delay=0.05)
    bootc = host.adapter(tmp_path)
    await bootc.capabilities()
    stage = asyncio.create_task(bootc.stage(ref(D2)))
    await host.wait_switches()
    status = await bootc.status()
    await stage
    assert status.staged_digest == D2  # status waited for the stage to finish
    events = [(e["argv"][0], e["phase"]) for e in host.log() if "--help" not in e["argv"]]
    statuses = [i for i, event in enumerate(events) if event == ("status", "start")]
    assert statuses[0] < events.index(("switch", "start"))  # the stage's already-staged check
    assert statuses[-1] > events.index(("switch", "exit"))


async def test_cancel_stage(host: StandinHost, tmp_path: Path) -> None:
    host.configure(progress_delay=0.5)
    bootc = host.adapter(tmp_path)
    await bootc.capabilities()
    stage = asyncio.create_task(bootc.stage(ref(D2)))
    await host.wait_switches()
    await bootc.cancel_stage()
    with pytest.raises(HostError) as err:
        await stage
    assert err.value.kind == "cancelled"
    host.configure(progress_delay=0)
    assert (await bootc.status()).staged is None


async def test_second_adapter_adopts_a_running_stage(host: StandinHost, tmp_path: Path) -> None:
    """Two adapters over one runner stand for an agent before and after a restart: the first
    dies mid-stage (its task is cancelled, the unit runs on), the second waits for the unit
    instead of starting bootc twice."""
    host.configure(progress_delay=0.1)  # ten events: the unit runs on for about a second
    runner = ProcessUnitRunner()
    first, second = host.adapter(tmp_path, runner=runner), host.adapter(tmp_path, runner=runner)
    await first.capabilities()
    await second.capabilities()
    dying = asyncio.create_task(first.stage(ref(D2)))
    await host.wait_switches()
    dying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dying
    assert (await runner.unit_state(first.unit)).running
    await second.stage(ref(D2))
    assert len(host.verb_calls("switch")) == 1
    assert (await second.status()).staged_digest == D2


async def test_a_different_target_supersedes_a_running_stage(
    host: StandinHost, tmp_path: Path
) -> None:
    host.configure(progress_delay=1.0)  # D2 is slow; D3 (delay 0 in the registry) is quick
    host.bootc("internals", "standin-add-image", f"{NAME}@{D3}", "3.0")
    registry = json.loads((host.state / "registry.json").read_text())
    registry["images"][f"{NAME}@{D3}"]["progress_delay"] = 0
    (host.state / "registry.json").write_text(json.dumps(registry))
    runner = ProcessUnitRunner()
    first, second = host.adapter(tmp_path, runner=runner), host.adapter(tmp_path, runner=runner)
    await first.capabilities()
    await second.capabilities()
    old = asyncio.create_task(first.stage(ref(D2)))
    await host.wait_switches()
    await second.stage(ref(D3))
    with pytest.raises(HostError) as err:
        await old
    assert err.value.kind == "cancelled"
    assert (await second.status()).staged_digest == D3


async def test_rollback_is_not_toggled_twice(host: StandinHost, tmp_path: Path) -> None:
    bootc = host.adapter(tmp_path)
    with pytest.raises(HostError) as err:
        await bootc.rollback()
    assert err.value.kind == "rollback"
    await bootc.stage(ref(D2))
    await bootc.unlock_staged()
    host.bootc("internals", "standin-reboot")
    host.bootc("internals", "standin-add-image", f"{NAME}@{D3}", "3.0")
    await bootc.stage(ref(D3))
    await bootc.rollback()
    status = await bootc.status()
    assert status.rollback_queued and status.staged is None  # rollback discards a staged one
    await bootc.rollback()
    assert (await bootc.status()).rollback_queued  # not toggled back
    assert len(host.verb_calls("rollback")) == 1


async def test_command_prefix_is_used(host: StandinHost, tmp_path: Path) -> None:
    """Pod mode runs bootc behind a prefix (nsenter); `env VAR=...` stands in for it here."""
    bootc = Bootc(
        bootc=str(STANDIN),
        command_prefix=["env", *(f"{k}={v}" for k, v in host.env.items())],
        run_dir=tmp_path / "run",
    )
    assert (await bootc.status()).booted_digest == D1
    await bootc.stage(ref(D2))
    assert (await bootc.status()).staged_digest == D2


def test_progress_events() -> None:
    assert progress_from_event('{"type": "Start", "version": "0.1.0"}') is None
    assert progress_from_event("Queued for next boot") is None
    line = json.dumps({"type": "ProgressBytes", "task": "pulling", "bytes": 5 << 20,
                       "bytesTotal": 10 << 20, "steps": 1, "stepsTotal": 2})  # fmt: skip
    assert progress_from_event(line) == Progress(5 << 20, 10 << 20, "pulling")
    line = json.dumps({"type": "ProgressSteps", "task": "staging", "steps": 2, "stepsTotal": 4})
    assert progress_from_event(line) == Progress(step="staging 2/4")


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("error: Switching: Pulling: reading manifest x in q/y: manifest unknown", "image-missing"),
        ("error: ...: received unexpected HTTP status: 401 Unauthorized", "registry-auth"),
        ("error: ...: 403 Forbidden", "registry-auth"),
        ("error: Pulling: writing object: No space left on device (os error 28)", "disk-space"),
        ("error: Upgrading: Insufficient free space for update", "disk-space"),
        ("Waiting for sysroot lock...\nerror: something", "lock"),
        ("error: Rollback: No rollback available", "other"),
        ("error: Switching: Pulling: Creating importer: failed to invoke method OpenImage: "
         "Source image rejected: A signature was required, but no signature exists", "signature"),
        ("error: ...: Source image rejected: Invalid GPG signature: gpgme_op_verify", "signature"),
        ("error: ...: Running image docker://q.io/os@sha256:1 is rejected by policy.",
         "signature"),
        ("error: ...: containers-policy.json specifies a default of `insecureAcceptAnything`; "
         "refusing usage", "signature"),
    ],
)  # fmt: skip
def test_error_classification(stderr: str, kind: str) -> None:
    assert bootc_errors.classify(stderr) == kind


def test_error_message_is_the_error_lines() -> None:
    err = bootc_errors.failure("bootc switch", "progress...\nerror: one\n  \n", 1)
    assert str(err) == "error: one"
    assert str(bootc_errors.failure("bootc switch", "", 1)) == (
        "bootc switch failed with exit status 1"
    )


# -- signatures (agent/core/trust.py decides; the adapter passes it on) ---------------------------
ENFORCED = StageTrust(enforce=True, scope="default: reject")


async def test_an_enforced_stage_asks_bootc_to_verify(host: StandinHost, tmp_path: Path) -> None:
    runner = RecordingRunner()
    bootc = host.adapter(tmp_path, runner=runner)
    assert (await bootc.capabilities()).sigpolicy
    await bootc.stage(ref(D2), trust=ENFORCED)
    (switch,) = host.verb_calls("switch")
    assert switch[:4] == ["switch", "--transport", "registry", "--enforce-container-sigpolicy"]
    assert "BindReadOnlyPaths" not in runner.started[0][1]  # the host's own policy


async def test_an_unenforced_stage_passes_no_flag(host: StandinHost, tmp_path: Path) -> None:
    await host.adapter(tmp_path).stage(ref(D2), trust=StageTrust(scope="no policy"))
    (switch,) = host.verb_calls("switch")
    assert "--enforce-container-sigpolicy" not in switch


@pytest.mark.parametrize(
    ("trust", "configure", "words"),
    [
        (StageTrust(refusal="quay.example/os is rejected by policy.json"), {}, "rejected"),
        (ENFORCED, {"switch_sigpolicy": False}, "no `bootc switch --enforce-container-sigpolicy`"),
        (StageTrust(enforce=True, policy=b"{}"), {}, "needs a systemd unit to mount it"),
    ],
)
async def test_a_stage_that_cannot_be_verified_never_starts(
    host: StandinHost, tmp_path: Path, trust: StageTrust, configure: dict, words: str
) -> None:
    host.configure(**configure)
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).stage(ref(D2), trust=trust)
    assert err.value.kind == "signature" and words in str(err.value)
    assert host.verb_calls("switch") == []


async def test_a_running_stage_under_other_trust_is_not_adopted(
    host: StandinHost, tmp_path: Path
) -> None:
    """A pre-stage started unverified is replaced, not adopted, by a stage that must verify."""
    host.configure(progress_delay=1.0)  # four steps: the first stage runs for about 4 s
    runner = ProcessUnitRunner()
    first = host.adapter(tmp_path, runner=runner)
    unverified = asyncio.create_task(first.stage(ref(D2)))
    await host.wait_switches()
    second = host.adapter(tmp_path, runner=runner)
    await second.stage(ref(D2), trust=ENFORCED)
    with pytest.raises(HostError):
        await unverified  # superseded
    switches = host.verb_calls("switch")
    assert len(switches) == 2 and "--enforce-container-sigpolicy" in switches[1]


async def test_a_deployment_staged_unverified_is_verified_again(
    host: StandinHost, tmp_path: Path
) -> None:
    """Pre-staged while nobody asked for a signature, then the policy demands one: the staged
    digest does not do, and the switch (a new spec for bootc) verifies it."""
    bootc = host.adapter(tmp_path)
    await bootc.stage(ref(D2), locked=True)
    status = await bootc.status()
    assert status.staged is not None and status.staged.image is not None
    assert not status.staged.image.policy_enforced
    await bootc.stage(ref(D2), trust=ENFORCED)
    await bootc.stage(ref(D2), trust=ENFORCED)  # now verified: not again
    switches = host.verb_calls("switch")
    assert len(switches) == 2 and "--enforce-container-sigpolicy" in switches[1]
    staged = (await bootc.status()).staged
    assert staged is not None and staged.image is not None and staged.image.policy_enforced
    await bootc.stage(ref(D2))  # an unverified stage is content with a verified one
    assert len(host.verb_calls("switch")) == 2


# -- following a tag: `bootc upgrade --check [--tag]` ------------------------------------------
async def test_check_update_asks_for_the_followed_tag(host: StandinHost, tmp_path: Path) -> None:
    host.bootc("internals", "standin-tag", f"{NAME}:stable", D2)
    bootc = host.adapter(tmp_path)
    assert await bootc.check_update(parse_image_ref(f"{NAME}:stable")) == D2
    # the host runs NAME@D1 (the agent stages digests): the tag is named explicitly
    assert host.verb_calls("upgrade") == [["upgrade", "--check", "--tag", "stable"]]
    assert (await bootc.capabilities()).upgrade_tag


async def test_check_update_of_the_image_the_host_runs_is_unchanged(
    host: StandinHost, tmp_path: Path
) -> None:
    """A host installed from the tag itself (spec NAME:stable): plain `upgrade --check`; bootc
    compares with the image stored under that name and prints "No changes in", so the digest
    is the booted deployment's."""
    state = json.loads((host.state / "host.json").read_text())
    state["booted"]["image"] = f"{NAME}:stable"
    (host.state / "host.json").write_text(json.dumps(state))
    host.bootc("internals", "standin-tag", f"{NAME}:stable", D1)
    assert "No changes in" in host.bootc("upgrade", "--check")
    bootc = host.adapter(tmp_path)
    assert await bootc.check_update(parse_image_ref(f"{NAME}:stable")) == D1
    assert host.verb_calls("upgrade")[-1] == ["upgrade", "--check"]
    host.bootc("internals", "standin-tag", f"{NAME}:stable", D2)  # the tag moves on
    assert await bootc.check_update(parse_image_ref(f"{NAME}:stable")) == D2


async def test_check_update_refuses_another_repository(host: StandinHost, tmp_path: Path) -> None:
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).check_update(parse_image_ref("quay.io/other/os:stable"))
    assert err.value.kind == "unsupported"
    assert "only in the repository the host runs (quay.io/example/os)" in str(err.value)
    assert "bootc switch quay.io/other/os:stable" in str(err.value)
    assert host.verb_calls("upgrade") == []  # refused before bootc was asked


async def test_check_update_needs_upgrade_tag_for_another_tag(
    host: StandinHost, tmp_path: Path
) -> None:
    host.configure(upgrade_tag=False)
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).check_update(parse_image_ref(f"{NAME}:stable"))
    assert err.value.kind == "unsupported" and "bootc >= 1.15" in str(err.value)


async def test_check_update_of_a_missing_tag_is_image_missing(
    host: StandinHost, tmp_path: Path
) -> None:
    with pytest.raises(HostError) as err:
        await host.adapter(tmp_path).check_update(parse_image_ref(f"{NAME}:nope"))
    assert err.value.kind == "image-missing"
