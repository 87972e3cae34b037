"""The canary secrets (tests/secrets_canary.py) and the collectors that look for them: what
counts as shown, that the configs carry them in a form the agent takes, and that a leak in any
channel the cluster harness collects fails the check, naming where."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from urllib.parse import quote

import pytest

from agent.core.plan import plan_update
from agent.model.dataurl import decode_data_url
from agent.model.machineconfig import parse_machine_config
from tests import secrets_canary as canary
from tests.builders import machine_config
from tests.scenarios.fake import FakeHarness
from tests.scenarios.harness import LOG_FORMATS, Harness, P, run_checked


def test_the_secrets_carry_their_markers() -> None:
    assert canary.REGISTRY_PASSWORD_MARKER in canary.REGISTRY_PASSWORD
    assert canary.PASSWORD_HASH.startswith(f"$6${canary.PASSWORD_HASH_MARKER}$")
    user, _, password = base64.b64decode(canary.AUTH_TOKEN).decode().partition(":")
    assert (user, password) == (canary.REGISTRY_USER, canary.REGISTRY_PASSWORD)
    secret = json.loads(canary.pull_secret("127.0.0.1:5000"))
    assert secret == {"auths": {"127.0.0.1:5000": {"auth": canary.AUTH_TOKEN,
                                                   "email": "puller@example.com"}}}  # fmt: skip


@pytest.mark.parametrize(
    "shown",
    [
        pytest.param(f"reason: bad password {canary.REGISTRY_PASSWORD}", id="raw-password"),
        pytest.param(canary.REGISTRY_PASSWORD_MARKER.upper(), id="marker-any-case"),
        pytest.param(f'{{"auth": "{canary.AUTH_TOKEN}"}}', id="auth-token"),
        pytest.param(canary.AUTH_TOKEN.rstrip("="), id="auth-token-unpadded"),
        pytest.param(f"core:{canary.PASSWORD_HASH}:19000::::::", id="shadow-line"),
        pytest.param(canary.pull_secret_file()["contents"]["source"], id="data-url"),
        pytest.param(quote(canary.pull_secret()), id="percent-encoded"),
        pytest.param(base64.b64encode(f"x{canary.pull_secret()}".encode()), id="base64-shifted"),
        pytest.param(base64.urlsafe_b64encode(canary.PASSWORD_HASH.encode()), id="base64url"),
        pytest.param(base64.b64encode(canary.AUTH_TOKEN.encode()), id="token-twice-encoded"),
        pytest.param(repr(canary.pull_secret().encode()), id="bytes-repr"),
    ],
)
def test_every_form_of_a_secret_is_found(shown: str | bytes) -> None:
    findings = canary.scan({"somewhere": shown})
    assert findings and {f.where for f in findings} == {"somewhere"}
    with pytest.raises(AssertionError, match="shown in 1 place"):
        canary.assert_no_canaries([("somewhere", shown)])


@pytest.mark.parametrize(
    "clean",
    [
        "update to rendered-worker-2: live (write /var/lib/kubelet/config.json, write "
        "/run/ostree/auth.json, write /etc/shadow)",
        "quay.example/os/node@sha256:" + "a" * 64,
        base64.b64encode(b"ssh-ed25519 AAAA-one\n" * 20).decode(),
        "canary",  # the word alone is no marker
    ],
)
def test_what_the_agent_may_say_is_not_a_finding(clean: str) -> None:
    canary.assert_no_canaries({"log": clean})


def test_the_report_names_each_place_and_form() -> None:
    findings = canary.scan([("Event", canary.REGISTRY_PASSWORD), ("GET /status", "clean"),
                            ("agent-0.json.log", canary.PASSWORD_HASH)])  # fmt: skip
    text = canary.report(findings)
    assert text.startswith("a canary secret was shown in 2 place(s): Event, agent-0.json.log")
    assert "Event: registry password in" in text and "agent-0.json.log: password hash in" in text


def test_configs_with_canaries_are_configs_the_agent_takes() -> None:
    """The pull secret is a base64 data URL the agent decodes; core gets the hash; a config that
    leaves users alone still does (the canary must not change what a scenario means); a
    scenario's own pull secret or hash is kept."""
    doc = canary.with_canary_secrets(machine_config(keys=["ssh-ed25519 AAAA"]), "reg:5000")
    mc = parse_machine_config(json.dumps(doc).encode())
    entry = mc.ignition.files[canary.PULL_SECRET_PATH]
    assert json.loads(entry.contents)["auths"]["reg:5000"]["auth"] == canary.AUTH_TOKEN
    assert entry.mode == 0o600
    assert mc.ignition.users[0].password_hash == canary.PASSWORD_HASH
    plan = plan_update(None, mc, booted=None, target=None)  # a first start writes them all
    assert {s.path for s in plan.live} >= {canary.PULL_SECRET_PATH, "/run/ostree/auth.json",
                                           "/etc/shadow"}  # fmt: skip
    assert all(
        s.secret for s in plan.live if s.path != "/home/core/.ssh/authorized_keys.d/ignition"
    )

    no_users = canary.with_canary_secrets(machine_config())
    assert "passwd" not in no_users["spec"]["config"]
    own = machine_config(users=[{"name": "core", "passwordHash": "$6$own$x"}],
                         files=[{"path": canary.PULL_SECRET_PATH,
                                 "contents": {"source": "data:,{}"}}])  # fmt: skip
    kept = canary.with_canary_secrets(own)["spec"]["config"]
    assert kept["passwd"]["users"][0]["passwordHash"] == "$6$own$x"
    assert [decode_data_url(f["contents"]["source"]) for f in kept["storage"]["files"]] == [b"{}"]


def test_input_records_are_the_config_documents_only() -> None:
    for name in ("current-config", "pending-config", ".current-config.tmp"):
        assert canary.is_input_record(name)
    for name in ("journal.json", "status.json", ".journal.json.tmp", "current-config.bak"):
        assert not canary.is_input_record(name)


async def update_naming_the_marker(h: Harness) -> None:
    """A deliberate leak through the real agent: a config whose name holds the (lower-cased)
    marker. The agent names its config everywhere: so into every channel the harness collects."""
    await h.start_agent()
    await h.wait_annotations(lambda a: a.get(P + "reason") == "", what="first Done")
    leaky = f"rendered-{canary.REGISTRY_PASSWORD_MARKER.lower()}"
    await h.add_config(leaky, "v1", keys=["ssh-ed25519 AAAA-two"])
    await h.set_desired(leaky)
    await h.wait_done(leaky)


@pytest.mark.parametrize("turn", range(len(LOG_FORMATS)), ids=LOG_FORMATS)
async def test_the_cluster_collector_catches_a_leak_in_every_channel(
    turn: int, tmp_path: Path
) -> None:
    harness = await FakeHarness.create(tmp_path)
    with pytest.raises(AssertionError) as failed:
        await run_checked(harness, update_naming_the_marker, turn=turn)
    message = str(failed.value)
    assert message.startswith("a canary secret was shown in"), message
    places = message.splitlines()[0].split(": ", 1)[1].split(", ")
    log = f"agent-0.{LOG_FORMATS[turn]}.log"
    channels = {"Node", "Event", "MachineConfigNode", "GET /status", "GET /metrics", log,
                "var/lib/image-mode-agent/journal.json"}  # fmt: skip
    assert channels <= set(places), places
    assert "registry password marker" in message


class StoppedMachine:
    """What tests/system/secrets.py reads of a machine that is no longer running: its disk
    (a directory), its console logs and its journal (entries as `journalctl -o json` gives)."""

    running = False

    def __init__(self, workdir: Path, entries: list[dict[str, object]]) -> None:
        self.workdir, self.root, self.entries = workdir, workdir / "root", entries

    def path(self, guest_path: str) -> Path:
        return self.root / guest_path.lstrip("/")

    def read(self, guest_path: str) -> str | None:
        path = self.path(guest_path)
        return path.read_text() if path.exists() else None

    def journal(self, *args: str) -> list[dict[str, object]]:
        return self.entries

    def put(self, guest_path: str, text: str) -> None:
        self.path(guest_path).parent.mkdir(parents=True, exist_ok=True)
        self.path(guest_path).write_text(text)


def test_the_system_collector_names_each_leak_and_skips_the_input_records(tmp_path: Path) -> None:
    """A journald field (binary, as journalctl gives it), journal.json; not current-config,
    the pull secret or /etc/shadow, which hold the secrets on purpose."""
    from tests.system import secrets

    unit = "image-mode-agent.service"
    leaky_field = list(f"bad hash {canary.PASSWORD_HASH}\x01".encode())
    entries = [
        {"_SYSTEMD_UNIT": unit, "MESSAGE": "reconciled", "STATE": "Done"},
        {"_SYSTEMD_UNIT": unit, "MESSAGE": "live write", "REASON": leaky_field},
        {"_SYSTEMD_UNIT": "other.service", "MESSAGE": canary.REGISTRY_PASSWORD},  # not ours
    ]
    m = StoppedMachine(tmp_path, entries)
    m.put("/var/lib/image-mode-agent/journal.json", json.dumps({"cause": canary.AUTH_TOKEN}))
    m.put("/var/lib/image-mode-agent/status.json", '{"state": "Done"}')
    m.put("/var/lib/image-mode-agent/current-config", canary.pull_secret())
    m.put(canary.PULL_SECRET_PATH, canary.pull_secret())
    m.put("/etc/shadow", f"core:{canary.PASSWORD_HASH}:1::::::\n")
    (tmp_path / "console-1.log").write_text("booted\n")
    text = secrets.check(m)  # type: ignore[arg-type]
    assert text is not None
    first = text.splitlines()[0]
    assert first.endswith(
        "shown in 2 place(s): /var/lib/image-mode-agent/journal.json, journal of " + unit
    ), text
    assert "journal of image-mode-agent.service: password hash in" in text
    assert "incomplete" not in text

    # Clean, but blind: no entries of the agent's unit, and the canaries never reached the disk.
    blind = StoppedMachine(tmp_path / "blind", [])
    blind.put("/var/lib/image-mode-agent/journal.json", "{}")
    text = secrets.check(blind)  # type: ignore[arg-type]
    assert text is not None and text.startswith("secrets check incomplete: no journal entries")
    assert "never reached /var/lib/kubelet/config.json" in text
    assert secrets.check(blind, require_complete=False) is None


def test_the_system_collector_finds_the_agents_listen_address(tmp_path: Path) -> None:
    from tests.system import secrets

    m = StoppedMachine(tmp_path, [])
    assert secrets.listen_address(m) == "127.0.0.1:8797"  # type: ignore[arg-type]
    args = "--source file:/etc/image-mode-agent/desired.yaml --host local"
    m.put("/etc/image-mode-agent/agent.env", f'IMAGE_MODE_AGENT_ARGS="{args}"\n')
    assert secrets.listen_address(m) == "127.0.0.1:8797"  # type: ignore[arg-type]
    m.put("/etc/image-mode-agent/agent.env", f'IMAGE_MODE_AGENT_ARGS="{args} --listen :9"\n')
    assert secrets.listen_address(m) == ":9"  # type: ignore[arg-type]


# A YAML constructor's error quotes the scalar it could not read: only its type may be named.
MISTAGGED = f"auth: !!int {canary.REGISTRY_PASSWORD}\n".encode()


def test_a_mistagged_secret_in_a_desired_state_is_not_quoted() -> None:
    from agent.errors import InputError
    from agent.model.document import load_document

    with pytest.raises(InputError) as err:
        load_document(MISTAGGED)
    canary.assert_no_canaries({"the desired state's error": str(err.value)})


def test_a_mistagged_token_in_a_kubeconfig_is_not_quoted() -> None:
    from agent.cluster.kubeconfig import certificate_authority
    from agent.errors import InputError

    with pytest.raises(InputError) as err:
        certificate_authority(b"users:\n- user: {token: " + MISTAGGED[6:-1] + b"}\n", "x")
    canary.assert_no_canaries({"the kubeconfig's error": str(err.value)})
