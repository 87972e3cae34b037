"""Ignition 3.x configs, reduced to what a node agent can diff: files, units, users, and the
sections whose change is refused (kept as canonical JSON so a change is cheap to detect)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.errors import InputError
from agent.model.dataurl import decode_data_url, decompress

T = TypeVar("T")
SUPPORTED_MINORS = range(0, 6)  # Ignition spec 3.0 to 3.5
# ASCII digits only (`\d` takes any script's digits), and few enough for int() to convert.
_VERSION = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(?:-experimental)?")
_USER_FIELDS = frozenset({"name", "sshAuthorizedKeys", "passwordHash"})
# uid_t and gid_t are 32 bits; 2**32 - 1 is chown's "leave unchanged".
MAX_ID = 2**32 - 2


@dataclass(frozen=True)
class Owner:
    """A user or group given by numeric id or by name (resolved on the host, not here)."""

    id: int | None = None
    name: str | None = None

    def __str__(self) -> str:
        return self.name if self.name is not None else str(self.id if self.id is not None else 0)


@dataclass(frozen=True)
class FileEntry:
    path: str
    contents: bytes = field(repr=False)
    mode: int = 0o644
    user: Owner = Owner()
    group: Owner = Owner()
    overwrite: bool | None = None
    has_append: bool = False


@dataclass(frozen=True)
class Dropin:
    name: str
    contents: str | None


@dataclass(frozen=True)
class Unit:
    name: str
    contents: str | None = None
    enabled: bool | None = None
    mask: bool | None = None
    dropins: tuple[Dropin, ...] = ()


@dataclass(frozen=True)
class User:
    name: str
    ssh_keys: tuple[str, ...] = ()
    password_hash: str | None = None
    other_fields: frozenset[str] = frozenset()


@dataclass(frozen=True)
class IgnitionConfig:
    version: str
    major: int
    minor: int
    files: dict[str, FileEntry] = field(default_factory=dict)
    units: dict[str, Unit] = field(default_factory=dict)
    users: tuple[User, ...] | None = None
    # Canonical JSON of sections that are compared, never applied.
    disks: str = "[]"
    filesystems: str = "[]"
    raid: str = "[]"
    directories: str = "[]"
    groups: str = "[]"
    kernel_arguments: str = "{}"
    links: frozenset[str] = frozenset()

    @property
    def supported(self) -> bool:
        return self.major == 3 and self.minor in SUPPORTED_MINORS


def empty_config() -> IgnitionConfig:
    return IgnitionConfig(version="3.5.0", major=3, minor=5)


def _canonical(value: Any) -> str:
    return json.dumps(value if value is not None else [], sort_keys=True, separators=(",", ":"))


def _expect(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputError(f"expected {what}, got {type(value).__name__}", field=where)
    return value


def _optional_bool(value: Any, where: str) -> bool | None:
    return None if value is None else _expect(value, bool, where, "a boolean")


def _owner(raw: Any, where: str) -> Owner:
    if raw is None:
        return Owner()
    _expect(raw, dict, where, "an object")
    ident, name = raw.get("id"), raw.get("name")
    if ident is not None:
        _expect(ident, int, f"{where}.id", "an integer")
        if ident < 0:
            raise InputError("must not be negative", field=f"{where}.id")
        if ident > MAX_ID:
            raise InputError(f"out of range (at most {MAX_ID})", field=f"{where}.id")
    if name is not None:
        _expect(name, str, f"{where}.name", "a string")
    return Owner(ident, name or None)


def _file(raw: Any, where: str) -> FileEntry:
    _expect(raw, dict, where, "an object")
    path = _expect(raw.get("path"), str, f"{where}.path", "a string")
    contents = raw.get("contents") or {}
    _expect(contents, dict, f"{where}.contents", "an object")
    data = b""
    source = contents.get("source")
    if source is not None:
        _expect(source, str, f"{where}.contents.source", "a string")
        compression = contents.get("compression")
        if compression is not None:
            _expect(compression, str, f"{where}.contents.compression", "a string")
        if compression not in (None, "", "gzip"):
            raise InputError(
                f"unsupported compression {compression!r}: only gzip is supported",
                field=f"{where}.contents.compression",
            )
        try:
            data = decompress(decode_data_url(source), compression)
        except InputError as exc:
            raise InputError(exc.message, field=f"{where}.contents.source") from None
    mode = raw.get("mode")
    if mode is None:
        mode = 0o644
    _expect(mode, int, f"{where}.mode", "an integer")
    if not 0 <= mode <= 0o7777:
        raise InputError(f"mode {mode:#o} is out of range", field=f"{where}.mode")
    overwrite = _optional_bool(raw.get("overwrite"), f"{where}.overwrite")
    append = raw.get("append")
    if append is not None:
        _expect(append, list, f"{where}.append", "a list")
    return FileEntry(
        path=path,
        contents=data,
        mode=mode,
        user=_owner(raw.get("user"), f"{where}.user"),
        group=_owner(raw.get("group"), f"{where}.group"),
        overwrite=overwrite,
        has_append=bool(append),
    )


def _unit(raw: Any, where: str) -> Unit:
    _expect(raw, dict, where, "an object")
    name = _expect(raw.get("name"), str, f"{where}.name", "a string")
    contents = raw.get("contents")
    if contents is not None:
        _expect(contents, str, f"{where}.contents", "a string")
    dropins = []
    raw_dropins = raw.get("dropins") or []
    _expect(raw_dropins, list, f"{where}.dropins", "a list")
    for i, dropin in enumerate(raw_dropins):
        dwhere = f"{where}.dropins[{i}]"
        _expect(dropin, dict, dwhere, "an object")
        dname = _expect(dropin.get("name"), str, f"{dwhere}.name", "a string")
        dcontents = dropin.get("contents")
        if dcontents is not None:
            _expect(dcontents, str, f"{dwhere}.contents", "a string")
        dropins.append(Dropin(dname, dcontents))
    return Unit(
        name=name,
        contents=contents,
        enabled=_optional_bool(raw.get("enabled"), f"{where}.enabled"),
        mask=_optional_bool(raw.get("mask"), f"{where}.mask"),
        dropins=tuple(sorted(dropins, key=lambda d: d.name)),
    )


def _user(raw: Any, where: str) -> User:
    _expect(raw, dict, where, "an object")
    name = _expect(raw.get("name"), str, f"{where}.name", "a string")
    keys = raw.get("sshAuthorizedKeys") or []
    _expect(keys, list, f"{where}.sshAuthorizedKeys", "a list")
    for i, key in enumerate(keys):
        _expect(key, str, f"{where}.sshAuthorizedKeys[{i}]", "a string")
    password = raw.get("passwordHash")
    if password is not None:
        _expect(password, str, f"{where}.passwordHash", "a string")
    others = frozenset(k for k, v in raw.items() if k not in _USER_FIELDS and v not in (None, ""))
    return User(name, tuple(keys), password, others)


def _keyed(raw: Any, where: str, parse: Callable[[Any, str], T], key: str) -> dict[str, T]:
    """A list of entries, each parsed and keyed by a field that must be unique."""
    if raw is None:
        return {}
    _expect(raw, list, where, "a list")
    out: dict[str, T] = {}
    for i, item in enumerate(raw):
        entry = parse(item, f"{where}[{i}]")
        name = getattr(entry, key)
        if name in out:
            raise InputError(f"duplicate {key} {name!r}", field=f"{where}[{i}]")
        out[name] = entry
    return out


def parse_ignition(raw: Any, where: str = "config") -> IgnitionConfig:
    """Parse an Ignition config object. Versions other than 3.0-3.5 parse to an unsupported
    config (only the version is read) so that the planner can refuse them with a reason."""
    _expect(raw, dict, where, "an Ignition config object")
    ign = raw.get("ignition")
    _expect(ign, dict, f"{where}.ignition", "an object")
    version = ign.get("version")
    if version is None:
        raise InputError("missing", field=f"{where}.ignition.version")
    _expect(version, str, f"{where}.ignition.version", "a string")
    match = _VERSION.fullmatch(version)
    if not match:
        raise InputError(f"malformed version {version!r}", field=f"{where}.ignition.version")
    major, minor = int(match.group(1)), int(match.group(2))
    if major != 3:
        return IgnitionConfig(version=version, major=major, minor=minor)

    storage = raw.get("storage") or {}
    _expect(storage, dict, f"{where}.storage", "an object")
    files = _keyed(storage.get("files"), f"{where}.storage.files", _file, "path")
    systemd = raw.get("systemd") or {}
    _expect(systemd, dict, f"{where}.systemd", "an object")
    units = _keyed(systemd.get("units"), f"{where}.systemd.units", _unit, "name")

    passwd = raw.get("passwd") or {}
    _expect(passwd, dict, f"{where}.passwd", "an object")
    raw_users = passwd.get("users")
    users = None
    if raw_users is not None:
        _expect(raw_users, list, f"{where}.passwd.users", "a list")
        users = tuple(_user(u, f"{where}.passwd.users[{i}]") for i, u in enumerate(raw_users))

    links = storage.get("links") or []
    _expect(links, list, f"{where}.storage.links", "a list")
    return IgnitionConfig(
        version=version,
        major=major,
        minor=minor,
        files=files,
        units=units,
        users=users,
        disks=_canonical(storage.get("disks")),
        filesystems=_canonical(storage.get("filesystems")),
        raid=_canonical(storage.get("raid")),
        directories=_canonical(storage.get("directories")),
        groups=_canonical(passwd.get("groups")),
        kernel_arguments=_canonical(raw.get("kernelArguments") or {}),
        links=frozenset(str(link.get("path")) for link in links if isinstance(link, dict)),
    )
