"""`image-mode-agent demo`: a timeline on a throwaway simulated host.

Each agent run is its own process, as on a machine: a reboot ends it (exit 3) and the next
start finds the host booted. Every printed step is checked; the demo fails if one did not
happen as printed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from standins.host.simulated import SimulatedHost

IMAGE = "quay.example/os/node"
CHECK = """#!/bin/sh
# Admin health check: the demo app that the image ships must report healthy.
state=$(cat "$IMAGE_MODE_AGENT_ROOT/usr/lib/demo-app/healthy" 2>/dev/null)
[ "$state" = yes ] || { echo "demo-app is not healthy (healthy=${state:-missing})"; exit 1; }
"""


class DemoFailed(Exception):
    pass


class Demo:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.sim_dir = base / "host"
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise DemoFailed(what)

    def agent(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agent", "--log-level", "warning", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    def config(self, name: str, image: str, key: str) -> Path:
        doc = {
            "apiVersion": "machineconfiguration.openshift.io/v1",
            "kind": "MachineConfig",
            "metadata": {"name": name},
            "spec": {
                "osImageURL": image,
                "config": {
                    "ignition": {"version": "3.4.0"},
                    "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": [key]}]},
                },
            },
        }
        path = self.base / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1))
        return path

    def run_until_settled(self, desired: Path) -> tuple[int, list[str]]:
        """Start the agent, and again after each reboot, as systemd would; returns the last
        exit code and what happened."""
        notes = []
        for _ in range(6):
            done = self.agent("run", "--source", f"file:{desired}", "--host",
                              f"simulated:{self.sim_dir}", "--once", "--listen", "")  # fmt: skip
            if done.returncode != 3:
                if done.stderr.strip():
                    notes.append(done.stderr.strip().splitlines()[-1])
                return done.returncode, notes
            status = json.loads(
                (self.sim_dir / "root/var/lib/image-mode-agent/status.json").read_text()
            )
            self.say(f"agent: {status['reason']} (exit 3: the host reboots)")
            boot = [a for a in self.sim.actions() if a["kind"] == "boot"]
            SimulatedHost(self.sim_dir).boot()
            boot = [a for a in self.sim.actions() if a["kind"] == "boot"][len(boot) :]
            for entry in boot:
                self.say(f"host: {entry['detail']}")
        raise DemoFailed("the agent did not settle after 6 starts")

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted_digest(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    def main(self) -> None:
        self.sim = SimulatedHost.create(
            self.sim_dir, f"{IMAGE}:v1", {"usr/lib/demo-app/healthy": "yes"}
        )
        v1 = f"{IMAGE}@{self.booted_digest()}"
        check = self.sim.root / "etc/image-mode-agent/check/required.d/50-demo-app"
        check.parent.mkdir(parents=True)
        check.write_text(CHECK)
        check.chmod(0o755)
        v2 = self.sim.add_image(f"{IMAGE}:v2", {"usr/lib/demo-app/healthy": "yes"})
        v3 = self.sim.add_image(f"{IMAGE}:v3", {"usr/lib/demo-app/healthy": "no"})
        self.say(f"simulated host in {self.sim_dir}, booted {v1}")
        self.say(f"registry: v2 = {v2}")
        self.say(f"registry: v3 = {v3} (its demo app is broken)")
        self.say("admin check: etc/image-mode-agent/check/required.d/50-demo-app")

        print("\n== 1. SSH-key rotation, applied live")
        first = self.config("rendered-worker-1", v1, "ssh-ed25519 AAAAC3Nza-alice alice@example")
        code, _ = self.run_until_settled(first)
        self.expect(code == 0, "first start did not reach Done")
        self.say("agent: first start: rendered-worker-1 recorded as current (Done)")
        second = self.config("rendered-worker-2", v1, "ssh-ed25519 AAAAC3Nza-bob bob@example")
        plan = self.agent("plan", "--current", str(first), "--desired", str(second))
        self.say("plan: " + plan.stdout.splitlines()[0])
        before = self.reboots()
        code, _ = self.run_until_settled(second)
        keys = (self.sim.root / "home/core/.ssh/authorized_keys.d/ignition").read_text()
        self.expect(code == 0 and "bob@example" in keys, "the SSH key was not rotated")
        self.expect(self.reboots() == before, "the SSH-key rotation rebooted the host")
        self.say(f"agent: Done with no reboot; authorized_keys now holds {keys.split()[-1]}")

        print("\n== 2. Image update: staged, rebooted into, verified, committed")
        third = self.config("rendered-worker-3", v2, "ssh-ed25519 AAAAC3Nza-bob bob@example")
        plan = self.agent("plan", "--current", str(second), "--desired", str(third))
        self.say("plan: " + plan.stdout.splitlines()[0])
        before = self.reboots()
        code, _ = self.run_until_settled(third)
        self.expect(code == 0, "the image update did not reach Done")
        self.expect(self.booted_digest() == v2.split("@")[1], "the host does not run v2")
        self.expect(self.reboots() == before + 1, "the image update did not take exactly 1 reboot")
        self.say(f"agent: verified and committed; booted {v2}; reboots: exactly 1")

        print("\n== 3. A bad image: its required check fails, rolled back automatically")
        fourth = self.config("rendered-worker-4", v3, "ssh-ed25519 AAAAC3Nza-bob bob@example")
        before = self.reboots()
        code, notes = self.run_until_settled(fourth)
        self.expect(code == 4, "the bad image did not end Degraded")
        self.expect(self.booted_digest() == v2.split("@")[1], "the host was not rolled back to v2")
        self.expect(self.reboots() == before + 2, "expected 2 reboots (into v3, back to v2)")
        self.say(f"agent: {notes[-1] if notes else 'Degraded'} (exit 4)")
        code, _ = self.run_until_settled(fourth)
        self.expect(code == 4 and self.reboots() == before + 2, "the failed image was retried")
        self.say("agent started again: still Degraded, v3 is not staged again until the desired")
        self.say("state changes; the host keeps running v2")
        print(f"\ndemo passed: {self.reboots()} reboots in all, each one needed")


def run_demo(keep: bool = False, file_mode: bool = False) -> int:
    """The cluster timeline on the embedded loopback API server, or (`--file-mode`) the
    file-mode timeline on the simulated host alone."""
    from standins.demo.cluster import run_cluster_demo

    base = Path(tempfile.mkdtemp(prefix="image-mode-agent-demo-"))
    demo = Demo(base)
    try:
        if not file_mode:
            return run_cluster_demo(base)
        demo.main()
        return 0
    except (DemoFailed, subprocess.TimeoutExpired) as exc:
        print(f"\ndemo FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f"(kept {base})")
        else:
            shutil.rmtree(base, ignore_errors=True)
