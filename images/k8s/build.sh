#!/usr/bin/env bash
# Builds the real Kubernetes v1.20.2 binaries the tests run (kubeadm, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, and the pod sandbox `pause`) from Debian
# bookworm's source package `kubernetes`, whose orig tarball is the complete upstream v1.20.2
# tree with vendor/. No registry ships these binaries; this is the only network use: apt fetching
# Debian's source package from the archive the machine already uses.
#
#   images/k8s/build.sh                 build (or reuse the cache) and print the bin dir
#   images/k8s/build.sh --print-bin-dir print the bin dir only (no build; exits 1 if not built)
#
# The cache lives in /var/cache/certrotor/kubernetes-v1.20.2/ (CERTROTOR_K8S_CACHE overrides):
# bin/ holds the binaries, bin/.complete (written last) names the version and the sha256 of this
# script; a bin/ without a matching marker is rebuilt from scratch, so a half-built cache is never
# used. Go 1.19 from Debian (golang-go) builds in GOPATH mode with vendor/, no module proxy.
# Cold build on 2 cores: about 11 minutes (see README.md).
set -euo pipefail

DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
K8S_VERSION=v1.20.2
K8S_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56 # upstream tag v1.20.2
ORIG=kubernetes_1.20.5+really1.20.2.orig.tar.gz
ORIG_SHA256=b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc
PAUSE_VERSION=3.4.1 # build/pause/Makefile TAG of v1.20.2
GO_BINARIES=(kubeadm kube-apiserver kube-controller-manager kube-scheduler kubelet)
REFLECT2_DEB=golang-github-modern-go-reflect2-dev
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

cache=${CERTROTOR_K8S_CACHE:-/var/cache/certrotor/kubernetes-$K8S_VERSION}
bin=$cache/bin
marker=$bin/.complete
self=$(readlink -f "$0")
key="kubernetes $K8S_VERSION deb $DEB_VERSION script-sha256 $(sha256sum "$self" | cut -d' ' -f1)"

die() { echo "images/k8s/build.sh: error: $*" >&2; exit 1; }
log() { echo "images/k8s/build.sh: $*" >&2; }

complete() { [ -f "$marker" ] && [ "$(cat "$marker")" = "$key" ]; }

case "${1:-}" in
  --print-bin-dir)
    complete || die "no complete build in $bin (run images/k8s/build.sh)"
    echo "$bin"; exit 0 ;;
  "") ;;
  -h|--help) sed -n '2,16p' "$self"; exit 0 ;;
  *) die "unknown argument '$1' (use --print-bin-dir or no argument)" ;;
esac

mkdir -p "$cache"
# One build at a time (tests may call this while a build runs): wait for the lock.
exec 9> "$cache/.lock"
flock 9

if complete; then
  log "cached build is complete ($key)"
  echo "$bin"; exit 0
fi

for t in go:golang-go gcc:gcc make:make rsync:rsync apt-get:apt dpkg-source:dpkg-dev sha256sum:coreutils flock:util-linux; do
  command -v "${t%%:*}" > /dev/null || die "'${t%%:*}' is missing: install the Debian package '${t#*:}' (images/setup-host.sh)"
done
[ -f "$REFLECT2_SRC/reflect2.go" ] || die "$REFLECT2_SRC is missing: install the Debian package '$REFLECT2_DEB' (images/setup-host.sh)"
[ "$(id -u)" = 0 ] || die "must run as root (apt-get source with a private apt state, writes to $cache)"

timings=()
step_start=0
step() { step_start=$(date +%s); log "== $*"; }
step_done() { local s=$(( $(date +%s) - step_start )); timings+=("$1 ${s}s"); log "   $1 took ${s}s"; }
total_start=$(date +%s)

# A stale bin/ (no marker, or another script version) goes first, so it can never be mixed in.
rm -rf "$bin"

# --- 1. fetch the source package (orig tarball, cached and verified by sha256) ---
dl=$cache/download
mkdir -p "$dl"
if [ -f "$dl/$ORIG" ] && [ "$(sha256sum "$dl/$ORIG" | cut -d' ' -f1)" = "$ORIG_SHA256" ]; then
  log "source tarball already downloaded and verified"
else
  step "fetch Debian source package kubernetes=$DEB_VERSION"
  rm -f "$dl/$ORIG"
  # A temporary deb-src entry in a private apt configuration (own sources list and lists dir):
  # the machine's /etc/apt is never touched, and the entry is removed even on failure.
  aptdir=$(mktemp -d "$cache/apt.XXXXXX")
  trap 'rm -rf "$aptdir"' EXIT
  mkdir -p "$aptdir/lists/partial" "$aptdir/archives/partial"
  cat > "$aptdir/sources.list" <<SRC
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
SRC
  aptopts=(-o "Dir::Etc::SourceList=$aptdir/sources.list" -o "Dir::Etc::SourceParts=-"
           -o "Dir::State::Lists=$aptdir/lists" -o "Dir::Cache::Archives=$aptdir/archives"
           -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")
  apt-get "${aptopts[@]}" -q update >&2 ||
    die "apt-get update of the temporary deb-src entry failed (network to deb.debian.org?)"
  (cd "$aptdir" && apt-get "${aptopts[@]}" -q source --download-only "kubernetes=$DEB_VERSION" >&2) ||
    die "apt-get source --download-only kubernetes=$DEB_VERSION failed (is bookworm still serving it?)"
  [ -f "$aptdir/$ORIG" ] || die "apt-get source did not produce $ORIG (files: $(ls "$aptdir"))"
  got=$(sha256sum "$aptdir/$ORIG" | cut -d' ' -f1)
  [ "$got" = "$ORIG_SHA256" ] || die "$ORIG has sha256 $got, expected $ORIG_SHA256: refusing to build it"
  mv "$aptdir/$ORIG" "$dl/$ORIG"
  rm -rf "$aptdir"; trap - EXIT
  step_done fetch
fi

# --- 2. unpack into a fresh GOPATH ---
step "unpack $ORIG"
work=$cache/work
gopath=$work/gopath
tree=$gopath/src/k8s.io/kubernetes
rm -rf "$work"
mkdir -p "$tree"
tar -xzf "$dl/$ORIG" -C "$tree" --strip-components=1
[ -f "$tree/cmd/kubeadm/kubeadm.go" ] && [ -d "$tree/vendor/k8s.io/api" ] ||
  die "$ORIG does not hold the Kubernetes tree with vendor/ as expected"
step_done unpack

export GOPATH=$gopath GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0
export GOCACHE=$cache/gocache GOTMPDIR=$work/tmp
mkdir -p "$GOTMPDIR"

# --- 3. vendored reflect2 v1.0.1 breaks at run time with Go >= 1.18: use Debian's 1.0.2 ---
r2=$tree/vendor/github.com/modern-go/reflect2
[ -d "$r2" ] || die "vendor/github.com/modern-go/reflect2 not found in the tree"
rm -f "$r2"/*.go "$r2"/*.s
cp "$REFLECT2_SRC"/*.go "$REFLECT2_SRC"/*.s "$r2"/

# --- 4. generated files (openapi etc. are not in the tarball) ---
step "make generated_files"
(cd "$tree" && make generated_files >&2) || die "make generated_files failed (log above)"
step_done generated_files

# --- 5. the Go binaries, static, with the upstream version stamped in ---
out=$work/out
mkdir -p "$out"
date=$(date -u -d "@$(stat -c %Y "$tree/cmd/kubeadm/kubeadm.go")" +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitCommit=$K8S_COMMIT -X $pkg.gitTreeState=clean"
  ld+=" -X $pkg.gitMajor=1 -X $pkg.gitMinor=20 -X $pkg.buildDate=$date"
done
for b in "${GO_BINARIES[@]}"; do
  step "go build cmd/$b"
  (cd "$tree" && go build -trimpath -ldflags "$ld" \
      -o "$out/$b" "k8s.io/kubernetes/cmd/$b" >&2) || die "go build cmd/$b failed (log above)"
  step_done "$b"
done

# --- 6. pause (the pod sandbox) ---
step "gcc -static pause"
gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_VERSION-certrotor" -o "$out/pause" "$tree/build/pause/linux/pause.c" ||
  die "gcc -static build/pause/linux/pause.c failed"
step_done pause

# --- 7. sanity: each binary runs and says v1.20.2, then publish; the marker goes last ---
"$out/kubeadm" version -o short | grep -qx "$K8S_VERSION" || die "built kubeadm does not report $K8S_VERSION"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  "$out/$b" --version 2>&1 | grep -q "$K8S_VERSION" || die "built $b does not report $K8S_VERSION"
done
mkdir -p "$bin"
for b in "${GO_BINARIES[@]}" pause; do
  install -m 0755 "$out/$b" "$bin/$b"
done
total=$(( $(date +%s) - total_start ))
{ printf '%s\n' "${timings[@]}"; echo "total ${total}s"; } > "$cache/build-times.txt"
sync
echo "$key" > "$marker.tmp" && mv "$marker.tmp" "$marker"
rm -rf "$work"
log "built in ${total}s: $(tr '\n' ' ' < "$cache/build-times.txt")"
echo "$bin"
