#!/bin/bash
# The VM tier: `vm-tests/run.sh [-k NAME]... [--keep]` (root). See vm-tests/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v qemu-system-x86_64 >/dev/null || {
  timeout 120 apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends qemu-system-x86 qemu-utils
}
tests/system/setup-host.sh
exec timeout "${IMA_VM_TIMEOUT:-3600}" .venv/bin/python vm-tests/run.py "$@"
