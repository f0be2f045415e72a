#!/usr/bin/env bash
# Growth benchmark of certrotor's YAML reading (issue 30.5; not a test: it prints, it asserts
# nothing). `check` reads admin.conf and the kube-apiserver manifest through the shape check
# (kubeconfig::check_yaml_shape) and, when that accepts, the YAML parser. For each hostile
# family of the campaign (an apostrophe or a quote inside a flow sequence hiding the brackets
# after it, a plain scalar continued over lines, deep flow maps, block indicators, aliases) and
# for a sound kubeconfig with many users, at sizes from 16 KiB to just under the 1 MiB read limit, it prints the
# median wall time of `check` and the time per KiB: flat (linear) when every hostile document
# is refused by the shape check in one pass. Before the fix, the apostrophe family took 35 s at
# 122 KB and about 40 min at 1 MiB (quadratic).
#   agent/yaml-bench.sh [BINARY] [RUNS]   (default target/release/certrotor if built, else
#                                          target/debug/certrotor; 5 runs per point)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-}"
if [ -z "$BIN" ]; then
  BIN=target/release/certrotor
  [ -x "$BIN" ] || BIN=target/debug/certrotor
fi
RUNS="${2:-5}"
[ -x "$BIN" ] || { echo "error: no certrotor binary at '$BIN': cargo build -p certrotor first" >&2; exit 64; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/certrotor-yaml-bench.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
NODE="$WORK/node"
"$BIN" lab init "$NODE" --key-algorithm ecdsa-p256 >/dev/null 2>&1
cp "$NODE/etc/kubernetes/admin.conf" "$WORK/admin.conf.orig"

# Writes a document of family $1 and about $2 bytes to $3.
document() {
  python3 - "$1" "$2" "$3" "$WORK/admin.conf.orig" <<'EOF'
import sys
family, size, out, orig = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if family == "apostrophe":
    doc = "a: [x 'y, " + "[" * size + "\n"
elif family == "quote":
    doc = 'a: [x "y, ' + "[" * size + "\n"
elif family == "continued":
    doc = "a: [x\n 'y, " + "[" * size + "\n"
elif family == "flow-map":
    doc = "a: " + "{k: x 'y, b: " * (size // 12) + "\n"
elif family == "indicators":
    doc = "- " * (size // 2) + "x\n"
elif family == "aliases":
    doc = "a: [*x, " * (size // 8) + "\n"
elif family == "sound":
    text = open(orig).read()
    head, users = text.split("users:\n")
    extra = users.replace("name: kubernetes-admin", "name: other")
    n = max(1, (size - len(text)) // len(extra))
    doc = text + extra * n
else:
    raise SystemExit("unknown family " + family)
open(out, "w").write(doc)
EOF
}

median_ms() {
  local times=() i start end
  for ((i = 0; i < RUNS; i++)); do
    start=$(date +%s%N)
    "$BIN" check --root "$NODE" --output json >/dev/null 2>&1 || true
    end=$(date +%s%N)
    times+=($(((end - start) / 1000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1000}'
}

printf '%-11s %9s %10s %10s  %s\n' family bytes "check ms" "us/KiB" "admin.conf status"
for family in apostrophe quote continued flow-map indicators aliases sound; do
  for size in 16384 65536 262144 1000000; do
    document "$family" "$size" "$NODE/etc/kubernetes/admin.conf"
    bytes=$(stat -c %s "$NODE/etc/kubernetes/admin.conf")
    ms=$(median_ms)
    status=$("$BIN" check --root "$NODE" --output json 2>/dev/null | python3 -c '
import json,sys
r=[c for c in json.load(sys.stdin)["certificates"] if c["name"]=="admin.conf"][0]
print(r["status"], (r.get("error") or "")[:70])' || true)
    awk -v f="$family" -v b="$bytes" -v ms="$ms" -v s="$status" \
      'BEGIN {printf "%-11s %9d %10.1f %10.2f  %s\n", f, b, ms, ms*1000/(b/1024), s}'
  done
done
