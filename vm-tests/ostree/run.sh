#!/bin/bash
# The ostree VM tier: `vm-tests/ostree/run.sh [-k NAME]... [--keep] [--list]` (root).
# See vm-tests/ostree/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
need=()
for tool in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils ostree:ostree \
            extlinux:extlinux sfdisk:fdisk; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
[ -e /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common)
if [ ${#need[@]} -gt 0 ]; then
  timeout 120 apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}"
fi
tests/system/setup-host.sh
exec timeout "${IMA_OSTREE_TIMEOUT:-5400}" .venv/bin/python vm-tests/ostree/scenarios.py "$@"
