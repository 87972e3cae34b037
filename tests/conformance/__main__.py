"""`python -m tests.conformance [PYTEST ARGS]`: checks for the kit, runs the tier with pytest and
prints the closing count line. Without the kit it says what is missing and how to get it, and
exits 2: the tier counts as not run, never as passed."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.conformance.kit import KitMissing, locate_kit, unpack

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    try:
        kit = locate_kit()
        print(f"conformance: kit {kit}, binaries in {unpack(kit)}", flush=True)
    except KitMissing as exc:
        print(f"conformance: not run: {exc}", file=sys.stderr)
        print("conformance: not run")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        env = {**os.environ, "IMAGE_MODE_AGENT_TIER": "conformance"}
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"--junitxml={report}", str(HERE), *argv], env=env)  # fmt: skip
        if not report.exists():
            print(f"conformance: 0 passed, 1 failed (pytest exited {rc} without a report)")
            return rc or 1
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
        failed = int(suite.get("failures")) + int(suite.get("errors"))
    # A skipped test is not a passed one: it is counted as failed, so nothing hides in it.
    print(f"conformance: {tests - failed - skipped} passed, {failed + skipped} failed")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
