"""Decoding a document's bytes: JSON or YAML, optionally gzip or base64-of-gzip (as the MCO
stores compressed Ignition configs)."""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
from typing import Any

import yaml

from agent.errors import InputError
from agent.model.dataurl import gunzip


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
# Real documents nest about ten levels deep; the bound keeps every later walk of a value (JSON
# serialization, diffing) far from Python's recursion limit.
MAX_DEPTH = 100
# YAML aliases can make a small document expand to billions of values ("billion laughs").
MAX_VALUES = 1_000_000
# Python prints (and json.dumps writes) integers of at most 4300 digits.
_MAX_INT_BITS = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")


def _key(key: Any, where: str) -> str:
    """A mapping key as JSON spells it (YAML allows `1:`, `true:` and `null:` keys)."""
    if isinstance(key, str):
        if _SURROGATE.search(key):
            raise InputError("key is not valid Unicode (lone surrogate)", field=where)
        return key
    if (
        key is None
        or isinstance(key, bool | float)
        or (isinstance(key, int) and key.bit_length() <= _MAX_INT_BITS)
    ):
        return json.dumps(key)
    raise InputError(f"unsupported mapping key of type {type(key).__name__}", field=where)


def _child(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def plain_value(value: Any, where: str = "") -> Any:
    """`value` as a JSON value (str keys; str, int, float, bool, None, list, dict), copied;
    raises InputError naming the field for anything else (YAML's `!!binary`, `!!set`, a lone
    surrogate), for a cycle, for nesting deeper than MAX_DEPTH and past MAX_VALUES values."""
    budget = [MAX_VALUES]

    active: set[int] = set()  # containers being walked: a YAML alias can point back up

    def walk(item: Any, where: str, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise InputError(f"document too large (more than {MAX_VALUES} values)")
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise InputError("not valid Unicode (lone surrogate)", field=where)
            return item
        if isinstance(item, int) and item.bit_length() > _MAX_INT_BITS:
            raise InputError("number too large", field=where)
        if item is None or isinstance(item, bool | int | float):
            return item
        if isinstance(item, datetime.date):  # an explicit `!!timestamp`
            return item.isoformat()
        if not isinstance(item, dict | list | tuple):
            raise InputError(f"unsupported value of type {type(item).__name__}", field=where)
        if depth >= MAX_DEPTH:
            raise InputError(f"nested more than {MAX_DEPTH} levels deep", field=where)
        if id(item) in active:
            raise InputError("refers to itself (recursive alias)", field=where)
        active.add(id(item))
        if isinstance(item, dict):
            out: Any = {}
            for k, v in item.items():
                name = _key(k, where)
                out[name] = walk(v, _child(where, name), depth + 1)
        else:
            out = [walk(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item)]
        active.discard(id(item))
        return out

    return walk(value, where, 0)


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
    """Bytes to a JSON value (see plain_value); raises InputError when it is neither JSON nor
    YAML, or when it is a value no JSON document could hold."""
    if data.startswith(_GZIP_MAGIC):
        data = gunzip(data)
    elif (inner := _maybe_base64_gzip(data)) is not None:
        data = gunzip(inner)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text (expected YAML or JSON)") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from None
        except RecursionError:
            raise InputError("invalid JSON: nested too deeply") from None
        except ValueError:  # an integer with more digits than Python will convert
            raise InputError("invalid JSON: a number with too many digits") from None
        return plain_value(value)
    try:
        docs = [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}") from None
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply") from None
    except Exception as exc:
        # PyYAML's constructors raise bare KeyError, ValueError, IndexError or AttributeError
        # for a scalar that its tag or form does not allow (`!!bool abc`, `!!int`,
        # `!!timestamp x`, an integer with more digits than Python converts). Their text
        # quotes the scalar, which may be a secret: only the type is named.
        raise InputError(
            f"invalid YAML: a value that cannot be read ({type(exc).__name__})"
        ) from None
    if not docs:
        raise InputError("empty document")
    if len(docs) > 1:
        raise InputError(f"expected one document, found {len(docs)}")
    return plain_value(docs[0])
