//! Hostile input (issue 15, issue 13.8): what a damaged, malicious or unusual node must not do to
//! certrotor. Each test reproduces one finding of the hostile-input campaign.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::{TestDir, certrotor, certrotor_within_cpu, check_json, record, s};

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Every 24-character run of the base64 body of a PEM file (the bytes that must never be shown).
fn secret_fragments(pem: &str) -> Vec<String> {
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----") && !l.contains(':'))
        .collect::<Vec<_>>()
        .concat();
    body.as_bytes()
        .chunks(24)
        .filter(|c| c.len() == 24)
        .map(|c| String::from_utf8_lossy(c).to_string())
        .collect()
}

#[track_caller]
fn assert_no_secret(output: &str, fragments: &[String], context: &str) {
    for f in fragments {
        assert!(
            !output.contains(f.as_str()),
            "{context}: key bytes '{f}' appear in the output:\n{output}"
        );
    }
}

/// Runs certrotor and returns stdout + stderr.
fn all_output(args: &[&str]) -> (Option<i32>, String) {
    let r = certrotor(args);
    assert!(!r.stderr.contains("panicked"), "{r}");
    (r.code, format!("{}\n{}", r.stdout, r.stderr))
}

fn base64(data: &[u8]) -> String {
    use std::process::{Command, Stdio};
    let mut c = Command::new("base64")
        .arg("-w0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(data).unwrap();
    String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
}

/// 15.1: a private key whose PEM lost its line breaks (or is otherwise damaged) is never echoed,
/// by `check` (table and JSON) or by `renew`.
#[test]
fn damaged_private_keys_are_never_printed() {
    let t = TestDir::new("keyprint");
    let original = std::fs::read_to_string(
        t.lab("orig", &["--expires-in", "3d"])
            .join("etc/kubernetes/pki/apiserver.key"),
    )
    .unwrap();
    let fragments = secret_fragments(&original);
    assert!(fragments.len() > 10);
    let one_line = original.replace('\n', "");
    let crlf_spaces = original.replace('\n', " ");
    let truncated = original[..original.len() * 2 / 3].to_string();
    let bad_char = original.replacen('A', "!", 3);
    let no_end = original.replace("-----END RSA PRIVATE KEY-----", "");
    let variants: Vec<(&str, String)> = vec![
        ("one line", one_line.clone()),
        ("spaces for line breaks", crlf_spaces),
        ("truncated", truncated),
        ("bad base64", bad_char),
        ("no END line", no_end),
    ];
    for (i, (what, text)) in variants.iter().enumerate() {
        let root = t.lab(&format!("n{i}"), &["--expires-in", "3d"]);
        std::fs::write(root.join("etc/kubernetes/pki/apiserver.key"), text).unwrap();
        // The same key, embedded in a kubeconfig.
        let admin = root.join("etc/kubernetes/admin.conf");
        let conf = std::fs::read_to_string(&admin).unwrap();
        let start = conf.find("client-key-data: ").unwrap() + "client-key-data: ".len();
        let end = start + conf[start..].find('\n').unwrap();
        let conf = format!(
            "{}{}{}",
            &conf[..start],
            base64(text.as_bytes()),
            &conf[end..]
        );
        std::fs::write(&admin, conf).unwrap();
        let r = p(&root);
        for args in [
            vec!["check", "--root", r],
            vec!["check", "--root", r, "--output", "json"],
            vec!["renew", "--root", r, "--all"],
            vec!["renew", "--root", r, "--cert", "apiserver"],
            vec!["renew", "--root", r, "--cert", "admin.conf"],
            vec!["renew", "--root", r, "--all", "--output", "json"],
            vec!["renew", "--root", r, "--all", "--dry-run"],
        ] {
            let (code, out) = all_output(&args);
            assert_ne!(code, Some(0), "{what}: {args:?} must fail:\n{out}");
            assert_no_secret(&out, &fragments, &format!("{what}: {args:?}"));
            // Base64 of the key (the embedded form) must not leak either.
            let b64 = base64(text.as_bytes());
            assert!(
                !out.contains(&b64[100..140]),
                "{what}: {args:?} echoes the kubeconfig's key data:\n{out}"
            );
        }
    }
}

/// 15.12: encrypted private keys (PKCS#8 and OpenSSL's legacy format) are named as encrypted,
/// with what to do.
#[test]
fn encrypted_private_keys_are_reported_as_encrypted() {
    let t = TestDir::new("encrypted");
    for (i, args) in [
        vec!["pkey", "-aes256", "-passout", "pass:secret"],
        vec!["rsa", "-aes256", "-traditional", "-passout", "pass:secret"],
    ]
    .into_iter()
    .enumerate()
    {
        let root = t.lab(&format!("n{i}"), &["--expires-in", "3d"]);
        let key = root.join("etc/kubernetes/pki/apiserver.key");
        let mut full = args.clone();
        let enc = root.join("enc.key");
        full.extend_from_slice(&["-in", p(&key), "-out", p(&enc)]);
        let out = std::process::Command::new("openssl")
            .args(&full)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        std::fs::rename(&enc, &key).unwrap();
        let inv = check_json(&root, &[], 2);
        let err = s(record(&inv, "apiserver"), "error");
        assert!(
            err.contains("encrypted") && err.contains("openssl pkey"),
            "{args:?}: {err}"
        );
        let (code, out) = all_output(&["renew", "--root", p(&root), "--cert", "apiserver"]);
        assert_eq!(code, Some(2), "{out}");
        assert!(out.contains("encrypted"), "{out}");
    }
}

/// Writes a kubeconfig-sized hostile YAML document of about `size` bytes.
fn hostile_yaml(shape: &str, size: usize) -> String {
    match shape {
        "flow-seq" => format!("a: {}{}\n", "[".repeat(size / 2), "]".repeat(size / 2)),
        "flow-map" => format!("a: {}1{}\n", "{a: ".repeat(size / 5), "}".repeat(size / 5)),
        "block-seq" => format!("a:\n{}x\n", "- ".repeat(size / 2)),
        "indent" => {
            let mut t = String::new();
            let mut depth = 0;
            while t.len() < size {
                t.push_str(&format!("{}k:\n", " ".repeat(depth)));
                depth += 1;
            }
            t
        }
        "aliases" => {
            let mut t = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
            let mut i = 1;
            while t.len() < size {
                let p = i - 1;
                t.push_str(&format!(
                    "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
                ));
                i += 1;
            }
            t
        }
        _ => unreachable!(),
    }
}

/// 13.8: deeply nested YAML under the 1 MiB read limit is answered at once (`invalid`, with a
/// clear error), never after minutes of parsing.
#[test]
fn deeply_nested_yaml_is_refused_at_once() {
    let t = TestDir::new("deepyaml");
    let root = node(&t, "n");
    for shape in ["flow-seq", "flow-map", "block-seq", "indent", "aliases"] {
        for size in [20_000usize, 1_000_000] {
            std::fs::write(
                root.join("etc/kubernetes/admin.conf"),
                hostile_yaml(shape, size),
            )
            .unwrap();
            std::fs::write(
                root.join("etc/kubernetes/manifests/kube-apiserver.yaml"),
                hostile_yaml(shape, size),
            )
            .unwrap();
            // A bound on work, not on time: the unbounded parser took 2.7 s (debug build) for
            // 20 KB and over an hour for 800 KB; the bounded one answers within this budget
            // of CPU time (the kernel stops a run that uses it up, and the test fails).
            let args = crate::util::check_args(&root, &["--output", "json"]);
            let inv = certrotor_within_cpu(&args, 1).expect(2).json();
            let r = record(&inv, "admin.conf");
            assert_eq!(s(r, "status"), "invalid", "{shape} {size}: {r:#}");
            let err = s(r, "error");
            assert!(
                err.contains("hostile or damaged") || err.contains("recursion limit"),
                "{shape} {size}: {err}"
            );
        }
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// 15.4: a new private key never inherits a wide mode from the old one, and `check` warns about
/// a key others can read.
#[test]
fn keys_are_written_0600_and_readable_keys_are_warned_about() {
    let t = TestDir::new("keymode");
    let root = node(&t, "n");
    let key = root.join("etc/kubernetes/pki/apiserver.key");
    let admin = root.join("etc/kubernetes/admin.conf");
    let set = |p: &Path, m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    set(&key, 0o644);
    set(&admin, 0o644);
    let inv = check_json(&root, &[], 1);
    for name in ["apiserver", "admin.conf"] {
        let w = format!("{}", record(&inv, name)["warnings"]);
        assert!(w.contains("0644") && w.contains("chmod 600"), "{name}: {w}");
    }
    let table = certrotor(&["check", "--root", p(&root)]);
    table.expect(1);
    assert!(table.stdout.contains("WARNINGS"), "{table}");
    certrotor(&[
        "renew",
        "--root",
        p(&root),
        "--cert",
        "apiserver",
        "--cert",
        "admin.conf",
    ])
    .expect(0);
    assert_eq!(mode(&key), 0o600, "renewed key");
    // A kubeconfig keeps its mode (as kubeadm's renewal does); check keeps warning about it.
    assert_eq!(mode(&admin), 0o644, "renewed kubeconfig");
    let inv = check_json(&root, &[], 1);
    assert!(
        record(&inv, "apiserver").get("warnings").is_none(),
        "{inv:#}"
    );
}

/// 15.10: `etcd-client export --out` replaces the bundle atomically: a run killed while writing
/// (here by a file-size limit, SIGXFSZ) leaves the old bundle whole.
#[test]
fn etcd_client_export_replaces_the_bundle_atomically() {
    let t = TestDir::new("export");
    let root = t.lab("n", &["--topology", "external-etcd"]).join("etcd");
    let bundle = t.join("bundle.pem");
    let export = [
        "etcd-client",
        "export",
        "--root",
        p(&root),
        "--out",
        p(&bundle),
    ];
    certrotor(&export).expect(0);
    let old = std::fs::read(&bundle).unwrap();
    assert_eq!(mode(&bundle), 0o600);
    certrotor(&["renew", "--root", p(&root), "--all"]).expect(0);
    // A crash while writing: the file-size limit kills the process at the first large write.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 1; exec '{}' etcd-client export --root '{}' --out '{}'",
            crate::util::BIN,
            p(&root),
            p(&bundle)
        ))
        .output()
        .unwrap();
    assert!(!out.status.success(), "the limited run must fail: {out:?}");
    assert_eq!(
        std::fs::read(&bundle).unwrap(),
        old,
        "the old bundle must survive a failed export"
    );
    certrotor(&export).expect(0);
    let new = std::fs::read(&bundle).unwrap();
    assert_ne!(new, old);
    let stdout = std::process::Command::new(crate::util::BIN)
        .args(["etcd-client", "export", "--root", p(&root), "--out", "-"])
        .output()
        .unwrap();
    assert_eq!(stdout.stdout, new);
    assert_eq!(mode(&bundle), 0o600);
}

fn openssl(args: &[&str]) -> String {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Replaces the certificate of `name` (key kept) by one openssl issues from `ca` with `ext`
/// (an openssl extension file body), valid for `days`.
fn reissue_with_openssl(pki: &Path, name: &str, ca: &str, subj: &str, ext: &str, days: &str) {
    let dir = pki.join(".openssl-work");
    std::fs::create_dir_all(&dir).unwrap();
    let csr = dir.join("csr");
    let extfile = dir.join("ext");
    std::fs::write(&extfile, ext).unwrap();
    let key = pki.join(format!("{name}.key"));
    let crt = pki.join(format!("{name}.crt"));
    csr_for(&key, subj, &csr);
    openssl(&[
        "x509",
        "-req",
        "-in",
        p(&csr),
        "-CA",
        p(&pki.join(format!("{ca}.crt"))),
        "-CAkey",
        p(&pki.join(format!("{ca}.key"))),
        "-set_serial",
        "4242",
        "-days",
        days,
        "-extfile",
        p(&extfile),
        "-out",
        p(&crt),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `openssl req -new`: a request for `key` with subject `subj`, written to `csr`.
fn csr_for(key: &Path, subj: &str, csr: &Path) {
    openssl(&["req", "-new", "-key", p(key), "-subj", subj, "-out", p(csr)]);
}

/// 15.8: renewal keeps every SAN type (URI and email too), not only DNS and IP.
#[test]
fn renewal_keeps_uri_and_email_sans() {
    let t = TestDir::new("urisan");
    let root = node(&t, "n");
    let pki = root.join("etc/kubernetes/pki");
    reissue_with_openssl(
        &pki,
        "apiserver-kubelet-client",
        "ca",
        "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client",
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=clientAuth\nsubjectAltName=DNS:node.example,email:ops@example.com,\
         IP:10.0.0.5,URI:spiffe://cluster.local/ns/kube-system/sa/apiserver\n",
        "3",
    );
    let crt = pki.join("apiserver-kubelet-client.crt");
    let sans = |f: &Path| openssl(&["x509", "-in", p(f), "-noout", "-ext", "subjectAltName"]);
    let before = sans(&crt);
    assert!(before.contains("URI:spiffe://"), "{before}");
    certrotor(&[
        "renew",
        "--root",
        p(&root),
        "--cert",
        "apiserver-kubelet-client",
    ])
    .expect(0);
    let after = sans(&crt);
    assert_eq!(after, before, "SANs after renewal");
    let serial = openssl(&["x509", "-in", p(&crt), "-noout", "-serial"]);
    assert!(
        !serial.contains("=1092"),
        "not renewed (serial 4242 kept): {serial}"
    );
}

/// A lab node in `t`'s `sub` with ECDSA keys whose leaves expire in 3 days.
fn node(t: &TestDir, sub: &str) -> PathBuf {
    t.lab(
        sub,
        &["--expires-in", "3d", "--key-algorithm", "ecdsa-p256"],
    )
}

/// Replaces `pki/ca.crt` by a self-signed CA with the same key and subject, valid from `start`
/// to `end` (openssl `YYYYMMDDHHMMSSZ`), made with `openssl ca` (3.0 has no -not_after).
fn redate_ca(pki: &Path, start: &str, end: &str) {
    let dir = pki.join(".openssl-ca");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.txt"), "").unwrap();
    std::fs::write(dir.join("serial"), "1000\n").unwrap();
    let cfg = format!(
        "[ca]\ndefault_ca=d\n[d]\ndatabase={0}/index.txt\nnew_certs_dir={0}\nserial={0}/serial\n\
         policy=p\ndefault_md=sha256\nunique_subject=no\nx509_extensions=v3\n[p]\n\
         commonName=supplied\n[v3]\nbasicConstraints=critical,CA:TRUE\n\
         keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign\n\
         subjectKeyIdentifier=hash\n",
        p(&dir)
    );
    std::fs::write(dir.join("cfg"), cfg).unwrap();
    let key = pki.join("ca.key");
    let csr = dir.join("csr");
    csr_for(&key, "/CN=kubernetes", &csr);
    openssl(&[
        "ca",
        "-batch",
        "-selfsign",
        "-config",
        p(&dir.join("cfg")),
        "-keyfile",
        p(&key),
        "-in",
        p(&csr),
        "-startdate",
        start,
        "-enddate",
        end,
        "-out",
        p(&pki.join("ca.crt")),
        "-notext",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 15.5: an expired CA makes its chains invalid in `check`, and renewal under it is refused
/// (even with --allow-beyond-ca) with advice that can work: rotate the CA.
#[test]
fn an_expired_ca_invalidates_its_chains_and_renewal_under_it_is_refused() {
    let t = TestDir::new("expiredca");
    let root = node(&t, "n");
    let pki = root.join("etc/kubernetes/pki");
    redate_ca(&pki, "20240101000000Z", "20250101000000Z");
    let before = std::fs::read(pki.join("apiserver.crt")).unwrap();
    let inv = check_json(&root, &[], 2);
    let ca = record(&inv, "ca");
    assert_eq!(s(ca, "status"), "expired", "{ca:#}");
    for name in ["apiserver", "apiserver-kubelet-client", "admin.conf"] {
        let r = record(&inv, name);
        assert_eq!(r["chain_ok"], false, "{name}: {r:#}");
        assert_eq!(s(r, "status"), "invalid", "{name}: {r:#}");
        assert!(s(r, "error").contains("must be rotated"), "{name}: {r:#}");
    }
    // etcd's chain is unaffected.
    assert_eq!(record(&inv, "etcd-peer")["chain_ok"], true);
    for args in [
        vec!["renew", "--root", p(&root), "--all", "--allow-beyond-ca"],
        vec![
            "renew",
            "--root",
            p(&root),
            "--cert",
            "apiserver",
            "--allow-beyond-ca",
        ],
    ] {
        let r = certrotor(&args);
        r.expect(2);
        assert!(r.stderr.contains("must be rotated"), "{r}");
    }
    assert_eq!(std::fs::read(pki.join("apiserver.crt")).unwrap(), before);
}

/// 15.9: `check` is read-only and never waits on another run's lock: it answers at once with
/// one of its documented codes, saying a run is in progress, and advises no flag it rejects.
#[test]
fn check_does_not_wait_for_another_runs_lock() {
    let t = TestDir::new("checklock");
    let root = node(&t, "n");
    let state = root.join("var/lib/certrotor");
    std::fs::create_dir_all(&state).unwrap();
    let lock = state.join("lock");
    std::fs::write(&lock, "pid 1\n").unwrap();
    // flock runs sleep as its child, which inherits the lock: both in a process group of
    // their own, killed together at the end. The sleep outlasts any wait of check's (its lock
    // timeout is 60 s) and ends by itself should the test stop before it kills the group.
    let mut holder = std::process::Command::new("flock")
        .args([p(&lock), "sleep", "600"])
        .process_group(0)
        .spawn()
        .expect("flock (util-linux) is needed");
    // Wait until the lock is really held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::process::Command::new("flock")
        .args(["-n", p(&lock), "true"])
        .status()
        .unwrap()
        .success()
    {
        assert!(Instant::now() < deadline, "flock never took the lock");
        std::thread::sleep(Duration::from_millis(50));
    }
    for args in [
        vec!["check", "--root", p(&root)],
        vec!["check", "--root", p(&root), "--output", "json"],
    ] {
        // The holder never lets go while check runs: a check that waited for the lock would
        // end on its lock timeout and advise --lock-timeout (refused below) or hang into the
        // run's deadline; no assertion on how long the answer took by the clock.
        let r = certrotor(&args);
        r.expect(1);
        assert!(
            holder.try_wait().unwrap().is_none(),
            "the lock holder went away while check ran"
        );
        assert!(r.stderr.contains("in progress"), "{r}");
        assert!(!r.stderr.contains("--lock-timeout"), "{r}");
        assert!(r.stdout.contains("apiserver"), "{r}");
    }
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    holder.wait().unwrap();
}

/// Every file under `dir` with its content (symlinks not followed).
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    crate::util::walk(dir)
        .into_iter()
        .filter(|f| !f.to_string_lossy().contains("var/lib/certrotor"))
        .map(|f| {
            let content = if f.is_symlink() {
                std::fs::read_link(&f)
                    .unwrap()
                    .to_string_lossy()
                    .as_bytes()
                    .to_vec()
            } else {
                std::fs::read(&f).unwrap_or_default()
            };
            (f.display().to_string(), content)
        })
        .collect()
}

/// 15.2: with `etc/kubernetes/pki` an absolute symlink, renewal writes where reads read (inside
/// the root), never to the host path the link names; `check` and `renew` agree.
#[test]
fn writes_through_a_symlinked_pki_folder_stay_inside_the_root() {
    let t = TestDir::new("symlinkpki");
    let root = node(&t, "n");
    let host = PathBuf::from(format!("/srv/certrotor-hostile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(host.join("pki/etcd")).unwrap();
    let inside = root.join(host.strip_prefix("/").unwrap());
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::rename(root.join("etc/kubernetes/pki"), inside.join("pki")).unwrap();
    std::os::unix::fs::symlink(host.join("pki"), root.join("etc/kubernetes/pki")).unwrap();
    let before = check_json(&root, &[], 1);
    assert_eq!(s(record(&before, "apiserver"), "status"), "expiring");
    let r = certrotor(&["renew", "--root", p(&root), "--all"]);
    let host_files = crate::util::walk(&host);
    let _ = std::fs::remove_dir_all(&host);
    r.expect(0);
    assert!(
        host_files.is_empty(),
        "renew wrote outside the root: {host_files:?}"
    );
    let after = check_json(&root, &[], 1);
    for name in ["apiserver", "etcd-peer", "admin.conf"] {
        assert_ne!(
            s(record(&after, name), "serial"),
            s(record(&before, name), "serial"),
            "{name} was not renewed in the root"
        );
    }
    assert!(
        root.join("etc/kubernetes/pki").is_symlink(),
        "the link is kept"
    );
}

/// 15.3: a live file that cannot be replaced (immutable attribute, a bind-mounted file) is found
/// before anything changes: exit 2 says so without advising root to run as root, the PKI is
/// whole, and `check` and `rollback` still run.
#[test]
fn an_unreplaceable_live_file_is_refused_before_anything_changes() {
    let t = crate::renew_util::TempDir::new("unreplaceable");
    let root = crate::renew_util::lab(&t.join("n"), &["--expires-in", "3d"]);
    let peer = root.join("etc/kubernetes/pki/etcd/peer.crt");
    // A first renewal, so that a backup exists for rollback.
    certrotor(&["renew", "--root", p(&root), "--cert", "apiserver"]).expect(0);
    let run_case = |what: &str, words: &[&str]| {
        let before = tree(&root);
        let r = certrotor(&["renew", "--root", p(&root), "--all"]);
        r.expect(2);
        for w in words {
            assert!(r.stderr.contains(w), "{what}: '{w}' missing\n{r}");
        }
        assert!(!r.stderr.contains("run as root"), "{what}\n{r}");
        assert!(r.stderr.contains("nothing was changed"), "{what}\n{r}");
        assert!(tree(&root) == before, "{what}: the PKI changed");
        certrotor(&["check", "--root", p(&root)]).expect(1);
    };
    let chattr = std::process::Command::new("chattr")
        .args(["+i", p(&peer)])
        .status()
        .expect("chattr (e2fsprogs) is needed");
    assert!(chattr.success(), "chattr +i failed (not root, or no ext4?)");
    run_case("immutable", &["peer.crt", "immutable", "chattr -i"]);
    std::process::Command::new("chattr")
        .args(["-i", p(&peer)])
        .status()
        .unwrap();
    let mut t = t;
    let copy = root.join("peer-copy.crt");
    std::fs::copy(&peer, &copy).unwrap();
    t.mount(&["--bind", p(&copy), p(&peer)])
        .expect("cannot bind-mount a file (root needed)");
    run_case("bind mount", &["peer.crt", "mount point"]);
    certrotor(&["rollback", "--root", p(&root)]).expect(0);
}

/// 15.7: a CA whose key is on the node but unusable (Ed25519) or unreadable (not root) is not
/// "externally managed": the report names the cause, and a renewal of something due under it
/// exits non-zero.
#[test]
fn an_unusable_or_unreadable_ca_key_is_named_not_called_external() {
    let t = TestDir::new("ed25519ca");
    let root = node(&t, "n");
    let pki = root.join("etc/kubernetes/pki");
    let ca_key = pki.join("front-proxy-ca.key");
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", p(&ca_key)]);
    openssl(&[
        "req",
        "-x509",
        "-key",
        p(&ca_key),
        "-subj",
        "/CN=front-proxy-ca",
        "-days",
        "3650",
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
        "-out",
        p(&pki.join("front-proxy-ca.crt")),
    ]);
    reissue_with_openssl(
        &pki,
        "front-proxy-client",
        "front-proxy-ca",
        "/CN=front-proxy-client",
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=clientAuth\n",
        "3",
    );
    let inv = check_json(&root, &[], 2);
    let ca = record(&inv, "front-proxy-ca");
    assert_eq!(ca["externally_managed"], false, "{ca:#}");
    assert!(
        s(ca, "error").contains("unsupported key type Ed25519"),
        "{ca:#}"
    );
    let leaf = record(&inv, "front-proxy-client");
    assert_eq!(leaf["externally_managed"], false, "{leaf:#}");
    let r = certrotor(&["renew", "--root", p(&root), "--all"]);
    r.expect(2);
    assert!(r.stderr.contains("unsupported key type"), "{r}");

    // Not root: keys are unreadable, which is a permission problem, not an external CA.
    let root2 = node(&t, "n2");
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            crate::util::BIN,
        ])
        .args(["check", "--root", p(&root2), "--output", "json"])
        .output()
        .expect("setpriv (util-linux) is needed");
    let inv: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(out.status.code(), Some(2), "{inv:#}");
    for name in ["ca", "etcd-ca", "front-proxy-ca", "apiserver"] {
        let r = record(&inv, name);
        assert_eq!(r["externally_managed"], false, "{name}: {r:#}");
        assert!(s(r, "error").contains("permission"), "{name}: {r:#}");
    }
}

/// 15.11: a kubeconfig naming certificate files (not embedded data) is shown as not renewable,
/// and `renew --all` renews everything else, reporting that one clearly.
#[test]
fn a_kubeconfig_naming_files_is_not_renewable_and_does_not_stop_renew_all() {
    let t = TestDir::new("kubeconfigfiles");
    let root = node(&t, "n");
    let admin = root.join("etc/kubernetes/admin.conf");
    let conf = std::fs::read_to_string(&admin).unwrap();
    let files = root.join("etc/kubernetes/admin-pki");
    std::fs::create_dir_all(&files).unwrap();
    let mut out = String::new();
    for line in conf.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let mut replaced = false;
        for (key, file) in [
            ("client-certificate-data: ", "admin.crt"),
            ("client-key-data: ", "admin.key"),
        ] {
            if let Some(data) = trimmed.strip_prefix(key) {
                let pem = crate::util::base64_decode(data.trim());
                std::fs::write(files.join(file), pem).unwrap();
                let name = key.trim_end_matches("-data: ");
                out.push_str(&format!(
                    "{indent}{name}: /etc/kubernetes/admin-pki/{file}\n"
                ));
                replaced = true;
            }
        }
        if !replaced {
            out.push_str(line);
            out.push('\n');
        }
    }
    std::fs::write(&admin, out).unwrap();
    let before = check_json(&root, &[], 1);
    let r = record(&before, "admin.conf");
    assert_eq!(r["renewable"], false, "{r:#}");
    assert!(
        format!("{}", r["warnings"]).contains("not embedded"),
        "{r:#}"
    );
    let run = certrotor(&["renew", "--root", p(&root), "--all"]);
    run.expect(0);
    let text = format!("{}{}", run.stdout, run.stderr);
    assert!(text.contains("skipped admin.conf"), "{run}");
    let after = check_json(&root, &[], 1);
    assert_ne!(
        s(record(&after, "apiserver"), "serial"),
        s(record(&before, "apiserver"), "serial")
    );
    let named = certrotor(&["renew", "--root", p(&root), "--cert", "admin.conf"]);
    assert_ne!(named.code, Some(0), "{named}");
    assert!(named.stderr.contains("not embedded"), "{named}");
}

/// Every `'certrotor ...'` command quoted in `text`.
fn quoted_commands(text: &str) -> Vec<String> {
    text.split('\'')
        .skip(1)
        .step_by(2)
        .filter(|q| q.starts_with("certrotor "))
        .map(str::to_string)
        .collect()
}

/// 15.6: every command a `check` report advises is one certrotor follows: each is run, and
/// must succeed. CAs and kubelet.conf are never advised to `certrotor renew`.
#[test]
fn every_advised_command_works() {
    let t = TestDir::new("advice");
    // A mismatched pair (a key from another certificate) and a kubeconfig with a foreign key.
    let root = node(&t, "n");
    let pki = root.join("etc/kubernetes/pki");
    std::fs::copy(
        pki.join("front-proxy-client.key"),
        pki.join("apiserver.key"),
    )
    .unwrap();
    // An expired node: kubelet.conf expired too.
    let expired = t.lab(
        "e",
        &["--expires-in", "-1d", "--key-algorithm", "ecdsa-p256"],
    );
    let mut ran = 0;
    for node in [&root, &expired] {
        let inv = check_json(node, &[], 2);
        for r in inv["certificates"].as_array().unwrap() {
            let Some(err) = r["error"].as_str() else {
                continue;
            };
            let name = s(r, "name");
            if s(r, "kind") == "ca" || name == "kubelet.conf" {
                assert!(!err.contains("certrotor renew"), "{name}: {err}");
            }
            for cmd in quoted_commands(err) {
                if cmd.contains(" ID") {
                    continue; // a template: 'certrotor rollback --backup ID'
                }
                let mut args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
                args.extend_from_slice(&["--root", p(node)]);
                let run = certrotor(&args);
                assert_eq!(run.code, Some(0), "{name}: advised '{cmd}' fails\n{run}");
                ran += 1;
            }
        }
    }
    assert!(ran >= 2, "too few advised commands were found ({ran})");
    let inv = check_json(&root, &[], 1);
    assert_eq!(record(&inv, "apiserver")["key_matches"], true);
}
