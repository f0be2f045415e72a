#!/usr/bin/env bash
# Builds certrotor's OCI image (an archive `ctr images import` and registries accept) from the
# static binary, without docker: entrypoint /usr/bin/certrotor, no other file. In a Bottlerocket
# container the command line comes from the container's user-data (see *.toml here).
#   bottlerocket/packaging/build-image.sh [OUT.tar] [--name REF]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/certrotor-oci.tar}
shift || true
bin=$(agent/build-static.sh)
images/oci-image.sh "$bin" "$out" --name "${IMAGE_NAME:-localhost/certrotor:latest}" "$@"
ls -l "$out"
