"""What a cluster scenario needs from an API server, written once: the simulated host, the
agent process and the waits are shared; each server (the project's fakekube, the real
kube-apiserver from the kit) supplies the few primitives below.

Every config a scenario adds carries the canary secrets (tests/secrets_canary.py), and
`run_checked` scans everything the agent emitted for them afterwards (no secret's contents
may show in a log, an Event or a reason): its console and JSON logs (agent starts alternate
between a pseudo-terminal and a file for stderr), every version of the Node, Events and
MachineConfigNodes the harness saw, `/status` and `/metrics` scraped while it ran, and the
host's journal.json, status.json and actions.log."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from standins.demo.loopback import P, stop_processes
from standins.demo.objects import machine_config
from standins.host.simulated import SimulatedHost
from tests import secrets_canary as canary

Annotations = dict[str, str]
DEFAULT_ANNOTATIONS = {P + "currentConfig": "rendered-worker-1",
                       P + "desiredConfig": "rendered-worker-1", P + "state": "Done"}  # fmt: skip
# stderr of the agent's starts, in turn: a file (JSON lines) and a pseudo-terminal (console).
LOG_FORMATS = ("json", "console")
STATE_DIR = "var/lib/image-mode-agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def exits(proc: asyncio.subprocess.Process, timeout: float = 40.0) -> int:
    """The agent's exit code (3: a simulated reboot ended it), within `timeout` s."""
    return await asyncio.wait_for(proc.wait(), timeout)


async def until(predicate: Callable[[], object], timeout: float = 30.0, what: str = "") -> None:
    """Poll `predicate` until it holds; AssertionError naming `what` after `timeout` s."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s: {what or predicate}") from None


def logged(path: Path, *texts: str) -> int:
    """How many complete lines of the log at `path` hold every one of `texts`."""
    try:
        data = path.read_text(errors="replace")
    except FileNotFoundError:
        return 0
    return sum(1 for line in data.split("\n")[:-1] if all(t in line for t in texts))


async def wait_logged(path: Path, *texts: str, count: int = 1, timeout: float = 30.0,
                      proc: asyncio.subprocess.Process | None = None) -> None:  # fmt: skip
    """Until `count` lines of an agent's log (JSON or console lines: the event's words, a
    field's value) hold every one of `texts`: positive evidence that it got that far, before
    a check that it did nothing more. Fails at once when `proc` exits."""

    def seen() -> bool:
        if proc is not None and proc.returncode is not None:
            raise AssertionError(f"the agent exited ({proc.returncode}) before logging {texts}")
        return logged(path, *texts) >= count

    await until(seen, timeout, f"{count} line(s) with {texts} in {path}")


async def metric(port: int, line_prefix: str) -> float:
    """The value of the agent's metric line that starts with `line_prefix` (name and
    labels) on 127.0.0.1:`port`; 0.0 when there is none yet."""
    timeout = aiohttp.ClientTimeout(total=5)
    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as answer:
        text = await answer.text()
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return 0.0


async def wait_metric(port: int, line_prefix: str, at_least: float,
                      timeout: float = 20) -> None:  # fmt: skip
    """Until that metric reaches `at_least` (the endpoints may not be up yet)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(OSError, aiohttp.ClientError):
                if await metric(port, line_prefix) >= at_least:
                    return
            await asyncio.sleep(0.1)


def _copy_pty(master: int, sink: Path) -> None:
    """Copy what the agent writes to its terminal into `sink` until every writer closed it."""
    with open(sink, "ab") as out:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            out.write(chunk)
            out.flush()
    os.close(master)


@dataclass
class Harness(abc.ABC):
    """One Node served by one API server, its simulated host, and the agent processes."""

    base: Path
    sim: SimulatedHost
    images: dict[str, str]
    node: str = "worker-0"
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    # Whether the server can count the agent's requests exactly (only the fake can).
    counts_requests: bool = False
    log_formats: tuple[str, ...] = LOG_FORMATS
    # What the agent emitted, for the canary check: where -> the distinct texts seen there.
    seen: dict[str, set[str]] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)  # every start's stdout and stderr
    listens: list[str] = field(default_factory=list)  # every start's --listen address
    _readers: list[threading.Thread] = field(default_factory=list)
    _poller: asyncio.Task[None] | None = None

    # -- what each server supplies ------------------------------------------------------------
    @abc.abstractmethod
    async def put(self, obj: dict[str, Any]) -> None:
        """Create or replace a cluster-scoped object, as an admin."""

    @abc.abstractmethod
    async def delete(self, kind: str, name: str) -> None: ...

    @abc.abstractmethod
    async def node_object(self) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    async def patch_annotations(self, values: dict[str, str | None]) -> None: ...

    @abc.abstractmethod
    async def event_reasons(self) -> list[str]: ...

    @abc.abstractmethod
    async def enable_drain_controller(self) -> None:
        """Something answers desiredDrain as the MCO's drain controller does."""

    @abc.abstractmethod
    def drain_values(self) -> list[str]:
        """Every value desiredDrain took, in order."""

    @abc.abstractmethod
    async def restart_api_server(self, downtime: float) -> None: ...

    @abc.abstractmethod
    async def expire_watches(self) -> None:
        """End the agent's watches so that resuming from its last resourceVersion is 410."""

    @abc.abstractmethod
    def agent_kubeconfigs(self) -> tuple[Path, Path]:
        """(service account, node identity)."""

    @abc.abstractmethod
    async def close_server(self) -> None: ...

    async def agent_objects(self) -> dict[str, list[dict[str, Any]]]:
        """What the agent writes to the API server, as it is now: {"Node": [...], "Event":
        [...], "MachineConfigNode": [...]} (each server lists them its own way)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list the agent's objects")

    # -- shared ---------------------------------------------------------------------------------
    async def add_config(self, name: str, image: str, **kwargs: Any) -> None:
        """A rendered config, with the canary pull secret and core's canary password hash."""
        doc = machine_config(name=name, image=self.images.get(image, image), **kwargs)
        await self.put(canary.with_canary_secrets(doc))

    async def set_desired(self, name: str, **extra: str | None) -> None:
        await self.patch_annotations({P + "desiredConfig": name, **extra})

    async def annotations(self) -> Annotations:
        node = await self.node_object()
        return (node or {}).get("metadata", {}).get("annotations") or {}

    async def wait_node(self, predicate: Callable[[dict[str, Any]], bool],
                        timeout: float = 30.0, what: str = "") -> dict[str, Any]:  # fmt: skip
        node: dict[str, Any] | None = None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        node = await self.node_object()
                    except Exception:  # the server may be restarting: keep asking
                        node = None
                    self.saw("Node", node)
                    if node is not None and predicate(node):
                        return node
                    if self.procs and self.procs[-1].returncode is not None:
                        raise AssertionError(
                            f"the agent exited ({self.procs[-1].returncode}) "
                            f"while waiting for {what or predicate}"
                        )
                    await asyncio.sleep(0.1)
        except TimeoutError:
            annotations = (node or {}).get("metadata", {}).get("annotations")
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}; "
                                 f"annotations: {annotations}") from None  # fmt: skip

    async def wait_annotations(self, predicate: Callable[[Annotations], bool],
                               timeout: float = 30.0, what: str = "") -> Annotations:  # fmt: skip
        node = await self.wait_node(
            lambda n: predicate(n["metadata"].get("annotations") or {}), timeout, what
        )
        return node["metadata"]["annotations"]

    async def wait_done(self, config: str, timeout: float = 30.0) -> Annotations:
        return await self.wait_annotations(
            lambda a: a.get(P + "currentConfig") == config and a.get(P + "state") == "Done",
            timeout, f"{config} Done",
        )  # fmt: skip

    async def start_agent(self, *extra: str) -> asyncio.subprocess.Process:
        """The agent at its most talkative (debug), its endpoints on a port of its own, its
        stdout in a file and its stderr in a file (JSON lines) or on a terminal (console
        lines), by turns."""
        sa, node = self.agent_kubeconfigs()
        n = len(self.procs)
        fmt = self.log_formats[n % len(self.log_formats)]
        listen = f"127.0.0.1:{free_port()}"
        stdout_path = self.base / f"agent-{n}.stdout"
        stderr_path = self.base / f"agent-{n}.{fmt}.log"
        self.logs += [stdout_path, stderr_path]
        with contextlib.ExitStack() as parent_copies:  # the child keeps its own
            stdout = parent_copies.enter_context(open(stdout_path, "wb"))
            if fmt == "console":
                master, terminal = os.openpty()
                parent_copies.callback(os.close, terminal)
                reader = threading.Thread(target=_copy_pty, args=(master, stderr_path),
                                          name=f"agent-{n}-tty", daemon=True)  # fmt: skip
                reader.start()
                self._readers.append(reader)
                stderr: Any = terminal
            else:
                stderr = parent_copies.enter_context(open(stderr_path, "wb"))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent", "--log-level", "debug", "run", "--source", "kube",
                "--host", f"simulated:{self.sim.base}", "--listen", listen,
                "--kubeconfig", str(sa), "--node-kubeconfig", str(node), "--node-name", self.node,
                *extra, stdout=stdout, stderr=stderr,
            )  # fmt: skip
        self.procs.append(proc)
        self.listens.append(listen)
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())
        return proc

    async def wait_logged(self, *texts: str, count: int = 1, timeout: float = 30.0) -> None:
        """Until the running agent's log (its last start's stderr) has `count` lines with
        every one of `texts`."""
        await wait_logged(self.logs[-1], *texts, count=count, timeout=timeout,
                          proc=self.procs[-1])  # fmt: skip

    async def exits(self, timeout: float = 60.0) -> int:
        return await exits(self.procs[-1], timeout)

    def reboots(self) -> int:
        return sum(1 for a in self.sim.actions() if a["kind"] == "reboot")

    def booted(self) -> str:
        return self.sim.status_document()["status"]["booted"]["image"]["imageDigest"]

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await stop_processes(self.procs)
        await self.close_server()
        for reader in self._readers:
            await asyncio.to_thread(reader.join, 10)

    # -- the canary check: no secret in anything the agent emitted ----------------------------
    def saw(self, where: str, value: Any) -> None:
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            self.seen.setdefault(where, set()).add(text)

    async def scrape(self, strict: bool = False) -> None:
        """The running agent's `/status` and `/metrics`, and the objects it writes."""
        try:
            for kind, objects in (await self.agent_objects()).items():
                for obj in objects:
                    self.saw(kind, obj)
        except Exception:
            if strict:
                raise
        running = [(p, a) for p, a in zip(self.procs, self.listens, strict=True)
                   if p.returncode is None]  # fmt: skip
        if not running:
            return
        proc, listen = running[-1]
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for path in ("/status", "/metrics"):
                try:
                    async with session.get(f"http://{listen}{path}") as resp:
                        self.saw(f"GET {path}", await resp.text())
                except aiohttp.ClientError:
                    if strict and proc.returncode is None:
                        raise

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            with contextlib.suppress(Exception):
                await self.scrape()

    async def wait_recorded(self, timeout: float = 30.0) -> None:
        """Until the agent recorded the config it runs: a scenario may end on annotations it
        seeded itself, before its first pass took the config (and the canaries) in hand."""
        record = self.sim.root / STATE_DIR / "current-config"
        with contextlib.suppress(TimeoutError):  # assert_no_secrets says so
            async with asyncio.timeout(timeout):
                while not record.exists() and self.procs and self.procs[-1].returncode is None:
                    await asyncio.sleep(0.1)

    def host_outputs(self) -> dict[str, bytes]:
        """The agent's logs and its files on the host (not its records of input, nor the
        files that hold the secrets on purpose)."""
        out = {str(path.relative_to(self.base)): path.read_bytes() for path in self.logs}
        state = self.sim.root / STATE_DIR
        for path in sorted(state.rglob("*")):
            if path.is_file() and not canary.is_input_record(path.name):
                out[str(path.relative_to(self.sim.root))] = path.read_bytes()
        actions = self.sim.base / "actions.log"
        if actions.exists():
            out["actions.log"] = actions.read_bytes()
        return out

    def assert_no_secrets(self) -> None:
        """No canary in anything the agent emitted; and the check is not blind: the agent had
        the canaries in hand (its record of the config it runs holds them), and logs, `/status`
        and `/metrics` were collected. (Whether the agent also wrote the pull secret and the
        hash depends on the scenario: only a first pass from no recorded config writes them.)"""
        outputs = self.host_outputs()
        canary.assert_no_canaries([
            *outputs.items(),
            *((where, text) for where, texts in self.seen.items() for text in texts),
        ])  # fmt: skip
        path = self.sim.root / STATE_DIR / "current-config"
        assert path.exists(), "the agent never recorded a config: the check would be blind"
        record = path.read_bytes()
        held = {f.what for f in canary.find("current-config", record)}
        wanted = {"base64 of the pull secret auth token"}
        if (json.loads(record)["spec"]["config"].get("passwd") or {}).get("users"):
            wanted.add("password hash")  # a config that leaves users alone has none
        assert wanted <= held, (
            f"the agent's current-config lacks the canaries (has {sorted(held)}): the check "
            "would be blind"
        )
        collected = {where for where, texts in self.seen.items() if texts}
        missing = {"GET /status", "GET /metrics", "Node"} - collected
        assert not missing, f"nothing collected from {sorted(missing)}"
        assert sum(len(outputs[str(p.relative_to(self.base))]) for p in self.logs) > 0, (
            "the agent logged nothing at debug level"
        )
        assert (self.sim.root / STATE_DIR / "journal.json").exists(), "no journal.json"


async def run_checked(h: Harness, run: Callable[[Harness], Awaitable[None]], turn: int = 0) -> None:
    """Run a scenario, collect what the agent emitted (while it and the server are up, then
    its logs once it stopped) and fail when any of it shows a canary secret. `turn` picks the
    log format of the first agent start (the scenario's index: both formats in every run)."""
    first = turn % len(LOG_FORMATS)
    h.log_formats = LOG_FORMATS[first:] + LOG_FORMATS[:first]
    try:
        await run(h)
        await h.wait_recorded()
        await h.scrape(strict=True)
    finally:
        await h.close()
    h.assert_no_secrets()
