"""The HTTP endpoints and metrics of a running agent."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent.observe.metrics import Metrics
from tests.builders import machine_config
from tests.test_cli import host, write  # noqa: F401


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_endpoints_of_a_running_agent(tmp_path: Path, host) -> None:  # noqa: F811
    sim, images = host
    desired = write(tmp_path / "mc.json", machine_config(keys=["k"], image=images["v1"]))
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
         f"file:{desired}", "--host", f"simulated:{sim}", "--listen", f"127.0.0.1:{port}"],
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                if _get(f"{base}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)
        assert _get(f"{base}/healthz") == (200, "ok\n")
        status = json.loads(_get(f"{base}/status")[1])
        assert (status["state"], status["phase"], status["currentConfig"]) == (
            "Done", "idle", "rendered-worker-1",
        )  # fmt: skip
        code, metrics = _get(f"{base}/metrics")
        assert code == 200
        assert 'mcd_state{reason="",state="Done"}' in metrics
        assert 'image_mode_agent_phase{phase="idle"} 1.0' in metrics
        assert 'mcd_update_state{config="rendered-worker-1",err=""}' in metrics
        # A second agent on the same address still runs (the endpoints are not vital).
        other = subprocess.run(
            [sys.executable, "-m", "agent", "--log-level", "warning", "run", "--source",
             f"file:{desired}", "--host", f"simulated:{sim}", "--listen", f"127.0.0.1:{port}",
             "--once"], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert other.returncode == 0 and "endpoints not served" in other.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_metrics_from_engine_notices() -> None:
    metrics = Metrics()
    metrics.notice("stage-failed", "x", None)
    metrics.notice("stage-failed", "x", None)
    metrics.notice("reboot-failed", "logind said no", None)
    metrics.notice("rolled-back", "required check failed", 42.0)
    text = metrics.render().decode()
    assert "mcd_pivot_errors_total 2.0" in text
    assert "mcd_reboots_failed_total 1.0" in text
    assert "image_mode_agent_rollbacks_total 1.0" in text
    assert 'image_mode_agent_update_duration_seconds_count{result="rolled-back"} 1.0' in text
    metrics.notice("staged", "img", None)
    assert "mcd_pivot_errors_total 0.0" in metrics.render().decode()
    metrics.record_state("Working", "")
    metrics.record_state("Done", "")
    text = metrics.render().decode()
    assert 'mcd_state{reason="",state="Done"}' in text and 'state="Working"' not in text


def test_two_agents_have_separate_metrics() -> None:
    one, two = Metrics(), Metrics()
    one.notice("reboot-failed", "", None)
    assert "mcd_reboots_failed_total 0.0" in two.render().decode()
