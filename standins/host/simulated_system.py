"""The simulated system: a simulated host's boot ID, unit actions and reboot requests.

A unit action is only logged (actions.log); a reboot request marks the host, and the reboot
happens when `SimulatedHost.boot()` runs, as the next agent process starts."""

from __future__ import annotations

from agent.errors import HostError
from agent.host.durable import write_json
from standins.host.state import HostState
from standins.host.unit_files import unit_file_state


class SimulatedSystem:
    """The `system` port of a simulated host: its boot ID, units and reboot requests."""

    def __init__(self, sim: HostState) -> None:
        self.sim = sim

    async def boot_id(self) -> str:
        return str(self.sim._state()["boot_id"])

    async def soft_reboots_count(self) -> int:
        return int(self.sim._state().get("soft_reboots", 0))

    async def perform(self, action: str) -> None:
        self.sim.log_action("unit", action)

    async def unit_file_state(self, name: str) -> str:
        return unit_file_state(self.sim.root, name)

    async def reboot(self, *, soft: bool = False) -> None:
        state = self.sim._state()
        if state.get("reboot_fails"):
            self.sim.log_action("reboot-refused", "soft-reboot" if soft else "reboot")
            # What agent/host/systemd.py raises for a D-Bus error reply (a DBusCallError).
            raise HostError(
                "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired: Interactive "
                "authentication required.",
                kind="systemd",
            )
        state["reboot_pending"] = "soft" if soft else "hard"
        write_json(self.sim._state_path, state)
        self.sim.log_action("reboot", "soft-reboot" if soft else "reboot")
