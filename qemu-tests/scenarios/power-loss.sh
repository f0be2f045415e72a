#!/bin/sh
# Scenario c (qemu-tests/tests/power_loss.rs): power loss in the middle of a renewal.
# The static pods are the REAL kube-apiserver (with the start-up cuts of node_fast_apiserver),
# controller-manager and scheduler v1.20.2 and Debian's etcd, under kubelet-sim.
# Boot 1: a healthy stacked node (certificates expire in 2 days), a ConfigMap written with
#   kubectl. With share/broken-first = yes, scenario e first (qemu-tests/tests/power_loss.rs,
#   `a_rejected_renewal_*`): a renewal that breaks for real and rolls back (below). Then certrotor
#   runs as a
#   superpowered host container with CERTROTOR_FAILPOINT=$(cat share/failpoint) and
#   CERTROTOR_FAILPOINT_ACTION=pause: at that step of the transaction it prints
#   "CERTROTOR-FAILPOINT <name> (#N)" (copied to the console) and waits; the harness kills QEMU.
# Boot 2, same disk: the node starts the way Bottlerocket does: API, bootstrap container
#   (share/bootstrap = yes; certrotor completes or undoes the transaction, then renews what is
#   due before any pod runs), kubelet, then the host container's `run --once`; kubectl with the
#   renewed admin.conf lists the namespaces and reads the ConfigMap back.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
# the host container's pass; its restart bound follows from this boot's first start of the
# control plane (node_restart_timeout; NODE_UP_S when it runs before any)
hc() { echo "run --once --platform bottlerocket --restart-timeout $(node_restart_timeout) --poll-interval 200ms --restart always --output json"; }

# Scenario e: a renewal that breaks for real. certrotor renews with the test-only failpoint
# CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client: after validation, the apiserver's etcd
# client pair is re-signed by a throwaway CA, so the real etcd refuses the real apiserver after
# its restart. certrotor restarts etcd, fails to bring kube-apiserver back, restores the backup,
# restarts again and exits 3. The node must serve the old, still valid certificates, and kubectl
# reads back the ConfigMap written before. Outputs: broken-* (and etcd-rejections.txt).
broken_renewal() {
  node_pki_sums broken-pki-before.sha /
  node_served broken-served-before.txt / 0
  # The failed renewal waits its whole restart timeout for the apiserver that cannot reach etcd
  # before it rolls back, so the bound is twice this boot's first start of the control plane (at
  # least 120 s), not three times: the rollback's restarts bring the same components up again on
  # the same host, which took that long the first time, cold.
  node_certrotor --superpowered certrotor broken \
    "run --once --platform bottlerocket --restart-timeout $(node_restart_timeout 2 120) --poll-interval 200ms --restart always --output json" \
    --env CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client
  e2e_check "control plane healthy after the rollback" node_wait_healthy / 0
  node_kubectl_after / restored broken-
  node_pki_sums broken-pki-after.sha /
  node_served broken-served-after.txt / 0
  node_check broken-check-after /
  node_save_state / broken-state
  # what the real etcd said of the foreign-signed client certificate
  grep -h "rejected connection" /var/log/pods/etcd.log > "$E2E_OUT/etcd-rejections.txt"
  ls /var/lib/certrotor/backups > "$E2E_OUT/broken-backups.txt" 2>&1
}

if [ "$E2E_BOOT" = 1 ]; then
  e2e_check "certrotor image imported" node_image
  e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
  node_real_cp /
  e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
  node_kubelet / node
  e2e_check "control plane healthy before" node_wait_healthy / 0
  node_configmap_before /
  e2e_check "etcd put before renewal" node_etcdctl / 0 put /e2e/before "$(cat "$E2E_SHARE/token")"
  [ "$(cat "$E2E_SHARE/broken-first" 2> /dev/null)" = yes ] && broken_renewal
  node_pki_sums pki-before.sha /
  ls /var/lib/certrotor/backups > "$E2E_OUT/backups-before-loss.txt" 2>&1
  e2e_finish; echo "$?" > "$E2E_OUT/checks-rc"; sync
  fp=$(cat "$E2E_SHARE/failpoint")
  node_certrotor --superpowered certrotor run "$(hc)" \
    --env "CERTROTOR_FAILPOINT=$fp" --env CERTROTOR_FAILPOINT_ACTION=pause
  e2e_log "certrotor ended without reaching failpoint $fp"
  exit 98
fi

# ---- boot 2: after the power loss (the manifests with their cuts persist in /var)
node_pki_sums pki-at-boot.sha /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
if [ "$(cat "$E2E_SHARE/bootstrap")" = yes ]; then
  node_certrotor --bootstrap certrotor bootstrap ""
  e2e_check "bootstrap container exit 0" [ "$(cat "$E2E_OUT/bootstrap.rc")" = 0 ]
fi
node_kubelet / node
# after a bootstrap container the PKI is consistent before any pod starts; without one the
# kubelet and the host container start together (Bottlerocket does not order them)
if [ "$(cat "$E2E_SHARE/bootstrap")" = yes ]; then
  e2e_check "control plane healthy at boot" node_wait_healthy / 0
fi
node_certrotor --superpowered certrotor run "$(hc)"
e2e_check "host container exit 0" [ "$(cat "$E2E_OUT/run.rc")" = 0 ]
e2e_check "control plane healthy after" node_wait_healthy / 0
node_kubectl_after /
e2e_save etcd-after "$(node_etcdctl / 0 get --print-value-only /e2e/before)"
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
ls -a /var/lib/kubeadm/pki /var/lib/kubeadm/pki/etcd /var/lib/kubeadm > "$E2E_OUT/pki-dirs.txt"
e2e_finish
