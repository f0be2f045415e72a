#!/bin/sh
# Scenario a (qemu-tests/tests/kubelet_control_plane.rs, which selects every variant below in
# its one boot): a stacked control-plane node whose leaf
# certificates expire in 2 days; certrotor, as a superpowered host container given `run --once`
# as arguments (node_certrotor; a host container's user-data is `daemon`), renews, reloads etcd
# and kube-apiserver live (`--restart live`; kube-apiserver v1.20.2 re-reads its leaf
# certificates), restarts the controller-manager and the scheduler (embedded kubeconfig data)
# through the API and verifies. The host-side test asserts on the files saved here. The static
# pods are the real kube-apiserver, controller-manager and scheduler v1.20.2 (the apiserver with
# the start-up cuts of node_fast_apiserver) and Debian's etcd: kubectl v1.20.2 writes a ConfigMap
# before the renewal and, with the renewed admin.conf, lists the namespaces and reads it back
# after; the real apiserver's /readyz is polled (100 ms between probes) while certrotor runs
# (readyz.txt).
#
# Share files that select a variant; kubelet_control_plane.rs sets every one of them in its one
# boot (without `real-kubelet` the pods run under kubelet-sim, which no scenario boots any more:
# that branch is kept for running the script by hand):
# * `real-kubelet` (qemu-tests/tests/kubelet_control_plane.rs): the static pods run under the
#   real kubelet v1.20.2 with containerd's CRI and runc, from OCI images of the real binaries,
#   instead of kubelet-sim; the pids of the components are saved before and after, and what the
#   kubelet made of the Bottlerocket API's rendering (static-pods.txt, the runc tasks' commands,
#   the CRI containers) before the renewal.
# * `kube-vip` (with `real-kubelet`; issue 25.6): the lab also writes EKS Anywhere's kube-vip
#   (`lab init --kube-vip eks-anywhere`: no probe, admin.conf mounted as a single file), which
#   the real kubelet runs from `cp-images/kube-vip.tar` (k8s-sim's `kube-vip manager` stand-in);
#   it holds kube-system/plndr-cp-lock through the real apiserver. What the node shows of it
#   (node_vip_snapshot, node_vip_lease) is saved before the renewal and after it, and the Lease
#   once more when it has been written again after the restart.
# * `kubeadm.oci.tar` (the kubeadm engine, issues 6 and 27.3): the node is made as kubeadm v1.20.2
#   makes it (RSA-2048 keys); the image sits where Bottlerocket keeps EKS Anywhere's
#   kubeadm-bootstrap image (a real host-containerd, namespace default; the API names it in
#   settings.host-containers.kubeadm-bootstrap.source); after the native renewal above and its
#   checks, the same boot renews again with `--engine kubeadm` alone (which finds that image),
#   super-admin.conf set aside as kubeadm v1.20.2 has none; that second pass's files are saved
#   with the prefix `kubeadm-`.
# * `first-boot` (issue 27): certrotor's containers run first on the node before any PKI exists
#   (the bootstrap container's default user-data; `run --once` as a host container's user-data).
# * `readme-exec.txt` (issue 27.5): at the end, the daemon runs as a host container in
#   host-containerd and each `apiclient exec` line of bottlerocket/packaging/README.md runs as
#   the API server runs it.
# * `ca-rotate` (with `real-kubelet`; issue 29.4): last, the cluster CA rotated on this node
#   under the real kubelet, now registered with the real kube-apiserver the Bottlerocket way
#   (node_kubelet_register), while a poller reads a mirrored pod's logs through it
#   (`kubectl logs etcd-cp-1`, every second): `ca rotate --ca ca` (trust-in and issue) then
#   `ca continue --ca ca` (trust-out), each from the superpowered host container. Saved after
#   each: its report, the CA files, the API's settings and what the API rendered (the kubelet's
#   client CA file, kube-controller-manager's manifest), the kubelet's restarts by the API
#   (kubelet-restarts.txt); after trust-out every certificate the node holds or serves
#   verified with the old CA alone and the new one alone (ca-verify.txt), and the data written
#   before the renewals read back.
. /usr/lib/certrotor-e2e/lib.sh
. "$E2E_SHARE/node-lib.sh"
R=/ P=/var/lib/kubeadm/pki

REAL_KUBELET=0
if [ -f "$E2E_SHARE/real-kubelet" ]; then
  REAL_KUBELET=1
  e2e_check "containerd with its CRI plugin, pause imported" node_cri_containerd
  e2e_check "control-plane images imported into k8s.io" node_cp_images
fi
KUBE_VIP=0 LAB_VIP=""
if [ -f "$E2E_SHARE/kube-vip" ]; then KUBE_VIP=1 LAB_VIP="--kube-vip eks-anywhere"; fi
e2e_check "certrotor image imported" node_image
KUBEADM=0
if [ -f "$E2E_SHARE/kubeadm.oci.tar" ]; then
  KUBEADM=1
  e2e_check "host-containerd started" node_host_containerd
  e2e_check "kubeadm-bootstrap image imported into host-containerd (namespace default)" \
    sh -c "ctr -a $NODE_HC -n default images import '$E2E_SHARE/kubeadm.oci.tar' > /dev/null"
  e2e_check "kubeadm-bootstrap image not in the kubelet's containerd" \
    sh -c "! ctr -n k8s.io images ls -q | grep -q certrotor-kubeadm"
fi
if [ -f "$E2E_SHARE/first-boot" ]; then
  # host-ctr binds /run/api.sock into every container; nothing calls it here
  : > /run/api.sock
  node_certrotor --bootstrap certrotor first-boot ""
  # `run --once` as a host container's user-data: refused (exit 64, with the reason)
  mkdir -p /local/host-containers/certrotor
  printf 'run --once --platform none\n' > /local/host-containers/certrotor/user-data
  e2e_host_ctr_run --superpowered certrotor "$NODE_IMG" > "$E2E_OUT/host-run-once.json" \
    2> "$E2E_OUT/host-run-once.log"
  echo $? > "$E2E_OUT/host-run-once.rc"
  rm -f /run/api.sock
fi
if [ $KUBEADM = 1 ]; then
  # a node as kubeadm v1.20.2 makes it: RSA-2048 keys (ECDSA came with kubeadm 1.31)
  NODE_KEY_ALG=rsa-2048
  # shellcheck disable=SC2086 # LAB_VIP: lab init's words
  e2e_check "lab node (RSA, expires in 2d)" node_lab / --expires-in 2d $LAB_VIP
else
  # shellcheck disable=SC2086 # LAB_VIP: lab init's words
  e2e_check "lab node (expires in 2d)" node_lab / --expires-in 2d $LAB_VIP
fi
node_real_cp /
if [ -f "$E2E_SHARE/kubeadm.oci.tar" ]; then
  # What EKS Anywhere leaves in the API: its kubeadm-bootstrap host container, disabled once it
  # made the node
  node_settings / /var/lib/e2e-settings.json
  sed -i 's|^{|{"host-containers":{"kubeadm-bootstrap":{"source":"localhost/certrotor-kubeadm:v1.20.2","enabled":false,"superpowered":true}},|' \
    /var/lib/e2e-settings.json
fi
e2e_check "apiserver-sim on /run/api.sock" node_api / /run/api.sock node
if [ $REAL_KUBELET = 1 ]; then
  node_real_kubelet / node
else
  node_kubelet / node
fi
e2e_check "control plane healthy before" node_wait_healthy / 0
if [ $KUBE_VIP = 1 ]; then
  node_vip_step "kube-vip's container running" e2e_wait_for $NODE_START_S pidof kube-vip
fi
if [ $REAL_KUBELET = 1 ]; then
  node_pids pids-before.txt
  # what the real kubelet made of the API's rendering: one sandbox (the real pause) and one
  # container per rendered static pod
  ls /etc/kubernetes/static-pods > "$E2E_OUT/static-pods.txt"
  ctr -n k8s.io tasks ls > "$E2E_OUT/tasks.txt" 2>&1
  ctr -n k8s.io containers ls > "$E2E_OUT/containers.txt" 2>&1
  for pid in $(awk '$3 == "RUNNING" {print $2}' "$E2E_OUT/tasks.txt"); do
    cat "/proc/$pid/comm" >> "$E2E_OUT/task-comms.txt"
  done
fi
node_configmap_before /
if [ $KUBE_VIP = 1 ]; then
  # it acquires the Lease once admin.conf's group is bound (node_configmap_before)
  node_vip_step "kube-vip holds kube-system/plndr-cp-lock" \
    e2e_wait_for $NODE_UP_S node_vip_lease vip-lease-before
fi
node_readyz_start / 0 readyz.txt
node_load_start guest-load.txt
e2e_check "etcd put before renewal" node_etcdctl / 0 put /e2e/before "$(cat "$E2E_SHARE/token")"
node_pki_sums pki-before.sha /
node_served served-before.txt / 0

# The restart bound follows from this boot's own first start of the control plane.
RT=$(node_restart_timeout)
e2e_save restart-timeout "$RT"
if [ $KUBE_VIP = 1 ]; then
  node_vip_step "kube-vip's Lease written again before the renewal" \
    e2e_wait_for $NODE_START_S node_vip_lease_written vip-lease-before vip-lease-held
  node_vip_step "kube-vip seen before the renewal" node_vip_snapshot before
fi
# the default `--restart live`, spelled out (issue 11)
node_certrotor --superpowered certrotor run \
  "run --once --platform bottlerocket --restart-timeout $RT --reload-timeout $RT --poll-interval 200ms --restart live --output json"
e2e_check "certrotor run exit 0" [ "$(cat "$E2E_OUT/run.rc")" = 0 ]

e2e_check "control plane healthy after" node_wait_healthy / 0
if [ $REAL_KUBELET = 1 ]; then node_pids pids-after.txt; fi
if [ $KUBE_VIP = 1 ]; then
  node_vip_step "kube-vip seen after the renewal" node_vip_snapshot after
  node_vip_step "kube-vip's Lease read after the renewal" node_vip_lease vip-lease-after
  node_vip_step "kube-vip's Lease written again after the renewal" \
    e2e_wait_for $NODE_START_S node_vip_lease_written vip-lease-after vip-lease-again
fi
node_readyz_stop
node_load_stop
node_kubectl_after /
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

if [ $KUBEADM = 1 ]; then
  # ---- the same node, renewed again by the real kubeadm (certrotor's kubeadm engine) ----------
  # kubeadm v1.20.2 has no super-admin.conf (kubeadm 1.29): set aside, as on such a node
  mv /var/lib/kubeadm/super-admin.conf /var/tmp/super-admin.conf
  node_pki_sums kubeadm-pki-before.sha /
  node_served kubeadm-served-before.txt / 0
  certs=""
  for c in apiserver apiserver-kubelet-client front-proxy-client apiserver-etcd-client \
    etcd-server etcd-peer etcd-healthcheck-client admin.conf controller-manager.conf scheduler.conf; do
    certs="$certs --cert $c"
  done
  node_certrotor --superpowered certrotor kubeadm-run \
    "run --once --platform bottlerocket --restart-timeout $RT --reload-timeout $RT --poll-interval 200ms --restart live --output json --engine kubeadm$certs"
  e2e_check "certrotor run --engine kubeadm exit 0" [ "$(cat "$E2E_OUT/kubeadm-run.rc")" = 0 ]
  e2e_check "control plane healthy after the kubeadm engine's renewal" node_wait_healthy / 0
  node_kubectl_after / kubeadm-renewed kubeadm-
  e2e_save kubeadm-etcd-after "$(node_etcdctl / 0 get --print-value-only /e2e/before)"
  node_pki_sums kubeadm-pki-after.sha /
  node_served kubeadm-served-after.txt / 0
  node_check kubeadm-check-after /
  node_save_state / kubeadm-state
  ctr -n k8s.io containers ls -q > "$E2E_OUT/k8s-containers.txt" 2>&1
  ctr -a "$NODE_HC" -n default containers ls -q > "$E2E_OUT/host-containers.txt" 2>&1
  ls /var/lib/certrotor/engine > "$E2E_OUT/engine-staging.txt" 2>&1 || true
fi

if [ -f "$E2E_SHARE/readme-exec.txt" ]; then
  e2e_check "certrotor image imported into host-containerd" \
    sh -c "ctr -a $NODE_HC -n default images import --all-platforms '$E2E_SHARE/certrotor.oci.tar' > /dev/null"
  mkdir -p /local/host-containers/certrotor
  printf 'daemon --interval 6h --within 60d\n' > /local/host-containers/certrotor/user-data
  export CONTAINERD_ADDRESS="$NODE_HC"
  e2e_check "certrotor daemon started as a host container in host-containerd" \
    e2e_host_ctr_run --superpowered --detach certrotor "$NODE_IMG"
  unset CONTAINERD_ADDRESS
  # the daemon's first pass finds nothing due (both passes above renewed for a year); the bound
  # only stops a hang
  e2e_check "the daemon's first pass recorded" \
    e2e_wait_for $NODE_UP_S grep -q '"daemon"' /var/lib/certrotor/last-pass.json
  apiclient() { [ "$1" = exec ] || return 99; shift; node_apiexec "$@"; }
  _n=0
  while IFS= read -r _line || [ -n "$_line" ]; do
    [ -n "$_line" ] || continue
    printf '%s\n' "$_line" > "$E2E_OUT/exec-$_n.cmd"
    eval "$_line" < /dev/null > "$E2E_OUT/exec-$_n.out" 2> "$E2E_OUT/exec-$_n.err"
    echo $? > "$E2E_OUT/exec-$_n.rc"
    _n=$((_n + 1))
  done < "$E2E_SHARE/readme-exec.txt"
  e2e_save exec-count "$_n"
  ctr -a "$NODE_HC" tasks kill -s SIGTERM certrotor > /dev/null 2>&1
  # the daemon has stopped before anything else runs on the node (a rotation command would wait
  # for its lock; the bound only stops a hang), and its container is removed, as host-ctr does
  # when a host container is disabled: both containerds' runc shims keep their state under
  # /run/containerd/runc/<namespace>, so a container of the same name left in host-containerd
  # keeps the next `certrotor` host container from being created ("container with given ID
  # already exists")
  e2e_check "the daemon's host container stopped" e2e_wait_for $NODE_START_S \
    sh -c "! ctr -a $NODE_HC tasks ls | grep -q '^certrotor .*RUNNING'"
  e2e_check "the daemon's host container removed" sh -c \
    "ctr -a $NODE_HC tasks rm -f certrotor > /dev/null 2>&1; ctr -a $NODE_HC containers rm certrotor"
fi

if [ -f "$E2E_SHARE/ca-rotate" ] && [ $REAL_KUBELET = 1 ]; then
  # ---- the cluster CA rotated under the real kubelet, registered, serving `kubectl logs` --------
  cp /var/lib/kubeadm/pki/ca.crt "$E2E_OUT/ca-old.crt"
  e2e_save ca-old.sha "$(node_file_sha /var/lib/kubeadm/pki/ca.crt)"
  e2e_check "the API rendered the kubelet's client CA from kubernetes.cluster-certificate" \
    cmp -s /var/lib/kubeadm/pki/ca.crt /etc/kubernetes/pki/ca.crt
  e2e_check "the real kubelet registered the Bottlerocket way" node_kubelet_register / registered
  e2e_check "Node cp-1 registered with the real apiserver" \
    e2e_wait_for $NODE_UP_S node_kubectl / get node cp-1
  # what kubeadm's mark-control-plane phase (v1.20) puts on the node EKS Anywhere makes
  e2e_check "Node cp-1 labelled a control plane" node_kubectl / label node cp-1 --overwrite \
    node-role.kubernetes.io/master= node-role.kubernetes.io/control-plane=
  # etcd: a pod the kubelet mirrors that the cluster CA's rotation never restarts (its CA is
  # another), so that a failed read is the path through the kubelet, not the pod
  e2e_check "kubectl logs etcd-cp-1 (through the registered kubelet)" \
    e2e_wait_for $NODE_UP_S node_kubectl / logs etcd-cp-1 --namespace=kube-system --tail=1
  e2e_check "control plane healthy before the CA rotation" node_wait_healthy / 0
  node_ca_saved ca-before
  node_logs_poll_start etcd-cp-1 kubectl-logs.txt
  node_readyz_start / 0 ca-readyz.txt
  e2e_check "kubectl logs answered by the poller before the rotation" \
    e2e_wait_for $NODE_UP_S node_logs_ok_since kubectl-logs.txt 0
  RT=$(node_restart_timeout)
  for stage in rotate continue; do
    e2e_save "ca-$stage-begin-ms" "$(node_uptime_ms)"
    node_certrotor --superpowered certrotor "ca-$stage" \
      "ca $stage --ca ca --platform bottlerocket --restart-timeout $RT --reload-timeout $RT --poll-interval 200ms --output json"
    _end=$(node_uptime_ms)
    e2e_save "ca-$stage-end-ms" "$_end"
    e2e_check "certrotor ca $stage --ca ca exit 0" [ "$(cat "$E2E_OUT/ca-$stage.rc")" = 0 ]
    e2e_check "control plane healthy after ca $stage" node_wait_healthy / 0
    node_ca_saved "ca-$stage"
    # the kubelet and kube-apiserver are up again (the API's restart command returned once the
    # kubelet answered, node_wait_healthy): one poll, a kubectl call on a loaded host
    e2e_check "kubectl logs answered after ca $stage" \
      e2e_wait_for $NODE_START_S node_logs_ok_since kubectl-logs.txt "$_end"
    [ "$(cat "$E2E_OUT/ca-$stage.rc")" = 0 ] || break
  done
  node_logs_poll_stop
  node_readyz_stop
  e2e_save ca-new.sha "$(node_file_sha /var/lib/kubeadm/pki/ca.crt)"
  node_ca_verify "$E2E_OUT/ca-old.crt" /var/lib/kubeadm/pki/ca.crt ca-verify.txt
  node_kubectl_after / ca-rotated ca-
  e2e_save ca-etcd-after "$(node_etcdctl / 0 get --print-value-only /e2e/before)"
  node_check ca-check-after /
  node_pids ca-pids-after.txt
fi
e2e_finish
