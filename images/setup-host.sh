#!/usr/bin/env bash
# Installs (idempotently) the Debian packages that images/build-vm.sh and the QEMU test
# harness need: QEMU (TCG), the Debian generic kernel (for its vmlinuz + modules), and the
# binaries copied into the VM root image. Debian bookworm; must run as root (or via sudo).
# Usage: images/setup-host.sh
set -euo pipefail

PKGS=(
  qemu-system-x86 qemu-utils        # the VM (TCG) and qemu-img for qcow2 overlays
  linux-image-amd64                 # kernel (vmlinuz -> vmlinux) + modules (9p, ext4, overlay, ...)
  busybox-static                    # the VM's userland (shell, mount, switch_root, ...)
  containerd runc                   # host-container runtime inside the VM (ctr, shim, runc)
  etcd-server etcd-client           # etcd + etcdctl for the scenarios
  openssl                           # test PKI inside the VM and on the host
  kmod cpio zstd e2fsprogs          # modprobe/depmod, initramfs packing, mkfs.ext4 -d
  python3                           # images/*.py helpers
  musl-tools                        # musl-gcc for C deps (aws-lc-sys) of the static musl build
)

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for fully installed packages
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-host: all ${#PKGS[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup-host: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup-host: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup-host: done"
