//! The image as users pull it (no VM): certrotor's OCI image index (linux/amd64 + linux/arm64)
//! is built twice to the same bytes, pushed with Debian's `skopeo` to a real registry on loopback
//! (Debian's `docker-registry`), and pulled back by the index's digest. Each platform's manifest,
//! config and layer are checked against what was built (digests, annotations, platform, labels,
//! entrypoint; the registry's platform selection from the index); each layer is unpacked and the
//! binary in it runs a lab node through `lab init`, `check`, `renew --all` and `rollback`: amd64
//! natively, arm64 under Debian's `qemu-aarch64-static` (qemu-user-static).
//!
//! A missing tool fails the test naming its Debian package (images/setup-host.sh installs them).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qemu_tests::paths;
use qemu_tests::registry::{ImageIndex, Registry, build_image_index, require_tool};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Tools the test calls, with the Debian package of each.
const TOOLS: [(&str, &str); 6] = [
    ("skopeo", "skopeo"),
    ("docker-registry", "docker-registry"),
    ("qemu-aarch64-static", "qemu-user-static"),
    ("tar", "tar"),
    ("gzip", "gzip"),
    ("sha256sum", "coreutils"),
];

/// The standard annotations every level of the image carries.
const ANNOTATIONS: [&str; 6] = [
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.source",
    "org.opencontainers.image.created",
    "org.opencontainers.image.title",
    "org.opencontainers.image.licenses",
];

/// (platform, OCI architecture, variant, ELF e_machine, how to run a binary of it)
type PlatformCase = (
    &'static str,
    &'static str,
    Option<&'static str>,
    u16,
    &'static [&'static str],
);
const PLATFORMS: [PlatformCase; 2] = [
    ("linux/amd64", "amd64", None, 62, &[]),
    (
        "linux/arm64",
        "arm64",
        Some("v8"),
        183,
        &["qemu-aarch64-static"],
    ),
];

const MAX_BINARY: u64 = 4 * 1024 * 1024;

fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils)");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn digest_of(data: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(data))
}

/// A blob of an OCI layout folder, checked against its digest.
fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let data = fs::read(layout.join("blobs/sha256").join(hex)).unwrap();
    assert_eq!(
        digest_of(&data),
        digest,
        "blob {digest} in {}",
        layout.display()
    );
    data
}

/// `skopeo ARGS --raw --tls-verify=false docker://REFERENCE` against `reg`: the raw bytes it
/// reads (an index, a manifest or, with `--config`, a config).
fn inspect_raw(reg: &Registry, args: &[&str], reference: &str) -> Vec<u8> {
    let target = format!("docker://{reference}");
    let all: Vec<&str> = [args, &["--raw", "--tls-verify=false", &target]].concat();
    reg.skopeo(&all).unwrap().stdout
}

fn json(data: &[u8], what: &str) -> Value {
    serde_json::from_slice(data).unwrap_or_else(|e| panic!("{what} is not JSON: {e}"))
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// What the annotations must say: version (agent/Cargo.toml), revision (HEAD, `-dirty` when
/// tracked files are modified), created (`epoch` as RFC 3339), title, licenses, a source URL.
fn expected_annotations(epoch: &str) -> BTreeMap<&'static str, String> {
    let root = paths::workspace_root();
    let cargo = fs::read_to_string(root.join("agent/Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("version in agent/Cargo.toml")
        .to_string();
    let git = |args: &str| sh(&format!("cd '{}' && git {args}", root.display()));
    let mut revision = git("rev-parse HEAD");
    if !git("status --porcelain --untracked-files=no").is_empty() {
        revision.push_str("-dirty");
    }
    let created = sh(&format!("date -u -d @{epoch} +%Y-%m-%dT%H:%M:%SZ"));
    BTreeMap::from([
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.revision", revision),
        ("org.opencontainers.image.created", created),
        ("org.opencontainers.image.title", "certrotor".to_string()),
        (
            "org.opencontainers.image.licenses",
            "Apache-2.0".to_string(),
        ),
    ])
}

fn assert_annotations(v: &Value, want: &BTreeMap<&'static str, String>, what: &str) {
    let got = v
        .as_object()
        .unwrap_or_else(|| panic!("{what}: no annotations/labels object in {v}"));
    for key in ANNOTATIONS {
        let value = got.get(key).and_then(Value::as_str).unwrap_or_default();
        assert!(!value.is_empty(), "{what}: no {key} in {v}");
        if let Some(w) = want.get(key) {
            assert_eq!(value, w, "{what}: {key}");
        }
    }
    let source = got["org.opencontainers.image.source"].as_str().unwrap();
    assert!(source.starts_with("https://"), "{what}: source {source:?}");
}

/// Every file and symlink under `root` except certrotor's own state (backups, journal):
/// relative path -> (mode, contents or link target).
fn snapshot(root: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == "var/lib/certrotor" {
                continue;
            }
            let md = fs::symlink_metadata(&p).unwrap();
            let mode = md.permissions().mode();
            if md.is_symlink() {
                let target = fs::read_link(&p).unwrap();
                out.insert(rel, (mode, target.to_string_lossy().as_bytes().to_vec()));
            } else if md.is_dir() {
                out.insert(rel.clone(), (mode, Vec::new()));
                walk(root, &p, out);
            } else {
                out.insert(rel, (mode, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the image's binary (through `runner`, e.g. qemu-aarch64-static) with a 10 min bound.
fn certrotor(runner: &[&str], bin: &Path, args: &[&str]) -> Run {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=10", "600"])
        .args(runner)
        .arg(bin)
        .args(args)
        // Lab nodes name addresses that are not theirs: no Kubernetes Events.
        .env("CERTROTOR_EVENTS", "off")
        .stdin(Stdio::null());
    let out = c.output().unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn expect(run: &Run, code: i32, what: &str) {
    assert_eq!(
        run.code,
        Some(code),
        "{what}: exit code\nstdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
}

/// name -> (kind, renewable, serial, status) from `check --output json`.
fn inventory(run: &Run) -> BTreeMap<String, (String, bool, String, String)> {
    let v: Value = serde_json::from_str(&run.stdout).expect("check JSON");
    v["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (
                s("name"),
                (s("kind"), c["renewable"] == true, s("serial"), s("status")),
            )
        })
        .collect()
}

/// `lab init`, `check`, `renew --all`, `check`, `rollback`, `check` on a fresh lab node with
/// the image's binary; returns how long it took.
fn lab_cycle(plat: &str, runner: &[&str], bin: &Path, dir: &Path, version: &str) -> Duration {
    let t0 = Instant::now();
    let v = certrotor(runner, bin, &["version"]);
    expect(&v, 0, &format!("{plat}: version"));
    assert_eq!(v.stdout.trim(), format!("certrotor {version}"), "{plat}");

    let root = dir.join("node");
    let r = root.to_str().unwrap();
    let init = certrotor(
        runner,
        bin,
        &[
            "lab",
            "init",
            r,
            "--layout",
            "bottlerocket",
            "--key-algorithm",
            "ecdsa-p256",
            "--advertise-address",
            "127.0.0.1",
        ],
    );
    expect(&init, 0, &format!("{plat}: lab init"));
    let check = || certrotor(runner, bin, &["check", "--root", r, "--output", "json"]);
    let c1 = check();
    expect(&c1, 0, &format!("{plat}: check of a fresh lab node"));
    let inv1 = inventory(&c1);
    assert!(inv1.len() >= 14, "{plat}: inventory {inv1:?}");
    assert!(inv1.values().all(|(_, _, _, st)| st == "ok"), "{inv1:?}");
    let before = snapshot(&root);

    let renew = certrotor(
        runner,
        bin,
        &["renew", "--root", r, "--all", "--output", "json"],
    );
    expect(&renew, 0, &format!("{plat}: renew --all"));
    let c2 = check();
    expect(&c2, 0, &format!("{plat}: check after renew"));
    let inv2 = inventory(&c2);
    let mut renewed = 0;
    for (name, (kind, renewable, serial, _)) in &inv1 {
        let (_, _, serial2, status2) = &inv2[name];
        assert_eq!(status2, "ok", "{plat}: {name} after renew");
        if *renewable {
            assert_ne!(serial, serial2, "{plat}: {name} ({kind}) was not renewed");
            renewed += 1;
        } else if kind == "ca" {
            assert_eq!(serial, serial2, "{plat}: CA {name} changed");
        }
    }
    assert!(renewed >= 11, "{plat}: {renewed} renewed\n{inv2:?}");
    assert_ne!(before, snapshot(&root), "{plat}: renew changed no file");

    let rb = certrotor(runner, bin, &["rollback", "--root", r]);
    expect(&rb, 0, &format!("{plat}: rollback"));
    let after = snapshot(&root);
    let differ: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(
        differ.is_empty(),
        "{plat}: after rollback, these differ from before renew: {differ:?}"
    );
    let c3 = check();
    expect(&c3, 0, &format!("{plat}: check after rollback"));
    assert_eq!(inventory(&c3), inv1, "{plat}: inventory after rollback");
    t0.elapsed()
}

fn build(work: &Path, sub: &str, envs: &[(&str, &str)]) -> ImageIndex {
    let dir = work.join(sub);
    fs::create_dir_all(&dir).unwrap();
    build_image_index(&dir.join("certrotor-oci.tar"), envs).unwrap()
}

#[test]
fn image_index_pushed_pulled_by_digest_and_run_on_both_architectures() {
    let t0 = Instant::now();
    for (tool, package) in TOOLS {
        require_tool(tool, package).unwrap();
    }
    let work = paths::work_root().join("image-registry");
    if work.exists() {
        fs::remove_dir_all(&work).unwrap();
    }
    fs::create_dir_all(&work).unwrap();
    let mut figures = String::new();
    let mut figure = |line: String| {
        eprintln!("image-registry: {line}");
        figures.push_str(&line);
        figures.push('\n');
    };

    // ---- deterministic: built twice, the same bytes; SOURCE_DATE_EPOCH sets `created`
    let a = build(&work, "a", &[]);
    let b = build(&work, "b", &[]);
    assert_eq!(a.digest, b.digest, "two builds, two index digests");
    assert!(
        fs::read(&a.archive).unwrap() == fs::read(&b.archive).unwrap(),
        "two builds of the index differ: {} {}",
        a.archive.display(),
        b.archive.display()
    );
    let c = build(&work, "c", &[("SOURCE_DATE_EPOCH", "1700000000")]);
    assert_ne!(
        c.digest, a.digest,
        "SOURCE_DATE_EPOCH did not change the index"
    );
    for (plat, p) in &a.platforms {
        assert_eq!(
            c.platforms[plat].layer, p.layer,
            "{plat}: layer depends on the date"
        );
    }
    assert_eq!(
        a.platforms.keys().collect::<Vec<_>>(),
        ["linux/amd64", "linux/arm64"]
    );
    figure(format!(
        "index {} built in {:.1}s, again in {:.1}s (same bytes: {} B archive)",
        a.digest,
        a.build_time.as_secs_f64(),
        b.build_time.as_secs_f64(),
        fs::metadata(&a.archive).unwrap().len()
    ));
    let epoch = sh(&format!(
        "cd '{}' && git log -1 --format=%ct HEAD",
        paths::workspace_root().display()
    ));
    let want = expected_annotations(&epoch);
    let mut want_c = want.clone();
    want_c.insert(
        "org.opencontainers.image.created",
        "2023-11-14T22:13:20Z".to_string(),
    );

    // ---- push to a real registry on loopback, read the index back by digest
    let reg = Registry::start("image-registry").unwrap();
    let t_push = Instant::now();
    let by_digest = reg.push(&a).unwrap();
    let push_time = t_push.elapsed();
    // c under another tag: the registry keeps both, each pulled by its own digest.
    let c_ref = reg.push_as(&c, "epoch-1700000000").unwrap();
    let raw_index = inspect_raw(&reg, &["inspect"], &by_digest);
    assert_eq!(
        digest_of(&raw_index),
        a.digest,
        "the registry serves other index bytes"
    );
    let index = json(&raw_index, "index");
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    assert_eq!(index["schemaVersion"], 2);
    assert_annotations(&index["annotations"], &want, "index");
    let raw_c = inspect_raw(&reg, &["inspect"], &c_ref);
    assert_annotations(&json(&raw_c, "index c")["annotations"], &want_c, "index c");
    let tags = reg
        .skopeo(&[
            "list-tags",
            "--tls-verify=false",
            &format!("docker://{}/certrotor", reg.addr()),
        ])
        .unwrap()
        .stdout;
    let tags = json(&tags, "list-tags");
    assert!(
        tags["Tags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| *t == *a.tag),
        "tag {} not in {tags}",
        a.tag
    );

    // ---- pull the whole index back by digest into an OCI layout
    let pulled = work.join("pulled");
    let t_pull = Instant::now();
    reg.skopeo(&[
        "copy",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{by_digest}"),
        &format!("oci:{}", pulled.display()),
    ])
    .unwrap();
    let pull_time = t_pull.elapsed();
    let layout = json(&fs::read(pulled.join("index.json")).unwrap(), "index.json");
    assert_eq!(
        layout["manifests"][0]["digest"],
        a.digest.as_str(),
        "{layout}"
    );
    assert_eq!(blob(&pulled, &a.digest), raw_index);
    figure(format!(
        "push (both platforms) {:.2}s, pull by digest {:.2}s",
        push_time.as_secs_f64(),
        pull_time.as_secs_f64()
    ));

    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 2, "{index}");
    for (plat, arch, variant, machine, runner) in PLATFORMS {
        let built = a.platform(plat).unwrap();
        let desc = manifests
            .iter()
            .find(|m| m["platform"]["architecture"] == arch)
            .unwrap_or_else(|| panic!("no {arch} manifest in {index}"));
        assert_eq!(desc["platform"]["os"], "linux");
        assert_eq!(desc["platform"]["variant"].as_str(), variant, "{desc}");
        assert_eq!(
            desc["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        assert_eq!(desc["digest"], built.manifest.as_str(), "{plat}");

        let manifest = json(&blob(&pulled, &built.manifest), "manifest");
        assert_eq!(
            manifest["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        assert_annotations(&manifest["annotations"], &want, &format!("{plat} manifest"));
        assert_eq!(manifest["config"]["digest"], built.config.as_str());
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1, "{manifest}");
        assert_eq!(layers[0]["digest"], built.layer.as_str());
        assert_eq!(
            layers[0]["mediaType"],
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );

        let raw_config = blob(&pulled, &built.config);
        let config = json(&raw_config, "config");
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["os"], "linux");
        assert_eq!(config["variant"].as_str(), variant);
        assert_eq!(
            config["created"],
            want["org.opencontainers.image.created"].as_str()
        );
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/usr/bin/certrotor"])
        );
        assert_annotations(
            &config["config"]["Labels"],
            &want,
            &format!("{plat} labels"),
        );
        assert_eq!(
            config["rootfs"]["diff_ids"],
            serde_json::json!([built.diff_id])
        );
        // The registry picks this platform's config from the index, as a node of that
        // architecture does.
        let picked = inspect_raw(
            &reg,
            &[
                "--override-arch",
                arch,
                "--override-os",
                "linux",
                "inspect",
                "--config",
            ],
            &by_digest,
        );
        assert_eq!(
            picked, raw_config,
            "{plat}: config chosen through the index"
        );

        // The layer: its digest, its diff_id, its files; the binary in it.
        let layer_path = pulled.join("blobs/sha256").join(&built.layer[7..]);
        let _ = blob(&pulled, &built.layer);
        let diff_id = sh(&format!(
            "gzip -dc '{}' | sha256sum | cut -c1-64",
            layer_path.display()
        ));
        assert_eq!(
            format!("sha256:{diff_id}"),
            built.diff_id,
            "{plat}: diff_id"
        );
        let listing = sh(&format!("tar -tzf '{}'", layer_path.display()));
        let mut files: Vec<&str> = listing.lines().filter(|l| !l.ends_with('/')).collect();
        files.sort_unstable();
        assert_eq!(
            files,
            ["etc/group", "etc/passwd", "usr/bin/certrotor"],
            "{plat}: files in the layer"
        );
        let rootfs = work.join(format!("rootfs-{arch}"));
        fs::create_dir_all(&rootfs).unwrap();
        sh(&format!(
            "tar -xzf '{}' -C '{}'",
            layer_path.display(),
            rootfs.display()
        ));
        let bin: PathBuf = rootfs.join("usr/bin/certrotor");
        let data = fs::read(&bin).unwrap();
        assert_eq!(&data[..4], b"\x7fELF", "{plat}");
        assert_eq!(
            u16::from_le_bytes([data[18], data[19]]),
            machine,
            "{plat}: ELF machine"
        );
        let size = data.len() as u64;
        assert!(
            size < MAX_BINARY,
            "{plat}: binary is {size} B, not under 4 MiB"
        );
        assert_eq!(size, built.binary_size);
        assert_eq!(sha256_hex(&data), built.binary_sha256, "{plat}: binary");
        assert_eq!(
            fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
            0o755
        );

        let took = lab_cycle(
            plat,
            runner,
            &bin,
            &work.join(format!("lab-{arch}")),
            &want["org.opencontainers.image.version"],
        );
        figure(format!(
            "{plat}: binary {size} B, layer {} B; lab init/check/renew --all/check/rollback/check {:.1}s{}",
            fs::metadata(&layer_path).unwrap().len(),
            took.as_secs_f64(),
            if runner.is_empty() {
                String::new()
            } else {
                format!(" (under {})", runner.join(" "))
            }
        ));
    }
    drop(reg);
    figure(format!("total {:.1}s", t0.elapsed().as_secs_f64()));
    fs::write(work.join("figures.txt"), figures).unwrap();
}
