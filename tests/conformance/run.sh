#!/bin/bash
# The conformance tier: `tests/conformance/run.sh [PYTEST ARGS]`. The agent against the real
# kube-apiserver + etcd and the real machine-config-controller from the kit named by
# IMAGE_MODE_AGENT_KIT (see tests/conformance/README.md). Ends with one line
# "conformance: N passed, N failed" when it ran, or "conformance: not run: ..." (exit 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec timeout "${IMA_CONFORMANCE_TIMEOUT:-2400}" .venv/bin/python -m tests.conformance "$@"
