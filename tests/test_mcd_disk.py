"""The MCD's on-disk config files (agent/model/mcd_disk.py; docs/mco-protocol.md §8), field by field
against what the MCD writes: `json.Marshal` of openshift/api's MachineConfig (types.go:318-360:
TypeMeta inline and empty on a lister's object, ObjectMeta `metadata,omitempty`, MachineConfigSpec
in declaration order, only `config` omitempty, which Go never applies to a struct), with the OCL
annotations taken out (ocl.go `newOnDiskConfigFromMachineConfig`), from daemon.go
`storeCurrentConfigOnDisk`."""

from __future__ import annotations

import json

import pytest

from agent.errors import InputError
from agent.model.machineconfig import parse_machine_config
from agent.model.mcd_disk import (
    OCL_OS_IMAGE_URL,
    ORIGINAL_OS_IMAGE_URL,
    config_document,
    on_disk_config,
    on_disk_image,
    read_image,
)
from tests.builders import IMAGE_A, IMAGE_B, machine_config

OWNER = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
         "name": "worker", "uid": "pool-uid", "controller": True,
         "blockOwnerDeletion": True}  # fmt: skip


def rendered(**annotations: str) -> dict:
    """A rendered config as the API server returns it (keys in the server's order)."""
    doc = machine_config("rendered-worker-1", keys=["ssh-ed25519 AAAA-one"], image=IMAGE_A)
    doc["metadata"] = {
        "annotations": {"machineconfiguration.openshift.io/generated-by-controller-version":
                        "4.19.0", **annotations},
        "creationTimestamp": "2026-12-01T10:00:00Z", "generation": 1,
        "name": "rendered-worker-1", "ownerReferences": [OWNER], "resourceVersion": "4242",
        "uid": "mc-uid",
    }  # fmt: skip
    doc["spec"] = {"config": doc["spec"]["config"], "extensions": [], "fips": False,
                   "kernelArguments": [], "kernelType": "", "osImageURL": IMAGE_A}  # fmt: skip
    return doc


# What Go's json.Marshal writes for rendered(): no kind/apiVersion, ObjectMeta's fields in
# declaration order (name, uid, resourceVersion, generation, creationTimestamp, annotations,
# ownerReferences), the spec's in MachineConfigSpec's order with
# baseOSExtensionsContainerImage's zero value.
GO_BYTES = (
    '{"metadata":{"name":"rendered-worker-1","uid":"mc-uid","resourceVersion":"4242",'
    '"generation":1,"creationTimestamp":"2026-12-01T10:00:00Z","annotations":'
    '{"machineconfiguration.openshift.io/generated-by-controller-version":"4.19.0"},'
    '"ownerReferences":[{"apiVersion":"machineconfiguration.openshift.io/v1",'
    '"kind":"MachineConfigPool","name":"worker","uid":"pool-uid","controller":true,'
    '"blockOwnerDeletion":true}]},"spec":{"osImageURL":"' + IMAGE_A + '",'
    '"baseOSExtensionsContainerImage":"","config":{"ignition":{"version":"3.4.0"},'
    '"passwd":{"users":[{"name":"core","sshAuthorizedKeys":["ssh-ed25519 AAAA-one"]}]}},'
    '"kernelArguments":[],"extensions":[],"fips":false,"kernelType":""}}'
).encode()


def test_currentconfig_is_what_the_mcds_json_marshal_writes() -> None:
    assert on_disk_config(rendered()) == GO_BYTES


def test_each_field_of_currentconfig() -> None:
    written = json.loads(on_disk_config(rendered()))
    assert list(written) == ["metadata", "spec"]  # TypeMeta: empty on a lister's object
    meta_order = ["name", "uid", "resourceVersion", "generation", "creationTimestamp",
                  "annotations", "ownerReferences"]  # fmt: skip
    spec_order = ["osImageURL", "baseOSExtensionsContainerImage", "config", "kernelArguments",
                  "extensions", "fips", "kernelType"]  # fmt: skip
    assert list(written["metadata"]) == meta_order
    assert list(written["spec"]) == spec_order
    assert written["spec"]["config"] == rendered()["spec"]["config"]
    assert written["metadata"]["ownerReferences"] == [OWNER]


def test_a_spec_without_the_optional_fields_gets_gos_zero_values() -> None:
    doc = machine_config("rendered-worker-2", image=None)
    written = json.loads(on_disk_config(doc))
    assert written["spec"] == {"osImageURL": "", "baseOSExtensionsContainerImage": "",
                               "config": {"ignition": {"version": "3.4.0"}},
                               "kernelArguments": None, "extensions": None, "fips": False,
                               "kernelType": ""}  # fmt: skip
    assert written["metadata"] == {"name": "rendered-worker-2"}


def test_the_layering_annotations_are_taken_out_and_the_original_url_put_back() -> None:
    doc = rendered(**{ORIGINAL_OS_IMAGE_URL: IMAGE_A, OCL_OS_IMAGE_URL: IMAGE_B})
    doc["spec"]["osImageURL"] = IMAGE_B  # as embedOCLImageInMachineConfig leaves it
    written = json.loads(on_disk_config(doc))
    assert written["spec"]["osImageURL"] == IMAGE_A
    assert list(written["metadata"]["annotations"]) == [
        "machineconfiguration.openshift.io/generated-by-controller-version"]  # fmt: skip


def test_go_escapes_html_characters_and_line_separators() -> None:
    doc = rendered(note="a <b> & c\u2028d é")
    text = on_disk_config(doc).decode()
    assert '"note":"a \\u003cb\\u003e \\u0026 c\\u2028d é"' in text
    assert json.loads(text)["metadata"]["annotations"]["note"] == "a <b> & c\u2028d é"


def test_currentimage_is_the_bare_image_or_empty() -> None:
    assert on_disk_image(IMAGE_B) == IMAGE_B.encode()
    assert on_disk_image(None) == b""
    assert read_image(b"  " + IMAGE_B.encode() + b"\n") == IMAGE_B  # the MCD trims it
    assert read_image(b"\n") is None and read_image(None) is None


def test_the_mcds_file_and_the_api_servers_object_read_as_the_same_config() -> None:
    from_disk = parse_machine_config(config_document(GO_BYTES))
    api = rendered()
    stable = {**api, "metadata": {"name": "rendered-worker-1"}}
    from_api = parse_machine_config(json.dumps(stable, sort_keys=True).encode())
    assert from_disk == from_api
    assert from_disk.name == "rendered-worker-1" and from_disk.os_image_url == IMAGE_A
    # with kind and apiVersion, as a file written with a TypeMeta would carry them
    with_kind = json.dumps({"kind": "MachineConfig", **json.loads(GO_BYTES)}).encode()
    assert parse_machine_config(config_document(with_kind)) == from_api


@pytest.mark.parametrize(
    ("data", "message"),
    [(b"{", "invalid JSON"), (b"[]", "expected a JSON object"),
     (b'{"spec": {}}', "metadata.name: expected the config's name"),
     (b'{"kind": "Pod", "metadata": {"name": "x"}}', "not a MachineConfig")],
)  # fmt: skip
def test_a_currentconfig_that_is_no_machineconfig_names_the_file(data: bytes, message: str) -> None:
    with pytest.raises(InputError) as caught:
        config_document(data)
    assert str(caught.value).startswith("/etc/machine-config-daemon/currentconfig")
    assert message in str(caught.value)
