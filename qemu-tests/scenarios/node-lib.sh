# Control-plane node helpers for the certrotor scenarios (busybox ash, sourced after
# /usr/lib/certrotor-e2e/lib.sh; the harness puts this file in the share as node-lib.sh).
#
# A node root R (/ for the VM's own node, a folder for a second node) holds a `certrotor lab`
# node (var/lib/kubeadm, var/lib/kubelet, var/lib/etcd). It runs like a Bottlerocket node:
# apiserver-sim (the Bottlerocket API) renders the static pods from
# settings.kubernetes.static-pods.<name> into R/etc/kubernetes/static-pods, kubelet-sim runs
# them as host processes: Debian's etcd and the real kube-apiserver, kube-controller-manager
# and kube-scheduler v1.20.2 (/usr/bin), with the flags kubeadm v1.20.2 writes. certrotor runs
# from its OCI image through containerd as a host or bootstrap container (e2e_host_ctr_run).
# kubectl v1.20.2 (/usr/bin/kubectl) talks to the apiserver with the node's admin.conf.
# Every wait is a polled condition with a deadline.

NODE_IMG=localhost/certrotor:e2e
# Under TCG the real control plane is slow: the longest wait for it to be healthy, and certrotor's
# --restart-timeout (a healthy component ends the wait as soon as it answers). From the share
# (files up-s / restart-s) when the harness writes them.
NODE_UP_S=$(cat "$E2E_SHARE/up-s" 2> /dev/null || echo 900)
NODE_RESTART_S=$(cat "$E2E_SHARE/restart-s" 2> /dev/null || echo 600)

# node_image: imports the certrotor image unless containerd has it (it persists in /var)
node_image() {
  e2e_image_present "$NODE_IMG" || e2e_import_image "$E2E_SHARE/certrotor.oci.tar" > /dev/null
}

# node_lab ROOT LAB-INIT-ARGS...   writes a Bottlerocket-layout lab node (ECDSA P-256, node IP
# 127.0.0.1) into ROOT: lab init needs an empty folder, so it goes to /var/tmp first.
node_lab() {
  _root=$1; shift
  _tmp=/var/tmp/lab.$$
  rm -rf "$_tmp"
  certrotor lab init "$_tmp" --layout bottlerocket --advertise-address 127.0.0.1 \
    --key-algorithm ecdsa-p256 "$@" > /dev/null || return 1
  mkdir -p "$_root/var/lib"
  cp -a "$_tmp/var/lib/." "$_root/var/lib/" && rm -rf "$_tmp"
}

# node_settings ROOT FILE   Bottlerocket settings enabling every manifest of ROOT as a static pod
node_settings() {
  _first=1
  printf '{"kubernetes":{"static-pods":{' > "$2"
  for _m in "$1"/var/lib/kubeadm/manifests/*.yaml; do
    [ "$_first" = 1 ] || printf ',' >> "$2"
    _first=0
    printf '"%s":{"manifest":"%s","enabled":true}' "$(basename "$_m" .yaml)" \
      "$(openssl base64 -A < "$_m")" >> "$2"
  done
  printf '}}}\n' >> "$2"
}

# node_api ROOT SOCKET NAME   starts apiserver-sim (settings persist in ROOT/var/lib/bottlerocket-sim)
node_api() {
  [ -s "$1/var/lib/e2e-settings.json" ] || node_settings "$1" "$1/var/lib/e2e-settings.json"
  mkdir -p "$(dirname "$2")"
  apiserver-sim --socket "$2" --root "$1" --settings "$1/var/lib/e2e-settings.json" \
    >> "$E2E_OUT/$3-apiserver-sim.log" 2>&1 &
  e2e_wait_for 30 test -S "$2"
}

# node_kubelet ROOT NAME [ENV=VALUE...]   starts kubelet-sim on ROOT's static pods (the pods
# inherit the environment)
node_kubelet() {
  _root=$1 _name=$2; shift 2
  if [ "$(cat "$E2E_SHARE/real-kubelet" 2> /dev/null)" = yes ]; then
    node_real_kubelet "$_root" "$_name"
    return
  fi
  mkdir -p "$_root/var/log/pods"
  env "$@" kubelet-sim --manifests "$_root/etc/kubernetes/static-pods" \
    --state-dir "$_root/var/lib/kubelet-sim" --root "$_root" --log-dir "$_root/var/log/pods" \
    --start-delay-ms 300 >> "$E2E_OUT/$_name-kubelet-sim.log" 2>&1 &
  e2e_save "$_name-kubelet-started-ms" "$(node_now_ms)"
}

# node_real_kubelet ROOT NAME   instead of kubelet-sim (share file `real-kubelet` = yes): the real
# kubelet v1.20.2 ($E2E_SHARE/kubelet), standalone, with containerd's CRI. containerd is
# restarted with the CRI plugin on; the component images ($E2E_SHARE/k8s-images/*.tar, built
# without docker: kube-apiserver, kube-controller-manager, kube-scheduler, etcd, pause) are
# imported into namespace k8s.io; staticPodPath is ROOT/etc/kubernetes/static-pods, where the
# Bottlerocket API renders the manifests. Times in $E2E_OUT/NAME-kubelet-times.txt.
node_real_kubelet() {
  _root=$1 _name=$2
  _t0=$(e2e_uptime)
  mkdir -p /var/lib/e2e-bin /var/lib/kubelet "$_root/etc/kubernetes/static-pods"
  cp "$E2E_SHARE/kubelet" /var/lib/e2e-bin/kubelet && chmod 0755 /var/lib/e2e-bin/kubelet || return 1
  cat > /etc/containerd/cri.toml << 'TOML'
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "k8s.gcr.io/pause:3.2"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
TOML
  for _p in $(pidof containerd); do kill "$_p"; done
  e2e_wait_for 30 sh -c '! pidof containerd' || return 1
  containerd --config /etc/containerd/cri.toml >> "$E2E_OUT/$_name-containerd-cri.log" 2>&1 &
  e2e_wait_for 60 ctr version || return 1
  for _t in "$E2E_SHARE"/k8s-images/*.tar; do
    ctr -n k8s.io images import "$_t" > /dev/null || return 1
  done
  _t1=$(e2e_uptime)
  /var/lib/e2e-bin/kubelet --container-runtime=remote \
    --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --pod-manifest-path="$_root/etc/kubernetes/static-pods" --cgroup-driver=cgroupfs \
    --fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable= \
    --make-iptables-util-chains=false --root-dir=/var/lib/kubelet \
    --hostname-override=certrotor-e2e --v=2 >> "$E2E_OUT/$_name-kubelet.log" 2>&1 &
  echo "containerd-cri+images $(awk "BEGIN{print $_t1 - $_t0}") s" > "$E2E_OUT/$_name-kubelet-times.txt"
}

node_now_ms() { echo $(( $(date +%s) * 1000 )); }

# node_https_ok PORT PATH [s_client options...]   GET https://127.0.0.1:PORT/PATH answers 200
node_https_ok() {
  _port=$1 _path=$2; shift 2
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$_path" |
    timeout 10 openssl s_client -quiet -connect "127.0.0.1:$_port" "$@" 2> /dev/null |
    head -n1 | grep -q ' 200 '
}
# node_served_sha PORT [s_client options...]   SHA-256 of the DER certificate served on PORT
node_served_sha() {
  _port=$1; shift
  timeout 10 openssl s_client -connect "127.0.0.1:$_port" "$@" < /dev/null 2> /dev/null |
    openssl x509 -outform der 2> /dev/null | sha256sum | cut -c1-64
}
# node_file_sha CERT   SHA-256 of the certificate file's DER
node_file_sha() { openssl x509 -in "$1" -outform der | sha256sum | cut -c1-64; }

# ---- the stacked control plane at ROOT with port offset O ------------------------------------
# node_etcdctl ROOT O ARGS...   etcdctl with the healthcheck client certificate
node_etcdctl() {
  _p=$1/var/lib/kubeadm/pki/etcd _o=$2; shift 2
  ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$((2379 + _o))" --cacert="$_p/ca.crt" \
    --cert="$_p/healthcheck-client.crt" --key="$_p/healthcheck-client.key" \
    --dial-timeout=3s --command-timeout=5s "$@"
}
node_apiserver_ok() {
  _p=$1/var/lib/kubeadm/pki
  node_https_ok $((6443 + $2)) /readyz -cert "$_p/apiserver-kubelet-client.crt" \
    -key "$_p/apiserver-kubelet-client.key"
}
node_kcm_ok() { node_https_ok $((10257 + $1)) /healthz; }
node_sched_ok() { node_https_ok $((10259 + $1)) /healthz; }
# node_cp_healthy ROOT O [WITH-ETCD=1]
node_cp_healthy() {
  if [ "${3:-1}" = 1 ]; then node_etcdctl "$1" "$2" endpoint health > /dev/null 2>&1 || return 1; fi
  node_apiserver_ok "$1" "$2" && node_kcm_ok "$2" && node_sched_ok "$2"
}
# node_wait_healthy ROOT O SECONDS [WITH-ETCD]   records how long it took
node_wait_healthy() {
  _t0=$(e2e_uptime)
  e2e_wait_for "$3" node_cp_healthy "$1" "$2" "${4:-1}" || return 1
  _dt=$(awk "BEGIN{print $(e2e_uptime) - $_t0}")
  e2e_log "control plane at $1 healthy after $_dt s"
  echo "$1 $_dt" >> "$E2E_OUT/healthy-times.txt"
}

# ---- kubectl v1.20.2 against the real apiserver ------------------------------------------
# node_kubectl ROOT ARGS...   kubectl with ROOT's admin.conf as it is on disk now
node_kubectl() {
  _r=$1; shift
  kubectl --kubeconfig "$_r/var/lib/kubeadm/admin.conf" --request-timeout=60s "$@"
}
# node_grant_admins ROOT   what `kubeadm init` v1.29+ (the lab's layout) does once the apiserver
# is up: bind admin.conf's group kubeadm:cluster-admins to cluster-admin, with super-admin.conf
# (system:masters). Idempotent (the binding persists in etcd across boots).
node_grant_admins() {
  _sa=$1/var/lib/kubeadm/super-admin.conf
  [ -f "$_sa" ] || return 0
  kubectl --kubeconfig "$_sa" --request-timeout=60s get clusterrolebinding \
    kubeadm:cluster-admins > /dev/null 2>&1 && return 0
  kubectl --kubeconfig "$_sa" --request-timeout=60s create clusterrolebinding \
    kubeadm:cluster-admins --clusterrole=cluster-admin --group=kubeadm:cluster-admins
}
# node_kubectl_before ROOT   writes the ConfigMap certrotor-e2e (data.token = the share's token)
# through the apiserver, before a renewal
node_kubectl_before() {
  e2e_check "cluster-admins bound (kubeadm init)" node_grant_admins "$1"
  e2e_check "kubectl: ConfigMap written before the renewal" node_kubectl "$1" create configmap \
    certrotor-e2e --namespace=default --from-literal=token="$(cat "$E2E_SHARE/token")"
}
# node_kubectl_after ROOT NAME   with the admin.conf on disk now: kubectl lists the namespaces
# ($E2E_OUT/NAME-namespaces.txt) and reads the ConfigMap back ($E2E_OUT/NAME-configmap.txt)
node_kubectl_after() {
  e2e_check "kubectl get namespaces ($2)" sh -c \
    "kubectl --kubeconfig '$1/var/lib/kubeadm/admin.conf' --request-timeout=60s get namespaces -o name > '$E2E_OUT/$2-namespaces.txt'"
  e2e_check "kubectl reads the ConfigMap back ($2)" sh -c \
    "kubectl --kubeconfig '$1/var/lib/kubeadm/admin.conf' --request-timeout=60s get configmap certrotor-e2e --namespace=default -o jsonpath='{.data.token}' > '$E2E_OUT/$2-configmap.txt'"
}

# ---- control-plane unavailability: the real apiserver's /readyz, polled ------------------------
# node_readyz_start ROOT O NAME   polls https://127.0.0.1:(6443+O)/readyz every 0.5 s in the
# background; one line per poll in $E2E_OUT/NAME: "<uptime seconds> <1 ready | 0 not>"
node_readyz_start() {
  ( while :; do
      if node_apiserver_ok "$1" "$2"; then _r=1; else _r=0; fi
      echo "$(e2e_uptime) $_r" >> "$E2E_OUT/$3"
      sleep 0.5
    done ) &
  NODE_READYZ_PID=$!
}
node_readyz_stop() { kill "$NODE_READYZ_PID" 2> /dev/null; wait "$NODE_READYZ_PID" 2> /dev/null; true; }

# node_served NAME ROOT O   writes $E2E_OUT/NAME: "<component> <served sha> <file sha>" lines
node_served() {
  _p=$2/var/lib/kubeadm/pki _o=$3
  {
    if [ -f "$_p/etcd/server.crt" ]; then
      echo "etcd $(node_served_sha $((2379 + _o)) -cert "$_p/etcd/healthcheck-client.crt" \
        -key "$_p/etcd/healthcheck-client.key") $(node_file_sha "$_p/etcd/server.crt")"
    fi
    echo "kube-apiserver $(node_served_sha $((6443 + _o)) -cert "$_p/apiserver-kubelet-client.crt" \
      -key "$_p/apiserver-kubelet-client.key") $(node_file_sha "$_p/apiserver.crt")"
  } > "$E2E_OUT/$1"
}

# node_pki_sums NAME ROOT   sha256sum of every PKI file and kubeconfig (sorted) -> $E2E_OUT/NAME
node_pki_sums() {
  (cd "$2" && find var/lib/kubeadm/pki var/lib/kubeadm/*.conf var/lib/etcd/pki -type f \
    2> /dev/null | sort | xargs sha256sum) > "$E2E_OUT/$1"
}

# node_check NAME ROOT   certrotor check --output json (host binary; it takes the lock and
# recovers, so only after the containerised certrotor ran) -> $E2E_OUT/NAME.json, rc in NAME.rc
node_check() {
  certrotor check --root "$2" --output json > "$E2E_OUT/$1.json" 2> "$E2E_OUT/$1.err"
  echo $? > "$E2E_OUT/$1.rc"
}

# node_certrotor --superpowered|--bootstrap NAME OUT USER-DATA [--env K=V]...
# Runs the certrotor image the way Bottlerocket does: the command line comes from the
# container's user-data file (no arguments after the image). stdout (the JSON report) ->
# $E2E_OUT/OUT.json, stderr -> $E2E_OUT/OUT.log and the serial console (failpoint markers),
# exit status -> $E2E_OUT/OUT.rc (and returned).
node_certrotor() {
  _kind=$1 _cname=$2 _out=$3 _ud=$4; shift 4
  _dir=host-containers; [ "$_kind" = --bootstrap ] && _dir=bootstrap-containers
  mkdir -p "/local/$_dir/$_cname"
  printf '%s\n' "$_ud" > "/local/$_dir/$_cname/user-data"
  e2e_mark "CERTROTOR-BEGIN $_out"
  { e2e_host_ctr_run "$_kind" "$@" "$_cname" "$NODE_IMG" 2>&1 > "$E2E_OUT/$_out.json"
    echo $? > "$E2E_OUT/$_out.rc"; } | tee "$E2E_OUT/$_out.log"
  e2e_mark "CERTROTOR-END $_out rc=$(cat "$E2E_OUT/$_out.rc")"
  return "$(cat "$E2E_OUT/$_out.rc")"
}

# node_save_state ROOT PREFIX   copies kubelet-sim's pod state files to $E2E_OUT/PREFIX-<pod>.json
node_save_state() {
  for _f in "$1"/var/lib/kubelet-sim/*.json; do
    [ -f "$_f" ] && cp "$_f" "$E2E_OUT/$2-$(basename "$_f")"
  done
}
