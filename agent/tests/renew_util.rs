//! Helpers of the `renew` and `etcd` tests: a fresh folder per test (with the mounts it made),
//! a command runner that prints command, stdout and stderr when an expectation fails, file-tree
//! snapshots to prove "nothing changed", and openssl as the independent oracle.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The certrotor binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_certrotor")
}

/// A fresh folder, removed when the test passes and kept (path printed) when it fails. Mounts
/// registered with [`TempDir::mount`] are unmounted first in any case.
pub struct TempDir {
    pub path: PathBuf,
    mounts: Vec<PathBuf>,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!(
            "certrotor-{tag}-{}-{n}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir {
            path,
            mounts: Vec::new(),
        }
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Runs `mount` with `args` (the last one being the mount point) and unmounts on drop.
    /// Returns the failed output when mounting is not possible (not root, no CAP_SYS_ADMIN).
    pub fn mount(&mut self, args: &[&str]) -> Result<(), Output> {
        let out = Cmd::new("mount").args(args).run();
        if !out.status.success() {
            return Err(out);
        }
        let point = PathBuf::from(args.last().copied().unwrap_or_default());
        if !self.mounts.contains(&point) {
            self.mounts.push(point);
        }
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            // A bind mount on top of a tmpfs is two entries: unmount until nothing is left.
            for _ in 0..4 {
                let ok = Command::new("umount")
                    .arg(m)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    break;
                }
            }
        }
        if std::thread::panicking() {
            eprintln!("test folder kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A prerequisite is missing: the test fails saying what to install (never a silent pass).
#[track_caller]
pub fn prerequisite_missing(test: &str, why: &str) -> ! {
    testkit::prereq::missing(test, why)
}

/// Fails the test (never passes it silently) when `program` was built without the `failpoints`
/// feature: such a binary ignores `CERTROTOR_FAILPOINT`, so a crash test would prove nothing.
/// The failpoint code names its variable, so the binary holds the string exactly when it has
/// the code.
pub fn require_failpoints(program: &Path) {
    static CHECKED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    if checked.iter().any(|p| p == program) {
        return;
    }
    let bytes = std::fs::read(program)
        .unwrap_or_else(|e| panic!("cannot read '{}': {e}", program.display()));
    let needle = b"CERTROTOR_FAILPOINT";
    assert!(
        bytes.windows(needle.len()).any(|w| w == needle),
        "'{}' was built without failpoints, so this crash test cannot run: run the tests with \
         `cargo test -p certrotor --features failpoints` (qemu-tests/test-all.sh does)",
        program.display()
    );
    checked.push(program.to_path_buf());
}

/// A command to run.
#[derive(Clone)]
pub struct Cmd {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(String, String)>,
    stdin: Option<Vec<u8>>,
}

impl Cmd {
    pub fn new(program: impl Into<OsString>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            stdin: None,
        }
    }
    pub fn args<A: Into<OsString> + Clone>(mut self, args: &[A]) -> Cmd {
        self.args.extend(args.iter().cloned().map(Into::into));
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Cmd {
        if k == "CERTROTOR_FAILPOINT" {
            require_failpoints(Path::new(&self.program));
        }
        self.envs.push((k.into(), v.into()));
        self
    }
    pub fn stdin(mut self, data: &[u8]) -> Cmd {
        self.stdin = Some(data.to_vec());
        self
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        for v in ["CERTROTOR_FAILPOINT", "CERTROTOR_FAILPOINT_ACTION"] {
            c.env_remove(v);
        }
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        c
    }

    pub fn text(&self) -> String {
        let mut s: Vec<String> = self.envs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push(self.program.to_string_lossy().to_string());
        s.extend(self.args.iter().map(|a| a.to_string_lossy().to_string()));
        s.join(" ")
    }

    /// Runs to completion.
    pub fn run(&self) -> Output {
        let mut c = self.command();
        c.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start '{}': {e}", self.text()));
        if let Some(data) = &self.stdin
            && let Some(mut input) = child.stdin.take()
        {
            input.write_all(data).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        Output {
            cmd: self.text(),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Starts in the background with stdout and stderr going to files in `dir`.
    pub fn spawn(&self, dir: &Path, name: &str) -> Background {
        let stdout = dir.join(format!("{name}.stdout"));
        let stderr = dir.join(format!("{name}.stderr"));
        let mut c = self.command();
        c.stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start '{}': {e}", self.text()));
        Background {
            cmd: self.text(),
            child: Some(child),
            stdout,
            stderr,
        }
    }
}

/// A finished command.
pub struct Output {
    pub cmd: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "command: {}\nstatus: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n---",
            self.cmd, self.status, self.stdout, self.stderr
        )
    }
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
    #[track_caller]
    pub fn expect_code(self, code: i32) -> Output {
        assert_eq!(self.code(), Some(code), "unexpected exit\n{self}");
        self
    }
    #[track_caller]
    pub fn ok(self) -> Output {
        self.expect_code(0)
    }
    #[track_caller]
    pub fn expect_sigkill(self) -> Output {
        assert_eq!(
            self.status.signal(),
            Some(libc::SIGKILL),
            "expected death by SIGKILL\n{self}"
        );
        self
    }
    /// Asserts that stderr (or stdout) contains every word, case-insensitively.
    #[track_caller]
    pub fn says(self, words: &[&str]) -> Output {
        let all = format!("{}\n{}", self.stdout, self.stderr).to_lowercase();
        for w in words {
            assert!(
                all.contains(&w.to_lowercase()),
                "output lacks '{w}'\n{self}"
            );
        }
        self
    }
}

/// A command running in the background; killed on drop.
pub struct Background {
    pub cmd: String,
    child: Option<std::process::Child>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Background {
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }
    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
    pub fn describe(&self) -> String {
        format!(
            "background command: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n---",
            self.cmd,
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            self.stderr_text()
        )
    }
    /// Waits until it exits, at most `within`; past that it is killed and the test fails
    /// showing its output.
    #[track_caller]
    pub fn finish_within(&mut self, within: Duration) {
        let end = Instant::now() + within;
        while self.running() {
            if Instant::now() >= end {
                self.kill();
                panic!("did not finish within {within:?}: {}", self.describe());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    /// SIGKILLs it and waits; returns its exit status.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` until it returns `Some`, failing with `what` after `deadline`.
#[track_caller]
pub fn wait_for<T>(what: &str, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The renewable certificates of a stacked kubeadm node, in the order of `kubeadm certs
/// check-expiration`: (name, certificate or kubeconfig under etc/kubernetes, its CA certificate
/// under etc/kubernetes/pki without `.crt`).
#[rustfmt::skip]
pub const KUBEADM_LEAVES: [(&str, &str, &str); 11] = [
    ("admin.conf", "admin.conf", "ca"),
    ("apiserver", "pki/apiserver.crt", "ca"),
    ("apiserver-etcd-client", "pki/apiserver-etcd-client.crt", "etcd/ca"),
    ("apiserver-kubelet-client", "pki/apiserver-kubelet-client.crt", "ca"),
    ("controller-manager.conf", "controller-manager.conf", "ca"),
    ("etcd-healthcheck-client", "pki/etcd/healthcheck-client.crt", "etcd/ca"),
    ("etcd-peer", "pki/etcd/peer.crt", "etcd/ca"),
    ("etcd-server", "pki/etcd/server.crt", "etcd/ca"),
    ("front-proxy-client", "pki/front-proxy-client.crt", "front-proxy-ca"),
    ("scheduler.conf", "scheduler.conf", "ca"),
    ("super-admin.conf", "super-admin.conf", "ca"),
];

/// `certrotor ARGS`.
pub fn certrotor(args: &[&str]) -> Cmd {
    // Lab nodes name addresses that are not theirs: no Kubernetes Events (events.rs tests them).
    Cmd::new(bin()).args(args).env("CERTROTOR_EVENTS", "off")
}

/// Path as &str (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `certrotor lab init DIR ARGS`; returns DIR.
#[track_caller]
pub fn lab(dir: &Path, args: &[&str]) -> PathBuf {
    certrotor(&["lab", "init", s(dir)]).args(args).run().ok();
    dir.to_path_buf()
}

/// A new test folder `tag` with a lab node `node` in it (`lab init` with `args`): (folder,
/// node root).
#[track_caller]
pub fn lab_in(tag: &str, args: &[&str]) -> (TempDir, PathBuf) {
    let t = TempDir::new(tag);
    let root = lab(&t.join("node"), args);
    (t, root)
}

/// A new test folder `tag` with an [`expiring_ecdsa`] node `node` in it: (folder, node root).
#[track_caller]
pub fn expiring_in(tag: &str) -> (TempDir, PathBuf) {
    let t = TempDir::new(tag);
    let root = expiring_ecdsa(&t.join("node"));
    (t, root)
}

/// A lab node at DIR due in two days, with ECDSA keys; returns DIR.
#[track_caller]
pub fn expiring_ecdsa(dir: &Path) -> PathBuf {
    lab(
        dir,
        &["--expires-in", "2d", "--key-algorithm", "ecdsa-p256"],
    )
}

/// Backup ids under the node's state folder (complete ones, not `.`-hidden), sorted; none
/// when there is no backup folder.
pub fn backup_ids(root: &Path) -> Vec<String> {
    let backups = root.join("var/lib/certrotor/backups");
    let Ok(list) = std::fs::read_dir(backups) else {
        return vec![];
    };
    let mut ids: Vec<String> = list
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.'))
        .collect();
    ids.sort();
    ids
}

/// The flags of a one-member etcd `name` keeping its data in `data`, with `pki`'s `server.*`,
/// `peer.*` and `ca.crt` (client certificates required on both sides), on 127.0.0.1's `client`
/// and `peer` ports.
pub fn one_member_etcd_args(
    name: &str,
    data: &Path,
    pki: &Path,
    client: u16,
    peer: u16,
) -> Vec<String> {
    let f = |n: &str| pki.join(n).display().to_string();
    let client_url = format!("https://127.0.0.1:{client}");
    let peer_url = format!("https://127.0.0.1:{peer}");
    vec![
        "--name".into(),
        name.into(),
        "--data-dir".into(),
        data.display().to_string(),
        "--cert-file".into(),
        f("server.crt"),
        "--key-file".into(),
        f("server.key"),
        "--trusted-ca-file".into(),
        f("ca.crt"),
        "--client-cert-auth".into(),
        "--peer-cert-file".into(),
        f("peer.crt"),
        "--peer-key-file".into(),
        f("peer.key"),
        "--peer-trusted-ca-file".into(),
        f("ca.crt"),
        "--peer-client-cert-auth".into(),
        "--listen-client-urls".into(),
        client_url.clone(),
        "--advertise-client-urls".into(),
        client_url,
        "--listen-peer-urls".into(),
        peer_url.clone(),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone(),
        "--initial-cluster".into(),
        format!("{name}={peer_url}"),
    ]
}

/// `lab init` flags: a node whose addresses are 127.0.0.1, with ECDSA keys.
pub const LOOPBACK_ECDSA: [&str; 4] = [
    "--key-algorithm",
    "ecdsa-p256",
    "--advertise-address",
    "127.0.0.1",
];

/// Pass flags for a node where nothing runs: every restart and live-reload wait gives up after
/// a second, polled every 100 ms.
pub const SHORT_WAITS: [&str; 6] = [
    "--restart-timeout",
    "1s",
    "--reload-timeout",
    "1s",
    "--poll-interval",
    "100ms",
];

/// `openssl req` flags for a new unencrypted P-256 key written to `keyout`.
pub fn new_p256_key(keyout: &str) -> [&str; 7] {
    [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        keyout,
    ]
}

/// `openssl ARGS`, which must succeed.
#[track_caller]
pub fn openssl(args: &[&str]) -> String {
    Cmd::new("openssl").args(args).run().ok().stdout
}

/// `openssl ARGS` with `input` on stdin, which must succeed.
#[track_caller]
pub fn openssl_in(input: &[u8], args: &[&str]) -> String {
    Cmd::new("openssl")
        .args(args)
        .stdin(input)
        .run()
        .ok()
        .stdout
}

// === Snapshots ===

/// One entry of a file tree.
#[derive(Clone, PartialEq, Eq)]
pub enum Node {
    File {
        bytes: Vec<u8>,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    Symlink(PathBuf),
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Never print the bytes: they may be private keys.
            Node::File {
                bytes,
                mode,
                uid,
                gid,
            } => write!(
                f,
                "file({} bytes, sha256 {}, {mode:o}, {uid}:{gid})",
                bytes.len(),
                &sha256(bytes)[..16]
            ),
            Node::Dir { mode, uid, gid } => write!(f, "dir({mode:o}, {uid}:{gid})"),
            Node::Symlink(t) => write!(f, "symlink({})", t.display()),
        }
    }
}

/// Every file, folder and symlink under `root`, by path relative to `root`.
pub type Snapshot = BTreeMap<String, Node>;

/// Snapshots `root`, leaving out paths that start with any of `exclude`.
pub fn snapshot(root: &Path, exclude: &[&str]) -> Snapshot {
    let mut out = Snapshot::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if exclude.iter().any(|x| rel.starts_with(x)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let (mode, uid, gid) = (meta.mode() & 0o7777, meta.uid(), meta.gid());
            let node = if meta.file_type().is_symlink() {
                Node::Symlink(std::fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path.clone());
                Node::Dir { mode, uid, gid }
            } else {
                Node::File {
                    bytes: std::fs::read(&path).unwrap(),
                    mode,
                    uid,
                    gid,
                }
            };
            out.insert(rel, node);
        }
    }
    out
}

/// The paths that differ between two snapshots, with what differs.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => out.push(format!("removed {k}")),
            Some(w) if w != v => out.push(format!("changed {k}: {v:?} -> {w:?}")),
            Some(_) => {}
        }
    }
    for k in after.keys() {
        if !before.contains_key(k) {
            out.push(format!("added {k}"));
        }
    }
    out
}

/// Asserts two snapshots are equal, listing the differences.
#[track_caller]
pub fn assert_same(before: &Snapshot, after: &Snapshot, context: &str) {
    let d = diff(before, after);
    assert!(
        d.is_empty(),
        "{context}: the tree changed:\n  {}",
        d.join("\n  ")
    );
}

pub fn sha256(data: &[u8]) -> String {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

// === Certificates and kubeconfigs ===

/// Standard base64 (with or without padding, whitespace ignored).
pub fn base64_decode(text: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?}"),
        }
    };
    let clean: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c) << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// A kubeconfig as YAML.
pub fn kubeconfig(path: &Path) -> serde_norway::Value {
    serde_norway::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("'{}' is not YAML: {e}", path.display()))
}

fn named<'a>(list: &'a serde_norway::Value, name: &str) -> &'a serde_norway::Value {
    list.as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no entry named '{name}'"))
}

/// The current user's `user` map of a kubeconfig.
pub fn current_user(kc: &serde_norway::Value) -> &serde_norway::Value {
    current_entry(kc, "user", "users")
}

/// The current cluster's `cluster` map of a kubeconfig.
pub fn current_cluster(kc: &serde_norway::Value) -> &serde_norway::Value {
    current_entry(kc, "cluster", "clusters")
}

/// The `kind` map (`user`, `cluster`) of the entry of `list` the current context names.
fn current_entry<'a>(
    kc: &'a serde_norway::Value,
    kind: &str,
    list: &str,
) -> &'a serde_norway::Value {
    let ctx = kc["current-context"].as_str().unwrap();
    let name = named(&kc["contexts"], ctx)["context"][kind]
        .as_str()
        .unwrap();
    &named(&kc[list], name)[kind]
}

/// The certificate PEM of a `.crt` file, or the client certificate embedded in a `.conf`.
pub fn cert_pem(path: &Path) -> Vec<u8> {
    if path.extension().is_some_and(|e| e == "conf") {
        let kc = kubeconfig(path);
        base64_decode(
            current_user(&kc)["client-certificate-data"]
                .as_str()
                .unwrap(),
        )
    } else {
        std::fs::read(path).unwrap_or_else(|e| panic!("'{}': {e}", path.display()))
    }
}

/// The private key PEM of a `.crt` file's `.key`, or the key embedded in a `.conf`.
pub fn key_pem(path: &Path) -> Vec<u8> {
    if path.extension().is_some_and(|e| e == "conf") {
        let kc = kubeconfig(path);
        base64_decode(current_user(&kc)["client-key-data"].as_str().unwrap())
    } else {
        std::fs::read(path.with_extension("key")).unwrap()
    }
}

/// `openssl x509 -noout ARGS` on a certificate PEM.
#[track_caller]
pub fn x509(pem: &[u8], args: &[&str]) -> String {
    let mut all = vec!["x509", "-noout"];
    all.extend_from_slice(args);
    openssl_in(pem, &all)
}

/// The identity openssl sees: subject (RFC 2253), SANs, key usage, extended key usage and
/// basic constraints, in the certificate's extension order.
pub fn identity(pem: &[u8]) -> String {
    x509(
        pem,
        &[
            "-subject",
            "-nameopt",
            "RFC2253",
            "-ext",
            "subjectAltName,keyUsage,extendedKeyUsage,basicConstraints",
        ],
    )
}

/// SHA-256 fingerprint of a certificate, as openssl prints it.
pub fn fingerprint(pem: &[u8]) -> String {
    x509(pem, &["-fingerprint", "-sha256"]).trim().to_string()
}

/// (notBefore, notAfter) as Unix seconds.
pub fn validity(pem: &[u8]) -> (i64, i64) {
    let out = x509(pem, &["-startdate", "-enddate", "-dateopt", "iso_8601"]);
    let get = |k: &str| {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {out}"));
        parse_iso(line.trim())
    };
    (get("notBefore="), get("notAfter="))
}

/// `YYYY-MM-DD HH:MM:SSZ` to Unix seconds.
pub use testkit::date::parse_iso;

/// Seconds since the epoch.
pub use crate::util::now as unix_now;

/// The first line of a PEM (its header).
pub fn pem_header(pem: &[u8]) -> String {
    String::from_utf8_lossy(pem)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The public key of a private key PEM, as openssl prints it.
pub fn public_of_key(key: &[u8]) -> String {
    openssl_in(key, &["pkey", "-pubout"])
}

/// The public key of a certificate PEM.
pub fn public_of_cert(pem: &[u8]) -> String {
    x509(pem, &["-pubkey"])
}

/// `certrotor check --output json`, which must exit 0 or 1 (fine or expiring).
#[track_caller]
pub fn check_json(root: &Path) -> serde_json::Value {
    let out = certrotor(&["check", "--root", s(root), "--output", "json"]).run();
    assert!(
        matches!(out.code(), Some(0 | 1)),
        "check must find the PKI sound\n{out}"
    );
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("check json: {e}\n{out}"))
}

/// A free loopback TCP port (bound to port 0, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Copies a tree with `cp -a` (modes, owners, symlinks kept).
#[track_caller]
pub fn copy_tree(from: &Path, to: &Path) {
    Cmd::new("cp").args(&["-a", s(from), s(to)]).run().ok();
}

/// `openssl x509 -req`: signs `csr` with `ca` and `ca_key` (a random serial) for `days` days,
/// with the extensions of `extfile` (then `more`, e.g. `-extensions NAME`), into `out`; it must
/// succeed.
#[track_caller]
pub fn sign_csr(
    csr: &Path,
    ca: &Path,
    ca_key: &Path,
    days: &str,
    extfile: &Path,
    more: &[&str],
    out: &Path,
) {
    let head = [
        "x509",
        "-req",
        "-in",
        s(csr),
        "-CA",
        s(ca),
        "-CAkey",
        s(ca_key),
        "-set_serial",
        &random_serial(),
        "-days",
        days,
        "-extfile",
        s(extfile),
    ];
    openssl(&[&head[..], more, &["-out", s(out)]].concat());
}

/// `etcdctl` (API v3) at `endpoints` with the CA `ca` and the client pair `cert`/`key`; the
/// caller adds its flags and its command.
pub fn etcdctl(endpoints: &str, ca: &Path, cert: &Path, key: &Path) -> Cmd {
    Cmd::new("etcdctl").env("ETCDCTL_API", "3").args(&[
        "--endpoints",
        endpoints,
        "--cacert",
        s(ca),
        "--cert",
        s(cert),
        "--key",
        s(key),
    ])
}

/// A random positive serial for `openssl x509 -set_serial`, so openssl leaves no `.srl` file.
pub fn random_serial() -> String {
    let mut b = [0u8; 8];
    aws_lc_rs::rand::fill(&mut b).unwrap();
    b[0] &= 0x7f;
    format!(
        "0x{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// What the real kubectl v1.20.2 (client-go) reads in a kubeconfig: `kubectl config view --raw
/// -o json`. Panics with kubectl's error when it cannot load the file.
#[track_caller]
pub fn kubectl_view(kubeconfig: &Path) -> serde_json::Value {
    let out = Cmd::new(testkit::k8s::kubectl_path())
        .args(&["config", "view", "--raw", "-o", "json"])
        .args(&[format!("--kubeconfig={}", s(kubeconfig))])
        .env("HOME", s(kubeconfig.parent().unwrap()))
        .run();
    assert!(
        out.status.success(),
        "kubectl cannot load '{}': {}\n--- the file ---\n{}",
        kubeconfig.display(),
        out.stderr,
        std::fs::read_to_string(kubeconfig).unwrap_or_default()
    );
    serde_json::from_str(&out.stdout).unwrap()
}

/// A kubectl view without the credentials a renewal replaces: the current user's client
/// certificate and key, the current cluster's CA.
pub fn without_renewed_credentials(view: &serde_json::Value) -> serde_json::Value {
    let mut v = view.clone();
    let current = v["current-context"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let context = v["contexts"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == current.as_str()))
        .map(|c| c["context"].clone())
        .unwrap_or_default();
    for (list, inner, name, fields) in [
        (
            "users",
            "user",
            &context["user"],
            &["client-certificate-data", "client-key-data"][..],
        ),
        (
            "clusters",
            "cluster",
            &context["cluster"],
            &["certificate-authority-data"][..],
        ),
    ] {
        for item in v[list].as_array_mut().into_iter().flatten() {
            if &item["name"] == name {
                for f in fields {
                    if let Some(m) = item[inner].as_object_mut() {
                        m.remove(*f);
                    }
                }
            }
        }
    }
    v
}

/// Issue 30.3: after a kubeconfig is written, kubectl reads the same clusters, users, contexts
/// and current context as before, only the renewed credentials changed.
#[track_caller]
pub fn assert_kubectl_reads_the_same(before: &serde_json::Value, kubeconfig: &Path) {
    let after = kubectl_view(kubeconfig);
    assert_eq!(
        without_renewed_credentials(&after),
        without_renewed_credentials(before),
        "kubectl reads '{}' differently after certrotor wrote it",
        kubeconfig.display()
    );
}
