"""Driving the engine against a simulated host, one "process life" at a time."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.desired import Desired
from agent.core.policy import Allowlist
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import machine_config_from_object
from agent.update.engine import REBOOTING, Engine, Hooks, Outcome
from standins.demo.loopback import IMAGE, make_host
from standins.host.simulated import SimulatedHost
from tests.builders import machine_config


class Killed(BaseException):
    """The process died here (raised from a checkpoint; nothing in memory survives)."""


@dataclass
class World:
    base: Path
    sim: SimulatedHost
    images: dict[str, str] = field(default_factory=dict)
    check_timeout: float = 30.0  # each health check's
    events: deque[str] = field(default_factory=lambda: deque(maxlen=200))  # across lives

    @classmethod
    def create(cls, base: Path) -> World:
        sim, images = make_host(base)
        images["bad-check"] = images.pop("bad")
        images["no-boot"] = sim.add_image(f"{IMAGE}:v4", {}, boot_fails=True)
        world = cls(base, sim, images)
        return world

    def desired(self, name: str, image: str, **kwargs) -> Desired:
        doc = machine_config(name=name, image=self.images.get(image, image), **kwargs)
        data = json.dumps(doc).encode()
        config = machine_config_from_object(doc)
        return Desired(config, data, parse_image_ref(config.os_image_url))

    def engine(self, checkpoint=None, **kwargs) -> Engine:
        self.sim.boot()  # a new process life starts after any pending reboot
        hooks = Hooks(checkpoint=checkpoint or (lambda label: None), events=self.events)
        host = self.sim.host(Allowlist().allows, check_timeout=self.check_timeout)
        return Engine(host, hooks=hooks, **kwargs)

    async def converge(self, desired: Desired, checkpoint=None, lives: int = 12, **kw) -> Outcome:
        """Start the agent again after every reboot or kill, until it settles."""
        for _ in range(lives):
            try:
                outcome = await self.engine(checkpoint, **kw).reconcile(desired)
            except Killed:
                continue
            if outcome.state != REBOOTING:
                return outcome
        raise AssertionError("did not settle")

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    def digest(self, name: str) -> str:
        return self.images[name].split("@")[1]

    def read(self, path: str) -> bytes | None:
        target = self.sim.root / path.lstrip("/")
        return target.read_bytes() if target.exists() else None
