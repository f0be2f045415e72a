#!/bin/sh
# Scenario b (qemu-tests/tests/expired_bootstrap.rs): the node boots with every leaf
# certificate expired (powered off past expiry). As on Bottlerocket, the bootstrap container
# runs before the kubelet: certrotor (empty user-data = `run --once --platform none`) renews,
# then the kubelet starts the static pods and the control plane comes up healthy.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expired 1 day ago)" node_lab / --expires-in -1d
node_check check-before /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_certrotor --bootstrap certrotor bootstrap ""
e2e_save bootstrap-done-ms "$(node_now_ms)"
node_kubelet / node
e2e_check "control plane healthy" node_wait_healthy / 0 "$NODE_UP_S"
e2e_check "cluster-admins bound (kubeadm init)" node_grant_admins /
e2e_check "kubectl get namespaces (after)" sh -c \
  "kubectl --kubeconfig /var/lib/kubeadm/admin.conf --request-timeout=60s get namespaces -o name > '$E2E_OUT/after-namespaces.txt'"
node_pki_sums pki-after.sha /
node_served served.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
