#!/usr/bin/env bash
# Builds the Bottlerocket-style certrotor test VM from the host's Debian packages (run
# images/setup-host.sh first). Outputs in OUT_DIR (all cached; only what changed is rebuilt):
#   vmlinux             ELF kernel extracted from Debian's vmlinuz (PVH direct boot, no xz under TCG)
#   initramfs.cpio.zst  tiny initramfs: busybox + virtio/ext4 modules; mounts the root disk
#                       (virtio serial "vmroot") read-only and switch_roots to its /sbin/init
#   rootfs.ext4         read-only root image: busybox, containerd + shim + ctr + runc, etcd +
#                       etcdctl, openssl, mkfs.ext4, their libraries, kernel modules, /sbin/init,
#                       /usr/lib/certrotor-e2e/lib.sh, plus every --add file
#   local-base.img      blank ext4 (label "local", sparse) for the persistent /local disk; use it
#                       as the backing file of a per-test qcow2 overlay
#   vm.env              KEY=VALUE description of the above (paths, kernel version, cache keys)
# Usage: build-vm.sh OUT_DIR [--add SRC:DEST]... [--kver KVER] [--force]
#   --add SRC:DEST  copy host file SRC into the image at DEST (absolute; a DEST ending in "/"
#                   gets SRC's file name); mode 0755, with its shared libraries. Repeatable.
#   --kver KVER     kernel version under /lib/modules (default: newest non-cloud one)
#   --force         rebuild everything
# Concurrent runs on the same OUT_DIR are serialised with flock.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
die() { echo "build-vm: error: $*" >&2; exit 1; }
log() { echo "build-vm: $*" >&2; }

[ $# -ge 1 ] || die "usage: build-vm.sh OUT_DIR [--add SRC:DEST]... [--kver KVER] [--force]"
OUT=$1; shift
adds=() KVER="" force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --add) [ $# -ge 2 ] || die "--add needs SRC:DEST"; adds+=("$2"); shift ;;
    --kver) [ $# -ge 2 ] || die "--kver needs a value"; KVER=$2; shift ;;
    --force) force=1 ;;
    *) die "unknown argument: $1" ;;
  esac
  shift
done

for tool in dpkg-query mkfs.ext4 depmod modprobe modinfo cpio zstd python3 flock sha256sum ldd; do
  command -v "$tool" > /dev/null || die "$tool not found: run images/setup-host.sh"
done
if ! [ -x /bin/busybox ] || ! /bin/busybox --list-full > /dev/null; then
  die "busybox-static missing: run images/setup-host.sh"
fi
if [ -z "$KVER" ]; then
  KVER=$(find /lib/modules -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | grep -v cloud | sort -V | tail -n1 || true)
fi
[ -n "$KVER" ] && [ -e "/boot/vmlinuz-$KVER" ] && [ -d "/lib/modules/$KVER" ] ||
  die "no usable kernel (KVER='$KVER'): install linux-image-amd64 (images/setup-host.sh)"

mkdir -p "$OUT/cache"
OUT=$(cd "$OUT" && pwd)
exec 9> "$OUT/.lock"
flock 9
t_start=$(date +%s.%N)

# ---- cache keys -----------------------------------------------------------------------
sha() { sha256sum | cut -c1-64; }
BINS=(containerd containerd-shim-runc-v2 ctr runc etcd etcdctl openssl mke2fs)
PKGS=(busybox-static containerd runc etcd-server etcd-client openssl libssl3 e2fsprogs libc6
      libseccomp2 "linux-image-$KVER")
pkg_versions=$(dpkg-query -W -f='${Package}=${Version}\n' "${PKGS[@]}" 2>/dev/null) ||
  die "missing packages (${PKGS[*]}): run images/setup-host.sh"
script_sum=$(cat "$here/build-vm.sh" "$here"/vm/* | sha)
kernel_key=$( { echo "$KVER"; dpkg-query -W -f='${Version}' "linux-image-$KVER"; cat "$here/extract-vmlinux.py"; } | sha)
initramfs_key=$( { echo "$kernel_key"; cat "$here/build-vm.sh" "$here/vm/initramfs-init.sh"; dpkg-query -W -f='${Version}' busybox-static; } | sha)
base_key=$( { echo "$KVER"; echo "$pkg_versions"; echo "$script_sum"; } | sha)
add_desc=""
for a in "${adds[@]}"; do
  src=${a%%:*} dest=${a#*:}
  [ "$src" != "$a" ] && [ -n "$src" ] && [ -n "$dest" ] || die "--add '$a': expected SRC:DEST"
  [ -f "$src" ] || die "--add '$a': $src is not a file"
  case "$dest" in /*) ;; *) die "--add '$a': DEST must be absolute" ;; esac
  case "$dest" in */) dest=$dest$(basename "$src") ;; esac
  add_desc+="$dest $(sha < "$src")"$'\n'
done
root_key=$( { echo "$base_key"; printf '%s' "$add_desc"; } | sha)
local_key=$( { dpkg-query -W -f='${Version}' e2fsprogs; grep 'mkfs.ext4 -q -F -L local ' "$here/build-vm.sh"; } | sha)
fresh() { [ "$force" = 0 ] && [ -e "$1" ] && [ "$(cat "$1.key" 2>/dev/null)" = "$2" ]; }

# ---- modules: copy_modules DESTROOT MODULE...  (+ deps + softdeps, then depmod) ----------
copy_modules() {
  local dest=$1; shift
  local src=/lib/modules/$KVER dst=$dest/lib/modules/$KVER mods=("$@") m sd kind ko rel
  mkdir -p "$dst"
  for f in modules.order modules.builtin modules.builtin.modinfo; do cp "$src/$f" "$dst/"; done
  for m in "${mods[@]}"; do   # softdeps ("pre: crc32c") are not in --show-depends
    sd=$(modinfo -k "$KVER" -F softdep "$m" 2>/dev/null | tr ' ' '\n' | grep -v -e ':$' -e '^$' || true)
    [ -n "$sd" ] && mapfile -t -O "${#mods[@]}" mods <<< "$sd"
  done
  for m in "${mods[@]}"; do
    modprobe -S "$KVER" --show-depends "$m" > "$OUT/cache/.deps" 2>/dev/null || die "kernel module $m not found for $KVER"
    while read -r kind ko _; do
      [ "$kind" = insmod ] || continue
      rel=${ko#"$src"/}
      [ -e "$dst/$rel" ] || install -D -m 0644 "$ko" "$dst/$rel"
    done < "$OUT/cache/.deps"
  done
  rm -f "$OUT/cache/.deps"
  depmod -b "$dest" "$KVER"
}
busybox_tree() {  # busybox + applet symlinks into DESTROOT (merged-/usr layout expected)
  install -D -m 0755 /bin/busybox "$1/usr/bin/busybox"
  local a
  for a in $(/bin/busybox --list-full); do
    case "$a" in usr/bin/busybox | bin/busybox | linuxrc) continue ;; esac
    ln -sfn /usr/bin/busybox "$1/$a"
  done
}
merged_usr() {
  mkdir -p "$1"/usr/{bin,sbin,lib,lib64}
  ln -sfn usr/bin "$1/bin"; ln -sfn usr/sbin "$1/sbin"; ln -sfn usr/lib "$1/lib"; ln -sfn usr/lib64 "$1/lib64"
}

# ---- 1. kernel ------------------------------------------------------------------------------
if fresh "$OUT/vmlinux" "$kernel_key"; then
  log "vmlinux: cached ($KVER)"
else
  log "vmlinux: extracting from /boot/vmlinuz-$KVER"
  python3 "$here/extract-vmlinux.py" "/boot/vmlinuz-$KVER" "$OUT/vmlinux.tmp" > /dev/null
  mv "$OUT/vmlinux.tmp" "$OUT/vmlinux"; echo "$kernel_key" > "$OUT/vmlinux.key"
fi

# ---- 2. tiny initramfs -------------------------------------------------------------------------
if fresh "$OUT/initramfs.cpio.zst" "$initramfs_key"; then
  log "initramfs: cached"
else
  log "initramfs: building"
  T=$OUT/cache/initramfs-tree; rm -rf "$T"; merged_usr "$T"
  mkdir -p "$T"/{proc,sys,dev,etc,newroot}
  busybox_tree "$T"
  INITRD_MODULES=(virtio_pci virtio_blk crc32c_generic ext4)
  copy_modules "$T" "${INITRD_MODULES[@]}"
  printf '%s\n' "${INITRD_MODULES[@]}" > "$T/etc/initramfs-modules"
  install -m 0755 "$here/vm/initramfs-init.sh" "$T/init"
  (cd "$T" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet | zstd -q -T0 -10 > "$OUT/initramfs.cpio.zst.tmp")
  mv "$OUT/initramfs.cpio.zst.tmp" "$OUT/initramfs.cpio.zst"; echo "$initramfs_key" > "$OUT/initramfs.cpio.zst.key"
fi

# ---- 3. base root tree (everything except --add files) ---------------------------------------
B=$OUT/cache/base-tree
if fresh "$B" "$base_key"; then
  log "base root tree: cached"
else
  log "base root tree: building"
  rm -rf "$B" "$B.key"; merged_usr "$B"
  mkdir -p "$B"/{proc,sys,dev,run,tmp,var,opt,mnt,local,root,etc,.bottlerocket,usr/local/bin,usr/local/sbin}
  chmod 1777 "$B/tmp"; chmod 0700 "$B/root"
  busybox_tree "$B"
  for b in "${BINS[@]}"; do
    p=$(command -v "$b" 2>/dev/null || true)
    [ -n "$p" ] || p=$(PATH=/usr/sbin:/sbin:$PATH command -v "$b" 2>/dev/null || true)
    [ -n "$p" ] || die "$b not found on the host: run images/setup-host.sh"
    case "$b" in mke2fs) d=usr/sbin ;; *) d=usr/bin ;; esac
    rm -f "$B/$d/$b"; install -m 0755 "$(readlink -f "$p")" "$B/$d/$b"
    # shared libraries (ldd prints "name => /path (addr)" or "/path (addr)")
    for lib in $(ldd "$p" 2>/dev/null | grep -o '/[^ ]*' || true); do
      [ -e "$B$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$B$lib"
    done
  done
  for l in mkfs.ext4 mkfs.ext3 mkfs.ext2; do ln -sfn mke2fs "$B/usr/sbin/$l"; done
  # /etc (copied into a tmpfs at boot by /sbin/init)
  install -D -m 0644 /etc/ssl/openssl.cnf "$B/etc/ssl/openssl.cnf"
  mkdir -p "$B/usr/lib/ssl"; ln -sfn /etc/ssl/openssl.cnf "$B/usr/lib/ssl/openssl.cnf"
  [ -e /etc/mke2fs.conf ] && install -m 0644 /etc/mke2fs.conf "$B/etc/mke2fs.conf"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$B/etc/passwd"
  printf 'root:x:0:\ntty:x:5:\nnogroup:x:65534:\n' > "$B/etc/group"
  printf '127.0.0.1 localhost certrotor-e2e\n::1 localhost\n' > "$B/etc/hosts"
  echo certrotor-e2e > "$B/etc/hostname"
  printf 'hosts: files dns\n' > "$B/etc/nsswitch.conf"
  : > "$B/etc/resolv.conf"
  printf 'NAME=Bottlerocket\nID=bottlerocket\nPRETTY_NAME="certrotor e2e test VM (Bottlerocket-like)"\nVARIANT_ID=certrotor-e2e\nVERSION_ID=0.0.0\n' > "$B/etc/os-release"
  install -D -m 0644 "$here/vm/containerd-config.toml" "$B/etc/containerd/config.toml"
  mapfile -t mods < <(awk '!/^#/ && NF {print $1}' "$here/vm/modules.txt")
  copy_modules "$B" "${mods[@]}"
  awk '!/^#/ && $2 == "load" {print $1}' "$here/vm/modules.txt" > "$B/etc/e2e-modules"
  rm -f "$B/usr/sbin/init"; install -m 0755 "$here/vm/init.sh" "$B/usr/sbin/init"
  install -D -m 0644 "$here/vm/e2e-lib.sh" "$B/usr/lib/certrotor-e2e/lib.sh"
  echo "$base_key" > "$B.key"
fi

# ---- 4. root image = base tree + --add files ----------------------------------------------------
if fresh "$OUT/rootfs.ext4" "$root_key"; then
  log "rootfs.ext4: cached"
else
  log "rootfs.ext4: building (${#adds[@]} added file(s))"
  R=$OUT/cache/root-tree; rm -rf "$R"
  cp -al "$B" "$R"    # hard links: cheap; added files are unlinked first, never written through
  for a in "${adds[@]}"; do
    src=${a%%:*} dest=${a#*:}
    case "$dest" in */) dest=$dest$(basename "$src") ;; esac
    mkdir -p "$(dirname "$R$dest")"
    rm -f "$R$dest"; cp "$src" "$R$dest"; chmod 0755 "$R$dest"
    # a dynamically linked addition brings its shared libraries (static ones list none)
    for lib in $(ldd "$src" 2>/dev/null | grep -o '/[^ ]*' || true); do
      [ -e "$R$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$R$lib"
    done
  done
  size_mb=$(( $(du -sm "$R" | cut -f1) * 12 / 10 + 32 ))
  rm -f "$OUT/rootfs.ext4.tmp"; truncate -s "${size_mb}M" "$OUT/rootfs.ext4.tmp"
  # no journal: the image is only ever mounted read-only
  mkfs.ext4 -q -F -L vmroot -O ^has_journal -E root_owner=0:0 -d "$R" "$OUT/rootfs.ext4.tmp"
  rm -rf "$R"
  mv "$OUT/rootfs.ext4.tmp" "$OUT/rootfs.ext4"; echo "$root_key" > "$OUT/rootfs.ext4.key"
fi

# ---- 5. blank /local disk (local-base) --------------------------------------------------------
if fresh "$OUT/local-base.img" "$local_key"; then
  log "local-base.img: cached"
else
  log "local-base.img: building"
  rm -f "$OUT/local-base.img.tmp"; truncate -s 4G "$OUT/local-base.img.tmp"
  mkfs.ext4 -q -F -L local -E root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0,nodiscard "$OUT/local-base.img.tmp"
  mv "$OUT/local-base.img.tmp" "$OUT/local-base.img"; echo "$local_key" > "$OUT/local-base.img.key"
fi

cat > "$OUT/vm.env.tmp" <<ENV
KVER=$KVER
VMLINUX=$OUT/vmlinux
INITRAMFS=$OUT/initramfs.cpio.zst
ROOTFS=$OUT/rootfs.ext4
LOCAL_BASE=$OUT/local-base.img
ROOT_KEY=$root_key
ENV
mv "$OUT/vm.env.tmp" "$OUT/vm.env"
printf '%s' "$add_desc" > "$OUT/added-files.txt"
log "done in $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t_start }") s -> $OUT/vm.env"
