#!/usr/bin/env bash
# Builds certrotor's OCI image, as users pull it: one image index with a linux/amd64 and a
# linux/arm64 manifest (Bottlerocket runs on both), each holding only the static musl binary as
# /usr/bin/certrotor, the entrypoint. No docker: agent/build-static.sh builds both binaries
# (arm64 cross-compiled), images/oci-image.py packs them deterministically (same sources and
# toolchain -> same bytes, same digests). In a Bottlerocket container the command line comes
# from the container's user-data (see *.toml here).
#   bottlerocket/packaging/build-image.sh [OUT.tar] [--name REF]
# Writes OUT.tar (an OCI layout archive, tag = the version) and OUT.json (the digests), e.g.
#   skopeo copy --all --preserve-digests oci-archive:target/certrotor-oci.tar:0.1.0 \
#       docker://registry.example.com/certrotor:0.1.0
# Annotations (index, manifests, config labels): org.opencontainers.image.{title, version,
# revision, source, licenses, created}; created is SOURCE_DATE_EPOCH, else the commit time of HEAD.
# Environment: SOURCE_DATE_EPOCH, IMAGE_NAME (default localhost/certrotor:VERSION),
# CERTROTOR_IMAGE_SOURCE (the source URL), CERTROTOR_IMAGE_REVISION (outside a git checkout).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-target/certrotor-oci.tar}
shift || true
die() { echo "build-image: error: $*" >&2; exit 1; }

if [ -n "${CERTROTOR_IMAGE_REVISION:-}" ]; then
  revision=$CERTROTOR_IMAGE_REVISION
elif revision=$(git rev-parse HEAD 2>/dev/null); then
  # A build from modified sources says so.
  [ -z "$(git status --porcelain --untracked-files=no)" ] || revision="$revision-dirty"
else
  die "not a git checkout: set CERTROTOR_IMAGE_REVISION (and SOURCE_DATE_EPOCH)"
fi
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct HEAD 2>/dev/null || true)}
[[ "$epoch" =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH '$epoch' is not a number of seconds (outside git, set it)"
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# The binaries do not depend on the date; cc-rs (aws-lc-sys) reruns its build script when
# SOURCE_DATE_EPOCH changes, so cargo does not see it (no rebuild of aws-lc for a new date).
amd64=$(env -u SOURCE_DATE_EPOCH agent/build-static.sh --arch amd64)
arm64=$(env -u SOURCE_DATE_EPOCH agent/build-static.sh --arch arm64)
version=$("$amd64" version) || die "$amd64 version failed"
version=${version#certrotor }
[ -n "$version" ] && [ "$version" = "${version#* }" ] || die "unexpected '$amd64 version' output: $version"
source_url=${CERTROTOR_IMAGE_SOURCE:-https://github.com/certrotor/certrotor}
license=$(sed -n 's/^license *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
[ -n "$license" ] || die "no license in Cargo.toml's [workspace.package]"

mkdir -p "$(dirname "$out")"
images/oci-image.sh --platform "linux/amd64=$amd64" --platform "linux/arm64=$arm64" "$out" \
  --name "${IMAGE_NAME:-localhost/certrotor:$version}" --dest /usr/bin/certrotor \
  --created "$created" --summary "${out%.tar}.json" \
  --annotation "org.opencontainers.image.title=certrotor" \
  --annotation "org.opencontainers.image.description=Renews kubeadm and etcdadm control-plane certificates on Bottlerocket nodes" \
  --annotation "org.opencontainers.image.version=$version" \
  --annotation "org.opencontainers.image.revision=$revision" \
  --annotation "org.opencontainers.image.source=$source_url" \
  --annotation "org.opencontainers.image.licenses=$license" \
  --annotation "org.opencontainers.image.created=$created" \
  "$@"
echo "build-image: $out (index $(sed -n 's/^  "index": "\(.*\)",*$/\1/p' "${out%.tar}.json"), linux/amd64 $(stat -c %s "$amd64") B, linux/arm64 $(stat -c %s "$arm64") B, version $version, revision $revision, created $created)"
