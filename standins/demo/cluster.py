"""`image-mode-agent demo` on an embedded loopback cluster: the machine-config-controller's
side is played by the loopback API server (standins/kube) and its drain-controller simulator;
the agent is the real process; the host is simulated. The timeline prints every change of the
MCO annotations on the Node object as the API server commits it."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from standins.demo.loopback import Cluster, P

SHOWN = ("state", "desiredConfig", "currentConfig", "desiredImage", "currentImage",
         "desiredDrain", "lastAppliedDrain", "post-config-action", "reason")  # fmt: skip


class DemoFailed(Exception):
    pass


class ClusterDemo:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.started = time.monotonic()
        self.last: dict[str, str] = {}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise DemoFailed(what)

    def on_change(self, change: Any) -> None:
        if change.rt.plural != "nodes" or change.obj is None:
            return
        prefix = "machineconfiguration.openshift.io/"
        annotations = change.obj["metadata"].get("annotations") or {}
        now = {k: annotations.get(prefix + k, "") for k in SHOWN}
        cordon = "cordoned" if change.obj.get("spec", {}).get("unschedulable") else "schedulable"
        now["node"] = cordon
        diff = {k: v for k, v in now.items() if self.last.get(k, "") != v}
        self.last = now
        if diff:
            text = ", ".join(f"{k}={v[:90]!r}" if k == "reason" else f"{k}={v or '(none)'}"
                             for k, v in diff.items())  # fmt: skip
            self.say(f"  Node: {text}")

    async def until_settled(self, cluster: Any, done: Any) -> None:
        """Run the agent again after every (simulated) reboot, as the host's systemd would."""
        for _ in range(6):
            proc = cluster.procs[-1]
            waiter = asyncio.create_task(done())
            exited = asyncio.create_task(proc.wait())
            finished, _ = await asyncio.wait({waiter, exited}, timeout=60,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if waiter in finished:
                exited.cancel()
                await waiter
                return
            waiter.cancel()
            if exited not in finished or proc.returncode != 3:
                raise DemoFailed(f"agent exited {proc.returncode} unexpectedly")
            self.say("agent: exit 3 - the host reboots; systemd starts the agent again")
            await cluster.start_agent()
        raise DemoFailed("did not settle")

    async def main(self) -> None:
        cluster = await Cluster.create(self.base)
        try:
            cluster.kube.add_hook(self.on_change)
            cluster.kube.enable_drain_controller(delay=0.3)
            self.say(f"loopback API server at {cluster.kube.url}; node {cluster.node}; "
                     f"simulated host in {cluster.sim.base}")  # fmt: skip
            self.say(f"booted {cluster.images['v1']}")
            await cluster.start_agent()
            await cluster.wait_done("rendered-worker-1")
            await asyncio.sleep(0.5)

            print("\n== 1. SSH-key rotation: applied live, no drain, no reboot")
            cluster.add_config("rendered-worker-2", "v1", keys=["ssh-ed25519 AAAA-two"])
            self.say("controller: desiredConfig=rendered-worker-2 (only core's SSH key changed)")
            cluster.set_desired("rendered-worker-2")
            annotations = await cluster.wait_done("rendered-worker-2")
            self.expect(cluster.reboots() == 0, "the SSH-key rotation rebooted")
            self.expect(P + "desiredDrain" not in annotations, "the SSH-key rotation drained")
            self.say("Done: no drain, no reboot")

            print("\n== 2. Image update: staged, drained, rebooted, verified, committed")
            v2 = cluster.images["v2"]
            cluster.add_config("rendered-worker-3", "v2", keys=["ssh-ed25519 AAAA-two"])
            self.say(f"controller: desiredConfig=rendered-worker-3, desiredImage={v2}")
            cluster.set_desired("rendered-worker-3", **{P + "desiredImage": v2})
            await self.until_settled(cluster, lambda: cluster.wait_done("rendered-worker-3", 60))
            self.expect(cluster.booted() == v2.split("@")[1], "the host does not run v2")
            self.expect(cluster.reboots() == 1, "expected exactly one reboot")
            self.say("Done on the new image: exactly 1 reboot")

            print("\n== 3. A bad image: its required health check fails; rolled back by itself")
            bad = cluster.images["bad"]
            cluster.add_config("rendered-worker-4", "bad", keys=["ssh-ed25519 AAAA-two"])
            self.say(f"controller: desiredConfig=rendered-worker-4, desiredImage={bad}")
            cluster.set_desired("rendered-worker-4", **{P + "desiredImage": bad})

            async def degraded() -> None:
                await cluster.wait_annotations(lambda a: a.get(P + "state") == "Degraded"
                                               and a.get(P + "reason"), timeout=60)  # fmt: skip

            await self.until_settled(cluster, degraded)
            await asyncio.sleep(0.5)
            self.expect(cluster.booted() == v2.split("@")[1], "the host was not rolled back")
            self.expect(cluster.reboots() == 3, "expected 3 reboots in all")
            reason = cluster.annotations()[P + "reason"]
            self.expect("required health check failed" in reason, "no cause in the reason")
            self.say(f"Degraded, back on v2; reason: {reason}")
            print(f"\ndemo passed: {cluster.reboots()} reboots in all, each one needed")
        finally:
            await cluster.close()


def run_cluster_demo(base: Path) -> int:
    try:
        asyncio.run(ClusterDemo(base).main())
        return 0
    except (DemoFailed, TimeoutError) as exc:
        print(f"\ndemo FAILED: {exc}", file=sys.stderr)
        return 1
