#!/usr/bin/env bash
# Installs (idempotently) the Debian packages that the whole test suite needs: the unit and
# integration tests (openssl, etcd, containerd + runc), images/build-vm.sh and the QEMU harness
# (QEMU under TCG, the Debian kernel, the VM's userland), the static builds (musl-tools; for
# arm64 the aarch64 cross gcc and Debian's arm64 musl, which needs dpkg's foreign architecture
# arm64), the image tests (skopeo, docker-registry, qemu-user-static), and the Go toolchain that
# builds Kubernetes from Debian's source package (images/k8s/build.sh).
# Then checks that every tool the suite calls is on PATH, naming the package of any that is not.
# Debian bookworm; must run as root (or via sudo). Usage: images/setup-host.sh [--check-only]
set -euo pipefail

PKGS=(
  qemu-system-x86 qemu-utils        # the VM (TCG) and qemu-img for qcow2 overlays
  linux-image-amd64                 # kernel (vmlinuz -> vmlinux) + modules (9p, ext4, overlay, ...)
  busybox-static                    # the VM's userland (shell, mount, switch_root, ...)
  containerd runc                   # container runtime on the host tests and inside the VM
  etcd-server etcd-client           # etcd + etcdctl
  openssl                           # the independent verifier, test PKI
  kmod cpio zstd e2fsprogs          # modprobe/depmod, initramfs packing, mkfs.ext4 -d
  python3                           # images/*.py helpers
  musl-tools                        # musl-gcc for C deps (aws-lc-sys) of the static musl build
  time iproute2                     # /usr/bin/time for peak RSS; ip netns
  hyperfine binutils                # agent/bench.sh timings; strings (no failpoints in the shipped binary)
  valgrind                          # agent/parser-growth.sh counts instructions (callgrind)
  golang-go make rsync gcc libc6-dev # building Kubernetes v1.20.2 from Debian's source package
  dpkg-dev                          # apt-get source
  golang-github-modern-go-reflect2-dev # reflect2 1.0.2 replacing the vendored 1.0.1 (Go >= 1.18)
  prometheus                        # promtool + a real Prometheus for the metrics tests (bookworm main only)
  gcc-aarch64-linux-gnu musl-dev:arm64 # the arm64 static build (agent/build-static.sh --arch arm64)
  skopeo docker-registry            # push/pull the OCI image index to/from a real registry on loopback
  qemu-user-static                  # run the arm64 binary of the image on this amd64 machine
)

# tool -> package that provides it; checked after installing.
TOOLS=(
  qemu-img:qemu-utils qemu-system-x86_64:qemu-system-x86 containerd:containerd ctr:containerd
  runc:runc etcd:etcd-server etcdctl:etcd-client openssl:openssl mkfs.ext4:e2fsprogs
  busybox:busybox-static cpio:cpio zstd:zstd depmod:kmod python3:python3 musl-gcc:musl-tools
  go:golang-go make:make rsync:rsync gcc:gcc ip:iproute2 dpkg-source:dpkg-dev
  hyperfine:hyperfine strings:binutils valgrind:valgrind promtool:prometheus prometheus:prometheus
  chattr:e2fsprogs lsattr:e2fsprogs flock:util-linux setpriv:util-linux mount:mount findmnt:util-linux
  readelf:binutils aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu aarch64-linux-musl-gcc:musl-dev:arm64
  skopeo:skopeo docker-registry:docker-registry qemu-aarch64-static:qemu-user-static
  perl:perl-base
)

check_tools() {
  local bad=0 t tool pkg
  for t in "${TOOLS[@]}"; do
    tool=${t%%:*}; pkg=${t#*:}
    if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$tool" >/dev/null 2>&1; then
      echo "setup-host: '$tool' is not on PATH: install the Debian package '$pkg' (apt-get install $pkg)" >&2
      bad=1
    fi
  done
  [ -x /usr/bin/time ] || { echo "setup-host: /usr/bin/time is missing: install the Debian package 'time'" >&2; bad=1; }
  ls /boot/vmlinuz-* >/dev/null 2>&1 || { echo "setup-host: no /boot/vmlinuz-*: install the Debian package 'linux-image-amd64'" >&2; bad=1; }
  return $bad
}

if [ "${1:-}" = --check-only ]; then
  [ -x /var/cache/certrotor/kubernetes-client/usr/bin/kubectl ] || echo "setup-host: kubectl v1.20.2 is not unpacked in /var/cache/certrotor/kubernetes-client: run images/setup-host.sh as root (it unpacks Debian's kubernetes-client there)" >&2
  check_tools
  exit
fi

missing=()
for p in "${PKGS[@]}"; do
  # dpkg-query prints "install ok installed" only for fully installed packages
  if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup-host: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive

# QEMU's packages must come from one release. A machine may ship qemu-utils from
# bookworm-backports (10.x); installing bookworm's qemu-system-x86 (7.2) beside it conflicts and
# apt removes qemu-utils. So the whole family is installed at qemu-system-x86's candidate version,
# together, downgrading a backports qemu-utils where there is one (qemu-system-data is
# architecture-independent with its own version: apt picks the one that fits).
qemu_family=(qemu-system-x86 qemu-system-common qemu-utils)
qemu_args=()
if [ ${#missing[@]} -gt 0 ] || ! check_tools >/dev/null 2>&1; then
  # musl-dev:arm64 is a package of the arm64 architecture (multiarch): apt lists arm64 packages
  # only once dpkg knows the architecture.
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "setup-host: adding the foreign architecture arm64 (for musl-dev:arm64)"
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -q
  qv=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/{print $2}')
  if [ -z "$qv" ] || [ "$qv" = "(none)" ]; then
    echo "setup-host: apt has no candidate for qemu-system-x86 (is bookworm main in the sources?)" >&2
    exit 1
  fi
  for p in "${qemu_family[@]}"; do
    if [ "$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)" != "$qv" ]; then
      qemu_args+=("$p=$qv")
    fi
  done
  rest=()
  for p in "${missing[@]}"; do
    case " ${qemu_family[*]} " in *" $p "*) ;; *) rest+=("$p") ;; esac
  done
  if [ ${#qemu_args[@]} -gt 0 ] || [ ${#rest[@]} -gt 0 ]; then
    echo "setup-host: installing ${qemu_args[*]} ${rest[*]}"
    $SUDO apt-get install -y -q --no-install-recommends --allow-downgrades "${qemu_args[@]}" "${rest[@]}"
  fi
else
  echo "setup-host: all ${#PKGS[@]} packages already installed"
fi
# Debian starts etcd and containerd on install where systemd runs; the tests start their own.
$SUDO systemctl stop etcd 2>/dev/null || true
# Likewise Prometheus (it would listen on every address); the metrics tests start their own on
# loopback.
$SUDO systemctl disable --now prometheus 2>/dev/null || true
# And docker-registry (Debian's unit serves :5000 on every address); the image tests start their
# own on a free 127.0.0.1 port.
$SUDO systemctl disable --now docker-registry 2>/dev/null || true
check_tools

# kubectl v1.20.2, the client of the control plane under test (the platform tests and the QEMU
# scenarios list namespaces and read objects back with it): Debian's kubernetes-client package,
# unpacked into a cache rather than installed, because /usr/bin/kubectl may belong to another
# package (Google's Cloud SDK ships one). The tests find it there (CERTROTOR_KUBECTL overrides).
KUBECTL_DIR=/var/cache/certrotor/kubernetes-client
kc_version=$(apt-cache policy kubernetes-client | awk '/Candidate:/{print $2}')
if [ -z "$kc_version" ] || [ "$kc_version" = "(none)" ]; then
  $SUDO apt-get update -q
  kc_version=$(apt-cache policy kubernetes-client | awk '/Candidate:/{print $2}')
fi
case "$kc_version" in
  *1.20.2*) ;;
  *) echo "setup-host: apt offers kubernetes-client '$kc_version', not 1.20.2 (is bookworm main in the sources?)" >&2; exit 1 ;;
esac
if [ "$(cat "$KUBECTL_DIR/.version" 2>/dev/null)" != "$kc_version" ] || ! [ -x "$KUBECTL_DIR/usr/bin/kubectl" ]; then
  echo "setup-host: unpacking kubernetes-client $kc_version into $KUBECTL_DIR"
  kc_tmp=$(mktemp -d); chmod 0755 "$kc_tmp"
  (cd "$kc_tmp" && $SUDO apt-get download -q "kubernetes-client=$kc_version")
  $SUDO rm -rf "$KUBECTL_DIR"; $SUDO mkdir -p "$KUBECTL_DIR"
  $SUDO dpkg-deb -x "$kc_tmp"/kubernetes-client_*.deb "$KUBECTL_DIR"
  echo "$kc_version" | $SUDO tee "$KUBECTL_DIR/.version" > /dev/null
  rm -rf "$kc_tmp"
fi
"$KUBECTL_DIR/usr/bin/kubectl" version --client > /dev/null ||
  { echo "setup-host: $KUBECTL_DIR/usr/bin/kubectl does not run" >&2; exit 1; }
echo "setup-host: done"
