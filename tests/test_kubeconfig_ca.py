"""The kube-apiserver serving-CA rotation of the kubeconfigs (upstream
pkg/daemon/certificate_writer.go): the pure decision, the writer on a simulated host, and the
real agent process against the loopback API server."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from agent.cluster import annotations as A
from agent.cluster.certs import rotate_if_published, rotate_server_ca
from agent.cluster.kube import Kube
from agent.cluster.kubeconfig import (
    CA_FIELD,
    ca_bundle,
    certificate_authority,
    certificates_due,
    plan_server_ca,
    rotation_due,
    subject_common_name,
    with_certificate_authority,
)
from agent.core.policy import KUBECONFIG, KUBELET_KUBECONFIG, Allowlist
from agent.errors import HostError, InputError
from standins.demo.loopback import Cluster, P
from standins.host.simulated import SimulatedHost
from standins.kube import FakeKube
from tests.fixtures_paths import CONTROLLER_CONFIG
from tests.simhost import IMAGE

# Self-signed P-256 certificates made with openssl, subject OU=openshift plus the CN named.
OLD = b"""-----BEGIN CERTIFICATE-----
MIIB5DCCAYugAwIBAgIUM1xpDG+KLkY4rOf0ABRki1dSs0kwCgYIKoZIzj0EAwIw
SDESMBAGA1UECwwJb3BlbnNoaWZ0MTIwMAYDVQQDDClvbGQta3ViZS1hcGlzZXJ2
ZXItc2VydmljZS1uZXR3b3JrLXNpZ25lcjAeFw0yNjEyMDEwNDE3MjZaFw0zNjEx
MjgwNDE3MjZaMEgxEjAQBgNVBAsMCW9wZW5zaGlmdDEyMDAGA1UEAwwpb2xkLWt1
YmUtYXBpc2VydmVyLXNlcnZpY2UtbmV0d29yay1zaWduZXIwWTATBgcqhkjOPQIB
BggqhkjOPQMBBwNCAAT5P68UUEFthYLgz2boUii0eh2mvV2X6Sv94euS9VHKowlJ
X/fbxvcvXpxl6Qw5tCdOSvACjD13I2Oue6GgGkKao1MwUTAdBgNVHQ4EFgQUsj6w
4BWggEpxQQy8okUqtDkf2RQwHwYDVR0jBBgwFoAUsj6w4BWggEpxQQy8okUqtDkf
2RQwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiBZOYYb0WuDwVOn
tzthmI4HcL5uKDYqqfmWFvaavYoN6wIgcCgLGJRCKZg0d44N3beLnJHnU0AcOTLD
zhh6QAYKWLI=
-----END CERTIFICATE-----"""
NEW = b"""-----BEGIN CERTIFICATE-----
MIIB3TCCAYOgAwIBAgIUEH/hlbwWOea6nYKVWgPDDCpax1MwCgYIKoZIzj0EAwIw
RDESMBAGA1UECwwJb3BlbnNoaWZ0MS4wLAYDVQQDDCVrdWJlLWFwaXNlcnZlci1z
ZXJ2aWNlLW5ldHdvcmstc2lnbmVyMB4XDTI2MTIwMTA0MTcyNloXDTM2MTEyODA0
MTcyNlowRDESMBAGA1UECwwJb3BlbnNoaWZ0MS4wLAYDVQQDDCVrdWJlLWFwaXNl
cnZlci1zZXJ2aWNlLW5ldHdvcmstc2lnbmVyMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEIdiCxc1jSA6MiSuYsXqw68YVLXwJLgGTbuB+80464KfEmRAKs+0uQE0n
n1wthVWV+OdOxkdIKB9riDfxnXFykKNTMFEwHQYDVR0OBBYEFIrh6zIyMCwRnQEt
W2BEZYqXVoxDMB8GA1UdIwQYMBaAFIrh6zIyMCwRnQEtW2BEZYqXVoxDMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgGy9+9pVLLhmeFbrZ8WmYPa7x
5m10RYc4S/wK95IDjxICIQDqa+I3ReZcpyC92ZfvYck0gYLixS4JMnbBckCPrHdB
9w==
-----END CERTIFICATE-----"""
LOCALHOST = b"""-----BEGIN CERTIFICATE-----
MIIB0TCCAXegAwIBAgIUZ6qZuTC1eQQbpt8PU42wBmc97uswCgYIKoZIzj0EAwIw
PjESMBAGA1UECwwJb3BlbnNoaWZ0MSgwJgYDVQQDDB9rdWJlLWFwaXNlcnZlci1s
b2NhbGhvc3Qtc2lnbmVyMB4XDTI2MTIwMTA0MTcyNloXDTM2MTEyODA0MTcyNlow
PjESMBAGA1UECwwJb3BlbnNoaWZ0MSgwJgYDVQQDDB9rdWJlLWFwaXNlcnZlci1s
b2NhbGhvc3Qtc2lnbmVyMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEZXSiLPCI
Qcft5KsQr0z3dMf9NLRruzJqod4OMbsLM1kbOgIyWSZfprNvXZc3OSPYBvQLBgth
aKXjJzq89SiNPKNTMFEwHQYDVR0OBBYEFOCEc8u+bx4Tu6WRiN5aLsngULGqMB8G
A1UdIwQYMBaAFOCEc8u+bx4Tu6WRiN5aLsngULGqMA8GA1UdEwEB/wQFMAMBAf8w
CgYIKoZIzj0EAwIDSAAwRQIgQ5Zaa4MAZMdR5POQdovKTZyrTxamksBA+ucVX7y3
cLMCIQCiJfL3bCSFMvb5faHGqL4FmGaOtE2YUqaiq5bigPZsdg==
-----END CERTIFICATE-----"""
BROKEN = b"-----BEGIN CERTIFICATE-----\nTk9UIEEgQ0VSVElGSUNBVEU=\n-----END CERTIFICATE-----"
TOKEN = "s3cr3t-bootstrap-token"


def bundle(*certs: bytes) -> bytes:
    return b"\n".join(certs) + b"\n"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(ca: bytes | None, *, comment: str = "# written by the MCS") -> bytes:
    """A kubeconfig as the machine-config-server writes it (bootstrap token user)."""
    ca_line = f"    certificate-authority-data: {b64(ca)}\n" if ca is not None else ""
    return (
        f"{comment}\n"
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        "- cluster:\n"
        f"{ca_line}"
        "    server: https://api-int.lab.example.com:6443\n"
        "  name: local\n"
        "contexts:\n"
        "- context:\n"
        "    cluster: local\n"
        "    user: kubelet\n"
        "  name: kubelet\n"
        "current-context: kubelet\n"
        "preferences: {}\n"
        "users:\n"
        "- name: kubelet\n"
        "  user:\n"
        f"    token: {TOKEN}\n"
    ).encode()


def without_ca(data: bytes) -> dict:
    doc = yaml.safe_load(data)
    doc["clusters"][0]["cluster"].pop("certificate-authority-data", None)
    return doc


# -- the pure decision -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("on_disk", "new_bundle", "rewritten", "written_ca", "restart", "added"),
    [
        # a new serving CA next to the old one: both trusted, the kubelet restarted
        (bundle(OLD), bundle(OLD, NEW), True, bundle(OLD, NEW), True,
         ("kube-apiserver-service-network-signer",)),
        # a whole new bundle replaces the old CA data
        (bundle(OLD), bundle(NEW), True, bundle(NEW), True,
         ("kube-apiserver-service-network-signer",)),
        # the same CA, other whitespace: nothing to do
        (bundle(OLD, NEW), b"\n" + bundle(OLD, NEW) + b"\n\n", False, None, False, ()),
        # the same certificates re-wrapped: no certificate is new, no rewrite
        (bundle(OLD, NEW), bundle(OLD, NEW).replace(b"\n", b"\r\n"), False, None, False, ()),
        # a CA dropped from the bundle: the MCD rewrites only when one is added
        (bundle(OLD, NEW), bundle(NEW), False, None, False, ()),
        # only a localhost signer is new: written, the kubelet restart deferred
        (bundle(OLD), bundle(OLD, LOCALHOST), True, bundle(OLD, LOCALHOST), False,
         ("kube-apiserver-localhost-signer",)),
        # a malformed entry is new: it is not written, so the CA stays as it is
        (bundle(OLD), bundle(OLD, BROKEN), False, None, False, ()),
        # ... and next to a new certificate: only the parseable ones are written
        (bundle(OLD), bundle(OLD, BROKEN, NEW), True, bundle(OLD, NEW), True,
         ("kube-apiserver-service-network-signer",)),
        # no CA data at all yet
        (None, bundle(NEW), True, bundle(NEW), True, ("kube-apiserver-service-network-signer",)),
    ],
)  # fmt: skip
def test_plan(on_disk, new_bundle, rewritten, written_ca, restart, added) -> None:
    before = kubeconfig(on_disk)
    plan = plan_server_ca(before, new_bundle)
    assert (plan.kubeconfig is not None) == rewritten
    assert plan.restart_kubelet == restart
    assert plan.added == added
    if rewritten:
        assert plan.ca == written_ca
        assert certificate_authority(plan.kubeconfig, KUBECONFIG) == written_ca
        # only the CA data changed, comment and layout included
        assert without_ca(plan.kubeconfig) == without_ca(before)
        if on_disk is not None:  # one value swapped in the text: comment and layout kept
            lines = zip(before.splitlines(), plan.kubeconfig.splitlines(), strict=True)
            assert [old for old, new in lines if old != new] == [
                f"    certificate-authority-data: {b64(on_disk)}".encode()
            ]


def test_with_certificate_authority_keeps_bytes_when_equal() -> None:
    before = kubeconfig(bundle(OLD))
    assert with_certificate_authority(before, bundle(OLD), KUBECONFIG) is before


def test_with_certificate_authority_dumps_when_text_cannot_be_edited() -> None:
    # Flow style and no CA field: no single value to swap, so the document is dumped again.
    before = b'{"clusters": [{"name": "c", "cluster": {"server": "https://x"}}], "users": []}'
    after = with_certificate_authority(before, bundle(NEW), KUBECONFIG)
    assert yaml.safe_load(after) == {
        "clusters": [
            {"name": "c", "cluster": {"server": "https://x",
                                      "certificate-authority-data": b64(bundle(NEW))}}
        ],
        "users": [],
    }  # fmt: skip
    assert after.endswith(b"\n")


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (b"clusters: [\n  token: " + TOKEN.encode() + b"\n", "", "not valid YAML"),
        (b"- just\n- a list\n", "", "expected a kubeconfig mapping"),
        (b"apiVersion: v1\nkind: Config\n", "clusters", "no cluster"),
        (b"clusters: []\n", "clusters", "no cluster"),
        (b"clusters:\n- name: local\n", "clusters[0].cluster", "expected a cluster"),
        (b"clusters:\n- cluster:\n    certificate-authority-data: '%%%'\n", CA_FIELD,
         "invalid base64"),
    ],
)  # fmt: skip
def test_bad_kubeconfig_is_an_input_error(data: bytes, field: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        plan_server_ca(data, bundle(NEW))
    assert caught.value.source == KUBECONFIG
    assert caught.value.field == field
    assert message in caught.value.message
    assert TOKEN not in str(caught.value)  # the parser's snippet of the file stays out


def test_bundle_without_a_certificate_is_refused() -> None:
    with pytest.raises(InputError) as caught:
        plan_server_ca(kubeconfig(bundle(OLD)), bundle(BROKEN))
    assert caught.value.field == "ca-bundle.crt"


def cc(rotate: str | None, version: str = "7") -> dict:
    annotations = {P + "service-ca-rotate": rotate} if rotate is not None else {}
    return {"metadata": {"resourceVersion": version, "annotations": annotations}}


@pytest.mark.parametrize(
    ("rotate", "node", "rotation", "due"),
    [
        ("true", {}, True, True),
        ("true", {P + "lastObservedServerCAAnnotation": "false"}, True, True),
        ("true", {P + "lastObservedServerCAAnnotation": "true",
                  P + "lastSyncedControllerConfigResourceVersion": "7"}, False, False),
        ("true", {P + "lastObservedServerCAAnnotation": "true"}, False, True),  # new version
        ("false", {P + "lastObservedServerCAAnnotation": "true",
                   P + "lastSyncedControllerConfigResourceVersion": "7"}, False, True),
        ("false", {P + "lastObservedServerCAAnnotation": "false",
                   P + "lastSyncedControllerConfigResourceVersion": "7"}, False, False),
        (None, {P + "lastSyncedControllerConfigResourceVersion": "7"}, False, False),
        (None, {P + "lastSyncedControllerConfigResourceVersion": "6"}, False, True),
    ],
)  # fmt: skip
def test_gates(rotate, node, rotation: bool, due: bool) -> None:
    assert rotation_due(cc(rotate), node) == rotation
    assert certificates_due(cc(rotate), node) == due


@pytest.mark.parametrize(
    ("configmap", "expected"),
    [
        ({"binaryData": {"ca-bundle.crt": b64(bundle(NEW))}}, bundle(NEW)),
        ({"data": {"ca-bundle.crt": b64(bundle(NEW))}}, bundle(NEW)),
        ({"data": {"ca-bundle.crt": bundle(NEW).decode()}}, bundle(NEW)),
        ({"data": {"other": "x"}}, None),
        ({}, None),
    ],
)
def test_ca_bundle_from_the_configmap(configmap: dict, expected: bytes | None) -> None:
    assert ca_bundle(configmap) == expected


def test_subject_common_name() -> None:
    der = base64.b64decode(b"".join(NEW.splitlines()[1:-1]))
    assert subject_common_name(der) == "kube-apiserver-service-network-signer"
    for bad in (der[:-1], der + b"\x00", b"\x30\x00", b"NOT A CERTIFICATE"):
        with pytest.raises(ValueError):
            subject_common_name(bad)


# -- the writer on a simulated host ------------------------------------------------------------
@pytest.fixture
def sim(tmp_path: Path) -> SimulatedHost:
    sim = SimulatedHost.create(tmp_path / "host", f"{IMAGE}:v1")
    for path, mode in ((KUBECONFIG, 0o600), (KUBELET_KUBECONFIG, 0o640)):
        target = sim.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(kubeconfig(bundle(OLD), comment=f"# {path}"))
        target.chmod(mode)
    return sim


def ca_on(sim: SimulatedHost, path: str) -> bytes:
    return certificate_authority((sim.root / path.lstrip("/")).read_bytes(), path)


def mode_of(sim: SimulatedHost, path: str) -> int:
    return stat.S_IMODE((sim.root / path.lstrip("/")).stat().st_mode)


def unit_actions(sim: SimulatedHost) -> list[str]:
    return [a["detail"] for a in sim.actions() if a["kind"] == "unit"]


async def test_writer_rewrites_both_and_restarts_the_kubelet_once(sim: SimulatedHost) -> None:
    host = sim.host(Allowlist().allows)
    plan, done = await rotate_server_ca(host, bundle(OLD, NEW))
    assert plan.restart_kubelet
    assert done == [KUBELET_KUBECONFIG, "daemon-reload", "restart kubelet.service", KUBECONFIG]
    for path, mode in ((KUBECONFIG, 0o600), (KUBELET_KUBECONFIG, 0o640)):
        assert ca_on(sim, path) == bundle(OLD, NEW)
        assert mode_of(sim, path) == mode  # kept
        text = (sim.root / path.lstrip("/")).read_bytes()
        assert text.startswith(f"# {path}\n".encode())  # the rest of the file kept
    assert unit_actions(sim) == ["daemon-reload", "restart kubelet.service"]
    assert [a["kind"] for a in sim.actions()].count("reboot") == 0
    # the same bundle again: nothing written, nothing restarted
    assert (await rotate_server_ca(host, bundle(OLD, NEW)))[1] == []
    assert unit_actions(sim) == ["daemon-reload", "restart kubelet.service"]


async def test_rotation_waits_for_the_published_bundle(sim: SimulatedHost) -> None:
    """No kubeconfig-data ConfigMap yet (or no bundle in it): nothing written, and False, so
    the flag stays unrecorded and the next pass asks again."""
    kube = FakeKube()
    await kube.start()
    api = Kube(ApiClient(kube.client_configuration(kube.admin)))
    host = sim.host(Allowlist().allows)
    try:
        assert await rotate_if_published(api, host) is False
        configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "kubeconfig-data",
                                  "namespace": "openshift-machine-config-operator"}}  # fmt: skip
        kube.put(configmap)
        assert await rotate_if_published(api, host) is False
        assert ca_on(sim, KUBECONFIG) == bundle(OLD) and unit_actions(sim) == []
        configmap["binaryData"] = {"ca-bundle.crt": base64.b64encode(bundle(OLD, NEW)).decode()}
        kube.put(configmap)
        assert await rotate_if_published(api, host) is True
        assert ca_on(sim, KUBECONFIG) == bundle(OLD, NEW)
    finally:
        await api.close()
        await kube.stop()


async def test_writer_defers_the_restart_for_a_localhost_signer(sim: SimulatedHost) -> None:
    _, done = await rotate_server_ca(sim.host(Allowlist().allows), bundle(OLD, LOCALHOST))
    assert done == [KUBECONFIG]
    assert ca_on(sim, KUBECONFIG) == bundle(OLD, LOCALHOST)
    assert ca_on(sim, KUBELET_KUBECONFIG) == bundle(OLD)
    assert unit_actions(sim) == []


async def test_writer_writes_nothing_when_the_kubelet_kubeconfig_is_bad(
    sim: SimulatedHost,
) -> None:
    (sim.root / KUBELET_KUBECONFIG.lstrip("/")).write_bytes(b"clusters: []\n")
    with pytest.raises(InputError) as caught:
        await rotate_server_ca(sim.host(Allowlist().allows), bundle(OLD, NEW))
    assert (caught.value.source, caught.value.field) == (KUBELET_KUBECONFIG, "clusters")
    assert ca_on(sim, KUBECONFIG) == bundle(OLD)
    assert unit_actions(sim) == []


async def test_writer_retries_the_whole_step_after_a_failed_restart(sim: SimulatedHost) -> None:
    host = sim.host(Allowlist().allows)
    real = host.system.perform

    async def failing(action: str) -> None:
        if action.startswith("restart"):
            raise HostError("restart kubelet.service: job failed", kind="unit")
        await real(action)

    host.system.perform = failing
    with pytest.raises(HostError):
        await rotate_server_ca(host, bundle(OLD, NEW))
    assert ca_on(sim, KUBECONFIG) == bundle(OLD)  # the decision is still open
    host.system.perform = real
    _, done = await rotate_server_ca(host, bundle(OLD, NEW))
    assert done == ["daemon-reload", "restart kubelet.service", KUBECONFIG]
    assert unit_actions(sim).count("restart kubelet.service") == 1


# -- the real agent against the loopback API server --------------------------------------------
@pytest.fixture
async def cluster(tmp_path: Path):
    c = await Cluster.create(tmp_path)
    yield c
    await c.close()


async def test_serving_ca_rotation_rewrites_kubeconfigs_and_restarts_kubelet_once(
    cluster: Cluster,
) -> None:
    root = cluster.sim.root
    for path in (KUBECONFIG, KUBELET_KUBECONFIG):
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(kubeconfig(bundle(OLD)))
        (root / path.lstrip("/")).chmod(0o600)
    config = yaml.safe_load(CONTROLLER_CONFIG.read_text())
    config["metadata"]["annotations"][A.SERVICE_CA_ROTATE] = "false"
    cluster.kube.put(config)
    await cluster.start_agent()
    synced = P + "lastSyncedControllerConfigResourceVersion"

    def version() -> str:
        return cluster.kube.get("controllerconfigs", "machine-config-controller")["metadata"][
            "resourceVersion"
        ]

    first = version()
    await cluster.wait_annotations(lambda a: a.get(synced) == first)
    assert unit_actions(cluster.sim) == []

    # What the operator does on a new kube-apiserver serving CA (pkg/operator/sync.go).
    cluster.kube.put({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubeconfig-data", "namespace": "openshift-machine-config-operator"},
        "binaryData": {"ca-bundle.crt": b64(bundle(OLD, NEW))},
    })  # fmt: skip
    cluster.kube.patch_annotations(
        "controllerconfigs", "machine-config-controller", {A.SERVICE_CA_ROTATE: "true"}
    )
    rotated = version()
    annotations = await cluster.wait_annotations(lambda a: a.get(synced) == rotated)
    assert annotations[P + "lastObservedServerCAAnnotation"] == "true"
    for path in (KUBECONFIG, KUBELET_KUBECONFIG):
        assert ca_on(cluster.sim, path) == bundle(OLD, NEW)
        assert mode_of(cluster.sim, path) == 0o600
    assert unit_actions(cluster.sim) == ["daemon-reload", "restart kubelet.service"]

    # Another ControllerConfig change while the flag is still "true": no second restart.
    cluster.kube.patch_annotations("controllerconfigs", "machine-config-controller",
                                   {P + "unrelated": "x"})  # fmt: skip
    later = version()
    await cluster.wait_annotations(lambda a: a.get(synced) == later)
    assert unit_actions(cluster.sim) == ["daemon-reload", "restart kubelet.service"]
    assert cluster.reboots() == 0
    assert cluster.annotations()[P + "state"] == "Done"
