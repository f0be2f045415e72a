# Control-plane node helpers for the certrotor scenarios (busybox ash, sourced after
# /usr/lib/certrotor-e2e/lib.sh; the harness puts this file in the share as node-lib.sh).
#
# A node root R (/ for the VM's own node, a folder for a second node) holds a `certrotor lab`
# node (var/lib/kubeadm, var/lib/kubelet, var/lib/etcd). It runs like a Bottlerocket node:
# apiserver-sim (the Bottlerocket API) renders the static pods from
# settings.kubernetes.static-pods.<name> into R/etc/kubernetes/static-pods, kubelet-sim runs
# them as host processes (etcd = Debian's etcd, the rest the real kube-apiserver,
# controller-manager and scheduler v1.20.2 from /usr/lib/k8s), certrotor runs from its
# OCI image through containerd as a host or bootstrap container (e2e_host_ctr_run).
# Every wait is a polled condition with a deadline, and no deadline measures speed: each one
# only stops a hang, and follows from what it waits for (the bounds below).

# NODE_UP_S: the real control plane (kube-apiserver v1.20.2 and the others, under TCG) coming up
# or back. Nothing bounds its start but the machine: 60-170 s on an idle host, several times
# that on a loaded one (one CI run saw over 300 s), so generous: a hang stop only.
NODE_UP_S=1200
# NODE_START_S: a small local process coming up (apiserver-sim's socket, containerd, etcd) on a
# loaded host.
NODE_START_S=300

NODE_IMG=localhost/certrotor:e2e
NODE_BIN=/run/e2e-bin
# A writable HOME (the image's /root is read-only): kubectl keeps the API discovery it fetched
# in ~/.kube/cache and asks again only after 10 minutes, instead of at every call (each a few
# dozen requests, slow under TCG).
export HOME=/var/tmp/e2e-home
mkdir -p "$HOME"

# node_image: imports the certrotor image unless containerd has it (it persists in /var)
node_image() {
  e2e_image_present "$NODE_IMG" || e2e_import_image "$E2E_SHARE/certrotor.oci.tar" > /dev/null
}

# node_lab ROOT LAB-INIT-ARGS...   writes a Bottlerocket-layout lab node (ECDSA P-256 unless
# NODE_KEY_ALG says otherwise, node IP 127.0.0.1) into ROOT: lab init needs an empty folder, so
# it goes to /var/tmp first.
node_lab() {
  _root=$1; shift
  _tmp=/var/tmp/lab.$$
  rm -rf "$_tmp"
  certrotor lab init "$_tmp" --layout bottlerocket --advertise-address 127.0.0.1 \
    --key-algorithm "${NODE_KEY_ALG:-ecdsa-p256}" "$@" > /dev/null || return 1
  mkdir -p "$_root/var/lib"
  cp -a "$_tmp/var/lib/." "$_root/var/lib/" && rm -rf "$_tmp"
}

# node_settings ROOT FILE   Bottlerocket settings enabling every manifest of ROOT as a static pod;
# with ROOT's cluster CA (a control plane), kubernetes.cluster-certificate = its base64, as
# EKS Anywhere sets it (`apiclient set kubernetes.cluster-certificate=<b64 ca.crt>`,
# bottlerocket-api.md §3.4): the API renders it as the kubelet's client CA file
# /etc/kubernetes/pki/ca.crt (§2.5)
node_settings() {
  _first=1
  printf '{"kubernetes":{' > "$2"
  if [ -f "$1/var/lib/kubeadm/pki/ca.crt" ]; then
    printf '"cluster-certificate":"%s",' "$(openssl base64 -A < "$1/var/lib/kubeadm/pki/ca.crt")" >> "$2"
  fi
  printf '"static-pods":{' >> "$2"
  for _m in "$1"/var/lib/kubeadm/manifests/*.yaml; do
    [ "$_first" = 1 ] || printf ',' >> "$2"
    _first=0
    printf '"%s":{"manifest":"%s","enabled":true}' "$(basename "$_m" .yaml)" \
      "$(openssl base64 -A < "$_m")" >> "$2"
  done
  printf '}}}\n' >> "$2"
}

# node_api ROOT SOCKET NAME   starts apiserver-sim (settings persist in ROOT/var/lib/bottlerocket-sim);
# its kubernetes service's restart command (`systemctl try-restart kubelet.service`) is
# node_kubelet_restart: it restarts the real kubelet when one runs (node_real_kubelet), and does
# nothing under kubelet-sim, as try-restart does nothing to a unit that is not running
node_api() {
  [ -s "$1/var/lib/e2e-settings.json" ] || node_settings "$1" "$1/var/lib/e2e-settings.json"
  mkdir -p "$(dirname "$2")"
  apiserver-sim --socket "$2" --root "$1" --settings "$1/var/lib/e2e-settings.json" \
    --kubelet-restart ". /usr/lib/certrotor-e2e/lib.sh && . '$E2E_SHARE/node-lib.sh' && node_kubelet_restart" \
    >> "$E2E_OUT/$3-apiserver-sim.log" 2>&1 &
  e2e_wait_for $NODE_START_S test -S "$2"
}

# node_kubelet ROOT NAME   starts kubelet-sim on ROOT's static pods, whose commands are the real
# kube-apiserver, controller-manager and scheduler v1.20.2 and Debian's etcd
node_kubelet() {
  _root=$1 _name=$2; shift 2
  mkdir -p "$NODE_BIN" "$_root/var/log/pods"
  for _n in kube-apiserver kube-controller-manager kube-scheduler; do
    ln -sf "/usr/lib/k8s/$_n" "$NODE_BIN/$_n"   # the real v1.20.2 binaries
  done
  env PATH="$NODE_BIN:$PATH" kubelet-sim --manifests "$_root/etc/kubernetes/static-pods" \
    --state-dir "$_root/var/lib/kubelet-sim" --root "$_root" --log-dir "$_root/var/log/pods" \
    --start-delay-ms 300 >> "$E2E_OUT/$_name-kubelet-sim.log" 2>&1 &
  e2e_save "$_name-kubelet-started-ms" "$(node_now_ms)"
}

# node_clock_shift DAYS   moves the guest clock DAYS days (negative: back), as a node switched off
# that long finds it
node_clock_shift() {
  _new=$(( $(date +%s) + $1 * 86400 ))
  date -u -s "@$_new" > /dev/null 2>&1 ||
    date -u -s "$(date -u -d "@$_new" '+%Y-%m-%d %H:%M:%S')" > /dev/null 2>&1
  _now=$(date +%s)
  [ "$_now" -ge $(( _new - 5 )) ] && [ "$_now" -le $(( _new + 60 )) ]
}
node_now_ms() { echo $(( $(date +%s) * 1000 )); }

# One TLS probe: a request that asks the server to close when it has answered, so the probe
# ends with the answer (~0.8 s under TCG on an idle host); its 60 s bound only stops a hang.
# node_https_ok PORT PATH [s_client options...]   GET https://127.0.0.1:PORT/PATH answers 200
node_https_ok() {
  _port=$1 _path=$2; shift 2
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$_path" |
    timeout 60 openssl s_client -quiet -connect "127.0.0.1:$_port" "$@" 2> /dev/null |
    head -n1 | grep -q ' 200 '
}
# node_served_sha PORT [s_client options...]   SHA-256 of the DER certificate served on PORT
# (s_client prints it before the answer to the request, which ends the connection)
node_served_sha() {
  _port=$1; shift
  printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' |
    timeout 60 openssl s_client -connect "127.0.0.1:$_port" "$@" 2> /dev/null |
    openssl x509 -outform der 2> /dev/null | sha256sum | cut -c1-64
}
# node_file_sha CERT   SHA-256 of the certificate file's DER
node_file_sha() { openssl x509 -in "$1" -outform der | sha256sum | cut -c1-64; }

# ---- the stacked control plane at ROOT with port offset O ------------------------------------
# etcdctl's own bounds: a refused connection fails at once, so these only stop a request etcd
# never answers. 3 s and 5 s once failed an `etcdctl put` on a 2-core host running other jobs
# (the VM's etcd answered, late): 60 s, as for a TLS probe.
NODE_ETCDCTL_BOUNDS="--dial-timeout=60s --command-timeout=60s"
# node_etcdctl ROOT O ARGS...   etcdctl with the healthcheck client certificate
node_etcdctl() {
  _p=$1/var/lib/kubeadm/pki/etcd _o=$2; shift 2
  ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$((2379 + _o))" --cacert="$_p/ca.crt" \
    --cert="$_p/healthcheck-client.crt" --key="$_p/healthcheck-client.key" \
    $NODE_ETCDCTL_BOUNDS "$@"
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
# node_wait_healthy ROOT O [SECONDS] [WITH-ETCD]   (SECONDS: NODE_UP_S when empty or absent)
# records how long it took; the first time in a boot also in NODE_UP_FIRST_S
node_wait_healthy() {
  _t0=$(e2e_uptime)
  e2e_wait_for "${3:-$NODE_UP_S}" node_cp_healthy "$1" "$2" "${4:-1}" || return 1
  _dt=$(awk "BEGIN{print $(e2e_uptime) - $_t0}")
  e2e_log "control plane at $1 healthy after $_dt s"
  printf '%s ' "$_dt" >> "$E2E_OUT/healthy-times.txt"
  [ -n "${NODE_UP_FIRST_S:-}" ] || NODE_UP_FIRST_S=$_dt
}
# node_restart_timeout [FACTOR] [FLOOR]   certrotor's --restart-timeout, from how long this boot's
# real control plane took to come up the first time (node_wait_healthy): FACTOR (default 3)
# times that, at least FLOOR (default 300) seconds. A restart brings the same components up
# again on the same host in the same boot, so the bound scales with the host as it is now, not
# with an idle host. Before any measurement: NODE_UP_S.
node_restart_timeout() {
  if [ -z "${NODE_UP_FIRST_S:-}" ]; then echo "${NODE_UP_S}s"; return; fi
  awk "BEGIN{ s = ${1:-3} * $NODE_UP_FIRST_S; if (s < ${2:-300}) s = ${2:-300}; printf \"%ds\\n\", s + 0.5 }"
}
# node_seconds DURATION   "300s" -> 300
node_seconds() { echo "${1%s}"; }

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

# node_certrotor --superpowered|--bootstrap NAME OUT COMMAND-LINE [--env K=V]...
# Runs the certrotor image the way Bottlerocket does. A bootstrap container takes its command
# line from its user-data file (no arguments after the image). A host container's user-data
# must be `daemon` (Bottlerocket restarts a host container 45 s after it exits, and certrotor
# refuses anything else there), so a one-off command in a superpowered host container goes as
# arguments, as `apiclient exec certrotor certrotor <command>` gives them. stdout (the JSON
# report) -> $E2E_OUT/OUT.json, stderr -> $E2E_OUT/OUT.log and the serial console (failpoint
# markers), exit status -> $E2E_OUT/OUT.rc (and returned).
node_certrotor() {
  _kind=$1 _cname=$2 _out=$3 _ud=$4; shift 4
  _dir=host-containers _cmd="/usr/bin/certrotor $_ud"
  if [ "$_kind" = --bootstrap ]; then
    _dir=bootstrap-containers _cmd=""
    mkdir -p "/local/$_dir/$_cname"
    printf '%s\n' "$_ud" > "/local/$_dir/$_cname/user-data"
  fi
  e2e_mark "CERTROTOR-BEGIN $_out"
  # certrotor bounds its own waits (--restart-timeout, --cluster-wait, ...) but may be silent
  # while it waits: a line every 30 s tells the harness the guest is not hung.
  e2e_heartbeat_start "certrotor $_out still running"
  # shellcheck disable=SC2086 # _cmd: the command line's words
  { e2e_host_ctr_run "$_kind" "$@" "$_cname" "$NODE_IMG" $_cmd 2>&1 > "$E2E_OUT/$_out.json"
    echo $? > "$E2E_OUT/$_out.rc"; } | tee "$E2E_OUT/$_out.log"
  e2e_heartbeat_stop
  e2e_mark "CERTROTOR-END $_out rc=$(cat "$E2E_OUT/$_out.rc")"
  return "$(cat "$E2E_OUT/$_out.rc")"
}

# node_save_state ROOT PREFIX   copies kubelet-sim's pod state files to $E2E_OUT/PREFIX-<pod>.json
node_save_state() {
  for _f in "$1"/var/lib/kubelet-sim/*.json; do
    [ -f "$_f" ] && cp "$_f" "$E2E_OUT/$2-$(basename "$_f")"
  done
}

# ---- external etcd: an etcd node at $E beside the control plane at / ------------------------
# Two node roots in one VM (the reasons are in qemu-tests/tests/external_etcd.rs): the etcd node
# at /var/lib/nodes/etcd (API /run/etcd-node/api.sock), ports offset by 100.
E=/var/lib/nodes/etcd O=100 EP=/var/lib/nodes/etcd/var/lib/etcd/pki
CR=/.bottlerocket/rootfs
etcd_ok() {
  ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:$((2379 + O)) --cacert=$EP/ca.crt \
    --cert=$EP/etcdctl-etcd-client.crt --key=$EP/etcdctl-etcd-client.key \
    $NODE_ETCDCTL_BOUNDS "$@"
}
cp_client() {  # the etcd client certificate the control plane's apiserver manifest names
  echo "/var/lib/kubeadm/pki/$(sed -n 's/.*--etcd-certfile=\/etc\/kubernetes\/pki\///p' /var/lib/kubeadm/manifests/kube-apiserver.yaml)"
}
# node_external_pair: both lab nodes due in 2 days, their APIs and kubelets (the control plane
# the real kube-apiserver, controller-manager and scheduler), healthy, a key written to etcd
# (/e2e/before = the token) and a ConfigMap with kubectl, the control plane's etcd client
# certificate's SHA-256 saved
node_external_pair() {
  e2e_check "certrotor image imported" node_image
  _lab=/var/tmp/lab-x
  rm -rf $_lab
  e2e_check "lab nodes (external etcd, expire in 2d)" certrotor lab init $_lab --layout bottlerocket \
    --topology external-etcd --port-offset $O --advertise-address 127.0.0.1 \
    --key-algorithm ecdsa-p256 --expires-in 2d
  mkdir -p $E/var/lib && cp -a $_lab/etcd/var/lib/. $E/var/lib/ && cp -a $_lab/control-plane/var/lib/. /var/lib/
  rm -rf $_lab
  node_real_cp /
  e2e_check "etcd node API" node_api $E /run/etcd-node/api.sock etcd-node
  e2e_check "control-plane API" node_api / /run/api.sock cp
  node_kubelet $E etcd-node
  node_kubelet / cp
  e2e_check "etcd node healthy" e2e_wait_for $NODE_START_S etcd_ok endpoint health
  e2e_check "control plane healthy (apiserver reaches etcd)" node_wait_healthy / $O "" 0
  e2e_check "etcd put before" etcd_ok put /e2e/before "$(cat "$E2E_SHARE/token")"
  node_configmap_before /
  e2e_save cp-client-sha-before "$(node_file_sha "$(cp_client)")"
}

# ---- the real control plane: kubectl v1.20.2, /readyz polled ----------------------------------
# node_fast_apiserver ROOT   adds the start-up cuts measured under TCG to ROOT's kube-apiserver
# manifest (before node_settings encodes it): no API priority and fairness, no watch cache,
# no profiling, only the API groups the control plane and the test use (the figures are in
# ARCHITECTURE.md, "Doubles that remain").
NODE_FAST_APISERVER="--enable-priority-and-fairness=false --profiling=false --watch-cache=false --runtime-config=api/all=false,api/v1=true,rbac.authorization.k8s.io/v1=true,authentication.k8s.io/v1=true,authorization.k8s.io/v1=true,coordination.k8s.io/v1=true,scheduling.k8s.io/v1=true,storage.k8s.io/v1=true,policy/v1beta1=true,events.k8s.io/v1=true,apps/v1=true,certificates.k8s.io/v1=true,apiregistration.k8s.io/v1=true,node.k8s.io/v1=true,admissionregistration.k8s.io/v1=true,networking.k8s.io/v1=true,discovery.k8s.io/v1beta1=true,apiextensions.k8s.io/v1=true"
node_fast_apiserver() {
  _m=$1/var/lib/kubeadm/manifests/kube-apiserver.yaml
  _add=""
  for _f in $NODE_FAST_APISERVER; do _add="$_add\\n    - $_f"; done
  sed -i "s|^    - kube-apiserver\$|    - kube-apiserver$_add|" "$_m" && grep -q -- '--watch-cache=false' "$_m"
}
# node_kubectl ROOT ARGS...   kubectl v1.20.2 with ROOT's admin.conf as it is on disk now
node_kubectl() {
  _r=$1; shift
  kubectl --kubeconfig "$_r/var/lib/kubeadm/admin.conf" --request-timeout=60s "$@"
}
# node_grant_admins ROOT   what `kubeadm init` v1.29+ (the lab's layout) does once the apiserver
# is up: bind admin.conf's group kubeadm:cluster-admins to cluster-admin, with super-admin.conf
# (NODE_SUPER_ADMIN: where it was moved aside)
# (system:masters)
node_grant_admins() {
  _sa=${NODE_SUPER_ADMIN:-$1/var/lib/kubeadm/super-admin.conf}
  [ -f "$_sa" ] || return 0
  _out=$(kubectl --kubeconfig "$_sa" --request-timeout=60s create clusterrolebinding \
    kubeadm:cluster-admins --clusterrole=cluster-admin --group=kubeadm:cluster-admins 2>&1)
  _rc=$?
  echo "$_out"
  [ $_rc = 0 ] || echo "$_out" | grep -q AlreadyExists
}
# node_real_cp ROOT   the real kube-apiserver of ROOT's static pods with the start-up cuts
# (kubelet-sim runs the real kube-apiserver, controller-manager and scheduler v1.20.2); call
# before node_api encodes the manifests
node_real_cp() {
  e2e_check "apiserver manifest at $1: start-up cuts for TCG" node_fast_apiserver "$1"
}
# node_real_version   the image's kube-apiserver is the real v1.20.2 (not a stand-in)
node_real_version() { [ "$(/usr/lib/k8s/kube-apiserver --version)" = "Kubernetes v1.20.2" ]; }
# node_configmap_before ROOT   once the real apiserver is up: admin.conf's group bound (as
# kubeadm init does), and a ConfigMap holding the share's token written with kubectl v1.20.2
node_configmap_before() {
  e2e_check "real kube-apiserver v1.20.2" node_real_version
  e2e_check "cluster-admins bound (kubeadm init)" node_grant_admins "$1"
  e2e_check "kubectl: ConfigMap written before the renewal" node_kubectl "$1" create configmap \
    certrotor-e2e --namespace=default --from-literal=token="$(cat "$E2E_SHARE/token")"
}
# node_kubectl_after ROOT [WHICH] [PREFIX]   after the renewal (or its rollback: WHICH
# "restored", default "renewed"), with ROOT's admin.conf: the namespaces ->
# $E2E_OUT/PREFIXnamespaces.txt, the ConfigMap written before -> $E2E_OUT/PREFIXconfigmap.txt
node_kubectl_after() {
  e2e_check "kubectl (${2:-renewed} admin.conf) lists the namespaces" \
    node_kubectl_save "$1" "${3:-}namespaces.txt" get namespaces -o name
  e2e_check "kubectl (${2:-renewed} admin.conf) reads the ConfigMap back" \
    node_kubectl_save "$1" "${3:-}configmap.txt" get configmap certrotor-e2e \
    --namespace=default -o jsonpath='{.data.token}'
  cp "$1/var/log/pods/kube-apiserver.log" "$E2E_OUT/${3:-}kube-apiserver.log" 2> /dev/null
  true
}
# node_kubectl_save ROOT FILE ARGS...   node_kubectl ROOT ARGS > $E2E_OUT/FILE
node_kubectl_save() { _ks=$2; _kr=$1; shift 2; node_kubectl "$_kr" "$@" > "$E2E_OUT/$_ks"; }
# node_readyz_start ROOT O NAME   polls the real apiserver's https://127.0.0.1:(6443+O)/readyz
# in the background, 100 ms between probes (each probe, an openssl s_client, itself takes ~0.8 s
# under TCG: that is the resolution); one line per poll in $E2E_OUT/NAME: "<uptime> <1|0>"
node_readyz_start() {
  ( while :; do
      if node_apiserver_ok "$1" "$2"; then _r=1; else _r=0; fi
      echo "$(e2e_uptime) $_r" >> "$E2E_OUT/$3"
      sleep 0.1
    done ) &
  NODE_READYZ_PID=$!
}
node_readyz_stop() { kill "$NODE_READYZ_PID" 2> /dev/null; wait "$NODE_READYZ_PID" 2> /dev/null; true; }
# node_load_start FILE   every 5 s, "<uptime> <MemAvailable kB> <1-min load>" -> $E2E_OUT/FILE:
# what the guest had to spare while certrotor ran (a starved or swapping guest explains a slow
# restart); node_load_stop
node_load_start() {
  ( while :; do
      echo "$(e2e_uptime) $(awk '/^MemAvailable:/ {print $2}' /proc/meminfo) $(cut -d' ' -f1 /proc/loadavg)" \
        >> "$E2E_OUT/$1"
      sleep 5
    done ) &
  NODE_LOAD_PID=$!
}
node_load_stop() { kill "$NODE_LOAD_PID" 2> /dev/null; wait "$NODE_LOAD_PID" 2> /dev/null; true; }

# ---- the real kubelet (qemu-tests/tests/kubelet_control_plane.rs) ----------------------------
# node_cri_containerd   restarts containerd as Bottlerocket's kubelet-facing one (its CRI plugin
# on; the image's config turns it off for host containers), same socket and root, and imports
# the sandbox image (the real pause, $E2E_SHARE/pause.tar) into k8s.io. With NODE_CNI_CONF=1 it
# also writes a CNI network list with no plugin binaries behind it (qemu-tests/tests/
# days_off_400.rs): enough for containerd to report the runtime network ready, and so the Node
# Ready, when every pod uses the host's network, as the control-plane static pods do.
node_cri_containerd() {
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
  if [ "${NODE_CNI_CONF:-0}" = 1 ]; then
    mkdir -p /etc/cni/net.d
    printf '%s\n' '{"cniVersion":"0.4.0","name":"host-only","plugins":[{"type":"loopback"}]}' \
      > /etc/cni/net.d/10-host-only.conflist
  fi
  for _p in $(pidof containerd); do kill "$_p"; done
  e2e_wait_for $NODE_START_S sh -c '! pidof containerd' || return 1
  containerd --config /etc/containerd/cri.toml > "$E2E_OUT/containerd-cri.log" 2>&1 &
  e2e_wait_for $NODE_START_S ctr version || return 1
  ctr -n k8s.io images import "$E2E_SHARE/pause.tar" > /dev/null
}
# node_cp_images   imports the control-plane images ($E2E_SHARE/cp-images/*.tar: the real
# binaries packed without docker, named as ROOT's manifests name them) into k8s.io
node_cp_images() {
  for _t in "$E2E_SHARE"/cp-images/*.tar; do
    ctr -n k8s.io images import "$_t" > /dev/null || return 1
    e2e_log "imported $(basename "$_t")"
  done
}
# node_real_kubelet ROOT NAME [FLAG...]   starts the real kubelet v1.20.2 with containerd's CRI
# and runc on ROOT's static-pod folder (where the Bottlerocket API renders; NODE_KUBELET_PODS
# overrides it), node name cp-1, standalone (no apiserver) unless a FLAG gives --kubeconfig.
# Its command line and pid are kept in NODE_KUBELET_DIR (what systemd knows of kubelet.service),
# for node_kubelet_restart; its output goes to $E2E_OUT/NAME-kubelet.log. NODE_KUBELET_PID: its
# pid (node_kubelet_pid after a restart by the API).
NODE_KUBELET_DIR=/run/e2e-kubelet
node_real_kubelet() {
  _root=$1 _name=$2; shift 2
  _pods=${NODE_KUBELET_PODS:-$_root/etc/kubernetes/static-pods}
  mkdir -p "$_pods" "$NODE_KUBELET_DIR"
  echo "--container-runtime=remote \
    --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
    --pod-manifest-path=$_pods --cgroup-driver=cgroupfs \
    --fail-swap-on=false --cgroups-per-qos=false --enforce-node-allocatable= \
    --make-iptables-util-chains=false --root-dir=/var/lib/kubelet \
    --pod-infra-container-image=k8s.gcr.io/pause:3.2 --hostname-override=cp-1 \
    --v=2 $*" > "$NODE_KUBELET_DIR/args"
  echo "$_name" > "$NODE_KUBELET_DIR/name"
  : > "$E2E_OUT/$_name-kubelet.log"
  node_kubelet_launch
  NODE_KUBELET_PID=$(node_kubelet_pid)
  e2e_save "$_name-kubelet-started-ms" "$(node_now_ms)"
}
# node_kubelet_launch   starts the kubelet with the kept command line (no word has a space)
node_kubelet_launch() {
  # shellcheck disable=SC2046 # the kept command line's words
  /usr/lib/k8s/kubelet $(cat "$NODE_KUBELET_DIR/args") \
    >> "$E2E_OUT/$(cat "$NODE_KUBELET_DIR/name")-kubelet.log" 2>&1 < /dev/null &
  echo $! > "$NODE_KUBELET_DIR/pid"
}
node_kubelet_pid() { cat "$NODE_KUBELET_DIR/pid" 2> /dev/null; }
# node_alive PID   PID runs (a zombie does not: a kubelet started by the API's restart command
# is reparented to init, which reaps it late)
node_alive() {
  _st=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2> /dev/null)
  [ -n "$_st" ] && [ "$_st" != Z ]
}
node_gone() { ! node_alive "$1"; }
# node_uptime_ms   the guest's uptime in ms: the clock of the kubelet restarts and the pollers
node_uptime_ms() { awk '{printf "%d\n", $1 * 1000}' /proc/uptime; }
# node_kubelet_healthy   the kubelet's healthz (127.0.0.1:10248) answers ok (busybox's static
# wget crashes in its name lookup: nc)
node_kubelet_healthy() {
  [ "$(printf 'GET /healthz HTTP/1.0\r\n\r\n' | timeout 10 nc 127.0.0.1 10248 2> /dev/null | tail -n1)" = ok ]
}
# node_real_kubelet_stop   stops the real kubelet (SIGTERM, as systemctl stop; its containers
# keep running: kubelet.service has KillMode=process) and waits until it has exited
node_real_kubelet_stop() {
  _kp=$(node_kubelet_pid)
  [ -n "$_kp" ] || return 0
  kill "$_kp" 2> /dev/null
  e2e_wait_for $NODE_START_S node_gone "$_kp"
}
# node_kubelet_restart   the Bottlerocket API's restart command for the kubernetes service,
# `systemctl try-restart kubelet.service` (kubelet.service: Type=notify, KillMode=process): when
# the real kubelet runs, stops it and starts it again with the same command line, and returns
# once the new one is up (its healthz answers, about when it notifies systemd). Each restart is
# a line of $E2E_OUT/kubelet-restarts.txt: "<old pid> <new pid> <stop requested> <old exited>
# <new healthy>" (node_uptime_ms; a field "none" when it did not happen).
node_kubelet_restart() {
  _kp=$(node_kubelet_pid)
  [ -n "$_kp" ] && node_alive "$_kp" || return 0
  _t0=$(node_uptime_ms)
  kill "$_kp"
  _rc=0
  e2e_wait_for $NODE_START_S node_gone "$_kp" || _rc=1
  _t1=$(node_uptime_ms)
  node_kubelet_launch
  if e2e_wait_for $NODE_START_S node_kubelet_healthy; then _t2=$(node_uptime_ms); else _t2=none _rc=1; fi
  echo "$_kp $(node_kubelet_pid) $_t0 $_t1 $_t2" >> "$E2E_OUT/kubelet-restarts.txt"
  e2e_log "kubelet restarted by the API: pid $_kp -> $(node_kubelet_pid)"
  return $_rc
}
# node_kubelet_register ROOT NAME   the real kubelet again, now registered with ROOT's real
# kube-apiserver the way Bottlerocket runs it (what EKS Anywhere's bootstrap turns on once the
# control plane is up: standalone-mode=false, authentication-mode=tls): --kubeconfig
# /etc/kubernetes/kubelet/kubeconfig as the API renders it (core-kit's kubelet-kubeconfig:
# certificate-authority the file /etc/kubernetes/pki/ca.crt, the client pair
# /var/lib/kubelet/pki/kubelet-client-current.pem), its client CA the same file (the API renders
# it from kubernetes.cluster-certificate), anonymous requests refused (so kube-apiserver's
# kubelet client certificate must verify against it), every authenticated request allowed.
# The node's IP: kube-apiserver reaches the kubelet's server at the Node's InternalIP, and the
# kubelet refuses a loopback one ("nodeIP can't be loopback address": the Node then has no
# address, and `kubectl logs` none to go to); the VM has no NIC, so NODE_KUBELET_IP, an address
# of TEST-NET-1 on lo (not a loopback address, reached through lo). A CNI network list with no
# plugin behind it, as NODE_CNI_CONF does (containerd's CRI watches the folder), so that the
# Node is Ready: its control-plane pods all use the host's network.
NODE_KUBELET_IP=192.0.2.10
node_kubelet_register() {
  ip addr show dev lo | grep -q " $NODE_KUBELET_IP/" || ip addr add "$NODE_KUBELET_IP/32" dev lo || return 1
  mkdir -p /etc/cni/net.d /etc/kubernetes/kubelet
  printf '%s\n' '{"cniVersion":"0.4.0","name":"host-only","plugins":[{"type":"loopback"}]}' \
    > /etc/cni/net.d/10-host-only.conflist
  cat > /etc/kubernetes/kubelet/kubeconfig << 'YAML'
---
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: "/etc/kubernetes/pki/ca.crt"
    server: "https://127.0.0.1:6443"
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: kubelet
  name: kubelet
current-context: kubelet
users:
- name: kubelet
  user:
    client-certificate: "/var/lib/kubelet/pki/kubelet-client-current.pem"
    client-key: "/var/lib/kubelet/pki/kubelet-client-current.pem"
YAML
  [ -s /etc/kubernetes/pki/ca.crt ] || return 1
  node_real_kubelet_stop || return 1
  node_real_kubelet "$1" "$2" --kubeconfig=/etc/kubernetes/kubelet/kubeconfig \
    --client-ca-file=/etc/kubernetes/pki/ca.crt --anonymous-auth=false \
    --authorization-mode=AlwaysAllow --node-ip=$NODE_KUBELET_IP
}
# node_pids NAME   "<component> <pid> <parent's comm>" per component -> $E2E_OUT/NAME
node_pids() {
  for _c in etcd kube-apiserver kube-controller-manager kube-scheduler; do
    _pid=$(pidof "$_c" | cut -d' ' -f1)
    _pp=$(awk '/^PPid:/ {print $2}' "/proc/${_pid:-0}/status" 2> /dev/null)
    echo "$_c ${_pid:-none} $(cat "/proc/${_pp:-0}/comm" 2> /dev/null || echo none)"
  done > "$E2E_OUT/$1"
}

# ---- Bottlerocket's host-containerd (qemu-tests/tests/kubelet_control_plane.rs) ------------------
# NODE_HC: host-containerd's socket. node_host_containerd starts a second, real containerd the
# way Bottlerocket runs host-containerd for host and bootstrap containers (bottlerocket-api.md
# §3.1, Bottlerocket's host-containerd config: its own root, state and socket, CRI off), beside
# the kubelet's containerd.
NODE_HC=/run/host-containerd/containerd.sock
node_host_containerd() {
  mkdir -p /etc/host-containerd
  cat > /etc/host-containerd/config.toml << 'TOML'
version = 2
root = "/var/lib/host-containerd"
state = "/run/host-containerd"
disabled_plugins = [
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.native",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.grpc.v1.cri",
]

[grpc]
address = "/run/host-containerd/containerd.sock"
TOML
  containerd --config /etc/host-containerd/config.toml > "$E2E_OUT/host-containerd.log" 2>&1 &
  e2e_wait_for $NODE_START_S ctr -a "$NODE_HC" version
}
# node_apiexec TARGET CMD...   what `apiclient exec TARGET CMD...` runs on Bottlerocket: the API
# server's exec child, `ctr -a <host-containerd> task exec --exec-id apiexec-<16 random>` into
# the host container's task, with a cleared environment plus TERM=screen (bottlerocket-api.md
# §1.5); the exit status is the command's
node_apiexec() {
  _target=$1; shift
  _id=apiexec-$(tr -dc 'A-Za-z0-9' < /dev/urandom | head -c 16)
  env -i TERM=screen "$(command -v ctr)" -a "$NODE_HC" task exec --exec-id "$_id" "$_target" "$@"
}

# ---- EKS Anywhere's kube-vip under the real kubelet (qemu-tests/tests/kubelet_control_plane.rs)
# `lab init --kube-vip eks-anywhere` writes it: no probe, admin.conf (/var/lib/kubeadm) mounted as
# a single file at /etc/kubernetes/admin.conf. The kubelet runs it as a runc container from an
# OCI image of k8s-sim's `kube-vip manager` stand-in (entrypoint /kube-vip; $E2E_SHARE/cp-images)
# with its own mount namespace; it reads that kubeconfig once at start and holds the Lease
# kube-system/plndr-cp-lock through the real apiserver.
# node_kubeconfig_cert_sha FILE   SHA-256 of the DER client certificate embedded in a kubeconfig
# (what the stand-in logs it read: "read client certificate sha256 ...")
node_kubeconfig_cert_sha() {
  sed -n 's/^ *client-certificate-data: *//p' "$1" | head -n1 | openssl base64 -d -A |
    openssl x509 -outform der | sha256sum | cut -c1-64
}
# node_vip_lease NAME   kube-system/plndr-cp-lock read with kubectl v1.20.2 (admin.conf on disk):
# "<holder> <resourceVersion> <renewTime>" -> $E2E_OUT/NAME; fails while no one holds it
node_vip_lease() {
  node_kubectl / get lease plndr-cp-lock --namespace=kube-system \
    -o jsonpath='{.spec.holderIdentity} {.metadata.resourceVersion} {.spec.renewTime}' \
    > "$E2E_OUT/$1.tmp" 2> /dev/null || return 1
  [ -n "$(cut -d' ' -f1 "$E2E_OUT/$1.tmp")" ] || return 1
  mv "$E2E_OUT/$1.tmp" "$E2E_OUT/$1"
}
# node_vip_lease_written FROM NAME   the Lease, written (another resourceVersion, a holder) since
# it was saved in $E2E_OUT/FROM -> $E2E_OUT/NAME
node_vip_lease_written() {
  node_vip_lease "$2" && [ "$(cut -d' ' -f2 "$E2E_OUT/$2")" != "$(cut -d' ' -f2 "$E2E_OUT/$1")" ]
}
# node_vip_step DESCRIPTION CMD...   e2e_check, and the guest seconds it took appended to
# $E2E_OUT/kube-vip-steps.txt ("<seconds> <description>"): what kube-vip adds to the boot
node_vip_step() {
  _vt0=$(e2e_uptime)
  e2e_check "$@"
  echo "$(awk "BEGIN{print $(e2e_uptime) - $_vt0}") $1" >> "$E2E_OUT/kube-vip-steps.txt"
}
# node_vip_snapshot PREFIX   what the node shows of its kube-vip -> $E2E_OUT/PREFIX-kube-vip.txt
# ("key value" lines: its pid, its parent's comm, its containerd task (container id, image,
# runtime), the SHA-256 of the admin.conf its mount namespace shows and of the node's file, the
# client certificate's in the node's file, the mount's root in its mountinfo) and its container
# logs -> $E2E_OUT/PREFIX-kube-vip.log
node_vip_snapshot() {
  # One kube-vip process, the same a second later (at most 60 looks): kube-vip exits when it
  # loses its Lease (an apiserver slow to answer on a busy host) and the kubelet starts it
  # again; a snapshot taken as it exits would show half of one process. What the last look
  # saw is written either way: the test reads it.
  _vtry=0
  while [ "$_vtry" -lt 60 ]; do
    _vp=$(pidof kube-vip || true)
    sleep 1
    _vq=$(pidof kube-vip || true)
    if [ -n "$_vp" ] && [ "$_vp" = "$_vq" ] && [ "$(echo "$_vp" | wc -w)" = 1 ]; then
      break
    fi
    _vtry=$((_vtry + 1))
  done
  _vp=$(pidof kube-vip | cut -d' ' -f1)
  _vpp=$(awk '/^PPid:/ {print $2}' "/proc/${_vp:-0}/status" 2> /dev/null)
  _vc=$(ctr -n k8s.io tasks ls 2> /dev/null | awk -v p="${_vp:-none}" '$2 == p {print $1}')
  {
    echo "pid ${_vp:-none}"
    echo "count $(pidof kube-vip | wc -w)"
    echo "parent $(cat "/proc/${_vpp:-0}/comm" 2> /dev/null || echo none)"
    echo "task ${_vc:-none} $(ctr -n k8s.io containers ls 2> /dev/null | awk -v c="${_vc:-none}" '$1 == c {print $2, $3}')"
    echo "mounted $(sha256sum < "/proc/${_vp:-0}/root/etc/kubernetes/admin.conf" 2> /dev/null | cut -c1-64)"
    echo "node $(sha256sum < /var/lib/kubeadm/admin.conf | cut -c1-64)"
    echo "node-cert $(node_kubeconfig_cert_sha /var/lib/kubeadm/admin.conf)"
    echo "mount-root $(awk '$5 == "/etc/kubernetes/admin.conf" {print $4}' "/proc/${_vp:-0}/mountinfo" 2> /dev/null)"
  } > "$E2E_OUT/$1-kube-vip.txt"
  cat /var/log/pods/*kube-vip*/kube-vip/*.log > "$E2E_OUT/$1-kube-vip.log" 2> /dev/null
  true
}

# ---- the cluster CA rotated under the real kubelet (qemu-tests/tests/kubelet_control_plane.rs) --
# node_logs_poll_start POD NAME   every second, `kubectl logs POD -n kube-system --tail=1`
# (kubectl v1.20.2, admin.conf as it is on disk at each call): through kube-apiserver to the
# kubelet's server, as a user reads a pod's logs. One line per call in $E2E_OUT/NAME:
# "<begun> <ended> ok" or "<begun> <ended> fail <the first line it printed>" (node_uptime_ms).
node_logs_poll_start() {
  ( while :; do
      _lb=$(node_uptime_ms)
      if node_kubectl / logs "$1" --namespace=kube-system --tail=1 > /var/tmp/logs-poll.out 2>&1; then
        _lr=ok
      else
        _lr="fail $(grep -v '^ *$' /var/tmp/logs-poll.out | head -n1)"
      fi
      echo "$_lb $(node_uptime_ms) $_lr" >> "$E2E_OUT/$2"
      sleep 1
    done ) &
  NODE_LOGS_PID=$!
}
node_logs_poll_stop() { kill "$NODE_LOGS_PID" 2> /dev/null; wait "$NODE_LOGS_PID" 2> /dev/null; true; }
# node_logs_ok_since NAME MS   a call of the poller begun at or after MS succeeded
node_logs_ok_since() { awk -v t="$2" '$1 >= t && $3 == "ok" {f = 1} END {exit !f}' "$E2E_OUT/$1"; }
# node_ca_saved PREFIX   what the cluster CA is on the node now -> $E2E_OUT/PREFIX-*: the CA file
# (ca.crt, the signer ca.signer.crt when there is one), the API's settings and
# kubernetes.cluster-certificate decoded, the kubelet's client CA file the API rendered, and the
# kube-controller-manager manifest the API rendered into the static-pod folder
node_ca_saved() {
  cp /var/lib/kubeadm/pki/ca.crt "$E2E_OUT/$1-ca.crt"
  [ ! -f /var/lib/kubeadm/pki/ca.signer.crt ] || cp /var/lib/kubeadm/pki/ca.signer.crt "$E2E_OUT/$1-ca.signer.crt"
  cp /var/lib/bottlerocket-sim/settings.json "$E2E_OUT/$1-settings.json"
  sed -n 's/.*"cluster-certificate": *"\([^"]*\)".*/\1/p' /var/lib/bottlerocket-sim/settings.json |
    openssl base64 -d -A > "$E2E_OUT/$1-cluster-certificate.pem"
  cp /etc/kubernetes/pki/ca.crt "$E2E_OUT/$1-kubelet-ca.crt"
  cp /etc/kubernetes/static-pods/kube-controller-manager "$E2E_OUT/$1-kcm.yaml"
}
# node_served_pem PORT OUT [s_client options...]   the certificate served on 127.0.0.1:PORT -> OUT
node_served_pem() {
  _port=$1 _o=$2; shift 2
  printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' |
    timeout 60 openssl s_client -connect "127.0.0.1:$_port" "$@" 2> /dev/null |
    openssl x509 > "$_o" 2> /dev/null
}
# node_ca_verify OLD NEW NAME   every certificate the node holds or serves, verified with the
# old cluster CA alone and with the new one alone -> $E2E_OUT/NAME, a line each:
# "<what> <rc with OLD> <rc with NEW> <issuer CN>" (rc: openssl verify's exit status, none when
# nothing was read). What: every certificate file under var/lib/kubeadm/pki but the CAs'
# (pki/<file>), each kubeconfig's client certificate (kubeconfig/<file>), the kubelet's client
# certificate (kubelet-client), and what kube-apiserver, the kubelet, kube-controller-manager
# and kube-scheduler serve (served/<port>).
node_ca_verify() {
  _old=$1 _new=$2 _out=$E2E_OUT/$3 _t=/var/tmp/ca-verify
  rm -rf "$_t" && mkdir -p "$_t"
  : > "$_out"
  _one() {  # WHAT FILE
    if [ -s "$2" ] && openssl x509 -in "$2" -noout 2> /dev/null; then
      openssl verify -CAfile "$_old" "$2" > /dev/null 2>&1; _ro=$?
      openssl verify -CAfile "$_new" "$2" > /dev/null 2>&1; _rn=$?
      _is=$(openssl x509 -in "$2" -noout -issuer -nameopt RFC2253 | sed -n 's/.*CN=\([^,]*\).*/\1/p')
      echo "$1 $_ro $_rn ${_is:-none}" >> "$_out"
    else
      echo "$1 none none none" >> "$_out"
    fi
  }
  for _f in $(cd /var/lib/kubeadm/pki && find . -name '*.crt' | sed 's|^\./||' | sort); do
    case "$_f" in *ca.crt) continue ;; esac
    _one "pki/$_f" "/var/lib/kubeadm/pki/$_f"
  done
  for _k in /var/lib/kubeadm/*.conf; do
    _d=$(sed -n 's/^ *client-certificate-data: *//p' "$_k" | head -n1)
    [ -n "$_d" ] || continue
    echo "$_d" | openssl base64 -d -A > "$_t/$(basename "$_k").pem"
    _one "kubeconfig/$(basename "$_k")" "$_t/$(basename "$_k").pem"
  done
  _one kubelet-client /var/lib/kubelet/pki/kubelet-client-current.pem
  _p=/var/lib/kubeadm/pki
  node_served_pem 6443 "$_t/6443.pem" -cert "$_p/apiserver-kubelet-client.crt" -key "$_p/apiserver-kubelet-client.key"
  _one served/6443 "$_t/6443.pem"
  for _port in 10250 10257 10259; do
    node_served_pem "$_port" "$_t/$_port.pem"
    _one "served/$_port" "$_t/$_port.pem"
  done
}
