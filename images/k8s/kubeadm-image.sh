#!/bin/sh
# Builds the REAL-KUBEADM image for certrotor's kubeadm engine tests: an OCI archive
# (`ctr images import`-able, no docker) laid out like EKS Anywhere's bottlerocket-bootstrap image:
#   /opt/bin/kubeadm          the real kubeadm v1.20.2 built by images/k8s/build.sh (static Go)
#   /opt/bin/etcdadm          the etcdadm TEST DOUBLE of images/kubeadm-standin/ (no registry or
#                             Debian package ships etcdadm), with its standin-lib.sh
#   /opt/bin/kubeadm-standin  the kubeadm TEST DOUBLE, only for failure injection the real tool
#                             cannot do on request (exit codes, a run slow enough to kill)
#   /bin/sh (busybox-static), /usr/bin/openssl and the libraries ldd lists (for the doubles).
#
# Usage: images/k8s/kubeadm-image.sh OUT.tar [--name REF]
#   default REF: localhost/certrotor-kubeadm:v1.20.2
# The kubeadm binary comes from CERTROTOR_K8S_BIN if set, else `images/k8s/build.sh
# --print-bin-dir` (which fails, naming the command to run, when the build is missing).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: kubeadm-image.sh OUT.tar [--name REF]}
shift
name=localhost/certrotor-kubeadm:v1.20.2
[ "${1:-}" != --name ] || name=${2:?--name needs a value}

die() { echo "kubeadm-image.sh: error: $*" >&2; exit 1; }
bindir=${CERTROTOR_K8S_BIN:-}
[ -n "$bindir" ] || bindir=$("$here/build.sh" --print-bin-dir) ||
    die "no real kubeadm: run images/k8s/build.sh (about 11 minutes) or set CERTROTOR_K8S_BIN"
kubeadm=$bindir/kubeadm
[ -x "$kubeadm" ] || die "$kubeadm is missing: run images/k8s/build.sh (or fix CERTROTOR_K8S_BIN)"
"$kubeadm" version -o short | grep -qx 'v1.20.2' || die "$kubeadm is not kubeadm v1.20.2"
! ldd "$kubeadm" > /dev/null 2>&1 || die "$kubeadm is not static (build it with images/k8s/build.sh)"

# The rest of the image (the doubles, busybox, openssl) is the stand-in image's.
exec "$here/../kubeadm-standin/build.sh" "$out" --name "$name" --kubeadm "$kubeadm"
