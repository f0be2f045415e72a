//! `certrotor check`: the JSON report agrees with openssl on every file, the field set, the exit
//! codes, and one test per kind of bad input (each must leave the rest of the inventory intact).

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::util::{
    Found, TestDir, certrotor, check_json, find_certificates, key_public_key, now, openssl,
    openssl_ok, openssl_verify, openssl_verify_all, public_keys, record, rfc3339, s, strings,
};

/// The fields every `certificates[]` entry has (null allowed where the value is unknown).
const FIELDS: [&str; 20] = [
    "name",
    "path",
    "kind",
    "subject",
    "issuer",
    "serial",
    "not_before",
    "not_after",
    "residual_seconds",
    "ca",
    "externally_managed",
    "dns_names",
    "ip_addresses",
    "key_usage",
    "ext_key_usage",
    "public_key",
    "key_matches",
    "chain_ok",
    "status",
    "error",
];

/// Checks the report's shape: top-level fields, and every field on every entry with its type.
pub fn assert_schema(inv: &Value, root: &Path, before: i64, after: i64) {
    assert_eq!(inv["root"], root.to_str().unwrap(), "root");
    assert!(inv["layouts"].is_array(), "layouts: {inv:#}");
    let generated = rfc3339(s(inv, "generated_at"));
    assert!(
        generated >= before && generated <= after,
        "generated_at {generated} not in [{before}, {after}]"
    );
    for r in inv["certificates"].as_array().expect("certificates[]") {
        let obj = r.as_object().unwrap();
        for f in FIELDS {
            assert!(obj.contains_key(f), "field '{f}' missing in {r:#}");
        }
        let status = s(r, "status");
        assert!(
            ["ok", "expiring", "expired", "invalid", "missing"].contains(&status),
            "{r:#}"
        );
        assert!(
            ["ca", "leaf", "kubeconfig", "other"].contains(&s(r, "kind")),
            "{r:#}"
        );
        assert!(r["externally_managed"].is_boolean(), "{r:#}");
        for list in ["dns_names", "ip_addresses", "key_usage", "ext_key_usage"] {
            strings(r, list);
        }
        assert_eq!(
            r["error"].is_null(),
            matches!(status, "ok" | "expiring"),
            "error iff something is wrong: {r:#}"
        );
        if r["serial"].is_null() {
            // Nothing was parsed: only for unreadable or missing files.
            assert!(matches!(status, "invalid" | "missing"), "{r:#}");
            continue;
        }
        let serial = s(r, "serial");
        assert!(
            !serial.is_empty()
                && serial
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
            "{r:#}"
        );
        let not_after = rfc3339(s(r, "not_after"));
        rfc3339(s(r, "not_before"));
        assert_eq!(
            r["residual_seconds"].as_i64(),
            Some(not_after - generated),
            "residual_seconds: {r:#}"
        );
        assert!(
            ["RSA-2048", "ECDSA-P256"].contains(&s(r, "public_key")),
            "{r:#}"
        );
        if r["kind"] == "ca" {
            assert!(r["chain_ok"].is_null(), "chain_ok is null for CAs: {r:#}");
        }
    }
}

/// `check --output json` with the schema checked.
pub fn inventory(root: &Path, extra: &[&str], code: i32) -> Value {
    let before = now();
    let inv = check_json(root, extra, code);
    assert_schema(&inv, root, before, now());
    inv
}

/// `certrotor check --root <root>` (the table) exits `code` and its stdout holds `text`.
fn table_has(root: &Path, code: i32, text: &str) {
    let run = certrotor(&["check", "--root", root.to_str().unwrap()]);
    run.expect(code);
    assert!(run.stdout.contains(text), "{run}");
}

/// A lab node with ECDSA keys whose leaves expire in `expires_in`.
fn ecdsa_lab(dir: &TestDir, expires_in: &str) -> PathBuf {
    dir.lab(
        "node",
        &["--expires-in", expires_in, "--key-algorithm", "ecdsa-p256"],
    )
}

/// Every certificate openssl finds under `root` (`*.crt`, and the client certificate of every
/// kubeconfig) has exactly one record, and the record says what openssl reads.
pub fn assert_agrees_with_openssl(root: &Path, inv: &Value, found: &[Found]) {
    let records = inv["certificates"].as_array().unwrap();
    let mut on_disk: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
    let mut reported: Vec<&str> = records.iter().map(|r| s(r, "path")).collect();
    on_disk.sort();
    reported.sort();
    assert_eq!(
        reported, on_disk,
        "check must report every certificate file once"
    );
    let generated = rfc3339(s(inv, "generated_at"));
    // openssl verify, one run per CA record, on the files of the records naming it.
    let mut verified = std::collections::BTreeMap::new();
    for ca in records.iter().filter(|r| r["kind"] == "ca") {
        let signed: Vec<&Value> = records.iter().filter(|r| r["ca"] == ca["name"]).collect();
        let files: Vec<&Path> = signed
            .iter()
            .map(|r| {
                found
                    .iter()
                    .find(|f| f.path == s(r, "path"))
                    .unwrap()
                    .cert_file
                    .as_path()
            })
            .collect();
        let results = openssl_verify_all(&root.join(s(ca, "path")), &files, false);
        for (r, res) in signed.iter().zip(results) {
            verified.insert(s(r, "name").to_string(), res.is_ok());
        }
    }
    for r in records {
        let f = found.iter().find(|f| f.path == s(r, "path")).unwrap();
        let o = &f.ossl;
        let ctx = format!(
            "record {r:#}\nopenssl reads {}:\n{}",
            f.cert_file.display(),
            o.text
        );
        assert_eq!(s(r, "serial"), o.serial, "serial: {ctx}");
        assert_eq!(
            rfc3339(s(r, "not_before")),
            o.not_before,
            "not_before: {ctx}"
        );
        assert_eq!(rfc3339(s(r, "not_after")), o.not_after, "not_after: {ctx}");
        assert_eq!(
            r["residual_seconds"].as_i64(),
            Some(o.not_after - generated),
            "{ctx}"
        );
        assert_eq!(s(r, "subject"), o.subject, "subject: {ctx}");
        assert_eq!(s(r, "issuer"), o.issuer, "issuer: {ctx}");
        assert_eq!(strings(r, "dns_names"), o.dns, "dns_names: {ctx}");
        let ips: Vec<IpAddr> = strings(r, "ip_addresses")
            .iter()
            .map(|i| i.parse().unwrap())
            .collect();
        assert_eq!(ips, o.ips, "ip_addresses: {ctx}");
        assert_eq!(strings(r, "key_usage"), o.key_usage, "key_usage: {ctx}");
        assert_eq!(
            strings(r, "ext_key_usage"),
            o.ext_key_usage,
            "ext_key_usage: {ctx}"
        );
        assert_eq!(s(r, "public_key"), o.public_key, "public_key: {ctx}");
        match &f.key_pubkey {
            Some(k) => assert_eq!(
                r["key_matches"],
                Value::Bool(*k == o.pubkey_pem),
                "key_matches: {ctx}"
            ),
            None => assert!(
                r["key_matches"].is_null(),
                "no key on disk, key_matches must be null: {ctx}"
            ),
        }
        if r["kind"] == "ca" {
            assert!(r["chain_ok"].is_null(), "{ctx}");
            assert_eq!(o.issuer, o.subject, "{ctx}");
            assert_eq!(
                r["externally_managed"],
                Value::Bool(f.key_file.is_none()),
                "{ctx}"
            );
        } else if r["ca"].is_null() {
            // Self-signed (the kubelet's serving certificate): no chain to check.
            assert!(r["chain_ok"].is_null(), "{ctx}");
            assert_eq!(o.issuer, o.subject, "{ctx}");
        } else {
            let ca = record(inv, s(r, "ca"));
            assert_eq!(
                r["chain_ok"],
                Value::Bool(verified[s(r, "name")]),
                "chain_ok vs openssl verify -CAfile {}: {ctx}",
                s(ca, "path")
            );
            assert_eq!(r["externally_managed"], ca["externally_managed"], "{ctx}");
        }
        if r["kind"] == "kubeconfig" && s(r, "name").starts_with("kubelet.conf") {
            assert_eq!(
                r["cert_path"], "var/lib/kubelet/pki/kubelet-client-current.pem",
                "{ctx}"
            );
        }
    }
    // The service-account pair (keys[]): openssl's public key of sa.key is sa.pub.
    for k in inv["keys"].as_array().unwrap() {
        let derived = key_public_key(&root.join(s(k, "path")));
        let stored = std::fs::read_to_string(root.join(s(k, "public_path"))).unwrap();
        assert_eq!(k["key_matches"], Value::Bool(derived == stored), "{k:#}");
    }
}

// === agreement and exit codes ===

#[test]
fn json_agrees_with_openssl_on_every_file_and_exit_0_when_fine() {
    let dir = TestDir::new("agree");
    let root = dir.lab("node", &["--expires-in", "365d"]);
    let inv = inventory(&root, &["--warn-within", "30d"], 0);
    assert_eq!(
        inv["certificates"].as_array().unwrap().len(),
        17,
        "3 CAs, 7 leaves, 5 kubeconfigs, the kubelet's client and serving certificates"
    );
    assert_agrees_with_openssl(&root, &inv, &find_certificates(&root, &dir.join("scratch")));
    for r in inv["certificates"].as_array().unwrap() {
        assert_eq!(s(r, "status"), "ok", "{r:#}");
        assert_eq!(r["key_matches"], true, "{r:#}");
        assert_eq!(r["externally_managed"], false, "{r:#}");
    }
    let run = certrotor(&crate::util::check_args(&root, &["--warn-within", "30d"]));
    run.expect(0);
    assert!(
        run.stdout.contains("CERTIFICATE AUTHORITY") && !run.stdout.contains("PROBLEMS"),
        "{run}"
    );
}

#[test]
fn exit_1_when_something_expires_within_warn_within() {
    let dir = TestDir::new("expiring");
    let root = ecdsa_lab(&dir, "2d");
    let inv = inventory(&root, &[], 1);
    for r in inv["certificates"].as_array().unwrap() {
        let want = if r["kind"] == "ca" { "ok" } else { "expiring" };
        assert_eq!(s(r, "status"), want, "{r:#}");
    }
    inventory(&root, &["--warn-within", "1d"], 0);
    inventory(&root, &["--warn-within", "3d"], 1);
    table_has(&root, 1, "expiring");
}

#[test]
fn exit_2_when_something_expired() {
    let dir = TestDir::new("expired");
    let root = ecdsa_lab(&dir, "-1d");
    let inv = inventory(&root, &[], 2);
    assert_eq!(s(record(&inv, "apiserver"), "status"), "expired");
    assert_eq!(s(record(&inv, "ca"), "status"), "ok");
    table_has(&root, 2, "apiserver: expired on");
}

#[test]
fn usage_errors_exit_64() {
    let dir = TestDir::new("usage");
    let root = dir.path().to_str().unwrap();
    for (args, words) in [
        (vec!["check", "--bogus"], "Unrecognized argument: --bogus"),
        (
            vec!["check", "--root", root, "--warn-within", "30x"],
            "'--warn-within' with value '30x': invalid duration '30x'",
        ),
        (
            vec!["check", "--root", root, "--warn-within", ""],
            "'--warn-within' with value '': invalid duration",
        ),
        (
            vec!["check", "--root", root, "--output", "yaml"],
            "'--output' with value 'yaml': use table, json or prometheus",
        ),
        (vec!["no-such-command"], "no-such-command"),
    ] {
        let run = certrotor(&args);
        run.expect(64);
        assert!(
            run.stderr.contains(words),
            "want '{words}' in stderr\n{run}"
        );
        assert!(run.stdout.is_empty(), "{run}");
    }
}

#[test]
fn empty_root_exits_2_with_a_message() {
    let dir = TestDir::new("empty-root");
    let run = certrotor(&["check", "--root", dir.path().to_str().unwrap()]);
    run.expect(2);
    assert!(
        run.stdout.contains("No kubeadm or etcdadm PKI found under"),
        "{run}"
    );
    assert!(run.stdout.contains("--root"), "tells what to do\n{run}");
    let inv = inventory(dir.path(), &[], 2);
    assert_eq!(inv["layouts"], serde_json::json!([]));
    assert_eq!(inv["certificates"], serde_json::json!([]));
}

#[test]
fn absent_root_exits_2_with_a_message() {
    let dir = TestDir::new("absent-root");
    let absent = dir.join("no-such-node");
    let run = certrotor(&["check", "--root", absent.to_str().unwrap()]);
    run.expect(2);
    assert!(
        run.stderr.contains(absent.to_str().unwrap()) && run.stderr.contains("not a folder"),
        "{run}"
    );
}

// === bad input: one test per case ===

/// A fine ECDSA lab node (fast to make) in a fresh folder.
fn lab(name: &str) -> (TestDir, PathBuf) {
    let dir = TestDir::new(name);
    let root = dir.lab("node", &["--key-algorithm", "ecdsa-p256"]);
    (dir, root)
}

const PKI: &str = "etc/kubernetes/pki";

/// Runs check on a damaged node: exit 2, `name` has `status`, and every other record, and the
/// service-account pair, is still reported with its normal status (ok). Returns `name`'s record.
fn damaged(root: &Path, name: &str, status: &str) -> Value {
    damaged_also(root, name, status, &[])
}

/// [`damaged`], where other records read the same damaged file (`also`: name and status).
fn damaged_also(root: &Path, name: &str, status: &str, also: &[(&str, &str)]) -> Value {
    let inv = inventory(root, &[], 2);
    let records = inv["certificates"].as_array().unwrap();
    assert_eq!(records.len(), 17, "every entry is still reported");
    for r in records {
        if r["name"] == name {
            assert_eq!(s(r, "status"), status, "{r:#}");
        } else if let Some((_, st)) = also.iter().find(|(n, _)| r["name"] == *n) {
            assert_eq!(s(r, "status"), *st, "{r:#}");
        } else {
            assert_eq!(
                s(r, "status"),
                "ok",
                "damage to '{name}' leaked into another record: {r:#}"
            );
        }
    }
    assert_eq!(inv["keys"][0]["status"], "ok", "{inv:#}");
    // The table reports it too, under PROBLEMS.
    let run = certrotor(&["check", "--root", root.to_str().unwrap()]);
    run.expect(2);
    assert!(
        run.stdout.contains(&format!("PROBLEMS\n  {name}: ")),
        "{run}"
    );
    record(&inv, name).clone()
}

fn assert_error_has(r: &Value, words: &[&str]) {
    let error = s(r, "error");
    for w in words {
        assert!(error.contains(w), "want '{w}' in error '{error}'");
    }
}

fn pem_body_lines(pem: &str) -> Vec<String> {
    pem.lines().map(str::to_string).collect()
}

#[test]
fn truncated_pem_is_invalid() {
    let (_dir, root) = lab("bad-truncated");
    let path = root.join(format!("{PKI}/apiserver.crt"));
    let pem = std::fs::read(&path).unwrap();
    std::fs::write(&path, &pem[..pem.len() / 2]).unwrap();
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &[
            "etc/kubernetes/pki/apiserver.crt",
            "damaged PEM data",
            "truncated",
        ],
    );
    assert!(r["serial"].is_null());
}

#[test]
fn pem_with_bad_base64_is_invalid() {
    let (_dir, root) = lab("bad-base64");
    let path = root.join(format!("{PKI}/apiserver.crt"));
    let mut lines = pem_body_lines(&std::fs::read_to_string(&path).unwrap());
    lines[3] = "!!!! this is not base64 @@@@".into();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &["etc/kubernetes/pki/apiserver.crt", "not valid base64"],
    );
}

#[test]
fn der_garbage_in_valid_pem_armor_is_invalid() {
    let (_dir, root) = lab("bad-der");
    let path = root.join(format!("{PKI}/apiserver.crt"));
    // "This is not DER at all, just text" in base64.
    let pem = "-----BEGIN CERTIFICATE-----\nVGhpcyBpcyBub3QgREVSIGF0IGFsbCwganVzdCB0ZXh0\n-----END CERTIFICATE-----\n";
    std::fs::write(&path, pem).unwrap();
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &[
            "etc/kubernetes/pki/apiserver.crt",
            "does not decode as X.509 DER",
        ],
    );
}

#[test]
fn key_that_does_not_match_its_certificate_is_invalid() {
    let (_dir, root) = lab("bad-key");
    std::fs::copy(
        root.join(format!("{PKI}/front-proxy-client.key")),
        root.join(format!("{PKI}/apiserver.key")),
    )
    .unwrap();
    let (a, b) = public_keys(
        &root.join(format!("{PKI}/apiserver.crt")),
        &root.join(format!("{PKI}/apiserver.key")),
    );
    assert_ne!(a, b, "openssl agrees that the pair is broken");
    let r = damaged(&root, "apiserver", "invalid");
    assert_eq!(r["key_matches"], false);
    assert_eq!(r["chain_ok"], true, "the certificate itself is fine");
    assert_error_has(
        &r,
        &[
            "private key 'etc/kubernetes/pki/apiserver.key' does not match",
            "apiserver.crt",
        ],
    );
}

/// Replaces apiserver.crt/.key with a pair from another CA named like the cluster's
/// ("CN=kubernetes"), made by openssl; `string_mask` picks the name's string type
/// (`default`: PrintableString as Go writes it, so the issuer bytes are identical;
/// `utf8only`: openssl's usual UTF8String). Returns the damaged record.
fn foreign_ca(name: &str, string_mask: &str) -> Value {
    let (dir, root) = lab(name);
    let other = dir.join("other");
    std::fs::create_dir(&other).unwrap();
    let p = |f: &str| other.join(f).to_str().unwrap().to_string();
    let cnf = p("req.cnf");
    std::fs::write(
        &cnf,
        format!("[req]\ndistinguished_name = dn\nstring_mask = {string_mask}\n[dn]\n"),
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-config",
        &cnf,
    ];
    let (ca_key, ca_crt) = (p("ca.key"), p("ca.crt"));
    let mut args = vec!["req", "-x509"];
    args.extend(ec);
    args.extend([
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
        "-subj",
        "/CN=kubernetes",
        "-days",
        "3650",
    ]);
    args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
    args.extend([
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
    ]);
    openssl_ok(&args);
    let (leaf_key, leaf_csr, leaf_crt, ext) =
        (p("leaf.key"), p("leaf.csr"), p("leaf.crt"), p("ext.cnf"));
    let mut args = vec!["req"];
    args.extend(ec);
    args.extend([
        "-keyout",
        &leaf_key,
        "-out",
        &leaf_csr,
        "-subj",
        "/CN=kube-apiserver",
    ]);
    openssl_ok(&args);
    std::fs::File::create(&ext)
        .unwrap()
        .write_all(
            b"keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n\
              basicConstraints=critical,CA:FALSE\nsubjectAltName=DNS:cp-1,IP:10.0.0.10\n",
        )
        .unwrap();
    openssl_ok(&[
        "x509",
        "-req",
        "-in",
        &leaf_csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-set_serial",
        "0x1234abcd",
        "-days",
        "365",
        "-extfile",
        &ext,
        "-out",
        &leaf_crt,
    ]);
    std::fs::copy(&leaf_crt, root.join(format!("{PKI}/apiserver.crt"))).unwrap();
    std::fs::copy(&leaf_key, root.join(format!("{PKI}/apiserver.key"))).unwrap();
    // The oracle: the leaf is fine with its own CA, and refused by the cluster's.
    openssl_verify(Path::new(&ca_crt), Path::new(&leaf_crt), true).unwrap();
    let cluster_ca = root.join(format!("{PKI}/ca.crt"));
    assert!(
        openssl_verify(
            &cluster_ca,
            &root.join(format!("{PKI}/apiserver.crt")),
            true
        )
        .is_err()
    );

    let r = damaged(&root, "apiserver", "invalid");
    assert_eq!(r["chain_ok"], false);
    assert_eq!(r["key_matches"], true);
    assert_eq!(s(&r, "issuer"), "CN=kubernetes");
    assert_eq!(s(&r, "serial"), "1234abcd");
    assert_error_has(&r, &["not signed by CA 'ca'"]);
    r
}

#[test]
fn certificate_from_a_same_name_ca_with_another_key_is_invalid() {
    let r = foreign_ca("bad-ca", "default");
    assert_error_has(
        &r,
        &["the signature does not verify with the CA's public key"],
    );
}

#[test]
fn certificate_from_a_same_name_ca_in_utf8_is_invalid() {
    foreign_ca("bad-ca-utf8", "utf8only");
}

#[test]
fn symlink_out_of_the_root_is_invalid() {
    let (dir, root) = lab("bad-symlink");
    // A perfectly good certificate, but outside the node root.
    let outside = dir.join("outside");
    std::fs::create_dir(&outside).unwrap();
    let cert = root.join(format!("{PKI}/apiserver.crt"));
    std::fs::rename(&cert, outside.join("apiserver.crt")).unwrap();
    std::os::unix::fs::symlink(outside.join("apiserver.crt"), &cert).unwrap();
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &[
            "'etc/kubernetes/pki/apiserver.crt' is a symlink to",
            "outside the node root",
        ],
    );
    assert!(
        r["serial"].is_null(),
        "nothing read through the link: {r:#}"
    );
}

#[test]
fn directory_named_like_the_certificate_is_invalid() {
    let (_dir, root) = lab("bad-dir");
    let cert = root.join(format!("{PKI}/apiserver.crt"));
    std::fs::remove_file(&cert).unwrap();
    std::fs::create_dir(&cert).unwrap();
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &["'etc/kubernetes/pki/apiserver.crt' is a directory, not a regular file"],
    );
}

#[test]
fn fifo_named_like_the_key_is_invalid_and_does_not_hang() {
    let (_dir, root) = lab("bad-fifo");
    let key = root.join(format!("{PKI}/front-proxy-client.key"));
    std::fs::remove_file(&key).unwrap();
    let out = std::process::Command::new("mkfifo")
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfifo: {out:?}");
    // A reader that opened the FIFO would block forever: `certrotor` runs under a deadline.
    let r = damaged(&root, "front-proxy-client", "invalid");
    assert_error_has(
        &r,
        &["'etc/kubernetes/pki/front-proxy-client.key' is a special file, not a regular file"],
    );
    assert!(r["key_matches"].is_null());
}

#[test]
fn multi_gigabyte_file_is_invalid_and_not_read() {
    let (_dir, root) = lab("bad-huge");
    let cert = root.join(format!("{PKI}/apiserver.crt"));
    let size: u64 = 8 * 1024 * 1024 * 1024;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&cert)
        .unwrap();
    f.set_len(size).unwrap(); // sparse: no disk used
    drop(f);
    let r = damaged(&root, "apiserver", "invalid");
    assert_error_has(
        &r,
        &[
            "'etc/kubernetes/pki/apiserver.crt' is 8589934592 bytes",
            "it was not read",
        ],
    );
    assert_eq!(std::fs::metadata(&cert).unwrap().len(), size);
}

#[test]
fn missing_required_certificate_is_missing() {
    let (_dir, root) = lab("missing");
    std::fs::remove_file(root.join(format!("{PKI}/apiserver.crt"))).unwrap();
    std::fs::remove_file(root.join(format!("{PKI}/apiserver.key"))).unwrap();
    let r = damaged(&root, "apiserver", "missing");
    assert_error_has(&r, &["'etc/kubernetes/pki/apiserver.crt' does not exist"]);
    let run = certrotor(&["check", "--root", root.to_str().unwrap()]);
    assert!(run.stdout.contains("!MISSING! apiserver"), "{run}");
}

#[test]
fn kubeconfig_with_bad_embedded_base64_is_invalid() {
    let (_dir, root) = lab("bad-kubeconfig");
    let path = root.join("etc/kubernetes/admin.conf");
    let text = std::fs::read_to_string(&path).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("client-certificate-data:") {
                "    client-certificate-data: not*base64"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&path, text + "\n").unwrap();
    let r = damaged(&root, "admin.conf", "invalid");
    assert_error_has(
        &r,
        &[
            "etc/kubernetes/admin.conf",
            "client-certificate-data",
            "not valid base64",
        ],
    );
}

#[test]
fn kubelet_conf_pointing_to_a_missing_pem_is_invalid() {
    let (_dir, root) = lab("bad-kubelet");
    let link = root.join("var/lib/kubelet/pki/kubelet-client-current.pem");
    let target = std::fs::read_link(&link).unwrap();
    std::fs::remove_file(root.join(target.to_str().unwrap().trim_start_matches('/'))).unwrap();
    // The kubelet-client record reads the same link: its file is gone too.
    let r = damaged_also(
        &root,
        "kubelet.conf",
        "invalid",
        &[("kubelet-client", "missing")],
    );
    assert_error_has(
        &r,
        &[
            "/var/lib/kubelet/pki/kubelet-client-current.pem",
            "does not exist",
        ],
    );
    // openssl cannot read it either.
    assert!(
        !openssl(&["x509", "-in", link.to_str().unwrap(), "-noout"], None)
            .status
            .success()
    );
}

#[test]
fn absent_super_admin_conf_is_listed_but_not_a_problem() {
    // Only the first control plane has super-admin.conf (pki-profiles §2, §6).
    let (_dir, root) = lab("no-super-admin");
    std::fs::remove_file(root.join("etc/kubernetes/super-admin.conf")).unwrap();
    let inv = inventory(&root, &[], 0);
    let r = record(&inv, "super-admin.conf");
    assert_eq!(s(r, "status"), "missing", "{r:#}");
    for r in inv["certificates"].as_array().unwrap() {
        if r["name"] != "super-admin.conf" {
            assert_eq!(s(r, "status"), "ok", "{r:#}");
        }
    }
    table_has(&root, 0, "!MISSING! super-admin.conf");
}
