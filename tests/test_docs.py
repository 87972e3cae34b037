"""The reference and the runbooks stay true to the code: every flag, metric, Event reason and
environment variable the agent has is in docs/reference.md, and every reason text, host error kind
and health check it can produce is in docs/operate.md's troubleshooting tables.

How each list is taken from the code (so that a new one fails this test until it is documented):

- Flags: `build_parser()` is walked through its sub-parsers. Each command path (`run`,
  `sim add-image`, ...) must have a section headed "`image-mode-agent <path>`" (the top-level
  parser: "`image-mode-agent`"), and each option string of that parser must be in the first
  column of a table in that section. Where a flag has a default (not None, False or ""), the
  table row must show it (floats as `format(x, "g")`); choices must be named in the row too,
  each as a code span.
- Metrics: every `Gauge/Counter/Histogram/Summary(...)` call under `agent/` with a literal
  name (the AST), cross-checked with the names a fresh `Metrics()` registry exports. A Counter
  is documented by its exported name (`<name>_total`). They must be in the first column of
  the metrics table.
- Event reasons: the literal first argument of every `*.emit(...)` call under `agent/`.
- Environment variables: literal keys of `os.environ.get/[]` (and of `env.get`/`environ.get`
  reading a process environment), keys set beside `**os.environ` for children, and `$VAR`s
  of the shipped units.
- Reason texts: string literals and f-strings passed at the places that build a state reason
  or a failure cause (REASON_SITES below: `Outcome(state, reason)`, `_set_state(state,
  reason)`, `Verdict(decision, cause)`, `_degrade(rec, cause)`, `_reboot(rec, plan, why)`,
  `DrainTimeout(text)`, the drain `report(text)`, `cause=`/`reasons=` keywords,
  `reasons.append/insert/extend`, the returns of `*_reasons()` and of `render()` in
  agent/host/ports.py, i.e. `Progress.render()`).
  A local name passed there is resolved to the literals assigned to it in the same function;
  a local name used inside an f-string is inlined when every assignment to it is a literal,
  or expanded to each value when it is a loop variable over literal strings (`for section
  in ("disks", ...)`). A function parameter stays a placeholder (so `failed to {what} node`
  is one template for its drain and uncordon texts).
  Each site must yield at least one template, so a refactoring that renames a site fails
  here rather than silently documenting nothing. A template becomes a pattern: its literal
  text exactly, each `{...}` a placeholder that the guide writes as `<words>` (or as concrete
  text). Templates with no letters outside their placeholders (pure compositions such as
  `f"{a}: {b}"`) are skipped: their parts are templates of their own. The pattern must match
  a whole code span in the first column of the reason table.
- Host error kinds (the `(<kind>)` in "host error (<kind>): ..." and "staging ... failed
  (<kind>)"): every literal `kind=` given to `HostError(...)` (or a subclass's
  `super().__init__`), with names resolved as above, plus bootc_errors' pattern kinds and
  HostError's default kind.
- Health checks: the literal names of `CheckResult(...)` calls and the detail templates of
  those that can fail (their `ok` argument is not a literal true value).

Each check looks only at the first column of its own table, so deleting one row fails it."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from agent.app.cli import build_parser
from agent.errors import HostError
from agent.host import bootc_errors
from agent.observe.metrics import Metrics

TOP = Path(__file__).resolve().parents[1]
REFERENCE = TOP / "docs/reference.md"  # commands, metrics, Events, environment
OPERATE = TOP / "docs/operate.md"  # reason texts, host error kinds, health checks
SOURCES = sorted(p for p in (TOP / "agent").rglob("*.py") if "demo" not in p.parts)
UNITS = sorted((TOP / "systemd").glob("*.service"))

# Callable name -> index of the positional argument that carries a reason (or cause).
REASON_CALLS = {
    "Outcome": 1,
    "_set_state": 1,
    "Verdict": 1,
    "_degrade": 1,
    "_reboot": 2,
    "DrainTimeout": 0,
    "report": 0,
}
REASON_KEYWORDS = ("cause", "reasons")
REASON_LIST_METHODS = {"append": 0, "extend": 0, "insert": 1}  # on a name `reasons`
REASON_RETURNS = re.compile(r"_reasons$")  # any `*_reasons()` function
# Progress.render(): "Staging image: 412/1380 MiB"
REASON_RETURNS_IN = {"agent/host/ports.py": "render"}
METRIC_TYPES = {"Gauge", "Counter", "Histogram", "Summary"}


# -- the pages ---------------------------------------------------------------------------------
@cache
def page(path: Path) -> str:
    return path.read_text()


def sections(path: Path = REFERENCE) -> list[tuple[str, str]]:
    """(heading text, body up to the next heading of the same or a higher level) of a page."""
    lines = page(path).splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines)
             if (m := re.match(r"(#{1,6}) (.*)", line))]  # fmt: skip
    out = []
    for n, (i, level, title) in enumerate(heads):
        end = next((j for j, lv, _ in heads[n + 1 :] if lv <= level), len(lines))
        out.append((title, "\n".join(lines[i + 1 : end])))
    return out


def section(title_part: str, path: Path = REFERENCE) -> str:
    found = [body for title, body in sections(path) if title_part in title]
    assert found, f"docs/{path.name} has no section headed {title_part!r}"
    return "\n".join(found)


def first_column(body: str) -> list[tuple[list[str], str]]:
    """(code spans of the first cell, whole row) of every table row in `body`."""
    rows = []
    for line in body.splitlines():
        if not line.startswith("|") or re.match(r"\|\s*-", line):
            continue
        cell = re.split(r"(?<!\\)\|", line)[1]  # `\|` is a pipe inside a cell
        rows.append((re.findall(r"`([^`]+)`", cell), line))
    return rows


def first_column_spans(body: str) -> set[str]:
    return {span for spans, _ in first_column(body) for span in spans}


# -- the code ----------------------------------------------------------------------------------
@cache
def trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in SOURCES}


def walk_functions(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(node, its innermost enclosing function or the module) for every node."""

    def visit(node: ast.AST, scope: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            yield child, scope
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
            yield from visit(child, inner)

    yield from visit(tree, tree)


def assignments(scope: ast.AST, name: str) -> list[ast.expr]:
    values = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                values.append(node.value)
        elif (
            isinstance(node, ast.AnnAssign | ast.AugAssign)
            and node.value is not None
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            values.append(node.value)
    return values


def loop_values(scope: ast.AST, name: str) -> list[str]:
    """The literal strings a loop variable takes: `for name in ("a", "b")` or
    `for (flag, name) in ((x, "a"), (y, "b"))`; [] when any of them is not a literal."""
    for node in ast.walk(scope):
        if not isinstance(node, ast.For | ast.comprehension):
            continue
        target, items = node.target, node.iter
        if not isinstance(items, ast.Tuple | ast.List):
            continue
        if isinstance(target, ast.Name) and target.id == name:
            picked = list(items.elts)
        elif isinstance(target, ast.Tuple) and any(
            isinstance(t, ast.Name) and t.id == name for t in target.elts
        ):
            index = next(i for i, t in enumerate(target.elts)
                         if isinstance(t, ast.Name) and t.id == name)  # fmt: skip
            picked = [e.elts[index] if isinstance(e, ast.Tuple) else e for e in items.elts]
        else:
            continue
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in picked):
            return [e.value for e in picked]  # type: ignore[attr-defined]
        return []
    return []


Template = tuple[str | None, ...]  # literal text, None for a placeholder


def templates(expr: ast.expr | None, scope: ast.AST, depth: int = 0) -> list[Template]:
    """The literal texts an expression can take, as templates; [] for anything computed."""
    if expr is None or depth > 4:
        return []
    match expr:
        case ast.Constant(value=str() as text):
            return [(text,)] if text else []
        case ast.JoinedStr():
            return _joined(expr, scope, depth)
        case ast.Name(id=name):
            return [t for value in assignments(scope, name)
                    for t in templates(value, scope, depth + 1)]  # fmt: skip
        case ast.List(elts=elts) | ast.Tuple(elts=elts):
            return [t for e in elts if not isinstance(e, ast.Starred)
                    for t in templates(e, scope, depth + 1)]  # fmt: skip
        case ast.ListComp(elt=elt) | ast.GeneratorExp(elt=elt):
            return templates(elt, scope, depth + 1)
        case ast.IfExp(body=body, orelse=orelse):
            return templates(body, scope, depth + 1) + templates(orelse, scope, depth + 1)
        case ast.BoolOp(values=values):
            return [t for v in values for t in templates(v, scope, depth + 1)]
    return []


def _joined(expr: ast.JoinedStr, scope: ast.AST, depth: int) -> list[Template]:
    variants: list[list[str | None]] = [[]]
    for part in expr.values:
        if isinstance(part, ast.Constant):
            for v in variants:
                v.append(str(part.value))
            continue
        assert isinstance(part, ast.FormattedValue)
        inlined: list[Template] = []
        if isinstance(part.value, ast.Name):
            values = assignments(scope, part.value.id)
            if values and all(isinstance(v, ast.Constant | ast.JoinedStr) for v in values):
                inlined = [t for v in values for t in templates(v, scope, depth + 1)]
            elif not values:
                inlined = [(text,) for text in loop_values(scope, part.value.id)]
        options = inlined or [(None,)]
        variants = [[*v, *option] for v in variants for option in options]
    return [tuple(v) for v in variants]


def literal(template: Template) -> str:
    return "".join(p for p in template if p is not None)


def pattern(template: Template) -> re.Pattern[str]:
    parts = [re.escape(p) if p is not None else r"(?:<[^<>]+>|.+?)" for p in template]
    return re.compile("".join(parts), re.S)


def call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def reason_templates() -> dict[str, set[Template]]:
    """Per site, the reason templates found there."""
    found: dict[str, set[Template]] = {}

    def add(site: str, items: list[Template]) -> None:
        found.setdefault(site, set()).update(items)

    for path, tree in trees().items():
        for node, scope in walk_functions(tree):
            if isinstance(node, ast.Call):
                name = call_name(node)
                index = REASON_CALLS.get(name)
                if index is not None and len(node.args) > index:
                    add(name, templates(node.args[index], scope))
                index = REASON_LIST_METHODS.get(name)
                receiver = getattr(node.func, "value", None)
                if (
                    index is not None
                    and isinstance(receiver, ast.Name)
                    and receiver.id == "reasons"
                ):
                    add(f"reasons.{name}", templates(node.args[index], scope))
                for kw in node.keywords:
                    if kw.arg in REASON_KEYWORDS:
                        add(f"{kw.arg}=", templates(kw.value, scope))
            elif (
                isinstance(node, ast.Return)
                and isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
                and (
                    REASON_RETURNS.search(scope.name)
                    or REASON_RETURNS_IN.get(path.relative_to(TOP).as_posix()) == scope.name
                )
            ):
                add(f"return of {scope.name}()", templates(node.value, scope))
    return found


def host_error_kinds() -> set[str]:
    kinds = {kind for kind, _ in bootc_errors._PATTERNS}
    kinds.add(inspect.signature(HostError.__init__).parameters["kind"].default)
    for tree in trees().values():
        for node, scope in walk_functions(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            is_super = (
                isinstance(func, ast.Attribute)
                and func.attr == "__init__"
                and isinstance(func.value, ast.Call)
                and call_name(func.value) == "super"
            )
            if call_name(node) != "HostError" and not is_super:
                continue
            for kw in node.keywords:
                if kw.arg == "kind":
                    kinds.update(literal(t) for t in templates(kw.value, scope))
    return kinds


def check_calls() -> tuple[set[str], set[Template]]:
    names: set[str] = set()
    details: set[Template] = set()
    for tree in trees().values():
        for node, scope in walk_functions(tree):
            if not (isinstance(node, ast.Call) and call_name(node) == "CheckResult"):
                continue
            if node.args and isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
            ok = node.args[2] if len(node.args) > 2 else None
            always_ok = isinstance(ok, ast.Constant) and bool(ok.value)
            if len(node.args) > 3 and not always_ok:
                details.update(templates(node.args[3], scope))
    return names, details


def metric_names() -> set[str]:
    """Exported names, from the AST of every metric constructor under agent/."""
    names = set()
    for tree in trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and call_name(node) in METRIC_TYPES and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    counter = call_name(node) == "Counter"
                    names.add(first.value + ("_total" if counter else ""))
    return names


def event_reasons() -> set[str]:
    reasons = set()
    for tree in trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and call_name(node) == "emit" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    reasons.add(first.value)
    return reasons


def environment_variables() -> set[str]:
    names: set[str] = set()
    upper = re.compile(r"^[A-Z][A-Z0-9_]+$")

    def is_environ(expr: ast.expr) -> bool:
        if isinstance(expr, ast.Attribute):
            return expr.attr == "environ"
        return isinstance(expr, ast.Name) and expr.id in ("env", "environ")

    for tree in trees().values():
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and call_name(node) == "get" and node.args:
                if is_environ(node.func.value):  # type: ignore[attr-defined]
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and is_environ(node.value):
                key = node.slice
            elif isinstance(node, ast.Dict) and any(
                k is None and is_environ(v) for k, v in zip(node.keys, node.values, strict=True)
            ):
                names.update(k.value for k in node.keys if isinstance(k, ast.Constant))
            if isinstance(key, ast.Constant) and upper.match(str(key.value)):
                names.add(key.value)
    for unit in UNITS:
        names.update(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", unit.read_text()))
        names.update(re.findall(r'Environment="?([A-Z][A-Z0-9_]+)=', unit.read_text()))
    return names


def parsers() -> Iterator[tuple[str, object]]:
    """(command path, parser) for the top-level parser and every sub-parser."""

    def visit(path: str, parser: object) -> Iterator[tuple[str, object]]:
        yield path, parser
        for action in parser._actions:  # type: ignore[attr-defined]
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from visit(f"{path} {name}".strip(), sub)

    yield from visit("", build_parser())


# -- the tests ---------------------------------------------------------------------------------
def _command_section(path: str) -> str:
    heading = f"`image-mode-agent{' ' + path if path else ''}`"
    found = [body for title, body in sections()
             if title == heading or title.startswith(heading + " ")]  # fmt: skip
    assert found, f"docs/reference.md: no section headed {heading}"
    return found[0]


def _default_text(value: object) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


@pytest.mark.parametrize("path", [path for path, _ in parsers()], ids=lambda p: p or "global")
def test_every_flag_is_documented_in_its_command_section(path: str) -> None:
    parser = dict(parsers())[path]
    body = _command_section(path)
    rows = first_column(body)
    missing, wrong = [], []
    for action in parser._actions:  # type: ignore[attr-defined]
        flags = [o for o in action.option_strings if o not in ("-h", "--help")]
        if not flags:
            continue
        row = next((line for spans, line in rows
                    if any(s.split()[0] in flags for s in spans)), None)  # fmt: skip
        if row is None:
            missing.append(flags[0])
            continue
        default = action.default
        if (
            default not in (None, False, "", argparse.SUPPRESS)
            and _default_text(default) not in row
        ):
            wrong.append(f"{flags[0]}: default {default!r} not in its row")
        for choice in action.choices or ():
            if f"`{choice}`" not in row:
                wrong.append(f"{flags[0]}: choice {choice!r} not in its row")
    assert not missing, f"flags of `image-mode-agent {path}` not in its table: {missing}"
    assert not wrong, wrong


def test_every_metric_is_documented() -> None:
    names = metric_names()
    exported = set()
    for family in Metrics().registry.collect():
        exported.add(family.name + ("_total" if family.type == "counter" else ""))
    assert names == exported, "metrics registered outside Metrics(): update this test's scan"
    documented = first_column_spans(section("Metrics"))
    assert not names - documented, f"metrics missing from the metrics table: {names - documented}"


def test_every_event_reason_is_documented() -> None:
    reasons = event_reasons()
    assert len(reasons) >= 5, reasons  # the scan still finds the emit() calls
    documented = first_column_spans(section("Events"))
    assert not reasons - documented, f"Event reasons missing: {sorted(reasons - documented)}"


def test_every_environment_variable_is_documented() -> None:
    names = environment_variables()
    assert {"NODE_NAME", "IMAGE_MODE_AGENT_ARGS"} <= names, names
    documented = first_column_spans(section("Environment"))
    assert not names - documented, f"variables missing: {sorted(names - documented)}"


def test_every_reason_site_still_yields_templates() -> None:
    found = reason_templates()
    expected = {*REASON_CALLS, "cause=", "reasons=", "reasons.append", "reasons.insert",
                "return of unreconcilable_reasons()", "return of render()"}  # fmt: skip
    empty = sorted(site for site in expected if not found.get(site))
    assert not empty, f"reason sites that no longer yield a template (update REASON_*): {empty}"


def _undocumented(items: set[Template], spans: set[str]) -> list[str]:
    """Templates that no span matches. A span that is exactly a fixed text of the code
    documents that text only, not also a template with placeholders that it happens to fit
    (so `ignition <section> section contains changes` needs a row of its own)."""
    fixed = {literal(t) for t in items if None not in t}
    missing = []
    for template in sorted(items, key=literal):
        if not re.search(r"[A-Za-z]", literal(template)):
            continue  # a composition of other templates
        regex = pattern(template)
        candidates = spans if None not in template else spans - fixed
        if not any(regex.fullmatch(span.replace("\\|", "|")) for span in candidates):
            missing.append("".join(p if p is not None else "<…>" for p in template))
    return missing


def test_every_reason_text_is_in_the_troubleshooting_table() -> None:
    items = {t for site in reason_templates().values() for t in site}
    spans = first_column_spans(section("Reason texts", OPERATE))
    missing = _undocumented(items, spans)
    assert not missing, "reason texts missing from the table:\n" + "\n".join(missing)


def test_every_host_error_kind_is_documented() -> None:
    kinds = host_error_kinds()
    assert {"registry-auth", "disk-space", "lock", "other"} <= kinds, kinds
    documented = first_column_spans(section("Host error kinds", OPERATE))
    assert not kinds - documented, f"kinds missing: {sorted(kinds - documented)}"


def test_every_health_check_is_documented() -> None:
    names, details = check_calls()
    body = section("Health checks", OPERATE)
    spans = first_column_spans(body)
    assert not names - spans, f"checks missing: {sorted(names - spans)}"
    detail_spans = {s for line in body.splitlines() for s in re.findall(r"`([^`]+)`", line)}
    missing = _undocumented(details, detail_spans)
    assert not missing, f"check failure details missing: {missing}"
