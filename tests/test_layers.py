"""The package's folders are its layers, and imports only point down (or stay in their layer):
a newcomer reads the architecture from `ls agent/`, and this keeps it true."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "agent"

# Lowest first. A module may import its own layer and the layers below it.
LAYERS: list[set[str]] = [
    {"agent", "agent.errors"},
    {"agent.model"},
    {"agent.core"},
    {"agent.host"},
    {"agent.update"},
    {"agent.sources", "agent.observe", "agent.strategy"},
    {"agent.cluster", "agent.follow", "agent.hypershift"},
    {"agent.demo"},
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


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(AGENT.rglob("*.py")):
        parts = path.relative_to(AGENT.parent).with_suffix("").parts
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
