"""The command line as a user runs it: `plan` contract, `run` exit codes, file watching, a
SIGKILL mid-update, `sim`, `demo`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.builders import IMAGE_A, IMAGE_B, dump, ign_file, machine_config

SSH = "home/core/.ssh/authorized_keys.d/ignition"


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--log-level", "warning", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def write(path: Path, doc: dict) -> Path:
    path.write_bytes(dump(doc))
    return path


# -- plan -----------------------------------------------------------------------------------
def test_plan_json_contract(tmp_path: Path) -> None:
    cur = write(tmp_path / "cur.json", machine_config(keys=["a"]))
    des = write(tmp_path / "des.json", machine_config(keys=["b"], image=IMAGE_B))
    done = agent("plan", "--current", str(cur), "--desired", str(des), "--output", "json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["verdict"] == "image"
    assert (body["reboot"], body["drain"], body["target_image"]) == (True, True, IMAGE_B)
    assert body["live"] == [
        {"path": "/home/core/.ssh/authorized_keys.d/ignition", "action": "write", "then": []}
    ]
    assert body["image_changes"] == ["osImageURL"]
    assert isinstance(body["reasons"], list) and body["reasons"]


def test_plan_image_flags(tmp_path: Path) -> None:
    cur = write(tmp_path / "cur.json", machine_config(image=None))
    des = write(tmp_path / "des.json", machine_config(image=None, files=[ign_file("/etc/x")]))
    base = ["plan", "--current", str(cur), "--desired", str(des), "--output", "json"]
    refused = json.loads(agent(*base).stdout)
    assert refused["verdict"] == "refused" and refused["target_image"] is None
    assert any("need an image build" in r for r in refused["reasons"])
    image = json.loads(agent(*base, "--booted-image", IMAGE_A, "--desired-image", IMAGE_B).stdout)
    assert (image["verdict"], image["image_changes"]) == ("image", ["osImageURL", "files"])
    same = json.loads(agent(*base, "--booted-image", IMAGE_A, "--desired-image", IMAGE_A).stdout)
    assert same["verdict"] == "refused"


def test_plan_refused_exits_zero(tmp_path: Path) -> None:
    cur = write(tmp_path / "cur.json", machine_config())
    des = write(tmp_path / "des.json", machine_config(fips=True))
    done = agent("plan", "--current", str(cur), "--desired", str(des), "--output", "json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["verdict"] == "refused"


def test_plan_text_output(tmp_path: Path) -> None:
    cur = write(tmp_path / "cur.json", machine_config(keys=["a"]))
    des = write(tmp_path / "des.json", machine_config(keys=["b"]))
    done = agent("plan", "--current", str(cur), "--desired", str(des))
    assert done.stdout.splitlines()[0] == "verdict: live (no reboot, no drain)"
    assert "  write /home/core/.ssh/authorized_keys.d/ignition" in done.stdout


BAD = [
    (b"key: [unclosed", "invalid YAML at line 2"),
    (b"kind: Pod\n", "kind: not a MachineConfig (kind 'Pod')"),
    (dump(machine_config(files=[{"path": "/a", "contents": {"source": "data:;base64,@@"}}])),
     "spec.config.storage.files[0].contents.source: malformed data URL: invalid base64"),
    (dump(machine_config(files=[{"path": "/a", "contents": {"source": "data:,x",
     "compression": "gzip"}}])), "spec.config.storage.files[0].contents.source: invalid gzip"),
    (json.dumps({"kind": "MachineConfig", "spec": {"config": "{oops"}}).encode(),
     "spec.config: invalid Ignition JSON"),
    (dump(machine_config(image="not an image")), "spec.osImageURL: image reference"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), BAD)
@pytest.mark.parametrize("which", ["current", "desired"])
def test_plan_bad_input_exits_2(tmp_path: Path, data: bytes, message: str, which: str) -> None:
    good = write(tmp_path / "good.json", machine_config())
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(data)
    files = {"current": good, "desired": good, which: bad}
    done = agent("plan", "--current", str(files["current"]), "--desired", str(files["desired"]))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(bad) in lines[0] and message in lines[0]


def test_plan_missing_file_and_bad_flag(tmp_path: Path) -> None:
    good = write(tmp_path / "good.json", machine_config())
    done = agent("plan", "--current", str(tmp_path / "nope"), "--desired", str(good))
    assert done.returncode == 2 and "nope" in done.stderr and "No such file" in done.stderr
    done = agent("plan", "--current", str(good), "--desired", str(good), "--desired-image", "x")
    assert done.returncode == 2 and "--desired-image" in done.stderr and done.stdout == ""


# -- run against a simulated host -----------------------------------------------------------
@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    sim = tmp_path / "host"
    assert agent("sim", "create", str(sim), "--image", "quay.example/os/node:v1").returncode == 0
    booted = json.loads((sim / "host.json").read_text())["booted"]["digest"]
    images = {"v1": f"quay.example/os/node@{booted}"}
    images["v2"] = agent("sim", "add-image", str(sim), "quay.example/os/node:v2").stdout.strip()
    images["slow"] = agent(
        "sim", "add-image", str(sim), "quay.example/os/node:slow", "--pull-seconds", "3"
    ).stdout.strip()
    return sim, images


def run_once(sim: Path, desired: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return agent("run", "--source", f"file:{desired}", "--host", f"simulated:{sim}", "--once",
                 "--listen", "", *extra)  # fmt: skip


def lines_starting(text: str, prefix: str) -> list[str]:
    """The lines of `text` a test means, whatever else (a warning) was printed around them."""
    return [line for line in text.splitlines() if line.startswith(prefix)]


def reboots(sim: Path) -> int:
    return sum(
        '"kind": "reboot"' in line for line in (sim / "actions.log").read_text().splitlines()
    )


def test_run_once_exit_codes(tmp_path: Path, host) -> None:
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k1"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    write(desired, machine_config(name="r2", keys=["k2"], image=images["v2"]))
    assert run_once(sim, desired).returncode == 3  # stopped for the reboot
    assert run_once(sim, desired).returncode == 0  # booted, verified, committed
    status = json.loads((sim / "root/var/lib/image-mode-agent/status.json").read_text())
    assert (status["state"], status["currentConfig"]) == ("Done", "r2")
    write(desired, machine_config(name="r3", files=[ign_file("/etc/motd")], image=images["v2"]))
    done = run_once(sim, desired)
    assert done.returncode == 4
    [refused] = lines_starting(done.stderr, "Unreconcilable: ")
    assert "need an image build" in refused


def test_dry_run_prints_plan_and_changes_nothing(tmp_path: Path, host) -> None:
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k1"], image=images["v2"]))
    before = {p: p.stat().st_mtime_ns for p in sim.rglob("*")}
    done = run_once(sim, desired, "--dry-run")
    assert done.returncode == 0
    assert done.stdout.startswith("verdict: image (reboot, drain)")
    assert {p: p.stat().st_mtime_ns for p in sim.rglob("*")} == before


def test_run_notices_file_changes(tmp_path: Path, host) -> None:
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["first"], image=images["v1"]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", f"simulated:{sim}", "--poll-interval", "0.1",
         "--listen", ""],
    )  # fmt: skip
    try:
        for expected in (b"first\n", b"second\n"):
            if expected == b"second\n":
                write(desired, machine_config(name="r2", keys=["second"], image=images["v1"]))
            deadline = time.monotonic() + 20
            while (sim / "root" / SSH).exists() is False or (
                (sim / "root" / SSH).read_bytes() != expected
            ):
                assert time.monotonic() < deadline, f"never saw {expected!r}"
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert reboots(sim) == 0


def test_sigkill_while_staging_then_converges(tmp_path: Path, host) -> None:
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    write(desired, machine_config(name="r2", keys=["k"], image=images["slow"]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", f"simulated:{sim}", "--once", "--listen", ""],
    )  # fmt: skip
    journal = sim / "root/var/lib/image-mode-agent/journal.json"
    deadline = time.monotonic() + 20
    while not (journal.exists() and json.loads(journal.read_text())["phase"] == "staging"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    codes = [run_once(sim, desired).returncode for _ in range(2)]
    assert codes == [3, 0]
    assert reboots(sim) == 1
    assert json.loads((sim / "host.json").read_text())["booted"]["digest"] in images["slow"]


def test_sim_usage_errors(tmp_path: Path) -> None:
    done = agent("sim", "create", str(tmp_path / "h"), "--image", "no-registry")
    assert done.returncode == 2 and "expected registry" in done.stderr
    done = agent("run", "--source", "file:/x", "--host", "bogus")
    assert done.returncode == 2 and "unknown host 'bogus'" in done.stderr
    done = agent("run", "--source", "http://x", "--host", f"simulated:{tmp_path}")
    assert done.returncode == 2 and "unknown source" in done.stderr


def test_demo_runs_on_the_loopback_cluster() -> None:
    done = agent("demo", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "== 1. SSH-key rotation: applied live, no drain, no reboot",
        "Node: desiredDrain=drain-rendered-worker-3",
        "Node: lastAppliedDrain=uncordon-rendered-worker-3",
        "Done on the new image: exactly 1 reboot",
        "required health check failed",
        "demo passed: 3 reboots in all",
    ):
        assert line in done.stdout


def test_demo_file_mode_runs_and_passes() -> None:
    done = agent("demo", "--file-mode", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for line in (
        "== 1. SSH-key rotation, applied live",
        "agent: Done with no reboot",
        "reboots: exactly 1",
        "required health check failed",
        "still Degraded, v3 is not staged again",
        "demo passed: 3 reboots in all",
    ):
        assert line in done.stdout


def test_run_tells_systemd_ready_and_pets_the_watchdog(tmp_path: Path, host) -> None:
    import socket as sock

    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k"], image=images["v1"]))
    listener = sock.socket(sock.AF_UNIX, sock.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    listener.settimeout(20)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", f"simulated:{sim}", "--listen", ""],
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "400000"},
    )  # fmt: skip
    try:
        messages = [listener.recv(4096).decode() for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        listener.close()
    assert messages[0].startswith("READY=1")
    assert messages[1:] == ["WATCHDOG=1", "WATCHDOG=1"]


def test_run_policy_makes_ndp_paths_live_in_file_mode(tmp_path: Path, host) -> None:
    """`run --policy FILE`: the MachineConfiguration's NodeDisruptionPolicy status extends the
    live allowlist as in cluster mode (here: the signature policy, written with no reboot);
    an unusable policy file is Degraded naming its field, and `--once` exits 2."""
    sim, images = host
    policy_json = ign_file("/etc/containers/policy.json", '{"default": [{"type": "reject"}]}')
    desired = write(tmp_path / "mc.json", machine_config(keys=["k1"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    write(desired, machine_config(name="r2", keys=["k1"], image=images["v1"],
                                  files=[policy_json]))  # fmt: skip
    assert run_once(sim, desired).returncode == 4  # image content without --policy
    ndp = {
        "apiVersion": "operator.openshift.io/v1",
        "kind": "MachineConfiguration",
        "metadata": {"name": "cluster"},
        "status": {"nodeDisruptionPolicyStatus": {"clusterPolicies": {"files": [
            {"path": "/etc/containers/policy.json", "actions": [{"type": "None"}]}]}}},
    }  # fmt: skip
    policy = write(tmp_path / "machineconfiguration.json", ndp)
    assert run_once(sim, desired, "--policy", str(policy)).returncode == 0
    assert (sim / "root/etc/containers/policy.json").read_text().startswith('{"default"')
    assert reboots(sim) == 0
    ndp["status"]["nodeDisruptionPolicyStatus"]["clusterPolicies"]["files"][0]["path"] = "x"
    write(policy, ndp)
    done = run_once(sim, desired, "--policy", str(policy))
    assert done.returncode == 2
    assert str(policy) in done.stderr and "clusterPolicies.files[0].path" in done.stderr


def test_sim_images_signed_by_a_key_and_the_policy_that_asks(tmp_path: Path, host) -> None:
    """`sim add-image --signed-by`: with the host's policy.json demanding that key, `run`
    refuses the unsigned image at staging (exit 4, nothing staged, no reboot) and updates to
    the signed one."""
    sim, images = host
    key = "/etc/pki/containers/os.gpg"
    signed = agent("sim", "add-image", str(sim), "quay.example/os/node:signed",
                   "--signed-by", key).stdout.strip()  # fmt: skip
    (sim / "root/etc/containers").mkdir(parents=True)
    (sim / "root/etc/containers/policy.json").write_text(json.dumps({
        "default": [{"type": "reject"}],
        "transports": {"docker": {"quay.example/os/node": [
            {"type": "signedBy", "keyType": "GPGKeys", "keyPath": key}]}},
    }))  # fmt: skip
    desired = write(tmp_path / "mc.json", machine_config(keys=["k1"], image=images["v1"]))
    assert run_once(sim, desired).returncode == 0
    write(desired, machine_config(name="r2", keys=["k1"], image=images["v2"]))
    done = run_once(sim, desired)
    assert done.returncode == 4
    assert "refused by the signature policy" in done.stderr and "no signature exists" in done.stderr
    assert json.loads((sim / "host.json").read_text())["staged"] is None
    write(desired, machine_config(name="r3", keys=["k1"], image=signed))
    assert run_once(sim, desired).returncode == 3
    assert run_once(sim, desired).returncode == 0
    assert reboots(sim) == 1


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [("--prestage-slots", "0", "expected auto, unbounded or a number >= 1, got '0'"),
     ("--prestage-slots", "some", "expected auto, unbounded or a number >= 1"),
     ("--prestage-lease-seconds", "2", "expected whole seconds >= 3, got '2'"),
     ("--prestage-lease-seconds", "1.5", "expected whole seconds >= 3")],
)  # fmt: skip
def test_prestage_bound_flags_refuse_bad_values(flag: str, value: str, words: str) -> None:
    done = agent("run", "--source", "kube", "--host", "simulated:/nonexistent", flag, value)
    assert done.returncode == 2 and flag in done.stderr and words in done.stderr


def test_run_help_says_what_each_mode_does_with_its_prestage() -> None:
    """`run --help` states the pre-pull bound truthfully for both modes: bounded lanes by
    default (a pool's maxUnavailable; 1 on a NodePool, whose maxUnavailable a node cannot read),
    and the jitter only where there is no bound (unbounded, or refused by RBAC)."""
    done = agent("run", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())  # argparse wraps the help text
    assert "through Lease lanes in the order the controller (the upgrader) picks the Nodes" in text
    assert "auto (default) = the pool's maxUnavailable; with --source hypershift 1" in text
    jitter = (
        "unbounded pre-pulls only (--prestage-slots unbounded, or, in either mode, the "
        "fallback when RBAC refuses the lanes, said by a PrestageUnbounded Event)"
    )
    assert jitter in text
    assert "with --prestage-slots unbounded only" not in text  # what it said before: untrue
    assert "with --source hypershift they are in the upgrade namespace" in text
