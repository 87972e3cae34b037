"""Decoding a document's bytes: JSON or YAML, optionally gzip or base64-of-gzip (as the MCO
stores compressed Ignition configs)."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from typing import Any

import yaml

from agent.errors import InputError


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe loader that reads serde_yaml's enum tags (`!ostreeRemote "fedora"`, as bootc writes
    them) as one-key mappings, the shape the JSON output has."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {suffix: value}


_Loader.add_multi_constructor("!", _tagged)
# Timestamps stay strings, as in the JSON form of the same documents.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}
_GZIP_MAGIC = b"\x1f\x8b"


def _gunzip(data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"invalid gzip data ({exc})") from None


def _maybe_base64_gzip(data: bytes) -> bytes | None:
    stripped = data.strip()
    if not stripped.startswith(b"H4sI"):  # base64 of the gzip magic
        return None
    try:
        decoded = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        return None
    return decoded if decoded.startswith(_GZIP_MAGIC) else None


def load_document(data: bytes) -> Any:
    """Bytes to a JSON-compatible value; raises InputError when it is neither JSON nor YAML."""
    if data.startswith(_GZIP_MAGIC):
        data = _gunzip(data)
    elif (inner := _maybe_base64_gzip(data)) is not None:
        data = _gunzip(inner)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (expected YAML or JSON)") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}") from None
    if not docs:
        raise InputError("empty document")
    if len(docs) > 1:
        raise InputError(f"expected one document, found {len(docs)}")
    return docs[0]
