#!/bin/sh
# Issue 6 scenario (qemu-tests/tests/engine_kubeadm.rs): the stacked node of scenario a, renewed
# with --engine kubeadm. certrotor runs as a superpowered host container; it finds the node's
# ctr and containerd socket through /.bottlerocket/rootfs, runs `kubeadm certs renew <name>`
# from the kubeadm image (here the openssl stand-in, a test double) against a staging copy, then
# validates, swaps, restarts each static pod once and verifies. The host-side test asserts on
# the files saved here.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
STANDIN=localhost/certrotor-kubeadm-standin:test

e2e_check "certrotor image imported" node_image
e2e_check "kubeadm stand-in imported into k8s.io" \
  sh -c "ctr -n k8s.io images import '$E2E_SHARE/kubeadm-standin.oci.tar' > /dev/null"
e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_kubelet / node
e2e_check "control plane healthy before" node_wait_healthy / 0 120
e2e_check "etcd put before renewal" node_etcdctl / 0 put /e2e/before "$(cat "$E2E_SHARE/token")"
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --engine kubeadm --kubeadm-image $STANDIN --restart-timeout 120s --poll-interval 200ms --output json"
e2e_check "certrotor run exit 0" [ "$(cat "$E2E_OUT/run.rc")" = 0 ]

e2e_check "control plane healthy after" node_wait_healthy / 0 60
e2e_save etcd-after "$(node_etcdctl / 0 get --print-value-only /e2e/before)"
node_pki_sums pki-after.sha /
node_served served-after.txt / 0
node_check check-after /
node_save_state / state
ctr -n k8s.io containers ls -q > "$E2E_OUT/k8s-containers.txt" 2>&1
ls /var/lib/certrotor/engine > "$E2E_OUT/engine-staging.txt" 2>&1 || true
e2e_finish
