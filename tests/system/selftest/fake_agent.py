"""A deliberately tiny fake of the agent's host-service contract, for the harness's own
self-test only (`IMA_SYSTEM_AGENT_UNITS=tests/system/selftest`). It proves the scenarios are
passable and the harness's reboot loop, kills, masks and checks work; it proves nothing about the
agent. Runs on the container's python with Debian's python3-systemd.

Contract it fakes: desired MachineConfig at /etc/image-mode-agent/desired.yaml (JSON is YAML),
status.json {state, reason, currentConfig, currentImage} and journal.json {phase, ...} in
/var/lib/image-mode-agent, `bootc switch` then a reboot, a verify step before
boot-complete.target that rolls back when a required check fails."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

from systemd import journal  # type: ignore[import-not-found]

STATE = "/var/lib/image-mode-agent"
KEYS = "/home/core/.ssh/authorized_keys.d/ignition"


def load_journal() -> dict:
    try:
        with open(f"{STATE}/journal.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"phase": "idle"}


def atomic_json(path: str, doc: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.rename(path + ".tmp", path)


def report(state: str, reason: str, config: str, image: str | None) -> None:
    doc = {"state": state, "reason": reason, "currentConfig": config, "currentImage": image}
    atomic_json(f"{STATE}/status.json", doc)
    journal.send(f"reconciled: {state}", STATE=state, REASON=reason)


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def booted() -> str:
    out = subprocess.run(["bootc", "status", "--format", "json"], capture_output=True, text=True)
    return json.loads(out.stdout)["status"]["booted"]["image"]["imageDigest"]


def reboot() -> None:
    subprocess.run(["systemctl", "reboot", "--no-block"], check=False)


def verify() -> None:
    record = load_journal()
    if record["phase"] != "rebooting" or record["boot"] == boot_id():
        return
    failed = []
    for check in sorted(glob.glob("/etc/image-mode-agent/check/required.d/*")):
        run = subprocess.run([check], capture_output=True, text=True)
        if run.returncode:
            failed.append(f"{os.path.basename(check)}: {run.stdout.strip()}")
    if booted() == record["target"].split("@")[1] and not failed:
        atomic_json(f"{STATE}/journal.json", {**record, "phase": "idle"})
        return
    record["failed"] = [*record.get("failed", []), record["target"]]
    record.update(phase="rollback-rebooting", cause="; ".join(failed), boot=boot_id())
    atomic_json(f"{STATE}/journal.json", record)
    subprocess.run(["bootc", "rollback"], check=True)
    reboot()
    time.sleep(60)


def run() -> None:
    os.makedirs(STATE, exist_ok=True)
    subprocess.run(["systemctl", "mask", "bootc-fetch-apply-updates.timer"], check=False)
    while True:
        time.sleep(1)
        record = load_journal()
        with open("/etc/image-mode-agent/desired.yaml") as f:
            doc = json.load(f)
        name, url = doc["metadata"]["name"], doc["spec"]["osImageURL"]
        keys = doc["spec"]["config"]["passwd"]["users"][0]["sshAuthorizedKeys"]
        os.makedirs(os.path.dirname(KEYS), exist_ok=True)
        with open(KEYS + ".tmp", "w") as f:
            f.write("\n".join(keys) + "\n")
        os.chmod(KEYS + ".tmp", 0o600)
        os.chown(KEYS + ".tmp", 1000, 1000)
        os.rename(KEYS + ".tmp", KEYS)
        if record["phase"] == "rollback-rebooting":
            if record["boot"] != boot_id():
                report("Degraded", "rolled back: " + record["cause"], name, booted())
            continue
        if record["phase"] == "rebooting" and record["boot"] == boot_id():
            reboot()  # journaled but the reboot never happened (killed, or held back)
            continue
        if url in record.get("failed", []):
            report("Degraded", f"{url} was rolled back", name, booted())
        elif booted() != url.split("@")[1]:
            switch = subprocess.run(["bootc", "switch", url], capture_output=True, text=True)
            if switch.returncode:
                report("Degraded", switch.stderr.strip(), name, booted())
                continue
            atomic_json(f"{STATE}/journal.json", {"phase": "rebooting", "boot": boot_id(),
                                                  "target": url})  # fmt: skip
            reboot()
        else:
            report("Done", "", name, url)


if __name__ == "__main__":
    verify() if sys.argv[1:] == ["verify"] else run()
