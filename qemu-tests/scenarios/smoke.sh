#!/bin/sh
# Smoke scenario (runs inside the VM as /mnt/share/run.sh; see qemu-tests/tests/smoke.rs).
# Boot 1: pull certrotor's image, as users pull it (the linux/amd64 + linux/arm64 index, by its
#         digest), from the host's registry through QEMU's user network, run it as a
#         superpowered host container, check the host-container mounts, start etcd with TLS,
#         write the host's token, print the MARK ETCD-WRITTEN marker and wait: the harness kills
#         QEMU there (power loss).
# Boot 2 (no network): same /local disk: the image is still in containerd, etcd returns the token.
. /usr/lib/certrotor-e2e/lib.sh
# 10.0.2.2:PORT/certrotor@sha256:<index digest>: the host pushed the index there.
IMG=$(cat "$E2E_SHARE/image-ref")
e2e_save boot-count "$E2E_BOOT_COUNT"

# /run/api.sock: the Bottlerocket API simulator when the image has it (host root = /, so
# settings persist in /var/lib/bottlerocket-sim), else a placeholder file to bind-mount.
if [ -x /usr/bin/apiserver-sim ]; then
  apiserver-sim --socket /run/api.sock --root / > "$E2E_OUT/apiserver-sim.log" 2>&1 &
  e2e_check "apiserver-sim serves /run/api.sock" e2e_wait_for 300 test -S /run/api.sock
  e2e_save api-sock socket
else
  : > /run/api.sock
  e2e_save api-sock placeholder
fi

if e2e_image_present "$IMG"; then
  e2e_save image-was-present yes
else
  e2e_save image-was-present no
  e2e_check "network to the host (QEMU user network, 10.0.2.2)" e2e_net_up
  e2e_check "ctr pull by digest from the host's registry" e2e_pull_image "$IMG"
fi
e2e_check "image $IMG present" e2e_image_present "$IMG"
e2e_mark IMAGE-READY
# REF TYPE DIGEST SIZE PLATFORMS LABELS: the host checks the index's digest and platforms.
ctr -n default images ls | grep -F "$IMG" > "$E2E_OUT/image-ls.txt"

# certrotor as a superpowered host container: `certrotor version` must exit 0 (ctr: a
# command given after the image replaces the entrypoint, hence the full path).
certrotor_version() {
  e2e_host_ctr_run --superpowered certrotor "$IMG" /usr/bin/certrotor version > "$E2E_OUT/certrotor-version.txt" 2>&1
}
e2e_check "certrotor runs as a superpowered host container" certrotor_version

# The same image with the host's static busybox (through /.bottlerocket/rootfs) as command:
# report what the container sees; the host-side test asserts on mounts.txt.
BB=/.bottlerocket/rootfs/usr/bin/busybox
rm -f /var/lib/certrotor-e2e/from-container
e2e_host_ctr_run --superpowered "probe-$E2E_BOOT" "$IMG" $BB sh -c "
  BB=$BB
  \$BB test -e /run/api.sock && echo api-sock=ok
  \$BB test -S /run/api.sock && echo api-sock=socket
  \$BB test -x /usr/bin/certrotor && echo certrotor-bin=ok
  echo certrotor-sha256=\$(\$BB sha256sum /usr/bin/certrotor | \$BB cut -d' ' -f1)
  \$BB test -d /.bottlerocket/rootfs/var/lib/containerd && echo host-rootfs=ok
  \$BB touch /.bottlerocket/rootfs/e2e-ro-probe 2>/dev/null || echo rootfs-top=ro
  \$BB touch /.bottlerocket/rootfs/var/lib/certrotor-e2e/from-container && echo host-var=rw
  \$BB test -d /.bottlerocket/host-containers/current && echo current-dir=ok
  echo pid1=\$(\$BB cat /proc/1/comm)
  echo caps=\$(\$BB grep CapEff /proc/self/status | \$BB tr -d ' \t' | \$BB cut -d: -f2)
" > "$E2E_OUT/mounts.txt" 2>&1
e2e_check "probe container ran" [ -s "$E2E_OUT/mounts.txt" ]
e2e_save host-pid1 "$(cat /proc/1/comm)"
e2e_check "container file visible on the host" [ -e /var/lib/certrotor-e2e/from-container ]

# etcd with TLS, data on the persistent /var
P=/var/lib/e2e-etcd/pki
e2e_check "etcd PKI (openssl)" e2e_etcd_pki $P
e2e_check "etcd healthy over TLS" e2e_etcd_start $P /var/lib/e2e-etcd/data
e2e_check "etcd rejects a client without certificate" sh -c \
  "! etcdctl --endpoints=https://127.0.0.1:2379 --cacert=$P/ca.crt --dial-timeout=2s --command-timeout=3s get /x > /dev/null 2>&1"
if [ "$E2E_BOOT" = 1 ]; then
  e2e_check "etcdctl put" e2e_etcdctl put /smoke/token "$(cat "$E2E_SHARE/token")"
  e2e_finish; echo "$?" > "$E2E_OUT/checks-rc"
  e2e_mark ETCD-WRITTEN
  e2e_wait_for 600 false   # the harness kills QEMU at the marker (power loss)
  exit 99
fi
e2e_save etcd-token "$(e2e_etcdctl get --print-value-only /smoke/token)"
e2e_finish
