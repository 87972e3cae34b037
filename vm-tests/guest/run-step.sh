#!/bin/sh
# VM tier, guest side: run by harness-step.service on every boot (copied into the harness share
# as /mnt/harness/run-step). Counts boots, reports to the serial console and the share, then
# sources the scenario's step.sh, which decides on reboot or poweroff.
# The boot number is the stand-in's count of boots (its unit records every boot early), not a
# count of this script's runs: a boot the agent reboots before multi-user.target never runs it.
n=$(wc -l < /var/lib/standin-bootc/boots.log)
log() { echo "HARNESS boot=$n $*" > /dev/ttyS0; echo "boot=$n $*" >> /mnt/harness/results.log; sync; }
finish() { log "RESULT $*"; sync; systemctl poweroff --no-block; exit 0; }
booted_digest() {
  python3 -c 'import json;print(json.load(open("/var/lib/standin-bootc/state.json"))["booted"]["digest"])'
}
agent_field() {  # agent_field KEY: a field of the agent's status.json, empty when absent
  python3 -c 'import json,sys
try: print(json.load(open("/var/lib/image-mode-agent/status.json")).get(sys.argv[1]) or "")
except Exception: print("")' "$1"
}
wait_agent() {  # wait_agent STATE [TEXT-IN-currentImage-or-reason] [SECONDS]
  i=0
  while [ $i -lt "${3:-180}" ]; do
    if [ "$(agent_field state)" = "$1" ]; then
      [ -z "$2" ] && return 0
      case "$(agent_field currentImage) $(agent_field reason)" in *"$2"*) return 0 ;; esac
    fi
    sleep 1; i=$((i + 1))
  done
  return 1
}
log "up bootid=$(cat /proc/sys/kernel/random/boot_id) uptime=$(cut -d' ' -f1 /proc/uptime)"
if [ $n = 1 ]; then
  # Units seeded on this first boot were not in the initial transaction: load and start them.
  systemctl daemon-reload
  systemctl start --no-block multi-user.target
fi
. /mnt/harness/step.sh
