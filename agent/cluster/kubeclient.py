"""The few pieces of kubernetes-asyncio the agent uses, imported without the whole client.

kubernetes-asyncio's package `__init__`s import everything: `kubernetes_asyncio/__init__.py`
imports client, config, dynamic, stream, utils and watch;
`kubernetes_asyncio/client/__init__.py` every API class and every model; and
`kubernetes_asyncio/client/api_client.py` does `import kubernetes_asyncio.client.models`, whose
`__init__` imports every model again. That is ~870 modules and ~33 MiB resident (most of the
agent's memory in cluster mode), while the agent needs `Configuration`, `ApiClient` (its raw
`call_api`), the exceptions and the two config loaders, which are a dozen small modules.

`lazy_packages()` puts a placeholder for each of the three heavy packages (`kubernetes_asyncio`,
`.client`, `.client.models`) into `sys.modules` before their first import. A placeholder is the
real package module (the real spec, `__path__` and `__file__`, so its submodules import as
usual) whose `__init__` has not run yet. A module `__getattr__` (PEP 562) resolves a missing
name the first time it is asked for, and stores it on the module like an import would:

1. a dunder: its literal value in the real `__init__`'s source (`__version__ = "36.1.0"`);
2. a line `from M import name` in that source: import M alone (`client.ApiClient` ->
   `kubernetes_asyncio/client/api_client.py`, `client.CoreV1Api` ->
   `kubernetes_asyncio/client/api/core_v1_api.py`, `client.models.V1Pod` ->
   `kubernetes_asyncio/client/models/v1_pod.py`: `ApiClient.deserialize` looks models up by name,
   and their nested models in turn);
3. a submodule of that name (`kubernetes_asyncio.watch`);
4. anything else: run the real `__init__` into the module, as a plain import would have, so
   code that uses the package in full works unchanged (the line format of the generated
   `__init__`s has been the same from 30.1 to 36.1; were it to change, names would resolve
   through this slower path, never wrongly).

The placeholders are the only state, and they live where every module does, in `sys.modules`;
when the package is already imported nothing is replaced. `tests/test_kubeclient.py` checks
that the agent's cluster modules load no model and no API class.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any

ROOT = "kubernetes_asyncio"
# Parent before child: each spec is found in its parent's __path__, without importing it.
HEAVY = (ROOT, f"{ROOT}.client", f"{ROOT}.client.models")


def lazy_packages() -> None:
    """Install the placeholders (once per process; a no-op when the package is already loaded)."""
    if ROOT in sys.modules:
        return
    parent: ModuleType | None = None
    for name in HEAVY:
        spec = (importlib.util.find_spec(name) if parent is None
                else PathFinder.find_spec(name, parent.__path__))  # fmt: skip
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            raise ImportError(f"{name}: not an installed package", name=name)
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _resolver(module, spec)  # type: ignore[method-assign]
        sys.modules[name] = module
        if parent is not None:
            setattr(parent, name.rpartition(".")[2], module)
        parent = module


def _resolver(module: ModuleType, spec: ModuleSpec) -> Any:
    def __getattr__(name: str) -> Any:
        source = _init_source(spec)
        # `__version__ = "36.1.0"`: kubernetes_asyncio/dynamic/discovery.py imports it
        if name.startswith("__"):
            found = re.search(rf"^{re.escape(name)}\s*=\s*(.+)$", source, re.M)
            if not found:
                raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")
            try:
                value = ast.literal_eval(found.group(1))
            except (ValueError, SyntaxError):
                return _load_in_full(module, spec, name)
            setattr(module, name, value)
            return value
        found = re.search(rf"^from\s+([\w.]+)\s+import\s+{re.escape(name)}\s*$", source, re.M)
        if found:
            value = getattr(importlib.import_module(found.group(1)), name)
            setattr(module, name, value)
            return value
        try:
            return importlib.import_module(f"{spec.name}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{spec.name}.{name}":
                raise
        return _load_in_full(module, spec, name)

    return __getattr__


def _init_source(spec: ModuleSpec) -> str:
    # Read on each miss, never cached: a resolved name is stored on the module, so this runs
    # once per name the process uses (a few dozen at most; the models' file is ~100 kB).
    assert spec.origin is not None
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def _load_in_full(module: ModuleType, spec: ModuleSpec, name: str) -> Any:
    """Run the real `__init__` into the placeholder: from then on it is the ordinary package."""
    resolver = module.__dict__.pop("__getattr__")
    try:
        assert spec.loader is not None
        spec.loader.exec_module(module)
    except BaseException:
        module.__getattr__ = resolver  # type: ignore[method-assign]
        raise
    try:
        return module.__dict__[name]
    except KeyError:
        raise AttributeError(f"module {spec.name!r} has no attribute {name!r}") from None


lazy_packages()

# Imported after the placeholders are in place (hence E402), from the submodules that define them.
from kubernetes_asyncio.client.api_client import ApiClient  # noqa: E402
from kubernetes_asyncio.client.configuration import Configuration  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402
from kubernetes_asyncio.config.incluster_config import load_incluster_config  # noqa: E402
from kubernetes_asyncio.config.kube_config import load_kube_config  # noqa: E402

__all__ = ["ApiClient", "ApiException", "Configuration", "lazy_packages",
           "load_incluster_config", "load_kube_config"]  # fmt: skip
