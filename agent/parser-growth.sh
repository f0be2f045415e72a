#!/usr/bin/env bash
# Growth benchmark of certrotor's readers of untrusted bytes (issues 28.6 and 30.5): what `check`
# costs as one of the node's files grows, counted in instructions (valgrind's callgrind), not
# seconds, so the figures are the same on an idle and on a busy machine.
#
# For each family of input (hostile YAML shapes in admin.conf, a sound kubeconfig with many
# users, a huge embedded certificate read by the fast reader and by the YAML parser, PEM and DER
# garbage as a certificate, a key file with junk around it) at 64 KiB, 256 KiB and just under the 1 MiB read limit, it
# prints the instructions each KiB added costs, from one size to the next. A linear reader keeps
# that flat; a quadratic one multiplies it by about four from the first step to the second. With
# --check it exits 1 naming the family whose second step costs more than GROWTH_LIMIT (default 2)
# times its first.
#
#   agent/parser-growth.sh [--check] [BINARY]
#     BINARY: default target/x86_64-unknown-linux-musl/release/certrotor (agent/build-static.sh),
#     else target/release/certrotor, else target/debug/certrotor.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECK=0
if [ "${1:-}" = --check ]; then CHECK=1; shift; fi
BIN="${1:-}"
if [ -z "$BIN" ]; then
  for b in target/x86_64-unknown-linux-musl/release/certrotor target/release/certrotor target/debug/certrotor; do
    [ -x "$b" ] && { BIN=$b; break; }
  done
fi
[ -n "$BIN" ] && [ -x "$BIN" ] || { echo "parser-growth: no certrotor binary: run agent/build-static.sh first" >&2; exit 64; }
command -v valgrind >/dev/null || { echo "parser-growth: valgrind is not on PATH: install the Debian package 'valgrind'" >&2; exit 64; }
command -v python3 >/dev/null || { echo "parser-growth: python3 is not on PATH: install the Debian package 'python3'" >&2; exit 64; }
LIMIT=${GROWTH_LIMIT:-2}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/certrotor-parser-growth.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
NODE="$WORK/node"
"$BIN" lab init "$NODE" --key-algorithm ecdsa-p256 >/dev/null 2>&1
K=etc/kubernetes
cp -a "$NODE" "$WORK/pristine"

# Instructions `check` runs on the node as it is now; empty when it did not finish within
# RUN_BOUND seconds (a bound on a hang, far above a linear reader's cost: a quadratic one at
# 64 KiB takes minutes under callgrind).
RUN_BOUND=${RUN_BOUND:-300}
instructions() {
  timeout "$RUN_BOUND" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" check \
    --root "$NODE" --output json >/dev/null 2>"$WORK/vg.err" || true
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$WORK/vg.err" | tail -n1
}

# Writes the document of family $1, about $2 bytes, over the node file it targets; prints that
# file's path relative to the node.
document() {
  python3 - "$1" "$2" "$NODE" <<'EOF'
import base64, os, random, sys
family, size, node = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# Seeded: the same bytes on every run, so a family's figures repeat (random bytes once made
# kubeconfig-big-cert start with a digit one run in five, which the fast reader leaves to the
# YAML parser: two linear readers with different costs looked like one non-linear one).
rng = random.Random(family + str(size))
K = "etc/kubernetes"
admin = os.path.join(node, K, "admin.conf")
orig = open(os.path.join(node, K, "admin.conf")).read()
targets = {"cert-pem-junk": K + "/pki/apiserver.crt", "cert-pem-blocks": K + "/pki/apiserver.crt",
           "cert-der": K + "/pki/apiserver.crt", "key-junk": K + "/pki/apiserver.key"}
rel = targets.get(family, K + "/admin.conf")
path = os.path.join(node, rel)
if family == "yaml-apostrophe":
    doc = "a: [x 'y, " + "[" * size + "\n"
elif family == "yaml-quote":
    doc = 'a: [x "y, ' + "[" * size + "\n"
elif family == "yaml-continued":
    doc = "a: [x\n 'y, " + "[" * size + "\n"
elif family == "yaml-flow-map":
    doc = "a: " + "{k: x 'y, b: " * (size // 13) + "\n"
elif family == "yaml-indicators":
    doc = "- " * (size // 2) + "x\n"
elif family == "yaml-aliases":
    doc = "a: [*x, " * (size // 8) + "\n"
elif family == "kubeconfig-users":
    head, users = orig.split("users:\n")
    extra = users.replace("name: kubernetes-admin", "name: other")
    doc = orig + extra * max(1, (size - len(orig)) // len(extra))
elif family in ("kubeconfig-big-cert", "kubeconfig-big-cert-yaml"):
    # As client-go writes it, the base64 of a PEM block ("LS0t", the fast reader's path); the
    # -yaml variant starts with a digit, which the fast reader leaves to the YAML parser.
    lead = "LS0t" if family == "kubeconfig-big-cert" else "0S0t"
    blob = lead + base64.b64encode(rng.randbytes(size * 3 // 4)).decode()
    doc = orig.replace("client-certificate-data: ", "client-certificate-data: " + blob[: size], 1)
elif family == "cert-pem-junk":
    cert = open(path).read()
    doc = ("junk line before the certificate\n" * (size // 33)) + cert
elif family == "cert-pem-blocks":
    doc = "-----BEGIN CERTIFICATE-----\nAAAA\n" * (size // 33)
elif family == "cert-der":
    doc = None
    open(path, "wb").write(b"\x30\x82" + rng.randbytes(size))
elif family == "key-junk":
    key = open(path).read()
    doc = key + ("-----END PRIVATE KEY-----\n" * (size // 26))
else:
    raise SystemExit("unknown family " + family)
if doc is not None:
    open(path, "w").write(doc)
print(rel)
EOF
}

FAMILIES="${FAMILIES:-yaml-apostrophe yaml-quote yaml-continued yaml-flow-map yaml-indicators yaml-aliases
kubeconfig-users kubeconfig-big-cert kubeconfig-big-cert-yaml cert-pem-junk cert-pem-blocks cert-der key-junk}"
SIZES="65536 262144 1000000"

base=$(instructions)
[ -n "$base" ] || { echo "parser-growth: valgrind gave no instruction count:" >&2; cat "$WORK/vg.err" >&2; exit 1; }
printf '%s, baseline check: %s instructions\n' "$("$BIN" version)" "$base"
printf '%-24s %9s %14s %16s\n' family bytes instructions "Ir/KiB added"
bad=()
for family in $FAMILIES; do
  prev_ir="" prev_bytes="" slopes=()
  for size in $SIZES; do
    rm -rf "$NODE" && cp -a "$WORK/pristine" "$NODE"
    rel=$(document "$family" "$size")
    bytes=$(stat -c %s "$NODE/$rel")
    ir=$(instructions)
    if [ -z "$ir" ]; then
      printf '%-24s %9d %14s %16s\n' "$family" "$bytes" "unfinished" "-"
      bad+=("$family (check did not finish within ${RUN_BOUND} s at $bytes bytes)")
      continue 2
    fi
    slope="-"
    if [ -n "$prev_ir" ]; then
      # Instructions per KiB added between this size and the one before: flat when linear.
      slope=$(( (ir - prev_ir) * 1024 / (bytes - prev_bytes) ))
      (( slope < 1 )) && slope=1
      slopes+=("$slope")
    fi
    printf '%-24s %9d %14d %16s\n' "$family" "$bytes" "$ir" "$slope"
    prev_ir=$ir prev_bytes=$bytes
  done
  if (( slopes[-1] > LIMIT * slopes[0] )); then
    bad+=("$family (${slopes[0]} -> ${slopes[-1]} instructions per KiB added)")
  fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "parser-growth: the cost of a KiB more grows more than ${LIMIT}x with the input (not linear): ${bad[*]}" >&2
  [ "$CHECK" = 1 ] && exit 1
else
  echo "parser-growth: every family's cost per KiB added stays within ${LIMIT}x as its input grows to 1 MiB"
fi
