#!/bin/bash
# Build the ostree VM tier's disk into OUT/ (called by vm-tests/ostree/disk.py, which caches it
# under a hash of its inputs):  OUT/disk.img  (raw, MBR: p1 /boot ext4 "boot", p2 root "root")
#
#   build-disk.sh OUT PACKAGES_FILE REQUIREMENTS_FILE MIRROR V1_LAYOUT V1_DIGEST V1_NAME
#
# A Debian 12 rootfs (mmdebstrap,
# dracut with ostree's module) made ostree-ready *after* mmdebstrap returns, committed as
# `ima/base`; the test image v1 (an OCI layout on the host) imported on top of it by the guest
# bootc's own import code and deployed as the first deployment, with v1 in its origin; syslinux
# (extlinux), whose config ostree writes, boots it. The repo, the scenario's files and the
# guest bootc are not baked in: the VM mounts them over 9p (`src`, `harness`).
set -euo pipefail
OUT=$1 PACKAGES=$2 REQUIREMENTS=$3 MIRROR=$4 V1_LAYOUT=$5 V1_DIGEST=$6 V1_NAME=$7
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PIP=${IMA_SYSTEM_HOST_PIP:-$REPO/.venv/bin/pip}
P9='9p trans=virtio,version=9p2000.L,msize=262144'
ROOT=$OUT/rootfs M=$OUT/mnt IMG=$OUT/disk.img.tmp
LOOPS=()
cleanup() {
  umount "$M/boot" 2>/dev/null || true
  umount "$M" 2>/dev/null || true
  for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
}
trap cleanup EXIT
step() { echo "[$(date +%T)] $*"; }

rm -rf "$ROOT" "$OUT/var-init" "$OUT/wheels" "$IMG" "$M"
mkdir -p "$OUT/wheels"
step "wheels"
timeout 600 "$PIP" download -q --only-binary=:all: -d "$OUT/wheels" -r "$REQUIREMENTS"

step "mmdebstrap"
timeout 1500 mmdebstrap --variant=apt --include="$(paste -sd, "$PACKAGES")" \
  --essential-hook='mkdir -p "$1/etc/dracut.conf.d"; printf "hostonly=no\ndrivers=\" virtio_blk virtio_pci ext4 crc32c_generic \"\nomit_dracutmodules+=\" plymouth lvm dm mdraid crypt nfs iscsi multipath network network-legacy i18n btrfs resume qemu qemu-net \"\n" > "$1/etc/dracut.conf.d/10-ima.conf"' \
  --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp $OUT/wheels/* \"\$1/tmp/wheels/\" && cp $REQUIREMENTS \"\$1/tmp/requirements.txt\"" \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin python3 -m venv --system-site-packages /usr/lib/ima/venv' \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/lib/ima/venv/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/requirements.txt' \
  --customize-hook='mkdir -p "$1/usr/lib/ima/src"; echo /usr/lib/ima/src > "$1"/usr/lib/ima/venv/lib/python3.11/site-packages/image-mode-agent-src.pth' \
  --customize-hook='printf "#!/bin/sh\nexec /usr/lib/ima/venv/bin/python -m agent \"\$@\"\n" > "$1/usr/bin/image-mode-agent"; chmod 755 "$1/usr/bin/image-mode-agent"; ln -sf /usr/lib/ima/src/vm-tests/ostree/guest/bootc "$1/usr/bin/bootc"' \
  --customize-hook='chroot "$1" useradd -m -s /bin/bash core; echo imaostree > "$1/etc/hostname"; chroot "$1" passwd -d root' \
  --customize-hook="printf 'LABEL=boot /boot ext4 defaults 0 2\nsrc /usr/lib/ima/src $P9,ro 0 0\nharness /var/mnt/harness $P9 0 0\n' > \"\$1/etc/fstab\"" \
  --customize-hook='mkdir -p "$1/etc/systemd/network"; printf "[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n" > "$1/etc/systemd/network/10-slirp.network"; chroot "$1" systemctl enable systemd-networkd.service ostree-finalize-staged.path ostree-remount.service' \
  --customize-hook='mkdir -p "$1/var/log/journal" "$1/var/mnt/harness" "$1/etc/image-mode-agent/check/required.d" "$1/etc/image-mode-agent/check/wanted.d"' \
  --customize-hook="cp $HERE/guest/harness-*.service \"\$1/etc/systemd/system/\"; chroot \"\$1\" systemctl enable harness-boot.service harness-seed.service harness-step.service" \
  --customize-hook='for u in e2scrub_reap.service modprobe@drm.service modprobe@efi_pstore.service modprobe@dm_mod.service modprobe@loop.service modprobe@fuse.service dev-hugepages.mount dev-mqueue.mount sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount sys-fs-fuse-connections.mount systemd-binfmt.service proc-sys-fs-binfmt_misc.automount getty@tty1.service serial-getty@ttyS0.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer fstrim.timer man-db.timer dpkg-db-backup.timer systemd-networkd-wait-online.service; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
  --customize-hook='kver=$(ls "$1/usr/lib/modules"); chroot "$1" dracut -q -f --no-hostonly --kver "$kver" "/usr/lib/modules/$kver/initramfs.img"; cp "$1/boot/vmlinuz-$kver" "$1/usr/lib/modules/$kver/vmlinuz"' \
  --customize-hook='rm -rf "$1/tmp/wheels" "$1/tmp/requirements.txt" "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
  bookworm "$ROOT" "$MIRROR"
rm -rf "$OUT/wheels"

step "ostree-ify"  # after mmdebstrap returns: moving /etc and /var in a hook breaks its cleanup
cd "$ROOT"
rm -rf boot/* dev/* run/* tmp/* vmlinuz vmlinuz.old initrd.img initrd.img.old
mv etc usr/etc
mkdir sysroot && ln -s sysroot/ostree ostree
# /var is the stateroot's, shared by every deployment: the commit gets an empty one and the
# contents seed the stateroot; the trees that live in /var move there with what they hold.
mv var "$OUT/var-init" && mkdir var
for d in home:home root:roothome opt:opt srv:srv mnt:mnt usr/local:usrlocal; do
  rm -rf "$OUT/var-init/${d#*:}"; mv "${d%%:*}" "$OUT/var-init/${d#*:}"
done
for d in home:var/home root:var/roothome opt:var/opt srv:var/srv mnt:var/mnt media:run/media; do
  rm -rf "${d%%:*}"; ln -s "${d#*:}" "${d%%:*}"
done
ln -s ../var/usrlocal usr/local
printf 'd /var/home 0755 - - -\nd /var/roothome 0700 - - -\nd /var/opt 0755 - - -\nd /var/srv 0755 - - -\nd /var/mnt 0755 - - -\nd /var/usrlocal 0755 - - -\nd /run/media 0755 - - -\n' > usr/lib/tmpfiles.d/ima-ostree.conf
mkdir -p "$OUT/var-init/mnt/harness"
cd - >/dev/null

step "disk"
truncate -s 6G "$IMG"
printf 'label: dos\n,512MiB,L,*\n,,L\n' | timeout 60 sfdisk -q "$IMG"
part() { sfdisk -J "$IMG" | python3 -c "import json,sys;p=json.load(sys.stdin)['partitiontable']['partitions'][$1];print(p['start']*512, p['size']*512)"; }
read -r BOOT_OFF BOOT_SIZE < <(part 0)
read -r ROOT_OFF ROOT_SIZE < <(part 1)
LBOOT=$(losetup -f --show -o "$BOOT_OFF" --sizelimit "$BOOT_SIZE" "$IMG"); LOOPS+=("$LBOOT")
LROOT=$(losetup -f --show -o "$ROOT_OFF" --sizelimit "$ROOT_SIZE" "$IMG"); LOOPS+=("$LROOT")
mkfs.ext4 -q -O ^64bit -L boot "$LBOOT"
mkfs.ext4 -q -L root "$LROOT"
mkdir -p "$M" && mount "$LROOT" "$M" && mkdir -p "$M/boot" && mount "$LBOOT" "$M/boot"

step "sysroot"
ostree admin init-fs "$M"
ostree admin --sysroot="$M" os-init debian
R=$M/ostree/repo
ostree --repo="$R" config set sysroot.bootloader syslinux
# /sysroot read-only once booted, as `bootc install` leaves it (install.rs:237): whatever writes
# the repository remounts it in a private mount namespace (the guest bootc's verbs do; the agent's
# pre-pull must).
ostree --repo="$R" config set sysroot.readonly true
ostree --repo="$R" commit -b ima/base --subject base --tree=dir="$ROOT"
# v1 goes in as the guest bootc imports any image: base + the image's /usr and /etc (as /usr/etc),
# a commit under ostree-ext's image ref for NAME@DIGEST (guest/bootc import_image)
V1=$(python3 "$HERE/guest/bootc" internal-import --repo "$R" --layout "$V1_LAYOUT" \
       --digest "$V1_DIGEST" --name "$V1_NAME")
mkdir -p "$M/boot/loader.0" && ln -s loader.0 "$M/boot/loader" && touch "$M/boot/loader/syslinux.cfg"
mkdir -p "$M/boot/syslinux" && ln -s ../loader/syslinux.cfg "$M/boot/syslinux/syslinux.cfg"
cp -a "$OUT/var-init/." "$M/ostree/deploy/debian/var/"
python3 "$HERE/guest/bootc" internal-origin --name "$V1_NAME" --digest "$V1_DIGEST" > "$OUT/origin"
ostree admin --sysroot="$M" deploy --os=debian --origin-file="$OUT/origin" \
  --karg=root=LABEL=root --karg=rw --karg-append=console=ttyS0 --karg-append=quiet \
  --karg-append=mitigations=off "$V1"
extlinux --install "$M/boot/syslinux" 2>&1 | grep -v '^/' || true
cleanup; LOOPS=()
dd if=/usr/lib/syslinux/mbr/mbr.bin of="$IMG" conv=notrunc bs=440 count=1 status=none
rm -rf "$ROOT" "$OUT/var-init" "$M" "$OUT/origin"
mv "$IMG" "$OUT/disk.img"
step "done"
