"""On-disk validation on a real host: the config drift monitor's real inotify in the machine,
unit file states from the machine's systemd over D-Bus (GetUnitFileState), the force file in
the machine's own /run; and a node taken over from the machine-config-daemon in cluster mode,
against the repository's loopback API server (standins/kube) served from this process on
127.0.0.1 (the machine shares the host's network).

The same cases as tests/test_drift.py and tests/test_takeover.py on the simulated host. Each
detection latency (the change made in the machine, its `date +%s.%N` just before, to the
first 50 ms poll that sees the report) is printed, never asserted: only bounded waits are."""

from __future__ import annotations

import json
import os
import shlex
import stat
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agent.core.policy import FORCE_FILE, SSH_KEYS_PATH
from agent.model.mcd_disk import CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH, on_disk_config
from standins.demo.loopback import SA_RULES, SCOPED_SA_RULES
from standins.kube import FakeKube
from tests import secrets_canary as canary
from tests.scenarios.mcd_node import DIR_FIELDS, FILE_FIELDS, P, done_annotations, entry
from tests.system.machine import Machine, MachineError
from tests.system.registry import free_port
from tests.system.world import (
    AGENT_ENV,
    AGENT_STATE,
    AGENT_UNIT,
    DESIRED,
    KEY_A,
    KEY_B,
    Image,
    World,
)

DRIFT_WAIT = 15.0  # seconds for a drift to be reported, or to heal
POLL = 0.05
DEBUG_UNIT = "debug.service"
DEBUG_UNIT_TEXT = """\
[Unit]
Description=system tier: a debug service the config wants disabled

[Service]
Type=oneshot
ExecStart=/bin/true

[Install]
WantedBy=multi-user.target
"""
KEYS_DIR = SSH_KEYS_PATH.rsplit("/", 1)[0]
PREFIX = "unexpected on-disk state validating against {}: "
CONTENT = f'content mismatch for file "{SSH_KEYS_PATH}"'
MODE = (f'mode mismatch for file: "{SSH_KEYS_PATH}"; expected: -rw-------/384/0600; '
        "received: -rw-r--r--/420/0644")  # fmt: skip
UNIT = f'unit "{DEBUG_UNIT}" expected enabled=false, but systemd reports "enabled"'


def say(text: str) -> None:
    print(text, flush=True)


# The few helpers of scenarios.py these need, here: scenarios.py imports this module to
# register its scenarios.
def expect(ok: object, what: str) -> None:
    if not ok:
        raise MachineError(what)


def agent_status(m: Machine) -> dict:
    return m.read_json(f"{AGENT_STATE}/status.json") or {}


def rendered_config(w: World, image: Image, name: str, *, key: str = KEY_A,
                    units: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A rendered MachineConfig as World.set_desired builds one (image, core's key, the canary
    secrets), with `systemd.units` when given."""
    assert w.auth_registry is not None
    config: dict[str, Any] = {
        "ignition": {"version": "3.4.0"},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [key]}]},
        "storage": {"files": []},
    }
    if units:
        config["systemd"] = {"units": units}
    doc = {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": name},
        "spec": {"osImageURL": image.pinned, "config": config},
    }
    return canary.with_canary_secrets(doc, w.auth_registry.host)


def poll(predicate: Callable[[], Any], timeout: float, what: str) -> tuple[Any, float]:
    """(the first truthy value of `predicate`, the wall-clock time it was seen), polled every
    50 ms; MachineError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value, time.time()
        if time.monotonic() > deadline:
            raise MachineError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL)


def in_background(m: Machine, command: str) -> Callable[[], float]:
    """Run `command` in the machine while the caller polls; the returned call waits for it and
    gives the time its first output line says (`date +%s.%N` just before the change: the
    machine and the host share the clock)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = m.sh(command, timeout=30).stdout
        except MachineError as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def started_at() -> float:
        thread.join(35)
        if "error" in box:
            raise box["error"]
        return float(box["out"].split()[0])

    return started_at


def agent_process(m: Machine) -> tuple[str, str]:
    """(MainPID, NRestarts) of the agent's unit."""
    out = m.sh(f"systemctl show -p MainPID -p NRestarts {AGENT_UNIT}").stdout
    props = dict(line.split("=", 1) for line in out.split())
    return props.get("MainPID", ""), props.get("NRestarts", "")


def validation_ok(status: dict, against: str) -> bool:
    validation = status.get("validation") or {}
    return validation.get("ok") is True and validation.get("against") == against


# ---- config-drift (file mode) -------------------------------------------------------------

DRIFT_CONFIG = "rendered-worker-drift"


def _done_and_valid(m: Machine) -> dict | None:
    status = agent_status(m)
    ok = status.get("state") == "Done" and validation_ok(status, DRIFT_CONFIG)
    return status if ok else None


def _replace_key(text: str) -> str:
    """A shell command: the key file replaced as an editor saves it (a sibling with the same
    mode and owner written, then renamed over it), the time printed just before the rename."""
    path, tmp = shlex.quote(SSH_KEYS_PATH), shlex.quote(f"{KEYS_DIR}/.ignition.swp")
    return (f"cp -p {path} {tmp} && printf '%s\\n' {shlex.quote(text)} > {tmp} && "
            f"date +%s.%N && mv -f {tmp} {path}")  # fmt: skip


def _drift_case(m: Machine, what: str, change: str, finding: str) -> float:
    """Make `change` in the machine; until status.json is Degraded with `finding` as its one
    finding. Returns the seconds from the change to that status.json."""
    want = PREFIX.format(DRIFT_CONFIG) + finding

    def degraded() -> dict | None:
        status = agent_status(m)
        found = status.get("state") == "Degraded" and finding in str(status.get("reason"))
        return status if found else None

    started_at = in_background(m, change)
    status, seen = poll(degraded, DRIFT_WAIT, f"Degraded for {what}")
    latency = seen - started_at()
    expect(status["reason"] == want, f"{what}: reason {status['reason']!r}, wanted {want!r}")
    validation = status.get("validation") or {}
    texts = [f.get("text") for f in validation.get("findings") or []]
    expect(validation.get("ok") is False and validation.get("against") == DRIFT_CONFIG
           and texts == [finding], f"{what}: validation {validation}")  # fmt: skip
    expect(KEY_B not in status["reason"] and "AAAA" not in status["reason"],
           f"{what}: the reason shows file contents: {status['reason']}")  # fmt: skip
    return latency


def _healed(m: Machine, what: str, restore: str) -> float:
    """Put it right in the machine; until status.json is Done with a clean validation."""
    started = time.time()
    m.sh(restore, timeout=30)
    _, seen = poll(lambda: _done_and_valid(m), DRIFT_WAIT, f"Done again after {what}")
    return seen - started


def config_drift(w: World, m: Machine) -> None:
    """File mode, real inotify and systemd: core's key replaced as an editor saves it, then
    `systemctl enable` of a unit the config has disabled, then the key chmod 0644: each
    Degraded with the MCD's reason within 15 s and Done again when put right (the mode by
    touching the force file, which re-applies the key and is removed); no reboot, the agent
    process never restarted; detection latencies printed."""
    v1 = w.images["v1"]
    w.boot_into(m, v1)
    w.install_agent(m, v1)  # units, agent.env; desired.yaml replaced with the units' below
    m.write(f"/etc/systemd/system/{DEBUG_UNIT}", DEBUG_UNIT_TEXT)  # installed, not enabled
    units = [{"name": DEBUG_UNIT, "enabled": False}]
    doc = rendered_config(w, v1, DRIFT_CONFIG, units=units)
    m.write(DESIRED, json.dumps(doc, indent=1), mode=0o600)  # it holds secrets
    m.start()
    m.wait_booted(1)
    try:  # the first pass, then the one that validates what it left
        first, _ = poll(
            lambda: (s := _done_and_valid(m)) and v1.digest in str(s.get("currentImage")) and s,
            90, "Done on v1 with a clean validation in status.json",
        )  # fmt: skip
    except MachineError as exc:
        raise MachineError(f"{exc}; last agent status: {agent_status(m)}") from None
    keys = {"time", "against", "ok", "findings", "notes"}
    expect(keys <= set(first["validation"]), f"status.json validation: {first['validation']}")
    notes = first["validation"].get("notes") or []
    has_ostree = m.sh("command -v ostree", check=False).returncode == 0
    expect(has_ostree or any("/etc not compared with the image" in n for n in notes),
           f"no note that /etc was not compared, on a host with no ostree: {notes}")  # fmt: skip
    state = m.sh(f"systemctl is-enabled {DEBUG_UNIT}", check=False).stdout.strip()
    expect(state == "disabled", f"{DEBUG_UNIT} is {state!r} before the drift")
    process = agent_process(m)
    expect(process[0] not in ("", "0"), f"the agent is not running: {process}")
    latencies: dict[str, float] = {}
    heals: dict[str, float] = {}

    latencies["content"] = _drift_case(m, "the key's content", _replace_key(KEY_B), CONTENT)
    heals["content"] = _healed(m, "the key restored", _replace_key(KEY_A))
    expect((m.read(SSH_KEYS_PATH) or "") == KEY_A + "\n", "key A not back")

    latencies["unit"] = _drift_case(
        m, f"{DEBUG_UNIT} enabled", f"date +%s.%N && systemctl enable {DEBUG_UNIT} 2>&1", UNIT
    )
    heals["unit"] = _healed(m, f"{DEBUG_UNIT} disabled", f"systemctl disable {DEBUG_UNIT} 2>&1")

    key = shlex.quote(SSH_KEYS_PATH)
    latencies["mode"] = _drift_case(m, "the key's mode", f"date +%s.%N && chmod 0644 {key}", MODE)
    heals["mode"] = _healed(m, "the force file", f"touch {FORCE_FILE}")
    info = m.path(SSH_KEYS_PATH).stat()
    expect(stat.S_IMODE(info.st_mode) == 0o600, f"key mode {oct(info.st_mode)} after the force")
    expect((m.read(SSH_KEYS_PATH) or "") == KEY_A + "\n", "key A changed by the force file")
    # /run is the container's own tmpfs: ask inside the machine.
    poll(lambda: m.sh(f"test -e {FORCE_FILE}", check=False).returncode == 1, DRIFT_WAIT,
         f"{FORCE_FILE} removed")  # fmt: skip
    done = _done_and_valid(m)
    expect(done is not None, f"not Done after the force file: {agent_status(m)}")

    time.sleep(2)  # nothing follows behind our back
    expect(m.boots == 1 and len(m.boot_records()) == 1, f"the machine rebooted: boots={m.boots}")
    expect(agent_process(m) == (process[0], "0") and process[1] == "0",
           f"the agent restarted: {process} -> {agent_process(m)}")  # fmt: skip
    expect(_done_and_valid(m) is not None, f"not Done at the end: {agent_status(m)}")
    say("  config-drift: detection latency (change -> Degraded status.json) "
        + ", ".join(f"{k} {v:.3f}s" for k, v in latencies.items())
        + "; healed in " + ", ".join(f"{k} {v:.3f}s" for k, v in heals.items())
        + f"; notes: {notes}")  # fmt: skip


# ---- mcd-takeover (cluster mode) ------------------------------------------------------------

TAKEOVER_CONFIG = "rendered-worker-takeover"
SA_KUBECONFIG = "/etc/image-mode-agent/kubeconfig"
NODE_KUBECONFIG = "/var/lib/kubelet/kubeconfig"
SNAPSHOT_ROOTS = ("/etc", "/home", "/var/lib/kubelet")


def snapshot(m: Machine) -> dict[str, tuple]:
    """Every entry under SNAPSHOT_ROOTS of the machine's root (the roots too) as `entry`
    records it: type, mode and owner, and for a file or a link its size, inode, mtime, ctime
    and contents (sha256; a link's target). Equal snapshots: nothing there was written, moved
    or touched."""
    found: dict[str, tuple] = {}
    for top in SNAPSHOT_ROOTS:
        base = m.path(top)
        entries = [base]
        for folder, dirs, files in os.walk(base):
            entries += [Path(folder) / name for name in (*dirs, *files)]
        for path in entries:
            found["/" + str(path.relative_to(m.root))] = entry(path)
    return found


def _differences(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    out = [f"new: {p}" for p in sorted(after.keys() - before.keys())]
    out += [f"gone: {p}" for p in sorted(before.keys() - after.keys())]
    for path in sorted(before.keys() & after.keys()):
        if len(before[path]) != len(after[path]):
            out.append(f"changed type: {path}")
            continue
        fields = FILE_FIELDS if len(before[path]) == len(FILE_FIELDS) else DIR_FIELDS
        changed = [f for f, a, b in zip(fields, before[path], after[path], strict=True) if a != b]
        if changed:
            out.append(f"changed {'/'.join(changed)}: {path}")
    return out


def _write_owned(m: Machine, path: str, data: str | bytes, mode: int, uid: int = 0) -> None:
    target = m.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(target, mode)
    os.chown(target, uid, uid)


def _set_password_hash(m: Machine, user: str, password_hash: str) -> None:
    """/etc/shadow as the MCD leaves it after the config set `user`'s hash (in place: its
    mode and owner kept)."""
    shadow = m.path("/etc/shadow")
    lines = []
    for line in shadow.read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            fields[1] = password_hash
        lines.append(":".join(fields))
    shadow.write_text("\n".join(lines) + "\n")


def prepare_mcd_node(w: World, m: Machine, rendered: dict[str, Any]) -> None:
    """The machine as the MCD leaves a node after applying `rendered`
    (tests/scenarios/mcd_node.py): its on-disk config, the first boot's annotations file, core's
    key, the pull secret, the password hash."""
    assert w.auth_registry is not None
    name = rendered["metadata"]["name"]
    _write_owned(m, CURRENT_CONFIG_PATH, on_disk_config(rendered), 0o644)
    _write_owned(m, CURRENT_IMAGE_PATH, "", 0o644)  # not layered
    seeded = {P + "currentConfig": name, P + "desiredConfig": name,
              P + "firstPivotConfig": name, P + "state": "Done"}  # fmt: skip
    _write_owned(m, "/etc/machine-config-daemon/node-annotation.json.bak", json.dumps(seeded),
                 0o644)  # fmt: skip
    core = core_uid(m)
    for folder in ("/home/core/.ssh", KEYS_DIR):
        m.path(folder).mkdir(mode=0o700, exist_ok=True)
        os.chmod(m.path(folder), 0o700)
        os.chown(m.path(folder), core, core)
    _write_owned(m, SSH_KEYS_PATH, KEY_A + "\n", 0o600, uid=core)
    _write_owned(m, canary.PULL_SECRET_PATH, canary.pull_secret(w.auth_registry.host), 0o600)
    _set_password_hash(m, "core", canary.PASSWORD_HASH)


def core_uid(m: Machine) -> int:
    for line in (m.read("/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if fields[0] == "core":
            return int(fields[2])
    raise MachineError("no user core in the machine's /etc/passwd")


def _status(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
            return json.load(resp)
    except (OSError, ValueError):
        return {}


def _events(kube: FakeKube, reason: str) -> list[dict]:
    return [e for e in kube.list("events") if e.get("reason") == reason]


def mcd_takeover(w: World, m: Machine) -> None:
    """Cluster mode, the loopback API server on 127.0.0.1: a node as the MCD leaves it (its
    currentconfig and empty currentimage, the Node Done at that config) is taken over with
    no file written under /etc, /home or /var/lib/kubelet, no reboot and no Node patch;
    then the key chmod 0644 is Degraded (mode mismatch, ConfigDriftDetected) on the Node,
    and Done again when put back."""
    v1 = w.images["v1"]
    node = m.name
    kube = FakeKube(bookmark_interval=0.5).start_in_thread()
    expect(kube.running, "the loopback API server did not start")
    w.cleanups.append(kube.stop_in_thread)  # after the secrets check, which asks the agent
    kube.put(rendered_config(w, v1, TAKEOVER_CONFIG))
    rendered = kube.get("MachineConfig", TAKEOVER_CONFIG)
    kube.put({"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": node, "annotations": done_annotations(TAKEOVER_CONFIG)},
              "spec": {}})  # fmt: skip
    node_id = kube.node_identity(node)
    sa = kube.service_account("openshift-machine-config-operator", "machine-config-daemon",
                              [*SA_RULES, *SCOPED_SA_RULES])  # fmt: skip

    w.boot_into(m, v1)
    w.install_agent(m, v1)
    m.path(DESIRED).unlink()  # cluster mode: the Node says what is desired
    # Started by hand once booted: the snapshot is of the booted machine before the agent.
    m.path(f"/etc/systemd/system/multi-user.target.wants/{AGENT_UNIT}").unlink()
    prepare_mcd_node(w, m, rendered)
    m.write(SA_KUBECONFIG, yaml.safe_dump(kube.kubeconfig(sa), sort_keys=False), mode=0o600)
    m.write(NODE_KUBECONFIG, yaml.safe_dump(kube.kubeconfig(node_id), sort_keys=False),
            mode=0o600)  # fmt: skip
    port = free_port()
    args = (f"--source kube --host {w.host_mode} --listen 127.0.0.1:{port} "
            f"--kubeconfig {SA_KUBECONFIG} --node-kubeconfig {NODE_KUBECONFIG} "
            f"--node-name {node}")  # fmt: skip
    m.write(AGENT_ENV, f'IMAGE_MODE_AGENT_ARGS="{args}"\n')

    m.start()
    m.wait_booted(1)
    m.wait_system_up()
    state = m.sh(f"systemctl is-active {AGENT_UNIT}", check=False).stdout.strip()
    expect(state == "inactive", f"the agent ran before the snapshot: {state}")
    before = snapshot(m)
    patches = kube.count_requests(verb="patch", resource="nodes")
    started = time.monotonic()
    m.sh(f"systemctl start {AGENT_UNIT}")

    def annotations() -> dict[str, str]:
        return kube.get("Node", node)["metadata"].get("annotations") or {}

    def done() -> bool:
        a = annotations()
        return a.get(P + "state") == "Done" and a.get(P + "currentConfig") == TAKEOVER_CONFIG

    def taken_over() -> bool:
        checked = validation_ok(_status(port), TAKEOVER_CONFIG)
        return checked and done() and bool(_events(kube, "NodeDone"))

    try:
        poll(taken_over, 60, "validated, Done and a NodeDone event")
    except MachineError as exc:
        raise MachineError(
            f"{exc}; /status: {_status(port)}; Node: {annotations()}; events: "
            f"{[e['reason'] for e in kube.list('events')]}"
        ) from None
    took = time.monotonic() - started
    m.sh("journalctl --sync", check=False)
    messages = [str(e.get("MESSAGE", "")) for e in m.journal(f"_SYSTEMD_UNIT={AGENT_UNIT}")]
    expect(any("validated on-disk state" in t for t in messages),
           "no 'validated on-disk state' in the agent's journal")  # fmt: skip
    time.sleep(2)  # a late write would show
    changed = _differences(before, snapshot(m))
    expect(not changed, "the takeover wrote on the host: " + "; ".join(changed[:20]))
    expect(m.boots == 1 and len(m.boot_records()) == 1, f"the machine rebooted: boots={m.boots}")
    node_patches = kube.count_requests(verb="patch", resource="nodes") - patches
    expect(node_patches == 0, f"the agent patched the Node {node_patches} time(s) at takeover")
    reasons = {e["reason"] for e in kube.list("events")}
    expect(not {"OnDiskStateValidationFailed", "ConfigDriftDetected"} & reasons,
           f"drift reported at the takeover: {sorted(reasons)}")  # fmt: skip
    process = agent_process(m)
    # The agent's own state: its journal, and no copy of the config (the MCD's is read).
    state_dir = sorted(p.name for p in m.path(AGENT_STATE).iterdir())
    expect(state_dir == ["journal.json"], f"the agent's state dir holds {state_dir}")

    # A key's mode changed by hand: drift on the Node, with the MCD's reason and Event.
    want = PREFIX.format(TAKEOVER_CONFIG) + MODE

    def degraded() -> bool:
        a = annotations()
        return a.get(P + "state") == "Degraded" and a.get(P + "reason") == want

    started_at = in_background(m, f"date +%s.%N && chmod 0644 {shlex.quote(SSH_KEYS_PATH)}")
    try:
        _, seen = poll(degraded, DRIFT_WAIT, "the Node Degraded with the mode mismatch")
    except MachineError as exc:
        raise MachineError(f"{exc}; Node: {annotations()}") from None
    latency = seen - started_at()

    def drift_events() -> list[dict]:
        return [e for e in _events(kube, "ConfigDriftDetected") if e.get("message") == want]

    poll(drift_events, DRIFT_WAIT, "a ConfigDriftDetected Event with the reason")
    restored = time.time()
    m.sh(f"chmod 0600 {shlex.quote(SSH_KEYS_PATH)}")
    _, seen = poll(done, DRIFT_WAIT, "the Node Done again")
    heal = seen - restored
    poll(lambda: validation_ok(_status(port), TAKEOVER_CONFIG), DRIFT_WAIT, "/status clean")
    expect(m.boots == 1, f"the machine rebooted: boots={m.boots}")
    expect(agent_process(m) == process and process[1] == "0",
           f"the agent restarted: {process} -> {agent_process(m)}")  # fmt: skip
    events = drift_events()
    expect(len(events) == 1, f"{len(events)} ConfigDriftDetected Events for one finding")
    # No secret on the cluster side either: the Node, Events and MachineConfigNodes.
    emitted = [("Node", json.dumps(kube.get("Node", node)))]
    emitted += [(f"Event {e['reason']}", json.dumps(e)) for e in kube.list("events")]
    emitted += [("MachineConfigNode", json.dumps(o)) for o in kube.list("machineconfignodes")]
    shown = canary.scan(emitted)
    expect(not shown, "secrets check (API objects): " + canary.report(shown))
    say(
        f"  mcd-takeover: validated, Done and NodeDone {took:.2f}s after the start; detection "
        f"latency (chmod -> Node Degraded) {latency:.3f}s; healed in {heal:.3f}s; "
        f"node patches {kube.count_requests(verb='patch', resource='nodes')} (drift and heal); "
        f"state dir after the takeover: {state_dir}"
    )
