"""The tree stays `ruff check` and `ruff format` clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]


def test_ruff_check_and_format() -> None:
    check = subprocess.run([sys.executable, "-m", "ruff", "check", "--quiet", "."], cwd=TOP,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--quiet", "."],
                         cwd=TOP, capture_output=True, text=True)  # fmt: skip
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
