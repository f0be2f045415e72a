#!/usr/bin/env bash
# The one test command: installs what the tests need on a fresh Debian machine (as root), then
# runs every check and test: format, lint, unit and integration tests (real openssl and etcd),
# the static build, the demo, and the QEMU end-to-end suite when its images can be built.
# `.ci/run` calls this script; so does a developer: `sudo qemu-tests/test-all.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n=== %s\n' "$*"; }
started=$(date +%s)

step "install test dependencies (Debian packages)"
if [ "$(id -u)" = 0 ]; then
  # Everything the suite needs, the QEMU family pinned to one release; then every tool is
  # checked on PATH and a missing one stops the run naming its package.
  images/setup-host.sh
else
  echo "not root: not installing; checking the tools the suite needs" >&2
  images/setup-host.sh --check-only
fi
step "real Kubernetes v1.20.2 binaries (images/k8s/build.sh: cached; ~11 min cold on 2 cores)"
# kubeadm, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and pause, built
# from Debian's source package; the parity and engine tests run them (CERTROTOR_K8S_BIN).
if [ -z "${CERTROTOR_K8S_BIN:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    CERTROTOR_K8S_BIN=$(images/k8s/build.sh)
  else
    CERTROTOR_K8S_BIN=$(images/k8s/build.sh --print-bin-dir)
  fi
fi
export CERTROTOR_K8S_BIN
ls -l "$CERTROTOR_K8S_BIN"

rustup component add rustfmt clippy >/dev/null 2>&1 || true
rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (agent, bottlerocket)"
cargo test --locked

step "static build"
bin=$(agent/build-static.sh --all)
ls -l "$bin"
ldd "$bin" || true

step "certrotor demo"
"$bin" demo

if [ "${CERTROTOR_SKIP_QEMU:-0}" != 1 ]; then
  step "QEMU end-to-end suite (TCG)"
  cargo test --locked -p qemu-tests -- --test-threads=1
fi

echo
echo "all tests passed in $(( $(date +%s) - started ))s"
