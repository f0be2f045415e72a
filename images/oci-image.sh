#!/usr/bin/env bash
# Builds a ctr-importable OCI image archive holding one static binary (entrypoint
# /usr/bin/<name>), without docker. See oci-image.py for the options.
# Usage: images/oci-image.sh BINARY OUT.tar [--name REF] [--dest PATH] [--add SRC:DEST]... [--entrypoint PATH]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 > /dev/null || { echo "oci-image: error: python3 missing (images/setup-host.sh)" >&2; exit 1; }
exec python3 "$here/oci-image.py" "$@"
