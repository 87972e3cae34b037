"""A host as the machine-config-daemon leaves it, and a snapshot that proves nothing on it was
written: shared by the takeover tests (tests/test_takeover.py) and the cluster scenario that
runs on both API servers (tests/scenarios/cluster.py).

What the MCD leaves (reference/mco-daemon.md §5.1-5.2, §6.2; MCO daemon.go
`storeCurrentConfigOnDisk`, update.go `updateSSHKeys`): `/etc/machine-config-daemon/currentconfig`
(its json.Marshal of the rendered config, 0644), `currentimage` (empty when not layered), the
machine-config-server's `node-annotations.json` renamed `node-annotation.json.bak` after the
first boot, core's keys in `authorized_keys.d/ignition` (0600, core's, directories 0700), and
the files of the config's live part (the pull secret)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from agent.core.policy import SSH_KEYS_PATH
from agent.model.mcd_disk import CURRENT_CONFIG_PATH, CURRENT_IMAGE_PATH, on_disk_config

STATE_DIR = "var/lib/image-mode-agent"
P = "machineconfiguration.openshift.io/"


def done_annotations(config: str) -> dict[str, str]:
    """The Node as the MCD leaves it after `config`: Done, the last drain answered."""
    return {P + "currentConfig": config, P + "desiredConfig": config, P + "state": "Done",
            P + "reason": "", P + "desiredDrain": f"uncordon-{config}",
            P + "lastAppliedDrain": f"uncordon-{config}"}  # fmt: skip


def write(root: Path, path: str, data: str | bytes, mode: int, uid: int = 0) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode() if isinstance(data, str) else data)
    target.chmod(mode)
    os.chown(target, uid, uid)


def prepare(root: Path, rendered: dict[str, Any], keys: list[str], *, image: str = "",
            files: dict[str, str] | None = None) -> None:  # fmt: skip
    """`root` as the MCD leaves it after applying `rendered` (the API server's object, or
    the document it was created from); `files`: the live part's other files (path -> text)."""
    name = rendered["metadata"]["name"]
    write(root, CURRENT_CONFIG_PATH, on_disk_config(rendered), 0o644)
    write(root, CURRENT_IMAGE_PATH, image, 0o644)
    seeded = {P + "currentConfig": name, P + "desiredConfig": name,
              P + "firstPivotConfig": name, P + "state": "Done"}  # fmt: skip
    write(root, "/etc/machine-config-daemon/node-annotation.json.bak", json.dumps(seeded), 0o644)
    for folder in ("var/home/core/.ssh", "var/home/core/.ssh/authorized_keys.d"):
        (root / folder).mkdir(mode=0o700, exist_ok=True)
        (root / folder).chmod(0o700)
        os.chown(root / folder, 1000, 1000)
    write(root, SSH_KEYS_PATH, "".join(f"{key}\n" for key in keys), 0o600, uid=1000)
    for path, text in (files or {}).items():
        write(root, path, text, 0o600)


def entry(path: Path, *, with_mtime: bool = True) -> tuple:
    """One entry as a snapshot records it: type and mode, owner, size, inode, mtime, and its
    contents (a sha256; a link's target)."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        content = os.readlink(path)
    elif stat.S_ISREG(info.st_mode):
        content = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        content = ""
    mtime = info.st_mtime_ns if with_mtime else None
    return (info.st_mode, info.st_uid, info.st_gid, info.st_size, info.st_ino, mtime, content)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` but the agent's own state directory (which it creates at its
    first start, in /var/lib, whose mtime that changes). Equal snapshots: nothing written."""
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root):
        rel_folder = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if str(rel_folder / d) != STATE_DIR]
        for name in (*dirs, *files):
            rel = rel_folder / name
            parent_of_state = str(rel) == str(Path(STATE_DIR).parent)
            found[str(rel)] = entry(Path(folder) / name, with_mtime=not parent_of_state)
    return found
