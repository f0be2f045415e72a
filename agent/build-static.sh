#!/usr/bin/env bash
# Builds a static `certrotor` (and, with --all, the static test doubles of bottlerocket/testbed/).
# musl where the target can be installed, else glibc with +crt-static. Prints the binary path.
#   agent/build-static.sh [--all] [--print-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(-p certrotor)
print_dir=false
for arg in "$@"; do
  case "$arg" in
    --all) packages+=(-p testbed) ;;
    --print-dir) print_dir=true ;;
    *) echo "usage: $0 [--all] [--print-dir]" >&2; exit 64 ;;
  esac
done
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
cargo build --release --locked --target "$target" "${packages[@]}" >&2
dir="${CARGO_TARGET_DIR:-target}/$target/release"
# ldd prints "statically linked" (static-pie) or "not a dynamic executable" for static files.
if ! ldd "$dir/certrotor" 2>&1 | grep -Eq 'statically linked|not a dynamic executable'; then
  echo "error: $dir/certrotor is dynamically linked:" >&2
  ldd "$dir/certrotor" >&2
  exit 1
fi
if $print_dir; then echo "$dir"; else echo "$dir/certrotor"; fi
