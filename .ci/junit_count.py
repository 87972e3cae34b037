"""A pytest JUnit report as a tier's count line: `python .ci/junit_count.py NAME REPORT.xml`
prints `NAME: N passed, N failed` (failures and errors count as failed, skipped as neither), the
line .ci/total.py reads from each tier's log; total.py reads the default run's report with
`count` too."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def count(report: Path) -> tuple[int, int]:
    """(passed, failed) in a JUnit report as pytest writes it."""
    root = ET.parse(report).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{report}: no testsuite"
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return int(suite.get("tests", 0)) - failed - int(suite.get("skipped", 0)), failed


if __name__ == "__main__":
    name, report = sys.argv[1], Path(sys.argv[2])
    passed, failed = count(report)
    print(f"{name}: {passed} passed, {failed} failed")
