#!/usr/bin/env bash
# Benchmark figures for certrotor (not a test): prints wall times, peak RSS and binary size.
#   agent/bench.sh [RUNS]          (default 20 runs per timing)
# Sections are functions; add new ones (e.g. "renew --all") and call them from main.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-20}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/certrotor-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
case "$WORK" in *[[:space:]]*) echo "error: TMPDIR must not contain spaces" >&2; exit 64 ;; esac

log() { printf '%s\n' "$*" >&2; }

# Median wall time in milliseconds of a command line (split on spaces, no shell), run $RUNS
# times; PREPARE (optional) runs before each run, untimed. hyperfine when installed (without a
# shell, -N: certrotor check takes a few ms), else a bash loop with date +%s%N.
median_ms() {
  local cmd="$1" prepare="${2:-true}"
  if command -v hyperfine >/dev/null 2>&1; then
    local json="$WORK/hyperfine.json"
    hyperfine -N --style none --warmup 2 --runs "$RUNS" --prepare "$prepare" --export-json "$json" -- "$cmd" >/dev/null
    python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["results"][0]["median"]*1000))' "$json"
  else
    local times=() i start end
    for ((i = 0; i < RUNS; i++)); do
      $prepare
      start=$(date +%s%N)
      $cmd >/dev/null 2>&1 || true
      end=$(date +%s%N)
      times+=($(((end - start) / 1000)))
    done
    printf '%s\n' "${times[@]}" | sort -n |
      awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%.2f\n", m/1000}'
  fi
}

# Peak resident set size in KiB of one run (GNU time %M).
peak_rss_kib() {
  if ! /usr/bin/time -f %M -o "$WORK/rss" "$@" >"$WORK/rss.out" 2>&1; then
    log "error: $* failed:"
    cat "$WORK/rss.out" "$WORK/rss" >&2
    return 1
  fi
  tail -n 1 "$WORK/rss"
}

section_build() {
  log "== building the static release binary"
  BIN="$(agent/build-static.sh)"
  file "$BIN" | sed 's/^/   /' >&2 || true
  local stripped="$WORK/certrotor.stripped"
  strip -o "$stripped" "$BIN"
  printf '%-42s %12s bytes\n' "binary size (static, stripped)" "$(stat -c %s "$stripped")"
}

section_lab_init() {
  local alg ms rss dir="$WORK/lab-run"
  for alg in rsa-2048 ecdsa-p256; do
    log "== lab init (stacked, kubeadm, $alg)"
    ms=$(median_ms "$BIN lab init $dir --key-algorithm $alg" "rm -rf $dir")
    rm -rf "$dir"
    rss=$(peak_rss_kib "$BIN" lab init "$dir" --key-algorithm "$alg")
    rm -rf "$dir"
    printf '%-42s %12s ms\n' "lab init $alg wall time (median)" "$ms"
    printf '%-42s %12s KiB\n' "lab init $alg peak RSS" "$rss"
  done
}

section_check() {
  log "== check on a stacked RSA-2048 lab node"
  NODE="$WORK/node"
  "$BIN" lab init "$NODE" --key-algorithm rsa-2048 >/dev/null
  local out ms rss
  for out in table json; do
    # check exits 0 on a fresh lab node; a non-zero exit would make hyperfine fail loudly.
    ms=$(median_ms "$BIN check --root $NODE --output $out")
    rss=$(peak_rss_kib "$BIN" check --root "$NODE" --output "$out")
    printf '%-42s %12s ms\n' "check --output $out wall time (median)" "$ms"
    printf '%-42s %12s KiB\n' "check --output $out peak RSS" "$rss"
  done
}

section_renew() {
  # renew --all on a stacked RSA-2048 node: 11 certificates and kubeconfigs, new keys (as
  # kubeadm) and --reuse-keys. Each timed run gets a fresh copy of the node (untimed prepare).
  local mode ms rss base="$WORK/renew-base" dir="$WORK/renew-run" runs
  "$BIN" lab init "$base" --key-algorithm rsa-2048 --expires-in 30d >/dev/null
  for mode in "" "--reuse-keys"; do
    log "== renew --all $mode on a stacked RSA-2048 lab node"
    runs=$RUNS
    RUNS=$(( RUNS < 10 ? RUNS : 10 ))
    ms=$(median_ms "$BIN renew --root $dir --all $mode" "sh -c 'rm -rf $dir && cp -a $base $dir'")
    RUNS=$runs
    rm -rf "$dir" && cp -a "$base" "$dir"
    rss=$(peak_rss_kib "$BIN" renew --root "$dir" --all $mode)
    printf '%-42s %12s ms
' "renew --all ${mode:-(new keys)} wall (median)" "$ms"
    printf '%-42s %12s KiB
' "renew --all ${mode:-(new keys)} peak RSS" "$rss"
  done
  rm -rf "$dir"
}

main() {
  section_build
  printf '%-42s %12s\n' "runs per timing" "$RUNS"
  printf '%-42s %12s\n' "timer" "$(command -v hyperfine >/dev/null && echo hyperfine || echo 'bash loop')"
  section_check
  section_lab_init
  section_renew
}

main "$@"
