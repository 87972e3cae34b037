#!/usr/bin/env bash
# Coverage of agent/ by the default test run: `tests/coverage.sh [PYTEST ARGS]` (`-m ''` adds the
# rollout tier, tests/rollouts.sh).
# The agent processes the tests start (`python -m agent run ...`) are measured too: most of the
# agent runs there (pyproject.toml's [tool.coverage.run]). Not measured: agents started by
# systemd or inside the system and VM tiers' machines. Writes build/coverage/html/index.html
# and ends with one line "coverage: statements N%, branches N%, total N%" (total: the coverage
# package's own figure, statements and branches together); exits with pytest's status.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,coverage]'
rm -rf build/coverage && mkdir -p build/coverage
status=0
.venv/bin/python -m coverage run -m pytest -q "$@" || status=$?
.venv/bin/python -m coverage combine -q
.venv/bin/python -m coverage html -q -d build/coverage/html
.venv/bin/python -m coverage json -q -o build/coverage/coverage.json
.venv/bin/python - <<'PY'
import json

totals = json.load(open("build/coverage/coverage.json"))["totals"]
statements = 100 * totals["covered_lines"] / totals["num_statements"]
branches = 100 * totals["covered_branches"] / totals["num_branches"]
print(f"coverage: statements {statements:.0f}%, branches {branches:.0f}%, "
      f"total {totals['percent_covered']:.0f}% (build/coverage/html/index.html)")
PY
exit "$status"
