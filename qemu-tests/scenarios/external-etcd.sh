#!/bin/sh
# Scenario d (qemu-tests/tests/external_etcd.rs): external etcd. One VM, two node roots (the
# reasoning is in the test's header): the control plane at / (API /run/api.sock) and the etcd
# node at /var/lib/nodes/etcd (API /run/etcd-node/api.sock), each with its own apiserver-sim
# and kubelet-sim, ports offset by 100 (lab init --topology external-etcd --port-offset 100);
# the control plane's static pods are the real kube-apiserver, controller-manager and scheduler
# v1.20.2, the etcd node's Debian's etcd.
# 1. etcd node: certrotor host container `run --once` renews and restarts etcd.
# 2. etcd node: `etcd-client export` writes the apiserver-etcd-client bundle; it is copied to
#    the control plane (as an operator would).
# 3. control plane: `etcd-client import` installs it, restarts kube-apiserver and verifies it.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"

node_external_pair
node_pki_sums cp-before.sha /
node_pki_sums etcd-before.sha $E

# 1. renew the etcd node
node_certrotor --superpowered certrotor-etcd etcd-run \
  "run --once --root $CR$E --platform bottlerocket --api-socket $CR/run/etcd-node/api.sock --restart-timeout 300s --poll-interval 200ms --restart always --output json"
e2e_check "etcd node run exit 0" [ "$(cat "$E2E_OUT/etcd-run.rc")" = 0 ]
e2e_check "etcd healthy after renewal" e2e_wait_for 60 etcd_ok endpoint health
e2e_save etcd-served "$(node_served_sha $((2379 + O)) -cert $EP/etcdctl-etcd-client.crt -key $EP/etcdctl-etcd-client.key) $(node_file_sha $EP/server.crt)"
# the old client certificate is still valid: the apiserver keeps working until the import
e2e_check "control plane still healthy before the import" node_wait_healthy / $O 300 0

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
  "etcd-client import --from $CR/var/tmp/transfer/etcd-client.pem --platform bottlerocket --restart-timeout 300s --poll-interval 200ms"
e2e_check "import exit 0" [ "$(cat "$E2E_OUT/import.rc")" = 0 ]
e2e_check "control plane healthy after the import (apiserver reaches etcd)" node_wait_healthy / $O 300 0
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
