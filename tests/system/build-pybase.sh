#!/bin/bash
# Build the minimal Debian 12 Python base the DaemonSet image is tested on (called by
# images.py, which caches the tarball under a hash of this script).
#
#   build-pybase.sh OUT.tar MIRROR
#
# Stands in for registry.access.redhat.com/ubi9/python-311, which is not reachable here: all
# the Containerfile needs from its base is python3 >= 3.11 with venv (ensurepip).
set -euo pipefail
OUT=$1 MIRROR=$2
rm -f "$OUT.tmp"
timeout 900 mmdebstrap --quiet --format=tar --variant=minbase --include=python3,python3-venv \
  --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
  --customize-hook='rm -rf "$1/usr/share/man" "$1/usr/share/locale"' \
  bookworm "$OUT.tmp" "$MIRROR"
mv "$OUT.tmp" "$OUT"
