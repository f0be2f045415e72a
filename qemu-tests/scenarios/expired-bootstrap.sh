#!/bin/sh
# Scenario b (qemu-tests/tests/expired_bootstrap.rs): the node boots with every leaf
# certificate expired (powered off past expiry). As on Bottlerocket, the bootstrap container
# runs before the kubelet: certrotor (empty user-data = `run --once --platform none`) renews,
# then the static pods start: the REAL kube-apiserver (with the start-up cuts of
# node_fast_apiserver), controller-manager and scheduler v1.20.2 and Debian's etcd, under
# kubelet-sim, and the control plane comes up healthy on the renewed files.
# The cluster's data from before the node was switched off: its etcd data folder holds a
# ConfigMap, written while the node's certificates were still valid (the guest clock set back
# two days, Debian's etcd started on the node's own data folder, PKI and member flags, the
# object stored as JSON, which kube-apiserver's storage decoder reads beside protobuf). After
# the renewal kubectl with the renewed admin.conf lists the namespaces and reads it back.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
P=/var/lib/kubeadm/pki/etcd

# seed_etcd   the ConfigMap the cluster held before the node was switched off, written into the
# node's own etcd (its manifest's member flags and data folder, its PKI) while its certificates
# were valid
seed_etcd() {
  etcd --name=cp-1 --data-dir=/var/lib/etcd \
    --listen-client-urls=https://127.0.0.1:2379 --advertise-client-urls=https://127.0.0.1:2379 \
    --listen-peer-urls=https://127.0.0.1:2380 --initial-advertise-peer-urls=https://127.0.0.1:2380 \
    --initial-cluster=cp-1=https://127.0.0.1:2380 --client-cert-auth=true \
    --cert-file=$P/server.crt --key-file=$P/server.key --trusted-ca-file=$P/ca.crt \
    --peer-cert-file=$P/peer.crt --peer-key-file=$P/peer.key --peer-trusted-ca-file=$P/ca.crt \
    --peer-client-cert-auth=true > "$E2E_OUT/etcd-before.log" 2>&1 &
  _etcd=$!
  _rc=1
  if e2e_wait_for 60 node_etcdctl / 0 endpoint health; then
    _uid=$(cat /proc/sys/kernel/random/uuid)
    _ts=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    node_etcdctl / 0 put /registry/configmaps/default/certrotor-e2e \
      "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"certrotor-e2e\",\"namespace\":\"default\",\"uid\":\"$_uid\",\"creationTimestamp\":\"$_ts\"},\"data\":{\"token\":\"$(cat "$E2E_SHARE/token")\"}}" \
      > /dev/null && _rc=0
  fi
  kill "$_etcd"; wait "$_etcd" 2> /dev/null
  return $_rc
}

e2e_check "certrotor image imported" node_image
e2e_check "lab node (expired 1 day ago)" node_lab / --expires-in -1d
node_check check-before /
e2e_check "clock set back 2 days (certificates valid)" node_clock_shift -2
e2e_check "etcd data from before: a ConfigMap" seed_etcd
e2e_check "clock set forward 2 days (certificates expired)" node_clock_shift 2
node_real_cp /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_certrotor --bootstrap certrotor bootstrap ""
e2e_save bootstrap-done-ms "$(node_now_ms)"
node_kubelet / node
e2e_check "control plane healthy" node_wait_healthy / 0 300
e2e_check "cluster-admins bound (kubeadm init)" node_grant_admins /
node_kubectl_after /
node_pki_sums pki-after.sha /
node_served served.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
