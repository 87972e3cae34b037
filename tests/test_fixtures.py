"""Every upstream fixture (tests/fixtures, verbatim copies of ../shared/fixtures) has a
checked outcome: bootc status documents parse; MachineConfigs and Ignition configs parse and
plan; the Ignition 2.2 sample is refused with a clear reason; other kinds are named errors."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import pytest

from agent.core.plan import plan_update
from agent.errors import InputError
from agent.model.bootc_status import parse_bootc_status
from agent.model.document import load_document
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import empty_machine_config, parse_machine_config

FIXTURES = Path(__file__).parent / "fixtures"
BOOTC = sorted((FIXTURES / "bootc-status").glob("spec-*"))
D47 = "sha256:47e5ed613a970b6574bfa954ab25bb6e85656552899aa518b5961d9645102b38"
D73 = "sha256:736b359467c9437c1ac915acaae952aad854e07eb4a16a94999a48af08c83c34"
D16 = "sha256:16dc2b6256b4ff0d2ec18d2dbfb06d117904010c8cf9732cdb022818cf7a7566"
DB5 = "sha256:b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c"

EXPECTED_BOOTC = {
    # file: (booted digest, staged digest, rollback present, downloadOnly of staged)
    "spec-booted-pinned.yaml": (D47, None, False, None),
    "spec-booted-update-same-digest.yaml": (D47, None, False, None),
    "spec-booted-usroverlay.yaml": (D73, None, False, None),
    "spec-booted-with-update-no-version.yaml": (D47, None, False, None),
    "spec-booted-with-update.yaml": (D47, None, False, None),
    "spec-only-booted.yaml": (D47, None, False, None),
    "spec-ostree-remote.yaml": (DB5, None, False, None),
    "spec-ostree-to-bootc.yaml": (None, D47, False, False),
    "spec-rfe-ostree-deployment.yaml": (None, None, False, False),
    "spec-staged-booted.yaml": (D73, D16, False, False),
    "spec-staged-download-only.yaml": (D73, D16, False, True),
    "spec-staged-rollback.yaml": (None, D16, True, False),
    "spec-v1-null.json": (None, None, False, None),
    "spec-v1a1-orig.yaml": (D73, D16, False, False),
    "spec-v1a1.yaml": (DB5, None, False, None),
    "spec-via-local-oci.yaml": (D47, None, False, None),
}


def test_every_bootc_fixture_is_covered() -> None:
    assert {p.name for p in BOOTC} == set(EXPECTED_BOOTC)


@pytest.mark.parametrize("path", BOOTC, ids=lambda p: p.name)
def test_bootc_status_fixture(path: Path) -> None:
    host = parse_bootc_status(path.read_bytes())
    booted, staged, rollback, download_only = EXPECTED_BOOTC[path.name]
    assert host.booted_digest == booted
    assert host.staged_digest == staged
    assert (host.rollback is not None) == rollback
    assert (host.staged.download_only if host.staged else None) == download_only
    assert host.rollback_queued is False


@pytest.mark.parametrize("path", BOOTC, ids=lambda p: p.name)
def test_bootc_status_fixture_as_json(path: Path) -> None:
    """`--format json` emits the same documents as JSON: both forms parse the same."""
    as_json = json.dumps(load_document(path.read_bytes())).encode()
    assert parse_bootc_status(as_json) == parse_bootc_status(path.read_bytes())


def test_bootc_fixture_details() -> None:
    remote = parse_bootc_status((FIXTURES / "bootc-status/spec-ostree-remote.yaml").read_bytes())
    assert remote.spec_image == "quay.io/fedora/fedora-coreos:stable"
    pinned = parse_bootc_status((FIXTURES / "bootc-status/spec-booted-pinned.yaml").read_bytes())
    assert pinned.booted.pinned and len(pinned.other_deployments) == 1
    update = parse_bootc_status(
        (FIXTURES / "bootc-status/spec-booted-with-update.yaml").read_bytes()
    )
    assert update.booted.cached_update is not None
    assert update.booted.cached_update.digest != update.booted_digest
    rfe = parse_bootc_status(
        (FIXTURES / "bootc-status/spec-rfe-ostree-deployment.yaml").read_bytes()
    )
    assert rfe.staged.incompatible and rfe.staged.image is None


def test_bootc_schema_lists_fields_we_read() -> None:
    schema = json.loads((FIXTURES / "bootc-status/host-v1.schema.json").read_text())
    entry = schema["$defs"]["BootEntry"]["properties"]
    for name in ("image", "cachedUpdate", "incompatible", "pinned", "softRebootCapable",
                 "downloadOnly"):  # fmt: skip
        assert name in entry
    status = schema["$defs"]["HostStatus"]["properties"]
    assert {"staged", "booted", "rollback", "rollbackQueued"} <= set(status)


@pytest.mark.parametrize(
    "name",
    [
        "controller_common_fixtures_ign_config.json",
        "controller_common_fixtures_compressed_ign_config.json.gz",
        "controller_common_fixtures_compressed_and_encoded_ign_config.json.gz",
    ],
)
def test_ignition_fixtures_plain_gzip_base64(name: str) -> None:
    mc = parse_machine_config((FIXTURES / "mco" / name).read_bytes(), "fixture")
    entry = mc.ignition.files["/etc/hello-worker"]
    assert (entry.contents, entry.mode, entry.user.name) == (b"hello world\n", 0o644, "root")
    plan = plan_update(empty_machine_config("old"), mc, booted=None, target=None)
    assert plan.verdict == "refused"
    assert plan.image_changes == ("files",)
    assert any("need an image build" in r for r in plan.reasons)


def test_ssh_machineconfig_fixture_is_live() -> None:
    path = (
        FIXTURES
        / "mco/controller_bootstrap_testdata_bootstrap_99_openshift-machineconfig_worker.yaml"
    )
    mc = parse_machine_config(path.read_bytes())
    assert mc.name == "99-worker-ssh" and mc.os_image_url is None
    plan = plan_update(empty_machine_config("old"), mc, booted=None, target=None)
    assert plan.verdict == "live"
    assert [s.path for s in plan.live] == ["/home/core/.ssh/authorized_keys.d/ignition"]
    assert plan.live[0].contents == b"ssh-rsa SSH-AUTHORIZED-KEY\n"
    assert not plan.reboot and not plan.drain


def test_ignition_2_2_fixture_is_refused_with_a_reason() -> None:
    mc = parse_machine_config(
        (FIXTURES / "mco/server_testdata_machine-configs_test-config.yaml").read_bytes()
    )
    assert mc.ignition.version == "2.2.0" and not mc.ignition.supported
    assert mc.os_image_url == f"registry.example.com/oscontainer@{DB5}"
    plan = plan_update(
        empty_machine_config("rendered-worker-0"), mc, booted=None,
        target=parse_image_ref(mc.os_image_url),
    )  # fmt: skip
    assert plan.verdict == "refused"
    assert plan.reasons == (
        "can't reconcile config rendered-worker-0 with test-config: ignition version 2.2.0 is "
        "not supported: image mode accepts Ignition spec 3.0-3.5 only (spec 2 configs must be "
        "converted to spec 3)",
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("controller_bootstrap_testdata_bootstrap_layered-worker.machineosconfig.yaml",
         "MachineOSConfig"),
        ("controller_bootstrap_testdata_bootstrap_machineconfigcontroller-controllerconfig.yaml",
         "ControllerConfig"),
        ("controller_bootstrap_testdata_bootstrap_worker.machineconfigpool.yaml",
         "MachineConfigPool"),
        ("server_testdata_controller-config_machine-config-controller.yaml", "ControllerConfig"),
    ],
)  # fmt: skip
def test_other_kinds_are_named_errors(name: str, kind: str) -> None:
    with pytest.raises(InputError) as info:
        parse_machine_config((FIXTURES / "mco" / name).read_bytes())
    assert info.value.field == "kind"
    assert info.value.message == f"not a MachineConfig (kind '{kind}')"


def test_every_mco_fixture_is_covered() -> None:
    names = {p.name for p in (FIXTURES / "mco").iterdir()}
    covered = {
        "controller_common_fixtures_ign_config.json",
        "controller_common_fixtures_compressed_ign_config.json.gz",
        "controller_common_fixtures_compressed_and_encoded_ign_config.json.gz",
        "controller_bootstrap_testdata_bootstrap_99_openshift-machineconfig_worker.yaml",
        "server_testdata_machine-configs_test-config.yaml",
        "controller_bootstrap_testdata_bootstrap_layered-worker.machineosconfig.yaml",
        "controller_bootstrap_testdata_bootstrap_machineconfigcontroller-controllerconfig.yaml",
        "controller_bootstrap_testdata_bootstrap_worker.machineconfigpool.yaml",
        "server_testdata_controller-config_machine-config-controller.yaml",
    }
    assert names == covered


def _digests(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_fixtures_are_verbatim_upstream_copies() -> None:
    """tests/fixtures holds exactly the files recorded in tests/fixtures.sha256 (taken from
    ../shared/fixtures), byte for byte; and when ../shared is beside the clone, as in CI, the
    record matches it too. A clone elsewhere checks the record only, and says so."""
    lines = (FIXTURES.parent / "fixtures.sha256").read_text().splitlines()
    recorded = {name: digest for digest, name in (line.split("  ", 1) for line in lines)}
    assert _digests(FIXTURES) == recorded
    shared = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
    if shared.is_dir():
        assert _digests(shared) == recorded, f"{shared} differs from tests/fixtures.sha256"
    else:
        warnings.warn(f"{shared} is absent: tests/fixtures was checked against "
                      "tests/fixtures.sha256 only", stacklevel=1)  # fmt: skip
