"""The durable writer under injected faults: a write that stops part-way, an fsync error, a full
disk, a failed rename. Each keeps the previous file whole and leaves no temporary file; the
same holds for the journal and the recorded configs while the engine runs an update, and for
status.json while the agent reports.

Faults are injected into the `os` the writer calls (agent/host/durable.py only), and one case
is the kernel's own: a file-size limit that makes a write stop after some bytes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from agent.app.runtime import write_status
from agent.errors import HostError
from agent.host import durable
from agent.observe.http import StatusBoard
from agent.update.engine import DEGRADED, DONE, REBOOTING, Outcome
from agent.update.journal import Journal, Phase
from tests.simhost import World

OLD = b'{"the": "previous document"}\n'
NEW = b'{"the": "new document", "padding": "' + b"x" * 64 * 1024 + b'"}\n'


class FaultyDisk:
    """The `os` module as agent/host/durable.py sees it, with one fault armed: the `nth`
    matching call (counting from 1) to a file whose name contains `target` fails."""

    def __init__(self, fault: str, target: str = "", nth: int = 1) -> None:
        self.fault, self.target, self.nth = fault, target, nth
        self.paths: dict[int, str] = {}
        self.seen = 0
        self.fired = False
        self.previous: bytes | None = None  # the file as it was when the fault fired
        self.module = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os)
                                               if not k.startswith("__")})  # fmt: skip
        self.module.open = self._open
        self.module.write = self._write
        self.module.fsync = self._fsync
        self.module.rename = self._rename

    def _armed(self, path: str) -> bool:
        if self.fired or self.target not in os.path.basename(path):
            return False
        self.seen += 1
        if self.seen != self.nth:
            return False
        self.fired = True
        final = Path(path).with_name(Path(path).name.removeprefix(".").removesuffix(".tmp"))
        self.previous = final.read_bytes() if final.exists() else None
        return True

    def _open(self, path, flags, mode=0o777):
        fd = os.open(path, flags, mode)
        self.paths[fd] = str(path)
        return fd

    def _write(self, fd: int, data) -> int:
        path = self.paths.get(fd, "")
        if self.fault == "short-write" and self._armed(path):
            os.write(fd, bytes(data[: len(data) // 2]))  # some bytes land, then the disk fills
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.fault == "disk-full" and self._armed(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    def _fsync(self, fd: int) -> None:
        if self.fault == "fsync" and self._armed(self.paths.get(fd, "")):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)

    def _rename(self, src, dst) -> None:
        if self.fault == "rename" and self._armed(str(dst)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        os.rename(src, dst)


FAULTS = ["short-write", "disk-full", "fsync", "rename"]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_write_keeps_the_previous_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    path = tmp_path / "record.json"
    durable.write_atomic(path, OLD)
    disk = FaultyDisk(fault, "record.json")
    monkeypatch.setattr(durable, "os", disk.module)
    with pytest.raises(OSError):
        durable.write_atomic(path, NEW)
    assert disk.fired
    assert path.read_bytes() == OLD
    assert leftovers(tmp_path) == []
    monkeypatch.undo()
    durable.write_atomic(path, NEW)  # the disk is back: the next write lands whole
    assert path.read_bytes() == NEW and leftovers(tmp_path) == []


def test_a_write_the_kernel_stops_part_way_keeps_the_previous_file(tmp_path: Path) -> None:
    """A real short write: under a 4 KiB file-size limit the kernel writes what fits, then
    refuses (EFBIG); the previous file stays whole and the temporary file goes."""
    path = tmp_path / "record.json"
    durable.write_atomic(path, OLD)
    program = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from agent.host.durable import write_atomic\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    write_atomic(Path(sys.argv[1]), {NEW!r})\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
        "    sys.exit(1)\n"
    )
    result = subprocess.run([sys.executable, "-c", program, str(path)], capture_output=True,
                            text=True, timeout=60, cwd=Path(__file__).parents[1])  # fmt: skip
    assert (result.returncode, result.stdout.strip()) == (1, str(errno.EFBIG)), result.stderr
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []


def test_a_record_that_cannot_be_written_is_a_host_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal.json")
    monkeypatch.setattr(durable, "os", FaultyDisk("disk-full", "journal.json").module)
    with pytest.raises(HostError) as err:
        journal.save(journal.load().to(Phase.STAGING))
    assert err.value.kind == "journal"
    assert str(err.value) == (
        f"cannot write the journal {tmp_path / 'journal.json'}: No space left on device"
    )
    assert not (tmp_path / "journal.json").exists() and leftovers(tmp_path) == []


async def probe_writes(tmp_path: Path) -> list[tuple[str, int]]:
    """Every write of the engine's records in the update to v2, in order, as (file name,
    how many writes of that file so far): one probe run on a world of its own."""
    world = World.create(tmp_path / "probe")
    await world.converge(world.desired("r1", "v1"))
    seen: list[tuple[str, int]] = []
    real = durable.write_atomic

    def recording(path: Path, data: bytes, mode: int = 0o600) -> None:
        seen.append((path.name, 1 + sum(1 for name, _ in seen if name == path.name)))
        real(path, data, mode)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(durable, "write_atomic", recording)
        await world.converge(world.desired("r2", "v2", keys=["ssh-ed25519 AAAA-two"]))
    return [(name, n) for name, n in seen if name in ("journal.json", "current-config",
                                                      "pending-config")]  # fmt: skip


async def test_the_engine_survives_a_failed_write_of_each_of_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update from v1 to v2 (an SSH key live, the image by reboot): every write of the
    journal and of the recorded configs, in turn, fails part-way. The pass fails with a
    host error naming the file; the file still holds what it held before (the journal loads
    to the record it had); no temporary file is left; no reboot was asked for on the strength
    of the record that failed. Run again on a sound disk, the update finishes with one
    reboot in all."""
    writes = await probe_writes(tmp_path)
    assert ("journal.json", 1) in writes and ("pending-config", 1) in writes
    for k, (name, nth) in enumerate(writes):
        world = World.create(tmp_path / str(k))
        await world.converge(world.desired("r1", "v1"))
        state = world.sim.root / "var/lib/image-mode-agent"
        desired = world.desired("r2", "v2", keys=["ssh-ed25519 AAAA-two"])
        disk = FaultyDisk("short-write", name, nth)
        reboots = world.reboots()
        with monkeypatch.context() as patch:
            patch.setattr(durable, "os", disk.module)
            outcome: Outcome | None = None
            for _ in range(4):  # process lives, until the fault is met
                try:
                    outcome = await world.engine().reconcile(desired)
                except HostError as exc:
                    assert exc.kind == "journal" and name in str(exc), (name, nth, exc)
                    break
                assert outcome.state in (REBOOTING, DONE, DEGRADED), outcome
            else:
                raise AssertionError(f"write {nth} of {name} never failed")
        assert disk.fired, (name, nth)
        target = state / name
        assert (target.read_bytes() if target.exists() else None) == disk.previous, (name, nth)
        assert leftovers(state) == [], (name, nth)
        Journal(state / "journal.json").load()  # whole, whatever it holds
        outcome = await world.converge(desired)
        assert (outcome.state, world.booted()) == (DONE, world.digest("v2")), (name, nth)
        assert world.reboots() - reboots == 1, (name, nth)
        keys = world.read("/home/core/.ssh/authorized_keys.d/ignition") or b""
        assert b"AAAA-two" in keys


@pytest.mark.parametrize("fault", ["short-write", "fsync"])
def test_a_status_file_that_cannot_be_written_keeps_the_last_and_serves_the_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """status.json keeps the last report whole when the disk fails; /status (the board) has
    the new one, and the next report writes the file again."""
    world = World.create(tmp_path)
    host = world.sim.host(lambda path: True)
    board = StatusBoard()
    write_status(host, Outcome(DONE, current_config="r1"), "idle", board)
    status = host.state_dir / "status.json"
    last = status.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(durable, "os", FaultyDisk(fault, "status.json").module)
        write_status(host, Outcome(DEGRADED, "something failed", current_config="r1"),
                     "degraded", board)  # fmt: skip
    assert status.read_bytes() == last and leftovers(host.state_dir) == []
    assert (board.document()["state"], board.document()["reason"]) == (DEGRADED, "something failed")
    write_status(host, Outcome(DONE, current_config="r1"), "idle", board)
    assert b'"state": "Done"' in status.read_bytes()
