#!/bin/sh
# Scenario (qemu-tests/tests/days_off_400.rs, issue 11.5): a control-plane node switched off for
# 400 days. The node is made with one-year leaves, then the guest clock jumps 400 days forward
# before anything else starts (as a node powered on after 400 days finds it). The bootstrap
# container (empty user-data: `run --once --platform none`) renews every expired leaf, the
# kubeconfigs and the kubelet's client certificate (and removes its expired self-signed serving
# pair) before the kubelet starts; the control plane comes up on the new files. The kubelet's
# new credentials are proven against k8s-sim's kube-apiserver stand-in (mTLS: chain to the
# cluster CA and validity at the guest's clock); the old ones are refused. (The real
# kube-apiserver cold-starts in ~7 min under TCG: agent/tests/kubelet.rs proves the same
# credentials against it, with its Node authorizer, on the host.)
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"

KPKI=/var/lib/kubelet/pki

# days_off N   moves the clock N days forward
days_off() {
  _new=$(( $(date +%s) + $1 * 86400 ))
  date -u -s "@$_new" > /dev/null 2>&1 ||
    date -u -s "$(date -u -d "@$_new" '+%Y-%m-%d %H:%M:%S')" > /dev/null 2>&1
  [ "$(date +%s)" -ge $(( _new - 5 )) ]
}
# kubelet_auth NAME PEM   can PEM (the kubelet's combined pair) talk to kube-apiserver?
kubelet_auth() {
  if node_https_ok 6443 /livez -cert "$2" -key "$2"; then e2e_save "$1" accepted
  else e2e_save "$1" refused; fi
}

e2e_check "certrotor image imported" node_image
e2e_check "lab node (one-year leaves)" node_lab /
e2e_save made-at "$(date +%s)"
cp -L "$KPKI/kubelet-client-current.pem" /var/tmp/old-kubelet-client.pem
readlink "$KPKI/kubelet-client-current.pem" > "$E2E_OUT/link-before.txt"
e2e_check "switched off for 400 days (clock +400 d)" days_off 400
e2e_save booted-at "$(date +%s)"
node_check check-before /
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
node_certrotor --bootstrap certrotor bootstrap ""
e2e_save bootstrap-done-ms "$(node_now_ms)"
readlink "$KPKI/kubelet-client-current.pem" > "$E2E_OUT/link-after.txt"
ls "$KPKI" > "$E2E_OUT/kubelet-pki.txt"
node_kubelet / node
e2e_check "control plane healthy" node_wait_healthy / 0 120
kubelet_auth kubelet-new "$KPKI/kubelet-client-current.pem"
kubelet_auth kubelet-old /var/tmp/old-kubelet-client.pem
openssl x509 -in "$KPKI/kubelet-client-current.pem" -noout -subject -nameopt compat \
  > "$E2E_OUT/kubelet-subject.txt" 2>&1
node_served served.txt / 0
node_check check-after /
node_save_state / state
ls /var/lib/certrotor/backups > "$E2E_OUT/backups.txt" 2>&1
e2e_finish
