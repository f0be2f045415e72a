//! `certrotor renew`, `backups` and `rollback` on lab nodes: crash safety at every failpoint,
//! faults that must leave the live PKI untouched, parity with kubeadm/etcdadm as openssl sees
//! it, selection, dry runs, backups and rollback.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::renew_util::*;

const K: &str = "etc/kubernetes";
const STATE: &str = "var/lib/certrotor";
const FAILPOINT: &str = "CERTROTOR_FAILPOINT";

/// The renewable certificates of a stacked kubeadm lab node.
const RENEWABLE: [(&str, &str, &str); 11] = KUBEADM_LEAVES;

/// The files a renewal of the stacked node may write: every renewable certificate, its key,
/// every renewable kubeconfig.
fn renewable_files() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, file, _) in RENEWABLE {
        out.insert(format!("{K}/{file}"));
        if let Some(base) = file.strip_suffix(".crt") {
            out.insert(format!("{K}/{base}.key"));
        }
    }
    out
}

/// Failpoints reached before the journal exists: a crash there leaves the old PKI.
const BEFORE_JOURNAL: [&str; 4] = ["staged-file", "staged-all", "backup-file", "backed-up"];
const ALL_FAILPOINTS: [&str; 9] = [
    "staged-file",
    "staged-all",
    "backup-file",
    "backed-up",
    "journaled",
    "renamed",
    "journal-removed",
    "staging-removed",
    "pruned",
];

fn renew(root: &Path, args: &[&str]) -> Cmd {
    certrotor(&["renew", "--root", s(root)]).args(args)
}

/// The certificate PEM of every renewable entry (embedded for kubeconfigs).
fn certs(root: &Path) -> BTreeMap<&'static str, Vec<u8>> {
    RENEWABLE
        .iter()
        .map(|(name, file, _)| (*name, cert_pem(&root.join(K).join(file))))
        .collect()
}

/// Names whose certificate differs between two sets.
fn changed(
    before: &BTreeMap<&'static str, Vec<u8>>,
    after: &BTreeMap<&'static str, Vec<u8>>,
) -> Vec<&'static str> {
    before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(v))
        .map(|(k, _)| *k)
        .collect()
}

/// What an interrupted transaction may leave: staging folders, the journal, incomplete backups.
fn leftovers(root: &Path) -> Vec<String> {
    snapshot(root, &[])
        .keys()
        .filter(|k| {
            k.contains(".certrotor-staging-")
                || k.ends_with("journal.json")
                || k.ends_with("journal.json.tmp")
                || k.contains("backups/.incomplete-")
        })
        .cloned()
        .collect()
}

/// The name of the failpoint that stopped a run, from its stderr.
fn failpoint_hit(out: &Output) -> String {
    out.stderr
        .lines()
        .find_map(|l| l.strip_prefix("CERTROTOR-FAILPOINT "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no failpoint line\n{out}"))
        .to_string()
}

/// Serial per renewable name, from `check --output json` (which must recover and pass).
fn check_serials(root: &Path, context: &str) -> BTreeMap<String, String> {
    let inv = check_json(root);
    let mut out = BTreeMap::new();
    for (name, _, _) in RENEWABLE {
        let rec = inv["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{context}: check lists no '{name}'"));
        assert_eq!(
            rec["key_matches"], true,
            "{context}: {name}: key does not match: {rec}"
        );
        assert!(
            rec["status"] == "ok" || rec["status"] == "expiring",
            "{context}: {name}: status {}: {}",
            rec["status"],
            rec["error"]
        );
        out.insert(
            name.to_string(),
            rec["serial"].as_str().unwrap().to_string(),
        );
    }
    out
}

/// The pristine state of a node, to compare recovered nodes with.
struct Pristine {
    root: PathBuf,
    tree: Snapshot,
    certs: BTreeMap<&'static str, Vec<u8>>,
    serials: BTreeMap<String, String>,
}

impl Pristine {
    fn of(root: &Path) -> Pristine {
        Pristine {
            root: root.to_path_buf(),
            tree: snapshot(root, &[STATE]),
            certs: certs(root),
            serials: check_serials(root, "pristine"),
        }
    }

    /// A lab node due in two days with ECDSA keys, at `pristine` in `t`.
    fn expiring(t: &TempDir) -> Pristine {
        Pristine::of(&expiring_ecdsa(&t.join("pristine")))
    }

    /// A copy of the pristine node at `root`; returns `root`.
    fn copy(&self, root: PathBuf) -> PathBuf {
        copy_tree(&self.root, &root);
        root
    }

    /// Asserts that `root` holds a whole PKI, old (`new == false`) or new, with nothing lost,
    /// no transaction leftovers and the CAs untouched.
    #[track_caller]
    fn assert_whole(&self, root: &Path, new: bool, context: &str) {
        // `check` completes or discards an interrupted transaction, and must find every key
        // matching its certificate.
        let serials = check_serials(root, context);
        let left = leftovers(root);
        assert!(left.is_empty(), "{context}: leftovers remain: {left:?}");
        let tree = snapshot(root, &[STATE]);
        // The kubelet's client pair is reissued in the same transaction (kubelet.rs): a new
        // dated file and the link swapped to it, wholly or not at all; older files untouched.
        const LINK: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";
        let is_dated = |p: &str| p.starts_with("var/lib/kubelet/pki/kubelet-client-2");
        let paths = |t: &Snapshot| {
            t.keys()
                .filter(|k| !is_dated(k))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paths(&tree),
            paths(&self.tree),
            "{context}: the set of files changed"
        );
        let dated = |t: &Snapshot| {
            t.keys()
                .filter(|k| is_dated(k))
                .cloned()
                .collect::<Vec<_>>()
        };
        let (before, after) = (dated(&self.tree), dated(&tree));
        for d in &before {
            assert_eq!(tree.get(d), self.tree.get(d), "{context}: '{d}' changed");
        }
        let added: Vec<&String> = after.iter().filter(|d| !before.contains(d)).collect();
        if new {
            assert_eq!(added.len(), 1, "{context}: kubelet files {after:?}");
            assert_eq!(
                tree.get(LINK),
                Some(&Node::Symlink(PathBuf::from(format!("/{}", added[0])))),
                "{context}: the kubelet's link names the new file"
            );
        } else {
            assert!(added.is_empty(), "{context}: kubelet files {after:?}");
            assert_eq!(tree.get(LINK), self.tree.get(LINK), "{context}: link");
        }
        let renewable = renewable_files();
        for (path, node) in &self.tree {
            if !renewable.contains(path) && path != LINK && !is_dated(path) {
                assert_eq!(
                    tree.get(path),
                    Some(node),
                    "{context}: '{path}' (CA, sa key, kubelet file) changed"
                );
            }
        }
        let now = certs(root);
        let differ = changed(&self.certs, &now);
        let want: Vec<&str> = if new {
            RENEWABLE.iter().map(|r| r.0).collect()
        } else {
            vec![]
        };
        let mut differ_sorted = differ.clone();
        differ_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(
            differ_sorted,
            want_sorted,
            "{context}: the PKI is not wholly {}",
            if new { "new" } else { "old" }
        );
        for (name, serial) in &serials {
            assert_eq!(
                serial != &self.serials[name],
                new,
                "{context}: serial of {name}"
            );
        }
        // A renewal that committed left one backup. One killed after its backup was complete
        // but before the journal may leave that backup; it then holds the live (old) bytes.
        let ids = backup_ids(root);
        if new {
            assert_eq!(ids.len(), 1, "{context}: backups {ids:?}");
        } else {
            assert!(ids.len() <= 1, "{context}: backups {ids:?}");
            for id in &ids {
                let files = root.join(STATE).join("backups").join(id).join("files");
                for (path, node) in snapshot(&files, &[]) {
                    if let Node::File { bytes, .. } = node {
                        assert_eq!(
                            std::fs::read(root.join(&path)).unwrap(),
                            bytes,
                            "{context}: backup {id} holds other bytes than the live {path}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn crash_at_every_failpoint_leaves_the_pki_wholly_old_or_wholly_new() {
    let t = TempDir::new("walk");
    let pristine = Pristine::expiring(&t);
    let mut seen = BTreeSet::new();
    let mut n = 1usize;
    loop {
        assert!(n < 200, "renew never completed");
        let root = pristine.copy(t.join(&format!("n{n}")));
        let out = renew(&root, &[]).env(FAILPOINT, &n.to_string()).run();
        if out.code() == Some(0) {
            pristine.assert_whole(&root, true, &format!("after the complete run #{n}\n{out}"));
            break;
        }
        let out = out.expect_sigkill();
        let name = failpoint_hit(&out);
        let context = format!("killed at failpoint #{n} ({name})");
        // The state at the kill: before the journal the live PKI is untouched; from the
        // journal until its removal the journal is there.
        let at_kill = snapshot(&root, &[]);
        let journal = at_kill.contains_key(&format!("{STATE}/journal.json"));
        if BEFORE_JOURNAL.contains(&name.as_str()) {
            assert!(!journal, "{context}: journal written too early");
            let live: Snapshot = snapshot(&root, &[STATE])
                .into_iter()
                .filter(|(k, _)| !k.contains(".certrotor-staging-"))
                .collect();
            assert_same(&pristine.tree, &live, &context);
        } else if matches!(name.as_str(), "journaled" | "renamed") {
            assert!(journal, "{context}: no journal while committing");
        } else {
            assert!(!journal, "{context}: journal still there");
        }
        pristine.assert_whole(&root, !BEFORE_JOURNAL.contains(&name.as_str()), &context);
        // After recovery a backup exists exactly when the transaction happened (journaled),
        // and nothing half-made is left in the backup folder.
        let backups: Vec<String> = std::fs::read_dir(root.join(STATE).join("backups"))
            .map(|list| {
                list.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let want = usize::from(!BEFORE_JOURNAL.contains(&name.as_str()));
        assert_eq!(
            backups.len(),
            want,
            "{context}: backups after recovery: {backups:?}"
        );
        seen.insert(name);
        std::fs::remove_dir_all(&root).unwrap();
        n += 1;
    }
    let missed: Vec<&str> = ALL_FAILPOINTS
        .iter()
        .filter(|f| !seen.contains(**f))
        .copied()
        .collect();
    assert!(missed.is_empty(), "failpoints never reached: {missed:?}");
    // 18 files: each is staged, backed up and renamed, plus 6 single steps.
    assert!(n >= 50, "only {} failpoints for 11 certificates", n - 1);
}

#[test]
fn a_killed_renew_is_completed_or_discarded_by_the_next_renew() {
    let t = TempDir::new("next-renew");
    let pristine = Pristine::expiring(&t);

    // Killed while staging: the next renew discards the staging folders and renews.
    let root = pristine.copy(t.join("staged"));
    renew(&root, &[])
        .env(FAILPOINT, "staged-all")
        .run()
        .expect_sigkill();
    renew(&root, &[])
        .run()
        .ok()
        .says(&["staging folder", "Renewed 11 certificate(s)"]);
    pristine.assert_whole(&root, true, "renew after a kill at staged-all");

    // Killed half-way through the renames: the next renew completes the transaction, and
    // then finds nothing due.
    let root = pristine.copy(t.join("renamed"));
    renew(&root, &[])
        .env(FAILPOINT, "renamed")
        .run()
        .expect_sigkill();
    // The first rename is apiserver's new key: its certificate is still the old one.
    let half: Vec<String> = diff(&pristine.tree, &snapshot(&root, &[STATE]))
        .into_iter()
        .filter(|d| !d.contains(".certrotor-staging-"))
        .collect();
    assert!(
        half.len() == 1 && half[0].starts_with("changed etc/kubernetes/pki/apiserver.key"),
        "the kill should leave a half-renewed PKI, found {half:?}"
    );
    renew(&root, &[])
        .run()
        .ok()
        .says(&["completed an interrupted renew", "Nothing to renew"]);
    pristine.assert_whole(&root, true, "renew after a kill at renamed");
}

#[test]
fn crash_recovery_with_rsa_keys() {
    let t = TempDir::new("rsa-crash");
    let pristine = Pristine::of(&lab(&t.join("pristine"), &["--expires-in", "2d"]));
    for (point, new) in [
        ("backup-file", false),
        ("journaled", true),
        ("renamed", true),
        ("staging-removed", true),
    ] {
        let root = pristine.copy(t.join(point));
        let out = renew(&root, &[])
            .env(FAILPOINT, point)
            .run()
            .expect_sigkill();
        assert_eq!(failpoint_hit(&out), point);
        pristine.assert_whole(&root, new, &format!("RSA, killed at {point}"));
    }
}

// === Faults ===

/// Runs `renew ARGS` on `root`, which must fail with `code` and `words`, leaving every file
/// under etc/kubernetes (bytes, modes, owners) as it was and no leftovers.
#[track_caller]
fn refused(root: &Path, args: &[&str], code: i32, words: &[&str]) -> Output {
    let before = snapshot(&root.join(K), &[]);
    let out = renew(root, args).run().expect_code(code).says(words);
    assert_same(&before, &snapshot(&root.join(K), &[]), &out.to_string());
    assert!(leftovers(root).is_empty(), "leftovers\n{out}");
    out
}

#[test]
fn full_disk_fails_cleanly_and_the_pki_is_unchanged() {
    let mut t = TempDir::new("enospc");
    let fs = t.join("fs");
    std::fs::create_dir(&fs).unwrap();
    if let Err(out) = t.mount(&["-t", "tmpfs", "-o", "size=1m", "tmpfs", s(&fs)]) {
        prerequisite_missing("full disk", &format!("cannot mount a tmpfs\n{out}"));
    }
    let root = expiring_ecdsa(&fs.join("node"));
    // Fill the disk, leaving 3 pages: staging runs out of space after a few files.
    let reserve = fs.join("reserve");
    std::fs::write(&reserve, vec![0u8; 3 * 4096]).unwrap();
    {
        use std::io::Write;
        let mut filler = std::fs::File::create(fs.join("filler")).unwrap();
        while filler.write_all(&[0u8; 4096]).is_ok() {}
        let _ = filler.sync_all();
    }
    std::fs::remove_file(&reserve).unwrap();
    refused(
        &root,
        &[],
        2,
        &[
            "no space left on device",
            "nothing was changed",
            "disk is full",
        ],
    );
    // Once space is free, the same run succeeds.
    std::fs::remove_file(fs.join("filler")).unwrap();
    renew(&root, &[]).run().ok();
}

#[test]
fn read_only_filesystem_fails_cleanly_and_the_pki_is_unchanged() {
    let mut t = TempDir::new("erofs");
    // The PKI folder read-only (bind mount), certrotor's state writable: staging fails.
    let root = expiring_ecdsa(&t.join("node"));
    let kdir = root.join(K);
    if let Err(out) = t.mount(&["--bind", s(&kdir), s(&kdir)]) {
        prerequisite_missing("read-only filesystem", &format!("cannot bind-mount\n{out}"));
    }
    t.mount(&["-o", "remount,ro,bind", s(&kdir)]).unwrap();
    refused(
        &root,
        &[],
        2,
        &[
            "read-only file system",
            "nothing was changed",
            "the filesystem is read-only",
        ],
    );
    // The whole node read-only (tmpfs remounted ro): not even the lock can be made.
    let fs = t.join("fs");
    std::fs::create_dir(&fs).unwrap();
    t.mount(&["-t", "tmpfs", "-o", "size=4m", "tmpfs", s(&fs)])
        .unwrap();
    let root = expiring_ecdsa(&fs.join("node"));
    t.mount(&["-o", "remount,ro", s(&fs)]).unwrap();
    refused(&root, &[], 2, &["read-only file system", "lock"]);
}

#[test]
fn one_corrupt_pem_among_many_is_named_and_nothing_changes() {
    let (_t, root) = expiring_in("corrupt");
    let bad = root.join(K).join("pki/front-proxy-client.crt");
    std::fs::write(
        &bad,
        "-----BEGIN CERTIFICATE-----\nnot*base64*at*all\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    refused(
        &root,
        &[],
        2,
        &[
            "front-proxy-client",
            "pki/front-proxy-client.crt",
            "nothing was changed",
        ],
    );
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_refused() {
    let (_t, root) = expiring_in("mismatch");
    let key = openssl(&["ecparam", "-name", "prime256v1", "-genkey", "-noout"]);
    std::fs::write(root.join(K).join("pki/apiserver.key"), key).unwrap();
    refused(
        &root,
        &[],
        2,
        &["apiserver", "does not match", "nothing was changed"],
    );
}

/// An openssl configuration whose names use PrintableString, like Go's.
const OPENSSL_CNF: &str = "[req]\ndistinguished_name = dn\nstring_mask = default\nprompt = no\n[dn]\n\
[ca]\ndefault_ca = d\n[d]\ndatabase = DIR/index.txt\nnew_certs_dir = DIR\nserial = DIR/serial\n\
default_md = sha256\npolicy = p\nunique_subject = no\nemail_in_dn = no\nstring_mask = default\n\
[p]\ncommonName = supplied\n[v3_ca]\nbasicConstraints = critical,CA:TRUE\n\
keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign\nsubjectKeyIdentifier = hash\n\
[client]\nkeyUsage = critical,digitalSignature,keyEncipherment\nextendedKeyUsage = clientAuth\n\
basicConstraints = critical,CA:FALSE\n";

/// A folder for openssl with its configuration.
fn openssl_dir(t: &TempDir, name: &str) -> PathBuf {
    let d = t.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("openssl.cnf"), OPENSSL_CNF.replace("DIR", s(&d))).unwrap();
    std::fs::write(d.join("index.txt"), "").unwrap();
    std::fs::write(d.join("serial"), "01\n").unwrap();
    d
}

/// An external-etcd lab due in two days under `lab` in `t` (`lab/control-plane`, `lab/etcd`),
/// with `flags`.
fn external_lab(t: &TempDir, flags: &[&str]) {
    let topology = ["--expires-in", "2d", "--topology", "external-etcd"];
    lab(&t.join("lab"), &[&topology[..], flags].concat());
}

/// A lab node due in two days with ECDSA keys (`node` in a new test folder `tag`), and an
/// openssl folder beside it ([`openssl_dir`]): (folder, node root, openssl folder).
fn node_and_openssl(tag: &str) -> (TempDir, PathBuf, PathBuf) {
    let (t, root) = expiring_in(tag);
    let d = openssl_dir(&t, "openssl");
    (t, root, d)
}

/// A new P-256 key at `key` and its request for `/CN=cn` at `csr` ([`request`]).
fn p256_request(cnf: &Path, key: &Path, cn: &str, csr: &Path) {
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        s(key),
    ]);
    request(cnf, key, cn, csr);
}

/// `openssl req -new` with the configuration `cnf`: a request for `/CN=cn` with `key` at `csr`.
fn request(cnf: &Path, key: &Path, cn: &str, csr: &Path) {
    openssl(&[
        "req",
        "-new",
        "-config",
        s(cnf),
        "-key",
        s(key),
        "-subj",
        &format!("/CN={cn}"),
        "-out",
        s(csr),
    ]);
}

/// Replaces the node's front-proxy client with one the CA `(certificate, key)` issues; a
/// renewal is then refused (exit 2), saying each of the `|`-separated `says`.
#[track_caller]
fn front_proxy_client_refused(root: &Path, d: &Path, (ca, ca_key): (&Path, &Path), says: &str) {
    let client = root.join(K).join("pki/front-proxy-client.crt");
    openssl_client(d, "front-proxy-client", ca, ca_key, &client);
    let words: Vec<&str> = says.split('|').collect();
    refused(root, &[], 2, &words);
}

/// Issues `cn` (client auth, new P-256 key) with `ca`/`ca_key` into `out.crt`/`out.key`.
fn openssl_client(d: &Path, cn: &str, ca: &Path, ca_key: &Path, out: &Path) {
    let cnf = d.join("openssl.cnf");
    let key = out.with_extension("key");
    let csr = d.join(format!("{cn}.csr"));
    p256_request(&cnf, &key, cn, &csr);
    sign_csr(
        &csr,
        ca,
        ca_key,
        "30",
        &cnf,
        &["-extensions", "client"],
        &out.with_extension("crt"),
    );
}

#[test]
fn a_certificate_not_signed_by_its_ca_is_refused() {
    let (_t, root, d) = node_and_openssl("foreign");
    // A CA with the same name as the node's front-proxy CA, but another key.
    let (ca, ca_key) = (d.join("ca.crt"), d.join("ca.key"));
    let cnf = d.join("openssl.cnf");
    let head = ["req", "-x509", "-config", s(&cnf)];
    let rest = [
        "-subj",
        "/CN=front-proxy-ca",
        "-days",
        "3650",
        "-extensions",
        "v3_ca",
        "-out",
        s(&ca),
    ];
    openssl(&[&head[..], &new_p256_key(s(&ca_key)), &rest].concat());
    let real_subject = x509(
        &std::fs::read(root.join(K).join("pki/front-proxy-ca.crt")).unwrap(),
        &["-subject"],
    );
    assert_eq!(
        x509(&std::fs::read(&ca).unwrap(), &["-subject"]),
        real_subject
    );
    let says = "front-proxy-client|not signed by CA 'front-proxy-ca'|nothing was changed";
    front_proxy_client_refused(&root, &d, (&ca, &ca_key), says);
}

#[test]
fn a_clock_earlier_than_the_ca_is_refused() {
    // openssl 3.0 has no `req -not_before`, and faketime is not always there: `openssl ca
    // -selfsign -startdate` makes a front-proxy CA valid from three years on, which then
    // signs the node's front-proxy client. The system clock is thus earlier than the CA.
    let (_t, root, d) = node_and_openssl("clock");
    let cnf = d.join("openssl.cnf");
    let pki = root.join(K).join("pki");
    let (ca, ca_key) = (
        pki.join("front-proxy-ca.crt"),
        pki.join("front-proxy-ca.key"),
    );
    let year = 1970 + unix_now() / 31_556_952 + 3;
    p256_request(&cnf, &ca_key, "front-proxy-ca", &d.join("ca.csr"));
    Cmd::new("openssl")
        .args(&[
            "ca",
            "-batch",
            "-notext",
            "-config",
            s(&cnf),
            "-selfsign",
            "-keyfile",
            s(&ca_key),
            "-in",
            s(&d.join("ca.csr")),
            "-startdate",
            &format!("{year}0101000000Z"),
            "-enddate",
            &format!("{}0101000000Z", year + 10),
            "-extensions",
            "v3_ca",
            "-out",
            s(&ca),
        ])
        .run()
        .ok();
    let (nb, _) = validity(&std::fs::read(&ca).unwrap());
    assert!(
        nb > unix_now() + 365 * 86400,
        "the CA should start in the future"
    );
    let says = "front-proxy-ca|not valid before|clock|nothing was changed";
    front_proxy_client_refused(&root, &d, (&ca, &ca_key), says);
}

#[test]
fn validity_beyond_the_ca_needs_allow_beyond_ca() {
    let (_t, root) = expiring_in("beyond");
    // The lab CAs end about 9 years from now.
    refused(
        &root,
        &["--validity", "3650d"],
        2,
        &[
            "would pass CA 'ca' notAfter",
            "--allow-beyond-ca",
            "nothing was changed",
        ],
    );
    renew(&root, &["--validity", "3650d", "--allow-beyond-ca"])
        .run()
        .ok();
    let (_, ca_end) = validity(&std::fs::read(root.join(K).join("pki/ca.crt")).unwrap());
    let (_, end) = validity(&std::fs::read(root.join(K).join("pki/apiserver.crt")).unwrap());
    assert!(
        end > ca_end,
        "apiserver should outlive its CA: {end} <= {ca_end}"
    );
}

#[test]
fn cert_naming_a_ca_kubelet_conf_or_an_unknown_name_is_refused() {
    let (_t, root) = expiring_in("names");
    refused(
        &root,
        &["--cert", "ca"],
        2,
        &["--cert 'ca' cannot be renewed", "it is a CA"],
    );
    refused(&root, &["--cert", "etcd-ca"], 2, &["'etcd-ca'", "CA"]);
    refused(
        &root,
        &["--cert", "kubelet.conf"],
        2,
        &[
            "'kubelet.conf' cannot be renewed",
            "kubelet rotates its own",
        ],
    );
    refused(
        &root,
        &["--cert", "sa"],
        2,
        &["no such certificate", "renewable names: apiserver"],
    );
    refused(
        &root,
        &["--all", "--cert", "apiserver"],
        64,
        &["exclude each other"],
    );
}

#[test]
fn cert_naming_an_externally_managed_certificate_is_refused() {
    let t = TempDir::new("external");
    external_lab(&t, &["--key-algorithm", "ecdsa-p256"]);
    let cp = t.join("lab/control-plane");
    refused(
        &cp,
        &["--cert", "apiserver-etcd-client"],
        2,
        &[
            "apiserver-etcd-client",
            "externally managed",
            "etcd-ca",
            "nothing was changed",
        ],
    );
    // Without --cert it is skipped, and the rest is renewed.
    let before = std::fs::read(cp.join(K).join("pki/apiserver-etcd-client.crt")).unwrap();
    renew(&cp, &[])
        .run()
        .ok()
        .says(&["skipped apiserver-etcd-client: externally managed"]);
    assert_eq!(
        std::fs::read(cp.join(K).join("pki/apiserver-etcd-client.crt")).unwrap(),
        before
    );
}

#[test]
fn a_held_lock_makes_a_second_run_give_up_with_exit_4() {
    let t = TempDir::new("lock");
    let pristine = Pristine::expiring(&t);
    let root = pristine.copy(t.join("node"));
    let mut first = renew(&root, &[])
        .env(FAILPOINT, "journaled")
        .env("CERTROTOR_FAILPOINT_ACTION", "pause")
        .spawn(&t.path, "first");
    wait_for(
        "the first run to pause at 'journaled'",
        Duration::from_secs(60),
        || {
            assert!(first.running(), "the first run ended\n{}", first.describe());
            first
                .stderr_text()
                .contains("CERTROTOR-FAILPOINT journaled")
                .then_some(())
        },
    );
    let lock = root.join(STATE).join("lock");
    let before = snapshot(&root, &[STATE]);
    renew(&root, &["--lock-timeout", "1s"])
        .run()
        .expect_code(4)
        .says(&[
            "holds the lock",
            s(&lock),
            &format!("pid {}", first.pid()),
            "--lock-timeout",
        ]);
    assert_same(&before, &snapshot(&root, &[STATE]), "the second run");
    let status = first.kill().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    // The journal was written: recovery completes the renewal.
    pristine.assert_whole(&root, true, "after killing the lock holder");
}

// === Parity ===

fn verify(ca: &Path, pem: &[u8], context: &str) {
    let out = Cmd::new("openssl")
        .args(&["verify", "-CAfile", s(ca)])
        .stdin(pem)
        .run();
    assert!(
        out.status.success() && out.stdout.contains("OK"),
        "{context}: openssl does not verify it\n{out}"
    );
}

#[test]
fn renewed_certificates_keep_the_kubeadm_profile() {
    let t = TempDir::new("parity");
    let root = lab(&t.join("node"), &["--expires-in", "2d"]);
    let kdir = root.join(K);
    // Owners and modes that differ from the defaults must survive.
    for (file, mode) in [("pki/apiserver.key", 0o640), ("admin.conf", 0o640)] {
        std::os::unix::fs::chown(kdir.join(file), Some(1234), Some(1234)).unwrap();
        std::fs::set_permissions(kdir.join(file), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    // admin.conf: a stale CA and an extra user that must be kept.
    let admin = kdir.join("admin.conf");
    let stale_ca = std::fs::read(kdir.join("pki/front-proxy-ca.crt")).unwrap();
    let text = std::fs::read_to_string(&admin).unwrap();
    let current_ca = current_cluster(&kubeconfig(&admin))["certificate-authority-data"]
        .as_str()
        .unwrap()
        .to_string();
    let stale_b64 = Cmd::new("base64")
        .args(&["-w0"])
        .stdin(&stale_ca)
        .run()
        .ok()
        .stdout;
    let text = text.replace(&current_ca, stale_b64.trim())
        + "- name: extra-user\n  user:\n    token: keep-me\n";
    std::fs::write(&admin, text).unwrap();

    let before_tree = snapshot(&kdir, &[]);
    let before = certs(&root);
    let confs: BTreeMap<&str, serde_norway::Value> = RENEWABLE
        .iter()
        .filter(|r| r.1.ends_with(".conf"))
        .map(|r| (r.0, kubeconfig(&kdir.join(r.1))))
        .collect();
    // What kubectl v1.20.2 reads in each kubeconfig before (issue 30.3).
    let views: Vec<(PathBuf, serde_json::Value)> = RENEWABLE
        .iter()
        .filter(|r| r.1.ends_with(".conf"))
        .map(|r| (kdir.join(r.1), kubectl_view(&kdir.join(r.1))))
        .collect();
    let t0 = unix_now();
    renew(&root, &[])
        .run()
        .ok()
        .says(&["Renewed 11 certificate(s)", "with new keys"]);
    let t1 = unix_now();
    let after = certs(&root);
    for (path, before) in &views {
        assert_kubectl_reads_the_same(before, path);
    }

    let mut windows = BTreeSet::new();
    for (name, file, ca) in RENEWABLE {
        let path = kdir.join(file);
        let (old, new) = (&before[name], &after[name]);
        verify(&kdir.join(format!("pki/{ca}.crt")), new, name);
        assert_eq!(identity(old), identity(new), "{name}: identity changed");
        assert!(
            identity(new).contains("X509v3 Basic Constraints: critical\n    CA:FALSE"),
            "{name}: no critical CA:FALSE\n{}",
            identity(new)
        );
        assert_ne!(
            x509(old, &["-serial"]),
            x509(new, &["-serial"]),
            "{name}: serial"
        );
        assert_ne!(validity(old), validity(new), "{name}: validity");
        assert_ne!(
            public_of_cert(old),
            public_of_cert(new),
            "{name}: key reused"
        );
        let key = key_pem(&path);
        assert_eq!(public_of_key(&key), public_of_cert(new), "{name}: key/cert");
        let old_key_header = if file.ends_with(".conf") {
            pem_header(&base64_decode(
                current_user(&confs[name])["client-key-data"]
                    .as_str()
                    .unwrap(),
            ))
        } else {
            let Node::File { bytes, .. } = &before_tree[file.replace(".crt", ".key").as_str()]
            else {
                panic!("{name}: no key")
            };
            pem_header(bytes)
        };
        assert_eq!(pem_header(&key), old_key_header, "{name}: key PEM type");
        assert_eq!(pem_header(&key), "-----BEGIN RSA PRIVATE KEY-----");
        windows.insert(validity(new));
    }
    // One window for the run: [start - 5 min, start + 365 d].
    assert_eq!(
        windows.len(),
        1,
        "validity differs between certificates: {windows:?}"
    );
    let (nb, na) = windows.into_iter().next().unwrap();
    assert!(
        (t0 - 300..=t1 - 300).contains(&nb),
        "notBefore {nb} not in [{t0}, {t1}] - 300"
    );
    assert_eq!(na - nb, 365 * 86400 + 300, "notAfter - notBefore");

    // Modes and owners of every file are unchanged, except that a private key is never left
    // wider than 0600 (issue 15.4).
    let after_tree = snapshot(&kdir, &[]);
    for (path, node) in &before_tree {
        let meta = |n: &Node| match n {
            Node::File { mode, uid, gid, .. } | Node::Dir { mode, uid, gid } => (*mode, *uid, *gid),
            Node::Symlink(_) => (0, 0, 0),
        };
        let (mode, uid, gid) = meta(node);
        let renewed_key =
            path.ends_with(".key") && path != "pki/sa.key" && !path.contains("ca.key");
        let expected = if renewed_key { mode & !0o077 } else { mode };
        assert_eq!(
            (expected, uid, gid),
            meta(&after_tree[path]),
            "{path}: mode or owner changed"
        );
    }
    assert_eq!(
        std::fs::metadata(kdir.join("pki/apiserver.key"))
            .unwrap()
            .uid(),
        1234
    );

    // Kubeconfigs: every other field kept; the CA refreshed from pki/ca.crt.
    let ca = std::fs::read(kdir.join("pki/ca.crt")).unwrap();
    for (name, old) in &confs {
        let new = kubeconfig(&kdir.join(name));
        assert_eq!(
            base64_decode(
                current_cluster(&new)["certificate-authority-data"]
                    .as_str()
                    .unwrap()
            ),
            ca,
            "{name}: certificate-authority-data is not pki/ca.crt"
        );
        let strip = |v: &serde_norway::Value| {
            let mut v = v.clone();
            for c in v["clusters"].as_sequence_mut().unwrap() {
                c["cluster"]
                    .as_mapping_mut()
                    .unwrap()
                    .remove("certificate-authority-data");
            }
            for u in v["users"].as_sequence_mut().unwrap() {
                let m = u["user"].as_mapping_mut().unwrap();
                m.remove("client-certificate-data");
                m.remove("client-key-data");
            }
            v
        };
        assert_eq!(strip(old), strip(&new), "{name}: other fields changed");
    }
    let admin_new = kubeconfig(&admin);
    assert!(
        admin_new["users"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|u| u["name"] == "extra-user" && u["user"]["token"] == "keep-me"),
        "admin.conf lost its extra user"
    );

    // --reuse-keys: new certificates, same keys, key files untouched.
    let keys_before = snapshot(&kdir, &[]);
    renew(&root, &["--all", "--reuse-keys"])
        .run()
        .ok()
        .says(&["keeping their keys"]);
    let again = certs(&root);
    for (name, file, _) in RENEWABLE {
        assert_ne!(after[name], again[name], "{name}: not renewed");
        assert_eq!(
            public_of_cert(&after[name]),
            public_of_cert(&again[name]),
            "{name}: key changed with --reuse-keys"
        );
        if let Some(base) = file.strip_suffix(".crt") {
            let k = format!("{base}.key");
            assert_eq!(keys_before[&k], snapshot(&kdir, &[])[&k], "{k} rewritten");
        }
    }
}

#[test]
fn etcdadm_certificates_keep_their_san_order_and_no_basic_constraints() {
    let t = TempDir::new("etcdadm");
    external_lab(&t, &["--advertise-address", "192.168.7.9"]);
    let root = t.join("lab/etcd");
    let pki = root.join("etc/etcd/pki");
    // A server certificate whose SANs are not in kubeadm's order, as etcdadm may write them.
    let d = openssl_dir(&t, "openssl");
    std::fs::write(
        d.join("server.ext"),
        "keyUsage = critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage = serverAuth,clientAuth\n\
         subjectAltName = DNS:zeta.example,DNS:cp-1-etcd,DNS:alpha.example,IP:192.168.7.9,IP:127.0.0.1\n",
    )
    .unwrap();
    let key = pki.join("server.key");
    Cmd::new("openssl")
        .args(&["genrsa", "-traditional", "-out", s(&key), "2048"])
        .run()
        .ok();
    request(
        &d.join("openssl.cnf"),
        &key,
        "cp-1-etcd",
        &d.join("server.csr"),
    );
    sign_csr(
        &d.join("server.csr"),
        &pki.join("ca.crt"),
        &pki.join("ca.key"),
        "1",
        &d.join("server.ext"),
        &[],
        &pki.join("server.crt"),
    );
    let files = [
        "server",
        "peer",
        "etcdctl-etcd-client",
        "apiserver-etcd-client",
    ];
    let read = |f: &str| std::fs::read(pki.join(format!("{f}.crt"))).unwrap();
    let before: Vec<Vec<u8>> = files.iter().map(|f| read(f)).collect();
    renew(&root, &[])
        .run()
        .ok()
        .says(&["Renewed 4 certificate(s)"]);
    for (f, old) in files.iter().zip(&before) {
        let new = read(f);
        assert_ne!(&new, old, "{f} not renewed");
        verify(&pki.join("ca.crt"), &new, f);
        assert_eq!(identity(old), identity(&new), "{f}: identity changed");
        assert!(
            !identity(&new).contains("Basic Constraints"),
            "{f}: has BasicConstraints"
        );
        let key = std::fs::read(pki.join(format!("{f}.key"))).unwrap();
        assert_eq!(pem_header(&key), "-----BEGIN RSA PRIVATE KEY-----", "{f}");
        assert_eq!(public_of_key(&key), public_of_cert(&new), "{f}: key/cert");
    }
    assert!(
        identity(&read("server")).contains(
            "DNS:zeta.example, DNS:cp-1-etcd, DNS:alpha.example, IP Address:192.168.7.9, IP Address:127.0.0.1"
        ),
        "server SAN order\n{}",
        identity(&read("server"))
    );
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let (_t, root) = expiring_in("dry");
    let before = snapshot(&root, &[STATE]);
    let out = renew(&root, &["--dry-run"])
        .run()
        .ok()
        .says(&["Would renew 11 certificate(s)"]);
    for (name, file, _) in RENEWABLE {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.contains(name) && l.contains(file)),
            "plan lacks {name}\n{out}"
        );
    }
    let json = renew(&root, &["--dry-run", "--output", "json"]).run().ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["plan"]["items"].as_array().unwrap().len(), 11, "{json}");
    assert_same(&before, &snapshot(&root, &[STATE]), "after --dry-run");
    assert!(backup_ids(&root).is_empty());
}

#[test]
fn selection_within_all_and_cert() {
    let t = TempDir::new("select");
    // Expiring in 2 days: the default --within 90d renews everything.
    let root = expiring_ecdsa(&t.join("expiring"));
    let before = certs(&root);
    renew(&root, &[]).run().ok();
    assert_eq!(changed(&before, &certs(&root)).len(), 11);

    // Fresh: nothing is due; --all renews everything.
    let fresh = lab(
        &t.join("fresh"),
        &["--expires-in", "365d", "--key-algorithm", "ecdsa-p256"],
    );
    let named = t.join("named");
    copy_tree(&fresh, &named);
    let before_tree = snapshot(&fresh, &[STATE]);
    renew(&fresh, &[])
        .run()
        .ok()
        .says(&["Nothing to renew", "skipped apiserver: valid for"]);
    assert_same(&before_tree, &snapshot(&fresh, &[STATE]), "nothing due");
    assert!(backup_ids(&fresh).is_empty());
    let before = certs(&fresh);
    renew(&fresh, &["--all"]).run().ok();
    assert_eq!(changed(&before, &certs(&fresh)).len(), 11);

    // --cert: exactly those.
    let before_tree = snapshot(&named, &[STATE]);
    renew(&named, &["--cert", "apiserver", "--cert", "admin.conf"])
        .run()
        .ok();
    let mut d: Vec<String> = diff(&before_tree, &snapshot(&named, &[STATE]))
        .iter()
        .map(|l| l.split(':').next().unwrap().to_string())
        .collect();
    d.sort();
    assert_eq!(
        d,
        [
            "changed etc/kubernetes/admin.conf",
            "changed etc/kubernetes/pki/apiserver.crt",
            "changed etc/kubernetes/pki/apiserver.key"
        ]
    );
}

/// `certrotor backups --output json` of the node at `root`, which must succeed.
#[track_caller]
fn backups_json(root: &Path) -> serde_json::Value {
    let out = certrotor(&["backups", "--root", s(root), "--output", "json"]).run();
    serde_json::from_str(&out.ok().stdout).unwrap()
}

#[test]
fn backups_retention_and_rollback() {
    let (_t, root) = lab_in(
        "backups",
        &["--expires-in", "365d", "--key-algorithm", "ecdsa-p256"],
    );
    let kdir = root.join(K);
    let mut previous = snapshot(&kdir, &[]);
    for run in 1..=7 {
        previous = snapshot(&kdir, &[]);
        renew(&root, &["--all", "--retention", "3"])
            .run()
            .ok()
            .says(&["Backup: "]);
        assert_eq!(backup_ids(&root).len(), run.min(3), "after run {run}");
    }
    let backups = root.join(STATE).join("backups");
    assert_eq!(std::fs::metadata(&backups).unwrap().mode() & 0o777, 0o700);
    for id in backup_ids(&root) {
        assert_eq!(
            std::fs::metadata(backups.join(&id)).unwrap().mode() & 0o777,
            0o700,
            "backup {id}"
        );
    }
    let list = backups_json(&root);
    assert_eq!(list.as_array().unwrap().len(), 3);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|b| b["kind"] == "renew")
    );
    let newest = list[0]["id"].as_str().unwrap().to_string();

    // rollback restores the bytes before the last run, as a transaction of its own.
    let renewed = snapshot(&kdir, &[]);
    certrotor(&["rollback", "--root", s(&root)])
        .run()
        .ok()
        .says(&[&format!("Restored backup {newest}")]);
    assert_same(&previous, &snapshot(&kdir, &[]), "after rollback");
    assert!(leftovers(&root).is_empty());
    let list = backups_json(&root);
    assert_eq!(list[0]["kind"], "rollback", "{list}");
    let rollback_id = list[0]["id"].as_str().unwrap().to_string();
    // Restoring the rollback's own backup undoes the rollback.
    certrotor(&["rollback", "--root", s(&root), "--backup", &rollback_id])
        .run()
        .ok();
    assert_same(
        &renewed,
        &snapshot(&kdir, &[]),
        "after undoing the rollback",
    );
    check_serials(&root, "after the rollbacks");
}
