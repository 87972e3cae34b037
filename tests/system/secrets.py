"""The secrets check of the system tier (no secret's contents may show in a log, an event or a
reason). Every agent scenario's desired state carries the canary secrets of
tests/secrets_canary.py (`World.set_desired`: the pull secret with the auth registry's real
credentials, core's password hash); after the scenario, before its machine is destroyed,
`check` collects everything the agent emitted and names every place a canary shows up:

- the journal of the agent's units (image-mode-agent.service, image-mode-agent-verify.service
  and the staging unit the agent starts, image-mode-agent-stage.service), every entry with all
  its fields (`journalctl -o json`: MESSAGE and the agent's own STATE, REASON, PATH...), and
  systemd's own entries about those units; their `StatusText`;
- every file under /var/lib/image-mode-agent (journal.json, status.json) and
  /run/image-mode-agent (the staging unit's stderr and progress), read inside the machine;
- `/status` and `/metrics` from the agent's `--listen` address (agent.env), fetched inside the
  machine while the agent runs;
- the machine's console (`console-<boot>.log`).

Not scanned, because they hold the secrets on purpose: the pull secret
(/var/lib/kubelet/config.json) and its mirror (/run/ostree/auth.json), /etc/shadow, the
desired.yaml the harness wrote, and the agent's records of its input in its state dir
(`current-config`, `pending-config`: the MachineConfig documents verbatim, 0600, as the MCD
keeps its on-disk config). journal.json and status.json are output and must be secret-free.

The check is not blind: it fails when the canaries never reached the machine (the agent's
first pass writes the pull secret and the hash), when the agent's unit has no journal entries,
or when the running agent's endpoints do not answer."""

from __future__ import annotations

import base64
import json
import shlex
import time
import traceback

from tests import secrets_canary as canary
from tests.system.machine import Machine, MachineError
from tests.system.world import AGENT_ENV, AGENT_STATE, AGENT_UNIT, VERIFY_UNIT

STAGE_UNIT = "image-mode-agent-stage.service"
AGENT_UNITS = (AGENT_UNIT, VERIFY_UNIT, STAGE_UNIT)
OUTPUT_DIRS = (AGENT_STATE, "/run/image-mode-agent")
DEFAULT_LISTEN = "127.0.0.1:8797"
_UNIT_FIELDS = ("_SYSTEMD_UNIT", "UNIT", "OBJECT_SYSTEMD_UNIT", "USER_UNIT")

# Run inside the machine (its python3): files as base64, endpoints as text, as JSON.
_READ_FILES = """
import base64, json, os, sys
out = {}
for top in sys.argv[1:]:
    for folder, _, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as f:
                    out[path] = base64.b64encode(f.read()).decode()
            except OSError as exc:
                out[path] = None
print(json.dumps(out))
"""
_FETCH = """
import json, sys, urllib.request
out = {}
for path in ("/status", "/metrics"):
    try:
        with urllib.request.urlopen("http://" + sys.argv[1] + path, timeout=5) as r:
            out[path] = r.read().decode("utf-8", "replace")
    except Exception as exc:
        out[path] = None
print(json.dumps(out))
"""


def _field_text(value: object) -> str:
    """A journal field as text: journalctl -o json gives binary values as byte arrays."""
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list):
        return " ".join(_field_text(v) for v in value)
    return str(value)


def _in_machine(m: Machine, code: str, *args: str) -> dict:
    command = " ".join(shlex.quote(a) for a in ("python3", "-c", code, *args))
    return json.loads(m.sh(command, timeout=30).stdout)


def listen_address(m: Machine) -> str:
    """The agent's --listen from agent.env (the default when it names none; '' = off)."""
    env = m.read(AGENT_ENV) or ""
    for line in env.splitlines():
        if line.startswith("IMAGE_MODE_AGENT_ARGS="):
            value = shlex.split(line.partition("=")[2])  # the quoted value, unquoted
            args = shlex.split(value[0]) if value else []
            for i, arg in enumerate(args):
                if arg == "--listen" and i + 1 < len(args):
                    return args[i + 1]
                if arg.startswith("--listen="):
                    return arg.partition("=")[2]
    return DEFAULT_LISTEN


def journal(m: Machine) -> dict[str, str]:
    """The agent units' journal entries, all fields, one JSON line each, by unit."""
    if m.running:
        m.sh("journalctl --sync", check=False)
    out: dict[str, list[str]] = {}
    for entry in m.journal():
        fields = {k: _field_text(v) for k, v in entry.items()}
        units = {fields.get(f) for f in _UNIT_FIELDS} & set(AGENT_UNITS)
        if not units and fields.get("SYSLOG_IDENTIFIER", "").startswith("image-mode-agent"):
            units = {"image-mode-agent (syslog identifier)"}
        for unit in units:
            out.setdefault(f"journal of {unit}", []).append(json.dumps(fields, sort_keys=True))
    return {where: "\n".join(lines) for where, lines in out.items()}


def output_files(m: Machine) -> dict[str, bytes]:
    """The agent's output files (not its input records), read inside the machine: /run is the
    container's own tmpfs. A stopped machine: /var/lib through the overlay, /run is gone."""
    if m.running:
        found = _in_machine(m, _READ_FILES, *OUTPUT_DIRS)
        files = {path: base64.b64decode(data) for path, data in found.items() if data is not None}
    else:
        root = m.path(AGENT_STATE)
        files = {
            f"/{p.relative_to(m.root)}": p.read_bytes() for p in root.rglob("*") if p.is_file()
        }
    return {path: data for path, data in files.items()
            if not canary.is_input_record(path.rsplit("/", 1)[-1])}  # fmt: skip


def agent_active(m: Machine) -> bool:
    state = m.sh(f"systemctl is-active {AGENT_UNIT}", check=False).stdout.strip()
    return state == "active"


def endpoints(m: Machine, listen: str, wait: float = 15) -> dict[str, str]:
    """/status and /metrics of the running agent (retried while it starts or restarts)."""
    deadline = time.monotonic() + wait
    got: dict[str, str] = {}
    while True:
        fetched = _in_machine(m, _FETCH, listen)
        got.update({f"GET {path}": text for path, text in fetched.items() if text is not None})
        if len(got) == 2 or time.monotonic() > deadline:
            return got
        time.sleep(1)


def collect(m: Machine) -> tuple[dict[str, str | bytes], list[str]]:
    """(where -> what the agent emitted there, what could not be collected and should be)."""
    sources: dict[str, str | bytes] = {}
    gaps: list[str] = []
    units = journal(m)
    sources.update(units)
    if f"journal of {AGENT_UNIT}" not in units:
        gaps.append(f"no journal entries of {AGENT_UNIT}")
    files = output_files(m)
    sources.update(files)
    if f"{AGENT_STATE}/journal.json" not in files:
        gaps.append(f"no {AGENT_STATE}/journal.json")
    for console in sorted(m.workdir.glob("console-*.log")):
        sources[console.name] = console.read_bytes()
    if m.running:
        show = "systemctl show -p StatusText -p StatusErrno -p Result"
        for unit in AGENT_UNITS:
            sources[f"systemctl show {unit}"] = m.sh(f"{show} {unit}", check=False).stdout
        listen = listen_address(m)
        if listen and agent_active(m):
            answered = endpoints(m, listen)
            sources.update(answered)
            if len(answered) < 2:
                gaps.append(f"the running agent did not answer /status and /metrics on {listen}")
    return sources, gaps


def reached(m: Machine) -> list[str]:
    """Gaps when the canaries never reached the machine: then nothing could leak them."""
    gaps = []
    secret = m.read(canary.PULL_SECRET_PATH) or ""
    if canary.AUTH_TOKEN not in secret:
        gaps.append(f"the canary pull secret never reached {canary.PULL_SECRET_PATH}")
    if canary.PASSWORD_HASH not in (m.read("/etc/shadow") or ""):
        gaps.append("the canary password hash never reached /etc/shadow")
    return gaps


def check(m: Machine, require_complete: bool = True) -> str | None:
    """None when nothing the agent emitted shows a canary (and, with `require_complete`, the
    collection was complete); else what was found where, and what could not be collected."""
    try:
        sources, gaps = collect(m)
        gaps += reached(m)
    except (MachineError, OSError, ValueError):
        if not require_complete:
            return None
        return "secrets check: collection failed:\n" + traceback.format_exc(limit=3)
    problems = []
    findings = canary.scan(sources)
    if findings:
        problems.append("secrets check: " + canary.report(findings))
    if gaps and require_complete:
        problems.append("secrets check incomplete: " + "; ".join(gaps))
    return "\n".join(problems) or None
