"""The payload of a HyperShift InPlace NodePool, built as HyperShift's ignition server builds it
(docs/mco-protocol.md §15, steps 2-4 and 14).

The ignition server runs the machine-config-server's bootstrap and GETs `/config/master`: an
Ignition config whose files are the rendered MachineConfig's own plus what the MCS appends
(MCO `pkg/server/bootstrap_server.go:86,134-139`):

* `/etc/mcs-machine-config-content.json`: the rendered MachineConfig, whole (what a node's
  daemon decodes as its desired state, and what Ignition leaves on a host at provisioning);
* `/etc/machine-config-daemon/node-annotations.json`: `currentConfig`/`desiredConfig` naming
  the rendered config (`rendered-master-<hash>`, never a NodePool config-version hash) and
  `state: Done`;
* `/etc/ignition-machine-config-encapsulated.json`: the same MachineConfig with an empty
  Ignition config (what firstboot reads for osImageURL and kernel arguments).

The token Secret's `payload`, copied unchanged into ConfigMap `<np>-upgrade` `data.config`, is
the base64 text of the gzip of that Ignition JSON (`util.CompressAndEncode`: gzip best
compression, standard base64; HyperShift's
ignition-server/controllers/tokensecret_controller.go:335-355 at
3ee9615567acffaf3e3ee25c2ca2942d650565cf). Files are written as the kit's self-test writes
them: URL-encoded `data:,` URLs, mode 0644, overwrite.

The config-version hash is FNV-32a (`%08x`) of the Ignition bytes, a NUL and the release
version, as the kit's `hcp-target` computes it (HyperShift hashes the config with the release
version: nodepool/config.go:165-167, support/util/util.go:204-209).

MachineConfigs to encode: `standins.demo.objects.machine_config` (re-exported by
tests/builders.py)."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import urllib.parse
from typing import Any

from agent.model.dataurl import decode_data_url

MCA = "machineconfiguration.openshift.io/"
IGNITION_VERSION = "3.5.0"
MCS_CONTENT = "/etc/mcs-machine-config-content.json"
NODE_ANNOTATIONS = "/etc/machine-config-daemon/node-annotations.json"
ENCAPSULATED = "/etc/ignition-machine-config-encapsulated.json"
APPENDED = (NODE_ANNOTATIONS, MCS_CONTENT, ENCAPSULATED)
RENDERED_PREFIX = "rendered-master-"  # the pool is "master in name only" (mcs/reconcile.go:94-125)


def fnv32a(data: bytes) -> str:
    """32-bit FNV-1a as 8 hex digits (HyperShift's util.HashSimple)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def config_hash(payload_ignition_bytes: bytes, release_version: str) -> str:
    """The NodePool config-version hash of a target, as `hcp-target` computes it."""
    return fnv32a(payload_ignition_bytes + b"\0" + release_version.encode())


def rendered_name(machine_config: dict[str, Any]) -> str:
    """The rendered config's name: kept when it already is `rendered-master-…`, else made from
    the MachineConfig's spec as the render controller names one (an MD5 of its content)."""
    name = machine_config.get("metadata", {}).get("name", "")
    if name.startswith(RENDERED_PREFIX):
        return name
    spec = json.dumps(machine_config.get("spec", {}), sort_keys=True).encode()
    return RENDERED_PREFIX + hashlib.md5(spec, usedforsecurity=False).hexdigest()


def _json_file(path: str, doc: Any) -> dict[str, Any]:
    source = "data:," + urllib.parse.quote(json.dumps(doc, sort_keys=True))
    return {"path": path, "mode": 0o644, "overwrite": True, "contents": {"source": source}}


def ignition(machine_config: dict[str, Any]) -> dict[str, Any]:
    """The Ignition config the MCS serves for `machine_config` (renamed to its rendered name,
    as the MCS serves the rendered config): its config at version 3.5.0 plus the three files
    the MCS appends."""
    rendered = rendered_name(machine_config)
    mc = copy.deepcopy(machine_config)
    mc.setdefault("metadata", {})["name"] = rendered
    config = copy.deepcopy(mc.get("spec", {}).get("config") or {})
    config["ignition"] = {**config.get("ignition", {}), "version": IGNITION_VERSION}
    storage = config.setdefault("storage", {})
    files = [f for f in storage.get("files", []) if f.get("path") not in APPENDED]
    annotations = {MCA + "currentConfig": rendered, MCA + "desiredConfig": rendered,
                   MCA + "state": "Done"}  # fmt: skip
    encapsulated = copy.deepcopy(mc)
    encapsulated["spec"]["config"] = {"ignition": {"version": IGNITION_VERSION}}
    appended = [_json_file(NODE_ANNOTATIONS, annotations), _json_file(MCS_CONTENT, mc),
                _json_file(ENCAPSULATED, encapsulated)]  # fmt: skip
    storage["files"] = [*files, *appended]
    return config


def ignition_bytes(machine_config: dict[str, Any]) -> bytes:
    """The Ignition JSON text the MCS serves (compact, as Go's encoder writes it)."""
    return json.dumps(ignition(machine_config), sort_keys=True, separators=(",", ":")).encode()


def encode_ignition(raw: bytes) -> str:
    """base64(gzip(raw)): the token Secret's `payload`, the ConfigMap's `data.config`. The gzip
    header carries no time, as Go's writer leaves it, so equal input gives equal text."""
    return base64.b64encode(gzip.compress(raw, 9, mtime=0)).decode()


def encode_payload(machine_config: dict[str, Any]) -> str:
    """What HyperShift puts in the token Secret's `payload` for this MachineConfig."""
    return encode_ignition(ignition_bytes(machine_config))


def payload_ignition_bytes(payload: str) -> bytes:
    """The Ignition JSON text inside a payload (base64 → gunzip)."""
    return gzip.decompress(base64.b64decode(payload))


def decode_payload(payload: str) -> dict[str, Any]:
    """The Ignition config inside a payload."""
    return json.loads(payload_ignition_bytes(payload))


def ignition_files(ign: dict[str, Any]) -> dict[str, bytes]:
    """Each storage file of an Ignition config, decoded (gzip-compressed contents too)."""
    out: dict[str, bytes] = {}
    for f in ign.get("storage", {}).get("files", []):
        contents = f.get("contents") or {}
        data = decode_data_url(contents.get("source", "data:,"))
        if contents.get("compression") == "gzip":
            data = gzip.decompress(data)
        out[f["path"]] = data
    return out


def target_ignition(config: bytes | str | dict[str, Any]) -> bytes:
    """The Ignition bytes of a target given as `hcp-target` takes it (Ignition JSON bytes, its
    FILE), as a payload (base64 of gzip), or as a dict: an Ignition config, or a MachineConfig
    encoded as the MCS serves it. ValueError when it is no Ignition config."""
    if isinstance(config, str):
        raw = payload_ignition_bytes(config)
    elif isinstance(config, dict):
        raw = (json.dumps(config, sort_keys=True).encode() if "ignition" in config
               else ignition_bytes(config))  # fmt: skip
    else:
        raw = config
    doc = json.loads(raw)
    if not (isinstance(doc, dict) and isinstance(doc.get("ignition"), dict)
            and doc["ignition"].get("version")):  # fmt: skip
        raise ValueError("not an Ignition config (JSON with ignition.version)")
    return raw


def payload_machine_config(payload: str) -> dict[str, Any]:
    """The MachineConfig a node's daemon takes from a payload (MCS_CONTENT)."""
    return json.loads(ignition_files(decode_payload(payload))[MCS_CONTENT])
