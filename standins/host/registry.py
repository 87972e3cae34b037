"""A simulated registry whose bandwidth the pulls of many simulated hosts share, across
processes, and the log it keeps of them (standins/host/simulated.py pulls through it).

`directory` is a folder every host of the registry names (its registry.json `link`),
`registry_bps` (B) the bytes per second shared by every pull running at that moment,
`link_bps` (b) each pull's own cap. A pull that fetches anything registers itself in
DIR/active (one file `PID-ID.active`, removed when it ends however it ends; an entry whose
process is dead is ignored and removed, so a killed agent holds no bandwidth), then moves its
bytes in ticks of TICK seconds at min(b, B / n), n the live entries at that tick.

Each start and end is one JSON line in DIR/pulls.log: `event` (start | end), `id`, `time`
(epoch), `mono` (time.monotonic(): one clock for every process on the machine), `host`, `pid`,
`digest`, `verb` (`pull`: the hidden image pull, only a pre-pull uses it; `stage`: a switch, a
pre-stage or a turn: the log cannot tell, the Node's desiredConfig can), `locked`, `layer` (the
first one fetched), `layers` and `bytes` to fetch; an end adds `outcome` (done | cancelled |
failed) and `fetched`. `pull_records` pairs them up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICK = 0.05  # seconds between a pull's looks at how many pulls share the registry


@dataclass(frozen=True)
class LinkEntry:
    """One pull registered in the shared directory: its file and what its log lines repeat."""

    path: Path
    fields: dict[str, Any]


@dataclass(frozen=True)
class SharedLink:
    """A registry's bandwidth shared by the pulls of every host that names `directory`, in
    any process: who pulls is the directory's `active/` entries, one per running pull."""

    directory: Path
    registry_bps: float  # B: shared by all pulls running at once
    link_bps: float  # b: each pull's own cap
    host: str

    @classmethod
    def of(cls, setting: dict[str, Any] | None) -> SharedLink | None:
        if not setting:
            return None
        return cls(Path(setting["dir"]), float(setting["registry_bps"]),
                   float(setting["link_bps"]), str(setting.get("host", "")))  # fmt: skip

    @property
    def active_dir(self) -> Path:
        return self.directory / "active"

    @property
    def log_path(self) -> Path:
        return self.directory / "pulls.log"

    def active(self) -> int:
        """The pulls running now: entries whose process lives (a killed agent's stay behind;
        they are removed here so that they are not looked at again)."""
        count = 0
        try:
            names = os.listdir(self.active_dir)
        except FileNotFoundError:
            return 0
        for name in names:
            pid_text = name.split("-", 1)[0]
            if not name.endswith(".active") or not pid_text.isdigit():
                continue
            if _alive(int(pid_text)):
                count += 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    (self.active_dir / name).unlink()
        return count

    def rate(self) -> float:
        """Bytes per second one pull gets now: its cap, or its share of the registry."""
        return min(self.link_bps, self.registry_bps / max(1, self.active()))

    def join(self, digest: str, verb: str, locked: bool, layer: int, layers: int,
             size: int) -> LinkEntry:  # fmt: skip
        pid, ident = os.getpid(), uuid.uuid4().hex[:12]
        self.active_dir.mkdir(parents=True, exist_ok=True)
        path = self.active_dir / f"{pid}-{ident}.active"
        path.write_text(self.host)
        fields = {"id": ident, "host": self.host, "pid": pid, "digest": digest, "verb": verb,
                  "locked": locked, "layer": layer, "layers": layers, "bytes": size}  # fmt: skip
        self._log("start", fields)
        return LinkEntry(path, fields)

    def leave(self, entry: LinkEntry, outcome: str, fetched: int) -> None:
        entry.path.unlink(missing_ok=True)
        self._log("end", {**entry.fields, "outcome": outcome, "fetched": fetched})

    def hold_path(self, host: str) -> Path:
        """While this file exists, `host`'s pulls move nothing (a test's pause of one pull)."""
        return self.directory / f"{host}.hold"

    async def transfer(self, size: float) -> None:
        """Move `size` bytes at the rate each tick allows (the rate of a tick holds for the
        time it really took, so a late wake-up neither loses nor gains bytes)."""
        left = float(size)
        last = time.monotonic()
        held = self.hold_path(self.host)
        while left > 0:
            if held.exists():
                await asyncio.sleep(TICK)
                last = time.monotonic()
                continue
            rate = self.rate()
            await asyncio.sleep(min(TICK, left / rate))
            now = time.monotonic()
            left -= rate * (now - last)
            last = now

    def _log(self, event: str, fields: dict[str, Any]) -> None:
        line = json.dumps({"event": event, "time": time.time(), "mono": time.monotonic(),
                           **fields})  # fmt: skip
        # One write of one short line to a file opened for appending: lines of concurrent
        # processes do not interleave.
        with open(self.log_path, "a") as handle:
            handle.write(line + "\n")


def _alive(pid: int) -> bool:
    """Whether the process exists. (A zombie still does until its parent reaps it, which
    systemd and the test supervisors do at once; reading /proc for it at every tick of every
    pull would cost more than the rare tick it corrects.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: it exists
    return True


@dataclass(frozen=True)
class PullRecord:
    """One pull in a registry's log: its start and, unless its process died, its end."""

    id: str
    host: str
    digest: str
    verb: str
    start: float  # time.monotonic() at the start
    end: float | None  # None: no end line (the process was killed mid-pull)
    outcome: str | None
    fetched: int


def pull_records(directory: Path, digest: str | None = None) -> list[PullRecord]:
    """The pulls DIR/pulls.log records (of `digest` only, when given), by their start."""
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    log = Path(directory) / "pulls.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        if digest is None or entry["digest"] == digest:
            (starts if entry["event"] == "start" else ends)[entry["id"]] = entry
    records = []
    for ident, start in starts.items():
        end = ends.get(ident) or {}
        records.append(PullRecord(ident, start["host"], start["digest"], start["verb"],
                                  start["mono"], end.get("mono"), end.get("outcome"),
                                  int(end.get("fetched", 0))))  # fmt: skip
    return sorted(records, key=lambda r: r.start)
