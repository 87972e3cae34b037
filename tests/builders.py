"""Small builders for MachineConfig documents used across the tests."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any
from urllib.parse import quote

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64
IMAGE_A = f"quay.example/os/node@{DIGEST_A}"
IMAGE_B = f"quay.example/os/node@{DIGEST_B}"
IMAGE_C = f"quay.example/os/node@{DIGEST_C}"


def data_url(text: str | bytes, *, b64: bool = False) -> str:
    raw = text.encode() if isinstance(text, str) else text
    if b64:
        return "data:;base64," + base64.b64encode(raw).decode()
    return "data:," + quote(raw)


def gz_url(text: str) -> str:
    return "data:;base64," + base64.b64encode(gzip.compress(text.encode())).decode()


def ign_file(path: str, text: str = "x", mode: int = 0o644, **extra: Any) -> dict[str, Any]:
    return {"path": path, "contents": {"source": data_url(text)}, "mode": mode, **extra}


def machine_config(
    name: str = "rendered-worker-1",
    *,
    files: list[dict[str, Any]] | None = None,
    units: list[dict[str, Any]] | None = None,
    keys: list[str] | None = None,
    users: list[dict[str, Any]] | None = None,
    image: str | None = IMAGE_A,
    kargs: list[str] | None = None,
    extensions: list[str] | None = None,
    kernel_type: str | None = None,
    fips: bool | None = None,
    version: str = "3.4.0",
    ignition_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {"ignition": {"version": version}}
    if files is not None:
        config["storage"] = {"files": files}
    if units is not None:
        config["systemd"] = {"units": units}
    if users is None and keys is not None:
        users = [{"name": "core", "sshAuthorizedKeys": keys}]
    if users is not None:
        config["passwd"] = {"users": users}
    for key, value in (ignition_extra or {}).items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    spec: dict[str, Any] = {"config": config}
    if image is not None:
        spec["osImageURL"] = image
    if kargs is not None:
        spec["kernelArguments"] = kargs
    if extensions is not None:
        spec["extensions"] = extensions
    if kernel_type is not None:
        spec["kernelType"] = kernel_type
    if fips is not None:
        spec["fips"] = fips
    return {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": name},
        "spec": spec,
    }


def dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()
