"""Which digest bootc records as `imageDigest` for a tag, from the manifest the tag points to
(pure: bytes in, digest out).

bootc < 1.15 has no `upgrade --tag`, so the agent resolves a tag itself with `skopeo inspect
--raw` (agent/host/skopeo.py) and stages by digest (docs/bootc-releases.md §11). bootc records
the per-platform instance digest, never an index's (docs/bootc-releases.md §7): its skopeo
proxy fetches the tag's manifest and, for a multi-image one, takes the instance that
containers/image's `ChooseInstance` picks for the running platform. This module repeats that
choice (containers/image `internal/manifest/{manifest,list,oci_index,docker_schema2_list}.go`
and `internal/pkg/platform/platform_matcher.go`: platform matching unchanged since v5.11,
2021, the zstd preference since v5.25, 2023, both still so in the go.podman.io/image that
skopeo vendors today; every skopeo beside a bootc >= 1.6 is newer):

- The kind: the top-level `mediaType` (the proxy goes by the registry's Content-Type, which
  `--raw` does not print; registries serve the type the manifest declares); without a
  recognised one, by shape (`GuessMIMEType`):
  `schemaVersion` 1 is Docker schema 1; with 2, a `config.mediaType` says OCI or Docker image,
  a non-empty `manifests` without config says OCI index, anything else an OCI manifest.
- Wanted platforms, best first (`WantedPlatforms`): os `linux`, the Go architecture, and the
  variants: with a variant V known for the architecture (`arm`: v8 > v7 > v6 > v5; `arm64`: v8),
  V and every less capable one, then none; with an unknown V, V then none; without a variant,
  none first, then all known variants of the architecture. Matching is exact on os,
  architecture and variant (`MatchesPlatform`); `os.version`/`os.features` are ignored.
- Docker manifest list: for each wanted platform in order, the first entry that matches. An
  entry without `platform` never matches.
- OCI index: the best entry by (wanted-platform rank, zstd first, position). An entry without
  `platform` is a candidate of the lowest rank (it matches any platform, after every entry
  that names one). "zstd" is the annotation `io.github.containers.compression.zstd: "true"`:
  the proxy calls plain `ChooseInstance`, which prefers zstd over gzip among equals.
- A single image (OCI manifest, Docker schema 2): the sha256 of the raw bytes
  (`manifest.Digest`, what `skopeo manifest-digest` prints).

Refused, because bootc could not deploy the result (`UnsupportedManifest`): Docker schema 1
(the proxy rejects "legacy" manifests), an index whose chosen entry is itself an index, a
valid sha384/sha512 instance digest (the agent pins `name@sha256:...` only), no instance for the
platform (`NoMatchingInstance`, naming the platforms there are). Unreadable input is a plain
`InputError`.

JSON is read as Go's encoding/json reads it into containers/image's structs: struct fields
match keys case-insensitively and the last duplicate wins (maps, e.g. annotations, match
exactly); `null` is the same as absent; a field this reads, of the wrong type, fails the whole
manifest."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import InputError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_SCHEMA1 = "application/vnd.docker.distribution.manifest.v1+json"
DOCKER_SCHEMA1_SIGNED = "application/vnd.docker.distribution.manifest.v1+prettyjws"
LISTS = frozenset({OCI_INDEX, DOCKER_LIST})
IMAGES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ZSTD_ANNOTATION = "io.github.containers.compression.zstd"
# containers/image reads at most 4 MiB of a manifest (iolimits.MaxManifestBodySize).
MAX_MANIFEST = 4 * 1024 * 1024
_SHOWN = 12  # platforms named in a "no instance" error

# platform_matcher.go `compatibility`: variants most capable first.
_VARIANTS: dict[str, tuple[str, ...]] = {"arm": ("v8", "v7", "v6", "v5"), "arm64": ("v8",)}
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
# The other algorithms go-digest accepts: valid, but not what the agent pins.
_OTHER_DIGESTS = {"sha384": re.compile(r"[0-9a-f]{96}"), "sha512": re.compile(r"[0-9a-f]{128}")}
# platform.machine() (uname -m) to GOARCH, as the kernel names the machine skopeo runs on.
_GO_ARCH: dict[str, str] = {
    "x86_64": "amd64",
    "amd64": "amd64",
    "i386": "386",
    "i486": "386",
    "i586": "386",
    "i686": "386",
    "aarch64": "arm64",
    "arm64": "arm64",
    "aarch64_be": "arm64be",
    "ppc64le": "ppc64le",
    "ppc64": "ppc64",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "loongarch64": "loong64",
    "mips64": "mips64",
    "mips": "mips",
}
# 32-bit ARM machine names (armv7l, armv6l, armv5tejl, armv8l) carry the architecture version.
_ARM32 = re.compile(r"arm(?:v(\d+)[a-z]*)?")


class UnsupportedManifest(InputError):
    """A readable manifest that gives no digest bootc could deploy on this platform."""


class NoMatchingInstance(UnsupportedManifest):
    """A multi-image manifest with no instance for the wanted platform; `platforms` names
    those it has (`os/arch[/variant]`, `(no platform)`)."""

    def __init__(self, message: str, *, platforms: Sequence[str] = ()) -> None:
        self.platforms = tuple(platforms)
        super().__init__(message)


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    def __str__(self) -> str:
        parts = [self.os, self.architecture] + ([self.variant] if self.variant else [])
        return "/".join(parts)


def go_arch(machine: str) -> tuple[str, str]:
    """`platform.machine()` as (GOARCH, variant): what containers/image in a skopeo built for
    this machine wants. The variant is ARM's (arm64 `v8`; armv7l `v7`...); skopeo reads it from
    /proc/cpuinfo (`cpu_variant`), and the machine name gives the same on ordinary hardware."""
    name = machine.strip().lower()
    if name in _GO_ARCH:
        arch = _GO_ARCH[name]
        return arch, "v8" if arch == "arm64" else ""
    arm = _ARM32.fullmatch(name)
    if arm:
        version = arm.group(1)
        return "arm", f"v{version}" if version and f"v{version}" in _VARIANTS["arm"] else ""
    raise InputError(f"unknown machine architecture {machine!r}", field="machine")


def cpu_variant(cpuinfo: str) -> str:
    """The ARM variant containers/image reads from /proc/cpuinfo (`getCPUVariantArm`): the
    first `CPU architecture` line; "7" is v6 on an "ARMv6-compatible" model (Raspberry Pi
    Zero); "" when there is no such line or the value is unknown."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, colon, value = line.partition(":")
        if colon and (key := key.strip().lower()) not in fields:
            fields[key] = value.split(":", 1)[0].strip()
    value = fields.get("cpu architecture", "").lower()
    if value in ("8", "aarch64"):
        return "v8"
    if value == "7":
        model = fields.get("model name")
        if model is None:
            return ""
        return "v6" if model.lower().startswith("armv6-compatible") else "v7"
    known = {
        "v7": ("7m", "?(12)", "?(13)", "?(14)", "?(15)", "?(16)", "?(17)"),
        "v6": ("6", "6tej"),
        "v5": ("5", "5t", "5te", "5tej"),
        "v4": ("4", "4t"),
        "v3": ("3",),
    }
    return next((variant for variant, names in known.items() if value in names), "")


def wanted_platforms(arch: str, variant: str = "") -> tuple[Platform, ...]:
    """The platforms `ChooseInstance` accepts on linux/`arch`[/`variant`], best first."""
    order = _VARIANTS.get(arch, ())
    if variant:
        variants = [*order[order.index(variant) :]] if variant in order else [variant]
        variants.append("")
    else:
        variants = ["", *order]
    return tuple(Platform("linux", arch, v) for v in variants)


def image_digest(raw: bytes, *, arch: str, variant: str = "") -> str:
    """The digest bootc records as `imageDigest` when it pulls the tag whose manifest is `raw`
    (as `skopeo inspect --raw` printed it) on linux/`arch`[/`variant`]: a list's chosen
    instance, or the sha256 of a single image's bytes. Raises `UnsupportedManifest` (or its
    `NoMatchingInstance`) when bootc could not deploy it, `InputError` when unreadable."""
    document = _load(raw)
    kind = _kind(document)
    if kind in (DOCKER_SCHEMA1, DOCKER_SCHEMA1_SIGNED):
        raise UnsupportedManifest(
            "a Docker schema 1 manifest: bootc (its skopeo proxy) refuses legacy manifests"
        )
    if kind in IMAGES:
        _unambiguous(document, kind, allowed={"config", "layers"})
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    _unambiguous(document, kind, allowed={"manifests"})
    entries = _entries(document)
    wanted = wanted_platforms(arch, variant)
    chosen = (
        _choose_docker(entries, wanted) if kind == DOCKER_LIST else _choose_oci(entries, wanted)
    )
    if chosen is None:
        there = list(dict.fromkeys(entry.describe() for entry in entries))
        shown = ", ".join(there[:_SHOWN]) if there else "no instances"
        if len(there) > _SHOWN:
            shown += f" and {len(there) - _SHOWN} more"
        raise NoMatchingInstance(
            f"the {_KIND_NAMES[kind]} has no instance for {wanted[0]} (it has {shown})",
            platforms=there,
        )
    return _usable_digest(chosen)


def _kind(document: Any) -> str:
    """The manifest's MIME type as containers/image tells it from the bytes (`GuessMIMEType`):
    the `mediaType` when it is one of the four it knows, else by `schemaVersion` and shape."""
    media_type = _string(document, "mediaType")
    if media_type in LISTS or media_type in IMAGES:
        return media_type
    version = _field(document, "schemaVersion")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
        raise InputError("not an integer", field="schemaVersion")
    if version == 1:
        return (
            DOCKER_SCHEMA1_SIGNED if _field(document, "signatures") is not None else DOCKER_SCHEMA1
        )
    if version != 2:
        raise InputError(
            f"not an image manifest (mediaType {media_type!r}, schemaVersion {version!r})"
        )
    config = _field(document, "config")
    config_type = _string(config, "mediaType", "config") if config is not None else ""
    if config_type == OCI_CONFIG:
        return OCI_MANIFEST
    if config_type == DOCKER_CONFIG:
        return DOCKER_MANIFEST
    manifests = _field(document, "manifests")
    if manifests is not None and not isinstance(manifests, list):
        raise InputError("not a list", field="manifests")
    if manifests:
        if config_type:
            raise InputError(f"a list of manifests with a config of type {config_type!r}")
        return OCI_INDEX
    return OCI_MANIFEST  # an OCI artifact, or an image from before image-spec 1.0.2


# -- reading JSON as Go does ---------------------------------------------------------------


class _Object:
    """A JSON object with every key/value pair in order (duplicates kept)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _reject_constant(name: str) -> Any:
    raise InputError(f"{name} is not JSON")


def _load(raw: bytes) -> Any:
    if not isinstance(raw, bytes | bytearray):
        raise InputError("manifest is not bytes")
    if len(raw) > MAX_MANIFEST:
        raise InputError(f"manifest is {len(raw)} bytes, more than {MAX_MANIFEST}")
    try:
        text = bytes(raw).decode("utf-8")  # Go's encoding/json reads UTF-8 only
        document = json.loads(text, object_pairs_hook=_Object, parse_constant=_reject_constant)
    except InputError:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InputError(f"manifest is not JSON ({type(exc).__name__})") from None
    if not isinstance(document, _Object):
        raise InputError("manifest is not a JSON object")
    return document


def _field(value: Any, name: str) -> Any:
    """A struct field: the last key equal to `name` ignoring case; None when absent or null."""
    if not isinstance(value, _Object):
        return None
    wanted, found = name.lower(), None
    for key, item in value.pairs:
        if key.lower() == wanted:
            found = item
    return found


def _string(value: Any, name: str, where: str = "") -> str:
    item = _field(value, name)
    if item is not None and not isinstance(item, str):
        raise InputError("not a string", field=f"{where}.{name}" if where else name)
    return item or ""


def _unambiguous(document: Any, kind: str, *, allowed: set[str]) -> None:
    """containers/image refuses a manifest that also has another format's essential fields
    (`ValidateUnambiguousManifestFormat`: any non-null value counts)."""
    essential = ("config", "fsLayers", "history", "layers", "manifests")
    extra = [
        name for name in essential if name not in allowed and _field(document, name) is not None
    ]
    if extra:
        raise InputError(f"ambiguous manifest: fields {extra} in a {_KIND_NAMES[kind]}")


@dataclass(frozen=True)
class _Entry:
    position: int
    digest: str
    media_type: str
    platform: Platform | None
    zstd: bool

    def describe(self) -> str:
        # The registry's text: bounded, so an error message stays a readable reason.
        return str(self.platform)[:80] if self.platform is not None else "(no platform)"


def _entries(document: Any) -> list[_Entry]:
    """The `manifests` entries; every field the choice reads must have its Go type."""
    manifests = _field(document, "manifests")
    if manifests is None:
        return []
    if not isinstance(manifests, list):
        raise InputError("not a list", field="manifests")
    entries = []
    for position, item in enumerate(manifests):
        where = f"manifests[{position}]"
        if item is not None and not isinstance(item, _Object):
            raise InputError("not an object", field=where)
        platform = _field(item, "platform")
        if platform is not None and not isinstance(platform, _Object):
            raise InputError("not an object", field=f"{where}.platform")
        entries.append(
            _Entry(
                position=position,
                digest=_string(item, "digest", where),
                media_type=_string(item, "mediaType", where),
                platform=None if platform is None else _platform(platform, f"{where}.platform"),
                zstd=_annotation(item, ZSTD_ANNOTATION, where) == "true",
            )
        )
    return entries


def _annotation(item: Any, key: str, where: str) -> str:
    """One annotation: a map, so the key matches exactly and the last duplicate wins."""
    annotations = _field(item, "annotations")
    if annotations is None:
        return ""
    if not isinstance(annotations, _Object):
        raise InputError("not an object", field=f"{where}.annotations")
    found = ""
    for name, value in annotations.pairs:
        if value is not None and not isinstance(value, str):
            raise InputError("not a string", field=f"{where}.annotations[{name!r}]")
        if name == key:
            found = value or ""
    return found


def _platform(value: Any, where: str) -> Platform:
    return Platform(
        os=_string(value, "os", where),
        architecture=_string(value, "architecture", where),
        variant=_string(value, "variant", where),
    )


def _choose_docker(entries: list[_Entry], wanted: Sequence[Platform]) -> _Entry | None:
    # Schema2List.ChooseInstance: wanted platforms in order, then the list in order. A missing
    # platform decodes as all-empty and matches nothing.
    for platform in wanted:
        for entry in entries:
            if (entry.platform or Platform("", "")) == platform:
                return entry
    return None


def _choose_oci(entries: list[_Entry], wanted: Sequence[Platform]) -> _Entry | None:
    # OCI1Index.chooseInstance with preferGzip false: rank (no platform ranks last), then zstd
    # before gzip, then position.
    best: tuple[int, bool, int] | None = None
    chosen = None
    for entry in entries:
        if entry.platform is None:
            rank = len(wanted)
        elif entry.platform in wanted:
            rank = wanted.index(entry.platform)
        else:
            continue
        key = (rank, not entry.zstd, entry.position)
        if best is None or key < best:
            best, chosen = key, entry
    return chosen


def _usable_digest(entry: _Entry) -> str:
    where = f"manifests[{entry.position}]"
    if entry.media_type in LISTS:
        raise UnsupportedManifest(
            f"the instance for this platform is itself a list ({entry.media_type}): bootc "
            "deploys image manifests only",
            field=where,
        )
    digest = entry.digest
    if _SHA256.fullmatch(digest):
        return digest
    algorithm, _, encoded = digest.partition(":")
    if algorithm in _OTHER_DIGESTS and _OTHER_DIGESTS[algorithm].fullmatch(encoded):
        raise UnsupportedManifest(
            f"the instance digest uses {algorithm}: the agent pins images by sha256 only",
            field=f"{where}.digest",
        )
    raise InputError(f"not a digest: {digest[:80]!r}", field=f"{where}.digest")


_KIND_NAMES = {
    OCI_INDEX: "OCI image index",
    DOCKER_LIST: "Docker manifest list",
    OCI_MANIFEST: "OCI image manifest",
    DOCKER_MANIFEST: "Docker image manifest",
}
