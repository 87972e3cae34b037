#!/bin/bash
# Host packages the system tier needs (Debian 12). Idempotent; ~15 s when nothing is cached.
set -euo pipefail
need=()
for pair in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container \
            docker-registry:docker-registry skopeo:skopeo nsenter:util-linux; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if ((${#need[@]})); then
  timeout 120 apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}"
fi
