"""Where the conformance tier's peer binaries come from. The kit ships none (its README,
"Binaries"): the user supplies them, and each is looked up in this order, the first
executable found winning:

1. `KIT_BIN`, a folder holding all of them (the kit's own convention);
2. the kit's `bin/` (where its README says to put them);
3. `KUBEBUILDER_ASSETS`, the folder controller-runtime's `setup-envtest` fills with
   `kube-apiserver`, `etcd` and `kubectl` (it has no machine-config-controller);
4. `PATH`, for `etcd` and `kubectl` only (Debian packages both: `etcd-server`, `kubectl`).

The kit's scripts take one folder (`KIT_BIN`) for all of them, so the binaries found are linked
into one folder of the tier's own (`link_into`). Pure lookups take the environment as an
argument, so the tests drive them with fake executables in a temp folder."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APISERVER, ETCD, KUBECTL, MCC = "kube-apiserver", "etcd", "kubectl", "machine-config-controller"
HCP = "hypershift-inplace"  # HyperShift's inplaceupgrader and drainer, started by hcp-up
CLUSTER = (APISERVER, ETCD, KUBECTL)  # what every scenario needs: cluster-up
ALL = (*CLUSTER, MCC, HCP)
ON_PATH = frozenset({ETCD, KUBECTL})
IN_ENVTEST = frozenset(CLUSTER)

# How a test skipped for a binary nobody supplied begins its reason: the tier's runner lists it
# as not run, and counts any other skip as a failure.
NOT_RUN = "not run: "

# What to do about each missing binary, in the words the tier prints.
HOW_TO_SUPPLY = {
    APISERVER: "set KIT_BIN or KUBEBUILDER_ASSETS",
    ETCD: "set KIT_BIN or KUBEBUILDER_ASSETS, or put etcd on PATH (Debian: etcd-server)",
    KUBECTL: "set KIT_BIN or KUBEBUILDER_ASSETS, or put kubectl on PATH",
    MCC: "set KIT_BIN to a folder that also holds it",
    HCP: "set KIT_BIN to a folder that also holds it",
}


@dataclass(frozen=True)
class Found:
    name: str
    path: Path | None  # None: found nowhere
    source: str = ""  # "KIT_BIN", "the kit's bin/", "KUBEBUILDER_ASSETS" or "PATH"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _candidates(name: str, env: Mapping[str, str], kit: Path | None) -> list[tuple[str, Path]]:
    folders: list[tuple[str, Path]] = []
    if env.get("KIT_BIN"):
        folders.append(("KIT_BIN", Path(env["KIT_BIN"])))
    if kit is not None:
        folders.append(("the kit's bin/", kit / "bin"))
    if env.get("KUBEBUILDER_ASSETS") and name in IN_ENVTEST:
        folders.append(("KUBEBUILDER_ASSETS", Path(env["KUBEBUILDER_ASSETS"])))
    if name in ON_PATH:
        folders += [("PATH", Path(p)) for p in env.get("PATH", "").split(os.pathsep) if p]
    return [(source, folder / name) for source, folder in folders]


def find(name: str, env: Mapping[str, str], kit: Path | None = None) -> Found:
    for source, path in _candidates(name, env, kit):
        if _executable(path):
            return Found(name, path.absolute(), source)
    return Found(name, None)


def find_all(env: Mapping[str, str], kit: Path | None = None) -> dict[str, Found]:
    return {name: find(name, env, kit) for name in ALL}


def missing(found: Mapping[str, Found], needed: tuple[str, ...] = CLUSTER) -> list[str]:
    return [name for name in needed if found[name].path is None]


def why_not_run(found: Mapping[str, Found], needed: tuple[str, ...] = CLUSTER) -> str | None:
    """None when all of `needed` were found; else `no NAME: what to do` for the first one
    missing (the API server first: nothing runs without it). `describe` lists them all."""
    absent = missing(found, needed)
    return f"no {absent[0]}: {HOW_TO_SUPPLY[absent[0]]}" if absent else None


def describe(found: Mapping[str, Found]) -> str:
    """One line per binary: where it was found, or that it was not."""
    return "\n".join(
        f"  {f.name}: {f.path} (from {f.source})" if f.path else f"  {f.name}: not found"
        for f in found.values()
    )


def link_into(found: Mapping[str, Found], folder: Path) -> Path:
    """One folder holding every binary found, for the kit's `KIT_BIN`. The kit recognises its
    processes by the basename of /proc/PID/exe, which a symlink resolves to its target: a
    binary whose real file has another name is hard-linked, or copied across filesystems."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in found.values():
        if f.path is None:
            continue
        target, link = f.path.resolve(), folder / f.name
        tmp = folder / f".{f.name}.tmp{os.getpid()}"
        tmp.unlink(missing_ok=True)
        if target.name == f.name:
            tmp.symlink_to(target)
        else:
            try:
                os.link(target, tmp)
            except OSError:
                shutil.copy2(target, tmp)
        tmp.replace(link)  # atomic: a running script never sees a half-made entry
        # rename(2) onto another hard link of the same file succeeds and moves nothing
        tmp.unlink(missing_ok=True)
    return folder
