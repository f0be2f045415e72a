#!/bin/sh
# Scenario (qemu-tests/tests/days_off_400.rs, issue 11.5): a control-plane node switched off for
# 400 days. The node is made with one-year leaves, then the guest clock jumps 400 days forward
# before anything else starts (as a node powered on after 400 days finds it). The bootstrap
# container (empty user-data: `run --once --platform none`) renews every expired leaf, the
# kubeconfigs and the kubelet's client certificate (and removes its expired self-signed serving
# pair) before any kubelet starts. Then the REAL control plane (kube-apiserver with the start-up
# cuts of node_fast_apiserver, controller-manager, scheduler v1.20.2 and Debian's etcd, static
# pods under kubelet-sim) comes up on the renewed files, and the REAL kubelet v1.20.2
# (containerd CRI, an empty static-pod folder of its own) starts with the renewed kubelet.conf
# and registers its Node object cp-1 with the real apiserver (Node authorizer, NodeRestriction).
# Saved: the Node as admin.conf reads it once its Ready condition has a heartbeat, the same Node
# read with the kubelet's own kubelet.conf, and kubectl's answer to the old (expired) client
# pair. No human step.
# The cluster's data from before the node was switched off (what scenario b, the expired node
# renewed by its bootstrap container, proved on its own before it was merged here): while the
# node's certificates were still valid, before the clock jump, Debian's etcd started on the
# node's own data folder, PKI and member flags stores a ConfigMap, as JSON (kube-apiserver's
# storage decoder reads it beside protobuf); after the renewal kubectl with the renewed
# admin.conf lists the namespaces and reads it back.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"

KPKI=/var/lib/kubelet/pki

# node_get ARGS...   kubectl get node cp-1 with the renewed admin.conf
node_get() { node_kubectl / get node cp-1 "$@"; }
# ready   the Node's Ready condition is True (with a heartbeat); the kubelet reports False at
# first ("CSINode is not yet initialized") and True a few seconds later
ready() {
  node_get -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' \
    > /var/tmp/ready 2> /dev/null && [ "$(cat /var/tmp/ready)" = True ]
}
# lease   the kubelet's Lease (holder and renew time) -> $E2E_OUT/node-lease.txt, once it has one
lease() {
  node_kubectl / get lease cp-1 --namespace=kube-node-lease \
    -o jsonpath='{.spec.holderIdentity} {.spec.renewTime}' > "$E2E_OUT/node-lease.txt" 2>&1 &&
    grep -q '^cp-1 2' "$E2E_OUT/node-lease.txt"
}
# kubeconfig_with PEM OUT   kubelet.conf with its client pair at PEM
kubeconfig_with() { sed "s|/var/lib/kubelet/pki/kubelet-client-current.pem|$1|" \
  /var/lib/kubeadm/kubelet.conf > "$2"; }
el() { awk "BEGIN{print $(e2e_uptime) - $1}"; }
# seed_etcd   the ConfigMap the cluster held before the node was switched off, written into the
# node's own etcd (its manifest's member flags and data folder, its PKI) while its certificates
# were valid
seed_etcd() {
  _p=/var/lib/kubeadm/pki/etcd
  etcd --name=cp-1 --data-dir=/var/lib/etcd \
    --listen-client-urls=https://127.0.0.1:2379 --advertise-client-urls=https://127.0.0.1:2379 \
    --listen-peer-urls=https://127.0.0.1:2380 --initial-advertise-peer-urls=https://127.0.0.1:2380 \
    --initial-cluster=cp-1=https://127.0.0.1:2380 --client-cert-auth=true \
    --cert-file=$_p/server.crt --key-file=$_p/server.key --trusted-ca-file=$_p/ca.crt \
    --peer-cert-file=$_p/peer.crt --peer-key-file=$_p/peer.key --peer-trusted-ca-file=$_p/ca.crt \
    --peer-client-cert-auth=true > "$E2E_OUT/etcd-before.log" 2>&1 &
  _etcd=$!
  _rc=1
  if e2e_wait_for $NODE_START_S node_etcdctl / 0 endpoint health; then
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
e2e_check "lab node (one-year leaves)" node_lab /
e2e_save made-at "$(date +%s)"
cp -L "$KPKI/kubelet-client-current.pem" /var/tmp/old-kubelet-client.pem
readlink "$KPKI/kubelet-client-current.pem" > "$E2E_OUT/link-before.txt"
e2e_check "etcd data from before: a ConfigMap" seed_etcd
e2e_check "switched off for 400 days (clock +400 d)" node_clock_shift 400
e2e_save booted-at "$(date +%s)"
e2e_save booted-at-rfc3339 "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
node_check check-before /
node_real_cp /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_certrotor --bootstrap certrotor bootstrap ""
e2e_save bootstrap-done-ms "$(node_now_ms)"
readlink "$KPKI/kubelet-client-current.pem" > "$E2E_OUT/link-after.txt"
ls "$KPKI" > "$E2E_OUT/kubelet-pki.txt"
openssl x509 -in "$KPKI/kubelet-client-current.pem" -noout -subject -nameopt compat \
  > "$E2E_OUT/kubelet-subject.txt" 2>&1

# the real control plane on the renewed files
node_kubelet / node
e2e_check "real control plane healthy" node_wait_healthy / 0
e2e_check "real kube-apiserver v1.20.2" node_real_version
e2e_check "cluster-admins bound (kubeadm init)" node_grant_admins /
node_kubectl_after /

# the real kubelet with the renewed kubelet.conf
NODE_CNI_CONF=1
t=$(e2e_uptime)
e2e_check "containerd with its CRI plugin, pause imported" node_cri_containerd
e2e_save containerd-cri-s "$(el "$t")"
t=$(e2e_uptime)
NODE_KUBELET_PODS=/var/lib/kubelet/static-pods
node_real_kubelet / real --kubeconfig=/var/lib/kubeadm/kubelet.conf
e2e_check "real kubelet: Node cp-1 Ready (admin.conf)" e2e_wait_for $NODE_UP_S ready
e2e_save kubelet-heartbeat-s "$(el "$t")"
node_get -o json > "$E2E_OUT/node.json" 2> "$E2E_OUT/node.err"
e2e_check "real kubelet: its Lease in kube-node-lease" e2e_wait_for $NODE_UP_S lease
# the kubelet's own credentials, accepted by the real apiserver as system:node:cp-1
kubectl --kubeconfig /var/lib/kubeadm/kubelet.conf --request-timeout=60s get node cp-1 \
  -o name > "$E2E_OUT/kubelet-get-node.txt" 2>&1
echo $? > "$E2E_OUT/kubelet-get-node.rc"
# the old (expired) client pair, refused
kubeconfig_with /var/tmp/old-kubelet-client.pem /var/tmp/old-kubelet.conf
kubectl --kubeconfig /var/tmp/old-kubelet.conf --request-timeout=60s get node cp-1 -o name \
  > "$E2E_OUT/kubelet-old-get-node.txt" 2>&1
echo $? > "$E2E_OUT/kubelet-old-get-node.rc"
ls "$KPKI" > "$E2E_OUT/kubelet-pki-running.txt"
openssl x509 -in "$KPKI/kubelet.crt" -noout -enddate > "$E2E_OUT/kubelet-serving-enddate.txt" 2>&1
kill "$NODE_KUBELET_PID" 2> /dev/null
cp /var/log/pods/kube-apiserver.log "$E2E_OUT/kube-apiserver.log" 2> /dev/null
node_served served.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
