"""The agent's first start on a node as provisioning leaves it: the real machine-config-
controller's rendered worker config (tests/fixtures/mcc-rendered/: 45 files, 26 units, among
them the regular file /etc/docker/certs.d/.create, units enabled with no contents, units with
drop-ins only) served by the machine-config-server and laid out by Ignition
(tests/scenarios/mcd_node.py `provision`), the host booted on the config's osImageURL. The
agent replaces the MCD: it must find the host as the config says, go Done with no reboot and
no file written outside its own state, as on a node taken over from the MCD
(tests/test_takeover.py), in cluster mode and in file mode, and keep the certificate writer's
files right when the ControllerConfig changes afterwards.

"Its own state": /var/lib/image-mode-agent (`STATE_DIR`, left out of `snapshot`), and
`RECORDS`, each checked for what it holds: the MCD's on-disk config (currentconfig,
currentimage), which the MCD's own first start writes too, where it finds the booted image as
the config says (`checkStateOnFirstRun`, bootstrapping); and bootc's copy of the pull secret in
/run/ostree/auth.json, the one path bootc reads it from, on a tmpfs that every boot empties.
Everything else under the host's root is compared entry by entry (type, mode, owner, size,
inode, times, contents), so a file rewritten with the same bytes counts as a write."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.core.policy import CERTS_DIR, PULL_SECRET, SSH_KEYS_PATH, Allowlist
from agent.model.machineconfig import machine_config_from_object
from agent.model.mcd_disk import on_disk_config
from agent.update.validator import Validator
from standins.demo.loopback import SA_RULES, SCOPED_SA_RULES, Cluster, P, make_host
from standins.host.simulated import SimulatedHost
from standins.host.unit_files import unit_file_state
from standins.kube import FakeKube
from tests.fixtures_paths import MCC_CONTROLLER_CONFIG, MCC_RENDERED_WORKER
from tests.scenarios.harness import exits, logged, until, wait_logged
from tests.scenarios.mcd_node import (
    NODE_ANNOTATIONS,
    OS_UNITS,
    STATE_DIR,
    NotProvisionable,
    changed,
    entry,
    image_units,
    lay_ignition,
    provision,
    snapshot,
)
from tests.scenarios.pool import provision_hosts
from tests.scenarios.standin import StandInCluster

pytestmark = pytest.mark.asyncio
LAST_SYNCED_CC = P + "lastSyncedControllerConfigResourceVersion"
BOOTC_AUTH = "run/ostree/auth.json"
RECORDS = ("etc/machine-config-daemon/currentconfig", "etc/machine-config-daemon/currentimage",
           "run", "run/ostree", BOOTC_AUTH)  # fmt: skip
CREATE = CERTS_DIR + ".create"  # Ignition's placeholder, a regular file (0600)


def fixtures() -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(MCC_RENDERED_WORKER.read_text()), json.loads(
        MCC_CONTROLLER_CONFIG.read_text()
    )


def provisioned_host(base: Path, rendered: dict[str, Any], cc: dict[str, Any]) -> SimulatedHost:
    """A host booted on the rendered config's osImageURL, its image shipping the units the
    config enables without contents, laid out from the served config."""
    sim = SimulatedHost.create(base / "host", rendered["spec"]["osImageURL"], image_units(rendered))
    provision(sim.root, rendered, cc)
    return sim


async def provisioned_node(tmp_path: Path, *, annotated: bool) -> Cluster:
    """The loopback API server serving the rendered config and the ControllerConfig, and the
    Node of the provisioned host: `annotated`, Done at the rendered config (as an earlier
    daemon or the controller left it); else bare, as the kubelet registers it, for the agent
    to seed from node-annotations.json."""
    rendered, cc = fixtures()
    kube = FakeKube(bookmark_interval=0.5)
    await kube.start()
    sim = provisioned_host(tmp_path, rendered, cc)
    name = rendered["metadata"]["name"]
    kube.put(rendered)
    kube.put(cc)
    annotations = (
        {P + "currentConfig": name, P + "desiredConfig": name, P + "state": "Done"}
        if annotated
        else {}
    )
    cluster = Cluster(kube, tmp_path, sim, images={"booted": rendered["spec"]["osImageURL"]})
    metadata = {"name": cluster.node, "annotations": annotations}
    kube.put({"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {}})
    sa = kube.service_account("openshift-machine-config-operator", "machine-config-daemon",
                              [*SA_RULES, *SCOPED_SA_RULES])  # fmt: skip
    kube.write_kubeconfig(tmp_path / "node.kubeconfig", kube.node_identity(cluster.node))
    kube.write_kubeconfig(tmp_path / "sa.kubeconfig", sa)
    return cluster


def degraded_writes(cluster: Cluster) -> list[str]:
    """Every Node patch that set state Degraded (a Degraded that healed leaves this trace)."""
    found = []
    for request in cluster.kube.requests:
        body = request.json() if request.resource == "nodes" and request.verb == "patch" else None
        annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
        if annotations.get(P + "state") == "Degraded":
            found.append(annotations.get(P + "reason", ""))
    return found


def reasons(cluster: Cluster) -> set[str]:
    return {e["reason"] for e in cluster.kube.list("events", "default")}


# -- the layout itself ------------------------------------------------------------------------


async def test_the_layout_holds_what_ignition_and_the_server_leave(tmp_path: Path) -> None:
    rendered, cc = fixtures()
    sim = provisioned_host(tmp_path, rendered, cc)
    root = sim.root

    def at(path: str) -> Path:
        return root / path.lstrip("/")

    create = at(CREATE).lstat()
    assert at(CREATE).read_bytes() == b"Initial Creation\n" and create.st_mode == 0o100600
    assert at("/etc/kubernetes/kubelet.conf").read_bytes().startswith(b"apiVersion")  # base64
    assert at("/usr/local/bin/configure-ovs.sh").lstat().st_mode == 0o100755  # via /var
    assert at("/var/usrlocal/bin/configure-ovs.sh").is_file()
    # contents, drop-ins only, enabled with contents from the image, disabled, static
    assert at("/etc/systemd/system/kubelet.service").is_file()
    assert at("/etc/systemd/system/crio.service.d/01-kubens.conf").is_file()
    assert not at("/etc/systemd/system/crio.service").exists()
    wants = "/etc/systemd/system/multi-user.target.wants/"
    assert at(wants + "openvswitch.service").readlink() == Path(
        "/usr/lib/systemd/system/openvswitch.service"
    )
    assert at(wants + "kubelet.service").readlink() == Path("/etc/systemd/system/kubelet.service")
    assert not at(wants + "kubens.service").is_symlink()
    requires = "/etc/systemd/system/firstboot-osupdate.target.requires/"
    assert at(requires + "machine-config-daemon-firstboot.service").is_symlink()
    preset = at("/etc/systemd/system-preset/20-ignition.preset").read_text().splitlines()
    assert "disable kubens.service" in preset and "enable openvswitch.service" in preset
    # what the machine-config-server appends; the encapsulated config is gone after firstboot
    name = rendered["metadata"]["name"]
    seeded = json.loads(at(NODE_ANNOTATIONS).read_text())
    assert seeded[P + "currentConfig"] == seeded[P + "desiredConfig"] == name
    assert seeded[P + "state"] == "Done"
    ca = base64.b64decode(cc["spec"]["kubeAPIServerServingCAData"])
    assert at("/etc/kubernetes/kubelet-ca.crt").read_bytes() == ca
    assert json.loads(at("/etc/mcs-machine-config-content.json").read_text()) == rendered
    assert at("/etc/kubernetes/kubeconfig").is_file()
    assert not at("/etc/ignition-machine-config-encapsulated.json").exists()
    # ...and the agent's own validator finds nothing to say
    validator = Validator(sim.host(Allowlist().allows))
    config = machine_config_from_object(rendered)
    result = await validator.validate(
        validator.expected(config, Allowlist().policy, rendered["spec"]["osImageURL"])
    )
    assert result.ok, [f.text for f in result.found]
    assert not result.notes


async def test_a_unit_enabled_without_contents_needs_the_images_copy(tmp_path: Path) -> None:
    # What failed on the real controller: hosts not laid out, units "not-found". The layout
    # refuses, as `systemctl enable` would, a unit that neither the config nor the image gives.
    rendered, cc = fixtures()
    sim = SimulatedHost.create(tmp_path / "host", rendered["spec"]["osImageURL"], {})
    with pytest.raises(NotProvisionable, match=r"openvswitch\.service"):
        provision(sim.root, rendered, cc)
    # OS_UNITS, what every simulated image of the pool scenarios ships, covers this config.
    assert image_units(rendered) == OS_UNITS


async def test_ignitions_layout_of_what_the_real_config_lacks(tmp_path: Path) -> None:
    # gzip and base64 contents, owners by name and by id, a user and a group Ignition adds,
    # core's keys, a mask, `enabled: false` with contents, an Alias=, a unit of the image.
    secret = b'{"auths":{"quay.example":{"auth":"dXNlcjpwYXNz"}}}'
    gz = "data:;base64," + base64.b64encode(gzip.compress(secret)).decode()
    config = {
        "ignition": {"version": "3.5.0"},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA-one"]},
                             {"name": "builder", "sshAuthorizedKeys": ["ssh-ed25519 AAAA-b"]}],
                   "groups": [{"name": "audit-readers", "gid": 4242}]},
        "storage": {"files": [
            {"path": PULL_SECRET, "mode": 0o600, "contents": {"source": gz, "compression": "gzip"}},
            {"path": "/etc/app/owned", "mode": 0o640, "user": {"name": "core"},
             "group": {"name": "audit-readers"}, "contents": {"source": "data:,a%20b"}},
            {"path": "/etc/app/by-id", "user": {"id": 1234}, "contents": {"source": "data:,"}},
        ]},
        "systemd": {"units": [
            {"name": "masked.service", "mask": True},
            {"name": "off.service", "enabled": False,
             "contents": "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"},
            {"name": "aliased.service", "enabled": True,
             "contents": "[Service]\nExecStart=/bin/true\n[Install]\nAlias=other.service\n"},
            {"name": "crio.service", "enabled": True},
        ]},
    }  # fmt: skip
    sim = SimulatedHost.create(tmp_path / "host", "quay.example/os/node:v1", OS_UNITS)
    root = sim.root
    lay_ignition(root, config)

    def at(path: str) -> Path:
        return root / path.lstrip("/")

    assert at(PULL_SECRET).read_bytes() == secret and at(PULL_SECRET).stat().st_mode == 0o100600
    owned = at("/etc/app/owned").stat()
    assert at("/etc/app/owned").read_bytes() == b"a b"
    assert (owned.st_mode, owned.st_uid, owned.st_gid) == (0o100640, 1000, 4242)
    assert at("/etc/app/by-id").stat().st_uid == 1234
    keys = at(SSH_KEYS_PATH)
    assert keys.read_text() == "ssh-ed25519 AAAA-one\n"
    assert (keys.stat().st_mode, keys.stat().st_uid) == (0o100600, 1000)
    assert (root / "var/home/core/.ssh").stat().st_mode & 0o777 == 0o700
    assert "builder:x:1001:1001::/home/builder:/bin/bash" in at("/etc/passwd").read_text()
    builder_keys = root / "var/home/builder/.ssh/authorized_keys.d/ignition"
    assert builder_keys.stat().st_uid == 1001
    units = "/etc/systemd/system/"
    assert at(units + "masked.service").readlink() == Path("/dev/null")
    assert at(units + "other.service").readlink() == Path(units + "aliased.service")
    assert not at(units + "multi-user.target.wants/off.service").is_symlink()
    assert at(units + "multi-user.target.wants/crio.service").readlink() == Path(
        "/usr/lib/systemd/system/crio.service"
    )
    names = ("masked.service", "off.service", "aliased.service", "crio.service")
    assert {name: unit_file_state(root, name) for name in names} == {
        "masked.service": "masked", "off.service": "disabled",
        "aliased.service": "enabled", "crio.service": "enabled",
    }  # fmt: skip
    with pytest.raises(NotProvisionable, match="no user 'nobody-here'"):
        lay_ignition(root, {"storage": {"files": [
            {"path": "/etc/x", "user": {"name": "nobody-here"}, "contents": {}}]}})  # fmt: skip


# -- the agent's first start ------------------------------------------------------------------


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "from-node-annotations"])
async def test_the_first_start_on_a_provisioned_node_writes_nothing(
    tmp_path: Path, annotated: bool
) -> None:
    cluster = await provisioned_node(tmp_path, annotated=annotated)
    root = cluster.sim.root
    name = json.loads(MCC_RENDERED_WORKER.read_text())["metadata"]["name"]
    log = tmp_path / "agent.log"
    try:
        before = snapshot(root)
        with log.open("wb") as stderr:
            await cluster.start_agent(log_level="info", stderr=stderr)
        await cluster.wait_done(name)
        await until(lambda: "NodeDone" in reasons(cluster), what="the NodeDone Event")
        version = cluster.kube.get("ControllerConfig", "machine-config-controller")["metadata"][
            "resourceVersion"
        ]
        await cluster.wait_annotations(lambda a: a.get(LAST_SYNCED_CC) == version)
        # The host validated against the real controller's config, and found as it says.
        await wait_logged(log, "validated on-disk state", name, '"ok": true')
        assert not logged(log, "validated on-disk state", '"ok": false')
        assert cluster.reboots() == 0
        assert degraded_writes(cluster) == []
        assert not {"OnDiskStateValidationFailed", "ConfigDriftDetected"} & reasons(cluster)
        written = changed(before, snapshot(root))
        assert set(written) <= set(RECORDS), written  # nothing else written, moved or touched
        served = cluster.kube.get("MachineConfig", name)  # as the MCD writes it, from its lister
        assert (root / RECORDS[0]).read_bytes() == on_disk_config(served)
        assert (root / RECORDS[1]).read_bytes() == b""  # not layered
        assert (root / BOOTC_AUTH).read_bytes() == (root / PULL_SECRET.lstrip("/")).read_bytes()
        annotations = cluster.annotations()
        assert annotations[P + "currentConfig"] == annotations[P + "desiredConfig"] == name
        assert annotations.get(P + "reason", "") == ""
    finally:
        await cluster.close()


async def test_a_controllerconfig_change_after_done_keeps_the_placeholder(tmp_path: Path) -> None:
    # A registry CA added to the ControllerConfig: its directory is written, Ignition's
    # regular file /etc/docker/certs.d/.create stays as it is, and the node stays Done.
    cluster = await provisioned_node(tmp_path, annotated=True)
    root = cluster.sim.root
    name = json.loads(MCC_RENDERED_WORKER.read_text())["metadata"]["name"]
    try:
        await cluster.start_agent()
        await cluster.wait_done(name)
        create = entry(root / CREATE.lstrip("/"))
        cc = cluster.kube.get("ControllerConfig", "machine-config-controller")
        ca = b"-----BEGIN CERTIFICATE-----\nMIIBnew\n-----END CERTIFICATE-----\n"
        bundle = [{"file": "registry.example.invalid..5000", "data": base64.b64encode(ca).decode()}]
        cc["spec"]["imageRegistryBundleData"] = bundle
        version = cluster.kube.put(cc)["metadata"]["resourceVersion"]
        await cluster.wait_annotations(lambda a: a.get(LAST_SYNCED_CC) == version)
        written = root / CERTS_DIR.lstrip("/") / "registry.example.invalid:5000/ca.crt"
        assert written.read_bytes() == ca
        assert entry(root / CREATE.lstrip("/")) == create  # untouched: same inode, same mtime
        annotations = cluster.annotations()
        assert annotations[P + "state"] == "Done" and annotations.get(P + "reason", "") == ""
        assert degraded_writes(cluster) == []
        assert "OnDiskStateValidationFailed" not in reasons(cluster)
    finally:
        await cluster.close()


async def test_the_first_start_in_file_mode_writes_nothing(tmp_path: Path) -> None:
    # `run --source file:PATH --once`, PATH the rendered config itself (no cluster, so no
    # ControllerConfig): the first start records it as current; the second start, as after a
    # boot, validates the host against it.
    rendered, cc = fixtures()
    sim = provisioned_host(tmp_path, rendered, cc)
    document = tmp_path / "rendered-worker.json"
    document.write_text(json.dumps(rendered))
    before = snapshot(sim.root)
    for start in ("first", "second"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "--log-level", "info", "run", "--source",
            f"file:{document}", "--host", f"simulated:{sim.base}", "--once", "--listen", "",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        assert await exits(proc) == 0, (start, err.decode()[-2000:])
    status = json.loads((sim.root / STATE_DIR / "status.json").read_text())
    assert status["state"] == "Done" and status["currentConfig"] == rendered["metadata"]["name"]
    assert status["validation"] and status["validation"]["ok"], status["validation"]
    assert sum(1 for a in sim.actions() if a["kind"] == "reboot") == 0
    written = changed(before, snapshot(sim.root))
    assert set(written) <= {"run", "run/ostree", BOOTC_AUTH}, written  # no MCD record here
    assert (sim.root / BOOTC_AUTH).read_bytes() == (sim.root / PULL_SECRET.lstrip("/")).read_bytes()


# -- the pool scenarios' and the conformance tier's hosts -----------------------------------------


async def test_the_pool_hosts_are_laid_out_from_what_the_api_server_serves(tmp_path: Path) -> None:
    # The path both pool backends take (tests/scenarios/pool.py MccCluster._prepare): the real
    # controller's rendered config and ControllerConfig read back from an API server, on hosts
    # made as the pool's are (booted before the render: OS_UNITS in every image). The tier
    # with the real controller failed here before (units "not-found"); this is its layout.
    rendered, cc = fixtures()
    cluster = StandInCluster(tmp_path / "cluster")
    await cluster.up()
    try:
        sim, images = make_host(tmp_path / "worker-0", os_files=OS_UNITS)
        rendered["spec"]["osImageURL"] = images["v1"]  # what mcc-up --os-image makes of it
        cluster.kube.put(rendered)
        cluster.kube.put(cc)
        name = rendered["metadata"]["name"]
        await provision_hosts(cluster, name, [sim])
        seeded = json.loads((sim.root / NODE_ANNOTATIONS.lstrip("/")).read_text())
        assert seeded[P + "currentConfig"] == name
        validator = Validator(sim.host(Allowlist().allows))
        config = machine_config_from_object(rendered)
        result = await validator.validate(
            validator.expected(config, Allowlist().policy, images["v1"])
        )
        assert result.ok, [f.text for f in result.found]
        # ...and an image update keeps the OS's units: every image of the pool ships them.
        assert all(rel in sim._registry()["images"][images["v2"].split("@")[1]]["files"]
                   for rel in OS_UNITS)  # fmt: skip
    finally:
        await cluster.down()
