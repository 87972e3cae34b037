"""Small bootable-labelled OS "images": an OCI layout written here, pushed with skopeo.

An image is one gzip layer of files (the stand-in bootc applies its etc/ and usr/ files at boot)
plus a config carrying the labels bootc looks for. Reproducible: same files, same digest."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path


def _blob(layout: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _layer(files: dict[str, tuple[str, int]]) -> tuple[bytes, str]:
    """(gzip blob, diff_id) for files {relative path: (text, mode)}."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    plain = raw.getvalue()
    return gzip.compress(plain, mtime=0), "sha256:" + hashlib.sha256(plain).hexdigest()


def write_image(layout: Path, tag: str, version: str, files: dict[str, tuple[str, int]]) -> str:
    """Add `tag` to the OCI layout at `layout`; returns the manifest digest."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    gz, diff_id = _layer(files)
    layer = _blob(layout, gz)
    config = {
        "created": "2026-01-01T00:00:00Z",
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Labels": {
                "containers.bootc": "1",
                "ostree.bootable": "1",
                "org.opencontainers.image.version": version,
            }
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    config_desc = _blob(layout, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    manifest_desc = _blob(layout, json.dumps(manifest, sort_keys=True).encode())
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"manifests": []}
    index["schemaVersion"] = 2
    index["manifests"] = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag
    ] + [
        {
            "mediaType": manifest["mediaType"],
            **manifest_desc,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }
    ]
    index_path.write_text(json.dumps(index))
    return manifest_desc["digest"]


def push(layout: Path, tag: str, dest: str, *, authfile: Path | None = None) -> str:
    """skopeo copy oci:LAYOUT:TAG docker://DEST (loopback, plain HTTP); returns the digest the
    registry serves, which must equal the layout's (skopeo copies the manifest unchanged)."""
    auth = ["--dest-authfile", str(authfile)] if authfile else []
    cmd = ["timeout", "60", "skopeo", "copy", "--quiet", "--dest-tls-verify=false", *auth]
    subprocess.run([*cmd, f"oci:{layout}:{tag}", f"docker://{dest}"], check=True)
    inspect = ["timeout", "30", "skopeo", "inspect", "--raw", "--tls-verify=false"]
    if authfile:
        inspect += ["--authfile", str(authfile)]
    raw = subprocess.run([*inspect, f"docker://{dest}"], check=True, capture_output=True).stdout
    return "sha256:" + hashlib.sha256(raw).hexdigest()
