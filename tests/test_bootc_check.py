"""agent/model/bootc_check.py: which `bootc upgrade --check` asks where a tag points, and what its
output means (the shapes are bootc's `upgrade()` in crates/lib/src/cli.rs)."""

from __future__ import annotations

import pytest

from agent.errors import HostError, InputError
from agent.model.bootc_check import check_argv, parse_check_output, unchanged_digest
from agent.model.bootc_status import bootc_host_from_object
from agent.model.imageref import parse_image_ref

D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
FOLLOWED = parse_image_ref("quay.io/example/os:stable")

UPDATE = f"""Update available for: docker://quay.io/example/os:stable
  Version: 42.20261201.0
  Digest: {D2}
Total new layers: 65    Size: 1.2 GB
Removed layers:   2     Size: 40.1 MB
Added layers:     3     Size: 45.7 MB
"""


@pytest.mark.parametrize(
    ("spec", "has_tag", "argv"),
    [
        ("quay.io/example/os:stable", False, ["upgrade", "--check"]),  # installed from the tag
        ("quay.io/example/os:stable", True, ["upgrade", "--check"]),
        (f"quay.io/example/os@{D1}", True, ["upgrade", "--check", "--tag", "stable"]),
        (f"quay.io/example/os:stable@{D1}", True, ["upgrade", "--check", "--tag", "stable"]),
        ("quay.io/example/os:v1", True, ["upgrade", "--check", "--tag", "stable"]),
    ],
)
def test_check_argv(spec: str, has_tag: bool, argv: list[str]) -> None:
    assert check_argv(spec, FOLLOWED, has_tag) == argv


@pytest.mark.parametrize(
    ("spec", "has_tag", "words"),
    [
        ("quay.io/other/os:stable", True, "in the repository the host runs (quay.io/other/os)"),
        ("registry.local/example/os:stable", True, "only in the repository the host runs"),
        (f"quay.io/example/os@{D1}", False, "no `bootc upgrade --tag` (bootc >= 1.15)"),
        (None, True, "reports no image this host was installed from"),
        ("not a reference", True, "reports no image this host was installed from"),
    ],
)
def test_check_argv_refusals(spec: str | None, has_tag: bool, words: str) -> None:
    with pytest.raises(HostError) as err:
        check_argv(spec, FOLLOWED, has_tag)
    assert err.value.kind == "unsupported" and words in str(err.value)


def test_check_argv_needs_a_tag_without_digest() -> None:
    for text in (f"quay.io/example/os@{D1}", "quay.io/example/os"):
        with pytest.raises(HostError) as err:
            check_argv("quay.io/example/os:stable", parse_image_ref(text), True)
        assert err.value.kind == "input"


def test_parse_update_available() -> None:
    answer = parse_check_output(UPDATE)
    assert (answer.digest, answer.version, answer.unchanged) == (D2, "42.20261201.0", False)


def test_parse_update_without_version() -> None:
    answer = parse_check_output(f"Update available for: docker://x/y:z\n  Digest: {D2}\n")
    assert answer.digest == D2 and answer.version is None


def test_parse_no_changes() -> None:
    answer = parse_check_output("No changes in: docker://quay.io/example/os:stable\n")
    assert answer.unchanged and answer.digest is None


@pytest.mark.parametrize(
    "text",
    ["", "No update available.\n", "Update available for: docker://x/y:z\n  Version: 1\n",
     "Update available for: x\n  Digest: sha256:short\n"],
)  # fmt: skip
def test_parse_anything_else_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError):
        parse_check_output(text)


def _host(booted: str, staged: str | None = None) -> object:
    def entry(image: str, digest: str) -> dict:
        return {"image": {"image": {"image": image, "transport": "registry"},
                          "imageDigest": digest, "architecture": "amd64"},
                "incompatible": False, "pinned": False}  # fmt: skip

    return bootc_host_from_object({
        "apiVersion": "org.containers.bootc/v1", "kind": "BootcHost",
        "status": {"booted": entry(booted, D1),
                   "staged": entry(staged, D2) if staged else None},
    })  # fmt: skip


def test_unchanged_digest_is_the_deployment_of_that_name() -> None:
    assert unchanged_digest(_host("quay.io/example/os:stable"), FOLLOWED) == D1
    assert unchanged_digest(_host("quay.io/example/os:stable", "quay.io/example/os:stable"),
                            FOLLOWED) == D2  # fmt: skip
    assert unchanged_digest(_host(f"quay.io/example/os@{D1}"), FOLLOWED) is None
