"""One booted test machine: systemd-nspawn over an overlay of the cached rootfs.

systemd is PID 1 with a real system bus; `systemctl reboot` ends nspawn with exit 133 and the
boot loop here starts it again (a new boot ID, the overlay's upper layer keeps the disk state).
The harness reads the machine's files through the merged overlay directory and runs commands in
it with nsenter (the container is not registered with machined: the host has no system bus).

`/sysroot` in the machine is read-only, as on a bootc host: a tmpfs of the machine's own (kept
across its reboots), bound with `--bind-ro`. The stand-in bootc keeps its ostree repository there
(`/sysroot/ostree/repo`), so whatever writes to it must remount it read-write in a private mount
namespace first, as bootc does and as the agent's pre-pull must; a remount really happens, of a
tmpfs, never of the host's own filesystem."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.system.rootfs import REPO

GUEST = Path(__file__).resolve().parent / "guest"
SRC_MOUNT = "/opt/image-mode-agent/src"
GUEST_MOUNT = "/opt/image-mode-agent/guest"
STANDIN_STATE = "/var/lib/standin-bootc"
EXIT_REBOOT = 133
MAX_BOOTS = 8  # a machine that reboots more than this is in a loop: stop it


class MachineError(AssertionError):
    pass


class Machine:
    def __init__(self, rootfs: Path, workdir: Path, name: str, persona: str | None = None) -> None:
        self.lower = rootfs
        self.workdir = workdir
        self.name = name
        self.persona = persona  # the stand-in bootc's release; None: its default (the newest)
        self.root = workdir / "root"
        self.sysroot = workdir / "sysroot"
        self.boots = 0
        self.exit_codes: list[int] = []
        self.proc: subprocess.Popen | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- disk ---------------------------------------------------------------------------------

    def create(self, agent_link: bool = True) -> Machine:
        """Mount the overlay (instant, unlike copying 430 MB) and give the machine its identity.
        `agent_link=False` keeps the lower tree's own /usr/bin/image-mode-agent (an image that
        installs the agent itself) instead of pointing it at the bind-mounted source."""
        for d in ("upper", "ovwork", "root", "sysroot"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        opts = (
            f"lowerdir={self.lower},upperdir={self.workdir / 'upper'},"
            f"workdir={self.workdir / 'ovwork'}"
        )
        run(["mount", "-t", "overlay", "overlay", "-o", opts, str(self.root)])
        run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=256m", "ima-sysroot", str(self.sysroot)])
        (self.sysroot / "ostree" / "repo").mkdir(parents=True)
        self.write("/etc/machine-id", uuid.uuid4().hex + "\n")
        if self.persona:
            self.write(f"{STANDIN_STATE}/persona", self.persona + "\n")
        self.write("/etc/hostname", self.name + "\n")
        # The stand-in bootc and its boot-time "bootloader" unit, bind-mounted from the repo.
        self.symlink("/usr/bin/bootc", f"{GUEST_MOUNT}/bootc")
        if agent_link:
            self.symlink("/usr/bin/image-mode-agent", "/usr/local/bin/image-mode-agent")
        self.install_unit(GUEST / "standin-bootc-boot.service", "sysinit.target")
        for unit in ("bootc-fetch-apply-updates.service", "bootc-fetch-apply-updates.timer"):
            self.write(f"/usr/lib/systemd/system/{unit}", (GUEST / unit).read_text())
        self.symlink(
            "/etc/systemd/system/timers.target.wants/bootc-fetch-apply-updates.timer",
            "/usr/lib/systemd/system/bootc-fetch-apply-updates.timer",
        )
        return self

    def path(self, guest_path: str) -> Path:
        return self.root / guest_path.lstrip("/")

    def write(self, guest_path: str, text: str, mode: int = 0o644) -> None:
        """Atomic, so an agent watching the file never reads half of it."""
        dest = self.path(guest_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.harness-tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.rename(tmp, dest)

    def read(self, guest_path: str) -> str | None:
        try:
            return self.path(guest_path).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_json(self, guest_path: str) -> dict | None:
        text = self.read(guest_path)
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None  # caught mid-write by a non-atomic writer: the next poll sees it whole

    def symlink(self, guest_path: str, target: str) -> None:
        link = self.path(guest_path)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)

    def install_unit(self, source: Path, wanted_by: str | None) -> None:
        self.write(f"/etc/systemd/system/{source.name}", source.read_text())
        if wanted_by:
            self.symlink(
                f"/etc/systemd/system/{wanted_by}.wants/{source.name}",
                f"/etc/systemd/system/{source.name}",
            )

    # ---- boot loop ----------------------------------------------------------------------------

    def start(self) -> None:
        """Boot in the background; every exit 133 (reboot) boots again."""
        self._thread = threading.Thread(target=self._loop, name=f"boot-{self.name}", daemon=True)
        self._thread.start()
        self.wait_for(lambda: self.proc is not None, 10, "nspawn to start")

    def _loop(self) -> None:
        while not self._stopping and self.boots < MAX_BOOTS:
            with self._lock:
                self.boots += 1
                console = open(self.workdir / f"console-{self.boots}.log", "w")  # noqa: SIM115
                self.proc = subprocess.Popen(
                    self._nspawn_cmd(), stdin=subprocess.DEVNULL, stdout=console,
                    stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
                )  # fmt: skip
            rc = self.proc.wait()
            console.close()
            self.exit_codes.append(rc)
            if rc != EXIT_REBOOT:
                break
        self._stopping = True

    def _nspawn_cmd(self) -> list[str]:
        return [
            "systemd-nspawn", "-q", "--register=no", "--keep-unit", "-b",
            "--console=pipe", "--link-journal=no", "--resolv-conf=off", "--timezone=off",
            f"--machine={self.name}", "-D", str(self.root),
            f"--bind-ro={REPO}:{SRC_MOUNT}", f"--bind-ro={GUEST}:{GUEST_MOUNT}",
            f"--bind-ro={self.sysroot}:/sysroot",
        ]  # fmt: skip

    @property
    def running(self) -> bool:
        return not self._stopping

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> object:
        """Poll `predicate` (which may read the machine's files) until it is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise MachineError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.2)

    def wait_booted(self, boot: int, timeout: float = 60) -> dict:
        """The stand-in bootc's boot record of boot number `boot` (1-based)."""

        def booted() -> dict | None:
            records = self.boot_records()
            if len(records) >= boot:
                return records[boot - 1]
            if not self.running:  # nspawn ended without a reboot: waiting is pointless
                raise MachineError(
                    f"the machine stopped before boot {boot} (exit codes {self.exit_codes}); "
                    f"console: {self.console_tail()}"
                )
            return None

        record = self.wait_for(
            booted, timeout, f"boot {boot} (boots seen: {self.boots}, exits: {self.exit_codes})"
        )
        assert isinstance(record, dict)
        return record

    def console_tail(self, lines: int = 6) -> str:
        text = (self.workdir / f"console-{self.boots}.log").read_text(errors="replace")
        return " | ".join(text.strip().splitlines()[-lines:])

    def boot_records(self) -> list[dict]:
        text = self.read(f"{STANDIN_STATE}/boots.log") or ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def leader(self) -> int:
        """The container's PID 1 (systemd) as the host sees it: a descendant of nspawn."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            raise MachineError("the machine is not running")
        todo = [proc.pid]
        while todo:
            pid = todo.pop()
            for child in _children(pid):
                if _comm(child) == "systemd":
                    return child
                todo.append(child)
        raise MachineError("no systemd under nspawn yet")

    def sh(
        self, command: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess:
        """Run a shell command inside the running machine (all its namespaces)."""
        cmd = ["timeout", str(timeout), "nsenter", "-t", str(self.leader()), "-a",
               "/bin/sh", "-c", command]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise MachineError(
                f"in-machine command failed ({result.returncode}): {command}\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def wait_system_up(self, timeout: float = 60) -> None:
        """Until PID 1 answers on the bus and boot has finished (running or degraded)."""

        def up() -> bool:
            try:
                r = self.sh("systemctl is-system-running", timeout=10, check=False)
            except MachineError:
                return False
            return r.stdout.strip() in ("running", "degraded")

        self.wait_for(up, timeout, "systemd to finish booting")

    def stop(self, timeout: float = 30) -> None:
        """Clean poweroff: SIGTERM makes nspawn send SIGRTMIN+3 to the container's systemd."""
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._thread:
            self._thread.join(timeout)

    def destroy(self, keep: bool = False) -> None:
        self.stop()
        subprocess.run(["timeout", "30", "umount", str(self.root)], capture_output=True)
        if keep:  # the tmpfs goes with its mount: keep a copy of /sysroot beside upper/
            subprocess.run(["timeout", "60", "cp", "-a", f"{self.sysroot}/.",
                            str(self.workdir / "sysroot-kept")], capture_output=True)  # fmt: skip
        subprocess.run(["timeout", "30", "umount", str(self.sysroot)], capture_output=True)
        if not keep:
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.workdir)])

    # ---- journal ------------------------------------------------------------------------------

    def journal(self, *args: str) -> list[dict]:
        """The machine's persistent journal, read from the host (works while it runs or not)."""
        cmd = ["timeout", "30", "journalctl", "-D", str(self.path("/var/log/journal")),
               "-o", "json", "--no-pager", *args]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            found += [int(c) for c in text.split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the harness thread that started it dies, so a
    killed run leaves no container or registry behind (SIGTERM halts an nspawn container)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["timeout", str(timeout), *cmd], check=True, capture_output=True)
