"""A simulated host's directory: its state files, its action log, its layer cache, its files.

Layout of DIR:
  root/            the host's filesystem (etc/passwd, /etc/kubernetes, ...), laid out as ostree
                   does: /home -> var/home, /root -> var/roothome
  host.json        the bootc deployments (booted/staged/rollback), boot ID, pending reboot,
                   injected faults (next boot fails, disk full, reboot or rollback refused)
  registry.json    the images this host can pull, by digest, and where each tag points
  layers.json      the image layers fetched so far, by digest (ostree's layer cache)
  actions.log      one JSON line per unit action, command, layer pulled and reboot, in order

An image is LAYERS layers. A fetched layer stays cached until a stage completes: every stage
prunes the images no deployment uses, as bootc's cleanup at the end of each stage runs
ostree-ext's prune (bootc v1.16.9, crates/lib/src/deploy.rs: the cleanup call at line 1121,
the prune at 869: https://github.com/bootc-dev/bootc/blob/v1.16.9/crates/lib/src/deploy.rs).

`HostState` is what the simulated host (simulated.py), its bootc (simulated_bootc.py) and its
system (simulated_system.py) share: the two ports depend on this class, not on `SimulatedHost`,
whose module builds them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import HostError
from agent.host.durable import read_json, write_json
from standins.bootc_releases import DEFAULT_PERSONA, features_of

LAYERS = 3


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def release_features(version: str) -> frozenset[str]:
    """The features of bootc `version`; an unknown release is the caller's mistake (input)."""
    try:
        return features_of(version)
    except ValueError as exc:
        raise HostError(f"simulated bootc: {exc}", kind="input") from None


@dataclass
class HostState:
    """The directory `base` of a simulated host, read and written."""

    base: Path

    # -- paths ---------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def _state_path(self) -> Path:
        return self.base / "host.json"

    @property
    def _registry_path(self) -> Path:
        return self.base / "registry.json"

    @property
    def _layers_path(self) -> Path:
        return self.base / "layers.json"

    def _state(self) -> dict[str, Any]:
        state = read_json(self._state_path)
        if state is None:
            raise HostError(f"{self.base} is not a simulated host (no host.json)", kind="input")
        return state

    def _registry(self) -> dict[str, Any]:
        return read_json(self._registry_path) or {"images": {}}

    def log_action(self, kind: str, detail: str) -> None:
        line = json.dumps({"time": utc_now(), "kind": kind, "detail": detail})
        with open(self.base / "actions.log", "a") as handle:
            handle.write(line + "\n")

    def actions(self) -> list[dict[str, str]]:
        path = self.base / "actions.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def stages(self, digest: str) -> list[tuple[int, bool]]:
        """Every stage of `digest` asked for, in order: (bytes fetched, locked). The last one
        is the node's turn; any before it were pre-stages."""
        found = []
        for action in self.actions():
            if action["kind"] == "fetched" and action["detail"].startswith(digest + " "):
                _, fetched, lock = action["detail"].split()
                found.append((int(fetched), lock == "locked"))
        return found

    @property
    def bootc_version(self) -> str:
        return str(self._state().get("bootc_version") or DEFAULT_PERSONA)

    def features(self) -> frozenset[str]:
        return release_features(self.bootc_version)

    # -- the layer cache -----------------------------------------------------------------
    def cached_layers(self, digest: str) -> set[int]:
        """The layers (1..LAYERS) of `digest` on disk. A deployed image has all of them."""
        state = self._state()
        deployed = (state.get(slot) or {} for slot in ("booted", "staged", "rollback"))
        if any(slot.get("digest") == digest for slot in deployed):
            return set(range(1, LAYERS + 1))
        return set((read_json(self._layers_path) or {}).get(digest, []))

    def _cache_layer(self, digest: str, layer: int) -> None:
        cache = read_json(self._layers_path) or {}
        cache[digest] = sorted({*cache.get(digest, []), layer})
        write_json(self._layers_path, cache)

    def _prune(self, state: dict[str, Any]) -> None:
        """What ends every bootc stage: images no deployment uses leave the repository."""
        deployed = {(state.get(slot) or {}).get("digest") for slot in ("booted", "staged",
                                                                      "rollback")}  # fmt: skip
        cache = read_json(self._layers_path) or {}
        pruned = sorted(digest for digest in cache if digest not in deployed)
        if pruned:
            write_json(self._layers_path, {d: v for d, v in cache.items() if d in deployed})
            for digest in pruned:
                self.log_action("prune", digest)

    # -- the image's files -----------------------------------------------------------------
    def _lay_image_files(self, old_digest: str | None, new_digest: str | None) -> None:
        """Boot the new image's files as ostree deploys them (what the real ostree VM tier
        showed): its /usr replaces the old one, and its /etc files land in /usr/etc and reach
        /etc through the 3-way merge: a file the host changed from the old image's default
        keeps the host's version, an unchanged or absent one takes the new image's, and one
        the new image no longer ships goes unless the host changed it. (A real rollback boots
        the old deployment's own /etc instead; for files the host never changed, the same.)"""
        images = self._registry()["images"]
        old = (images.get(old_digest) or {}).get("files", {})
        new = (images.get(new_digest) or {}).get("files", {})
        for rel, text in old.items():
            if rel in new:
                continue
            if rel.startswith("etc/"):
                (self.root / "usr" / rel).unlink(missing_ok=True)
                if self._text(rel) != text:
                    continue  # changed on the host: the merge keeps it
            (self.root / rel).unlink(missing_ok=True)
        for rel, text in new.items():
            if rel.startswith("etc/"):
                self._lay(f"usr/{rel}", text)
                if self._text(rel) not in (None, old.get(rel)):
                    continue  # changed on the host: the merge keeps the host's version
            self._lay(rel, text)

    def _text(self, rel: str) -> str | None:
        try:
            return (self.root / rel).read_text()
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def _lay(self, rel: str, text: str) -> None:
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        if text.startswith("#!"):
            target.chmod(0o755)
