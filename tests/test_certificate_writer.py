"""The certificate writer's rules for /etc/docker/certs.d, as the MCD's
(pkg/daemon/certificate_writer.go at openshift/machine-config-operator 7ff337a4): only
directories no bundle names are removed; regular files (Ignition's `.create`) and links are
left alone; a directory that cannot be removed is a warning; what is as wanted already is not
written again."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from agent.cluster.certs import certificates, write_certificates
from agent.core.policy import Allowlist
from agent.errors import HostError
from agent.host.files import RootedFiles
from tests.fixtures_paths import MCC_CONTROLLER_CONFIG, MCC_RENDERED_WORKER

CERTS = "etc/docker/certs.d"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (tmp_path / "etc/group").write_text("root:x:0:\n")
    return tmp_path


@pytest.fixture
def files(root: Path) -> RootedFiles:
    return RootedFiles(root, Allowlist().allows, set_owner=os.geteuid() == 0)


def controller_config(*registries: str) -> dict:
    data = base64.b64encode(b"CA\n").decode()
    return {"spec": {"imageRegistryBundleData": [{"file": r, "data": data} for r in registries]}}


def tree(root: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    """Every path under root: (mode, mtime_ns, bytes or link target)."""
    out: dict[str, tuple[int, int, bytes | str | None]] = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(folder) / name
            info = path.lstat()
            if path.is_symlink():
                value: bytes | str | None = os.readlink(path)
            elif path.is_file():
                value = path.read_bytes()
            else:
                value = None
            out[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, value)
    return out


def test_the_real_controller_config_keeps_ignitions_create_file(root: Path, files: RootedFiles):
    # What every real cluster has: the rendered config's /etc/docker/certs.d/.create, laid
    # down by Ignition, and the ControllerConfig the real controller rendered it from.
    rendered = json.loads(MCC_RENDERED_WORKER.read_text())
    paths = [f["path"] for f in rendered["spec"]["config"]["storage"]["files"]]
    assert "/etc/docker/certs.d/.create" in paths
    (root / CERTS).mkdir(parents=True)
    (root / CERTS / ".create").write_bytes(b"")
    certs = certificates(json.loads(MCC_CONTROLLER_CONFIG.read_text()))

    first = write_certificates(files, certs)

    assert first.warnings == []
    assert (root / CERTS / ".create").is_file()
    assert "/etc/kubernetes/kubelet-ca.crt" in first.changed
    before = tree(root)
    again = write_certificates(files, certs)
    assert again.changed == [] and again.warnings == []
    assert tree(root) == before  # nothing written, no mtime moved


def test_only_unlisted_directories_are_removed(root: Path, files: RootedFiles, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "victim").mkdir()
    (outside / "victim/ca.crt").write_text("not ours")
    base = root / CERTS
    (base / "old.example/nested").mkdir(parents=True)
    (base / "old.example/ca.crt").write_text("old")
    (base / "old.example/nested/client.cert").write_text("old")
    (base / "kept.example").mkdir()
    (base / "kept.example/ca.crt").write_bytes(b"CA\n")
    (base / ".create").write_bytes(b"")
    (base / "README").write_text("an admin's note")
    (base / "linked.example").symlink_to(outside / "victim")

    done = write_certificates(files, certificates(controller_config("kept.example")))

    assert sorted(os.listdir(base)) == [".create", "README", "kept.example", "linked.example"]
    assert done.changed == [f"/{CERTS}/old.example"]  # kept.example's CA is as wanted already
    assert (outside / "victim/ca.crt").read_text() == "not ours"  # a link is never followed
    assert done.warnings == []


def test_a_listed_registry_with_a_port_is_left_as_it_is(root: Path, files: RootedFiles):
    certs = certificates(controller_config("registry.example..5000"))
    write_certificates(files, certs)
    before = tree(root)
    assert write_certificates(files, certs).changed == []
    assert tree(root) == before
    assert (root / CERTS / "registry.example:5000/ca.crt").read_bytes() == b"CA\n"


class RefusesOneRemoval:
    """The files port, with one directory's removal failing as a host error would."""

    def __init__(self, files: RootedFiles, refused: str) -> None:
        self._files, self._refused = files, refused

    def __getattr__(self, name: str):
        return getattr(self._files, name)

    def remove_dir(self, path: str) -> None:
        if path == self._refused:
            raise HostError(f"cannot remove {path}: device or resource busy", kind="path")
        self._files.remove_dir(path)


def test_a_directory_that_cannot_be_removed_is_a_warning(root: Path, files: RootedFiles):
    for name in ("busy.example", "old.example"):
        (root / CERTS / name).mkdir(parents=True)
    port = RefusesOneRemoval(files, f"/{CERTS}/busy.example")

    done = write_certificates(port, certificates(controller_config("new.example")))

    assert done.warnings == [
        f"could not remove old certificate directory /{CERTS}/busy.example: "
        f"cannot remove /{CERTS}/busy.example: device or resource busy"
    ]
    assert not (root / CERTS / "old.example").exists()
    assert (root / CERTS / "new.example/ca.crt").read_bytes() == b"CA\n"
