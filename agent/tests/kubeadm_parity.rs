//! Parity with the REAL kubeadm v1.20.2 (built by `images/k8s/build.sh`; `CERTROTOR_K8S_BIN`):
//! node roots made by `kubeadm init phase certs all` / `init phase kubeconfig all` with a config
//! file (extra certSANs, a controlPlaneEndpoint), then
//! - `certrotor check --output json` agrees with `kubeadm certs check-expiration` on every row;
//! - `certrotor renew --all` on one copy issues what `kubeadm certs renew all` issues on another,
//!   read by openssl (subject, SANs, KU/EKU, issuer, key algorithm and encoding, validity);
//! - kubeadm reads certrotor's result (`check-expiration`, and `renew all` on top of it);
//! - `certrotor lab init` writes what `kubeadm init` writes for the same node.
//!
//! Known differences between kubeadm v1.20 and certrotor, asserted as such (each changed with a
//! later kubeadm, which certrotor follows; reference/pki-profiles.md §1.4):
//! - kubeadm v1.20 leaves have notBefore = the CA's notBefore; certrotor: issue time - 5 min
//!   (kubeadm >= 1.31). notAfter is issue time + 365 d in both.
//! - kubeadm v1.20 leaves carry no BasicConstraints; certrotor writes critical CA:FALSE.
//! - kubeadm v1.20 prints an empty CERTIFICATE AUTHORITY for kubeconfig rows; certrotor prints
//!   `ca` (kubeadm >= 1.24, kubernetes/kubernetes#106891).
//! - `lab init` writes kubeadm >= 1.29 subjects (admin.conf and apiserver-kubelet-client in
//!   kubeadm:cluster-admins, etcd clients without O, a super-admin.conf); v1.20 has
//!   O=system:masters for all four.
//! - `lab init` CAs carry their CN as a DNS SAN (newer client-go); v1.20 CAs have no SAN.
//! - certrotor also lists kubelet.conf and super-admin.conf (kubeadm >= 1.29); kubeadm v1.20 does not.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::kubeadm_parity_util::{
    CONFIG, Row, check_expiration, config, kubeadm, kubeadm_node, require_root,
    short_human_duration,
};
use crate::renew_util::KUBEADM_LEAVES;
use crate::util::{
    Ossl, TestDir, YEAR, base64_decode, certrotor, now, openssl_verify, record, rfc3339, s,
};

/// kubeadm v1.20's renewable certificates, in its order: (name, file under etc/kubernetes, CA
/// file under pki); super-admin.conf came with v1.29.
fn v1_20_leaves() -> Vec<(&'static str, &'static str, &'static str)> {
    KUBEADM_LEAVES
        .into_iter()
        .filter(|l| l.0 != "super-admin.conf")
        .collect()
}

const CAS: [(&str, &str); 3] = [
    ("ca", "pki/ca.crt"),
    ("etcd-ca", "pki/etcd/ca.crt"),
    ("front-proxy-ca", "pki/front-proxy-ca.crt"),
];

fn etc(root: &Path) -> std::path::PathBuf {
    root.join("etc/kubernetes")
}

/// The certificate of a `v1_20_leaves()` entry as a PEM file openssl can read (a kubeconfig's
/// embedded one written out next to the test folder).
fn leaf_file(root: &Path, rel: &str, scratch: &Path) -> std::path::PathBuf {
    let path = etc(root).join(rel);
    if !rel.ends_with(".conf") {
        return path;
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let b64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-certificate-data:"))
        .unwrap_or_else(|| panic!("{}: no embedded client certificate", path.display()));
    std::fs::create_dir_all(scratch).unwrap();
    let file = scratch.join(format!(
        "{}-{}.pem",
        root.file_name().unwrap().to_str().unwrap(),
        rel
    ));
    std::fs::write(&file, base64_decode(b64.trim())).unwrap();
    file
}

/// What must be equal between kubeadm's and certrotor's certificate of one name.
fn identity(o: &Ossl) -> String {
    let mut dns = o.dns.clone();
    dns.sort();
    let mut ips: Vec<String> = o.ips.iter().map(|i| i.to_string()).collect();
    ips.sort();
    format!(
        "subject={} issuer={} dns={dns:?} ips={ips:?} ku={:?} ku_critical={:?} eku={:?} key={} sig={}",
        o.subject,
        o.issuer,
        o.key_usage,
        o.ext.get("Key Usage").map(|e| e.critical),
        o.ext_key_usage,
        o.public_key,
        o.signature_algorithm,
    )
}

/// The first line of a key file (its PEM encoding: PKCS#1, SEC1 or PKCS#8).
/// Each of `certs` (who made it, the certificate) expires 365 days after a moment between
/// `earliest` and `end` (+ 2 s); the failure names `name`, `since` (what the moment is), `start`.
fn assert_a_year_from(
    name: &str,
    certs: [(&str, &Ossl); 2],
    since: &str,
    (earliest, end): (i64, i64),
    start: i64,
) {
    for (who, o) in certs {
        assert!(
            o.not_after >= earliest + YEAR && o.not_after <= end + YEAR + 2,
            "{name}: {who} notAfter {} is not {since} + 365 d ({start}..{end})",
            o.not_after
        );
    }
}

fn key_encoding(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn certrotor_check(root: &Path) -> Value {
    let run = certrotor(&crate::util::check_args(root, &["--output", "json"]));
    assert!(
        matches!(run.code, Some(0) | Some(1)),
        "certrotor check must succeed on a kubeadm node\n{run}"
    );
    run.json()
}

/// Every row kubeadm prints agrees with certrotor's JSON record of that name.
fn assert_check_agrees(root: &Path, what: &str) -> (Vec<Row>, Vec<Row>) {
    let (leaves, cas) = check_expiration(root);
    let inv = certrotor_check(root);
    let names: Vec<&str> = leaves.iter().map(|r| r.name.as_str()).collect();
    let want: Vec<&str> = v1_20_leaves().iter().map(|l| l.0).collect();
    assert_eq!(names, want, "{what}: kubeadm's rows");
    let ca_names: Vec<&str> = cas.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(ca_names, ["ca", "etcd-ca", "front-proxy-ca"], "{what}");
    for row in leaves.iter().chain(&cas) {
        let r = record(&inv, &row.name);
        let ctx = format!("{what}: {}: kubeadm {row:?}\ncertrotor {r:#}", row.name);
        assert_eq!(
            rfc3339(s(r, "not_after")) / 60 * 60,
            row.expires,
            "expiry, {ctx}"
        );
        // certrotor counts whole seconds, kubeadm nanoseconds: in the second a certificate was
        // made, 365 d of certrotor's is 364 d 23:59:59.x of kubeadm's.
        let residual = r["residual_seconds"].as_i64().unwrap();
        assert!(
            short_human_duration(residual) == row.residual
                || short_human_duration(residual - 1) == row.residual,
            "residual time {residual} s, {ctx}"
        );
        match &row.ca {
            None => assert_eq!(s(r, "kind"), "ca", "{ctx}"),
            // kubeadm v1.20 prints no CA for kubeconfigs (#106891 added it); certrotor does.
            Some(ca) if ca.is_empty() => {
                assert!(row.name.ends_with(".conf"), "empty CA column, {ctx}");
                assert_eq!(s(r, "ca"), "ca", "{ctx}");
            }
            Some(ca) => assert_eq!(s(r, "ca"), ca, "CA, {ctx}"),
        }
        assert_eq!(
            r["externally_managed"].as_bool(),
            Some(row.external),
            "externally managed, {ctx}"
        );
    }
    (leaves, cas)
}

fn copy(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(ok.success());
}

#[test]
fn check_agrees_with_kubeadm_check_expiration() {
    require_root("check_agrees_with_kubeadm_check_expiration");
    let t = TestDir::new("parity-check");
    let node = t.join("node");
    kubeadm_node(&node, true);
    let (leaves, _) = assert_check_agrees(&node, "kubeadm init");
    assert!(leaves.iter().all(|r| !r.external && r.residual == "364d"));

    // An external front-proxy CA (its key removed): both say "externally managed".
    let ext = t.join("external");
    copy(&node, &ext);
    std::fs::remove_file(etc(&ext).join("pki/front-proxy-ca.key")).unwrap();
    let (leaves, cas) = assert_check_agrees(&ext, "external front-proxy CA");
    let externals: Vec<&str> = leaves
        .iter()
        .chain(&cas)
        .filter(|r| r.external)
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(externals, ["front-proxy-client", "front-proxy-ca"]);
}

/// Renews copies of `orig` with `kubeadm certs renew all` and `certrotor renew --all` and
/// compares them with openssl, then lets kubeadm read certrotor's result.
fn assert_renew_parity(t: &TestDir, orig: &Path, what: &str) {
    let by_kubeadm = t.join(&format!("{what}-by-kubeadm"));
    let by_certrotor = t.join(&format!("{what}-by-certrotor"));
    copy(orig, &by_kubeadm);
    copy(orig, &by_certrotor);
    let start = now();
    kubeadm(
        &by_kubeadm,
        &["certs", "renew", "all", "--config", &format!("/{CONFIG}")],
    );
    certrotor(&["renew", "--root", by_certrotor.to_str().unwrap(), "--all"]).expect(0);
    let end = now();
    let (by_kubeadm, by_certrotor) = (by_kubeadm.as_path(), by_certrotor.as_path());
    let scratch = t.join("pem");
    let mut summary = BTreeMap::new();
    for (name, rel, ca) in v1_20_leaves() {
        let ca_file = etc(orig).join(format!("pki/{ca}.crt"));
        let ca_cert = Ossl::read(&ca_file);
        let old = Ossl::read(&leaf_file(orig, rel, &scratch));
        let k_file = leaf_file(by_kubeadm, rel, &scratch);
        let c_file = leaf_file(by_certrotor, rel, &scratch);
        let (k, c) = (Ossl::read(&k_file), Ossl::read(&c_file));
        openssl_verify(&ca_file, &k_file, true).unwrap();
        openssl_verify(&ca_file, &c_file, true).unwrap();
        assert_eq!(
            identity(&k),
            identity(&old),
            "{name}: kubeadm keeps the identity"
        );
        assert_eq!(
            identity(&c),
            identity(&k),
            "{name}: certrotor renew --all vs kubeadm certs renew all"
        );
        assert!(
            k.pubkey_pem != old.pubkey_pem && c.pubkey_pem != old.pubkey_pem,
            "{name}: both make a new key"
        );
        // Validity: one year from the renewal in both.
        assert_a_year_from(
            name,
            [("kubeadm", &k), ("certrotor", &c)],
            "renewal time",
            (start - 2, end),
            start,
        );
        // notBefore: kubeadm v1.20 copies the CA's; certrotor backdates 5 min (kubeadm >= 1.31).
        assert_eq!(
            k.not_before, ca_cert.not_before,
            "{name}: kubeadm v1.20 notBefore"
        );
        assert!(
            c.not_before >= start - 300 - 2 && c.not_before <= end - 300 + 2,
            "{name}: certrotor notBefore {} is not renewal time - 5 min",
            c.not_before
        );
        // BasicConstraints: none from kubeadm v1.20, critical CA:FALSE from certrotor.
        assert!(
            !k.ext.contains_key("Basic Constraints"),
            "{name}: {}",
            k.text
        );
        let bc = c
            .ext
            .get("Basic Constraints")
            .expect("certrotor writes CA:FALSE");
        assert!(bc.critical && bc.value == "CA:FALSE", "{name}: {bc:?}");
        if !rel.ends_with(".conf") {
            let key = rel.replace(".crt", ".key");
            assert_eq!(
                key_encoding(&etc(by_certrotor).join(&key)),
                key_encoding(&etc(by_kubeadm).join(&key)),
                "{name}: key PEM encoding"
            );
            let (cc, ck) = crate::util::public_keys(&c_file, &etc(by_certrotor).join(&key));
            assert_eq!(cc, ck, "{name}: certrotor's key matches its certificate");
        }
        summary.insert(name, identity(&c));
    }
    eprintln!(
        "parity renew ({what}): {} certificates agree: {summary:#?}",
        summary.len()
    );

    // kubeadm reads certrotor's result, agrees with certrotor's check, and can renew on top.
    let (leaves, _) = assert_check_agrees(by_certrotor, &format!("{what}: certrotor renew --all"));
    assert!(leaves.iter().all(|r| r.residual == "364d"), "{leaves:?}");
    assert_check_agrees(by_kubeadm, &format!("{what}: kubeadm certs renew all"));
    kubeadm(
        by_certrotor,
        &["certs", "renew", "all", "--config", &format!("/{CONFIG}")],
    );
    certrotor(&["check", "--root", by_certrotor.to_str().unwrap()]).expect(0);
}

#[test]
fn renew_all_issues_what_kubeadm_renew_all_issues() {
    require_root("renew_all_issues_what_kubeadm_renew_all_issues");
    let t = TestDir::new("parity-renew");
    let orig = t.join("orig");
    kubeadm_node(&orig, true);
    assert_renew_parity(&t, &orig, "kubeadm init");
}

#[test]
fn lab_init_writes_what_kubeadm_init_writes() {
    require_root("lab_init_writes_what_kubeadm_init_writes");
    let t = TestDir::new("parity-lab");
    let start = now();
    let lab = t.lab(
        "lab",
        &["--node-name", "cp-1", "--advertise-address", "10.0.0.10"],
    );
    let real = t.join("kubeadm");
    kubeadm_node(&real, false);
    let end = now();
    let scratch = t.join("pem");
    for (name, rel, _) in v1_20_leaves() {
        let l = Ossl::read(&leaf_file(&lab, rel, &scratch));
        let k = Ossl::read(&leaf_file(&real, rel, &scratch));
        // lab init writes kubeadm >= 1.29 subjects (reference/pki-profiles.md §1): v1.20 had
        // O=system:masters where 1.29 has kubeadm:cluster-admins or no O at all.
        let v120 = match name {
            "admin.conf" | "apiserver-kubelet-client" => l
                .subject
                .replace("O=kubeadm:cluster-admins", "O=system:masters"),
            "apiserver-etcd-client" | "etcd-healthcheck-client" => {
                assert!(!l.subject.contains("O="), "{name}: {}", l.subject);
                format!("{},O=system:masters", l.subject)
            }
            _ => l.subject.clone(),
        };
        assert_eq!(
            v120, k.subject,
            "{name}: subject, lab init (1.29 profile) vs kubeadm v1.20"
        );
        let lab_identity = identity(&l).replace(&l.subject, &k.subject);
        assert_eq!(
            lab_identity,
            identity(&k),
            "{name}: certrotor lab init vs kubeadm init"
        );
        assert_a_year_from(
            name,
            [("lab init", &l), ("kubeadm", &k)],
            "creation",
            (start - 310, end),
            start,
        );
        if !rel.ends_with(".conf") {
            let key = rel.replace(".crt", ".key");
            assert_eq!(
                key_encoding(&etc(&lab).join(&key)),
                key_encoding(&etc(&real).join(&key)),
                "{name}: key PEM encoding"
            );
        }
    }
    for (name, rel) in CAS {
        let (l, k) = (
            Ossl::read(&etc(&lab).join(rel)),
            Ossl::read(&etc(&real).join(rel)),
        );
        // Newer client-go (NewSelfSignedCACert) names the CA's CN as a DNS SAN too; v1.20 not.
        assert_eq!(l.dns, [l.subject.trim_start_matches("CN=")], "CA {name}");
        assert!(k.dns.is_empty(), "CA {name}: kubeadm v1.20 {:?}", k.dns);
        let mut l_v120 = l.clone();
        l_v120.dns.clear();
        assert_eq!(identity(&l_v120), identity(&k), "CA {name}");
        assert_eq!(
            l.ext_value("Basic Constraints"),
            k.ext_value("Basic Constraints"),
            "CA {name}"
        );
        for (who, o) in [("lab init", &l), ("kubeadm", &k)] {
            assert!(
                (o.not_after - o.not_before - 10 * YEAR).abs() <= 310,
                "CA {name}: {who} is not valid 10 years: {} .. {}",
                o.not_before,
                o.not_after
            );
        }
    }
    // kubeadm reads the lab node, and agrees with certrotor about it.
    std::fs::write(lab.join(CONFIG), config(false)).unwrap();
    assert_check_agrees(&lab, "certrotor lab init");
    // And both renew the lab node alike (kubeadm v1.20 ignores super-admin.conf).
    assert_renew_parity(&t, &lab, "lab init");
}

#[test]
fn build_script_never_hands_out_a_missing_or_stale_cache() {
    let t = TestDir::new("parity-cache");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/k8s/build.sh");
    let print = |cache: &Path| {
        Command::new(&script)
            .arg("--print-bin-dir")
            .env("CERTROTOR_K8S_CACHE", cache)
            .output()
            .unwrap()
    };
    let cache = t.join("cache");
    // Absent, then binaries without the marker (a half-built cache), then a marker of another
    // script version: each is refused with the command to run.
    let bin = cache.join("bin");
    for step in ["absent", "no marker", "stale marker"] {
        match step {
            "no marker" => {
                std::fs::create_dir_all(&bin).unwrap();
                std::fs::write(bin.join("kubeadm"), "").unwrap();
            }
            "stale marker" => std::fs::write(
                bin.join(".complete"),
                "kubernetes v1.20.2 deb 1.20.5+really1.20.2-1.1+deb12u1 script-sha256 0\n",
            )
            .unwrap(),
            _ => {}
        }
        let out = print(&cache);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{step}: {err}");
        assert!(out.stdout.is_empty(), "{step}: nothing on stdout");
        assert!(
            err.contains("no complete build") && err.contains("run images/k8s/build.sh"),
            "{step}: {err}"
        );
    }
    let out = Command::new(&script).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument '--bogus'"));
}
