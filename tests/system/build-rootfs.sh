#!/bin/bash
# Build the system tier's Debian 12 root filesystem into OUT/root (called by rootfs.py, which
# caches the result under a hash of this script, the package list and the Python requirements).
#
#   build-rootfs.sh OUT PACKAGES_FILE REQUIREMENTS_FILE MIRROR
#
# The agent's source is NOT baked in: the harness bind-mounts the repo read-only at
# /opt/image-mode-agent/src, so code changes never invalidate the cache. What is baked in is a
# venv built for the container's own python3 (Debian 3.11) with the agent's dependencies, because
# Debian's python3-aiohttp/structlog/dbus-fast are older than pyproject.toml allows.
set -euo pipefail
OUT=$1 PACKAGES=$2 REQUIREMENTS=$3 MIRROR=$4
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PIP=${IMA_SYSTEM_HOST_PIP:-$REPO/.venv/bin/pip}

rm -rf "$OUT/root.tmp" "$OUT/wheels"
mkdir -p "$OUT/wheels"
# Wheels are fetched on the host (its pip knows the local mirrors); the chroot installs them
# offline. Both Pythons are CPython 3.11 on x86_64, so the same cp311 wheels fit.
timeout 600 "$PIP" download -q --only-binary=:all: -d "$OUT/wheels" -r "$REQUIREMENTS"

# Everything after `chroot` runs with a clean environment: the host's PIP_* settings name files
# that do not exist inside the chroot.
timeout 900 mmdebstrap --variant=apt --include="$(paste -sd, "$PACKAGES")" \
  --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp $OUT/wheels/* \"\$1/tmp/wheels/\" && cp $REQUIREMENTS \"\$1/tmp/requirements.txt\"" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m venv --system-site-packages /opt/image-mode-agent/venv' \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /opt/image-mode-agent/venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.txt' \
  --customize-hook='echo /opt/image-mode-agent/src > "$1"/opt/image-mode-agent/venv/lib/python3.11/site-packages/image-mode-agent-src.pth; mkdir -p "$1/opt/image-mode-agent/src"' \
  --customize-hook='printf "#!/bin/sh\nexec /opt/image-mode-agent/venv/bin/python -m agent \"\$@\"\n" > "$1/usr/local/bin/image-mode-agent"; chmod 755 "$1/usr/local/bin/image-mode-agent"' \
  --customize-hook='chroot "$1" useradd -m -s /bin/bash core; echo imasys > "$1/etc/hostname"; chroot "$1" passwd -d root' \
  --customize-hook='mkdir -p "$1/var/log/journal" "$1/etc/image-mode-agent/check/required.d" "$1/etc/image-mode-agent/check/wanted.d"' \
  --customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer systemd-networkd-wait-online.service getty@tty1.service console-getty.service; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/tmp/requirements.txt" "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
  bookworm "$OUT/root.tmp" "$MIRROR"
rm -rf "$OUT/wheels"
mv "$OUT/root.tmp" "$OUT/root"
