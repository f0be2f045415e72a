#!/bin/sh
# Scenario e (qemu-tests/tests/broken_renewal.rs): a renewal that breaks for real. The node's
# static pods are the real kube-apiserver, controller-manager and scheduler v1.20.2 and Debian's
# etcd. certrotor (superpowered host container, a build with the test-only
# failpoints) renews with CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client: after
# validation, the apiserver's etcd client pair is re-signed by a throwaway CA, so the real etcd
# refuses the real apiserver after its restart. certrotor restarts etcd, fails to bring
# kube-apiserver back, restores the backup, restarts again and exits 3. The node must serve the
# old, still valid certificates, and kubectl reads back a ConfigMap written before.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
P=/var/lib/kubeadm/pki

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
node_real_cp /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_kubelet / node
e2e_check "control plane healthy before" node_wait_healthy / 0
node_configmap_before /
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

# The failed renewal waits its whole restart timeout for the apiserver that cannot reach etcd
# before it rolls back, so the bound is twice this boot's first start of the control plane (at
# least 120 s), not the other scenarios' three times: the rollback's restarts bring the same
# components up again on the same host, which took that long the first time, cold.
RT=$(node_restart_timeout 2 120)
e2e_save restart-timeout "$RT"
node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --restart-timeout $RT --poll-interval 200ms --restart always --output json" \
  --env CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client

e2e_check "control plane healthy after the rollback" node_wait_healthy / 0
node_kubectl_after / restored
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
# what the real etcd said of the foreign-signed client certificate
grep -h "rejected connection" /var/log/pods/etcd.log > "$E2E_OUT/etcd-rejections.txt"
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
