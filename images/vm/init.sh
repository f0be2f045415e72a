#!/bin/sh
# /sbin/init of the certrotor test VM (busybox ash), entered from the initramfs with the
# root image mounted READ-ONLY. It builds a Bottlerocket-like host:
#   /            read-only ext4 (Bottlerocket: dm-verity root)
#   /etc         tmpfs, filled from the image's /etc each boot (Bottlerocket: generated tmpfs)
#   /run /tmp    tmpfs;   /sys/fs/cgroup cgroup2;   "/" made rshared (systemd does that)
#   /local       persistent disk (virtio serial "local"; formatted here if blank), with
#                /var, /opt and /mnt bind-mounted from /local/{var,opt,mnt}
#   /mnt/share   9p share from the host (mount tag "share"): run.sh in, results out
# then starts containerd (root /var/lib/containerd, namespace "default") and runs the scenario
# script (/mnt/share/run.sh, or e2e.script=PATH) and powers off. Serial markers (one line each,
# matched as substrings by the harness):
#   CERTROTOR-E2E: BOOTED boot=N uptime=S
#   CERTROTOR-E2E: CONTAINERD-UP uptime=S     (or CONTAINERD-FAILED)
#   CERTROTOR-E2E: RUN-BEGIN script=PATH uptime=S
#   CERTROTOR-E2E: RESULT rc=N uptime=S
#   CERTROTOR-E2E: POWEROFF uptime=S
# Kernel command line knobs: e2e.boot=N (harness boot index, names the output dir
# /mnt/share/out/boot-N), e2e.script=PATH, e2e.nocontainerd=1, e2e.shell=1 (shell on ttyS0).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
umask 022
up() { cut -d' ' -f1 /proc/uptime; }
mark() { echo "CERTROTOR-E2E: $* uptime=$(up)"; }
arg() { sed -n "s/.*[[:space:]]$1=\\([^[:space:]]*\\).*/\\1/p" /proc/cmdline | head -n1; }
ismnt() { grep -q "^[^ ]* $1 " /proc/mounts; }

# ---- kernel filesystems ------------------------------------------------------------------
mount -t proc proc /proc
mount -t sysfs sysfs /sys
ismnt /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue 2>/dev/null
ln -sf /proc/self/fd /dev/fd; ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout; ln -sf /proc/self/fd/2 /dev/stderr
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
# /etc: a tmpfs copy of the image's /etc (writable, lost at reboot, like Bottlerocket's)
mkdir -p /run/.etc-image && mount --bind /etc /run/.etc-image
mount -t tmpfs -o mode=0755 tmpfs /etc && cp -a /run/.etc-image/. /etc/
umount /run/.etc-image && rmdir /run/.etc-image
mount --make-rshared /
hostname "$(cat /etc/hostname)"
ip link set lo up   # etcd and the API simulators listen on 127.0.0.1 / unix sockets

# ---- modules + cgroup controllers -------------------------------------------------------
while read -r m; do modprobe "$m" || echo "CERTROTOR-E2E: WARN modprobe $m failed"; done < /etc/e2e-modules
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
  echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
done

# ---- persistent /local (virtio serial "local") ------------------------------------------
localdev=""
for s in /sys/block/vd*/serial; do
  [ -e "$s" ] && [ "$(cat "$s")" = local ] && localdev=/dev/$(basename "$(dirname "$s")")
done
if [ -n "$localdev" ]; then
  # ext2/3/4 superblock magic 0xEF53 at byte 1080; anything else = blank disk: format it
  magic=$(dd if="$localdev" bs=1 skip=1080 count=2 2>/dev/null | od -An -tx1 | tr -d ' \n')
  if [ "$magic" != 53ef ]; then
    echo "CERTROTOR-E2E: formatting blank $localdev as /local"
    mkfs.ext4 -q -F -L local -E lazy_itable_init=1,lazy_journal_init=1 "$localdev"
  fi
  mount -t ext4 -o rw,noatime "$localdev" /local || echo "CERTROTOR-E2E: WARN cannot mount $localdev on /local"
else
  echo "CERTROTOR-E2E: WARN no disk with serial 'local': /local is a tmpfs (nothing persists)"
  mount -t tmpfs -o mode=0755 tmpfs /local
fi
for d in var opt mnt; do mkdir -p "/local/$d" && mount --bind "/local/$d" "/$d"; done
mkdir -p /var/lib /var/log /var/tmp /local/host-containers /local/bootstrap-containers
ln -sfn /run /var/run 2>/dev/null
n=$(( $(cat /var/lib/certrotor-e2e/boot-count 2>/dev/null || echo 0) + 1 ))
mkdir -p /var/lib/certrotor-e2e && echo "$n" > /var/lib/certrotor-e2e/boot-count && sync
boot=$(arg e2e.boot); boot=${boot:-$n}

# ---- host share --------------------------------------------------------------------------
mkdir -p /mnt/share
if grep -qsw share /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag; then
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=none share /mnt/share ||
    echo "CERTROTOR-E2E: WARN cannot mount the 9p share"
fi
export E2E_SHARE=/mnt/share E2E_BOOT="$boot" E2E_BOOT_COUNT="$n"
export E2E_OUT="/mnt/share/out/boot-$boot"
ismnt /mnt/share && mkdir -p "$E2E_OUT" || E2E_OUT=/run/e2e-out
mkdir -p "$E2E_OUT"
mark "BOOTED boot=$boot count=$n kernel=$(uname -r)"

# ---- containerd ---------------------------------------------------------------------------
if [ "$(arg e2e.nocontainerd)" != 1 ]; then
  mkdir -p /run/containerd
  containerd --config /etc/containerd/config.toml > "$E2E_OUT/containerd.log" 2>&1 &
  # A hang stop only (containerd answers in 3-4 s on an idle host), with a line every 30 s
  # while it waits: the harness takes a silent console for a hung boot.
  now=$(cut -d. -f1 /proc/uptime); deadline=$(( now + 600 )) beat=$(( now + 30 ))
  until ctr version > /dev/null 2>&1; do
    now=$(cut -d. -f1 /proc/uptime)
    if [ "$now" -ge "$deadline" ]; then break; fi
    if [ "$now" -ge "$beat" ]; then echo "init: still waiting for containerd"; beat=$(( now + 30 )); fi
    sleep 0.1
  done
  if ctr version > /dev/null 2>&1; then mark CONTAINERD-UP; else mark CONTAINERD-FAILED; fi
fi

# ---- scenario -----------------------------------------------------------------------------
script=$(arg e2e.script)
[ -z "$script" ] && [ -f /mnt/share/run.sh ] && script=/mnt/share/run.sh
rc=0
if [ -n "$script" ]; then
  mark "RUN-BEGIN script=$script"
  (cd /tmp && exec sh "$script" < /dev/null); rc=$?
  echo "$rc" > "$E2E_OUT/rc"
  mark "RESULT rc=$rc"
else
  mark "NO-SCRIPT"
fi
[ "$(arg e2e.shell)" = 1 ] && setsid cttyhack sh -l

# ---- orderly shutdown: stop everything so that /local unmounts clean -----------------------
anyprocs() {  # any user-space process left besides PID 1? (kernel threads have no exe)
  for p in /proc/[0-9]*; do
    [ "$p" = /proc/1 ] && continue
    [ -e "$p/exe" ] && return 0
  done
  return 1
}
kill -TERM -1 2>/dev/null
deadline=$(( $(cut -d. -f1 /proc/uptime) + 5 ))
while anyprocs && [ "$(cut -d. -f1 /proc/uptime)" -lt "$deadline" ]; do sleep 0.1; done
kill -KILL -1 2>/dev/null
sync
for m in $(awk '$2 ~ "^/(var|opt|mnt|local|run)/" {print $2}' /proc/mounts | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
for m in /var /opt /mnt /local; do ismnt "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }; done
sync
mark POWEROFF
poweroff -f
