"""Tag following on bootc < 1.15 (docs/bootc-releases.md §11): agent/model/manifest.py picks the
digest bootc records for a tag (containers/image's ChooseInstance), agent/host/skopeo.py asks the
registry with the credentials bootc uses. The adapter runs against a fake `skopeo` written into
tmp_path that records its argv; no registry and no real skopeo are needed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import HostError, InputError
from agent.host.skopeo import AUTH_FILES, TagResolver
from agent.model.imageref import parse_image_ref
from agent.model.manifest import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    ZSTD_ANNOTATION,
    NoMatchingInstance,
    Platform,
    UnsupportedManifest,
    cpu_variant,
    go_arch,
    image_digest,
    wanted_platforms,
)


def digest(label: str) -> str:
    return "sha256:" + hashlib.sha256(label.encode()).hexdigest()


def entry(
    label: str,
    arch: str | None,
    variant: str = "",
    *,
    os_name: str = "linux",
    zstd: bool = False,
    media_type: str = OCI_MANIFEST,
) -> dict[str, Any]:
    item: dict[str, Any] = {"mediaType": media_type, "digest": digest(label), "size": 1234}
    if arch is not None:
        item["platform"] = {"architecture": arch, "os": os_name}
        if variant:
            item["platform"]["variant"] = variant
    if zstd:
        item["annotations"] = {ZSTD_ANNOTATION: "true"}
    return item


def index(*entries: dict[str, Any], media_type: str | None = OCI_INDEX) -> bytes:
    document: dict[str, Any] = {"schemaVersion": 2, "manifests": list(entries)}
    if media_type is not None:
        document["mediaType"] = media_type
    return json.dumps(document, indent=3).encode()


def docker_list(*entries: dict[str, Any]) -> bytes:
    for item in entries:
        item["mediaType"] = DOCKER_MANIFEST
    return index(*entries, media_type=DOCKER_LIST)


# What `podman manifest push` / `buildah` write for a multi-arch bootc image.
MULTI = [
    entry("amd64", "amd64"),
    entry("arm64", "arm64", "v8"),
    entry("armv7", "arm", "v7"),
    entry("ppc64le", "ppc64le"),
    entry("s390x", "s390x"),
    entry("attestation", "unknown", os_name="unknown"),  # buildkit's attestation manifests
]
SINGLE = json.dumps(
    {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest("c")},
        "layers": [],
    },
    indent=2,
).encode()


# -- model: which instance ---------------------------------------------------------------


@pytest.mark.parametrize("build", [index, docker_list], ids=["oci-index", "docker-list"])
@pytest.mark.parametrize(
    ("arch", "variant", "label"),
    [
        ("amd64", "", "amd64"),
        ("arm64", "v8", "arm64"),
        ("arm64", "", "arm64"),
        ("arm", "v7", "armv7"),
        ("arm", "v8", "armv7"),  # a v8 CPU in 32-bit mode runs v7 images
        ("ppc64le", "", "ppc64le"),
        ("s390x", "", "s390x"),
    ],
)
def test_the_host_platforms_instance(build: Any, arch: str, variant: str, label: str) -> None:
    raw = build(*json.loads(json.dumps(MULTI)))
    assert image_digest(raw, arch=arch, variant=variant) == digest(label)
    assert image_digest(raw, arch=arch, variant=variant) != "sha256:" + sha(raw)


def sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


@pytest.mark.parametrize("build", [index, docker_list], ids=["oci-index", "docker-list"])
def test_arm_variants_fall_back_to_less_capable_ones_then_none(build: Any) -> None:
    only_v6 = [entry("v5", "arm", "v5"), entry("v6", "arm", "v6"), entry("none", "arm")]
    raw = build(*only_v6)
    assert image_digest(raw, arch="arm", variant="v7") == digest("v6")
    assert image_digest(raw, arch="arm", variant="v5") == digest("v5")
    # Without a variant the variant-less instance comes first, then v8 > v7 > ... (c/image).
    assert image_digest(raw, arch="arm", variant="") == digest("none")
    assert image_digest(build(*only_v6[:2]), arch="arm", variant="") == digest("v6")
    # An unknown variant matches itself, then none.
    assert image_digest(raw, arch="arm", variant="v9") == digest("none")
    with pytest.raises(NoMatchingInstance):
        image_digest(build(entry("v7", "arm", "v7")), arch="arm", variant="v6")


@pytest.mark.parametrize("build", [index, docker_list], ids=["oci-index", "docker-list"])
def test_arm64_with_and_without_v8(build: Any) -> None:
    raw = build(entry("plain", "arm64"), entry("v8", "arm64", "v8"))
    assert image_digest(raw, arch="arm64", variant="v8") == digest("v8")  # what cpuinfo says
    assert image_digest(raw, arch="arm64", variant="") == digest("plain")


def test_the_wanted_platform_order_beats_the_position_in_the_list() -> None:
    raw = [entry("v6", "arm", "v6"), entry("v7", "arm", "v7")]
    assert image_digest(index(*raw), arch="arm", variant="v7") == digest("v7")
    assert image_digest(docker_list(*raw), arch="arm", variant="v7") == digest("v7")


def test_an_oci_index_prefers_zstd_among_equals_and_then_the_first() -> None:
    raw = index(
        entry("gzip", "amd64"),
        entry("zstd", "amd64", zstd=True),
        entry("zstd-too", "amd64", zstd=True),
    )
    assert image_digest(raw, arch="amd64") == digest("zstd")
    # ...but never over a better platform.
    better = index(entry("v7-zstd", "arm", "v7", zstd=True), entry("v8", "arm", "v8"))
    assert image_digest(better, arch="arm", variant="v8") == digest("v8")
    # A Docker list has no such preference.
    listed = docker_list(entry("gzip", "amd64"), entry("zstd", "amd64", zstd=True))
    assert image_digest(listed, arch="amd64") == digest("gzip")


def test_an_annotation_is_a_map_key_matched_exactly() -> None:
    shouting = entry("shout", "amd64")
    shouting["annotations"] = {ZSTD_ANNOTATION.upper(): "true"}
    raw = index(entry("gzip", "amd64"), shouting)
    assert image_digest(raw, arch="amd64") == digest("gzip")


def test_oci_entries_without_platform_match_after_every_named_one() -> None:
    raw = index(entry("anything", None), entry("s390x", "s390x"))
    assert image_digest(raw, arch="s390x") == digest("s390x")
    assert image_digest(raw, arch="amd64") == digest("anything")
    # In a Docker list a missing platform is an empty one: it matches nothing.
    with pytest.raises(NoMatchingInstance):
        image_digest(docker_list(entry("anything", None)), arch="amd64")


def test_only_linux_instances() -> None:
    raw = index(entry("win", "amd64", os_name="windows"), entry("lin", "amd64"))
    assert image_digest(raw, arch="amd64") == digest("lin")


def test_no_instance_for_this_platform_names_those_there_are() -> None:
    with pytest.raises(NoMatchingInstance) as caught:
        image_digest(index(*MULTI), arch="riscv64")
    error = caught.value
    assert isinstance(error, UnsupportedManifest) and isinstance(error, InputError)
    assert error.platforms == (
        "linux/amd64",
        "linux/arm64/v8",
        "linux/arm/v7",
        "linux/ppc64le",
        "linux/s390x",
        "unknown/unknown",
    )
    assert "linux/riscv64" in str(error) and "linux/arm/v7" in str(error)
    with pytest.raises(NoMatchingInstance, match="no instances"):
        image_digest(index(), arch="amd64")
    many = index(*(entry(f"e{i}", f"arch{i}") for i in range(40)))
    with pytest.raises(NoMatchingInstance, match="and 28 more") as caught:
        image_digest(many, arch="amd64")
    assert len(caught.value.platforms) == 40 and len(str(caught.value)) < 600


# -- model: single images, kinds, refusals --------------------------------------------------


def test_a_single_image_is_the_digest_of_its_exact_bytes() -> None:
    assert image_digest(SINGLE, arch="amd64") == "sha256:" + sha(SINGLE)
    compact = json.dumps(json.loads(SINGLE), separators=(",", ":")).encode()
    assert image_digest(compact, arch="s390x") == "sha256:" + sha(compact)
    assert sha(compact) != sha(SINGLE)
    docker = SINGLE.replace(OCI_MANIFEST.encode(), DOCKER_MANIFEST.encode())
    assert image_digest(docker, arch="amd64") == "sha256:" + sha(docker)


def test_the_kind_by_shape_when_media_type_is_absent() -> None:
    no_type = index(*MULTI[:2], media_type=None)
    assert image_digest(no_type, arch="arm64", variant="v8") == digest("arm64")
    bare = json.loads(SINGLE)
    del bare["mediaType"]
    raw = json.dumps(bare).encode()
    assert image_digest(raw, arch="amd64") == "sha256:" + sha(raw)
    artifact = json.dumps({"schemaVersion": 2, "config": {"mediaType": "x/y"}}).encode()
    assert image_digest(artifact, arch="amd64") == "sha256:" + sha(artifact)


def test_keys_are_read_as_go_reads_struct_fields() -> None:
    # encoding/json: case-insensitive field names, the last duplicate wins.
    text = (
        f'{{"schemaVersion": 2, "MediaType": "{OCI_INDEX}", "Manifests": [{{'
        f'"Digest": "{digest("first")}", "digest": "{digest("last")}", '
        '"PLATFORM": {"OS": "linux", "Architecture": "amd64"}}]}'
    )
    assert image_digest(text.encode(), arch="amd64") == digest("last")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"\xff\xfe{}",
        b"[]",
        b'"manifest"',
        b"{}",
        b'{"schemaVersion": 3}',
        b'{"schemaVersion": "2"}',
        b'{"schemaVersion": 2.0}',
        b'{"schemaVersion": 2, "mediaType": 7}',
        b'{"schemaVersion": 2, "manifests": {"a": 1}}',
        b'{"schemaVersion": 2, "mediaType": "' + OCI_INDEX.encode() + b'", "manifests": [1]}',
        b'{"schemaVersion": 2, "mediaType": "'
        + OCI_INDEX.encode()
        + b'", "manifests": [{"digest": 5, "platform": {"os": "linux", "architecture": "amd64"}}]}',
        b'{"schemaVersion": 2, "mediaType": "'
        + OCI_INDEX.encode()
        + b'", "manifests": [{"platform": "linux/amd64"}]}',
        b'{"schemaVersion": 2, "size": NaN}',
        b"{" * 5000,
        b'{"schemaVersion": 2, "x": "' + b"a" * (4 * 1024 * 1024) + b'"}',
    ],
)
def test_garbage_is_an_input_error_that_is_not_unsupported(raw: bytes) -> None:
    with pytest.raises(InputError) as caught:
        image_digest(raw, arch="amd64")
    assert not isinstance(caught.value, UnsupportedManifest)


def test_an_ambiguous_manifest_is_refused() -> None:
    both = json.loads(SINGLE)
    both["manifests"] = [entry("amd64", "amd64")]
    with pytest.raises(InputError, match="ambiguous"):
        image_digest(json.dumps(both).encode(), arch="amd64")
    listed = json.loads(index(entry("amd64", "amd64")))
    listed["layers"] = []
    with pytest.raises(InputError, match="ambiguous"):
        image_digest(json.dumps(listed).encode(), arch="amd64")


def test_digests_the_agent_cannot_pin() -> None:
    sha512 = entry("x", "amd64")
    sha512["digest"] = "sha512:" + "a" * 128
    with pytest.raises(UnsupportedManifest, match="sha512"):
        image_digest(index(sha512), arch="amd64")
    bad_ones = ("sha256:" + "A" * 64, "sha256:abc", "sha512:abc", "md5:" + "a" * 32, "", "x")
    for bad in bad_ones:
        broken = entry("x", "amd64")
        broken["digest"] = bad
        with pytest.raises(InputError, match=r"manifests\[0\]\.digest") as caught:
            image_digest(index(broken), arch="amd64")
        assert not isinstance(caught.value, UnsupportedManifest)
    # Only the chosen instance's digest matters.
    other = entry("other", "s390x")
    other["digest"] = "nonsense"
    assert image_digest(index(other, entry("x", "amd64")), arch="amd64") == digest("x")


def test_manifests_bootc_cannot_deploy() -> None:
    schema1 = json.dumps({"schemaVersion": 1, "name": "os", "tag": "1", "fsLayers": []})
    with pytest.raises(UnsupportedManifest, match="schema 1"):
        image_digest(schema1.encode(), arch="amd64")
    signed = json.dumps({"schemaVersion": 1, "fsLayers": [], "signatures": []})
    with pytest.raises(UnsupportedManifest, match="schema 1"):
        image_digest(signed.encode(), arch="amd64")
    nested = index(entry("inner", "amd64", media_type=OCI_INDEX))
    with pytest.raises(UnsupportedManifest, match="itself a list"):
        image_digest(nested, arch="amd64")


# -- model: the platform ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("x86_64", ("amd64", "")),
        ("aarch64", ("arm64", "v8")),
        ("arm64", ("arm64", "v8")),
        ("ppc64le", ("ppc64le", "")),
        ("s390x", ("s390x", "")),
        ("riscv64", ("riscv64", "")),
        ("i686", ("386", "")),
        ("armv7l", ("arm", "v7")),
        ("armv6l", ("arm", "v6")),
        ("armv5tejl", ("arm", "v5")),
        ("armv8l", ("arm", "v8")),
        ("loongarch64", ("loong64", "")),
    ],
)
def test_go_arch(machine: str, expected: tuple[str, str]) -> None:
    assert go_arch(machine) == expected


@pytest.mark.parametrize("machine", ["", "sparc64", "x86-64", "armv"])
def test_go_arch_refuses_what_it_does_not_know(machine: str) -> None:
    with pytest.raises(InputError, match="machine"):
        go_arch(machine)


def test_go_arch_names_this_machine() -> None:
    arch, _ = go_arch(platform.machine())
    assert arch in {"amd64", "arm64", "ppc64le", "s390x", "riscv64", "arm", "386", "loong64"}


AARCH64_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
"""
PI_ZERO_CPUINFO = """processor\t: 0
model name\t: ARMv6-compatible processor rev 7 (v6l)
CPU architecture: 7
"""


def test_cpu_variant_as_containers_image_reads_cpuinfo() -> None:
    assert cpu_variant(AARCH64_CPUINFO) == "v8"
    assert cpu_variant("model name\t: ARMv7 Processor rev 4 (v7l)\nCPU architecture: 7\n") == "v7"
    assert cpu_variant(PI_ZERO_CPUINFO) == "v6"
    assert cpu_variant("CPU architecture: 7\n") == ""  # no model name: c/image gives up
    assert cpu_variant("CPU architecture: 5TEJ\n") == "v5"
    assert cpu_variant("processor\t: 0\nvendor_id\t: GenuineIntel\n") == ""


def test_wanted_platforms() -> None:
    def names(arch: str, variant: str = "") -> list[str]:
        return [str(p) for p in wanted_platforms(arch, variant)]

    assert names("amd64") == ["linux/amd64"]
    assert names("arm64", "v8") == ["linux/arm64/v8", "linux/arm64"]
    assert names("arm64") == ["linux/arm64", "linux/arm64/v8"]
    assert names("arm", "v7") == ["linux/arm/v7", "linux/arm/v6", "linux/arm/v5", "linux/arm"]
    assert names("arm") == [
        "linux/arm",
        "linux/arm/v8",
        "linux/arm/v7",
        "linux/arm/v6",
        "linux/arm/v5",
    ]
    assert names("arm", "v9") == ["linux/arm/v9", "linux/arm"]
    assert wanted_platforms("amd64")[0] == Platform("linux", "amd64")


# -- model: properties ----------------------------------------------------------------------

ARCHES = st.sampled_from(["amd64", "arm64", "arm", "s390x"])
VARIANTS = st.sampled_from(["", "v5", "v6", "v7", "v8"])
ENTRY = st.tuples(
    st.one_of(st.none(), ARCHES), VARIANTS, st.booleans(), st.sampled_from(["linux", "windows"])
)


def build_entries(specs: list[tuple[Any, str, bool, str]], zstd: bool) -> list[dict[str, Any]]:
    return [
        entry(f"e{i}", arch, variant, os_name=os_name, zstd=zstd and z)
        for i, (arch, variant, z, os_name) in enumerate(specs)
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRY, max_size=8), ARCHES, VARIANTS)
def test_the_choice_is_a_best_ranked_instance(specs: list[Any], arch: str, variant: str) -> None:
    entries = build_entries(specs, zstd=True)
    wanted = list(wanted_platforms(arch, variant))

    def rank(item: dict[str, Any]) -> int | None:
        if "platform" not in item:
            return len(wanted)
        p = item["platform"]
        here = Platform(p["os"], p["architecture"], p.get("variant", ""))
        return wanted.index(here) if here in wanted else None

    ranks = [r for r in map(rank, entries) if r is not None]
    try:
        chosen = image_digest(index(*entries), arch=arch, variant=variant)
    except NoMatchingInstance:
        assert not ranks
        return
    item = next(e for e in entries if e["digest"] == chosen)
    assert rank(item) == min(ranks)


@settings(max_examples=300, deadline=None)
@given(st.lists(ENTRY, max_size=8), ARCHES, VARIANTS)
def test_an_index_and_a_list_of_the_same_instances_agree(
    specs: list[Any], arch: str, variant: str
) -> None:
    """Without zstd annotations and with every platform named, the OCI (rank, position) order
    and the Docker (wanted platform, then position) loop pick the same instance."""
    specs = [("amd64" if a is None else a, v, z, o) for a, v, z, o in specs]

    def outcome(raw: bytes) -> str:
        try:
            return image_digest(raw, arch=arch, variant=variant)
        except NoMatchingInstance:
            return "none"

    oci = outcome(index(*build_entries(specs, zstd=False)))
    assert oci == outcome(docker_list(*build_entries(specs, zstd=False)))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = [
    "mediaType",
    "schemaVersion",
    "manifests",
    "platform",
    "digest",
    "annotations",
    "architecture",
    "os",
    "variant",
    "config",
    "layers",
]


def mutate(document: Any, data: st.DataObject) -> Any:
    """Replace the value at one random path with a random JSON value."""
    if isinstance(document, dict) and document and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(document)))
        return {**document, key: mutate(document[key], data)}
    if isinstance(document, list) and document and data.draw(st.booleans()):
        at = data.draw(st.integers(0, len(document) - 1))
        return [*document[:at], mutate(document[at], data), *document[at + 1 :]]
    if isinstance(document, dict) and data.draw(st.booleans()):
        return {**document, data.draw(st.sampled_from(KEYS)): data.draw(JSON)}
    return data.draw(JSON)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), ARCHES)
def test_hostile_manifests_give_a_digest_or_an_input_error(data: st.DataObject, arch: str) -> None:
    seed = data.draw(
        st.sampled_from([index(*MULTI), docker_list(*json.loads(json.dumps(MULTI))), SINGLE])
    )
    raw = json.dumps(mutate(json.loads(seed), data)).encode()
    try:
        result = image_digest(raw, arch=arch)
    except InputError:
        return
    assert result.startswith("sha256:") and len(result) == 71


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_digest_or_an_input_error(raw: bytes) -> None:
    with contextlib.suppress(InputError):
        image_digest(raw, arch="amd64")


# -- the adapter ----------------------------------------------------------------------------

FAKE_SKOPEO = """#!{python}
# A stand-in skopeo: records its argv, then does what the test configured.
import json, os, sys, time
state = os.environ["FAKE_SKOPEO_STATE"]
with open(os.path.join(state, "calls.log"), "a") as log:
    log.write(json.dumps({{"argv": sys.argv[1:], "prefixed": os.environ.get("PREFIXED")}}) + "\\n")
config = json.load(open(os.path.join(state, "config.json")))
time.sleep(config.get("sleep", 0))
sys.stderr.write(config.get("stderr", ""))
sys.stdout.buffer.write(open(os.path.join(state, "out"), "rb").read())
sys.exit(config.get("status", 0))
"""
# Like `nsenter -t 1 -m ... --`: marks the environment, then runs the rest.
FAKE_PREFIX = """#!/bin/sh
PREFIXED=yes exec "$@"
"""
TAGGED = parse_image_ref("registry.example.com:5000/os/base:stable")


class FakeSkopeo:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.state.mkdir()
        self.path = tmp / "skopeo"
        self.path.write_text(FAKE_SKOPEO.format(python=sys.executable))
        self.path.chmod(0o755)
        self.prefix = tmp / "nsenter"
        self.prefix.write_text(FAKE_PREFIX)
        self.prefix.chmod(0o755)
        self.host = tmp / "host"
        self.host.mkdir()
        self.answer(index(*MULTI))

    def answer(self, out: bytes, **config: Any) -> None:
        (self.state / "out").write_bytes(out)
        (self.state / "config.json").write_text(json.dumps(config))

    def calls(self) -> list[dict[str, Any]]:
        log = self.state / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [json.loads(line) for line in lines]

    def auth(self, path: str, text: str = "{}") -> Path:
        local = self.host / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
        return local

    def resolver(self, **kwargs: Any) -> TagResolver:
        kwargs.setdefault("skopeo", str(self.path))
        kwargs.setdefault("host_root", self.host)
        kwargs.setdefault("arch", "amd64")
        kwargs.setdefault("env", {"FAKE_SKOPEO_STATE": str(self.state)})
        return TagResolver(**kwargs)


@pytest.fixture
def skopeo(tmp_path: Path) -> FakeSkopeo:
    return FakeSkopeo(tmp_path)


async def test_resolve_runs_skopeo_inspect_raw_anonymously_without_auth_files(
    skopeo: FakeSkopeo,
) -> None:
    assert await skopeo.resolver().resolve(TAGGED) == digest("amd64")
    assert await skopeo.resolver(arch="arm", variant="v7").resolve(TAGGED) == digest("armv7")
    argv = skopeo.calls()[0]["argv"]
    assert argv == ["inspect", "--raw", "--no-creds", "docker://" + str(TAGGED)]
    assert "--authfile" not in argv


@pytest.mark.parametrize(
    ("present", "chosen"),
    [
        (AUTH_FILES, "/run/ostree/auth.json"),
        (AUTH_FILES[1:], "/etc/ostree/auth.json"),
        (AUTH_FILES[2:], "/usr/lib/ostree/auth.json"),
        ((AUTH_FILES[0], AUTH_FILES[2]), "/run/ostree/auth.json"),
    ],
)
async def test_the_auth_file_bootc_would_use(
    skopeo: FakeSkopeo, present: tuple[str, ...], chosen: str
) -> None:
    for path in present:
        skopeo.auth(path)
    # Files bootc never reads are never passed either.
    skopeo.auth("/run/containers/0/auth.json")
    skopeo.auth("/root/.docker/config.json")
    resolver = skopeo.resolver(
        env={"FAKE_SKOPEO_STATE": str(skopeo.state), "REGISTRY_AUTH_FILE": "/elsewhere.json"}
    )
    assert resolver.auth_file() == chosen
    await resolver.resolve(TAGGED)
    argv = skopeo.calls()[0]["argv"]
    # The host's path, not where the agent sees it.
    assert argv == ["inspect", "--raw", "--authfile", chosen, f"docker://{TAGGED}"]


async def test_an_absolute_auth_symlink_points_into_the_host(skopeo: FakeSkopeo) -> None:
    skopeo.auth("/run/secrets/pull.json")
    link = skopeo.host / "etc/ostree/auth.json"
    link.parent.mkdir(parents=True)
    link.symlink_to("/run/secrets/pull.json")  # dangling from the agent's /, not the host's
    assert skopeo.resolver().auth_file() == "/etc/ostree/auth.json"
    dangling = skopeo.host / "run/ostree/auth.json"
    dangling.parent.mkdir(parents=True)
    dangling.symlink_to("/run/secrets/gone.json")
    assert skopeo.resolver().auth_file() == "/etc/ostree/auth.json"


async def test_behind_the_command_prefix(skopeo: FakeSkopeo) -> None:
    resolver = skopeo.resolver(command_prefix=[str(skopeo.prefix)])
    assert resolver.argv(TAGGED)[:2] == [str(skopeo.prefix), str(skopeo.path)]
    assert await resolver.resolve(TAGGED) == digest("amd64")
    assert skopeo.calls()[0]["prefixed"] == "yes"


async def test_a_single_image_is_the_digest_of_what_skopeo_printed(skopeo: FakeSkopeo) -> None:
    skopeo.answer(SINGLE)
    assert await skopeo.resolver(arch="s390x").resolve(TAGGED) == "sha256:" + sha(SINGLE)


async def test_the_deadline_is_kind_timeout(skopeo: FakeSkopeo) -> None:
    skopeo.answer(b"", sleep=30)
    started = time.monotonic()
    with pytest.raises(HostError) as caught:
        await skopeo.resolver(timeout=0.5).resolve(TAGGED)
    assert caught.value.kind == "timeout" and "0.5s" in str(caught.value)
    assert time.monotonic() - started < 10


def fatal(msg: str) -> str:
    # How skopeo reports a failure (logrus at level fatal), exit status 1.
    return f'time="2026-12-02T10:00:00Z" level=fatal msg="{msg}"\n'


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        (
            fatal(
                'Error parsing image name \\"docker://registry.example.com:5000/os/base:stable\\"'
                ": reading manifest stable in registry.example.com:5000/os/base: manifest unknown"
            ),
            "image-missing",
        ),
        (
            fatal(
                "Error parsing image name: reading manifest stable in registry.example.com:5000/"
                "os/base: unauthorized: authentication required"
            ),
            "registry-auth",
        ),
        (
            fatal("Error parsing image name: requested access to the resource is denied"),
            "registry-auth",
        ),
        (
            fatal(
                "Error parsing image name: pinging container registry registry.example.com:5000:"
                ' Get \\"https://registry.example.com:5000/v2/\\": dial tcp: connection refused'
            ),
            "other",
        ),
    ],
)
async def test_failures_are_classified_as_bootc_errors_are(
    skopeo: FakeSkopeo, stderr: str, kind: str
) -> None:
    skopeo.answer(b"", stderr=stderr, status=1)
    with pytest.raises(HostError) as caught:
        await skopeo.resolver().resolve(TAGGED)
    assert caught.value.kind == kind
    assert str(caught.value).startswith(f"skopeo inspect docker://{TAGGED}: ")
    assert "level=fatal" in str(caught.value)  # skopeo's own words


async def test_no_instance_for_this_platform_is_unsupported(skopeo: FakeSkopeo) -> None:
    with pytest.raises(HostError) as caught:
        await skopeo.resolver(arch="riscv64").resolve(TAGGED)
    assert caught.value.kind == "unsupported"
    assert "linux/riscv64" in str(caught.value) and "linux/s390x" in str(caught.value)


async def test_an_unreadable_answer_is_kind_other(skopeo: FakeSkopeo) -> None:
    skopeo.answer(b"<html>proxy error</html>")
    with pytest.raises(HostError) as caught:
        await skopeo.resolver().resolve(TAGGED)
    assert caught.value.kind == "other" and "unreadable manifest" in str(caught.value)


async def test_without_skopeo(skopeo: FakeSkopeo, tmp_path: Path) -> None:
    missing = skopeo.resolver(skopeo=str(tmp_path / "no-such-skopeo"))
    with pytest.raises(HostError) as caught:
        await missing.resolve(TAGGED)
    assert caught.value.kind == "unsupported" and "skopeo is not available" in str(caught.value)
    # Behind nsenter, a missing command is exit status 127.
    prefixed = skopeo.resolver(
        command_prefix=[str(skopeo.prefix)], skopeo=str(tmp_path / "no-such-skopeo")
    )
    with pytest.raises(HostError) as caught:
        await prefixed.resolve(TAGGED)
    assert caught.value.kind == "unsupported"


@pytest.mark.parametrize(
    "text", ["registry.example.com/os@sha256:" + "1" * 64, "registry.example.com/os"]
)
async def test_only_tags_are_resolved(skopeo: FakeSkopeo, text: str) -> None:
    with pytest.raises(HostError) as caught:
        await skopeo.resolver().resolve(parse_image_ref(text))
    assert caught.value.kind == "input"
    assert skopeo.calls() == []


def test_the_host_platform(
    skopeo: FakeSkopeo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert skopeo.resolver(arch="arm").host_platform() == ("arm", "")
    assert skopeo.resolver(arch="arm", variant="v6").host_platform() == ("arm", "v6")
    assert TagResolver().host_platform()[0] == go_arch(platform.machine())[0]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(PI_ZERO_CPUINFO)
    monkeypatch.setattr(platform, "machine", lambda: "armv7l")
    assert TagResolver(cpuinfo=cpuinfo).host_platform() == ("arm", "v6")  # cpuinfo decides
    assert TagResolver(cpuinfo=cpuinfo, variant="v7").host_platform() == ("arm", "v7")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert TagResolver(cpuinfo=tmp_path / "absent").host_platform() == ("arm64", "v8")
    monkeypatch.setattr(platform, "machine", lambda: "sparc64")
    with pytest.raises(HostError) as caught:
        TagResolver().host_platform()
    assert caught.value.kind == "unsupported"


async def test_the_instance_of_a_pinned_list_is_this_hosts(skopeo: FakeSkopeo) -> None:
    pinned = parse_image_ref(f"registry.example.com:5000/os/base@sha256:{sha(index(*MULTI))}")
    assert await skopeo.resolver().instance(pinned) == digest("amd64")
    assert skopeo.calls()[0]["argv"][-1] == f"docker://{pinned}"  # the list, by its digest
    single = b'{"schemaVersion": 2, "mediaType": "' + OCI_MANIFEST.encode() + b'", "config": {}}'
    skopeo.answer(single)
    own = parse_image_ref(f"registry.example.com:5000/os/base@sha256:{sha(single)}")
    assert await skopeo.resolver().instance(own) == f"sha256:{sha(single)}"  # its own
    with pytest.raises(HostError) as caught:
        await skopeo.resolver().instance(TAGGED)
    assert caught.value.kind == "input"
