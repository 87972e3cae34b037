"""Label and field selectors (query-string syntax) and LabelSelector objects (PDBs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import ApiError
from .resources import ResourceType

_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=,()]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([^\s!=,()]+)\s*(==|=|!=)\s*([^\s,()]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(s: str) -> list[str]:
    """Split on commas that are not inside `in (a,b)` parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(s: str | None) -> tuple[Requirement, ...]:
    if not s:
        return ()
    reqs = []
    for part in _split_top_level(s):
        if m := _EQ_RE.match(part):
            key, op, value = m.groups()
            reqs.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
        elif m := _SET_RE.match(part):
            neg, key, op, values = m.groups()
            if op:
                vals = tuple(v.strip() for v in values.split(",") if v.strip())
                reqs.append(Requirement(key, op, vals))
            else:
                reqs.append(Requirement(key, "!exists" if neg else "exists"))
        else:
            raise ApiError.bad_request(f"unable to parse requirement: {part!r}")
    return tuple(reqs)


def field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


def parse_field_selector(s: str | None, rt: ResourceType) -> tuple[tuple[str, str, str], ...]:
    if not s:
        return ()
    out = []
    for part in s.split(","):
        m = re.match(r"^\s*([^=!\s]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError.bad_request(f"invalid selector: '{s}'; can't understand '{part}'")
        field, op, value = m.groups()
        if not rt.supports_field(field):
            raise ApiError.bad_request(f"field label not supported: {field}")
        out.append((field, "!=" if op == "!=" else "=", value))
    return tuple(out)


@dataclass(frozen=True)
class Selector:
    """A parsed `labelSelector` + `fieldSelector` pair."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def parse(cls, rt: ResourceType, label: str | None, field: str | None) -> Selector:
        return cls(parse_label_selector(label), parse_field_selector(field, rt))

    def matches(self, obj: dict[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        for field, op, value in self.fields:
            if (field_value(obj, field) == value) != (op == "="):
                return False
        return True

    def field_equals(self, field: str) -> str | None:
        """The value of a `field=value` requirement (e.g. the name a node may list)."""
        for f, op, value in self.fields:
            if f == field and op == "=":
                return value
        return None


def label_selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics: null matches nothing, {} matches everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}.get(
            expr.get("operator", ""), ""
        )
        if not op or not Requirement(expr["key"], op, tuple(expr.get("values") or ())).matches(
            labels
        ):
            return False
    return True
