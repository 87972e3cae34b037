#!/bin/bash
# Host packages the system tier needs (Debian 12). Idempotent; ~15 s when nothing is cached,
# ~40 s more the first time podman/buildah/runc come in (the container-image scenarios).
set -euo pipefail
need=()
# runc: crun fails here ("cgroups in hybrid mode not supported"), so podman is pointed at runc
# (tests/system/podman.py writes the containers.conf that says so).
for pair in mmdebstrap:mmdebstrap systemd-nspawn:systemd-container \
            docker-registry:docker-registry skopeo:skopeo nsenter:util-linux \
            podman:podman buildah:buildah runc:runc; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if ((${#need[@]})); then
  timeout 120 apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}"
fi
