#!/bin/bash
# Build the VM tier's disk and kernel into OUT/ (called by vm-tests/image.py, which caches the
# result under a hash of this script, the package list and the agent's Python requirements):
#   OUT/base.img (ext4, LABEL=root, 2 GiB sparse)  OUT/vmlinux (uncompressed, PVH)  OUT/initrd.img
#
#   build-image.sh OUT PACKAGES_FILE REQUIREMENTS_FILE MIRROR
#
# The guest runs under qemu's TCG (software emulation): KVM hangs on the machines CI uses. A
# Debian rootfs from mmdebstrap, an initramfs with only the virtio, ext4 and 9p modules, and the
# kernel uncompressed for a PVH boot, which saves the decompression at every boot.
# As in the system tier, the repo and tests/system/guest are NOT baked in: the VM mounts them
# over 9p (tags `src`, `guest`), and a third share (`harness`) carries each scenario's seed
# files and step script.
set -euo pipefail
OUT=$1 PACKAGES=$2 REQUIREMENTS=$3 MIRROR=$4
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PIP=${IMA_SYSTEM_HOST_PIP:-$REPO/.venv/bin/pip}
P9='9p trans=virtio,version=9p2000.L,msize=262144'

rm -rf "$OUT/root" "$OUT/wheels" "$OUT/base.img.tmp"
mkdir -p "$OUT/wheels"
timeout 600 "$PIP" download -q --only-binary=:all: -d "$OUT/wheels" -r "$REQUIREMENTS"

timeout 1200 mmdebstrap --variant=apt --include="$(paste -sd, "$PACKAGES")" \
  --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"; echo MODULES=list > "$1/etc/initramfs-tools/conf.d/ima.conf"; printf "virtio_pci\nvirtio_blk\nvirtio_net\next4\n9p\n9pnet_virtio\n" > "$1/etc/initramfs-tools/modules"' \
  --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp $OUT/wheels/* \"\$1/tmp/wheels/\" && cp $REQUIREMENTS \"\$1/tmp/requirements.txt\"" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m venv --system-site-packages /opt/image-mode-agent/venv' \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /opt/image-mode-agent/venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.txt' \
  --customize-hook='echo /opt/image-mode-agent/src > "$1"/opt/image-mode-agent/venv/lib/python3.11/site-packages/image-mode-agent-src.pth; mkdir -p "$1/opt/image-mode-agent/src" "$1/opt/image-mode-agent/guest" "$1/mnt/harness"' \
  --customize-hook='printf "#!/bin/sh\nexec /opt/image-mode-agent/venv/bin/python -m agent \"\$@\"\n" > "$1/usr/local/bin/image-mode-agent"; chmod 755 "$1/usr/local/bin/image-mode-agent"; ln -sf /usr/local/bin/image-mode-agent "$1/usr/bin/image-mode-agent"; ln -sf /opt/image-mode-agent/guest/bootc "$1/usr/bin/bootc"' \
  --customize-hook='chroot "$1" useradd -m -s /bin/bash core; echo imavm > "$1/etc/hostname"; chroot "$1" passwd -d root' \
  --customize-hook="printf 'LABEL=root / ext4 rw,errors=remount-ro 0 1\nsrc /opt/image-mode-agent/src $P9,ro 0 0\nguest /opt/image-mode-agent/guest $P9,ro 0 0\nharness /mnt/harness $P9 0 0\n' > \"\$1/etc/fstab\"" \
  --customize-hook='mkdir -p "$1/etc/systemd/network"; printf "[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n" > "$1/etc/systemd/network/10-slirp.network"; chroot "$1" systemctl enable systemd-networkd.service' \
  --customize-hook='mkdir -p "$1/var/log/journal" "$1/etc/image-mode-agent/check/required.d" "$1/etc/image-mode-agent/check/wanted.d"' \
  --customize-hook="cp $HERE/guest/harness-seed.service $HERE/guest/harness-step.service \"\$1/etc/systemd/system/\"; cp $REPO/tests/system/guest/standin-bootc-boot.service $REPO/tests/system/guest/bootc-fetch-apply-updates.* \"\$1/etc/systemd/system/\"; chroot \"\$1\" systemctl enable harness-seed.service harness-step.service standin-bootc-boot.service bootc-fetch-apply-updates.timer" \
  --customize-hook='for u in e2scrub_reap.service modprobe@drm.service modprobe@efi_pstore.service modprobe@dm_mod.service modprobe@loop.service modprobe@fuse.service dev-hugepages.mount dev-mqueue.mount sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount systemd-binfmt.service proc-sys-fs-binfmt_misc.automount getty@tty1.service serial-getty@ttyS0.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer fstrim.timer systemd-networkd-wait-online.service; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
  --customize-hook="cp \"\$1\"/boot/vmlinuz-* $OUT/vmlinuz; cp \"\$1\"/boot/initrd.img-* $OUT/initrd.img" \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/tmp/requirements.txt" "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
  bookworm "$OUT/root" "$MIRROR"
rm -rf "$OUT/wheels"
truncate -s 2G "$OUT/base.img.tmp"
timeout 300 mkfs.ext4 -q -L root -d "$OUT/root" "$OUT/base.img.tmp"
# The uncompressed ELF kernel boots ~2 s faster under TCG (no self-decompression).
python3 -c 'import lzma,sys;d=open(sys.argv[1],"rb").read();i=d.find(b"\xfd7zXZ\x00");open(sys.argv[2],"wb").write(lzma.LZMADecompressor().decompress(d[i:]))' "$OUT/vmlinuz" "$OUT/vmlinux"
rm -rf "$OUT/root"
mv "$OUT/base.img.tmp" "$OUT/base.img"
