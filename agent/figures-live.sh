#!/usr/bin/env bash
# Figures of issue 11 point 6 (not a test): restart-all (`--restart always`) against live
# rotation (`--restart live`, the default), on the same nodes, each component's unavailability
# measured by polling its health endpoint every 100 ms (etcd /health, kube-apiserver /readyz)
# while the passes run, plus certrotor's own per-restart figures. Runs the tests that measure
# them and prints their FIGURES lines:
#   - cluster::three_stacked_nodes_due_together_restart_one_at_a_time (3 stacked nodes, real
#     etcd 3.4 and real kube-apiserver v1.20.2, --restart always)
#   - cluster::etcd_peer_renewal_keeps_the_leader (the same, --restart live)
#   - platform::kubeadm_restart_always_restarts_all_four_one_at_a_time and
#     platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies (one node,
#     real etcd, k8s-sim apiserver/controller-manager/scheduler)
#   - cluster::apiserver_serves_renewed_cert_without_restart (how long the real apiserver takes
#     to serve a renewed certificate by itself)
# Needs etcd/etcdctl and the real Kubernetes binaries (images/k8s/build.sh; CERTROTOR_K8S_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
export CERTROTOR_K8S_BIN="${CERTROTOR_K8S_BIN:-/var/cache/certrotor/kubernetes-v1.20.2/bin}"
out="$(mktemp "${TMPDIR:-/tmp}/certrotor-figures.XXXXXX")"
trap 'rm -f "$out"' EXIT
cargo test -p certrotor --test integration -- --test-threads 1 --nocapture \
  cluster::three_stacked_nodes_due_together_restart_one_at_a_time \
  cluster::etcd_peer_renewal_keeps_the_leader \
  cluster::apiserver_serves_renewed_cert_without_restart \
  platform::kubeadm_restart_always_restarts_all_four_one_at_a_time \
  platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies >"$out" 2>&1 || {
  tail -50 "$out" >&2
  echo "error: the figure tests failed (output above)" >&2
  exit 1
}
grep -oE 'FIGURES.*' "$out"
