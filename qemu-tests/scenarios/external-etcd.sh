#!/bin/sh
# External etcd (qemu-tests/tests/external_etcd.rs). One VM, two node roots (the reasoning is in
# the test's header): the control plane at / (API /run/api.sock) and the etcd node at
# /var/lib/nodes/etcd (API /run/etcd-node/api.sock), each with its own apiserver-sim and
# kubelet-sim, ports offset by 100 (lab init --topology external-etcd --port-offset 100); the
# control plane's static pods are the real kube-apiserver, controller-manager and scheduler
# v1.20.2, the etcd node's Debian's etcd. Both nodes due in 2 days.
#
# Phase 1, with no person (issue 10; files prefixed `cluster-`): both certrotor host containers
#   start `run --once` at the same moment, in cluster mode (the default): they coordinate their
#   restarts through etcd's lock, the etcd node publishes the renewed apiserver-etcd-client pair
#   through etcd, and the control plane installs it; a control plane whose first pass ran
#   before the publication installs it on its next pass, as the daemon does.
# Phase 2, by hand (scenario d), on the same nodes:
#   1. etcd node: certrotor host container `run --once --all` renews (again) and restarts etcd.
#   2. etcd node: `etcd-client export` writes the apiserver-etcd-client bundle; it is copied to
#      the control plane (as an operator would).
#   3. control plane: `etcd-client import` installs it, restarts kube-apiserver and verifies it.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"

node_external_pair
mv "$E2E_OUT/cp-client-sha-before" "$E2E_OUT/cluster-cp-client-sha-before"

# The bounds follow from what is awaited: a restart brings the real components up again on
# this host, which took NODE_UP_FIRST_S the first time (node_restart_timeout); a node waits for
# the cluster lock while the other one restarts under it: at most four restarts (the control
# plane's kube-apiserver, controller-manager, scheduler, and kube-apiserver again to install the
# published pair), each a stop and a verification within the restart timeout.
RT=$(node_restart_timeout)
CW="$(( 8 * $(node_seconds "$RT") ))s"
e2e_save restart-timeout "$RT"
e2e_save cluster-wait "$CW"
PASS="--platform bottlerocket --restart-timeout $RT --poll-interval 200ms --cluster-wait $CW --restart always --output json"

# ---- phase 1: cluster mode, no person ---------------------------------------------------------
cp_pass() {  # cp_pass OUT (OUT-begin-ms: when it started)
  e2e_save "$1-begin-ms" "$(node_now_ms)"
  node_certrotor --superpowered "certrotor-$1" "$1" \
    "run --once --root $CR --api-socket $CR/run/api.sock $PASS"
}
e2e_save cluster-begin-ms "$(node_now_ms)"
node_certrotor --superpowered certrotor-etcd cluster-etcd-run \
  "run --once --root $CR$E --api-socket $CR/run/etcd-node/api.sock $PASS" &
etcd_pid=$!
cp_pass cluster-cp-run-1 &
cp_pid=$!
wait $etcd_pid; wait $cp_pid
e2e_check "etcd node run exit 0" [ "$(cat "$E2E_OUT/cluster-etcd-run.rc")" = 0 ]
e2e_check "control plane first run exit 0" [ "$(cat "$E2E_OUT/cluster-cp-run-1.rc")" = 0 ]
# the control plane's next pass (the daemon's next tick)
cp_pass cluster-cp-run-2
e2e_check "control plane second run exit 0" [ "$(cat "$E2E_OUT/cluster-cp-run-2.rc")" = 0 ]
e2e_save cluster-end-ms "$(node_now_ms)"

e2e_check "etcd healthy after" e2e_wait_for $NODE_START_S etcd_ok endpoint health
e2e_check "control plane healthy after (apiserver reaches etcd)" node_wait_healthy / $O "" 0
node_kubectl_after / renewed cluster-
e2e_save cluster-cp-client-sha "$(node_file_sha "$(cp_client)")"
e2e_save cluster-etcd-node-client-sha "$(node_file_sha $EP/apiserver-etcd-client.crt)"
e2e_save cluster-etcd-after "$(etcd_ok get --print-value-only /e2e/before)"
node_save_state $E cluster-etcd-state
node_save_state / cluster-cp-state

# ---- phase 2: by hand ---------------------------------------------------------------------------
node_pki_sums cp-before.sha /
node_pki_sums etcd-before.sha $E
e2e_save cp-client-sha-before "$(node_file_sha "$(cp_client)")"

# 1. renew the etcd node (everything: phase 1 renewed it already)
node_certrotor --superpowered certrotor-etcd etcd-run \
  "run --once --all --root $CR$E --platform bottlerocket --api-socket $CR/run/etcd-node/api.sock --restart-timeout $RT --poll-interval 200ms --cluster-wait $CW --restart always --output json"
e2e_check "etcd node run exit 0" [ "$(cat "$E2E_OUT/etcd-run.rc")" = 0 ]
e2e_check "etcd healthy after renewal" e2e_wait_for $NODE_START_S etcd_ok endpoint health
e2e_save etcd-served "$(node_served_sha $((2379 + O)) -cert $EP/etcdctl-etcd-client.crt -key $EP/etcdctl-etcd-client.key) $(node_file_sha $EP/server.crt)"
# the old client certificate is still valid: the apiserver keeps working until the import
e2e_check "control plane still healthy before the import" node_wait_healthy / $O "" 0

# 2. export on the etcd node, copy to the control plane
mkdir -p /var/tmp/transfer
node_certrotor --superpowered certrotor-etcd export \
  "etcd-client export --root $CR$E --out $CR/var/tmp/transfer/etcd-client.pem"
e2e_check "export exit 0" [ "$(cat "$E2E_OUT/export.rc")" = 0 ]
cp /var/tmp/transfer/etcd-client.pem "$E2E_OUT/bundle.pem"
e2e_save bundle-sha "$(node_file_sha /var/tmp/transfer/etcd-client.pem)"
e2e_save etcd-node-client-sha "$(node_file_sha $EP/apiserver-etcd-client.crt)"

# 3. import on the control plane
e2e_save import-begin-ms "$(node_now_ms)"
node_certrotor --superpowered certrotor import \
  "etcd-client import --from $CR/var/tmp/transfer/etcd-client.pem --platform bottlerocket --restart-timeout $RT --poll-interval 200ms"
e2e_check "import exit 0" [ "$(cat "$E2E_OUT/import.rc")" = 0 ]
e2e_check "control plane healthy after the import (apiserver reaches etcd)" node_wait_healthy / $O "" 0
node_kubectl_after /
e2e_save cp-client-file "$(cp_client)"
e2e_save cp-client-sha "$(node_file_sha "$(cp_client)")"
e2e_save etcd-after "$(etcd_ok get --print-value-only /e2e/before)"
node_pki_sums cp-after.sha /
node_pki_sums etcd-after.sha $E
node_check etcd-check $E
node_save_state $E etcd-state
node_save_state / cp-state
e2e_finish
