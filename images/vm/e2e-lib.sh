# Helpers for scenario scripts inside the certrotor test VM (busybox ash).
# Installed as /usr/lib/certrotor-e2e/lib.sh; use:  . /usr/lib/certrotor-e2e/lib.sh
# Environment from /sbin/init: E2E_SHARE (/mnt/share), E2E_OUT (/mnt/share/out/boot-N),
# E2E_BOOT (harness boot index), E2E_BOOT_COUNT (persistent boot counter in /var).
# Conventions: e2e_ok/e2e_fail append to $E2E_OUT/results.txt and print to the serial log;
# e2e_finish exits non-zero when any check failed. e2e_mark prints a marker line that the
# harness can wait for or kill QEMU at ("CERTROTOR-E2E: MARK <text>").

E2E_FAILS=0
e2e_uptime() { cut -d' ' -f1 /proc/uptime; }
e2e_mark() { echo "CERTROTOR-E2E: MARK $* uptime=$(e2e_uptime)"; }
e2e_log() { echo "e2e: $*"; }
e2e_ok() { echo "OK   $*"; echo "OK $*" >> "$E2E_OUT/results.txt"; }
e2e_fail() { echo "FAIL $*"; echo "FAIL $*" >> "$E2E_OUT/results.txt"; E2E_FAILS=$((E2E_FAILS + 1)); }
# e2e_check DESCRIPTION CMD...   -> ok/fail by the command's status
e2e_check() { d=$1; shift; if "$@"; then e2e_ok "$d"; else e2e_fail "$d (rc=$?)"; fi; }
e2e_finish() { echo "fails=$E2E_FAILS" >> "$E2E_OUT/results.txt"; echo "e2e: fails=$E2E_FAILS"; [ "$E2E_FAILS" = 0 ]; }
# e2e_save NAME VALUE  -> $E2E_OUT/NAME (a value for the host-side test to read)
e2e_save() { printf '%s\n' "$2" > "$E2E_OUT/$1"; }

# e2e_wait_for SECONDS CMD...   poll CMD (every 0.1 s) until it succeeds or the deadline passes
# (a bound that only stops a hang: pick it from what is awaited, not from an idle host's speed).
# While it waits it prints a line every 30 s: the harness takes a silent console for a hang.
e2e_wait_for() {
  _ew_t=$1; shift
  _ew_now=$(cut -d. -f1 /proc/uptime)
  _ew_deadline=$(( _ew_now + _ew_t )) _ew_beat=$(( _ew_now + 30 ))
  until "$@" > /dev/null 2>&1; do
    _ew_now=$(cut -d. -f1 /proc/uptime)
    if [ "$_ew_now" -ge "$_ew_deadline" ]; then
      echo "e2e: timed out after $_ew_t s waiting for: $*"
      return 1
    fi
    if [ "$_ew_now" -ge "$_ew_beat" ]; then
      echo "e2e: still waiting ($(( _ew_t - _ew_deadline + _ew_now )) s of $_ew_t) for: $*"
      _ew_beat=$(( _ew_now + 30 ))
    fi
    sleep 0.1
  done
}
# e2e_heartbeat_start TEXT / e2e_heartbeat_stop   while a long command runs that bounds itself
# (certrotor with its own timeouts), a line every 30 s so that the console is never silent
e2e_heartbeat_start() {
  ( _hb_n=0; while sleep 30; do _hb_n=$((_hb_n + 30)); echo "e2e: $1 (${_hb_n} s)"; done ) &
  E2E_HEARTBEAT_PID=$!
}
e2e_heartbeat_stop() {
  [ -n "${E2E_HEARTBEAT_PID:-}" ] && kill "$E2E_HEARTBEAT_PID" 2> /dev/null
  wait "$E2E_HEARTBEAT_PID" 2> /dev/null
  E2E_HEARTBEAT_PID=""
  true
}

# ---- network (a boot with BootOptions::user_net: QEMU's user network) ---------------------
# e2e_net_up   loads virtio_net and gives the NIC QEMU's slirp address 10.0.2.15/24, with no
# default route: the guest reaches 10.0.2.2, which QEMU maps to the host's 127.0.0.1, and
# nothing else.
e2e_net_up() {
  modprobe virtio_net || return 1
  e2e_wait_for 10 sh -c 'ls /sys/class/net | grep -qvx lo' || return 1
  _if=$(ls /sys/class/net | grep -vx lo | head -n1)
  ip addr add 10.0.2.15/24 dev "$_if" && ip link set "$_if" up
}

# ---- containers ------------------------------------------------------------------------
# e2e_image_present REF
e2e_image_present() { ctr -n default images ls -q | grep -qx "$1"; }
# e2e_import_image TAR   (ctr images import into namespace "default")
e2e_import_image() { ctr -n default images import --all-platforms "$1"; }
# e2e_pull_image REF   (ctr images pull into namespace "default", this VM's platform only) from a
# plain-HTTP registry, e.g. the host's on 10.0.2.2:PORT; REF may name a digest (repo@sha256:...)
e2e_pull_image() { ctr -n default images pull --plain-http "$1"; }

# e2e_host_ctr_run [--superpowered|--bootstrap] [--detach] [--mount SPEC]... [--env K=V]... NAME IMAGE [CMD ARGS...]
# Runs IMAGE like Bottlerocket's host-ctr does (bottlerocket-api.md §3.2/3.3): host network,
# /run/api.sock, /etc/hosts, /.bottlerocket/host-containers/{NAME,current} ->
# /local/host-containers/NAME (bootstrap: .../bootstrap-containers/...); privileged kinds add
# /.bottlerocket/rootfs (rbind of host /, read-only at the top only), /.bottlerocket/rootfs/mnt
# (rshared), /lib/modules (ro) and the host PID namespace; superpowered = all capabilities.
# Without --detach it waits for the task and returns its exit status (container removed).
# A container of the same NAME left behind by a power loss is removed first.
e2e_host_ctr_run() {
  _kind=plain _detach="" _extra=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --superpowered) _kind=super ;;
      --bootstrap) _kind=bootstrap ;;
      --detach) _detach=1 ;;
      --mount) _extra="$_extra --mount $2"; shift ;;
      --env) _extra="$_extra --env $2"; shift ;;   # test knobs (e.g. CERTROTOR_FAILPOINT)
      *) break ;;
    esac
    shift
  done
  _name=$1 _image=$2; shift 2
  _dir=host-containers; [ "$_kind" = bootstrap ] && _dir=bootstrap-containers
  mkdir -p "/local/$_dir/$_name"
  if ctr -n default containers ls -q | grep -qx "$_name"; then
    ctr -n default tasks rm -f "$_name" > /dev/null 2>&1
    ctr -n default containers rm "$_name" > /dev/null 2>&1
  fi
  [ -e /run/api.sock ] || { echo "e2e_host_ctr_run: /run/api.sock missing (start apiserver-sim first)" >&2; return 1; }
  # Options are plain words (no spaces in paths here); "$@" stays the container's command.
  _opts="--net-host
    --mount type=bind,src=/run/api.sock,dst=/run/api.sock,options=rbind:rw
    --mount type=bind,src=/etc/hosts,dst=/etc/hosts,options=rbind:ro
    --mount type=bind,src=/local/$_dir/$_name,dst=/.bottlerocket/$_dir/$_name,options=rbind:rw
    --mount type=bind,src=/local/$_dir/$_name,dst=/.bottlerocket/$_dir/current,options=rbind:rw"
  if [ "$_kind" != plain ]; then
    _opts="$_opts --with-ns pid:/proc/1/ns/pid --rootfs-propagation rshared
      --mount type=bind,src=/,dst=/.bottlerocket/rootfs,options=rbind:ro:rshared
      --mount type=bind,src=/mnt,dst=/.bottlerocket/rootfs/mnt,options=rbind:rw:rshared
      --mount type=bind,src=/lib/modules,dst=/lib/modules,options=rbind:ro"
    if [ "$_kind" = super ]; then
      _opts="$_opts --privileged --allow-new-privs"
    else
      _opts="$_opts --cap-add CAP_SYS_ADMIN --cap-add CAP_NET_ADMIN --cap-add CAP_SYS_CHROOT
        --cap-add CAP_SYS_MODULE --cap-add CAP_AUDIT_CONTROL"
    fi
  fi
  # shellcheck disable=SC2086 # word splitting of _opts/_extra is intended
  if [ -n "$_detach" ]; then
    ctr -n default run -d $_opts $_extra "$_image" "$_name" "$@"
  else
    ctr -n default run --rm $_opts $_extra "$_image" "$_name" "$@"
  fi
}

# ---- etcd with TLS -------------------------------------------------------------------------
# e2e_etcd_pki DIR   CA + server (SAN 127.0.0.1, localhost) + client certs (EC P-256), once
e2e_etcd_pki() {
  _p=$1; mkdir -p "$_p"
  [ -s "$_p/client.crt" ] && return 0
  ( cd "$_p" || exit 1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > ext.cnf
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj /CN=e2e-etcd-ca -keyout ca.key -out ca.crt 2>/dev/null || exit 1
    for n in server client; do
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj "/CN=etcd-$n" -keyout $n.key -out $n.csr 2>/dev/null || exit 1
      openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile ext.cnf -out $n.crt 2>/dev/null || exit 1
    done )
}
# e2e_etcd_start PKIDIR DATADIR [LOG]   starts etcd (TLS, client-cert-auth) in the background
# on https://127.0.0.1:2379 and waits (60 s) until it is healthy
e2e_etcd_start() {
  etcd --name e2e --data-dir "$2" \
    --listen-client-urls https://127.0.0.1:2379 --advertise-client-urls https://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster e2e=http://127.0.0.1:2380 \
    --cert-file "$1/server.crt" --key-file "$1/server.key" --trusted-ca-file "$1/ca.crt" \
    --client-cert-auth > "${3:-$E2E_OUT/etcd.log}" 2>&1 &
  E2E_ETCD_PKI=$1
  e2e_wait_for 60 e2e_etcdctl endpoint health
}
# e2e_etcdctl ARGS...   etcdctl against the local etcd with the client certificate
e2e_etcdctl() {
  ETCDCTL_API=3 etcdctl --endpoints=https://127.0.0.1:2379 --cacert="$E2E_ETCD_PKI/ca.crt" \
    --cert="$E2E_ETCD_PKI/client.crt" --key="$E2E_ETCD_PKI/client.key" "$@"
}
