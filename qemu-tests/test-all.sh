#!/usr/bin/env bash
# The one test command: installs what the tests need on a fresh Debian machine (as root), then
# runs every check and test: format, lint, unit and integration tests (real openssl and etcd),
# the static build, the demo, and the QEMU end-to-end suite when its images can be built.
# `.ci/run` calls this script; so does a developer: `sudo qemu-tests/test-all.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
step() { printf '\n=== [%ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }

# Every process this run starts carries this mark in its environment. When the run ends, however
# it ends, whatever still carries it (a test's leftover etcd, daemon or VM) is named and killed:
# nothing outlives the run, holds its output open or takes the next run's ports.
export CERTROTOR_TEST_RUN="test-all-$$-$started"
leftovers() {
  local pid found=0
  for pid in $(grep -lsz "^CERTROTOR_TEST_RUN=$CERTROTOR_TEST_RUN\$" /proc/[0-9]*/environ 2>/dev/null |
               cut -d/ -f3); do
    [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
    grep -qs . "/proc/$pid/cmdline" || continue
    echo "test-all: left running by a test, killed: $pid $(tr '\0' ' ' < "/proc/$pid/cmdline" | cut -c1-160)" >&2
    kill -KILL "$pid" 2>/dev/null || true
    found=1
  done
  return $found
}
trap 'leftovers || true' EXIT

# Each phase is bounded (timeout signals its whole process group), so that a hung test fails
# the run with a message naming the phase instead of running into CI's limit.
bounded() {
  local minutes=$1; shift
  local rc=0
  timeout --kill-after=30 "${minutes}m" "$@" || rc=$?
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "test-all: '$*' did not finish within ${minutes} min; stopped (see the last test named above)" >&2
  fi
  return "$rc"
}

step "install test dependencies (Debian packages)"
if [ "$(id -u)" = 0 ]; then
  # Everything the suite needs, the QEMU family pinned to one release; then every tool is
  # checked on PATH and a missing one stops the run naming its package.
  images/setup-host.sh
else
  echo "not root: not installing; checking the tools the suite needs" >&2
  images/setup-host.sh --check-only
fi
step "real Kubernetes v1.20.2 binaries (images/k8s/build.sh: cached; ~5-11 min cold on 2 cores)"
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

# Cargo's target folder is a cache outside the clone, rebuilt when absent: a fresh clone reuses
# the dependencies the run before it compiled and compiles its own crates again (cargo keys
# a path crate's artifacts by its path and its sources' times, and a clone's files are newer
# than anything built before it). A folder that outgrew 20 GiB is emptied first.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    CARGO_TARGET_DIR=/var/cache/certrotor/cargo-target
  else
    CARGO_TARGET_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/certrotor/cargo-target
  fi
fi
export CARGO_TARGET_DIR
mkdir -p "$CARGO_TARGET_DIR"
if [ "$(du -sm "$CARGO_TARGET_DIR" | cut -f1)" -gt 20480 ]; then
  echo "test-all: $CARGO_TARGET_DIR holds over 20 GiB: emptied" >&2
  rm -rf "$CARGO_TARGET_DIR" && mkdir -p "$CARGO_TARGET_DIR"
fi
echo "cargo target folder (cache): $CARGO_TARGET_DIR"

rustup component add rustfmt clippy >/dev/null 2>&1 || true
rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 || true
rustup target add aarch64-unknown-linux-musl >/dev/null 2>&1 || true

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -D warnings (with and without the test-only failpoints)"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --workspace --all-targets --locked --features certrotor/failpoints -- -D warnings

step "the library's module graph: no import circle (../shared/tools/module-graph.py)"
# agent/tests/layout.rs checks the stage order itself; this prints the graph, its circles and the
# functions over 80 lines, and fails on a circle. The tool sits beside the clone, not in it.
graph_tool=""
for g in "$PWD/../shared/tools/module-graph.py" /work/shared/tools/module-graph.py; do
  if [ -f "$g" ]; then graph_tool=$g; break; fi
done
if [ -n "$graph_tool" ]; then
  python3 "$graph_tool" agent/src
else
  echo "NOT RUN: module-graph.py is not beside this clone (../shared/tools); agent/tests/layout.rs still checks the stage order"
fi

step "cargo test (agent, bottlerocket; certrotor built with its test-only failpoints)"
# The integration tests run the binary and crash it at failpoints: it must have them (a crash
# test against a binary without them fails, naming the feature).
# Four tests at a time on two cores: the suite keeps both cores about 90 % busy (the real
# apiserver, etcd and certrotor's debug binary), and four tests fill the gaps while some wait
# for a component to reload or restart. Every wait is a bound on a condition, not a sleep, so
# the tests hold under CPU contention (they pass at load 12-17).
bounded 40 cargo test --locked --features certrotor/failpoints -- --test-threads=4

step "static build (musl, under 4 MiB, no failpoint code: checked by build-static.sh)"
bin=$(agent/build-static.sh --all)
ls -l "$bin"
if strings "$bin" | grep -q CERTROTOR_FAILPOINT; then
  echo "error: the shipped binary $bin contains failpoint code" >&2
  exit 1
fi
ldd "$bin" || true

step "readers of untrusted bytes stay linear (agent/parser-growth.sh: instructions, not seconds)"
agent/parser-growth.sh --check "$bin"

step "certrotor demo"
"$bin" demo

step "the image as users pull it: OCI index linux/amd64 + linux/arm64 (arm64 cross-compiled), deterministic, pushed to a loopback registry, pulled by digest, both binaries run"
# bottlerocket/packaging/build-image.sh, then qemu-tests/tests/image_registry.rs (no VM): skopeo,
# docker-registry, qemu-aarch64-static. The smoke scenario below pulls the same index in its VM.
bounded 30 bottlerocket/packaging/build-image.sh target/certrotor-oci.tar
bounded 20 cargo test --locked -p qemu-tests --test image_registry

if [ "${CERTROTOR_SKIP_QEMU:-0}" != 1 ]; then
  step "QEMU end-to-end suite (TCG)"
  # --no-fail-fast: a failed scenario does not keep the others from running and reporting.
  bounded 70 cargo test --locked --no-fail-fast -p qemu-tests -- --test-threads=1 \
    --skip image_index_pushed_pulled_by_digest_and_run_on_both_architectures
fi

step "no test left a process running"
if ! leftovers; then
  echo "test-all: the tests above left processes running (listed above): a test must stop what it starts" >&2
  exit 1
fi

echo
echo "all tests passed in $(( $(date +%s) - started ))s"
