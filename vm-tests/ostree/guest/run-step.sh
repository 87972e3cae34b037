#!/bin/sh
# ostree VM tier, guest side: run by harness-step.service on every boot (copied into the share
# as /var/mnt/harness/run-step). Reports this boot (its number from harness-boot.service, which
# records every boot early, and the deployment ostree booted), then sources the scenario's
# step.sh, which checks and ends with `finish`.
H=/var/mnt/harness
n=$(wc -l < /var/lib/harness/boots.log)
log() { echo "HARNESS boot=$n $*" > /dev/ttyS0; echo "boot=$n $*" >> $H/results.log; sync; }
finish() { log "RESULT $*"; sync; systemctl poweroff --no-block; exit 0; }
status_field() {  # status_field SLOT KEY: a field of `bootc status` (real ostree deployments)
  bootc status --format json | python3 -c 'import json,sys
e = json.load(sys.stdin)["status"][sys.argv[1]] or {}
print({"digest": (e.get("image") or {}).get("imageDigest"),
       "checksum": (e.get("ostree") or {}).get("checksum")}.get(sys.argv[2]) or "")' "$1" "$2"
}
booted_digest() { status_field booted digest; }
. /usr/lib/ima/src/vm-tests/guest/agent-status.sh  # agent_field, wait_agent
wait_file() {  # wait_file PATH [TENTHS]: poll fast (the window after staging is short)
  i=0
  while [ ! -e "$1" ]; do
    [ $i -ge "${2:-3000}" ] && return 1
    sleep 0.1; i=$((i + 1))
  done
}
agent_pid() { systemctl show -p MainPID --value image-mode-agent.service; }
set_desired() {  # set_desired FILE: the next desired state, replaced atomically
  cp "$H/$1" /etc/image-mode-agent/desired.yaml.tmp
  chmod 600 /etc/image-mode-agent/desired.yaml.tmp
  mv /etc/image-mode-agent/desired.yaml.tmp /etc/image-mode-agent/desired.yaml
}
# The agent's units and ostree's finalization, line by line on the console (console.log).
journalctl -f -n all -b -o cat -u image-mode-agent.service -u image-mode-agent-verify.service \
  -u image-mode-agent-stage.service -u ostree-finalize-staged.service | sed -u 's/^/JOURNAL /' > /dev/ttyS0 &
# First the line that tells the driver this boot is up (vm-tests/run.py STEP_UP), before
# anything that could hang: a hang after it is a failure, not a stall.
log "up bootid=$(cat /proc/sys/kernel/random/boot_id) uptime=$(cut -d' ' -f1 /proc/uptime)"
checksum=$(status_field booted checksum)
echo "$n $checksum $(booted_digest)" >> /var/lib/harness/booted.log
log "deployment=$checksum"
if [ "$n" = 1 ]; then
  # Units seeded on this first boot were not in the initial transaction: load and start them.
  systemctl daemon-reload
  systemctl start --no-block multi-user.target
fi
. $H/step.sh
