#!/bin/sh
# Scenario e (qemu-tests/tests/broken_renewal.rs): a real failure. certrotor (superpowered host
# container) renews with the test-only failpoint CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client,
# which re-signs the apiserver's etcd client certificate with a throwaway CA after validation.
# It restarts etcd, then the real kube-apiserver, which the real etcd refuses: the apiserver
# never becomes ready, certrotor restores the backup, restarts again and exits 3. The node must
# serve the old, still valid certificates, and the apiserver must read back what it had.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
P=/var/lib/kubeadm/pki

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_kubelet / node
e2e_check "control plane healthy before" node_wait_healthy / 0 "$NODE_UP_S"
node_kubectl_before /
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

node_readyz_start / 0 readyz.txt
node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --restart-timeout ${NODE_RESTART_S}s --poll-interval 200ms --output json" \
  --env CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client

e2e_check "control plane healthy after the rollback" node_wait_healthy / 0 "$NODE_UP_S"
node_readyz_stop
node_kubectl_after / after
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
grep -h "certificate signed by unknown authority" /var/log/pods/etcd.log > "$E2E_OUT/etcd-rejections.txt"
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
