"""`image-mode-agent run --source image:REF` from the command line: a simulated host follows a
tag through one reboot; bad settings and flags fail before the host is touched (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.app.cli import main
from standins.host.simulated import SimulatedHost

TAG = "quay.example/os/node:stable"


def run(host: Path, settings: Path, *extra: str) -> int:
    return main(["run", "--source", f"image:{TAG}", "--host", f"simulated:{host}", "--once",
                 "--listen", "", "--settings-dir", str(settings), *extra])  # fmt: skip


@pytest.fixture
def host(tmp_path: Path) -> Path:
    SimulatedHost.create(tmp_path / "host", TAG, {"usr/lib/v": "1"})
    return tmp_path / "host"


def status(host: Path) -> dict:
    return json.loads((host / "root/var/lib/image-mode-agent/status.json").read_text())


def test_follow_through_one_reboot(host: Path, tmp_path: Path) -> None:
    new = SimulatedHost(host).add_image(TAG, {"usr/lib/v": "2"}).split("@")[1]
    assert run(host, tmp_path / "none") == 3  # pre-staged, rebooting
    assert run(host, tmp_path / "none") == 0  # verified, committed
    report = status(host)
    assert report["state"] == "Done" and report["currentImage"].endswith(new)
    assert report["follow"]["latestDigest"] == new
    assert report["follow"]["strategy"] == {"strategy": "immediate"}


def test_settings_drop_in_picks_the_strategy(host: Path, tmp_path: Path) -> None:
    settings = tmp_path / "config.d"
    settings.mkdir()
    (settings / "50-window.toml").write_text(
        '[updates]\nstrategy = "periodic"\n[[updates.periodic.window]]\n'
        'days = ["Mon"]\nstart_time = "00:00"\nlength_minutes = 1\n'
    )
    SimulatedHost(host).add_image(TAG, {"usr/lib/v": "2"})
    code = run(host, settings)
    report = status(host)
    if report["follow"]["decision"]["allowed"]:  # the one minute a week it is open
        assert code == 3
        return
    assert code == 0 and report["state"] == "Working"
    assert "reboot held: outside the maintenance windows" in report["reason"]
    assert report["follow"]["strategy"]["windows"] == ["Mon 00:00 (1 min)"]
    assert run(host, settings, "--strategy", "immediate") == 3  # a flag overrides the file


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--source", f"image:{TAG}@sha256:" + "a" * 64], "pinned by digest"),
        (["--source", "image:quay.example/os/node"], "names no tag"),
        (["--source", "image:"], "no image to follow"),
        (["--strategy", "fleet_lock"], "updates.fleet_lock.base_url"),
        (["--check-interval", "0"], "--check-interval"),
        (["--config", "live.yaml"], "expected file:PATH"),
        (["--group", "no spaces"], "--group"),
    ],
)
def test_bad_flags_exit_2_and_touch_nothing(
    host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    before = (host / "host.json").read_text()
    argv = ["run", "--source", f"image:{TAG}", "--host", f"simulated:{host}", "--once",
            "--listen", "", "--settings-dir", str(tmp_path / "none")]  # fmt: skip
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    assert words in capsys.readouterr().err
    assert (host / "host.json").read_text() == before
    assert not (host / "root/var/lib/image-mode-agent/status.json").exists()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[updates]\nstratgy = "periodic"\n', ["10-bad.toml", "stratgy"]),
        ('[updates]\nstrategy = "periodic"\n[[updates.periodic.window]]\ndays = ["Mon"]\n'
         'start_time = "25:00"\nlength_minutes = 60\n', ["10-bad.toml", "start_time", "25:00"]),
        ('[updates]\nstrategy = "periodic"\n[updates.periodic]\ntime_zone = "Mars/Olympus"\n'
         '[[updates.periodic.window]]\ndays = ["Mon"]\nstart_time = "01:00"\n'
         'length_minutes = 60\n', ["10-bad.toml", "time_zone", "Mars/Olympus"]),
    ],
)  # fmt: skip
def test_bad_settings_exit_2_naming_them_before_the_host_is_touched(
    host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: list[str]
) -> None:
    settings = tmp_path / "config.d"
    settings.mkdir()
    (settings / "10-bad.toml").write_text(text)
    before = (host / "host.json").read_text()
    assert run(host, settings) == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err
    assert (host / "host.json").read_text() == before


def test_dry_run_changes_nothing(host: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    new = SimulatedHost(host).add_image(TAG, {"usr/lib/v": "2"})
    assert run(host, tmp_path / "none", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "verdict: image" in out and new in out
    assert "the immediate strategy decides when to reboot" in out
    document = SimulatedHost(host).status_document()["status"]
    assert document["staged"] is None  # bootc's check cached the manifest: nothing more
    assert document["booted"]["cachedUpdate"]["imageDigest"] == new.split("@")[1]
    assert not (host / "root/var/lib/image-mode-agent/journal.json").exists()
    assert not (host / "root/var/lib/image-mode-agent/status.json").exists()
    assert [a["kind"] for a in SimulatedHost(host).actions()].count("reboot") == 0
