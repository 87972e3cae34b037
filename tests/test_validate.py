"""On-disk validation, the pure part (agent/core/validate.py; docs/mco-protocol.md §10): what a
config makes the host hold, and each kind of difference worded as the MCD words it
(on_disk_validation.go)."""

from __future__ import annotations

import stat

import pytest

from agent.core.policy import (
    BOOTC_AUTH,
    BUILTIN_POLICY,
    KUBELET_CA,
    PULL_SECRET,
    SSH_KEYS_PATH,
    USER_CA_BUNDLE,
)
from agent.core.validate import (
    FileFacts,
    HostFacts,
    drift_reason,
    expectations,
    findings,
)
from agent.model.etc_drift import EtcChange
from agent.model.ignition import Owner
from agent.model.machineconfig import machine_config_from_object
from tests.builders import DIGEST_A, DIGEST_B, IMAGE_A, ign_file, machine_config

REG = stat.S_IFREG
SECRET = '{"auths": {"quay.example": {"auth": "c2VjcmV0"}}}'


def config():
    return machine_config_from_object(machine_config(
        keys=["ssh-ed25519 AAAA-one", "ssh-rsa BBBB-two"],
        files=[ign_file(PULL_SECRET, SECRET, 0o600), ign_file(USER_CA_BUNDLE, "CA\n"),
               ign_file(KUBELET_CA, "kubelet CA\n"), ign_file("/etc/motd", "image content\n")],
        units=[{"name": "kubelet.service", "enabled": True},
               {"name": "debug.service", "enabled": False},
               {"name": "telemetry.service", "mask": True}],
    ))  # fmt: skip


def good_facts(expected, **changes):
    files = {f.path: FileFacts(REG | f.mode, *owner(f), f.contents) for f in expected.files}
    facts = dict(
        files=files,
        file_errors={},
        owners={f.path: owner(f) for f in expected.files},
        units={"kubelet.service": "enabled", "debug.service": "disabled",
               "telemetry.service": "masked"},
        booted_digest=DIGEST_A,
        booted_image=IMAGE_A,
        etc_changes=(),
    )  # fmt: skip
    facts.update(changes)
    return HostFacts(**facts)


def owner(expected_file):
    return (1000, 1000) if expected_file.user == Owner(name="core") else (0, 0)


def test_the_config_expects_its_live_files_units_and_image_and_nothing_else() -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    by_path = {f.path: f for f in expected.files}
    # the live part; never the image's /etc/motd, the cert writer's CA, or bootc's copy of
    # the pull secret in /run (a tmpfs, gone at every boot)
    assert sorted(by_path) == sorted([PULL_SECRET, USER_CA_BUNDLE, SSH_KEYS_PATH])
    assert by_path[SSH_KEYS_PATH].contents == b"ssh-ed25519 AAAA-one\nssh-rsa BBBB-two\n"
    assert (by_path[SSH_KEYS_PATH].mode, by_path[SSH_KEYS_PATH].user) == (0o600, Owner(name="core"))
    assert by_path[PULL_SECRET].mode == 0o600 and by_path[PULL_SECRET].contents == SECRET.encode()
    assert BOOTC_AUTH not in by_path
    assert [(u.name, u.enabled, u.masked) for u in expected.units] == [
        ("kubelet.service", True, False), ("debug.service", False, False),
        ("telemetry.service", None, True)]  # fmt: skip
    assert findings(expected, good_facts(expected)) == ()


def test_each_kind_of_difference_is_worded_as_the_mcd_words_it() -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    ssh = next(f for f in expected.files if f.path == SSH_KEYS_PATH)
    cases = {
        "content": ({SSH_KEYS_PATH: FileFacts(REG | 0o600, 1000, 1000, b"ssh-ed25519 X\n")},
                    f'content mismatch for file "{SSH_KEYS_PATH}"'),
        "mode": ({SSH_KEYS_PATH: FileFacts(REG | 0o644, 1000, 1000, ssh.contents)},
                 f'mode mismatch for file: "{SSH_KEYS_PATH}"; expected: -rw-------/384/0600; '
                 "received: -rw-r--r--/420/0644"),
        "owner": ({SSH_KEYS_PATH: FileFacts(REG | 0o600, 0, 0, ssh.contents)},
                  f'owner mismatch for file "{SSH_KEYS_PATH}"; expected: 1000:1000; received: 0:0'),
        "deleted": ({SSH_KEYS_PATH: None},
                    f'could not stat file "{SSH_KEYS_PATH}": lstat {SSH_KEYS_PATH}: no such file '
                    "or directory"),
        "symlink": ({SSH_KEYS_PATH: FileFacts(stat.S_IFLNK | 0o777, 0, 0)},
                    f'mode mismatch for file: "{SSH_KEYS_PATH}"; expected: -rw-------/384/0600; '
                    "received: lrwxrwxrwx/511/0777"),
    }  # fmt: skip
    good = good_facts(expected)
    for name, (files, text) in cases.items():
        facts = good_facts(expected, files={**good.files, **files})
        (found,) = findings(expected, facts)
        assert (found.kind, found.path, found.text) == ("file", SSH_KEYS_PATH, text), name
        assert b"AAAA" not in found.text.encode()  # never the contents


@pytest.mark.parametrize(
    ("unit", "state", "text"),
    [
        ("kubelet.service", "disabled",
         'unit "kubelet.service" expected enabled=true, but systemd reports "disabled"'),
        ("kubelet.service", "not-found",
         'unit "kubelet.service" expected enabled=true, but systemd reports "not-found"'),
        ("debug.service", "enabled",
         'unit "debug.service" expected enabled=false, but systemd reports "enabled"'),
        ("debug.service", "enabled-runtime",
         'unit "debug.service" expected enabled=false, but systemd reports "enabled-runtime"'),
        ("telemetry.service", "disabled",
         'state validation: invalid unit masked setting. path: '
         '"/etc/systemd/system/telemetry.service"; expected: /dev/null; received: disabled'),
    ],
)  # fmt: skip
def test_a_unit_in_another_state_than_the_config_says(unit: str, state: str, text: str) -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    good = good_facts(expected)
    facts = good_facts(expected, units={**good.units, unit: state})
    assert [(f.kind, f.path, f.text) for f in findings(expected, facts)] == [("unit", unit, text)]


@pytest.mark.parametrize(
    ("unit", "state"),
    [("kubelet.service", "static"), ("kubelet.service", "indirect"),
     ("debug.service", "static"), ("debug.service", "masked")],
)  # fmt: skip
def test_states_the_mcd_accepts_are_accepted(unit: str, state: str) -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    good = good_facts(expected)
    assert findings(expected, good_facts(expected, units={**good.units, unit: state})) == ()


def test_another_booted_image_and_the_images_own_etc_files() -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    other = f"quay.example/os/node@{DIGEST_B}"
    changes = (EtcChange("M", "/etc/motd"), EtcChange("D", "/etc/chrony.conf"),
               EtcChange("A", "/etc/local.conf"), EtcChange("M", "/etc/passwd"),
               EtcChange("M", USER_CA_BUNDLE), EtcChange("M", KUBELET_CA))  # fmt: skip
    facts = good_facts(expected, booted_digest=DIGEST_B, booted_image=other, etc_changes=changes)
    found = findings(expected, facts)
    assert [(f.kind, f.path) for f in found] == [
        ("image", IMAGE_A), ("etc", "/etc/motd"), ("etc", "/etc/chrony.conf")]  # fmt: skip
    assert found[0].text == f'expected target osImageURL "{IMAGE_A}", have "{other}"'
    # added files are the host's own; /etc/passwd and the live-managed paths are not the
    # image's business
    assert "/etc/local.conf" not in {f.path for f in found}


def test_nothing_recorded_is_nothing_compared() -> None:
    expected = expectations(config(), BUILTIN_POLICY, None, None)
    facts = good_facts(expected, booted_digest=DIGEST_B, etc_changes=None)
    assert findings(expected, facts) == ()


def test_a_file_that_cannot_be_inspected_is_a_finding_naming_why() -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    why = "refusing /home/core/.ssh: /home/core/.ssh is a symlink or not a directory"
    facts = good_facts(expected, file_errors={SSH_KEYS_PATH: why})
    (found,) = findings(expected, facts)
    assert found.text == f'could not stat file "{SSH_KEYS_PATH}": {why}'


def test_the_reason_names_the_config_and_the_first_findings() -> None:
    expected = expectations(config(), BUILTIN_POLICY, IMAGE_A, DIGEST_A)
    facts = good_facts(expected, files={}, etc_changes=(EtcChange("M", "/etc/motd"),))
    found = findings(expected, facts)
    reason = drift_reason("rendered-worker-1", found)
    assert reason.startswith("unexpected on-disk state validating against rendered-worker-1: ")
    assert reason.endswith(f" (and {len(found) - 3} more)")
    assert reason.count("could not stat file") == 3
