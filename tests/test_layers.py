"""The package's folders are its layers, and imports only point down (or stay in their layer):
a newcomer reads the architecture from `ls agent/`, and this keeps it true. The stand-ins
(`standins/`) sit beside the agent, never inside it: the agent reaches them only from its
command line, when asked for, and no import goes round in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "agent"
STANDINS = REPO / "standins"
# Where the agent may load a stand-in, inside the function that needs it: `sim`, `demo` and
# `--host simulated:DIR` (run, verify).
STANDIN_DOORS = {"agent.app.cli", "agent.app.runtime"}

# Lowest first. A module may import its own layer and the layers below it.
LAYERS: list[set[str]] = [
    {"agent", "agent.errors"},
    {"agent.model"},
    {"agent.core"},
    {"agent.host"},
    {"agent.update"},
    {"agent.sources", "agent.observe", "agent.strategy"},
    {"agent.cluster", "agent.follow", "agent.hypershift"},
    {"standins.demo"},
    {"agent.app", "agent.__main__"},
]
PURE = {"agent.model", "agent.core"}
IO_MODULES = {"asyncio", "subprocess", "socket", "aiohttp", "dbus_fast", "kubernetes_asyncio",
              "os", "shutil", "tempfile"}  # fmt: skip


def layer_of(module: str) -> int:
    parts = module.split(".")
    for depth in (2, 1):
        prefix = ".".join(parts[:depth])
        for rank, members in enumerate(LAYERS):
            if prefix in members:
                return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def modules(*packages: Path) -> dict[str, Path]:
    found = {}
    for package in packages or (AGENT,):
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_module_has_a_layer_and_imports_point_down() -> None:
    wrong = []
    for name, path in modules().items():
        own = layer_of(name)
        for imported in imports_of(path):
            if imported.split(".")[0] == "tests":
                wrong.append(f"{name} imports {imported}: product code never imports tests/")
            elif imported.split(".")[0] == "agent" and layer_of(imported) > own:
                wrong.append(f"{name} (layer {own}) imports {imported} (layer "
                             f"{layer_of(imported)})")  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_the_functional_core_does_no_io() -> None:
    wrong = [f"{name} imports {imported}"
             for name, path in modules().items() if ".".join(name.split(".")[:2]) in PURE
             for imported in imports_of(path) if imported.split(".")[0] in IO_MODULES]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_the_top_of_the_package_holds_only_folders() -> None:
    loose = sorted(p.name for p in AGENT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py"]


def top_level_imports(path: Path) -> set[str]:
    """What a module imports when it is loaded (not inside a function)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, part, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(ast.parse(path.read_text()).body)
    return names


def test_the_agent_loads_stand_ins_only_when_asked_for() -> None:
    wrong = []
    for name, path in modules().items():
        for imported in imports_of(path):
            if imported.split(".")[0] != "standins":
                continue
            if name not in STANDIN_DOORS:
                wrong.append(f"{name} imports {imported}: only {sorted(STANDIN_DOORS)} may")
            elif imported in top_level_imports(path):
                wrong.append(f"{name} imports {imported} when loaded, not when asked for")
    assert not wrong, "\n".join(wrong)


def test_a_plain_run_loads_no_stand_in() -> None:
    """`run --help` (every flag, every subcommand's parser) loads no module of standins/."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\n"
            "from agent.app import cli, runtime\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.build_parser().parse_args(['run', '--help'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'standins'))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_no_product_module_names_the_stand_ins() -> None:
    """The agent's modules speak of hosts, never of the simulated one (the ports are the
    seam); only the command line that loads it names it."""
    words = ("simulated", "standins", "stand-in", "fakekube")
    wrong = [f"{name}: {word!r}" for name, path in modules().items()
             if name not in STANDIN_DOORS
             for word in words if word in path.read_text().lower()]  # fmt: skip
    assert not wrong, "\n".join(wrong)


def _module_graph(*packages: Path) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports anywhere (functions and TYPE_CHECKING
    blocks too: a circle there still ties the modules together). `from pkg import sub` of
    a submodule is an edge to `sub` only."""
    mods = modules(*packages)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = (".".join(base) + (f".{node.module}" if node.module else "")
                          if node.level else node.module or "")  # fmt: skip
                subs = {f"{module}.{a.name}" for a in node.names} & mods.keys()
                edges.update(subs if len(subs) == len(node.names) else {module, *subs})
        graph[name] = {edge for edge in edges if edge in mods and edge != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_goes_round_in_a_circle() -> None:
    circles = _circles(_module_graph(AGENT, STANDINS))
    assert not circles, "\n".join(" <-> ".join(group) for group in circles)


def test_the_circle_finder_finds_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
