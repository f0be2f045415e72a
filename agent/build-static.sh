#!/usr/bin/env bash
# Builds a static `certrotor` (and, with --all, the static test doubles of bottlerocket/testbed/).
# Prints the binary path.
#   agent/build-static.sh [--all] [--print-dir] [--arch amd64|arm64]
# amd64 (default): musl where the target can be installed, else glibc with +crt-static.
# arm64: cross-compiled for aarch64-unknown-linux-musl, musl only: rustup's target, and for the
# C code of aws-lc-sys Debian's aarch64 cross gcc (gcc-aarch64-linux-gnu) with Debian's arm64
# musl (musl-dev:arm64, whose aarch64-linux-musl-gcc wrapper points that gcc at musl's headers);
# the same gcc links, against Rust's own musl (self-contained) as for amd64.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(-p certrotor)
print_dir=false
arch=amd64
while [ $# -gt 0 ]; do
  case "$1" in
    --all) packages+=(-p testbed) ;;
    --print-dir) print_dir=true ;;
    --arch) [ $# -ge 2 ] || { echo "usage: $0 [--all] [--print-dir] [--arch amd64|arm64]" >&2; exit 64; }
            arch=$2; shift ;;
    *) echo "usage: $0 [--all] [--print-dir] [--arch amd64|arm64]" >&2; exit 64 ;;
  esac
  shift
done
case "$arch" in
  amd64)
    target=x86_64-unknown-linux-musl
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      rustup target add "$target" >/dev/null 2>&1 || target=""
    fi
    if [ -n "$target" ] && ! command -v musl-gcc >/dev/null 2>&1; then
      # aws-lc-sys needs a musl C compiler for the musl target.
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null 2>&1 || target=""
      else
        target=""
      fi
    fi
    if [ -z "$target" ]; then
      target=x86_64-unknown-linux-gnu
      export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
    fi
    machine="Advanced Micro Devices X86-64"
    ;;
  arm64)
    target=aarch64-unknown-linux-musl
    if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      rustup target add "$target" >/dev/null ||
        { echo "error: rustup cannot add the target $target" >&2; exit 1; }
    fi
    for t in aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu aarch64-linux-musl-gcc:musl-dev:arm64 \
             readelf:binutils; do
      command -v "${t%%:*}" >/dev/null 2>&1 || {
        echo "error: ${t%%:*} is missing: install the Debian package '${t#*:}' (images/setup-host.sh)" >&2
        exit 1
      }
    done
    export CC_aarch64_unknown_linux_musl=aarch64-linux-musl-gcc
    export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
    machine="AArch64"
    ;;
  *) echo "error: --arch $arch: expected amd64 or arm64" >&2; exit 64 ;;
esac
cargo build --release --locked --target "$target" "${packages[@]}" >&2
dir="${CARGO_TARGET_DIR:-target}/$target/release"
bin="$dir/certrotor"
# Static: no program interpreter and no shared library (readelf reads any architecture; ldd
# prints "statically linked" (static-pie) or "not a dynamic executable" for static files).
if ! readelf -h "$bin" | grep -q "Machine: *$machine"; then
  echo "error: $bin is not a $arch executable:" >&2
  readelf -h "$bin" | grep Machine >&2
  exit 1
fi
if readelf -lW "$bin" | grep -q 'program interpreter' || readelf -dW "$bin" | grep -q '(NEEDED)'; then
  echo "error: $bin is dynamically linked:" >&2
  readelf -lW "$bin" | grep 'program interpreter' >&2 || true
  readelf -dW "$bin" | grep NEEDED >&2 || true
  exit 1
fi
if [ "$arch" = amd64 ] && ! ldd "$bin" 2>&1 | grep -Eq 'statically linked|not a dynamic executable'; then
  echo "error: $bin is dynamically linked:" >&2
  ldd "$bin" >&2
  exit 1
fi
# The shipped binary holds no test machinery: the failpoint code (cargo feature `failpoints`,
# which reads CERTROTOR_FAILPOINT) must not be in it.
if grep -aq CERTROTOR_FAILPOINT "$bin"; then
  echo "error: $bin contains failpoint code (built with --features failpoints?)" >&2
  exit 1
fi
# And it stays small: under 4 MiB.
size=$(stat -c %s "$bin")
if [ "$size" -ge $((4 * 1024 * 1024)) ]; then
  echo "error: $bin is $size bytes, not under 4 MiB" >&2
  exit 1
fi
if $print_dir; then echo "$dir"; else echo "$bin"; fi
