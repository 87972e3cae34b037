"""The node's identity towards a lock manager, as Zincati's `src/identity/`: a node id and a
reboot group. The id is systemd's app-specific machine id of /etc/machine-id for Zincati's
application id, so a host that moves from Zincati to this agent keeps its FleetLock slot."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

from agent.errors import InputError

# Zincati's application id: sharing it means sharing Zincati's node id for the same machine.
ZINCATI_APP_ID = "de35106b6ec24688b63afddaa156679b"
DEFAULT_GROUP = "default"
GROUP_PATTERN = re.compile(r"[a-zA-Z0-9.-]+")  # FleetLock protocol, "Body"
_ID128 = re.compile(r"[0-9a-fA-F]{32}")


def node_id_from_machine_id(machine_id_hex: str, app_id_hex: str = ZINCATI_APP_ID) -> str:
    """`sd_id128_get_machine_app_specific()`: HMAC-SHA256 keyed by the machine id over the app
    id, cut to 128 bits and stamped as a UUID v4 so it cannot be mistaken for the machine id."""
    key = _id128(machine_id_hex, "machine id")
    message = _id128(app_id_hex, "application id")
    digest = bytearray(hmac.new(key, message, hashlib.sha256).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x40
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest.hex()


def read_node_id(root: Path = Path("/"), override: str | None = None) -> str:
    """The configured `node_uuid` if any (32 hex digits), else the id derived from
    `<root>/etc/machine-id`; 32 lowercase hex digits either way."""
    if override:
        if not _ID128.fullmatch(override):
            raise InputError(f"{override!r} is not 32 hexadecimal digits",
                             field="identity.node_uuid")  # fmt: skip
        return override.lower()
    path = root / "etc" / "machine-id"
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise InputError("missing: the node id derives from it (or set identity.node_uuid)",
                         source=str(path)) from None  # fmt: skip
    except OSError as exc:
        raise InputError(f"unreadable ({exc.strerror})", source=str(path)) from None
    # systemd writes the id and one newline; "uninitialized" marks a first boot in progress.
    content = text.removesuffix("\n")
    if not content:
        raise InputError("empty: the machine id is not set up yet", source=str(path))
    if not _ID128.fullmatch(content) or int(content, 16) == 0:
        raise InputError("not a machine id (32 hexadecimal digits, not all zero)",
                         source=str(path))  # fmt: skip
    return node_id_from_machine_id(content)


def validate_group(group: str) -> str:
    """The reboot group, unchanged, if the FleetLock protocol allows it."""
    if not isinstance(group, str) or not GROUP_PATTERN.fullmatch(group):
        raise InputError(f"{group!r} does not match ^[a-zA-Z0-9.-]+$", field="identity.group")
    return group


def _id128(text: str, what: str) -> bytes:
    if not _ID128.fullmatch(text):
        raise InputError(f"{what} {text!r} is not 32 hexadecimal digits")
    return bytes.fromhex(text)
