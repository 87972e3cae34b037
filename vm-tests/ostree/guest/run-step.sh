#!/bin/sh
# ostree VM tier, guest side: run by harness-step.service on every boot (copied into the share
# as /var/mnt/harness/run-step). Reports this boot (its number from harness-boot.service, which
# records every boot early, and the deployment ostree booted), then sources the scenario's
# $H/step.sh, which checks and ends with `finish`.
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
# The guest bootc's fetched.log (a line per fetch: verb, ref, registry contacted, bytes).
FETCHED=/var/lib/ostree-bootc/fetched.log
fetch_count() { if [ -e $FETCHED ]; then wc -l < $FETCHED; else echo 0; fi; }
fetches() {  # fetches FROM [registry|verbs|boot]: the lines after line FROM, summarised
  [ -e $FETCHED ] || { echo; return; }
  tail -n +$(($1 + 1)) $FETCHED | python3 -c 'import json,sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
what = sys.argv[1] if len(sys.argv) > 1 else ""
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
if what == "registry":  # how many contacted the registry
    print(sum(1 for l in lines if l["registry"]))
elif what == "boot":  # how many in this boot contacted the registry
    print(sum(1 for l in lines if l["registry"] and l["bootId"] == boot))
elif what == "verbs":
    print(" ".join(l["verb"] for l in lines))
else:
    print(" | ".join("%s %s registry=%s bytes=%s" % (l["verb"], l["ref"][-12:], l["registry"],
                                                      l["bytes"]) for l in lines))' "$2"
}
repo_lists() { bootc internals ostree-container image list --repo /sysroot/ostree/repo | grep -qx "docker://$1"; }
sysroot_ro() { findmnt -no OPTIONS /sysroot | grep -q '^ro'; }
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
