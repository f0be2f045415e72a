#!/bin/sh
# Scenario e (qemu-tests/tests/broken_renewal.rs): the kube-apiserver stand-in refuses any
# serving certificate issued after the lab's (K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER, set on
# the kubelet and inherited by its pods). certrotor (superpowered host container) renews,
# restarts etcd, fails to bring kube-apiserver back, restores the backup, restarts again and
# exits 3. The node must serve the old, still valid certificates.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
P=/var/lib/kubeadm/pki

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
# reject certificates issued one second after the lab's notBefore (renewal: now - 5 min)
nb=$(openssl x509 -in $P/apiserver.crt -noout -startdate -dateopt iso_8601 | sed 's/^notBefore=//; s/Z$//')
reject=$(date -u -d "@$(( $(date -u -d "$nb" +%s) + 1 ))" +%Y-%m-%dT%H:%M:%SZ)
e2e_save reject-after "$reject"
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_kubelet / node K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER="$reject"
e2e_check "control plane healthy before" node_wait_healthy / 0 120
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --restart-timeout 30s --poll-interval 200ms --restart always --output json"

e2e_check "control plane healthy after the rollback" node_wait_healthy / 0 60
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
grep -h "rejected by test switch" /var/log/pods/kube-apiserver.log > "$E2E_OUT/apiserver-rejections.txt"
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
