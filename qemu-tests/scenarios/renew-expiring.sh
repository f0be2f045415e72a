#!/bin/sh
# Scenario a (qemu-tests/tests/renew_expiring.rs): a stacked control-plane node whose leaf
# certificates expire in 2 days; certrotor, as a superpowered host container configured by its
# user-data, renews, restarts each static pod once through the API and verifies. The host-side
# test asserts on the files saved here.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
R=/ P=/var/lib/kubeadm/pki

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_kubelet / node
e2e_check "control plane healthy before" node_wait_healthy / 0 120
e2e_check "etcd put before renewal" node_etcdctl / 0 put /e2e/before "$(cat "$E2E_SHARE/token")"
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --restart-timeout 120s --poll-interval 200ms --output json"
e2e_check "certrotor run exit 0" [ "$(cat "$E2E_OUT/run.rc")" = 0 ]

e2e_check "control plane healthy after" node_wait_healthy / 0 60
e2e_save etcd-after "$(node_etcdctl / 0 get --print-value-only /e2e/before)"
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
for b in /var/lib/certrotor/backups/*/; do
  find "$b" -type f | sed "s|^$b||" | sort > "$E2E_OUT/backup-files.txt"
  f=$(find "$b" -name apiserver.crt | head -n1)
  [ -n "$f" ] && sha256sum < "$f" | cut -c1-64 > "$E2E_OUT/backup-apiserver.sha"
done
e2e_finish
