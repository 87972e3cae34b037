"""The closing line of .ci/run: `total: N passed, N failed` over the README's test command (its
JUnit report) and every tier's log. A tier's log ends with `TIER: N passed, N failed` when it
ran, or says `TIER: not run (why)` when its peers were not supplied: that tier counts nothing
and is named on a line of its own. A log with neither is a tier that broke: exit 1.

    python .ci/total.py RESULTS_DIR conformance.log system.log ..."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from junit_count import count  # beside this script

COUNT = re.compile(r"^[\w-]+: (\d+) passed, (\d+) failed$", re.M)
NOT_RUN = re.compile(r"^([\w-]+): not run \((.+)\)$", re.M)


def main(results: Path, logs: list[str]) -> int:
    passed, failed = count(results / "pytest.xml")
    broken = False
    for log in logs:
        text = (results / log).read_text(errors="replace")
        if counted := COUNT.findall(text):
            passed, failed = passed + int(counted[-1][0]), failed + int(counted[-1][1])
        elif not_run := NOT_RUN.search(text):
            print(f"not counted: {not_run.group(1)} not run ({not_run.group(2)})")
        else:
            print(f"{log}: neither a count line nor a not-run line", file=sys.stderr)
            broken = True
    print(f"total: {passed} passed, {failed} failed")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
