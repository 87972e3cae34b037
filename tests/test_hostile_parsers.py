"""Hostile input for every parser (MachineConfig, Ignition, data URLs, image references, bootc
status, documents, the file source): whatever comes in, a parser returns its value or raises
InputError, never another exception, and the error names the field when one is at fault.

Seeds are the upstream fixtures and the builders' documents; a mutation replaces the value at
one random path with a hostile one (wrong types, nested lists, huge numbers, NaN, lone
surrogates, garbage data URLs), then the document is parsed as an object, as JSON, as YAML."""

from __future__ import annotations

import base64
import copy
import datetime
import gzip
import json
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.core.windows import parse_windows
from agent.errors import InputError
from agent.model.bootc_check import parse_check_output
from agent.model.bootc_status import BootcHost, bootc_host_from_object, parse_bootc_status
from agent.model.dataurl import decode_data_url, decompress
from agent.model.document import load_document
from agent.model.ignition import IgnitionConfig, parse_ignition
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import (
    MachineConfig,
    machine_config_from_object,
    parse_machine_config,
)
from agent.model.settings import check_settings, merge_fragments, parse_fragment, settings_from
from agent.sources.file import load_desired
from tests.builders import DIGEST_A, gz_url, ign_file, machine_config

FIXTURES = Path(__file__).parent / "fixtures"
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# No example database in the repository; a bounded run (the file takes seconds, not minutes).
HOSTILE = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)
FEW = settings(HOSTILE, max_examples=100)


# -- what a parser may do ------------------------------------------------------------------------
def outcome(parse: Callable[..., Any], *args: Any) -> Any:
    """The parser's value, or the InputError it raised. Any other exception fails the test."""
    try:
        return parse(*args)
    except InputError as exc:
        assert exc.message, "an InputError without a message"
        assert exc.message in str(exc) and exc.field in str(exc)
        return exc


def render(path: tuple[Any, ...]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


def related(field: str, where: str) -> bool:
    """The error is at the mutated value, inside it, or at a container holding it."""

    def within(inner: str, outer: str) -> bool:
        return inner == outer or inner.startswith((outer + ".", outer + "["))

    return within(field, where) or within(where, field)


def assert_names_field(result: Any, path: tuple[Any, ...], strip: str = "") -> None:
    """An InputError caused by a mutation at `path` names a field related to `path`."""
    if not isinstance(result, InputError):
        return
    field = result.field.removeprefix(strip)
    assert result.field, f"no field named for a hostile value at {render(path)}: {result}"
    assert related(field, render(path)), (
        f"error names {result.field!r}, the hostile value is at {render(path)!r}: {result}"
    )


def same(a: Any, b: Any) -> bool:
    if isinstance(a, InputError) or isinstance(b, InputError):
        return (
            isinstance(a, InputError)
            and isinstance(b, InputError)
            and (a.field, a.message) == (b.field, b.message)
        )
    return a == b


def _overwrite(data: bytes, at: int, junk: bytes) -> bytes:
    at %= len(data)
    return data[:at] + junk + data[at + len(junk) :]


# -- seeds ---------------------------------------------------------------------------------------
def _load(path: Path) -> Any:
    return load_document(path.read_bytes())


def _rich_machine_config() -> dict[str, Any]:
    return machine_config(
        files=[
            ign_file("/etc/a", "plain"),
            {"path": "/etc/b", "contents": {"source": gz_url("zipped"), "compression": "gzip"},
             "mode": 384, "user": {"name": "core"}, "group": {"id": 1000}, "overwrite": True},
        ],
        units=[
            {"name": "a.service", "contents": "[Unit]\n", "enabled": True},
            {"name": "b.service", "mask": True,
             "dropins": [{"name": "10-x.conf", "contents": "[Service]\n"}]},
        ],
        users=[{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "passwordHash": "$6$x"}],
        kargs=["nosmt"],
        extensions=["usbguard"],
        kernel_type="realtime",
        fips=False,
        ignition_extra={"storage": {"links": [{"path": "/etc/l", "target": "/etc/a"}],
                                    "directories": [{"path": "/etc/d"}]},
                        "kernelArguments": {"shouldExist": ["a"]}},
    )  # fmt: skip


def _test_config_as_v3() -> dict[str, Any]:
    doc = _load(FIXTURES / "mco/server_testdata_machine-configs_test-config.yaml")
    doc["spec"]["config"]["ignition"]["version"] = "3.2.0"  # so that its storage is read
    return doc


WORKER_99 = "controller_bootstrap_testdata_bootstrap_99_openshift-machineconfig_worker.yaml"
MC_SEEDS = [
    _rich_machine_config(),
    _test_config_as_v3(),
    _load(FIXTURES / "mco" / WORKER_99),
]
IGNITION_SEEDS = [
    _load(FIXTURES / "mco/controller_common_fixtures_ign_config.json"),
    _rich_machine_config()["spec"]["config"],
]
BOOTC_SEEDS = [_load(p) for p in sorted((FIXTURES / "bootc-status").glob("spec-*"))]


def paths_in(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path to a value inside `value` (mapping keys and list indices), root excluded."""
    if not isinstance(value, dict | list):
        return
    for key, child in value.items() if isinstance(value, dict) else enumerate(value):
        yield (*prefix, key)
        yield from paths_in(child, (*prefix, key))


def put(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(doc)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return out


# -- hostile values ------------------------------------------------------------------------------
FIELD_NAMES = [
    "kind", "apiVersion", "metadata", "name", "spec", "config", "ignition", "version",
    "storage", "files", "path", "contents", "source", "compression", "mode", "user", "group",
    "id", "overwrite", "append", "systemd", "units", "enabled", "mask", "dropins", "passwd",
    "users", "sshAuthorizedKeys", "passwordHash", "links", "disks", "osImageURL",
    "kernelArguments", "extensions", "kernelType", "fips", "status", "booted", "staged",
    "rollback", "image", "imageDigest", "transport", "cachedUpdate", "otherDeployments",
    "rollbackQueued", "incompatible", "pinned", "softRebootCapable", "downloadOnly",
    "timestamp", "architecture",
]  # fmt: skip
_gzip_garbage = st.binary(max_size=40).map(lambda b: gzip.compress(b)[: -(len(b) % 7) - 1])
_base64_garbage = st.one_of(
    st.text(alphabet="ABCDabcd0189+/=%-_ \n", max_size=24),
    _gzip_garbage.map(lambda b: base64.b64encode(b).decode()),
)
DATA_URLS = st.one_of(
    st.builds("data:;base64,{}".format, _base64_garbage),
    st.builds("data:,{}".format, st.text(max_size=12)),
    st.sampled_from(["data:", "data:;base64", "http://x/y", "data:,%", "data:,%zz", "data:,\ud800",
                     "data:;base64,\udcff", "data:;base64,%ff%fe", "s3:" + "x" * 200]),
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([-1, 0o7777 + 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, -(2**70)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=16),
    st.sampled_from(["", "3.2.0", "2.2.0", "3.99.0", "3." + "9" * 40 + ".0", "\u0663.\u0660.\u0660",
                     "\ud800", "a\x00b", "/etc/../x", "gzip", "xz", "realtime", "rt", "false"]),
    DATA_URLS,
)  # fmt: skip
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=12,
)
# Python values that no JSON document holds: only an object-taking parser can be handed them.
NOT_JSON = st.one_of(
    st.binary(max_size=8),
    st.sets(st.integers(), max_size=3),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.just(10**5000),
    st.just(datetime.date(2001, 12, 14)),
    st.just(object()),
    st.dictionaries(st.integers() | st.none() | st.floats(allow_nan=False), SCALARS, max_size=3),
    st.just({(1, 2): "tuple key"}),
    st.just({b"bytes key": 1}),
)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any], values: st.SearchStrategy[Any] = JSON_VALUES):
    """A seed document with the value at one random path replaced; and that path."""
    doc = draw(st.sampled_from(seeds))
    path = draw(st.sampled_from(list(paths_in(doc))))
    return put(doc, path, draw(values)), path


# -- MachineConfig -------------------------------------------------------------------------------
def test_the_seeds_parse() -> None:
    for seed in MC_SEEDS:
        assert isinstance(machine_config_from_object(seed), MachineConfig)
    for seed in IGNITION_SEEDS:
        assert isinstance(parse_ignition(seed), IgnitionConfig)
    for seed in BOOTC_SEEDS:
        assert isinstance(bootc_host_from_object(seed), BootcHost)


@HOSTILE
@given(mutated(MC_SEEDS))
def test_machine_config_with_a_hostile_field(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, path = case
    as_object = outcome(machine_config_from_object, doc)
    assert isinstance(as_object, MachineConfig | InputError)
    assert_names_field(as_object, path)
    # The bytes an API server or a file would hold: the same answer.
    as_json = outcome(parse_machine_config, json.dumps(doc).encode())
    assert same(as_object, as_json), (as_object, as_json)


@FEW
@given(mutated(MC_SEEDS))
def test_machine_config_as_yaml_reads_as_json_does(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, _ = case
    # A lone surrogate has no YAML spelling libyaml reads, and NaN is not equal to itself.
    assume(not re.search(r"\\ud[89a-f]|NaN", json.dumps(doc)))
    text = yaml.dump(doc, Dumper=DUMPER, allow_unicode=False, sort_keys=False)
    as_yaml = outcome(parse_machine_config, text.encode())
    assert same(as_yaml, outcome(machine_config_from_object, doc))


@FEW
@given(mutated(MC_SEEDS, NOT_JSON))
def test_machine_config_object_with_a_non_json_value(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, path = case
    result = outcome(machine_config_from_object, doc)
    assert isinstance(result, MachineConfig | InputError)
    assert_names_field(result, path)


@HOSTILE
@given(mutated(MC_SEEDS), st.sampled_from(["", "x", "{", "[1]", "null", "1" * 5000]))
def test_machine_config_with_spec_config_as_a_string(
    case: tuple[Any, tuple[Any, ...]], junk: str
) -> None:
    """A RawExtension can arrive serialized: the string is parsed like a document."""
    doc, path = case
    config = doc.get("spec", {}).get("config") if isinstance(doc.get("spec"), dict) else None
    assume(config is not None)
    for text in (json.dumps(config), junk, json.dumps(config)[:-1]):
        result = outcome(machine_config_from_object, put(doc, ("spec", "config"), text))
        if isinstance(result, InputError) and result.field.startswith("spec.config"):
            continue
        assert_names_field(result, path)


@HOSTILE
@given(JSON_VALUES)
def test_any_json_value_as_a_machine_config(value: Any) -> None:
    outcome(machine_config_from_object, value)
    outcome(parse_machine_config, json.dumps(value).encode())
    outcome(parse_ignition, value)


@HOSTILE
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data: bytes) -> None:
    for parse in (parse_machine_config, parse_bootc_status, load_document):
        outcome(parse, data)


def _settings(data: bytes) -> Any:
    merged = merge_fragments([("f.toml", parse_fragment(data, "f.toml"))])
    return check_settings(settings_from(merged, ["f.toml"]))


@HOSTILE
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_settings_and_check_output(data: bytes) -> None:
    """Standalone mode's inputs: a settings drop-in, `bootc upgrade --check`'s stdout, and the
    windows a drop-in holds."""
    outcome(_settings, data)
    outcome(parse_check_output, data.decode(errors="replace"))


@HOSTILE
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["days", "start_time", "length_minutes",
                                                       "x"]), inner, max_size=4),
                    max_leaves=12))  # fmt: skip
def test_hostile_windows(value: Any) -> None:
    outcome(parse_windows, value if isinstance(value, list) else [value], "w")


@HOSTILE
@given(
    st.sampled_from(MC_SEEDS + BOOTC_SEEDS),
    st.integers(min_value=0, max_value=10**6),
    st.binary(min_size=1, max_size=4),
    st.sampled_from(["json", "yaml", "gzip", "base64-gzip"]),
)
def test_corrupted_serialized_documents(seed: Any, at: int, junk: bytes, form: str) -> None:
    """A real document serialized four ways, with a few bytes overwritten somewhere."""
    raw = json.dumps(seed).encode() if form != "yaml" else yaml.dump(seed, Dumper=DUMPER).encode()
    if form == "gzip":
        raw = gzip.compress(raw)
    elif form == "base64-gzip":
        raw = base64.b64encode(gzip.compress(raw))
    data = _overwrite(raw, at, junk)
    at %= len(raw)
    for parse in (parse_machine_config, parse_bootc_status):
        outcome(parse, data)
    outcome(parse_machine_config, data[:at])  # truncated


# YAML a hostile or careless writer can produce; each is put in place of one field's value.
YAML_SNIPPETS = [
    "!!binary aGVsbG8=", "!!timestamp 2001-12-14", "!!timestamp nope", "!!bool abc", "!!int",
    "!!int 0x", "!!float x", "!!set {a, b}", "!!omap [a: 1, b: 2]", "!!pairs [a: 1]",
    "!!python/object:os.system x", "!custom tagged", "!ostreeRemote [a, {b: c}]", "&a [*a]",
    "&a {k: *a}", "*undefined", "{1: a, b: c, null: d, true: e, 1.5: f}", "{? [a]: b}",
    "[" * 200 + "]" * 200, "1" * 5000, ".nan", "-.inf", "0o777", "0x1F", "'\\ud800'",
    '"\\ud800"', '"\\x00"', "~", "<<: {a: 1}", "{<<: [1]}", "|-\n  text", "- a\n- b",
    "!!str", "!!map [1]", "!!seq {a: 1}",
]  # fmt: skip


@HOSTILE
@given(st.sampled_from(MC_SEEDS + BOOTC_SEEDS).flatmap(
    lambda doc: st.tuples(st.just(doc), st.sampled_from(list(paths_in(doc))))
), st.sampled_from(YAML_SNIPPETS))  # fmt: skip
def test_hostile_yaml_in_place_of_a_field(case: tuple[Any, tuple[Any, ...]], snippet: str) -> None:
    doc, path = case
    marker = "HOSTILE-VALUE-MARKER"
    text = yaml.dump(put(doc, path, marker), Dumper=DUMPER, default_flow_style=True, width=10**6)
    data = text.replace(marker, snippet).encode()
    for parse in (parse_machine_config, parse_bootc_status, load_document):
        result = outcome(parse, data)
        if isinstance(result, InputError) and result.field and parse is load_document:
            assert related(result.field, render(path)), (result, render(path))


def test_yaml_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(InputError, match="too large"):
        load_document("\n".join(lines).encode())


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b'{"kind": "MachineConfig", "spec": {"kernelType": [1]}}', "spec.kernelType"),
        (b'{"kind": "MachineConfig", "spec": {"kernelType": {"a": 1}}}', "spec.kernelType"),
        (b"kind: MachineConfig\nspec: {config: {ignition: {version: 3.2.0},"
         b" storage: {disks: !!binary aGVsbG8=}}}", "spec.config.storage.disks"),
        (b"kind: MachineConfig\nspec: {config: {ignition: {version: 3.2.0},"
         b" storage: {disks: &a [*a]}}}", "spec.config.storage.disks[0]"),
        (b'{"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": "/a",'
         b' "contents": {"source": "data:,\\ud800"}}]}}', "storage.files[0].contents.source"),
        (b'{"ignition": {"version": "3.' + b"1" * 5000 + b'.0"}}', "config.ignition.version"),
        (b'{"ignition": {"version": "3.2.0"}, "systemd": {"units": [{"name": "a",'
         b' "dropins": 5}]}}', "config.systemd.units[0].dropins"),
        (b'{"ignition": {"version": "3.2.0"}, "systemd": {"units": [{"name": "a",'
         b' "enabled": "yes"}]}}', "config.systemd.units[0].enabled"),
        (b'{"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": "/a",'
         b' "user": {"id": 4294967296}}]}}', "config.storage.files[0].user.id"),
        (b'{"ignition": {"version": "3.2.0"}, "storage": {"files": [{"path": "/a",'
         b' "overwrite": "no"}]}}', "config.storage.files[0].overwrite"),
    ],
)  # fmt: skip
def test_found_by_hostile_input(data: bytes, field: str) -> None:
    """Inputs that once raised TypeError, ValueError or UnicodeEncodeError, or were misread."""
    with pytest.raises(InputError) as info:
        parse_machine_config(data)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a": ' + b"1" * 5000 + b"}", "too many digits"),
        (b"a: " + b"1" * 5000, "invalid YAML"),
        (b"a: !!bool abc", "invalid YAML"),
        (b"a: !!timestamp nope", "invalid YAML"),
    ],
)
def test_documents_found_by_hostile_input(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_document(data)


# -- Ignition ------------------------------------------------------------------------------------
@HOSTILE
@given(mutated(IGNITION_SEEDS))
def test_ignition_with_a_hostile_field(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, path = case
    result = outcome(parse_ignition, doc, "config")
    assert isinstance(result, IgnitionConfig | InputError)
    assert_names_field(result, path, strip="config.")
    # A bare Ignition config is a MachineConfig document too.
    as_bytes = outcome(parse_machine_config, json.dumps(doc).encode())
    if isinstance(as_bytes, InputError):
        assert_names_field(as_bytes, path, strip="config.")
    else:
        assert isinstance(result, IgnitionConfig) and as_bytes.ignition == result


@FEW
@given(
    st.lists(
        st.fixed_dictionaries(
            {"path": st.text(max_size=8)},
            optional={"contents": st.fixed_dictionaries(
                {"source": DATA_URLS},
                optional={"compression": st.sampled_from(["gzip", "", None, "xz", 1])}),
                "mode": SCALARS, "user": JSON_VALUES, "append": JSON_VALUES},
        ),
        max_size=3,
    )
)  # fmt: skip
def test_ignition_files_with_hostile_contents(files: list[dict[str, Any]]) -> None:
    result = outcome(
        parse_ignition, {"ignition": {"version": "3.4.0"}, "storage": {"files": files}}
    )
    if isinstance(result, InputError):
        assert re.fullmatch(r"config\.storage\.files\[\d+\](\..+)?", result.field), result


# -- data URLs and compression -------------------------------------------------------------------
_percent = st.builds("%{}".format, st.text(alphabet="0123456789abcdefABCDEFxz%", max_size=2))
_url_text = st.lists(
    st.one_of(st.characters(), st.sampled_from(list(",;%=+/ ")), _percent), max_size=30
).map("".join)
_header = st.lists(
    st.sampled_from(["text/plain", "charset=utf-8", "base64", "BASE64", " base64 ", "", "a=b"])
    | st.text(max_size=5),
    max_size=3,
).map(";".join)


@HOSTILE
@given(st.one_of(st.builds("data:{},{}".format, _header, _url_text), _url_text, DATA_URLS))
def test_data_urls(url: str) -> None:
    result = outcome(decode_data_url, url)
    assert isinstance(result, bytes | InputError)


@HOSTILE
@given(
    st.one_of(
        st.binary(max_size=64),
        _gzip_garbage,
        st.builds(_overwrite, st.binary(max_size=32).map(gzip.compress), st.integers(0, 63),
                  st.binary(min_size=1, max_size=3)),
        st.binary(max_size=16).map(lambda b: gzip.compress(b) + gzip.compress(b) + b"\x00junk"),
    ),
    st.sampled_from(["gzip", None, "", "xz", "GZIP", "gzip ", "zstd"]),
)  # fmt: skip
def test_decompress(data: bytes, compression: str | None) -> None:
    result = outcome(decompress, data, compression)
    assert isinstance(result, bytes | InputError)
    url = "data:;base64," + base64.b64encode(data).decode()
    assert isinstance(
        outcome(lambda: decompress(decode_data_url(url), compression)), bytes | InputError
    )


# -- image references ----------------------------------------------------------------------------
_ref_chars = "abcXYZ019.-_:/@+ \t\u00e9\u0663%\x00"
_digests = st.one_of(
    st.builds("sha256:{}".format, st.text(alphabet="0123456789abcdefABCDEFg", max_size=70)),
    st.just(DIGEST_A),
    st.text(alphabet="sha256:md5@", max_size=12),
)
IMAGE_REFS = st.one_of(
    st.text(max_size=64),
    st.text(alphabet=_ref_chars, max_size=80),
    st.builds(
        lambda reg, comps, tag, dig: reg + "/" + "/".join(comps) + tag + dig,
        st.text(alphabet="abc019.-:_", max_size=20),
        st.lists(st.text(alphabet="abc09._-_/A", min_size=0, max_size=12), min_size=1, max_size=4),
        st.one_of(st.just(""), st.builds(":{}".format, st.text(alphabet="aZ09_.-:", max_size=140))),
        st.one_of(st.just(""), st.builds("@{}".format, _digests)),
    ),
    st.builds(lambda n: "quay.io/" + "a" * n, st.integers(0, 3000)),
    st.sampled_from([f"quay.io/os@{DIGEST_A}@{DIGEST_A}", "quay.io/", "/os", ":5000/os",
                     "quay.io:port/os", "quay.io/os:", "quay.io/os@", "QUAY.IO/os"]),
    JSON_VALUES,
)  # fmt: skip


@HOSTILE
@given(IMAGE_REFS)
def test_image_refs(text: Any) -> None:
    result = outcome(parse_image_ref, text)
    if isinstance(result, ImageRef):
        assert str(result) == text  # what was accepted is what is printed
        assert parse_image_ref(str(result)) == result
    else:
        assert isinstance(result, InputError)
        assert len(str(result)) < 1500  # a reference too long to be real is not echoed back


# -- bootc status --------------------------------------------------------------------------------
@HOSTILE
@given(mutated(BOOTC_SEEDS))
def test_bootc_status_with_a_hostile_field(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, path = case
    as_object = outcome(bootc_host_from_object, doc)
    assert isinstance(as_object, BootcHost | InputError)
    assert_names_field(as_object, path)
    as_json = outcome(parse_bootc_status, json.dumps(doc).encode())
    assert same(as_object, as_json), (as_object, as_json)
    if isinstance(as_object, BootcHost):  # what the engine reads of it has the right types
        for entry in (as_object.booted, as_object.staged, as_object.rollback):
            if entry and entry.image:
                for text in (entry.image.image, entry.image.digest, entry.image.version):
                    assert text is None or isinstance(text, str)
                assert isinstance(entry.pinned, bool)


@FEW
@given(mutated(BOOTC_SEEDS, NOT_JSON))
def test_bootc_status_object_with_a_non_json_value(case: tuple[Any, tuple[Any, ...]]) -> None:
    doc, path = case
    assert_names_field(outcome(bootc_host_from_object, doc), path)


@HOSTILE
@given(JSON_VALUES)
def test_any_json_value_as_bootc_status(value: Any) -> None:
    outcome(bootc_host_from_object, value)
    outcome(bootc_host_from_object, {"apiVersion": "org.containers.bootc/v1", "status": value})


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"status": {"otherDeployments": 5}}, "status.otherDeployments"),
        ({"status": {"rollbackQueued": "false"}}, "status.rollbackQueued"),
        ({"status": {"staged": {"downloadOnly": "false"}}}, "status.staged.downloadOnly"),
        ({"spec": {"image": {"image": ["x"]}}}, "spec.image.image"),
        ({"status": {"booted": {"image": {"image": {"image": "a"}, "imageDigest": "d",
                                          "version": {"v": 1}}}}}, "status.booted.image.version"),
    ],
)  # fmt: skip
def test_bootc_status_found_by_hostile_input(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError) as info:
        bootc_host_from_object({"apiVersion": "org.containers.bootc/v1", **doc})
    assert info.value.field == field


# -- the file source -----------------------------------------------------------------------------
@HOSTILE
@given(
    st.one_of(
        st.binary(max_size=200),
        mutated(MC_SEEDS).map(lambda case: json.dumps(case[0]).encode()),
        st.sampled_from(MC_SEEDS).map(lambda doc: yaml.dump(doc, Dumper=DUMPER).encode()),
    ),
    st.one_of(st.none(), IMAGE_REFS.filter(lambda v: isinstance(v, str))),
)
def test_file_source(data: bytes, image: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "desired.yaml"
        path.write_bytes(data)
        result = outcome(load_desired, path, image)
    if isinstance(result, InputError):
        assert result.source == str(path)
        if "image reference" in result.message:
            assert result.field == ("--image" if image else "spec.osImageURL")
    else:
        assert result.config.name and result.document == data


@pytest.mark.parametrize("name", ["missing.yaml", "dir", "bad\0name", "x" * 300])
def test_file_source_unreadable_paths(tmp_path: Path, name: str) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(InputError, match="cannot read") as info:
        load_desired(tmp_path / name)
    assert info.value.source


def test_nan_and_huge_numbers_are_values_not_crashes() -> None:
    doc = machine_config(ignition_extra={"storage": {"disks": [{"size": math.nan, "n": 2**200}]}})
    assert "NaN" in machine_config_from_object(doc).ignition.disks


@pytest.mark.parametrize("where", ["document", "file contents"])
def test_a_gzip_bomb_is_refused_not_expanded(where: str) -> None:
    """1 GiB of zeros is about 1 MiB of gzip: refused once past MAX_DECOMPRESSED (256 MiB)."""
    bomb = gzip.compress(b"\0" * (300 << 20), compresslevel=1)
    with pytest.raises(InputError) as err:
        if where == "document":
            load_document(bomb)
        else:
            decompress(bomb, "gzip")
    assert "expand beyond 256 MiB" in str(err.value)
