"""Small builders for MachineConfig documents used across the tests."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any
from urllib.parse import quote

from standins.demo.objects import DIGEST_A, IMAGE_A, machine_config

__all__ = ["DIGEST_A", "IMAGE_A", "machine_config"]  # re-exported: the tests' one import point

DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64
IMAGE_B = f"quay.example/os/node@{DIGEST_B}"
IMAGE_C = f"quay.example/os/node@{DIGEST_C}"


def data_url(text: str | bytes, *, b64: bool = False) -> str:
    raw = text.encode() if isinstance(text, str) else text
    if b64:
        return "data:;base64," + base64.b64encode(raw).decode()
    return "data:," + quote(raw)


def gz_url(text: str) -> str:
    return "data:;base64," + base64.b64encode(gzip.compress(text.encode())).decode()


def ign_file(path: str, text: str | bytes = "x", mode: int = 0o644, **extra: Any) -> dict[str, Any]:
    return {"path": path, "contents": {"source": data_url(text)}, "mode": mode, **extra}


def dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()
