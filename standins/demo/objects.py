"""MachineConfig documents as the controller renders them, for the demo's loopback cluster
(the tests build theirs with the same function)."""

from __future__ import annotations

from typing import Any

DIGEST_A = "sha256:" + "a" * 64
IMAGE_A = f"quay.example/os/node@{DIGEST_A}"


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
