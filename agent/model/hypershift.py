"""HyperShift InPlace NodePool payloads: the names the upgrader uses and the decoding of what it
publishes (docs/mco-protocol.md §15, steps 4 and 11-14).

The upgrader copies the ignition server's payload, base64 text of the gzip of the Ignition
config the machine-config-server serves, into ConfigMap `<np>-upgrade/<np>-upgrade` as
`data.config`, with the NodePool's config-version hash as `data.hash`. The MachineConfig is the
file `/etc/mcs-machine-config-content.json` inside that Ignition. Node annotations name configs by
that hash, never by `rendered-…`: the desired document is named by it here too, so the agent's
journal, its drain requests (`drain-<hash>`) and currentConfig all say the same thing."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

from agent.errors import InputError
from agent.model.dataurl import decode_data_url, decompress, gunzip
from agent.model.document import load_document

NODEPOOL_LABEL = "hypershift.openshift.io/nodePool"
# What Ignition wrote at provisioning, and what the MCD writes after each in-place update
# (MCO pkg/daemon/daemon.go, HyperShift mode; docs/mco-protocol.md §15 step 14).
MC_CONTENT_PATH = "/etc/mcs-machine-config-content.json"
MCD_CURRENT_CONFIG = "/etc/mcd-currentconfig.json"
# A config-version hash is `%08x` of FNV-32a (docs/mco-protocol.md §15 step 2); any short token of
# the characters an annotation value and `drain-<hash>` may hold is accepted, so that a
# future hash function is not a refusal.
_HASH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# A payload is a few MiB of base64; more is refused before it is decoded.
MAX_PAYLOAD_TEXT = 64 * 1024 * 1024


def upgrade_objects(nodepool: str) -> tuple[str, str]:
    """The namespace and name of the NodePool's upgrade ConfigMap (docs/mco-protocol.md §15
    step 11)."""
    return f"{nodepool}-upgrade", f"{nodepool}-upgrade"


def check_hash(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _HASH.match(value):
        shown = value[:70] if isinstance(value, str) else type(value).__name__
        raise InputError(f"not a config-version hash: {shown!r}", field=field)
    return value


@dataclass(frozen=True)
class Payload:
    """One published NodePool target: its hash and the MachineConfig document, named by it."""

    hash: str
    document: bytes


def payload_from_configmap(configmap: Any) -> Payload:
    """ConfigMap `<np>-upgrade` to a Payload; InputError naming the field (`data.config`,
    `data.hash`) for anything the upgrader would not have written."""
    data = configmap.get("data") if isinstance(configmap, dict) else None
    if not isinstance(data, dict):
        raise InputError("expected an object", field="data")
    config_hash = check_hash(data.get("hash"), "data.hash")
    text = data.get("config")
    if not isinstance(text, str) or not text.strip():
        raise InputError("missing", field="data.config")
    if len(text) > MAX_PAYLOAD_TEXT:
        raise InputError(f"larger than {MAX_PAYLOAD_TEXT >> 20} MiB", field="data.config")
    try:
        ignition = decode_ignition(text)
        document = machine_config_document(ignition, config_hash)
    except InputError as exc:
        where = "data.config" + (f": {exc.field}" if exc.field else "")
        raise InputError(exc.message, field=where) from None
    return Payload(config_hash, document)


def decode_ignition(text: str) -> dict[str, Any]:
    """base64 → gzip → Ignition JSON object (as the MCD's ParseAndConvertGzippedConfig)."""
    try:
        compressed = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError("not base64") from None
    ignition = load_document(gunzip(compressed, "payload"))
    if not isinstance(ignition, dict) or not isinstance(ignition.get("ignition"), dict):
        raise InputError("not an Ignition config (no `ignition` object)")
    return ignition


def machine_config_document(ignition: dict[str, Any], name: str) -> bytes:
    """The MachineConfig carried in the Ignition file `/etc/mcs-machine-config-content.json`,
    as canonical JSON named `name` (only the name is kept of its metadata)."""
    files = (ignition.get("storage") or {}).get("files") if isinstance(ignition, dict) else None
    if not isinstance(files, list):
        raise InputError(f"no file {MC_CONTENT_PATH}", field="storage.files")
    entries = [f for f in files if isinstance(f, dict) and f.get("path") == MC_CONTENT_PATH]
    if len(entries) != 1:
        problem = "no file" if not entries else "more than one file"
        raise InputError(f"{problem} {MC_CONTENT_PATH}", field="storage.files")
    where = f"storage.files[{MC_CONTENT_PATH}].contents"
    contents = entries[0].get("contents")
    if not isinstance(contents, dict) or not isinstance(contents.get("source"), str):
        raise InputError("expected a data URL in contents.source", field=where)
    try:
        raw = decompress(decode_data_url(contents["source"]), contents.get("compression"))
    except InputError as exc:
        raise InputError(exc.message, field=where) from None
    return named_document(raw, name, where)


def named_document(raw: bytes, name: str, where: str = "") -> bytes:
    """A MachineConfig document's bytes (from a payload or a file on the host) as canonical
    JSON named `name`: the same content gives the same bytes, whoever wrote it."""
    try:
        value = load_document(raw)
    except InputError as exc:
        raise InputError(exc.message, field=where) from None
    if not isinstance(value, dict) or value.get("kind") != "MachineConfig":
        raise InputError("not a MachineConfig", field=where)
    stable = {**value, "metadata": {"name": name}}
    return json.dumps(stable, sort_keys=True).encode()
