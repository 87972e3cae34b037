#!/bin/bash
# The system tier: `tests/system/run.sh [-k NAME]... [--keep]` (root). See tests/system/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec timeout "${IMA_SYSTEM_TIMEOUT:-1800}" .venv/bin/python -m tests.system run "$@"
