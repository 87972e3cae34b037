"""The simulated registry's shared bandwidth: pulls of many hosts, in any process, share one
budget (registry_bps) with a cap each (link_bps), a killed puller holds none of it, and every
pull's start and end are logged for the benchmarks."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.errors import HostError
from agent.host.ports import Progress
from agent.model.imageref import ImageRef, parse_image_ref
from standins.host.registry import pull_records
from standins.host.simulated import LAYERS, SimulatedBootc, SimulatedHost

IMAGE = "quay.example/os/node"
SIZE = 64 * 1024 * 1024 * 2  # an image with one file: 64 MiB x (1 + files)
REPO = Path(__file__).resolve().parents[1]

# A host in another process pulling through the same directory: argv BASE DIR BPS.
CHILD = """
import asyncio, sys
from pathlib import Path
from standins.host.simulated import SimulatedBootc, SimulatedHost
from agent.model.imageref import parse_image_ref
base, shared, bps = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
sim = SimulatedHost.create(base, "quay.example/os/node:v1", {"usr/lib/v": "1"})
ref = parse_image_ref(sim.add_image("quay.example/os/node:v2", {"usr/lib/v": "2"}))
sim.set_shared_link(shared, registry_bps=bps, link_bps=bps, host="child")
asyncio.run(SimulatedBootc(sim).stage(ref))
"""


def host(tmp_path: Path, name: str, shared: Path, registry_bps: float,
         link_bps: float) -> tuple[SimulatedHost, ImageRef]:  # fmt: skip
    """A host booted on v1 with v2 (SIZE bytes) to pull through the shared directory."""
    sim = SimulatedHost.create(tmp_path / name, f"{IMAGE}:v1", {"usr/lib/v": "1"})
    ref = parse_image_ref(sim.add_image(f"{IMAGE}:v2", {"usr/lib/v": "2"}, pull_seconds=99))
    sim.set_shared_link(shared, registry_bps=registry_bps, link_bps=link_bps, host=name)
    return sim, ref


def log(shared: Path) -> list[dict]:
    path = shared / "pulls.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def seconds(shared: Path, name: str) -> float:
    """How long the host's first pull took, by the log's shared clock (pull_records pairs its
    start and end lines)."""
    record = next(r for r in pull_records(shared) if r.host == name)
    assert record.outcome == "done" and record.fetched == SIZE and record.end, record
    return record.end - record.start


def peak(shared: Path) -> int:
    running, most = 0, 0
    for entry in sorted(log(shared), key=lambda e: (e["mono"], e["event"] == "start")):
        running += 1 if entry["event"] == "start" else -1
        most = max(most, running)
    return most


async def wait_for(predicate, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_two_hosts_through_one_budget_take_twice_as_long(tmp_path: Path) -> None:
    bps = SIZE / 0.6  # alone: 0.6 s
    shared = tmp_path / "registry"
    alone, ref = host(tmp_path, "alone", shared, bps, bps)
    seen: list[Progress] = []
    await SimulatedBootc(alone).stage(ref, seen.append)
    # Per-layer progress as without a link; pull_seconds (99 s) is not what set the pace.
    assert [p.done_bytes for p in seen] == [SIZE * k // LAYERS for k in range(1, LAYERS + 1)]
    one = seconds(shared, "alone")
    assert 0.6 * 0.95 <= one < 3.0
    pair = [host(tmp_path, name, shared, bps, bps) for name in ("a", "b")]
    await asyncio.gather(*(SimulatedBootc(sim).stage(ref) for sim, ref in pair))
    for name in ("a", "b"):
        assert 1.5 <= seconds(shared, name) / one <= 3.0
    assert peak(shared) == 2
    assert not list((shared / "active").iterdir())  # every pull left


async def test_each_pull_is_capped_when_the_registry_has_room(tmp_path: Path) -> None:
    bps = SIZE / 0.6
    shared = tmp_path / "registry"
    pair = [host(tmp_path, name, shared, 100 * bps, bps) for name in ("a", "b")]
    await asyncio.gather(*(SimulatedBootc(sim).stage(ref) for sim, ref in pair))
    for name in ("a", "b"):
        # Never faster than the cap; about as fast as alone.
        assert 0.6 * 0.95 <= seconds(shared, name) < 0.6 * 1.6 + 0.5
    assert peak(shared) == 2


async def test_a_host_in_another_process_shares_the_budget(tmp_path: Path) -> None:
    bps = SIZE / 1.0
    shared = tmp_path / "registry"
    sim, ref = host(tmp_path, "here", shared, bps, bps)
    shared.mkdir(exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "child"),
                              str(shared), str(bps)], cwd=REPO)  # fmt: skip
    try:
        await wait_for(lambda: any(e["host"] == "child" for e in log(shared)))
        await SimulatedBootc(sim).stage(ref)
        await asyncio.to_thread(child.wait, 30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    # Both 1 s alone; sharing all the way, about 2 s each.
    assert seconds(shared, "here") >= 1.4 and seconds(shared, "child") >= 1.4
    assert peak(shared) == 2


async def test_a_killed_pullers_entry_is_ignored(tmp_path: Path) -> None:
    bps = SIZE / 0.6
    shared = tmp_path / "registry"
    shared.mkdir()
    # The child's pull would take 30 s alone; it is killed mid-way, as a rebooting node's is.
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "child"),
                              str(shared), str(SIZE / 30)], cwd=REPO)  # fmt: skip
    try:
        await wait_for(lambda: any(e["host"] == "child" for e in log(shared)))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    left = list((shared / "active").iterdir())
    assert [p.name.split("-")[0] for p in left] == [str(child.pid)]  # no `finally` ran
    sim, ref = host(tmp_path, "here", shared, bps, bps)
    await SimulatedBootc(sim).stage(ref)
    assert seconds(shared, "here") < 0.6 * 1.6 + 0.5  # the whole budget: not halved
    assert not list((shared / "active").iterdir())  # and the dead entry is gone


async def test_a_cancelled_pull_leaves_and_keeps_its_layers(tmp_path: Path) -> None:
    shared = tmp_path / "registry"
    sim, ref = host(tmp_path, "here", shared, SIZE / 1.5, SIZE / 1.5)  # 0.5 s a layer
    bootc = SimulatedBootc(sim)
    staging = asyncio.create_task(bootc.stage(ref, locked=True))
    assert ref.digest is not None
    await wait_for(lambda: len(sim.cached_layers(ref.digest or "")) >= 1)
    staging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await staging
    kept = sim.cached_layers(ref.digest)
    assert 1 <= len(kept) < LAYERS
    assert not list((shared / "active").iterdir())
    start, end = log(shared)
    assert (start["event"], start["verb"], start["locked"], start["layer"]) == (
        "start", "stage", True, 1,
    )  # fmt: skip
    assert (end["outcome"], end["fetched"]) == ("cancelled", SIZE * len(kept) // LAYERS)
    await bootc.stage(ref)  # the rest only
    again = log(shared)[-2:]
    assert again[0]["layer"] == len(kept) + 1 and again[0]["layers"] == LAYERS - len(kept)
    assert again[1]["outcome"] == "done"


async def test_a_registry_down_fails_the_pull_and_it_leaves(tmp_path: Path) -> None:
    shared = tmp_path / "registry"
    sim, ref = host(tmp_path, "here", shared, SIZE / 0.3, SIZE / 0.3)
    sim.set_registry_down()
    with pytest.raises(HostError) as failed:
        await SimulatedBootc(sim).pull(ref)
    assert failed.value.kind == "other" and "connection refused" in str(failed.value)
    assert log(shared) == []  # nothing fetched: no pull registered
    sim.set_registry_down(False)
    await SimulatedBootc(sim).pull(ref)
    assert [(e["event"], e["verb"]) for e in log(shared)] == [("start", "pull"), ("end", "pull")]
    # Down in the middle of a pull: it stops at the next layer, and leaves.
    sim.set_shared_link(shared, registry_bps=SIZE / 1.5, link_bps=SIZE / 1.5, host="here")
    other = parse_image_ref(sim.add_image(f"{IMAGE}:v3", {"usr/lib/v": "3"}))
    assert other.digest is not None
    pulling = asyncio.create_task(SimulatedBootc(sim).pull(other))
    await wait_for(lambda: len(sim.cached_layers(other.digest or "")) >= 1)
    sim.set_registry_down()
    with pytest.raises(HostError):
        await pulling
    assert log(shared)[-1]["outcome"] == "failed"
    assert not list((shared / "active").iterdir())
    sim.set_shared_link(None)  # back to pull_seconds
    assert "link" not in json.loads((sim.base / "registry.json").read_text())
