#!/bin/bash
# The rollout tier: `tests/rollouts.sh [PYTEST_ARGS]...`. Whole pool and NodePool rollouts whose
# pre-pulls take seconds through the shared simulated registry (bounded lanes in the controller's
# order, a holder killed mid-pull, tied Nodes, the NodePool's lanes), with the real agent
# processes on the loopback API server: the tests marked `rollout`, out of the default run for
# their time. Ends with `rollout: N passed, N failed`, the line .ci/total.py counts.
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
trap 'rm -f "$report"' EXIT
rc=0
timeout "${IMA_ROLLOUT_TIMEOUT:-900}" .venv/bin/python -m pytest -q -p no:cacheprovider \
    -m rollout --junitxml="$report" "$@" || rc=$?
.venv/bin/python .ci/junit_count.py rollout "$report" || rc=1
exit "$rc"
