//! The harness: a fresh folder per test, the real `certrotor` binary, openssl as the oracle.
//!
//! - [`TestDir`]: a unique folder under the system temp dir, removed when the test passes and
//!   kept (with a listing printed) when it fails.
//! - [`certrotor`]: runs the binary with a deadline; [`Run::expect`] checks the exit code and
//!   prints command, stdout and stderr when it differs.
//! - [`Ossl`]: what openssl reads in a certificate, parsed from its text output.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_certrotor");

/// Longest a single certrotor run may take before the test fails as hung (e.g. on a FIFO):
/// a bound for hangs, not a measure of speed, so generous enough for a debug build on a
/// machine busy with other work (a `lab init` took over 60 s at load 50).
const DEADLINE: Duration = Duration::from_secs(300);

pub const DAY: i64 = 86_400;
pub const YEAR: i64 = 365 * DAY;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh folder for one test.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    /// Creates `certrotor-it-<name>-<pid>-<n>` under the temp dir.
    pub fn new(name: &str) -> TestDir {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("certrotor-it-{name}-{}-{n}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path).unwrap();
        }
        std::fs::create_dir_all(&path).unwrap();
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// A lab node at `<dir>/<sub>` made by `certrotor lab init` with extra flags.
    pub fn lab(&self, sub: &str, flags: &[&str]) -> PathBuf {
        let root = self.join(sub);
        let mut args = vec!["lab", "init", root.to_str().unwrap()];
        args.extend_from_slice(flags);
        certrotor(&args).expect(0);
        root
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test folder kept: {}\n{}",
                self.path.display(),
                listing(&self.path)
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `find`-like listing with modes and link targets, for failure reports.
pub fn listing(dir: &Path) -> String {
    let mut out = String::new();
    for file in walk(dir) {
        let meta = std::fs::symlink_metadata(&file);
        let mode = meta
            .as_ref()
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
            .unwrap_or(0);
        let link = std::fs::read_link(&file)
            .map(|t| format!(" -> {}", t.display()))
            .unwrap_or_default();
        let size = meta.map(|m| m.len()).unwrap_or(0);
        out.push_str(&format!("  {mode:o} {size:>10} {}{link}\n", file.display()));
    }
    out
}

/// Every non-folder entry under `dir` (symlinks not followed), sorted.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(list) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in list.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(p),
                _ => out.push(p),
            }
        }
    }
    out.sort();
    out
}

/// One finished run of a command.
pub struct Run {
    pub command: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "command: {}\ncwd: {}\nexit code: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            self.code,
            self.stdout,
            self.stderr
        )
    }
}

/// Asserts that a certrotor run (`run`, shown on failure) did not panic and exited with `code`.
#[track_caller]
pub fn assert_exit(run: &dyn fmt::Display, stderr: &str, exit: Option<i32>, code: i32) {
    assert!(!stderr.contains("panicked"), "certrotor panicked\n{run}");
    assert_eq!(exit, Some(code), "unexpected exit code\n{run}");
}

impl Run {
    /// Asserts the exit code (and that nothing panicked); returns self for chaining.
    pub fn expect(&self, code: i32) -> &Run {
        assert_exit(self, &self.stderr, self.code, code);
        self
    }

    /// stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{self}"))
    }
}

/// Runs certrotor with `args`, failing the test if it does not finish within the deadline.
pub fn certrotor(args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    run_to_end(cmd, format!("{BIN} {}", args.join(" "))).0
}

/// Runs certrotor with `args` under a budget of `cpu_seconds` of CPU time (`ulimit -t`: past it
/// the kernel stops the process with SIGXCPU), failing the test, naming the budget, when the run
/// used it up. A bound on the work one run may do, the same whatever else the machine runs;
/// never a bound on how long it takes by the clock (the deadline only stops a hang).
pub fn certrotor_within_cpu(args: &[&str], cpu_seconds: u32) -> Run {
    let budget = cpu_seconds.to_string();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -S -t \"$0\" && exec \"$@\"", &budget, BIN])
        .args(args);
    let command = format!("(ulimit -S -t {cpu_seconds}) {BIN} {}", args.join(" "));
    let (run, signal) = run_to_end(cmd, command);
    assert_ne!(
        signal,
        Some(nix::sys::signal::Signal::SIGXCPU as i32),
        "used up its budget of {cpu_seconds} s of CPU time: more work than this input calls for\n{run}"
    );
    run
}

/// Runs `cmd` to its end (output captured, stdin empty, no Kubernetes Events), killing it and
/// failing the test past [`DEADLINE`]; returns the run and the signal that ended it, if any.
fn run_to_end(mut cmd: Command, command: String) -> (Run, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    let child = cmd
        // Lab nodes name addresses that are not theirs: no Kubernetes Events (events.rs tests them).
        .env("CERTROTOR_EVENTS", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out: Output = match rx.recv_timeout(DEADLINE) {
        Ok(r) => r.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("{command} did not finish within {DEADLINE:?} (hung?)");
        }
    };
    let run = Run {
        command,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (run, out.status.signal())
}

/// `certrotor check --root <root> --output json` with extra flags, expecting `code`.
pub fn check_json(root: &Path, extra: &[&str], code: i32) -> Value {
    let args = check_args(root, &[&["--output", "json"][..], extra].concat());
    certrotor(&args).expect(code).json()
}

/// The command line `check --root <root>` with `extra` flags.
pub fn check_args<'a>(root: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    [&["check", "--root", root.to_str().unwrap()][..], extra].concat()
}

/// The `certificates[]` record with this name.
pub fn record<'a>(inv: &'a Value, name: &str) -> &'a Value {
    inv["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no record '{name}' in {inv:#}"))
}

/// A string field of a record (panics when null or absent).
pub fn s<'a>(r: &'a Value, field: &str) -> &'a str {
    r[field]
        .as_str()
        .unwrap_or_else(|| panic!("field '{field}' is not a string in {r:#}"))
}

/// A string-array field of a record.
pub fn strings(r: &Value, field: &str) -> Vec<String> {
    r[field]
        .as_array()
        .unwrap_or_else(|| panic!("field '{field}' is not an array in {r:#}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Unix seconds now.
pub fn now() -> i64 {
    since_epoch().as_secs() as i64
}

/// The time since the Unix epoch, now.
pub fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

// === openssl ===

/// Runs openssl, optionally feeding stdin.
pub fn openssl(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let input = stdin.unwrap_or_default();
    run_piped("openssl", args, input, "openssl must be installed")
}

/// Runs `program args` with `input` on its stdin, to its end; `missing` is the panic when it
/// cannot start.
pub fn run_piped(program: &str, args: &[&str], input: &[u8], missing: &str) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(missing);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// Runs openssl and returns stdout, failing the test on a non-zero exit.
pub fn openssl_ok(args: &[&str]) -> String {
    let out = openssl(args, None);
    assert!(
        out.status.success(),
        "openssl {} failed\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `openssl verify -CAfile ca cert...` in one run: per certificate, Ok or openssl's output.
pub fn openssl_verify_all(ca: &Path, certs: &[&Path], check_time: bool) -> Vec<Result<(), String>> {
    if certs.is_empty() {
        return Vec::new();
    }
    let mut args = vec!["verify"];
    if !check_time {
        args.push("-no_check_time");
    }
    args.extend(["-CAfile", ca.to_str().unwrap()]);
    args.extend(certs.iter().map(|c| c.to_str().unwrap()));
    let out = openssl(&args, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    certs
        .iter()
        .map(|c| {
            let ok = format!("{}: OK", c.to_str().unwrap());
            if stdout.lines().any(|l| l == ok) {
                Ok(())
            } else {
                Err(text.clone())
            }
        })
        .collect()
}

/// `openssl verify -CAfile ca cert`: Ok, or openssl's output.
pub fn openssl_verify(ca: &Path, cert: &Path, check_time: bool) -> Result<(), String> {
    openssl_verify_all(ca, &[cert], check_time).remove(0)
}

/// The public key of a private key as openssl prints it (PEM).
pub fn key_public_key(key: &Path) -> String {
    openssl_ok(&["pkey", "-in", key.to_str().unwrap(), "-pubout"])
}

/// The public key of a certificate and of a private key as openssl prints them (PEM).
pub fn public_keys(cert: &Path, key: &Path) -> (String, String) {
    (
        openssl_ok(&["x509", "-in", cert.to_str().unwrap(), "-noout", "-pubkey"]),
        key_public_key(key),
    )
}

/// Standard base64 decoding, written here so as not to trust certrotor's own decoder.
pub fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.trim().bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {text}"),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// One extension as openssl prints it.
#[derive(Debug, Clone)]
pub struct Ext {
    pub critical: bool,
    pub value: String,
}

/// What openssl reads in a certificate file.
#[derive(Debug, Clone)]
pub struct Ossl {
    pub serial: String,
    pub not_before: i64,
    pub not_after: i64,
    pub subject: String,
    pub issuer: String,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// RFC 5280 names (`digitalSignature`), in openssl's order.
    pub key_usage: Vec<String>,
    pub ext_key_usage: Vec<String>,
    /// Extensions by openssl's name without the `X509v3 ` prefix.
    pub ext: BTreeMap<String, Ext>,
    /// `RSA-2048`, `ECDSA-P256`, ...
    pub public_key: String,
    /// The public key as PEM (`openssl x509 -pubkey`).
    pub pubkey_pem: String,
    pub signature_algorithm: String,
    /// The whole `-text` output.
    pub text: String,
}

impl Ossl {
    /// Reads `path` (first certificate) with openssl.
    pub fn read(path: &Path) -> Ossl {
        let p = path.to_str().unwrap();
        // One run (openssl is slow to start): the header lines, the public key, then -text.
        let out = openssl_ok(&[
            "x509",
            "-in",
            p,
            "-noout",
            "-serial",
            "-startdate",
            "-enddate",
            "-subject",
            "-issuer",
            "-pubkey",
            "-text",
            "-nameopt",
            "RFC2253",
        ]);
        let (head, text) = out
            .split_once("Certificate:\n")
            .unwrap_or_else(|| panic!("openssl -text of {p}:\n{out}"));
        let begin = "-----BEGIN PUBLIC KEY-----";
        let end = "-----END PUBLIC KEY-----";
        let pubkey_pem = match (head.find(begin), head.find(end)) {
            (Some(a), Some(b)) => format!("{}\n", &head[a..b + end.len()]),
            _ => panic!("no public key for {p}:\n{head}"),
        };
        let (head, text) = (head.to_string(), text.to_string());
        let field = |prefix: &str| -> String {
            head.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("openssl printed no '{prefix}' for {p}:\n{head}"))
                .trim()
                .to_string()
        };
        let ext = parse_extensions(&text);
        let list = |name: &str| -> Vec<String> {
            ext.get(name)
                .map(|e| {
                    e.value
                        .split(',')
                        .map(|v| v.trim().to_string())
                        .filter(|v| !v.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        for item in list("Subject Alternative Name") {
            if let Some(d) = item.strip_prefix("DNS:") {
                dns.push(d.to_string());
            } else if let Some(ip) = item.strip_prefix("IP Address:") {
                ips.push(
                    ip.parse()
                        .unwrap_or_else(|_| panic!("openssl IP '{ip}' does not parse")),
                );
            }
        }
        Ossl {
            serial: field("serial=").to_lowercase(),
            not_before: openssl_date(&field("notBefore=")),
            not_after: openssl_date(&field("notAfter=")),
            subject: field("subject="),
            issuer: field("issuer="),
            dns,
            ips,
            key_usage: list("Key Usage").iter().map(|k| ku_name(k)).collect(),
            ext_key_usage: list("Extended Key Usage")
                .iter()
                .map(|k| eku_name(k))
                .collect(),
            public_key: public_key_name(&text),
            signature_algorithm: text
                .lines()
                .find_map(|l| l.trim().strip_prefix("Signature Algorithm: "))
                .unwrap_or("?")
                .to_string(),
            ext,
            pubkey_pem,
            text,
        }
    }

    /// An extension's value, if present.
    pub fn ext_value(&self, name: &str) -> Option<&str> {
        self.ext.get(name).map(|e| e.value.as_str())
    }
}

/// Parses the `X509v3 extensions:` section of `openssl x509 -text`.
fn parse_extensions(text: &str) -> BTreeMap<String, Ext> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Ext)> = None;
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t == "X509v3 extensions:" {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if t.starts_with("Signature Algorithm:") {
            break;
        }
        if let Some(rest) = t.strip_prefix("X509v3 ") {
            if let Some((name, ext)) = current.take() {
                out.insert(name, ext);
            }
            let (name, flags) = rest.split_once(':').unwrap_or((rest, ""));
            current = Some((
                name.trim().to_string(),
                Ext {
                    critical: flags.contains("critical"),
                    value: String::new(),
                },
            ));
        } else if let Some((_, ext)) = current.as_mut() {
            if !ext.value.is_empty() {
                ext.value.push(',');
            }
            // OpenSSL 1.1 prefixes the AKI with `keyid:`.
            ext.value.push_str(t.strip_prefix("keyid:").unwrap_or(t));
        }
    }
    if let Some((name, ext)) = current.take() {
        out.insert(name, ext);
    }
    out
}

fn ku_name(openssl: &str) -> String {
    match openssl {
        "Digital Signature" => "digitalSignature",
        "Non Repudiation" => "contentCommitment",
        "Key Encipherment" => "keyEncipherment",
        "Data Encipherment" => "dataEncipherment",
        "Key Agreement" => "keyAgreement",
        "Certificate Sign" => "keyCertSign",
        "CRL Sign" => "cRLSign",
        "Encipher Only" => "encipherOnly",
        "Decipher Only" => "decipherOnly",
        other => other,
    }
    .to_string()
}

fn eku_name(openssl: &str) -> String {
    match openssl {
        "TLS Web Server Authentication" => "serverAuth",
        "TLS Web Client Authentication" => "clientAuth",
        other => other,
    }
    .to_string()
}

fn public_key_name(text: &str) -> String {
    let bits = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Public-Key: ("))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    if text.contains("Public Key Algorithm: rsaEncryption") {
        format!("RSA-{bits}")
    } else if text.contains("ASN1 OID: prime256v1") {
        "ECDSA-P256".into()
    } else if text.contains("ASN1 OID: secp384r1") {
        "ECDSA-P384".into()
    } else {
        format!("unknown ({bits} bit)")
    }
}

/// Parses openssl's `Nov 24 14:26:38 2026 GMT` into Unix seconds.
pub fn openssl_date(text: &str) -> i64 {
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert!(
        parts.len() == 5 && parts[4] == "GMT",
        "unexpected openssl date '{text}'"
    );
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS
        .iter()
        .position(|m| *m == parts[0])
        .unwrap_or_else(|| panic!("month in '{text}'")) as i64
        + 1;
    let day: i64 = parts[1].parse().unwrap();
    let hms: Vec<i64> = parts[2].split(':').map(|x| x.parse().unwrap()).collect();
    let year: i64 = parts[3].parse().unwrap();
    days_from_civil(year, month, day) * DAY + hms[0] * 3600 + hms[1] * 60 + hms[2]
}

/// Parses RFC 3339 UTC (`2026-11-24T14:26:38Z`, as certrotor prints it) into Unix seconds.
pub fn rfc3339(text: &str) -> i64 {
    let b = text.as_bytes();
    assert!(
        b.len() == 20
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'Z',
        "not RFC 3339 UTC with whole seconds: '{text}'"
    );
    let n = |r: std::ops::Range<usize>| -> i64 {
        text[r]
            .parse()
            .unwrap_or_else(|_| panic!("digits in '{text}'"))
    };
    days_from_civil(n(0..4), n(5..7), n(8..10)) * DAY
        + n(11..13) * 3600
        + n(14..16) * 60
        + n(17..19)
}

use testkit::date::days_from_civil;

// === the oracle's own reading of a node ===

/// A certificate found on disk by walking the node, independently of certrotor's catalog.
#[derive(Debug)]
pub struct Found {
    /// Relative to the root: the `.crt`, or the kubeconfig.
    pub path: String,
    /// The PEM file openssl reads (a decoded copy for embedded kubeconfig data).
    pub cert_file: PathBuf,
    /// The private key file, when there is one.
    pub key_file: Option<PathBuf>,
    /// The private key's public key as openssl derives it.
    pub key_pubkey: Option<String>,
    pub ossl: Ossl,
}

/// A string value of a kubeconfig (`key: value` line, first match); enough for kubeadm's files.
pub fn kubeconfig_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(&format!("{key}:"))
            .map(|v| v.trim().to_string())
    })
}

/// Resolves an absolute path as the node sees it (one level of absolute symlink, as the kubelet
/// makes `kubelet-client-current.pem`).
pub fn node_path(root: &Path, abs: &str) -> PathBuf {
    let p = root.join(abs.trim_start_matches('/'));
    match std::fs::read_link(&p) {
        Ok(t) if t.is_absolute() => root.join(t.to_str().unwrap().trim_start_matches('/')),
        Ok(t) => p.parent().unwrap().join(t),
        Err(_) => p,
    }
}

/// Every certificate of the node: `*.crt` files, and the client certificate of every `*.conf`
/// (embedded data decoded into `scratch`, or the file it names).
pub fn find_certificates(root: &Path, scratch: &Path) -> Vec<Found> {
    std::fs::create_dir_all(scratch).unwrap();
    let mut out = Vec::new();
    for file in walk(root) {
        let rel = file
            .strip_prefix(root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        if rel.ends_with(".crt") {
            let key = if rel.ends_with("server-etcd-client.crt") {
                file.with_file_name("apiserver-etcd-client.key")
            } else {
                file.with_extension("key")
            };
            let key_file = key.exists().then_some(key);
            out.push(Found {
                ossl: Ossl::read(&file),
                key_pubkey: key_file.as_deref().map(key_public_key),
                key_file,
                cert_file: file,
                path: rel,
            });
        } else if rel == "var/lib/kubelet/pki/kubelet-client-current.pem" {
            // The kubelet's link to its combined certificate-and-key file (the dated files
            // behind it are reached through it only).
            let pem = node_path(root, &format!("/{rel}"));
            out.push(Found {
                ossl: Ossl::read(&pem),
                key_pubkey: Some(key_public_key(&pem)),
                key_file: Some(pem.clone()),
                cert_file: pem,
                path: rel,
            });
        } else if rel.ends_with(".conf") {
            let text = std::fs::read_to_string(&file).unwrap();
            let stem = rel.replace('/', "_");
            let (cert_file, key_file) = if let Some(data) =
                kubeconfig_value(&text, "client-certificate-data")
            {
                let cert = scratch.join(format!("{stem}.crt"));
                std::fs::write(&cert, base64_decode(&data)).unwrap();
                let key = scratch.join(format!("{stem}.key"));
                let key_data = kubeconfig_value(&text, "client-key-data").expect("client-key-data");
                std::fs::write(&key, base64_decode(&key_data)).unwrap();
                (cert, Some(key))
            } else {
                let cert =
                    kubeconfig_value(&text, "client-certificate").expect("client-certificate");
                let key = kubeconfig_value(&text, "client-key").expect("client-key");
                (node_path(root, &cert), Some(node_path(root, &key)))
            };
            out.push(Found {
                ossl: Ossl::read(&cert_file),
                key_pubkey: key_file.as_deref().map(key_public_key),
                cert_file,
                key_file,
                path: rel,
            });
        }
    }
    out
}

/// The string `field` of each object in the JSON array `list` (`restarted[].component`);
/// panics when `list` is not an array or an object's field is not a string.
#[track_caller]
pub fn each_field<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|x| x[field].as_str().unwrap())
        .collect()
}

/// The items of the JSON array of strings `list`; panics when one is not a string.
#[track_caller]
pub fn str_items(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect()
}
