#!/usr/bin/env bash
# Figures of the metrics endpoint (issue 12.6; not a test): response time of
# `daemon --metrics-address` on a lab node (median and p99 over REQUESTS requests, while the
# daemon passes) and the daemon's resident memory after PASSES passes against the same node.
#   agent/metrics-bench.sh [PASSES] [REQUESTS]     (defaults 1000 and 1000)
# CERTROTOR_BIN picks the binary (default target/release/certrotor, built when missing).
# The CI test metrics_daemon_memory_does_not_grow_over_passes asserts the memory bound.
set -euo pipefail
cd "$(dirname "$0")/.."
PASSES="${1:-1000}"
REQUESTS="${2:-1000}"
BIN="${CERTROTOR_BIN:-target/release/certrotor}"
[ -x "$BIN" ] || cargo build --release -p certrotor >&2
command -v curl >/dev/null || { echo "error: curl is needed (apt-get install -y curl)" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/certrotor-metrics-bench.XXXXXX")"
PID=""
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

"$BIN" lab init "$WORK/node" --expires-in 200d --key-algorithm ecdsa-p256 >/dev/null
# start_daemon INTERVAL: a daemon on the lab node; sets PID and URL.
start_daemon() {
  "$BIN" daemon --root "$WORK/node" --platform none --cluster off --interval "$1" \
    --metrics-address 127.0.0.1:0 2>"$WORK/daemon.log" &
  PID=$!
  local addr="" i
  for i in $(seq 1 100); do
    addr="$(sed -n 's|.*metrics served on http://\([^/]*\)/metrics.*|\1|p' "$WORK/daemon.log" | head -1)"
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "error: the daemon did not serve metrics" >&2; cat "$WORK/daemon.log" >&2; exit 1; }
  URL="http://$addr/metrics"
}
stop_daemon() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; PID=""; }
passes() { curl -s --max-time 10 "$URL" | awk '/^certrotor_passes_total/ {s += $2} END {print s + 0}'; }
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$PID/status"; }
wait_passes() {
  local deadline=$((SECONDS + 900))
  while [ "$(passes)" -lt "$1" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "error: fewer than $1 passes in 900 s" >&2; exit 1; }
    sleep 0.2
  done
}
# $REQUESTS scrapes, one after the other: their median, p99 and slowest response time.
response_times() {
  for _ in $(seq 1 "$REQUESTS"); do
    curl -s -o /dev/null --max-time 10 -w '%{time_total}\n' "$URL"
  done | sort -n | awk '{a[NR] = $1} END {
    printf "metrics endpoint: %d requests, median %.2f ms, p99 %.2f ms, max %.2f ms\n",
      NR, a[int(NR / 2) + 1] * 1000, a[int(NR * 0.99)] * 1000, a[NR] * 1000 }'
}
# Response time: an idle daemon (its pass done), as between hourly passes; then while it passes
# back to back.
start_daemon 1h
wait_passes 1
echo "idle daemon:"
response_times
stop_daemon
start_daemon 1ms
wait_passes 100
RSS_100="$(rss)"
echo "daemon passing back to back:"
response_times
wait_passes "$PASSES"
echo "daemon RSS: $RSS_100 KiB after 100 passes, $(rss) KiB after $(passes) passes"
echo "page: $(curl -s "$URL" | wc -c) bytes, $(curl -s "$URL" | grep -vc '^#') samples"
