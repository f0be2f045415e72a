#!/usr/bin/env python3
"""Build an OCI image archive (an OCI layout in a tar) holding one static binary as its
entrypoint, without docker or a registry: one platform (`ctr images import`-able), or an image
index of several platforms (what a registry serves and a node pulls by tag or digest).

Usage:
  oci-image.py BINARY OUT.tar [--name REF] [--dest PATH] [--add SRC:DEST]... [--entrypoint PATH]
  oci-image.py --platform linux/amd64=BIN --platform linux/arm64=BIN OUT.tar [--name REF] ...
Options (both forms):
  --name REF          image reference stored in the archive (default localhost/certrotor:latest)
  --dest PATH         where the binary goes in the image (default /usr/bin/<basename of BINARY>)
  --add SRC:DEST      extra host file in the image (mode 0755), e.g. a static busybox
  --entrypoint P      default: the --dest path
  --annotation K=V    OCI annotation (org.opencontainers.image.*) on the index, on every
                      manifest and as a config label; repeatable
  --created RFC3339   the configs' `created` (default 1970-01-01T00:00:00Z)
  --summary FILE      write the digests as JSON: index (or manifest), and per platform the
                      manifest, config, layer, diff_id, and the binary's path, sha256 and size
Each binary's ELF header must match its platform (BINARY alone: the platform is read from it).

Output is deterministic (files mtime 0, uid 0, sorted; gzip mtime 0; JSON with sorted keys): the
same inputs give the same bytes and digests. So it can be cached: with OCI_IMAGE_CACHE=DIR in the
environment, an archive is built once per input hash (the options, the SHA-256 of every input
file and of this script) into DIR and hard-linked (or copied) to OUT.tar afterwards (the test
suite packs the same 100 MB Kubernetes binaries for several scenarios).
Archive layout: oci-layout, index.json, blobs/sha256/<digest>. index.json holds one
descriptor, annotated io.containerd.image.name = REF and org.opencontainers.image.ref.name =
REF's tag: the image manifest (one platform) or the image index (--platform), which lists one
manifest per platform (platform os/architecture[/variant] on each descriptor).
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile

# ELF e_machine -> OCI (GOARCH) architecture, variant
ELF_ARCH = {62: ("amd64", None), 183: ("arm64", "v8")}
PLATFORMS = {"linux/amd64": ("amd64", None), "linux/arm64": ("arm64", "v8"),
             "linux/arm64/v8": ("arm64", "v8")}
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def die(msg):
    sys.exit(f"oci-image: error: {msg}")


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


def elf_arch(path):
    """(architecture, variant) of an ELF file, or None when it is not a 64-bit LE ELF we know."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] != 1:
        return None
    return ELF_ARCH.get(int.from_bytes(head[18:20], "little"))


def layer(files, level):
    """files: {path in image (no leading /): host path} -> (tar bytes, tar.gz bytes)."""
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
    with gzip.GzipFile(filename="", fileobj=gz, mode="wb", mtime=0, compresslevel=level) as g:
        g.write(layer_tar)
    return layer_tar, gz.getvalue()


def image(arch, variant, files, entry, created, annotations, blobs, level):
    """Builds one platform's layer, config and manifest into blobs; returns the manifest's
    descriptor (with its platform) and the summary of its digests."""
    layer_tar, layer_gz = layer(files, level)
    platform = {"architecture": arch, "os": "linux"}
    if variant:
        platform["variant"] = variant
    cfg = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
           "Entrypoint": [entry], "WorkingDir": "/"}
    if annotations:
        cfg["Labels"] = annotations
    config = jdump({
        **platform, "created": created, "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [sha(layer_tar)]},
        "history": [{"created": created, "created_by": "images/oci-image.py"}],
    })
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": MT_LAYER, "digest": sha(layer_gz), "size": len(layer_gz)}],
    }
    if annotations:
        manifest["annotations"] = annotations
    manifest = jdump(manifest)
    for b in (manifest, config, layer_gz):
        blobs[sha(b)] = b
    desc = {"mediaType": MT_MANIFEST, "digest": sha(manifest), "size": len(manifest),
            "platform": platform}
    summary = {"manifest": sha(manifest), "config": sha(config), "layer": sha(layer_gz),
               "diff_id": sha(layer_tar), "layer_size": len(layer_gz)}
    return desc, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("args", nargs="+", metavar="[BINARY] OUT.tar")
    ap.add_argument("--platform", action="append", default=[], metavar="OS/ARCH=BINARY")
    ap.add_argument("--name", default="localhost/certrotor:latest")
    ap.add_argument("--dest")
    ap.add_argument("--add", action="append", default=[], metavar="SRC:DEST")
    ap.add_argument("--entrypoint")
    ap.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--created", default="1970-01-01T00:00:00Z")
    ap.add_argument("--summary")
    a = ap.parse_args()
    cache = os.environ.get("OCI_IMAGE_CACHE")
    if cache:
        return cached(a, cache)
    build(a)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached(a, cache):
    """Builds through the cache: the key hashes every option but OUT.tar (and --summary's path),
    every input file's content and this script; a hit links the stored archive (and summary)."""
    out = a.args[-1]
    inputs = [x for x in a.args[:-1]] + [p.partition("=")[2] for p in a.platform] \
        + [s.partition(":")[0] for s in a.add] + [os.path.abspath(__file__)]
    key = hashlib.sha256(jdump({
        "args": a.args[:-1], "platform": a.platform, "name": a.name, "dest": a.dest,
        "add": a.add, "entrypoint": a.entrypoint, "annotation": a.annotation,
        "created": a.created, "summary": bool(a.summary),
        "files": {f: file_sha256(f) if os.path.isfile(f) else None for f in inputs},
    })).hexdigest()
    os.makedirs(cache, exist_ok=True)
    stored = os.path.join(cache, key + ".tar")
    stored_summary = os.path.join(cache, key + ".summary.json")
    if not os.path.isfile(stored):
        a.args[-1] = stored + ".building." + str(os.getpid())
        summary = a.summary
        if summary:
            a.summary = stored_summary
        build(a)
        os.replace(a.args[-1], stored)
        a.summary = summary
    else:
        print(f"oci-image: {out}: cached {stored}", file=sys.stderr)
    for src, dst in [(stored, out)] + ([(stored_summary, a.summary)] if a.summary else []):
        tmp = dst + ".tmp"
        if os.path.exists(tmp):
            os.remove(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            import shutil
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)


def build(a):
    # (platform name, arch, variant, binary)
    targets = []
    if a.platform:
        if len(a.args) != 1:
            die("with --platform, give only OUT.tar (the binaries come with --platform)")
        out = a.args[0]
        for spec in a.platform:
            plat, sep, binary = spec.partition("=")
            if not sep or plat not in PLATFORMS:
                die(f"--platform {spec!r}: expected one of {', '.join(PLATFORMS)} =BINARY")
            targets.append((plat,) + PLATFORMS[plat] + (binary,))
        if len({t[1] for t in targets}) != len(targets):
            die("--platform: each architecture once")
    else:
        if len(a.args) != 2:
            die("expected BINARY OUT.tar (or --platform OS/ARCH=BINARY... OUT.tar)")
        binary, out = a.args
        arch, variant = (elf_arch(binary) if os.path.isfile(binary) else None) or ("amd64", None)
        targets.append((f"linux/{arch}", arch, variant, binary))
    for plat, arch, variant, binary in targets:
        if not os.path.isfile(binary):
            die(f"{binary} is not a file")
        found = elf_arch(binary)
        if a.platform and found != (arch, variant):
            die(f"{binary} is not a {plat} executable (its ELF header says {found})")

    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a.created):
        die(f"--created {a.created!r}: expected YYYY-MM-DDTHH:MM:SSZ (UTC)")
    annotations = {}
    for spec in a.annotation:
        k, sep, v = spec.partition("=")
        if not sep or not k:
            die(f"--annotation {spec!r}: expected KEY=VALUE")
        annotations[k] = v

    extra = {}
    for spec in a.add:
        src, sep, dest = spec.partition(":")
        if not sep or not src or not dest.startswith("/"):
            die(f"--add {spec!r}: expected SRC:/ABS/DEST")
        if not os.path.isfile(src):
            die(f"--add {spec!r}: {src} is not a file")
        if dest.endswith("/"):
            dest += os.path.basename(src)
        extra[dest.lstrip("/")] = src
    last = a.name.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"

    blobs = {}
    descs = []
    summary = {"name": a.name, "platforms": {}}
    for plat, arch, variant, binary in targets:
        dest_bin = a.dest or "/usr/bin/" + os.path.basename(binary)
        if not dest_bin.startswith("/") or dest_bin.endswith("/"):
            die(f"--dest {dest_bin!r}: expected an absolute file path")
        files = dict(extra)
        files[dest_bin.lstrip("/")] = binary
        # gzip -9 for the shipped index (every node pulls it at every container start), -1 for
        # the tests' single-platform archives (some hold 100 MB Kubernetes binaries).
        desc, s = image(arch, variant, files, a.entrypoint or dest_bin, a.created, annotations,
                        blobs, 9 if a.platform else 1)
        with open(binary, "rb") as fh:
            data = fh.read()
        s.update(binary=binary, binary_sha256=hashlib.sha256(data).hexdigest(),
                 binary_size=len(data))
        descs.append(desc)
        summary["platforms"][plat] = s

    ref_annotations = {"io.containerd.image.name": a.name,
                       "org.opencontainers.image.ref.name": tag}
    if a.platform:
        index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": descs}
        if annotations:
            index["annotations"] = annotations
        index = jdump(index)
        blobs[sha(index)] = index
        top = {"mediaType": MT_INDEX, "digest": sha(index), "size": len(index),
               "annotations": ref_annotations}
        summary["index"] = sha(index)
    else:
        top = dict(descs[0], annotations=ref_annotations)
    summary["digest"] = top["digest"]
    layout_index = jdump({"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [top]})

    tmp = out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        tar_add(tf, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}')
        tar_add(tf, "index.json", data=layout_index)
        tar_add(tf, "blobs", kind=tarfile.DIRTYPE, mode=0o755)
        tar_add(tf, "blobs/sha256", kind=tarfile.DIRTYPE, mode=0o755)
        for digest in sorted(blobs):
            tar_add(tf, "blobs/sha256/" + digest[7:], data=blobs[digest])
    os.replace(tmp, out)
    if a.summary:
        with open(a.summary + ".tmp", "w") as fh:
            json.dump(summary, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(a.summary + ".tmp", a.summary)
    print(f"oci-image: {out}: {a.name} {'index' if a.platform else 'manifest'}={top['digest']} "
          f"platforms={','.join(t[0] for t in targets)} size={os.path.getsize(out)}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
