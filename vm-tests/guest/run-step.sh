#!/bin/sh
# VM tier, guest side: run by harness-step.service on every boot (copied into the harness share
# as /mnt/harness/run-step). Counts boots, reports to the serial console and the share, then
# sources the scenario's /mnt/harness/step.sh, which decides on reboot or poweroff.
# The boot number is the stand-in's count of boots (its unit records every boot early), not a
# count of this script's runs: a boot the agent reboots before multi-user.target never runs it.
n=$(wc -l < /var/lib/standin-bootc/boots.log)
log() { echo "HARNESS boot=$n $*" > /dev/ttyS0; echo "boot=$n $*" >> /mnt/harness/results.log; sync; }
finish() { log "RESULT $*"; sync; systemctl poweroff --no-block; exit 0; }
booted_digest() {
  python3 -c 'import json;print(json.load(open("/var/lib/standin-bootc/state.json"))["booted"]["digest"])'
}
. /opt/image-mode-agent/src/vm-tests/guest/agent-status.sh  # agent_field, wait_agent
log "up bootid=$(cat /proc/sys/kernel/random/boot_id) uptime=$(cut -d' ' -f1 /proc/uptime)"
if [ $n = 1 ]; then
  # Units seeded on this first boot were not in the initial transaction: load and start them.
  systemctl daemon-reload
  systemctl start --no-block multi-user.target
fi
. /mnt/harness/step.sh
