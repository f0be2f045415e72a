#!/bin/sh
# Cluster scenario (qemu-tests/tests/cluster_external.rs): external etcd with no person. One VM,
# two node roots as in the external-etcd scenario (the control plane at /, the etcd node at
# /var/lib/nodes/etcd, ports offset by 100; the control plane's static pods the real
# kube-apiserver, controller-manager and scheduler v1.20.2), both due in 2 days. Both certrotor host containers
# start `run --once` at the same moment, in cluster mode (the default): they coordinate their
# restarts through etcd's lock, the etcd node publishes the renewed apiserver-etcd-client pair
# through etcd, and the control plane installs it; a control plane whose first pass ran before
# the publication installs it on its next pass, as the daemon does. Nothing is exported,
# copied or imported by hand.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
cp_pass() {  # cp_pass OUT (OUT-begin-ms: when it started)
  e2e_save "$1-begin-ms" "$(node_now_ms)"
  node_certrotor --superpowered "certrotor-$1" "$1" \
    "run --once --root $CR --platform bottlerocket --api-socket $CR/run/api.sock --restart-timeout 300s --poll-interval 200ms --cluster-wait 180s --restart always --output json"
}

node_external_pair

# 1. both nodes' passes start together
e2e_save begin-ms "$(node_now_ms)"
node_certrotor --superpowered certrotor-etcd etcd-run \
  "run --once --root $CR$E --platform bottlerocket --api-socket $CR/run/etcd-node/api.sock --restart-timeout 300s --poll-interval 200ms --cluster-wait 180s --restart always --output json" &
etcd_pid=$!
cp_pass cp-run-1 &
cp_pid=$!
wait $etcd_pid; wait $cp_pid
e2e_check "etcd node run exit 0" [ "$(cat "$E2E_OUT/etcd-run.rc")" = 0 ]
e2e_check "control plane first run exit 0" [ "$(cat "$E2E_OUT/cp-run-1.rc")" = 0 ]
# 2. the control plane's next pass (the daemon's next tick)
cp_pass cp-run-2
e2e_check "control plane second run exit 0" [ "$(cat "$E2E_OUT/cp-run-2.rc")" = 0 ]
e2e_save end-ms "$(node_now_ms)"

e2e_check "etcd healthy after" e2e_wait_for 60 etcd_ok endpoint health
e2e_check "control plane healthy after (apiserver reaches etcd)" node_wait_healthy / $O 300 0
node_kubectl_after /
e2e_save cp-client-sha "$(node_file_sha "$(cp_client)")"
e2e_save etcd-node-client-sha "$(node_file_sha $EP/apiserver-etcd-client.crt)"
e2e_save etcd-after "$(etcd_ok get --print-value-only /e2e/before)"
node_save_state $E etcd-state
node_save_state / cp-state
e2e_finish
