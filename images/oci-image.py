#!/usr/bin/env python3
"""Build an OCI image archive (OCI layout in a tar, `ctr images import`-able) holding one
static binary as /usr/bin/<name> (entrypoint), without docker or a registry.

Usage: oci-image.py BINARY OUT.tar [--name REF] [--dest PATH] [--add SRC:DEST]... [--entrypoint PATH]
  --name REF       image reference stored in the archive (default localhost/certrotor:latest)
  --dest PATH      where BINARY goes in the image (default /usr/bin/<basename of BINARY>)
  --add SRC:DEST   extra host file in the image (mode 0755), e.g. a static busybox for debugging
  --entrypoint P   default: the --dest path
Output is deterministic (mtime 0, uid 0,
sorted, gzip mtime 0): the same inputs give the same digests.
Archive layout: oci-layout, index.json (annotation io.containerd.image.name = REF and
org.opencontainers.image.ref.name = tag), blobs/sha256/{manifest,config,layer.tar+gzip}.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile


def tar_add(tf, path, *, data=None, mode=0o644, kind=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(path)
    ti.mode, ti.uid, ti.gid, ti.mtime, ti.type = mode, 0, 0, 0, kind
    ti.uname = ti.gname = "root"
    if kind == tarfile.SYMTYPE:
        ti.linkname = link
        tf.addfile(ti)
    elif kind == tarfile.DIRTYPE:
        tf.addfile(ti)
    else:
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def jdump(o):
    return json.dumps(o, separators=(",", ":"), sort_keys=True).encode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("out")
    ap.add_argument("--name", default="localhost/certrotor:latest")
    ap.add_argument("--dest")
    ap.add_argument("--add", action="append", default=[], metavar="SRC:DEST")
    ap.add_argument("--entrypoint")
    a = ap.parse_args()

    if not os.path.isfile(a.binary):
        sys.exit(f"oci-image: error: {a.binary} is not a file")
    dest_bin = a.dest or "/usr/bin/" + os.path.basename(a.binary)
    if not dest_bin.startswith("/") or dest_bin.endswith("/"):
        sys.exit(f"oci-image: error: --dest {dest_bin!r}: expected an absolute file path")
    files = {dest_bin.lstrip("/"): a.binary}
    for spec in a.add:
        src, sep, dest = spec.partition(":")
        if not sep or not src or not dest.startswith("/"):
            sys.exit(f"oci-image: error: --add {spec!r}: expected SRC:/ABS/DEST")
        if not os.path.isfile(src):
            sys.exit(f"oci-image: error: --add {spec!r}: {src} is not a file")
        if dest.endswith("/"):
            dest += os.path.basename(src)
        files[dest.lstrip("/")] = src
    entry = a.entrypoint or dest_bin
    last = a.name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"

    dirs = {"etc", "tmp", "proc", "sys", "dev", "run", "var", "root", ".bottlerocket", "usr",
            "usr/bin", "usr/local", "usr/local/bin"}
    for f in files:
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in sorted(dirs):
            tar_add(tf, d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        tar_add(tf, "etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"
                b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        tar_add(tf, "etc/group", data=b"root:x:0:\nnogroup:x:65534:\n")
        for dest in sorted(files):
            with open(files[dest], "rb") as fh:
                tar_add(tf, dest, data=fh.read(), mode=0o755)
    layer_tar = raw.getvalue()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=1) as g:
        g.write(layer_tar)
    layer_gz = gz.getvalue()

    config = jdump({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Entrypoint": [entry], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [sha(layer_tar)]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "images/oci-image.py"}],
    })
    manifest = jdump({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha(layer_gz), "size": len(layer_gz)}],
    })
    index = jdump({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": sha(manifest), "size": len(manifest),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": a.name,
                                       "org.opencontainers.image.ref.name": tag}}],
    })
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        tar_add(tf, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}')
        tar_add(tf, "index.json", data=index)
        tar_add(tf, "blobs", kind=tarfile.DIRTYPE, mode=0o755)
        tar_add(tf, "blobs/sha256", kind=tarfile.DIRTYPE, mode=0o755)
        for blob in (manifest, config, layer_gz):
            tar_add(tf, "blobs/sha256/" + sha(blob)[7:], data=blob)
    os.replace(tmp, a.out)
    print(f"oci-image: {a.out}: {a.name} manifest={sha(manifest)} "
          f"size={os.path.getsize(a.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
