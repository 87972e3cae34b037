"""Parsers: data URLs, image references, Ignition, MachineConfig documents; bad input errors."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import InputError
from agent.model.dataurl import decode_data_url, decompress
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import parse_machine_config
from tests.builders import DIGEST_A, dump, gz_url, ign_file, machine_config


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("data:,hello%20world%0A", b"hello world\n"),
        ("data:,plain", b"plain"),
        ("data:text/plain;charset=utf-8,caf%C3%A9", "café".encode()),
        ("data:;base64,aGVsbG8=", b"hello"),
        ("data:text/plain;base64,aGVsbG8=", b"hello"),
        ("data:;base64,aGVs%62G8=", b"hello"),  # percent-escapes inside base64
        ("data:,", b""),
    ],
)
def test_data_urls(url: str, expected: bytes) -> None:
    assert decode_data_url(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/x", "unsupported source scheme 'https'"),
        ("data:nocomma", "missing ','"),
        ("data:;base64,!!!", "invalid base64"),
        ("s3://bucket/key", "unsupported source scheme 's3'"),
    ],
)
def test_bad_data_urls(url: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode_data_url(url)


def test_decompress() -> None:
    assert decompress(gzip.compress(b"abc"), "gzip") == b"abc"
    assert decompress(b"abc", None) == b"abc"
    with pytest.raises(InputError, match="invalid gzip contents"):
        decompress(b"not gzip", "gzip")
    with pytest.raises(InputError, match="unsupported compression 'xz'"):
        decompress(b"abc", "xz")


@given(st.binary(max_size=256))
def test_data_url_round_trip(payload: bytes) -> None:
    assert decode_data_url("data:;base64," + base64.b64encode(payload).decode()) == payload


@pytest.mark.parametrize(
    ("text", "pinned", "tag", "registry"),
    [
        (f"quay.io/openshift/os@{DIGEST_A}", True, None, "quay.io"),
        (f"quay.io/openshift/os:4.17@{DIGEST_A}", True, "4.17", "quay.io"),
        ("quay.io/openshift/os:latest", False, "latest", "quay.io"),
        ("localhost:5000/a/b/c", False, None, "localhost:5000"),
        (f"127.0.0.1:5000/os@{DIGEST_A}", True, None, "127.0.0.1:5000"),
    ],
)
def test_image_refs(text: str, pinned: bool, tag: str | None, registry: str) -> None:
    ref = parse_image_ref(text)
    assert (ref.pinned, ref.tag, ref.registry) == (pinned, tag, registry)
    assert str(ref) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("ubuntu", "expected registry"),
        ("quay.io/os@sha256:abc", "digest must be sha256"),
        ("quay.io/os@md5:" + "a" * 32, "digest must be sha256"),
        ("quay.io/OS/Upper", "invalid path component 'OS'"),
        ("quay.io/os:bad/tag", "invalid path component"),
        ("quay.io/os:-x", "invalid tag '-x'"),
        ("quay io/os", "whitespace"),
        ("dummy://foo", "invalid"),
    ],
)
def test_bad_image_refs(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_image_ref(text)


def test_same_image_compares_digests() -> None:
    a = parse_image_ref(f"quay.io/os:v1@{DIGEST_A}")
    assert a.same_image(parse_image_ref(f"mirror.example/os@{DIGEST_A}"))
    assert not a.same_image(parse_image_ref("quay.io/os:v1"))


def test_files_plain_percent_base64_gzip_mode_owner() -> None:
    doc = machine_config(
        files=[
            ign_file("/etc/a", "plain text"),
            {"path": "/etc/b", "contents": {"source": "data:;base64,aGk="}, "mode": 384},
            {"path": "/etc/c", "contents": {"source": gz_url("zipped"), "compression": "gzip"}},
            {"path": "/etc/d", "user": {"name": "core"}, "group": {"id": 1000}, "overwrite": True},
        ]
    )
    files = parse_machine_config(dump(doc)).ignition.files
    assert files["/etc/a"].contents == b"plain text"
    assert (files["/etc/b"].contents, files["/etc/b"].mode) == (b"hi", 0o600)
    assert files["/etc/c"].contents == b"zipped"
    assert files["/etc/c"].mode == 0o644  # Ignition's default
    assert files["/etc/d"].contents == b""
    assert (files["/etc/d"].user.name, files["/etc/d"].group.id) == ("core", 1000)


def test_units_users_and_spec_fields() -> None:
    doc = machine_config(
        units=[
            {"name": "a.service", "contents": "[Unit]\n", "enabled": True},
            {"name": "b.service", "mask": True},
            {"name": "c.service", "dropins": [{"name": "10-x.conf", "contents": "[Service]\n"}]},
        ],
        users=[{"name": "core", "sshAuthorizedKeys": ["k1", "k2"], "passwordHash": "$6$x"}],
        kargs=["nosmt", "foo=bar"],
        extensions=["usbguard"],
        kernel_type="realtime",
        fips=False,
    )
    mc = parse_machine_config(dump(doc))
    assert mc.ignition.units["a.service"].enabled is True
    assert mc.ignition.units["b.service"].mask is True
    assert mc.ignition.units["c.service"].dropins[0].name == "10-x.conf"
    assert mc.ignition.users[0].ssh_keys == ("k1", "k2")
    assert mc.kernel_arguments == ("nosmt", "foo=bar")
    assert (mc.extensions, mc.kernel_type, mc.fips) == (("usbguard",), "realtime", False)


def test_yaml_and_json_parse_the_same() -> None:
    import yaml

    doc = machine_config(files=[ign_file("/etc/a", "x")], keys=["k"])
    from_json = parse_machine_config(json.dumps(doc).encode())
    from_yaml = parse_machine_config(yaml.safe_dump(doc).encode())
    assert from_json == from_yaml


def test_spec_config_as_serialized_string() -> None:
    doc = machine_config(keys=["k"])
    doc["spec"]["config"] = json.dumps(doc["spec"]["config"])
    assert parse_machine_config(dump(doc)).ignition.users[0].ssh_keys == ("k",)


@pytest.mark.parametrize("minor", range(6))
def test_every_ignition_3_minor_is_supported(minor: int) -> None:
    mc = parse_machine_config(dump(machine_config(version=f"3.{minor}.0")))
    assert mc.ignition.supported


def _with(doc: dict, path: list, value: object) -> bytes:
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return dump(doc)


BAD_DOCUMENTS = [
    (b"\xff\xfe\x00binary", "not UTF-8"),
    (b"key: [unclosed", "invalid YAML at line 2"),
    (b'{"kind": "MachineConfig",', "invalid JSON at line 1"),
    (b"", "empty document"),
    (b"a: 1\n---\nb: 2\n", "expected one document, found 2"),
    (b"- just\n- a list\n", "expected a MachineConfig object, got list"),
    (b"kind: ControllerConfig\n", "kind: not a MachineConfig (kind 'ControllerConfig')"),
    (b"apiVersion: v1\n", "not a MachineConfig (no kind)"),
    (b"\x1f\x8bnot-really-gzip", "invalid gzip data"),
]


@pytest.mark.parametrize(("data", "message"), BAD_DOCUMENTS)
def test_bad_documents(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        parse_machine_config(data)


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        (["spec", "config"], "{not json", "spec.config", "invalid Ignition JSON"),
        (["spec", "config", "ignition"], {}, "spec.config.ignition.version", "missing"),
        (["spec", "config", "ignition", "version"], "three", "ignition.version", "malformed"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "contents": {"source":
         "data:;base64,%%%"}}]}, "storage.files[0].contents.source", "invalid base64"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "contents": {"source":
         "data:,abc", "compression": "gzip"}}]}, "files[0].contents.source", "invalid gzip"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "contents": {"source":
         "data:,abc", "compression": "xz"}}]}, "files[0].contents.compression", "xz"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "mode": "0644"}]},
         "storage.files[0].mode", "expected an integer, got str"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "mode": 99999}]},
         "storage.files[0].mode", "out of range"),
        (["spec", "config", "storage"], {"files": [{"path": "/a", "user": {"id": -1}}]},
         "files[0].user.id", "must not be negative"),
        (["spec", "config", "storage"], {"files": [{"contents": {}}]},
         "storage.files[0].path", "expected a string"),
        (["spec", "config", "storage"], {"files": [{"path": "/a"}, {"path": "/a"}]},
         "storage.files[1]", "duplicate path"),
        (["spec", "config", "systemd"], {"units": [{"name": 5}]}, "units[0].name", "a string"),
        (["spec", "config", "passwd"], {"users": [{"name": "core", "sshAuthorizedKeys": "k"}]},
         "users[0].sshAuthorizedKeys", "expected a list"),
        (["spec", "kernelArguments"], "nosmt", "spec.kernelArguments", "list of strings"),
        (["spec", "kernelType"], "rt", "spec.kernelType", "unknown kernel type"),
        (["spec", "fips"], "yes", "spec.fips", "expected a boolean"),
        (["spec", "osImageURL"], 5, "spec.osImageURL", "expected a string"),
        (["metadata"], [], "metadata", "expected an object"),
    ],
)  # fmt: skip
def test_bad_fields_name_the_field(path: list, value: object, field: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_machine_config(_with(machine_config(), path, value))
    assert field in info.value.field
    assert message in info.value.message


def test_error_text_names_source_and_field() -> None:
    err = InputError("invalid base64", field="spec.config.storage.files[0].contents.source")
    assert str(err.located("mc.yaml")) == (
        "mc.yaml: spec.config.storage.files[0].contents.source: invalid base64"
    )
