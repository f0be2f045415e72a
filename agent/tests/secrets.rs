//! No private-key material in anything certrotor prints (issue 12.5): every command of cli.rs
//! (check, renew, run, rollback, backups, status, etcd-client export/import, lab init, demo,
//! daemon, version, a usage error, and check/renew on a hostile node whose certificate file
//! holds a key) with every `--log-level` and `--log-format` and every `--output`. stdout and
//! stderr are searched for PEM `PRIVATE KEY` blocks, and for base64 (standard and url-safe, the
//! three byte alignments) and hex of every private key that was on the node at any point (key
//! files, backups, kubeconfigs' `client-key-data`, the export bundle, the demo's node): any run
//! of 24 or more characters of those encodings is a failure, unless the same run is public
//! (it also appears in a certificate's encodings: an RSA key holds its modulus).
//!
//! `etcd-client export --out -` prints the bundle (with its key) on stdout by design: its
//! stdout is compared with the bundle and only its stderr is searched.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64ct::{Base64Unpadded, Base64UrlUnpadded, Encoding};

use crate::renew_util::LOOPBACK_ECDSA;
use crate::util::{BIN, TestDir, walk};

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
const FORMATS: [&str; 2] = ["text", "json"];
const OUTPUTS: [&str; 2] = ["table", "json"];
/// The shortest run of a key's encoding that counts as a leak.
const WINDOW: usize = 24;

/// What a run printed.
struct Printed {
    what: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs certrotor with the global flags; Events on (the node's apiserver is a closed loopback
/// port, so the failed post and its warning are part of what is searched).
fn run(level: &str, format: &str, args: &[&str]) -> Printed {
    let mut all = vec!["--log-level", level, "--log-format", format];
    all.extend_from_slice(args);
    let what = format!("certrotor {}", all.join(" "));
    let mut child = Command::new(BIN)
        .args(&all)
        .env_remove("CERTROTOR_EVENTS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let out_pipe = child.stdout.take().unwrap();
    let err_pipe = child.stderr.take().unwrap();
    let reader = |mut p: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = p.read_to_end(&mut b);
            b
        })
    };
    let (o, e) = (reader(Box::new(out_pipe)), reader(Box::new(err_pipe)));
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(s) => s.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{what} did not finish within 90 s");
        }
    };
    Printed {
        what,
        code: status.code(),
        stdout: String::from_utf8_lossy(&o.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&e.join().unwrap()).into_owned(),
    }
}

/// `daemon` until it has recorded one pass, then SIGTERM (bounded waits).
fn run_daemon(level: &str, format: &str, root: &Path) -> Printed {
    let record = root.join("var/lib/certrotor/last-pass.json");
    let _ = fs::remove_file(&record);
    let args = [
        "--log-level",
        level,
        "--log-format",
        format,
        "daemon",
        "--root",
        root.to_str().unwrap(),
        "--interval",
        "1h",
        "--platform",
        "none",
        "--all",
    ];
    let dir = root.parent().unwrap();
    let (out, err) = (dir.join("daemon.stdout"), dir.join("daemon.stderr"));
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("CERTROTOR_EVENTS")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while !record.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let recorded = record.exists();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let p = Printed {
        what: format!("certrotor {}", args.join(" ")),
        code: status.and_then(|s| s.code()),
        stdout: fs::read_to_string(&out).unwrap_or_default(),
        stderr: fs::read_to_string(&err).unwrap_or_default(),
    };
    assert!(
        recorded,
        "the daemon recorded no pass within 60 s\n{}",
        p.stderr
    );
    p
}

// === key material ===

/// The PEM blocks of a text: (label, DER).
fn pem_blocks(text: &str) -> Vec<(String, Vec<u8>)> {
    pem_blocks_with_text(text)
        .into_iter()
        .map(|(label, der, _)| (label, der))
        .collect()
}

/// The PEM blocks of a text: (label, DER, the block's text from BEGIN to END).
fn pem_blocks_with_text(text: &str) -> Vec<(String, Vec<u8>, String)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("-----BEGIN ") {
        let after = &rest[i + 11..];
        let Some(j) = after.find("-----") else { break };
        let label = after[..j].to_string();
        let body_start = &after[j + 5..];
        let end_marker = format!("-----END {label}-----");
        let Some(k) = body_start.find(&end_marker) else {
            break;
        };
        let body: String = body_start[..k]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if let Ok(der) = base64ct::Base64::decode_vec(&body) {
            let block = &rest[i..rest.len() - body_start.len() + k + end_marker.len()];
            out.push((label, der, format!("{block}\n")));
        }
        rest = &body_start[k + end_marker.len()..];
    }
    out
}

/// Private keys and public material found in the files under `dirs`, added to the sets: key
/// DER, key files' bytes; certificate and public key DER.
fn collect(
    dirs: &[PathBuf],
    seen: &mut HashSet<(PathBuf, u64, i64, i64)>,
    secrets: &mut BTreeSet<Vec<u8>>,
    public: &mut BTreeSet<Vec<u8>>,
) {
    use std::os::unix::fs::MetadataExt;
    for dir in dirs {
        for file in walk(dir) {
            // Files already read, unchanged since (path, size, mtime): nothing new in them.
            let Ok(m) = fs::symlink_metadata(&file) else {
                continue;
            };
            if !seen.insert((file.clone(), m.len(), m.mtime(), m.mtime_nsec())) {
                continue;
            }
            let Ok(bytes) = fs::read(&file) else { continue };
            if bytes.len() > 1 << 20 {
                continue;
            }
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let mut texts = vec![text.clone()];
            // kubeconfigs: *-data values are base64 of PEM text.
            for line in text.lines() {
                let line = line.trim();
                for field in [
                    "client-key-data:",
                    "client-certificate-data:",
                    "certificate-authority-data:",
                ] {
                    if let Some(v) = line.strip_prefix(field)
                        && let Ok(pem) = base64ct::Base64::decode_vec(v.trim())
                    {
                        if field == "client-key-data:" {
                            secrets.insert(pem.clone());
                        }
                        texts.push(String::from_utf8_lossy(&pem).into_owned());
                    }
                }
            }
            for t in &texts {
                for (label, der, block) in pem_blocks_with_text(t) {
                    if !label.contains("PRIVATE KEY") {
                        // Its text is public too: a key file's text shares runs with it (the
                        // END line, an EC key's public point at the same alignment).
                        public.insert(block.into_bytes());
                    }
                    if label.contains("PRIVATE KEY") {
                        secrets.insert(der);
                        // The file's own bytes (base64 of a key file is a leak too).
                        if t.starts_with("-----BEGIN") && t.matches("-----BEGIN").count() == 1 {
                            secrets.insert(t.as_bytes().to_vec());
                        }
                    } else {
                        public.insert(der);
                    }
                }
            }
        }
    }
}

/// Every encoding searched for: base64 standard and url-safe at the three byte alignments,
/// hex lower case (text is lower-cased before hex matching).
fn encodings(blob: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for a in 0..3.min(blob.len()) {
        out.push(Base64Unpadded::encode_string(&blob[a..]));
        out.push(Base64UrlUnpadded::encode_string(&blob[a..]));
    }
    out.push(base16ct::lower::encode_string(blob));
    out.push(
        base16ct::lower::encode_string(blob)
            .replace("", ":")
            .trim_matches(':')
            .to_string(),
    );
    out
}

/// All WINDOW-character windows of the runs of `alphabet` characters in `text`.
fn windows(text: &str, alphabet: impl Fn(char) -> bool) -> HashSet<String> {
    let mut out = HashSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !alphabet(chars[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && alphabet(chars[i]) {
            i += 1;
        }
        if i - start >= WINDOW {
            for w in chars[start..i].windows(WINDOW) {
                out.insert(w.iter().collect());
            }
        }
    }
    out
}

fn b64_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '-' | '_')
}

fn hex_char(c: char) -> bool {
    c.is_ascii_hexdigit() || c == ':'
}

/// `text` without whitespace and without escaped line ends (`\\n`, `\\r`, `\\t` with any
/// number of backslashes): a PEM body cut into lines or columns, or inside a JSON string, is
/// one run again.
fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if c == '\\' {
            while chars.peek() == Some(&'\\') {
                chars.next();
            }
            if matches!(chars.peek(), Some('n' | 'r' | 't')) {
                chars.next();
                continue;
            }
            out.push(c);
            continue;
        }
        out.push(c);
    }
    out
}

/// The bytes of the hex dumps in `text`, rows in order: lines (text logs, or the `msg` of JSON
/// logs) holding groups of hex byte pairs as ureq-proto's trace rows print them (`7b22 6b76 …`,
/// `--` for no byte), whatever follows them (the ASCII column).
fn hex_dump_bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in text.lines() {
        let msg = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or_else(|| line.to_string());
        let group = |t: &str| {
            (t.len() == 2 || t.len() == 4)
                && t.as_bytes()
                    .chunks(2)
                    .all(|p| p == b"--" || (p[0].is_ascii_hexdigit() && p[1].is_ascii_hexdigit()))
        };
        let tokens: Vec<&str> = msg.split_whitespace().collect();
        let Some(first) = tokens.iter().position(|t| group(t)) else {
            continue;
        };
        for t in tokens[first..].iter().take_while(|t| group(t)) {
            for pair in t.as_bytes().chunks(2) {
                if pair != b"--"
                    && let Ok(b) = u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16)
                {
                    out.push(b);
                }
            }
        }
    }
    out
}

/// Base64 (standard or url-safe, padded or not) runs of 32 characters or more in `text`,
/// decoded.
fn base64_runs(text: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for run in text.split(|c: char| !(b64_char(c) || c == '=')) {
        let run = run.trim_end_matches('=');
        if run.len() < 32 {
            continue;
        }
        // Every alignment: the run may start inside a group.
        for skip in 0..4.min(run.len()) {
            let body = &run[skip..];
            let body = &body[..body.len() - body.len() % 4];
            if let Ok(b) =
                Base64Unpadded::decode_vec(body).or_else(|_| Base64UrlUnpadded::decode_vec(body))
            {
                out.push(b);
                break;
            }
        }
    }
    out
}

/// What a printed text says once its layers are undone, each a text to search: the text; the
/// text compacted ([`compact`]); the bytes of its hex dumps ([`hex_dump_bytes`]), as text and as
/// hex; and, two levels down, every long base64 run of these decoded ([`base64_runs`]), undone
/// the same way. A key published through etcd is printed by a trace log as hex rows of base64
/// of JSON of PEM: the rows give the bytes, the base64 the JSON, compacting the PEM's base64.
fn views(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![(text.to_string(), 0)];
    while let Some((t, depth)) = todo.pop() {
        let mut layer = vec![compact(&t)];
        let dump = hex_dump_bytes(&t);
        if !dump.is_empty() {
            let d = String::from_utf8_lossy(&dump).into_owned();
            layer.push(base16ct::lower::encode_string(&dump));
            layer.push(compact(&d));
            layer.push(d);
        }
        if depth < 2 {
            for l in &layer {
                for bytes in base64_runs(l) {
                    layer_hex(&mut out, &bytes);
                    todo.push((String::from_utf8_lossy(&bytes).into_owned(), depth + 1));
                }
            }
        }
        out.push(t);
        out.extend(layer);
    }
    out
}

/// Decoded bytes as hex, searched too (raw DER inside base64).
fn layer_hex(out: &mut Vec<String>, bytes: &[u8]) {
    out.push(base16ct::lower::encode_string(bytes));
}

/// The leaks in `texts` (name, text): each as "name printed …". Every text's windows go into
/// one index, then every window of every key encoding is looked up once; a window that also
/// belongs to public material is not a leak.
fn leaks(
    texts: &[(String, &str)],
    secrets: &BTreeSet<Vec<u8>>,
    public: &BTreeSet<Vec<u8>>,
) -> Vec<String> {
    let mut found = Vec::new();
    let mut index: std::collections::HashMap<String, Vec<usize>> = Default::default();
    for (i, (name, text)) in texts.iter().enumerate() {
        for view in views(text) {
            if view.contains("PRIVATE KEY") {
                found.push(format!("{name} printed a 'PRIVATE KEY' PEM label"));
            }
            for w in windows(&view, b64_char)
                .into_iter()
                .chain(windows(&view.to_lowercase(), hex_char))
            {
                index.entry(w).or_default().push(i);
            }
        }
    }
    found.dedup();
    if index.is_empty() {
        return found;
    }
    let mut public_enc: Option<Vec<String>> = None;
    for secret in secrets {
        for enc in encodings(secret) {
            // Encodings are ASCII: byte windows are character windows.
            for start in 0..=enc.len().saturating_sub(WINDOW) {
                let Some(w) = enc.get(start..start + WINDOW) else {
                    break;
                };
                let Some(who) = index.get(w) else { continue };
                let public_enc = public_enc
                    .get_or_insert_with(|| public.iter().flat_map(|p| encodings(p)).collect());
                if public_enc.iter().any(|p| p.contains(w)) {
                    continue;
                }
                for i in who {
                    found.push(format!("{} printed '{w}' of a key's encoding", texts[*i].0));
                }
                break;
            }
        }
    }
    found
}

/// The private and public key material under `dirs` (see [`collect`]).
fn collected(dirs: &[PathBuf]) -> (BTreeSet<Vec<u8>>, BTreeSet<Vec<u8>>) {
    let (mut secrets, mut public) = (BTreeSet::new(), BTreeSet::new());
    collect(dirs, &mut HashSet::new(), &mut secrets, &mut public);
    (secrets, public)
}

/// A fresh ECDSA lab node in a test folder named `name`, and the key material under it.
fn scanned_lab(name: &str) -> (TestDir, PathBuf, BTreeSet<Vec<u8>>, BTreeSet<Vec<u8>>) {
    let t = TestDir::new(name);
    let root = t.lab("n", &["--key-algorithm", "ecdsa-p256"]);
    let (secrets, public) = collected(std::slice::from_ref(&root));
    (t, root, secrets, public)
}

#[test]
fn the_scanner_finds_key_material_in_any_encoding_and_alignment() {
    let (_t, root, secrets, public) = scanned_lab("secrets-scanner");
    assert!(secrets.len() >= 10, "keys found: {}", secrets.len());
    let key = fs::read_to_string(root.join("etc/kubernetes/pki/apiserver.key")).unwrap();
    let der = pem_blocks(&key).remove(0).1;
    let clean = "2026-11-23T00:00:00.000Z INFO  [ops] renewed apiserver; sha256 \
                 8077b6c456f8464158d414ad5d22453a1136c03ba2d50978c68e06dddd99e2c1";
    assert!(leaks(&[("clean".into(), clean)], &secrets, &public).is_empty());
    for (what, text) in [
        ("the PEM", key.clone()),
        (
            "base64, alignment 1, mid-text",
            format!("x {} y", &Base64Unpadded::encode_string(&der[1..])[10..40]),
        ),
        (
            "url-safe base64, alignment 2",
            format!(
                "\"{}\"",
                &Base64UrlUnpadded::encode_string(&der[2..])[4..30]
            ),
        ),
        (
            "hex, upper case",
            base16ct::upper::encode_string(&der[20..40]),
        ),
        (
            "base64 of the key file",
            format!(
                "k={}",
                &Base64Unpadded::encode_string(key.as_bytes())[30..60]
            ),
        ),
    ] {
        assert!(
            !leaks(&[(what.into(), &text)], &secrets, &public).is_empty(),
            "{what} not found in {text}"
        );
    }
}

/// One combination of global flags: every command, every `--output`.
fn sweep(level: &str, format: &str, t: &Path, offset: u16) -> Vec<String> {
    let combo_started = Instant::now();
    let dir = t.join(format!("{level}-{format}"));
    fs::create_dir_all(&dir).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // RSA keys (kubeadm's default) in one combination, ECDSA in the others: RSA key generation
    // in every run would make the sweep minutes long; the search is the same for both.
    let algorithm = if (level, format) == ("info", "text") {
        "rsa-2048"
    } else {
        "ecdsa-p256"
    };
    let port = offset.to_string();
    let node = dir.join("node");
    let external = dir.join("external");
    let hostile = dir.join("hostile");
    let lab = dir.join("lab");
    let bundle = dir.join("bundle.pem");
    let mut scan_dirs = vec![dir.clone()];
    let printed: std::cell::RefCell<Vec<Printed>> = Default::default();
    let (mut secrets, mut public) = (BTreeSet::new(), BTreeSet::new());
    let lab_flags = [
        "--expires-in",
        "3d",
        "--key-algorithm",
        algorithm,
        "--advertise-address",
        "127.0.0.1",
        "--port-offset",
        &port,
    ];
    let mut seen = HashSet::new();
    let collecting = std::cell::Cell::new(Duration::ZERO);
    let mut step = |p: Printed, scan: &[PathBuf], secrets: &mut BTreeSet<Vec<u8>>| {
        let t0 = Instant::now();
        collect(scan, &mut seen, secrets, &mut public);
        collecting.set(collecting.get() + t0.elapsed());
        printed.borrow_mut().push(p);
    };
    // lab init (the nodes of this combination).
    for (d, extra) in [
        (&node, vec![]),
        (&external, vec!["--topology", "external-etcd"]),
        (&hostile, vec![]),
    ] {
        let mut args = vec!["lab".to_string(), "init".into(), s(d)];
        args.extend(lab_flags.iter().map(|x| x.to_string()));
        args.extend(extra.iter().map(|x| x.to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        step(run(level, format, &a), &scan_dirs, &mut secrets);
    }
    // The hostile node: a key where a certificate should be, and pasted on one line.
    let key = fs::read_to_string(hostile.join("etc/kubernetes/pki/apiserver.key")).unwrap();
    fs::write(hostile.join("etc/kubernetes/pki/apiserver.crt"), &key).unwrap();
    fs::write(
        hostile.join("etc/kubernetes/pki/front-proxy-client.crt"),
        key.replace('\n', " "),
    )
    .unwrap();
    let n = s(&node);
    let h = s(&hostile);
    let cp = s(&external.join("control-plane"));
    let etcd = s(&external.join("etcd"));
    let b = s(&bundle);
    let mut commands: Vec<Vec<String>> = vec![vec!["version".into()]];
    for output in OUTPUTS {
        for c in [
            vec!["check", "--root", &n],
            vec!["renew", "--root", &n, "--all"],
            vec!["renew", "--root", &n, "--all", "--dry-run"],
            vec!["run", "--once", "--root", &n, "--all", "--platform", "none"],
            vec!["backups", "--root", &n],
            vec!["status", "--root", &n],
            vec!["check", "--root", &h],
            vec!["renew", "--root", &h, "--all"],
            vec!["ca", "plan", "--ca", "ca", "--root", &n],
            vec!["ca", "plan", "--ca", "etcd-ca", "--root", &h],
        ] {
            let mut c: Vec<String> = c.iter().map(|x| x.to_string()).collect();
            c.extend(["--output".to_string(), output.to_string()]);
            commands.push(c);
        }
    }
    for c in [
        vec!["rollback", "--root", &n],
        vec!["etcd-client", "export", "--root", &etcd, "--out", &b],
        vec![
            "etcd-client",
            "import",
            "--root",
            &cp,
            "--from",
            &b,
            "--platform",
            "none",
        ],
        // A CA rotation makes a CA key: trust-in and issue, the state, then an abort.
        vec![
            "ca",
            "rotate",
            "--ca",
            "front-proxy-ca",
            "--root",
            &n,
            "--platform",
            "none",
        ],
        vec!["ca", "status", "--root", &n],
        vec![
            "ca",
            "abort",
            "--ca",
            "front-proxy-ca",
            "--root",
            &n,
            "--platform",
            "none",
        ],
        vec!["renew", "--root", &n, "--no-such-flag"],
        vec!["lab", "init", &s(&lab), "--key-algorithm", "ecdsa-p256"],
    ] {
        commands.push(c.iter().map(|x| x.to_string()).collect());
    }
    for c in &commands {
        let a: Vec<&str> = c.iter().map(String::as_str).collect();
        step(run(level, format, &a), &scan_dirs, &mut secrets);
    }
    // export to stdout: the bundle by design; only stderr is searched.
    let mut out = run(
        level,
        format,
        &["etcd-client", "export", "--root", &etcd, "--out", "-"],
    );
    assert_eq!(out.code, Some(0), "{}\n{}", out.what, out.stderr);
    assert_eq!(
        out.stdout.as_bytes(),
        fs::read(&bundle).unwrap(),
        "export --out - prints the bundle"
    );
    out.stdout.clear();
    step(out, &scan_dirs, &mut secrets);
    step(run_daemon(level, format, &node), &scan_dirs, &mut secrets);
    // demo --keep: its node is searched too, then removed.
    let demo = run(level, format, &["demo", "--keep"]);
    let kept = demo
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("The lab node is kept at "))
        .map(|p| PathBuf::from(p.trim()))
        .unwrap_or_else(|| panic!("demo --keep names no folder\n{}", demo.stdout));
    scan_dirs.push(kept.clone());
    step(demo, &scan_dirs, &mut secrets);
    let _ = fs::remove_dir_all(&kept);
    let printed = printed.into_inner();
    eprintln!(
        "{level}/{format}: reading the node's keys took {:.1} s",
        collecting.get().as_secs_f64()
    );

    let mut problems = Vec::new();
    let mut texts: Vec<(String, &str)> = Vec::new();
    for p in &printed {
        if p.stderr.contains("panicked") || p.code.is_none() {
            problems.push(format!("{}: crashed ({:?})\n{}", p.what, p.code, p.stderr));
        }
        texts.push((format!("{} (stdout)", p.what), &p.stdout));
        texts.push((format!("{} (stderr)", p.what), &p.stderr));
    }
    let scan = Instant::now();
    problems.extend(leaks(&texts, &secrets, &public));
    let scan = scan.elapsed();
    // Every level prints what it should: nothing at off, more at trace.
    let stderr_len: usize = printed.iter().map(|p| p.stderr.len()).sum();
    if level == "info" {
        assert!(stderr_len > 0, "{level}/{format}: no diagnostics at all");
    }
    assert!(
        secrets.len() > 30,
        "{level}/{format}: only {} keys found to search for",
        secrets.len()
    );
    eprintln!(
        "{level}/{format}: {} runs in {:.1} s, {} keys searched in {:.1} s, {} bytes printed",
        printed.len(),
        combo_started.elapsed().as_secs_f64() - scan.as_secs_f64(),
        secrets.len(),
        scan.as_secs_f64(),
        printed
            .iter()
            .map(|p| p.stdout.len() + p.stderr.len())
            .sum::<usize>()
    );
    problems
}

#[test]
fn no_command_prints_key_material_at_any_log_level_format_or_output() {
    let t = TestDir::new("secrets-sweep");
    let combos: Vec<(&str, &str)> = LEVELS
        .iter()
        .flat_map(|l| FORMATS.iter().map(move |f| (*l, *f)))
        .collect();
    let queue = Mutex::new(combos.into_iter().enumerate().collect::<Vec<_>>());
    let problems = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let Some((i, (level, format))) = queue.lock().unwrap().pop() else {
                        break;
                    };
                    // Ports where nothing listens: Events and the cluster lock fail fast.
                    let offset = 45_000 + 10 * i as u16 + (std::process::id() % 7) as u16;
                    let found = sweep(level, format, t.path(), offset);
                    problems.lock().unwrap().extend(found);
                }
            });
        }
    });
    eprintln!("sweep: {:.1} s", started.elapsed().as_secs_f64());
    let problems = problems.into_inner().unwrap();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// ureq-proto's trace rows of `data`, as certrotor's text and JSON logs print them: 16 bytes a
/// row, hex groups of two bytes (`--` for none), then the ASCII column.
fn trace_rows(data: &[u8], json: bool) -> String {
    let mut out = String::new();
    for row in data.chunks(16) {
        let mut line = String::new();
        for i in 0..16 {
            match row.get(i) {
                Some(b) => line.push_str(&format!("{b:02x}")),
                None => line.push_str("--"),
            }
            if i % 2 == 1 {
                line.push(' ');
            }
        }
        line.push(' ');
        for i in 0..16 {
            line.push(match row.get(i) {
                Some(b) if b.is_ascii_alphanumeric() || b.is_ascii_punctuation() => *b as char,
                _ => '.',
            });
        }
        if json {
            out.push_str(
                &serde_json::json!({"time": "t", "level": "trace", "target": "ureq_proto::util", "msg": line})
                    .to_string(),
            );
            out.push('\n');
        } else {
            out.push_str(&format!(
                "2026-11-23T00:00:00.000Z TRACE [ureq_proto::util] {line}\n"
            ));
        }
    }
    out
}

/// Issue 30.1: the key published through etcd reached stderr at `--log-level trace` as hex rows
/// of base64 of JSON of PEM, which the windows of the raw text never show. The scanner undoes
/// those layers.
#[test]
fn the_scanner_finds_a_key_in_hex_rows_of_base64_of_json_of_pem() {
    let (_t, root, secrets, public) = scanned_lab("secrets-scanner-rows");
    let key =
        fs::read_to_string(root.join("etc/kubernetes/pki/apiserver-etcd-client.key")).unwrap();
    let pair = serde_json::json!({"version": 1, "cert_pem": "x", "key_pem": key}).to_string();
    let value = base64ct::Base64::encode_string(pair.as_bytes());
    let body = serde_json::json!({"kvs": [{"key": "Y2VydHJvdG9y", "value": value}]}).to_string();
    for json in [false, true] {
        let printed = trace_rows(body.as_bytes(), json);
        assert!(!printed.contains("PRIVATE KEY"));
        let found = leaks(&[("trace rows".into(), &printed)], &secrets, &public);
        assert!(!found.is_empty(), "json {json}: not found in\n{printed}");
    }
    // The same rows of a certificate only are clean.
    let cert =
        fs::read_to_string(root.join("etc/kubernetes/pki/apiserver-etcd-client.crt")).unwrap();
    let body = base64ct::Base64::encode_string(cert.as_bytes());
    let found = leaks(
        &[("rows".into(), &trace_rows(body.as_bytes(), false))],
        &secrets,
        &public,
    );
    assert!(found.is_empty(), "{found:?}");
}

/// `run --once` in cluster mode on `root` through etcd at `endpoint` (short waits).
fn cluster_pass(root: &str, endpoint: &str) -> Vec<String> {
    [
        "run",
        "--once",
        "--root",
        root,
        "--platform",
        "kubeadm",
        "--etcd-endpoint",
        endpoint,
        "--restart-timeout",
        "3s",
        "--cluster-wait",
        "3s",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Issue 30.1: cluster mode at every log level and format. An external-etcd lab with one real
/// etcd (Debian's): the etcd node's pass publishes its apiserver-etcd-client pair through etcd
/// (the key reset first, so every pass publishes), the control plane's pass reads it back, and
/// `status` reads the cluster lock. Nothing they print holds key material, in any encoding.
#[test]
fn no_cluster_mode_command_prints_key_material_at_any_log_level_or_format() {
    let t = TestDir::new("secrets-cluster");
    let offset = testkit::ports::offsets(1)[0].to_string();
    let flags = [
        &["--topology", "external-etcd"][..],
        &LOOPBACK_ECDSA,
        &["--port-offset", &offset],
    ];
    let base = t.lab("x", &flags.concat());
    let (etcd_root, cp) = (base.join("etcd"), base.join("control-plane"));
    let epki = etcd_root.join("etc/etcd/pki");
    let etcd = crate::hostile30::OneEtcd::start(
        t.path(),
        &epki,
        (
            &epki.join("apiserver-etcd-client.crt"),
            &epki.join("apiserver-etcd-client.key"),
        ),
    );
    let client = etcd.client();
    let ep = etcd.endpoint.clone();
    let (secrets, public) = collected(&[etcd_root.clone(), cp.clone()]);
    assert!(secrets.len() > 10, "{} keys", secrets.len());
    let (e, c) = (
        etcd_root.to_str().unwrap().to_string(),
        cp.to_str().unwrap().to_string(),
    );
    let mut problems = Vec::new();
    let mut printed_bytes = 0;
    for level in LEVELS {
        for format in FORMATS {
            client.put(certrotor::cluster::PAIR_KEY, b"{}", 0).unwrap();
            let (pe, pc) = (cluster_pass(&e, &ep), cluster_pass(&c, &ep));
            let runs = [
                run(level, format, &refs(&pe)),
                run(level, format, &refs(&pc)),
                run(
                    level,
                    format,
                    &["status", "--root", &c, "--etcd-endpoint", &ep],
                ),
            ];
            let published = client.get(certrotor::cluster::PAIR_KEY).unwrap().unwrap();
            assert!(
                published.len() > 100,
                "{level}/{format}: the etcd node's pass published no pair\n{}",
                runs[0].stderr
            );
            let mut texts: Vec<(String, &str)> = Vec::new();
            for p in &runs {
                if p.stderr.contains("panicked") || p.code.is_none() {
                    problems.push(format!("{}: crashed\n{}", p.what, p.stderr));
                }
                printed_bytes += p.stdout.len() + p.stderr.len();
                texts.push((format!("{} (stdout)", p.what), &p.stdout));
                texts.push((format!("{} (stderr)", p.what), &p.stderr));
            }
            problems.extend(leaks(&texts, &secrets, &public));
        }
    }
    eprintln!(
        "cluster sweep: {printed_bytes} bytes printed, {} keys searched",
        secrets.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
