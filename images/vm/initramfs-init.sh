#!/bin/sh
# /init of the tiny initramfs (busybox-static + virtio/ext4 modules). It loads the modules
# in /etc/initramfs-modules, finds the root disk by its virtio serial (QEMU:
# -device virtio-blk-pci,serial=vmroot; override with e2e.rootserial=NAME), mounts it
# READ-ONLY (like Bottlerocket's dm-verity root) and switch_roots into /sbin/init there.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "CERTROTOR-E2E: INITRAMFS-ERROR $*"; echo "CERTROTOR-E2E: RESULT rc=125"; poweroff -f; }
while read -r m; do modprobe "$m" || fail "modprobe $m"; done < /etc/initramfs-modules
want=$(sed -n 's/.*e2e\.rootserial=\([^ ]*\).*/\1/p' /proc/cmdline)
want=${want:-vmroot}
# Poll (bounded: 20 s of uptime) until the disk with that serial shows up.
dev=""; deadline=$(( $(cut -d. -f1 /proc/uptime) + 20 ))
while [ -z "$dev" ]; do
  for s in /sys/block/vd*/serial; do
    [ -e "$s" ] && [ "$(cat "$s")" = "$want" ] && { dev=/dev/$(basename "$(dirname "$s")"); break; }
  done
  [ -n "$dev" ] && break
  [ "$(cut -d. -f1 /proc/uptime)" -ge "$deadline" ] && fail "no virtio disk with serial $want"
  sleep 0.05
done
mkdir -p /newroot
mount -t ext4 -o ro "$dev" /newroot || fail "cannot mount $dev read-only"
umount /sys /proc
mount --move /dev /newroot/dev 2>/dev/null || umount /dev
exec switch_root /newroot /sbin/init
