# VM tiers, guest side: the agent's status.json, for both tiers' run-step scripts (sourced).
agent_field() {  # agent_field KEY: a field of the agent's status.json, empty when absent
  python3 -c 'import json,sys
try: print(json.load(open("/var/lib/image-mode-agent/status.json")).get(sys.argv[1]) or "")
except Exception: print("")' "$1"
}
wait_agent() {  # wait_agent STATE [TEXT-IN-currentImage-or-reason] [SECONDS]
  i=0
  while [ $i -lt "${3:-240}" ]; do
    if [ "$(agent_field state)" = "$1" ]; then
      [ -z "$2" ] && return 0
      case "$(agent_field currentImage) $(agent_field reason)" in *"$2"*) return 0 ;; esac
    fi
    sleep 1; i=$((i + 1))
  done
  return 1
}
