"""One engine pass told as MachineConfigNode steps: the engine's checkpoints (journal phases
and side effects) become the steps the MCD records at the same points of its update."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from agent.cluster import mcn as M
from agent.cluster.annotations import NodeView
from agent.cluster.mcn_writer import MachineConfigNodeWriter

# Journal phases an engine pass resumes from after a boot.
AFTER_BOOT = ("rebooting", "rolling-back", "rollback-rebooting", "committing")


@dataclass
class PassSteps:
    writer: MachineConfigNodeWriter
    node: Callable[[], NodeView]
    start: str = "idle"  # the journal's phase when the pass began
    live_writes: int = 0
    actions: list[str] = field(default_factory=list)
    prepared: bool = False

    def begin(self, phase: str) -> None:
        """A new engine pass, starting from this journal phase."""
        self.start, self.live_writes, self.actions, self.prepared = phase, 0, [], False

    @property
    def ran(self) -> bool:
        """An update ran or resumed (not a pass that found nothing to do)."""
        return self.prepared or self.start in AFTER_BOOT

    def on_checkpoint(self, label: str) -> None:
        """The engine's hook: `journal:<phase>` after each journal write (before the side effect
        it names), `did:<effect>` after a side effect."""
        step, _, what = label.partition(":")
        record = self.writer.record
        if step == "did":
            if what.startswith("live:"):
                self.live_writes += 1
            elif what.startswith("action:"):
                self.actions.append(what.removeprefix("action:"))
            elif what == "stage" and self.prepared:
                record(M.applied_files_and_os(True, self.live_writes > 0))
            return
        fresh = self.start not in AFTER_BOOT
        match what:
            case "staging" if fresh:
                self._prepare(image=True)
            case "committing" if fresh:
                self._prepare(image=False)
                record(M.applied_files_and_os(False, self.live_writes > 0))
                for action in self.actions or ["none"]:
                    if action == "none":
                        record(M.post_action_none())
                    elif action.startswith("reload ") or action == "daemon-reload":
                        record(M.post_action_reloaded(action.removeprefix("reload ")))
                    # a restart writes no condition in the MCD either
            case "committing" | "rolling-back" if self.start == "rebooting":
                record(M.rebooted())
            case "degraded" if self.start == "rollback-rebooting":
                record(M.rebooted())
            case "rebooting" | "rollback-rebooting":
                record(M.rebooting())
            case _:
                pass

    def _prepare(self, *, image: bool) -> None:
        """The update is known to be compatible and what it needs: the MCD's preparation."""
        if self.prepared:
            return
        self.prepared = True
        drain = image and not self.node().single_replica
        self.writer.record(M.prepared(drain))
        if not drain:
            self.writer.record(M.drain_not_required())
        self.writer.record(M.applying_files_and_os(image, self.live_writes > 0))
