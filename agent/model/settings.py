"""Standalone-mode settings: TOML drop-in fragments, checked, merged and given defaults.

Reading the files is `agent.sources.settings_files`; this module only sees their bytes. Every
key a fragment may set is in `_SCHEMA`: a misspelt section or key is refused, never ignored, as
an ignored typo silently leaves the host on a strategy its administrator did not choose."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from agent.errors import InputError
from agent.model.imageref import parse_image_ref

STRATEGIES = ("immediate", "periodic", "fleet_lock")
# Zincati's documentation spells the strategy both ways; both name the same thing here.
_ALIASES = {"fleetlock": "fleet_lock"}
DEFAULT_INTERVAL = 300.0
# A tag checked less often than weekly is not being followed; the bound also keeps timers far
# from float and event-loop limits (TOML accepts `inf`).
MAX_INTERVAL = 7 * 24 * 3600.0
DEFAULT_GROUP = "default"
DEFAULT_TIME_ZONE = "UTC"
_GROUP = re.compile(r"[a-zA-Z0-9.-]+")
_UUID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WINDOW_KEY = "updates.periodic.window"
# Where each merged value came from (dotted key -> source), kept inside the merged dict so an
# error found only once every fragment is in (say, fleet_lock without a URL) can name a file.
# Files cannot set it: a leading underscore is no section of the schema.
ORIGINS = "_origins"
COMMAND_LINE = "command line"


@dataclass(frozen=True)
class FollowSettings:
    image: str | None = None
    interval: float = DEFAULT_INTERVAL
    live_config: str | None = None
    strategy: str = "immediate"
    time_zone: str = DEFAULT_TIME_ZONE
    windows: tuple[dict[str, Any], ...] = ()
    fleet_lock_url: str | None = None
    group: str = DEFAULT_GROUP
    node_uuid: str | None = None  # None: derived from /etc/machine-id
    sources: tuple[str, ...] = ()  # the fragments read, in merge order
    origins: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def source_of(self, key: str) -> str:
        """The file (or "command line") that set `key` or the entry it lies in, e.g.
        `updates.periodic.window[2].start_time` -> the fragment of the third window; "" when
        nothing set it (a default)."""
        owners = [k for k in self.origins if key == k or key.startswith((f"{k}.", f"{k}["))]
        return self.origins[max(owners, key=len)] if owners else ""


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {_kind(value)}")
    if not value or "\0" in value or value != value.strip():
        raise InputError(f"{value!r} is not a usable value (empty, NUL or edge whitespace)")
    return value


def _image(value: Any) -> str:
    return str(parse_image_ref(_string(value)))


def _interval(value: Any) -> float:
    # bool is an int to Python; `interval_secs = true` is a mistake, not one second.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"must be a number of seconds, not {_kind(value)}")
    if not (math.isfinite(value) and 0 < value <= MAX_INTERVAL):
        raise InputError(f"must be more than 0 and at most {MAX_INTERVAL:.0f} seconds")
    return float(value)


def _absolute_path(value: Any) -> str:
    # The agent runs from a unit whose working directory nobody chose: only absolute paths mean
    # one file.
    if not _string(value).startswith("/"):
        raise InputError(f"{value!r} is not an absolute path")
    return value


def _strategy(value: Any) -> str:
    name = _ALIASES.get(_string(value), value)
    if name not in STRATEGIES:
        raise InputError(f"{value!r} is not one of {', '.join(map(repr, STRATEGIES))}")
    return name


def _time_zone(value: Any) -> str:
    # Whether the zone exists needs the tz database, a file: checked where windows are built.
    if any(ch.isspace() for ch in _string(value)):
        raise InputError(f"{value!r} is not a time zone name")
    return value


def _url(value: Any) -> str:
    text = _string(value)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise InputError(f"{text!r} is not a URL ({exc})") from None
    spaced = any(ch.isspace() or not ch.isprintable() for ch in text)
    if parts.scheme not in ("http", "https") or not parts.hostname or spaced:
        raise InputError(f"{text!r} is not an http:// or https:// URL with a host")
    return text


def _group(value: Any) -> str:
    if not _GROUP.fullmatch(_string(value)):
        raise InputError(f"{value!r} is not a group label (letters, digits, '.' and '-')")
    return value


def _node_uuid(value: Any) -> str | None:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {_kind(value)}")
    if value == "":  # Zincati's spelling of "derive it from the machine id"
        return None
    if not _UUID.fullmatch(value.lower()):
        raise InputError(f"{value!r} is not 32 hex digits (a machine-id) or a UUID")
    return value.lower().replace("-", "")


def _windows(value: Any) -> list[dict[str, Any]]:
    # Only the shape: days, start time and length are `agent.core.windows`'s to judge.
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InputError("must be an array of tables, written [[updates.periodic.window]]")
    return value


Schema = dict[str, "Schema | Callable[[Any], Any]"]
_SCHEMA: Schema = {
    "follow": {"image": _image, "interval_secs": _interval, "live_config": _absolute_path},
    "updates": {
        "strategy": _strategy,
        "periodic": {"time_zone": _time_zone, "window": _windows},
        "fleet_lock": {"base_url": _url},
    },
    "identity": {"group": _group, "node_uuid": _node_uuid},
}


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)  # fmt: skip


def _checked(table: dict[str, Any], schema: Schema, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{where}.{key}" if where else key
        rule = schema.get(key)
        if rule is None:
            raise InputError(_unknown(key, schema, where), field=path)
        if isinstance(rule, dict):
            if not isinstance(value, dict):
                raise InputError(f"must be a table [{path}], not {_kind(value)}", field=path)
            out[key] = _checked(value, rule, path)
            continue
        try:
            out[key] = rule(value)
        except InputError as exc:
            raise InputError(exc.message, field=path) from None
    return out


def _unknown(key: str, schema: Schema, where: str) -> str:
    # Sections are named as they are written, so the hint can be pasted into the file.
    named = {k: (f"[{where}.{k}]" if where else f"[{k}]") if isinstance(rule, dict) else k
             for k, rule in schema.items()}  # fmt: skip
    what = f"key {key!r} in [{where}]" if where else f"section [{key}]"
    close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
    hint = f" (did you mean {named[close[0]]}?)" if close else ""
    return f"unknown {what}{hint}; known: {', '.join(named.values())}"


def parse_fragment(data: bytes, source: str) -> dict[str, Any]:
    """One fragment's TOML, every key known and of the right type (the strategy spelt
    canonically, a node UUID as 32 lowercase hex); InputError naming `source` and the key."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", source=source) from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"invalid TOML: {exc}", source=source) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise InputError("invalid TOML: nested too deeply", source=source) from None
    try:
        return _checked(table, _SCHEMA, "")
    except InputError as exc:
        raise exc.located(source) from None


def merge_fragments(fragments: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Fragments (source, parsed) in order, later values replacing earlier ones, tables merged
    key by key; the periodic windows of all fragments are concatenated instead, as Zincati
    does. The result also records under ORIGINS which source set each value."""
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for source, fragment in fragments:
        _merge_into(merged, fragment, "", source, origins)
    merged[ORIGINS] = origins
    return merged


def _merge_into(
    into: dict[str, Any], table: dict[str, Any], where: str, source: str, origins: dict[str, str]
) -> None:
    for key, value in table.items():
        path = f"{where}.{key}" if where else key
        if path == WINDOW_KEY:
            start = len(into.setdefault(key, []))
            into[key].extend(value)
            origins.update({f"{path}[{start + i}]": source for i in range(len(value))})
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_into(into[key], value, path, source, origins)
        elif isinstance(value, dict):
            into[key] = {}
            _merge_into(into[key], value, path, source, origins)
        else:
            into[key] = value
            origins[path] = source


def settings_from(merged: dict[str, Any], sources: Iterable[str]) -> FollowSettings:
    """The merged fragments with defaults filled in. Not yet checked as a whole: command-line
    flags may still complete it (see `apply_overrides` and `check_settings`)."""
    follow = merged.get("follow", {})
    updates = merged.get("updates", {})
    periodic = updates.get("periodic", {})
    identity = merged.get("identity", {})
    origins = dict(merged.get(ORIGINS, {}))
    windows = tuple(periodic.get("window", ()))
    return FollowSettings(
        image=follow.get("image"),
        interval=follow.get("interval_secs", DEFAULT_INTERVAL),
        live_config=follow.get("live_config"),
        strategy=updates.get("strategy", "immediate"),
        time_zone=periodic.get("time_zone", DEFAULT_TIME_ZONE),
        windows=windows,
        fleet_lock_url=updates.get("fleet_lock", {}).get("base_url"),
        group=identity.get("group", DEFAULT_GROUP),
        node_uuid=identity.get("node_uuid"),
        sources=tuple(sources),
        origins=origins,
    )


# Command-line flag -> (settings field, the key it stands for, the check a file value gets).
_FLAGS: dict[str, tuple[str, str, Callable[[Any], Any]]] = {
    "image": ("image", "follow.image", _image),
    "interval": ("interval", "follow.interval_secs", _interval),
    "live_config": ("live_config", "follow.live_config", _absolute_path),
    "strategy": ("strategy", "updates.strategy", _strategy),
    "time_zone": ("time_zone", "updates.periodic.time_zone", _time_zone),
    "fleet_lock_url": ("fleet_lock_url", "updates.fleet_lock.base_url", _url),
    "group": ("group", "identity.group", _group),
}


# The command line's names where they differ from the override's (`run --help`).
_FLAG_SPELLING = {"image": "--source", "interval": "--check-interval", "live_config": "--config"}


def apply_overrides(settings: FollowSettings, **flags: Any) -> FollowSettings:
    """`settings` with each flag that was given (not None) replacing the file's value, checked
    as a file's would be. Flags: image, interval, live_config, strategy, time_zone,
    fleet_lock_url, group; another name is a TypeError (a programming error)."""
    unknown = set(flags) - set(_FLAGS)
    if unknown:
        raise TypeError(f"apply_overrides() got unknown flags {sorted(unknown)}")
    changes: dict[str, Any] = {}
    origins = dict(settings.origins)
    for name, value in flags.items():
        if value is None:
            continue
        attribute, key, check = _FLAGS[name]
        try:
            changes[attribute] = check(value)
        except InputError as exc:
            flag = _FLAG_SPELLING.get(name, "--" + name.replace("_", "-"))
            raise InputError(exc.message, source=COMMAND_LINE, field=flag) from None
        origins[key] = COMMAND_LINE
    return dataclasses.replace(settings, **changes, origins=origins)


def check_settings(settings: FollowSettings) -> FollowSettings:
    """`settings` if they hold together as a whole; else InputError naming the key to set and
    the source that chose the strategy needing it."""
    chosen_by = settings.origins.get("updates.strategy", "")
    if settings.strategy == "fleet_lock" and not settings.fleet_lock_url:
        raise InputError(
            'strategy "fleet_lock" needs the lock server: set base_url in [updates.fleet_lock]',
            source=chosen_by,
            field="updates.fleet_lock.base_url",
        )
    if settings.strategy == "periodic" and not settings.windows:
        raise InputError(
            'strategy "periodic" needs at least one [[updates.periodic.window]] table',
            source=chosen_by,
            field=WINDOW_KEY,
        )
    return settings
