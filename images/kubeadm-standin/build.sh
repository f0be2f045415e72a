#!/bin/sh
# Builds the TEST DOUBLE image for certrotor's kubeadm engine tests: an OCI archive
# (`ctr images import`-able) with /opt/bin/kubeadm and /opt/bin/etcdadm stand-ins (POSIX shell +
# the openssl CLI; see README.md), busybox-static as /bin/sh, and the host's /usr/bin/openssl with
# the libraries `ldd` lists. No docker, no network: Debian packages busybox-static, openssl and
# python3 only. Deterministic for the same host packages.
#
# Usage: images/kubeadm-standin/build.sh OUT.tar [--name REF] [--kubeadm PATH]
#   default REF: localhost/certrotor-kubeadm-standin:test
#   --kubeadm PATH: PATH (a static binary) is /opt/bin/kubeadm and the kubeadm stand-in moves to
#   /opt/bin/kubeadm-standin (images/k8s/kubeadm-image.sh, with the real kubeadm).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
usage="build.sh OUT.tar [--name REF] [--kubeadm PATH]"
out=${1:?usage: $usage}
shift
name=localhost/certrotor-kubeadm-standin:test
kubeadm=""
while [ $# -gt 0 ]; do
    case $1 in
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --kubeadm) kubeadm=${2:?--kubeadm needs a value}; shift 2 ;;
        *) echo "build.sh: unknown argument $1 (usage: $usage)" >&2; exit 64 ;;
    esac
done

busybox=""
for b in /bin/busybox /usr/bin/busybox; do
    [ -x "$b" ] && busybox=$b && break
done
[ -n "$busybox" ] || { echo "build.sh: busybox-static is not installed (apt-get install busybox-static)" >&2; exit 1; }
ldd "$busybox" > /dev/null 2>&1 &&
    { echo "build.sh: $busybox is not static (install busybox-static)" >&2; exit 1; }
openssl=/usr/bin/openssl
[ -x "$openssl" ] || { echo "build.sh: openssl is not installed" >&2; exit 1; }

if [ -n "$kubeadm" ]; then
    set -- "$kubeadm" "$out" --name "$name" --dest /opt/bin/kubeadm \
        --add "$here/etcdadm:/opt/bin/etcdadm" --add "$here/kubeadm:/opt/bin/kubeadm-standin"
else
    set -- "$here/kubeadm" "$out" --name "$name" --dest /opt/bin/kubeadm \
        --add "$here/etcdadm:/opt/bin/etcdadm"
fi
set -- "$@" --add "$here/standin-lib.sh:/opt/bin/standin-lib.sh" \
    --add "$busybox:/bin/sh" --add "$openssl:/usr/bin/openssl"
# The dynamic loader and libraries openssl needs, at the paths ldd prints.
for lib in $(ldd "$openssl" | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) .*/\1/p' | sort -u); do
    set -- "$@" --add "$lib:$lib"
done
[ ! -e /usr/lib/ssl/openssl.cnf ] || set -- "$@" --add "/usr/lib/ssl/openssl.cnf:/usr/lib/ssl/openssl.cnf"
exec "$here/../oci-image.sh" "$@" --entrypoint /opt/bin/kubeadm
