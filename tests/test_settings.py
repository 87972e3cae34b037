"""Standalone-mode settings: drop-in discovery, merging, defaults, flags, and every refusal
naming the file and the key at fault."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import InputError
from agent.model.settings import (
    FollowSettings,
    apply_overrides,
    check_settings,
    merge_fragments,
    parse_fragment,
    settings_from,
)
from agent.sources import settings_files
from agent.sources.settings_files import (
    DEFAULT_DIRS,
    MAX_FRAGMENT_BYTES,
    find_fragments,
    load_settings,
)

WINDOW = '[[updates.periodic.window]]\ndays = ["Sat"]\nstart_time = "23:30"\nlength_minutes = 60\n'


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    """usr/lib, etc and run stand-ins, in scan order; created on first write."""
    return [tmp_path / "usr", tmp_path / "etc", tmp_path / "run"]


def put(directory: Path, name: str, text: str | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_default_dirs_are_vendor_then_admin_then_runtime() -> None:
    assert DEFAULT_DIRS == ("/usr/lib/image-mode-agent/config.d",
                            "/etc/image-mode-agent/config.d",
                            "/run/image-mode-agent/config.d")  # fmt: skip


def test_no_files_gives_the_defaults(dirs: list[Path]) -> None:
    assert load_settings(dirs) == FollowSettings(
        image=None, interval=300.0, live_config=None, strategy="immediate", time_zone="UTC",
        windows=(), fleet_lock_url=None, group="default", node_uuid=None,
        sources=(),
    )  # fmt: skip


def test_a_single_file_sets_every_key(dirs: list[Path]) -> None:
    path = put(dirs[1], "50-follow.toml", """
[follow]
image = "quay.io/example/os:stable"
interval_secs = 60
live_config = "/etc/image-mode-agent/machineconfig.yaml"

[updates]
strategy = "fleet_lock"

[updates.periodic]
time_zone = "Europe/Rome"

[updates.fleet_lock]
base_url = "https://fleetlock.example:8080/"

[identity]
group = "workers.eu-1"
node_uuid = "27E3AC02-AF39-46AF-995C-9940E18B0CCE"
""")  # fmt: skip
    settings = load_settings(dirs)
    assert settings == FollowSettings(
        image="quay.io/example/os:stable", interval=60.0,
        live_config="/etc/image-mode-agent/machineconfig.yaml", strategy="fleet_lock",
        time_zone="Europe/Rome", fleet_lock_url="https://fleetlock.example:8080/",
        group="workers.eu-1", node_uuid="27e3ac02af3946af995c9940e18b0cce",
        sources=(str(path),),
    )  # fmt: skip
    assert settings.origins["updates.strategy"] == str(path)


def test_fragments_merge_by_name_across_directories(dirs: list[Path]) -> None:
    # 10-* in /etc sorts before 20-* in /usr/lib: the name decides, not the directory.
    a = put(dirs[1], "10-admin.toml", "[follow]\ninterval_secs = 10\n")
    b = put(dirs[0], "20-vendor.toml", "[follow]\ninterval_secs = 20\n")
    c = put(dirs[2], "15-runtime.toml", "[follow]\ninterval_secs = 15\n")
    assert find_fragments(dirs) == [a, c, b]
    settings = load_settings(dirs)
    assert settings.interval == 20.0
    assert settings.sources == (str(a), str(c), str(b))


def test_same_name_later_directory_replaces_the_whole_file(dirs: list[Path]) -> None:
    put(dirs[0], "50-x.toml", '[follow]\nimage = "quay.io/a/b:1"\ninterval_secs = 5\n')
    admin = put(dirs[1], "50-x.toml", "[follow]\ninterval_secs = 7\n")
    settings = load_settings(dirs)
    assert (settings.image, settings.interval, settings.sources) == (None, 7.0, (str(admin),))
    runtime = put(dirs[2], "50-x.toml", "[follow]\ninterval_secs = 9\n")
    assert load_settings(dirs).sources == (str(runtime),)
    assert load_settings(dirs).interval == 9.0


def test_a_symlink_to_dev_null_masks_the_file(dirs: list[Path]) -> None:
    put(dirs[0], "50-x.toml", '[updates]\nstrategy = "fleet_lock"\n')
    dirs[1].mkdir()
    (dirs[1] / "50-x.toml").symlink_to("/dev/null")
    assert find_fragments(dirs) == []
    assert load_settings(dirs).strategy == "immediate"


def test_an_empty_file_overrides_the_same_name_too(dirs: list[Path]) -> None:
    put(dirs[0], "50-x.toml", '[updates]\nstrategy = "fleet_lock"\n')
    empty = put(dirs[1], "50-x.toml", "")
    settings = load_settings(dirs)
    assert (settings.strategy, settings.sources) == ("immediate", (str(empty),))


def test_only_visible_toml_files_are_read(dirs: list[Path]) -> None:
    put(dirs[0], "10-real.toml", "[follow]\ninterval_secs = 1\n")
    linked = put(dirs[0], "target.conf", "[follow]\ninterval_secs = 2\n")
    (dirs[0] / "20-link.toml").symlink_to(linked)
    for ignored in (".30-hidden.toml", "40-x.toml.bak", "50-x.conf", "README", "toml"):
        put(dirs[0], ignored, "this is not toml [[[")
    (dirs[0] / "60-dir.toml").mkdir()
    (dirs[0] / "70-dangling.toml").symlink_to(dirs[0] / "missing")
    os.mkfifo(dirs[0] / "80-fifo.toml")  # never opened: reading it would block
    assert find_fragments(dirs) == [dirs[0] / "10-real.toml", dirs[0] / "20-link.toml"]
    assert load_settings(dirs).interval == 2.0


def test_windows_accumulate_in_file_order(dirs: list[Path]) -> None:
    a = put(dirs[0], "10-a.toml", '[updates]\nstrategy = "periodic"\n' + WINDOW)
    b = put(dirs[1], "20-b.toml", WINDOW.replace("Sat", "Sun") + WINDOW.replace("Sat", "Mon"))
    settings = load_settings(dirs)
    assert [w["days"] for w in settings.windows] == [["Sat"], ["Sun"], ["Mon"]]
    assert settings.windows[0] == {"days": ["Sat"], "start_time": "23:30", "length_minutes": 60}
    assert [settings.source_of(f"updates.periodic.window[{i}]") for i in range(3)] == \
        [str(a), str(b), str(b)]  # fmt: skip
    assert settings.source_of("updates.periodic.window[1].start_time") == str(b)
    assert settings.source_of("updates.strategy") == str(a)
    assert settings.source_of("identity.group") == ""


def test_later_scalars_replace_and_tables_merge(dirs: list[Path]) -> None:
    put(dirs[0], "10-a.toml", '[updates]\nstrategy = "immediate"\n[identity]\ngroup = "a"\n')
    b = put(dirs[0], "20-b.toml", '[updates]\nstrategy = "fleetlock"\n')
    c = put(dirs[0], "30-c.toml", '[updates.fleet_lock]\nbase_url = "http://lock:8080/"\n')
    settings = load_settings(dirs)
    assert (settings.strategy, settings.fleet_lock_url, settings.group) == (
        "fleet_lock", "http://lock:8080/", "a")  # fmt: skip
    assert settings.origins["updates.strategy"] == str(b)
    assert settings.origins["updates.fleet_lock.base_url"] == str(c)


@pytest.mark.parametrize("spelling", ["fleet_lock", "fleetlock"])
def test_fleetlock_is_an_alias(spelling: str) -> None:
    parsed = parse_fragment(f'[updates]\nstrategy = "{spelling}"\n'.encode(), "x.toml")
    assert parsed == {"updates": {"strategy": "fleet_lock"}}


def test_flags_win_over_files(dirs: list[Path]) -> None:
    put(dirs[1], "50-x.toml", '[follow]\nimage = "quay.io/a/b:1"\ninterval_secs = 5\n'
                              '[updates]\nstrategy = "fleet_lock"\n')  # fmt: skip
    settings = load_settings(dirs, image="quay.io/c/d:2", interval=2.5, strategy=None,
                             fleet_lock_url="http://lock/", group="g", time_zone="Asia/Tokyo",
                             live_config="/run/mc.yaml")  # fmt: skip
    assert (settings.image, settings.interval, settings.strategy, settings.fleet_lock_url,
            settings.group, settings.time_zone, settings.live_config) == (
        "quay.io/c/d:2", 2.5, "fleet_lock", "http://lock/", "g", "Asia/Tokyo",
        "/run/mc.yaml")  # fmt: skip
    assert settings.origins["follow.image"] == "command line"


def test_a_flag_completes_what_the_files_require(dirs: list[Path]) -> None:
    put(dirs[1], "50-x.toml", '[updates]\nstrategy = "fleet_lock"\n')
    with pytest.raises(InputError):
        load_settings(dirs)
    assert load_settings(dirs, fleet_lock_url="http://lock/").fleet_lock_url == "http://lock/"
    assert load_settings(dirs, strategy="immediate").strategy == "immediate"


@pytest.mark.parametrize(("flags", "flag", "says"), [
    ({"interval": 0}, "--check-interval", "more than 0"),
    ({"interval": True}, "--check-interval", "not a boolean"),
    ({"strategy": "weekly"}, "--strategy", "'weekly' is not one of"),
    ({"fleet_lock_url": "lock:8080"}, "--fleet-lock-url", "not an http:// or https:// URL"),
    ({"group": "a b"}, "--group", "not a group label"),
    ({"image": "not an image"}, "--source", "whitespace"),
    ({"live_config": "mc.yaml"}, "--config", "not an absolute path"),
])  # fmt: skip
def test_bad_flags_are_refused_naming_the_flag(flags: dict, flag: str, says: str) -> None:
    with pytest.raises(InputError) as caught:
        apply_overrides(FollowSettings(), **flags)
    assert (caught.value.source, caught.value.field) == ("command line", flag)
    assert says in caught.value.message


def test_an_unknown_flag_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="imgae"):
        apply_overrides(FollowSettings(), imgae="quay.io/a/b:1")


@pytest.mark.parametrize(("text", "field", "says"), [
    ("[follow]\ninterval_secs = = 3\n", "", "invalid TOML: Invalid value (at line 2, column 17)"),
    ('[update]\nstrategy = "periodic"\n', "update",
     "unknown section [update] (did you mean [updates]?)"),
    ('[updates]\nstratgy = "periodic"\n', "updates.stratgy",
     "unknown key 'stratgy' in [updates] (did you mean strategy?)"),
    ("[updates.periodc]\n", "updates.periodc", "did you mean [updates.periodic]?"),
    ("[follow]\nimage = 3\n", "follow.image", "must be a string, not an integer"),
    ('[follow]\nimage = "quay.io/Upper/os"\n', "follow.image", "quay.io/Upper/os"),
    ('[follow]\ninterval_secs = "300"\n', "follow.interval_secs", "not a string"),
    ("[follow]\ninterval_secs = true\n", "follow.interval_secs", "not a boolean"),
    ("[follow]\ninterval_secs = 0\n", "follow.interval_secs", "more than 0"),
    ("[follow]\ninterval_secs = -5\n", "follow.interval_secs", "more than 0"),
    ("[follow]\ninterval_secs = inf\n", "follow.interval_secs", "at most 604800 seconds"),
    ("[follow]\ninterval_secs = nan\n", "follow.interval_secs", "more than 0"),
    ('[follow]\nlive_config = "mc.yaml"\n', "follow.live_config", "not an absolute path"),
    ('[updates]\nstrategy = "weekly"\n', "updates.strategy",
     "'weekly' is not one of 'immediate', 'periodic', 'fleet_lock'"),
    ("[updates]\nstrategy = 1\n", "updates.strategy", "must be a string"),
    ('[updates.fleet_lock]\nbase_url = "ftp://lock/"\n', "updates.fleet_lock.base_url",
     "not an http:// or https:// URL"),
    ('[updates.fleet_lock]\nbase_url = "http://"\n', "updates.fleet_lock.base_url", "with a host"),
    ('[updates.fleet_lock]\nbase_url = "http://lock server/"\n', "updates.fleet_lock.base_url",
     "not an http:// or https:// URL"),
    ('[updates.fleet_lock]\nbase_url = "http://lock:port/"\n', "updates.fleet_lock.base_url",
     "is not a URL"),
    ('[updates.periodic]\ntime_zone = "Europe/ Rome"\n', "updates.periodic.time_zone",
     "not a time zone"),
    ('[updates.periodic]\nwindow = "Sat"\n', "updates.periodic.window", "array of tables"),
    ("[updates.periodic.window]\ndays = []\n", "updates.periodic.window", "array of tables"),
    ('[identity]\ngroup = "workers/eu"\n', "identity.group", "not a group label"),
    ('[identity]\ngroup = ""\n', "identity.group", "not a usable value"),
    ('[identity]\nnode_uuid = "abc"\n', "identity.node_uuid", "not 32 hex digits"),
    ("follow = 3\n", "follow", "must be a table [follow]"),
])  # fmt: skip
def test_bad_fragments_are_refused_naming_file_and_key(
    dirs: list[Path], text: str, field: str, says: str
) -> None:
    put(dirs[0], "10-good.toml", "[follow]\ninterval_secs = 1\n")
    bad = put(dirs[1], "50-bad.toml", text)
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert (caught.value.source, caught.value.field) == (str(bad), field)
    assert says in caught.value.message
    assert str(caught.value).startswith(f"{bad}: {field + ': ' if field else ''}")


def test_not_utf8_and_deep_nesting_are_refused() -> None:
    with pytest.raises(InputError) as caught:
        parse_fragment(b"# comment\xff\n", "x.toml")
    assert str(caught.value) == "x.toml: not UTF-8 text (byte 9)"
    with pytest.raises(InputError) as caught:
        parse_fragment(b"a = " + b"[" * 100_000, "x.toml")
    assert str(caught.value) == "x.toml: invalid TOML: nested too deeply"


def test_fleet_lock_needs_a_base_url(dirs: list[Path]) -> None:
    chose = put(dirs[1], "50-strategy.toml", '[updates]\nstrategy = "fleet_lock"\n')
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert (caught.value.source, caught.value.field) == (str(chose), "updates.fleet_lock.base_url")
    assert "set base_url in [updates.fleet_lock]" in caught.value.message


def test_periodic_needs_a_window(dirs: list[Path]) -> None:
    chose = put(dirs[1], "50-strategy.toml", '[updates]\nstrategy = "periodic"\n')
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert (caught.value.source, caught.value.field) == (str(chose), "updates.periodic.window")
    assert "at least one [[updates.periodic.window]]" in caught.value.message
    with pytest.raises(InputError) as caught:
        load_settings(dirs[:0], strategy="periodic")
    assert caught.value.source == "command line"


def test_a_file_too_large_is_refused(dirs: list[Path]) -> None:
    big = put(dirs[1], "50-big.toml", b"#" * (MAX_FRAGMENT_BYTES + 1))
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert str(caught.value) == f"{big}: larger than 1024 KiB: not a settings fragment"
    big.write_bytes(b"#" * MAX_FRAGMENT_BYTES)
    assert load_settings(dirs).sources == (str(big),)


def test_an_unreadable_directory_is_refused(dirs: list[Path], monkeypatch) -> None:
    put(dirs[0], "10-a.toml", "")
    dirs[1].mkdir()
    real_scandir = os.scandir

    def scandir(path):
        if Path(path) == dirs[1]:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    # Tests run as root, where chmod 000 does not keep a directory from being listed.
    monkeypatch.setattr(settings_files.os, "scandir", scandir)
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert str(caught.value) == f"{dirs[1]}: cannot list directory: Permission denied"


def test_a_directory_that_is_a_file_is_refused(dirs: list[Path]) -> None:
    put(dirs[0].parent, "etc", "")
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert str(caught.value) == f"{dirs[1]}: cannot list directory: Not a directory"


def test_one_bad_file_means_no_settings_at_all(dirs: list[Path]) -> None:
    put(dirs[0], "10-a.toml", '[follow]\nimage = "quay.io/a/b:1"\n')
    put(dirs[0], "90-z.toml", "[follow\n")
    with pytest.raises(InputError) as caught:
        load_settings(dirs)
    assert str(caught.value).startswith(f"{dirs[0] / '90-z.toml'}: invalid TOML: ")


def test_merging_and_defaults_without_files() -> None:
    merged = merge_fragments([
        ("a.toml", parse_fragment(WINDOW.encode(), "a.toml")),
        ("b.toml", parse_fragment(b'[updates]\nstrategy = "periodic"\n' + WINDOW.encode(),
                                  "b.toml")),
    ])  # fmt: skip
    settings = check_settings(settings_from(merged, ["a.toml", "b.toml"]))
    assert settings.strategy == "periodic"
    assert [settings.source_of(f"updates.periodic.window[{i}]") for i in range(2)] == \
        ["a.toml", "b.toml"]  # fmt: skip
    assert settings.sources == ("a.toml", "b.toml")
    assert settings.node_uuid is None
    assert parse_fragment(b'[identity]\nnode_uuid = ""\n', "c.toml") == {
        "identity": {"node_uuid": None}
    }
