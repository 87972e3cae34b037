"""A unit file's state read from the unit directories under a host root, as systemd's
`systemctl is-enabled` derives it (the simulated host's answer to GetUnitFileState).

systemd looks a unit up in /etc, then /run, then /usr/lib (lookup-paths.c); a unit is masked
where its name there is a link to /dev/null, enabled where a `.wants/` or `.requires/` link of
it exists or an alias link to it (`Alias=`, a link of another name to its file), and otherwise
`disabled` when it has an [Install] section to enable it by, `static` when not, `not-found`
with no file at all. The same enablement links `systemctl enable` writes, so a drift monitor
watching /etc/systemd/system sees them appear."""

from __future__ import annotations

import os
from pathlib import Path

# (directory under the root, the "-runtime" suffix systemd adds for /run)
_SEARCH = (("etc/systemd/system", ""), ("run/systemd/system", "-runtime"),
           ("usr/lib/systemd/system", ""), ("lib/systemd/system", ""))  # fmt: skip
_LINK_DIRS = (".wants", ".requires")


def _masked(path: Path) -> bool:
    try:
        return os.readlink(path) == "/dev/null"
    except OSError:
        return False


def _aliases(entry: Path, name: str) -> bool:
    """Whether `entry` is an alias link of unit `name`: another name, linked to its file."""
    try:
        return entry.name != name and os.path.basename(os.readlink(entry)) == name
    except OSError:
        return False


def _linked(directory: Path, name: str) -> bool:
    try:
        entries = list(directory.iterdir())
    except OSError:
        return False
    return any(
        (entry.name.endswith(_LINK_DIRS) and (entry / name).is_symlink()) or _aliases(entry, name)
        for entry in entries
    )


def _has_install(path: Path) -> bool:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False
    return any(line.strip() == "[Install]" for line in text.splitlines())


def unit_file_state(root: Path, name: str) -> str:
    """`enabled`, `enabled-runtime`, `masked`, `masked-runtime`, `disabled`, `static` or
    `not-found` for unit `name` under `root`."""
    for folder, suffix in _SEARCH:
        if _masked(root / folder / name):
            return "masked" + suffix
    for folder, suffix in _SEARCH[:2]:
        if _linked(root / folder, name):
            return "enabled" + suffix
    for folder, _ in _SEARCH:
        path = root / folder / name
        if path.is_file():
            return "disabled" if _has_install(path) else "static"
    return "not-found"
