"""`python -m tests.conformance [PYTEST ARGS]`: finds the kit and the peer binaries the user
supplied, runs the tier with pytest and prints the closing count line.

- Without the kit or without a cluster's binaries (kube-apiserver, etcd, kubectl) it prints one
  line `conformance: not run (no NAME: what to do)` and exits 2: the tier counts as not run,
  never as passed.
- Tests that need a binary that was not supplied (the machine-config-controller) are listed as
  `conformance: not run: TEST (no NAME ...)`; the count line counts only what ran.
- Any other skip is counted as failed, so nothing hides in one."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tests.conformance import peers
from tests.conformance.kit import KitMissing, locate_kit, prepare

HERE = Path(__file__).resolve().parent
NOT_RUN_EXIT = 2


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    not_run: list[tuple[str, str]] = field(default_factory=list)  # (test id, reason)


def tally(report: Path) -> Tally:
    """Counts from pytest's JUnit report: a skip that says "not run: ..." is a test whose
    peer binary was not supplied; every other skip is a failure."""
    result = Tally()
    for case in ET.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed += 1
        elif skipped is not None:
            message = skipped.get("message", "")
            if peers.NOT_RUN in message:
                result.not_run.append((test, message.split(peers.NOT_RUN, 1)[1]))
            else:
                result.failed += 1
        else:
            result.passed += 1
    return result


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
        try:
            kit = prepare(locate_kit(), Path(tmp) / "bin")
        except KitMissing as exc:
            if exc.found is not None:
                print(f"conformance: where each binary was looked for\n"
                      f"{peers.describe(exc.found)}", file=sys.stderr, flush=True)  # fmt: skip
            print(f"conformance: not run ({exc})", flush=True)
            return NOT_RUN_EXIT
        print(f"conformance: kit {kit.path}; binaries:\n{peers.describe(kit.found)}", flush=True)
        report = Path(tmp) / "junit.xml"
        # pytest finds the same binaries through the same lookup, in this KIT_BIN.
        env = {**os.environ, "IMAGE_MODE_AGENT_TIER": "conformance", "KIT_BIN": str(kit.bin)}
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"--junitxml={report}", str(HERE), *argv], env=env)  # fmt: skip
        if not report.exists():
            print(f"conformance: 0 passed, 1 failed (pytest exited {rc} without a report)")
            return rc or 1
        result = tally(report)
    for test, reason in result.not_run:
        print(f"conformance: not run: {test} ({reason})")
    print(f"conformance: {result.passed} passed, {result.failed} failed")
    return 1 if result.failed else (0 if rc in (0, 5) else rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
