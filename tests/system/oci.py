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

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"


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


def write_image(
    layout: Path,
    tag: str,
    version: str,
    files: dict[str, tuple[str, int]],
    architecture: str = "amd64",
) -> str:
    """Add `tag` to the OCI layout at `layout`; returns the manifest digest."""
    return _add_ref(layout, tag, _manifest(layout, version, files, architecture))


def write_index(
    layout: Path, tag: str, version: str, files: dict[str, dict[str, tuple[str, int]]]
) -> tuple[str, dict[str, str]]:
    """Add `tag` to `layout` as a multi-platform OCI image index: one image per architecture
    (`files` by Go arch: amd64, arm64...), all linux. Returns (index digest, {arch: instance
    digest})."""
    instances, entries = {}, []
    for arch, arch_files in files.items():
        desc = _manifest(layout, version, arch_files, arch)
        instances[arch] = desc["digest"]
        entries.append({"mediaType": MANIFEST, **desc,
                        "platform": {"architecture": arch, "os": "linux"}})  # fmt: skip
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}
    desc = _blob(layout, json.dumps(index, sort_keys=True).encode())
    return _add_ref(layout, tag, desc, INDEX), instances


def _manifest(
    layout: Path, version: str, files: dict[str, tuple[str, int]], architecture: str
) -> dict:
    """A bootable-labelled single-layer image's blobs; returns the manifest's descriptor."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    gz, diff_id = _layer(files)
    layer = _blob(layout, gz)
    config = {
        "created": "2026-01-01T00:00:00Z",
        "architecture": architecture,
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
        "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    return _blob(layout, json.dumps(manifest, sort_keys=True).encode())


def _add_ref(layout: Path, tag: str, desc: dict, media: str = MANIFEST) -> str:
    """Name `desc` `tag` in the layout's index.json; returns its digest."""
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {"manifests": []}
    index["schemaVersion"] = 2
    index["manifests"] = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag
    ] + [
        {
            "mediaType": media,
            **desc,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }
    ]
    index_path.write_text(json.dumps(index))
    return desc["digest"]


def push(
    layout: Path, tag: str, dest: str, *, authfile: Path | None = None, all_images: bool = False
) -> str:
    """skopeo copy oci:LAYOUT:TAG docker://DEST (loopback, plain HTTP); returns the digest the
    registry serves, which must equal the layout's (skopeo copies the manifest unchanged).
    `all_images`: an index with every instance (`--all`), not only this host's."""
    auth = ["--dest-authfile", str(authfile)] if authfile else []
    auth += ["--all"] if all_images else []
    cmd = ["timeout", "60", "skopeo", "copy", "--quiet", "--dest-tls-verify=false", *auth]
    subprocess.run([*cmd, f"oci:{layout}:{tag}", f"docker://{dest}"], check=True)
    inspect = ["timeout", "30", "skopeo", "inspect", "--raw", "--tls-verify=false"]
    if authfile:
        inspect += ["--authfile", str(authfile)]
    raw = subprocess.run([*inspect, f"docker://{dest}"], check=True, capture_output=True).stdout
    return "sha256:" + hashlib.sha256(raw).hexdigest()
