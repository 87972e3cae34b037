"""The kube-apiserver serving-CA rotation of the MCD's certificate writer, pure part
(upstream `pkg/daemon/certificate_writer.go` `syncControllerConfigHandler`).

How the rotation reaches a node: the operator copies ConfigMap
`openshift-config-managed/kube-apiserver-server-ca` into
`openshift-machine-config-operator/kubeconfig-data` (key `ca-bundle.crt`) and, in the same sync,
sets the ControllerConfig annotation `machineconfiguration.openshift.io/service-ca-rotate` to
"true" ("false" when nothing changed; `pkg/operator/sync.go` `syncControllerConfig`). The
daemon acts once per "true", remembering it in the Node annotation
`lastObservedServerCAAnnotation`. `spec.kubeAPIServerServingCAData` plays no part: it becomes
`/etc/kubernetes/kubelet-ca.crt`, the kubelet's `clientCAFile` (the operator fills it with the
initial serving CA plus the kube-apiserver-to-kubelet client CA, `pkg/operator/sync.go`).

What the daemon does then, and this module decides: every certificate of the bundle that is
missing from cluster[0] of `/etc/kubernetes/kubeconfig` makes it rewrite that CA data with all
parseable certificates of the bundle. If one of the missing certificates is not one of the
kube-apiserver's localhost, localhost-recovery or load-balancer signers (which rotate during
upgrades), the kubelet is restarted with the same CA data in `/var/lib/kubelet/kubeconfig`."""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from agent.cluster import annotations as A
from agent.core.policy import KUBECONFIG
from agent.errors import InputError

KUBECONFIG_DATA_NAMESPACE = "openshift-machine-config-operator"
KUBECONFIG_DATA_NAME = "kubeconfig-data"
CA_BUNDLE_KEY = "ca-bundle.crt"
KUBECONFIG_DATA_PATH = (
    f"/api/v1/namespaces/{KUBECONFIG_DATA_NAMESPACE}/configmaps/{KUBECONFIG_DATA_NAME}"
)
KUBECONFIG_DATA_SOURCE = f"configmap {KUBECONFIG_DATA_NAMESPACE}/{KUBECONFIG_DATA_NAME}"
CA_FIELD = "clusters[0].cluster.certificate-authority-data"
# New certificates with these in their subject CN do not restart the kubelet: they rotate
# randomly during upgrades (certificate_writer.go, "DO NOT restart kubelet until we error").
DEFERRED_SIGNERS = (
    "kube-apiserver-localhost-signer",
    "openshift-kube-apiserver-operator_localhost-recovery-serving-signer",
    "kube-apiserver-lb-signer",
)

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)
_CN_OID = b"\x55\x04\x03"  # 2.5.4.3


# -- the gates -------------------------------------------------------------------------------
def _cc_annotations(controller_config: Mapping[str, Any]) -> Mapping[str, Any]:
    return (controller_config.get("metadata") or {}).get("annotations") or {}


def rotate_value(controller_config: Mapping[str, Any]) -> str:
    """The ControllerConfig's `service-ca-rotate`, "" when absent (as a Go map lookup)."""
    return str(_cc_annotations(controller_config).get(A.SERVICE_CA_ROTATE) or "")


def rotation_due(controller_config: Mapping[str, Any], node: Mapping[str, str]) -> bool:
    """The MCD's gate for touching the kubeconfigs: the operator flagged a new serving CA and
    this node has not acted on the flag yet."""
    value = rotate_value(controller_config)
    return value == A.SERVICE_CA_ROTATE_TRUE and node.get(A.LAST_OBSERVED_SERVER_CA, "") != value


def certificates_due(controller_config: Mapping[str, Any], node: Mapping[str, str]) -> bool:
    """Whether a certificate sync has anything to do: a ControllerConfig resourceVersion this
    node has not synced, or a rotate flag it has not recorded.

    The MCD re-runs the whole writer on every ControllerConfig event while the flag is "true";
    that rewrites identical files and annotations, so the state reached is the same."""
    version = str((controller_config.get("metadata") or {}).get("resourceVersion") or "")
    return node.get(A.LAST_SYNCED_CC, "") != version or node.get(
        A.LAST_OBSERVED_SERVER_CA, ""
    ) != rotate_value(controller_config)


# -- the bundle ------------------------------------------------------------------------------
def ca_bundle(configmap: Mapping[str, Any]) -> bytes | None:
    """`ca-bundle.crt` of the kubeconfig-data ConfigMap (upstream `cmToData`): binaryData
    first, then data, base64-decoded when it decodes; None when the key is absent."""
    binary = (configmap.get("binaryData") or {}).get(CA_BUNDLE_KEY)
    if binary is not None:
        try:
            return base64.b64decode(str(binary), validate=True)
        except (binascii.Error, ValueError):
            raise InputError(
                "invalid base64", source=KUBECONFIG_DATA_SOURCE, field=f"binaryData.{CA_BUNDLE_KEY}"
            ) from None
    text = (configmap.get("data") or {}).get(CA_BUNDLE_KEY)
    if text is None:
        return None
    try:
        return base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        return str(text).encode()


@dataclass(frozen=True)
class _Block:
    text: bytes  # BEGIN through END, as found
    key: bytes  # the base64 body without whitespace: equal certificates, equal keys


def _blocks(data: bytes) -> list[_Block]:
    return [_Block(m.group(0), b"".join(m.group(1).split())) for m in _PEM.finditer(data)]


# -- a certificate's subject CN, from DER --------------------------------------------------------
def _tlv(der: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, value start, value end) of the DER element at `pos`."""
    if pos + 2 > end:
        raise ValueError("truncated element")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if tag & 0x1F == 0x1F:
        raise ValueError("unexpected high tag number")
    if length & 0x80:
        count = length & 0x7F
        if not 0 < count <= 4 or pos + count > end:
            raise ValueError("bad length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > end:
        raise ValueError("truncated element")
    return tag, pos, pos + length


def _expect(der: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    found, start, stop = _tlv(der, pos, end)
    if found != tag:
        raise ValueError(f"expected tag {tag:#x}, found {found:#x}")
    return start, stop


_STRINGS = {0x0C: "utf-8", 0x13: "ascii", 0x16: "ascii", 0x14: "latin-1", 0x1E: "utf-16-be",
            0x1C: "utf-32-be"}  # fmt: skip


def subject_common_name(der: bytes) -> str:
    """The subject CN of an X.509 certificate ("" when it has none); ValueError when the DER
    is not a certificate's shape. Structure only: the MCD's parse only sorts out malformed
    entries, it verifies no signature."""
    start, end = _expect(der, 0, len(der), 0x30)
    if end != len(der):
        raise ValueError("trailing data")
    tbs_start, tbs_end = _expect(der, start, end, 0x30)
    _, algorithm_end = _expect(der, tbs_end, end, 0x30)
    _, signature_end = _expect(der, algorithm_end, end, 0x03)
    if signature_end != end:
        raise ValueError("trailing data in certificate")
    tag, _, pos = _tlv(der, tbs_start, tbs_end)
    if tag == 0xA0:  # explicit version
        _, pos = _expect(der, pos, tbs_end, 0x02)
    elif tag != 0x02:
        raise ValueError("expected a serial number")
    for _ in ("signature", "issuer", "validity"):
        _, pos = _expect(der, pos, tbs_end, 0x30)
    subject, subject_end = _expect(der, pos, tbs_end, 0x30)
    common_name = ""
    while subject < subject_end:
        rdn, subject = _expect(der, subject, subject_end, 0x31)
        while rdn < subject:
            attr, attr_end = _expect(der, rdn, subject, 0x30)
            oid, oid_end = _expect(der, attr, attr_end, 0x06)
            if der[oid:oid_end] == _CN_OID:
                tag, value, value_end = _tlv(der, oid_end, attr_end)
                if tag not in _STRINGS:
                    raise ValueError(f"unexpected string type {tag:#x}")
                # The last CN wins, as in Go's pkix.Name.FillFromRDNSequence.
                common_name = der[value:value_end].decode(_STRINGS[tag])
            rdn = attr_end
    return common_name


def _common_name(block: _Block) -> str | None:
    try:
        return subject_common_name(base64.b64decode(block.key, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


# -- kubeconfig documents ------------------------------------------------------------------------
def _load(kubeconfig: bytes, source: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(kubeconfig)
    except yaml.YAMLError as exc:
        # Only the problem and its position: the snippet yaml would quote may hold a token.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "unparseable"
        raise InputError(f"not valid YAML: {problem}{where}", source=source) from None
    except (ValueError, KeyError, IndexError, AttributeError, TypeError, RecursionError) as exc:
        # PyYAML's constructors on a scalar its tag does not allow (`!!int <token>`): their
        # text quotes the scalar, so only the type is named.
        raise InputError(
            f"not valid YAML: a value that cannot be read ({type(exc).__name__})", source=source
        ) from None
    if not isinstance(doc, dict):
        raise InputError("expected a kubeconfig mapping", source=source)
    return doc


def _cluster(doc: dict[str, Any], source: str) -> dict[str, Any]:
    clusters = doc.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise InputError("no cluster", source=source, field="clusters")
    entry = clusters[0]
    cluster = entry.get("cluster") if isinstance(entry, dict) else None
    if not isinstance(cluster, dict):
        raise InputError("expected a cluster", source=source, field="clusters[0].cluster")
    return cluster


def _ca_of(cluster: dict[str, Any], source: str) -> bytes:
    value = cluster.get("certificate-authority-data")
    if value is None or value == "":
        return b""
    if not isinstance(value, str):
        raise InputError("expected base64 data", source=source, field=CA_FIELD)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InputError("invalid base64", source=source, field=CA_FIELD) from None


def certificate_authority(kubeconfig: bytes, source: str) -> bytes:
    """The CA data of the first cluster (the one the MCD reads), b"" when it has none."""
    doc = _load(kubeconfig, source)
    return _ca_of(_cluster(doc, source), source)


def with_certificate_authority(kubeconfig: bytes, ca: bytes, source: str) -> bytes:
    """The kubeconfig with the first cluster's CA data set to `ca`, everything else kept.

    The old base64 value is replaced in the text when that provably yields the intended
    document, so comments, order and style survive; otherwise the document is dumped again.
    The result ends with a newline (as the MCD's writeToDisk ensures)."""
    doc = _load(kubeconfig, source)
    cluster = _cluster(doc, source)
    _ca_of(cluster, source)
    new_value = base64.b64encode(ca).decode()
    old_value = cluster.get("certificate-authority-data")
    if old_value == new_value:
        return kubeconfig
    expected = copy.deepcopy(doc)
    expected["clusters"][0]["cluster"]["certificate-authority-data"] = new_value
    try:
        text = kubeconfig.decode()
    except UnicodeDecodeError:
        text = ""
    if isinstance(old_value, str) and old_value and text.count(old_value) == 1:
        candidate = text.replace(old_value, new_value)
        try:
            same = yaml.safe_load(candidate) == expected
        except yaml.YAMLError:
            same = False
        if same:
            return candidate.encode() if candidate.endswith("\n") else (candidate + "\n").encode()
    return yaml.safe_dump(expected, sort_keys=False, default_flow_style=False).encode()


# -- the decision ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerCAPlan:
    """What one rotation does. `kubeconfig`: the new `/etc/kubernetes/kubeconfig`, None when it
    keeps its CA; `restart_kubelet`: copy `ca` into the kubelet's kubeconfig and restart it."""

    ca: bytes = field(repr=False)
    kubeconfig: bytes | None = field(default=None, repr=False)
    restart_kubelet: bool = False
    added: tuple[str, ...] = ()  # subject CNs of the certificates new to the kubeconfig
    malformed: int = 0  # entries of the bundle that are no certificate (not written)


def plan_server_ca(kubeconfig: bytes, bundle: bytes, source: str = KUBECONFIG) -> ServerCAPlan:
    """The MCD's decision for one bundle from the kubeconfig-data ConfigMap (pure)."""
    current = certificate_authority(kubeconfig, source)
    if current.strip() == bundle.strip():
        return ServerCAPlan(current)
    on_disk = {block.key for block in _blocks(current)}
    named = [(block, _common_name(block)) for block in _blocks(bundle)]
    missing = [(block, name) for block, name in named if block.key not in on_disk]
    if not missing:
        # The MCD rewrites only when a certificate was added: a CA merely dropped from the
        # bundle stays trusted until the next addition rewrites the whole set.
        return ServerCAPlan(current)
    valid = [block.text for block, name in named if name is not None]
    if not valid:
        # The MCD would write empty CA data here, leaving the kubelet to trust any system CA;
        # refuse instead.
        raise InputError("no parseable certificate", source=KUBECONFIG_DATA_SOURCE,
                         field=CA_BUNDLE_KEY)  # fmt: skip
    ca = b"\n".join(valid) + b"\n"
    malformed = len(named) - len(valid)
    if ca.strip() == current.strip():
        return ServerCAPlan(current, malformed=malformed)  # only malformed entries were new
    added = tuple(name for _, name in missing if name is not None)
    restart = any(not any(signer in name for signer in DEFERRED_SIGNERS) for name in added)
    return ServerCAPlan(
        ca=ca,
        kubeconfig=with_certificate_authority(kubeconfig, ca, source),
        restart_kubelet=restart,
        added=added,
        malformed=malformed,
    )
