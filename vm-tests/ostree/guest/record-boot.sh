#!/bin/sh
# ostree VM tier (harness-boot.service, early in every boot): a line per boot in
# /var/lib/harness/boots.log: the boot ID and the deployment directory (<checksum>.<serial>)
# that the bootloader entry's ostree= argument resolves to.
set -e
mkdir -p /var/lib/harness
entry=$(sed -n 's/.*ostree=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "$(cat /proc/sys/kernel/random/boot_id) $(basename "$(readlink -f "$entry")")" >> /var/lib/harness/boots.log
sync
