//! `certrotor lab init`: every layout, topology and key algorithm, read back with openssl and
//! compared with the kubeadm/etcdadm profiles (reference/pki-profiles.md §1.2, §1.3, §2, §4, §5).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::check::assert_agrees_with_openssl;
use crate::util::{
    DAY, Found, Ossl, TestDir, YEAR, base64_decode, certrotor, check_json, find_certificates,
    kubeconfig_value, now, openssl_verify, openssl_verify_all, record, s, walk,
};

/// The profile a certificate must have.
struct Want {
    /// Relative to its root: a `.crt` or a kubeconfig.
    path: String,
    cn: String,
    o: Option<&'static str>,
    eku: Vec<&'static str>,
    dns: Vec<String>,
    ips: Vec<&'static str>,
    /// The signing CA's certificate file.
    ca: PathBuf,
    /// etcdadm profile (no BasicConstraints, always RSA-2048) instead of kubeadm's.
    etcdadm: bool,
}

const NODE: &str = "cp-1";
const IP: &str = "10.0.0.10";

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The kubeadm leaves and kubeconfigs of a control-plane root (pki-profiles §1.2, §2).
fn kubeadm_wants(root: &Path, kdir: &str, stacked: bool, etcd_client_crt: &str) -> Vec<Want> {
    let pki = format!("{kdir}/pki");
    let ca = root.join(format!("{pki}/ca.crt"));
    let fp = root.join(format!("{pki}/front-proxy-ca.crt"));
    let etcd = root.join(format!("{pki}/etcd/ca.crt"));
    let leaf = |file: &str,
                cn: &str,
                o,
                eku: &[&'static str],
                dns: &[&str],
                ips: &[&'static str],
                ca: &PathBuf| Want {
        path: format!("{pki}/{file}"),
        cn: cn.into(),
        o,
        eku: eku.to_vec(),
        dns: strings(dns),
        ips: ips.to_vec(),
        ca: ca.clone(),
        etcdadm: false,
    };
    let apiserver_dns = [
        NODE,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ];
    let mut out = vec![
        leaf(
            "apiserver.crt",
            "kube-apiserver",
            None,
            &["serverAuth"],
            &apiserver_dns,
            &["10.96.0.1", IP],
            &ca,
        ),
        leaf(
            "apiserver-kubelet-client.crt",
            "kube-apiserver-kubelet-client",
            Some("kubeadm:cluster-admins"),
            &["clientAuth"],
            &[],
            &[],
            &ca,
        ),
        leaf(
            "front-proxy-client.crt",
            "front-proxy-client",
            None,
            &["clientAuth"],
            &[],
            &[],
            &fp,
        ),
    ];
    if stacked {
        let both = ["serverAuth", "clientAuth"];
        let member_ips = [IP, "127.0.0.1", "::1"];
        for rel in ["etcd/server.crt", "etcd/peer.crt"] {
            out.push(leaf(
                rel,
                NODE,
                None,
                &both,
                &[NODE, "localhost"],
                &member_ips,
                &etcd,
            ));
        }
        out.push(leaf(
            "etcd/healthcheck-client.crt",
            "kube-etcd-healthcheck-client",
            None,
            &["clientAuth"],
            &[],
            &[],
            &etcd,
        ));
        out.push(leaf(
            "apiserver-etcd-client.crt",
            "kube-apiserver-etcd-client",
            None,
            &["clientAuth"],
            &[],
            &[],
            &etcd,
        ));
    } else {
        // The copy of the etcd node's client certificate (etcdadm profile).
        let mut w = leaf(
            etcd_client_crt,
            &format!("{NODE}-etcd-kube-apiserver-etcd-client"),
            Some("system:masters"),
            &["clientAuth"],
            &[],
            &[],
            &etcd,
        );
        w.etcdadm = true;
        out.push(w);
    }
    for (file, cn, o) in [
        (
            "admin.conf",
            "kubernetes-admin",
            Some("kubeadm:cluster-admins"),
        ),
        (
            "super-admin.conf",
            "kubernetes-super-admin",
            Some("system:masters"),
        ),
        (
            "controller-manager.conf",
            "system:kube-controller-manager",
            None,
        ),
        ("scheduler.conf", "system:kube-scheduler", None),
        ("kubelet.conf", "system:node:cp-1", Some("system:nodes")),
    ] {
        let mut w = leaf(file, cn, o, &["clientAuth"], &[], &[], &ca);
        w.path = format!("{kdir}/{file}");
        out.push(w);
    }
    out
}

/// The etcdadm leaves of an etcd node (pki-profiles §4; lab member name `cp-1-etcd`).
fn etcdadm_wants(root: &Path, dir: &str) -> Vec<Want> {
    let ca = root.join(format!("{dir}/ca.crt"));
    let name = format!("{NODE}-etcd");
    let leaf = |file: &str,
                cn: String,
                o,
                eku: &[&'static str],
                dns: Vec<String>,
                ips: &[&'static str]| Want {
        path: format!("{dir}/{file}"),
        cn,
        o,
        eku: eku.to_vec(),
        dns,
        ips: ips.to_vec(),
        ca: ca.clone(),
        etcdadm: true,
    };
    let both = ["serverAuth", "clientAuth"];
    vec![
        leaf(
            "server.crt",
            name.clone(),
            None,
            &both,
            vec![name.clone()],
            &[IP, "127.0.0.1"],
        ),
        leaf(
            "peer.crt",
            name.clone(),
            None,
            &both,
            vec![name.clone()],
            &[IP],
        ),
        leaf(
            "etcdctl-etcd-client.crt",
            format!("{name}-etcdctl"),
            Some("system:masters"),
            &["clientAuth"],
            vec![],
            &[],
        ),
        leaf(
            "apiserver-etcd-client.crt",
            format!("{name}-kube-apiserver-etcd-client"),
            Some("system:masters"),
            &["clientAuth"],
            vec![],
            &[],
        ),
    ]
}

fn subject(cn: &str, o: Option<&str>) -> String {
    match o {
        Some(o) => format!("CN={cn},O={o}"),
        None => format!("CN={cn}"),
    }
}

fn by_path<'a>(found: &[&'a Found]) -> BTreeMap<&'a str, &'a Found> {
    found.iter().map(|f| (f.path.as_str(), *f)).collect()
}

/// Checks a CA certificate against kubeadm's CA profile (pki-profiles §1.3).
fn assert_ca(f: &Found, cn: &str, algorithm: &str) {
    let o = &f.ossl;
    let ctx = format!("{}:\n{}", f.path, o.text);
    assert_eq!(o.subject, format!("CN={cn}"), "{ctx}");
    assert_eq!(o.issuer, o.subject, "self-signed: {ctx}");
    assert_eq!(o.dns, vec![cn.to_string()], "CA SAN DNS = CN: {ctx}");
    let ku = &o.ext["Key Usage"];
    assert!(ku.critical, "{ctx}");
    assert_eq!(
        o.key_usage,
        ["digitalSignature", "keyEncipherment", "keyCertSign"],
        "{ctx}"
    );
    let bc = &o.ext["Basic Constraints"];
    assert!(
        bc.critical && bc.value == "CA:TRUE",
        "BasicConstraints critical CA:TRUE: {ctx}"
    );
    assert!(o.ext.contains_key("Subject Key Identifier"), "{ctx}");
    assert!(!o.ext.contains_key("Authority Key Identifier"), "{ctx}");
    assert_eq!(o.public_key, algorithm, "{ctx}");
    // ~10 years: kubeadm's notBefore is backdated 5 minutes.
    assert_eq!(o.not_after - o.not_before, 10 * YEAR + 300, "{ctx}");
    openssl_verify(&f.cert_file, &f.cert_file, true).unwrap_or_else(|e| panic!("{ctx}\n{e}"));
    assert_eq!(
        f.key_pubkey.as_ref(),
        Some(&o.pubkey_pem),
        "CA key does not match {}",
        f.path
    );
}

/// Checks a leaf (certificate file or kubeconfig) against its profile, with openssl alone.
/// `verified`: openssl verify against `w.ca` without and with the time check.
fn assert_leaf(
    w: &Want,
    f: &Found,
    ca: &Ossl,
    verified: (&Result<(), String>, &Result<(), String>),
    algorithm: &str,
    expired: bool,
) {
    let o = &f.ossl;
    let ctx = format!("{}:\n{}", f.path, o.text);
    assert_eq!(o.subject, subject(&w.cn, w.o), "{ctx}");
    assert_eq!(o.issuer, ca.subject, "{ctx}");
    assert_eq!(o.ext_key_usage, w.eku, "{ctx}");
    assert_eq!(o.dns, w.dns, "{ctx}");
    let ips: Vec<IpAddr> = w.ips.iter().map(|i| i.parse().unwrap()).collect();
    assert_eq!(o.ips, ips, "{ctx}");
    assert!(o.ext["Key Usage"].critical, "KeyUsage critical: {ctx}");
    assert_eq!(
        o.key_usage,
        ["digitalSignature", "keyEncipherment"],
        "{ctx}"
    );
    match o.ext.get("Basic Constraints") {
        Some(bc) if !w.etcdadm => assert!(bc.critical && bc.value == "CA:FALSE", "{ctx}"),
        None if w.etcdadm => {}
        other => panic!(
            "BasicConstraints {other:?}, want {}: {ctx}",
            if w.etcdadm { "none" } else { "CA:FALSE" }
        ),
    }
    assert!(
        !o.ext.contains_key("Subject Key Identifier"),
        "no SKI on leaves: {ctx}"
    );
    assert_eq!(
        o.ext_value("Authority Key Identifier"),
        ca.ext_value("Subject Key Identifier"),
        "AKI = CA SKI: {ctx}"
    );
    let want_alg = if w.etcdadm { "RSA-2048" } else { algorithm };
    assert_eq!(o.public_key, want_alg, "{ctx}");
    let want_sig = if ca.public_key.starts_with("RSA") {
        "sha256WithRSAEncryption"
    } else {
        "ecdsa-with-SHA256"
    };
    assert_eq!(o.signature_algorithm, want_sig, "{ctx}");
    assert_eq!(
        o.not_before, ca.not_before,
        "leaves start with their CA in the lab: {ctx}"
    );
    if let Err(e) = verified.0 {
        panic!("not signed by {}: {e}\n{ctx}", w.ca.display());
    }
    match verified.1 {
        Ok(()) => assert!(!expired, "openssl accepts an expired lab leaf: {ctx}"),
        Err(e) => assert!(
            expired && e.contains("certificate has expired"),
            "{e}\n{ctx}"
        ),
    }
    let key = f
        .key_file
        .as_ref()
        .unwrap_or_else(|| panic!("no key for {}", f.path));
    assert_eq!(
        f.key_pubkey.as_ref(),
        Some(&o.pubkey_pem),
        "key does not match {}",
        f.path
    );
    let key_pem = std::fs::read_to_string(key).unwrap();
    let header = pem_key_label(want_alg);
    assert!(
        key_pem.contains(&format!("-----BEGIN {header}-----")),
        "{} is not {header}",
        key.display()
    );
}

/// Checks every certificate of a root against `wants` and `cas` (path, CN): nothing missing,
/// nothing extra. Returns what was found and the leaves' notAfter values.
fn assert_profiles(
    root: &Path,
    scratch: &Path,
    wants: &[Want],
    cas: &[(&str, &str)],
    alg: &str,
    expired: bool,
) -> (Vec<Found>, Vec<i64>) {
    // The kubelet's own files (its client link and self-signed serving pair) are not kubeadm's
    // profiles: tests/kubelet.rs covers them.
    let found = find_certificates(root, scratch);
    let kubeadms: Vec<&Found> = found
        .iter()
        .filter(|f| !f.path.starts_with("var/lib/kubelet/"))
        .collect();
    let map = by_path(&kubeadms);
    let mut expected: Vec<&str> = wants
        .iter()
        .map(|w| w.path.as_str())
        .chain(cas.iter().map(|c| c.0))
        .collect();
    expected.sort();
    assert_eq!(
        map.keys().copied().collect::<Vec<_>>(),
        expected,
        "certificates under {}",
        root.display()
    );
    for (path, cn) in cas {
        if map[path].key_file.is_some() {
            assert_ca(map[path], cn, alg);
        }
    }
    // openssl is slow to start: one verify run per CA, with and without the time check.
    let mut verified = BTreeMap::new();
    let mut ca_files: Vec<&PathBuf> = wants.iter().map(|w| &w.ca).collect();
    ca_files.sort();
    ca_files.dedup();
    for ca in ca_files {
        let signed: Vec<&Want> = wants.iter().filter(|w| &w.ca == ca).collect();
        let files: Vec<&Path> = signed
            .iter()
            .map(|w| map[w.path.as_str()].cert_file.as_path())
            .collect();
        let without = openssl_verify_all(ca, &files, false);
        let with = openssl_verify_all(ca, &files, true);
        let ca_ossl = Ossl::read(ca);
        for ((w, a), b) in signed.iter().zip(without).zip(with) {
            verified.insert(w.path.clone(), (ca_ossl.clone(), a, b));
        }
    }
    let not_afters = wants
        .iter()
        .map(|w| {
            let (ca, a, b) = &verified[&w.path];
            assert_leaf(w, map[w.path.as_str()], ca, (a, b), alg, expired);
            map[w.path.as_str()].ossl.not_after
        })
        .collect();
    drop(map);
    (found, not_afters)
}

/// Modes per pki-profiles §1.5/§2: keys and kubeconfigs 0600, certificates 0644.
fn assert_modes(root: &Path) {
    for file in walk(root) {
        let meta = std::fs::symlink_metadata(&file).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        let name = file.to_str().unwrap();
        let want = if name.ends_with(".crt") { 0o644 } else { 0o600 };
        assert_eq!(mode, want, "mode of {name}: {mode:o}");
    }
}

/// The kubeconfigs name the CA of `pki/ca.crt` and the local API endpoint.
fn assert_kubeconfigs(root: &Path, kdir: &str) {
    let ca = std::fs::read(root.join(format!("{kdir}/pki/ca.crt"))).unwrap();
    for file in [
        "admin.conf",
        "super-admin.conf",
        "controller-manager.conf",
        "scheduler.conf",
        "kubelet.conf",
    ] {
        let text = std::fs::read_to_string(root.join(format!("{kdir}/{file}"))).unwrap();
        let data = kubeconfig_value(&text, "certificate-authority-data").unwrap();
        assert_eq!(
            base64_decode(&data),
            ca,
            "{file}: certificate-authority-data is not pki/ca.crt"
        );
        assert_eq!(
            kubeconfig_value(&text, "server").as_deref(),
            Some("https://10.0.0.10:6443"),
            "{file}"
        );
    }
    let kubelet = std::fs::read_to_string(root.join(format!("{kdir}/kubelet.conf"))).unwrap();
    let current = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    assert_eq!(
        kubeconfig_value(&kubelet, "client-certificate").as_deref(),
        Some(current)
    );
    assert_eq!(
        kubeconfig_value(&kubelet, "client-key").as_deref(),
        Some(current)
    );
    let link = std::fs::read_link(root.join(current.trim_start_matches('/'))).unwrap();
    let target = link.to_str().unwrap();
    assert!(
        target.starts_with("/var/lib/kubelet/pki/kubelet-client-2") && target.ends_with(".pem"),
        "{target}"
    );
    let pem = std::fs::read_to_string(root.join(target.trim_start_matches('/'))).unwrap();
    assert!(
        pem.contains("BEGIN CERTIFICATE") && pem.contains("PRIVATE KEY-----"),
        "cert + key bundle"
    );
}

/// The PKI files of a root: everything but the dated kubelet PEM (checked through its link)
/// and static-pod manifests (not certificates).
fn relative_files(root: &Path) -> Vec<String> {
    walk(root)
        .iter()
        .map(|p| p.strip_prefix(root).unwrap().to_str().unwrap().to_string())
        .filter(|p| !p.starts_with("var/lib/kubelet/pki/kubelet-client-2"))
        .filter(|p| !p.contains("/manifests/"))
        .collect()
}

fn kubeadm_files(kdir: &str, stacked: bool, etcd_client_crt: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut pairs = vec![
        "ca",
        "front-proxy-ca",
        "apiserver",
        "apiserver-kubelet-client",
        "front-proxy-client",
    ];
    if stacked {
        pairs.extend([
            "etcd/ca",
            "etcd/server",
            "etcd/peer",
            "etcd/healthcheck-client",
            "apiserver-etcd-client",
        ]);
    } else {
        out.push(format!("{kdir}/pki/etcd/ca.crt"));
        out.push(format!("{kdir}/pki/{etcd_client_crt}"));
        out.push(format!("{kdir}/pki/apiserver-etcd-client.key"));
    }
    for p in pairs {
        out.push(format!("{kdir}/pki/{p}.crt"));
        out.push(format!("{kdir}/pki/{p}.key"));
    }
    out.push(format!("{kdir}/pki/sa.key"));
    out.push(format!("{kdir}/pki/sa.pub"));
    for c in [
        "admin.conf",
        "super-admin.conf",
        "controller-manager.conf",
        "scheduler.conf",
        "kubelet.conf",
    ] {
        out.push(format!("{kdir}/{c}"));
    }
    out.push("var/lib/kubelet/pki/kubelet-client-current.pem".into());
    // The kubelet's self-signed serving pair, as it writes one at its first start.
    out.push("var/lib/kubelet/pki/kubelet.crt".into());
    out.push("var/lib/kubelet/pki/kubelet.key".into());
    out.sort();
    out
}

/// Leaves expire `expires_in` after the lab was made; returns (before, after) of the run.
fn assert_leaf_expiry(not_afters: &[i64], before: i64, after: i64, expires_in: i64) {
    for n in not_afters {
        assert!(
            *n >= before + expires_in && *n <= after + expires_in,
            "notAfter {n} not in [{before}, {after}] + {expires_in}"
        );
    }
}

/// A stacked kubeadm node, checked file by file.
fn stacked(name: &str, layout: &str, kdir: &str, alg_flag: &str, alg: &str) {
    let dir = TestDir::new(name);
    let before = now();
    let root = dir.lab("node", &["--layout", layout, "--key-algorithm", alg_flag]);
    let after = now();
    assert_eq!(relative_files(&root), kubeadm_files(kdir, true, ""));
    assert_modes(&root);
    assert_kubeconfigs(&root, kdir);
    let wants = kubeadm_wants(&root, kdir, true, "");
    let cas = [
        (format!("{kdir}/pki/ca.crt"), "kubernetes"),
        (format!("{kdir}/pki/front-proxy-ca.crt"), "front-proxy-ca"),
        (format!("{kdir}/pki/etcd/ca.crt"), "etcd-ca"),
    ];
    let cas: Vec<(&str, &str)> = cas.iter().map(|(p, c)| (p.as_str(), *c)).collect();
    let (found, not_afters) =
        assert_profiles(&root, &dir.join("scratch"), &wants, &cas, alg, false);
    assert_leaf_expiry(&not_afters, before, after, 365 * DAY);
    let sa = std::fs::read_to_string(root.join(format!("{kdir}/pki/sa.key"))).unwrap();
    let header = pem_key_label(alg);
    assert!(
        sa.starts_with(&format!("-----BEGIN {header}-----")),
        "sa.key: {header}"
    );
    let sa_pub = std::fs::read_to_string(root.join(format!("{kdir}/pki/sa.pub"))).unwrap();
    assert!(
        sa_pub.starts_with("-----BEGIN PUBLIC KEY-----"),
        "sa.pub is a PKIX PUBLIC KEY"
    );

    let inv = check_json(&root, &[], 0);
    assert_eq!(inv["layouts"], serde_json::json!([layout]));
    assert_agrees_with_openssl(&root, &inv, &found);
    for r in inv["certificates"].as_array().unwrap() {
        assert_eq!(s(r, "status"), "ok", "{r:#}");
        // The kubelet's self-signed serving key is always RSA-2048, as the kubelet makes it.
        let want = if r["name"] == "kubelet-serving" {
            "RSA-2048"
        } else {
            alg
        };
        assert_eq!(s(r, "public_key"), want, "{r:#}");
    }
}

#[test]
fn kubeadm_stacked_rsa_2048_matches_the_kubeadm_profiles() {
    stacked(
        "stacked-rsa",
        "kubeadm",
        "etc/kubernetes",
        "rsa-2048",
        "RSA-2048",
    );
}

#[test]
fn kubeadm_stacked_ecdsa_p256_matches_the_kubeadm_profiles() {
    stacked(
        "stacked-ecdsa",
        "kubeadm",
        "etc/kubernetes",
        "ecdsa-p256",
        "ECDSA-P256",
    );
}

#[test]
fn bottlerocket_stacked_uses_var_lib_kubeadm() {
    stacked(
        "br-stacked",
        "bottlerocket",
        "var/lib/kubeadm",
        "ecdsa-p256",
        "ECDSA-P256",
    );
}

/// An external-etcd lab: two roots sharing one etcd CA.
fn external(
    name: &str,
    layout: &str,
    kdir: &str,
    etcd_dir: &str,
    etcd_client_crt: &str,
    alg_flag: &str,
    alg: &str,
) {
    let dir = TestDir::new(name);
    let before = now();
    dir.lab(
        "lab",
        &[
            "--layout",
            layout,
            "--topology",
            "external-etcd",
            "--key-algorithm",
            alg_flag,
        ],
    );
    let after = now();
    let cp = dir.join("lab/control-plane");
    let etcd = dir.join("lab/etcd");
    assert_eq!(
        relative_files(&cp),
        kubeadm_files(kdir, false, etcd_client_crt)
    );
    let mut etcd_files: Vec<String> = [
        "ca",
        "server",
        "peer",
        "etcdctl-etcd-client",
        "apiserver-etcd-client",
    ]
    .iter()
    .flat_map(|p| [format!("{etcd_dir}/{p}.crt"), format!("{etcd_dir}/{p}.key")])
    .collect();
    etcd_files.sort();
    assert_eq!(relative_files(&etcd), etcd_files);
    assert_modes(&cp);
    assert_modes(&etcd);
    assert_kubeconfigs(&cp, kdir);
    // One etcd CA: the control plane holds its certificate only, and a copy of the client pair.
    let read = |root: &Path, rel: &str| std::fs::read(root.join(rel)).unwrap();
    assert_eq!(
        read(&cp, &format!("{kdir}/pki/etcd/ca.crt")),
        read(&etcd, &format!("{etcd_dir}/ca.crt"))
    );
    assert_eq!(
        read(&cp, &format!("{kdir}/pki/{etcd_client_crt}")),
        read(&etcd, &format!("{etcd_dir}/apiserver-etcd-client.crt"))
    );
    assert_eq!(
        read(&cp, &format!("{kdir}/pki/apiserver-etcd-client.key")),
        read(&etcd, &format!("{etcd_dir}/apiserver-etcd-client.key"))
    );

    let mut cp_wants = kubeadm_wants(&cp, kdir, false, etcd_client_crt);
    // The etcd CA's key is on the etcd node only.
    for w in &mut cp_wants {
        if w.etcdadm {
            w.ca = etcd.join(format!("{etcd_dir}/ca.crt"));
        }
    }
    let cp_cas = [
        (format!("{kdir}/pki/ca.crt"), "kubernetes"),
        (format!("{kdir}/pki/front-proxy-ca.crt"), "front-proxy-ca"),
        (format!("{kdir}/pki/etcd/ca.crt"), "kubernetes"),
    ];
    let cp_cas: Vec<(&str, &str)> = cp_cas.iter().map(|(p, c)| (p.as_str(), *c)).collect();
    let (cp_found, mut not_afters) =
        assert_profiles(&cp, &dir.join("s1"), &cp_wants, &cp_cas, alg, false);
    let etcd_ca = format!("{etcd_dir}/ca.crt");
    // etcdadm certificates are always RSA-2048, the CA follows --key-algorithm.
    let etcd_wants = etcdadm_wants(&etcd, etcd_dir);
    let etcd_cas = [(etcd_ca.as_str(), "kubernetes")];
    let (etcd_found, etcd_not_afters) =
        assert_profiles(&etcd, &dir.join("s2"), &etcd_wants, &etcd_cas, alg, false);
    not_afters.extend(etcd_not_afters);
    assert_leaf_expiry(&not_afters, before, after, 365 * DAY);

    let inv = check_json(&cp, &[], 0);
    assert_eq!(inv["layouts"], serde_json::json!([layout]));
    assert_agrees_with_openssl(&cp, &inv, &cp_found);
    let etcd_ca_rec = record(&inv, "etcd-ca");
    assert_eq!(etcd_ca_rec["externally_managed"], true, "{etcd_ca_rec:#}");
    let client = record(&inv, "apiserver-etcd-client");
    assert_eq!(s(client, "path"), format!("{kdir}/pki/{etcd_client_crt}"));
    assert_eq!(
        client["key_path"],
        format!("{kdir}/pki/apiserver-etcd-client.key")
    );
    assert_eq!(client["externally_managed"], true, "{client:#}");
    assert_eq!(client["key_matches"], true, "{client:#}");
    assert_eq!(client["chain_ok"], true, "{client:#}");
    assert!(
        inv["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| !s(r, "name").starts_with("etcd-server"))
    );

    let inv = check_json(&etcd, &[], 0);
    let etcd_layout = if layout == "kubeadm" {
        "etcdadm"
    } else {
        "etcdadm-bottlerocket"
    };
    assert_eq!(inv["layouts"], serde_json::json!([etcd_layout]));
    assert_agrees_with_openssl(&etcd, &inv, &etcd_found);
    for r in inv["certificates"].as_array().unwrap() {
        assert_eq!(s(r, "status"), "ok", "{r:#}");
    }
}

#[test]
fn kubeadm_external_etcd_writes_two_roots_sharing_one_etcd_ca() {
    external(
        "ext-kubeadm",
        "kubeadm",
        "etc/kubernetes",
        "etc/etcd/pki",
        "apiserver-etcd-client.crt",
        "rsa-2048",
        "RSA-2048",
    );
}

#[test]
fn bottlerocket_external_etcd_names_the_client_certificate_server_etcd_client() {
    external(
        "ext-br",
        "bottlerocket",
        "var/lib/kubeadm",
        "var/lib/etcd/pki",
        "server-etcd-client.crt",
        "ecdsa-p256",
        "ECDSA-P256",
    );
}

#[test]
fn expires_in_negative_gives_expired_leaves_and_valid_cas() {
    let dir = TestDir::new("lab-expired");
    let before = now();
    let root = dir.lab(
        "node",
        &["--expires-in", "-1d", "--key-algorithm", "ecdsa-p256"],
    );
    let after = now();
    let kdir = "etc/kubernetes";
    let wants = kubeadm_wants(&root, kdir, true, "");
    let cas = [
        ("etc/kubernetes/pki/ca.crt", "kubernetes"),
        ("etc/kubernetes/pki/front-proxy-ca.crt", "front-proxy-ca"),
        ("etc/kubernetes/pki/etcd/ca.crt", "etcd-ca"),
    ];
    // assert_leaf checks that openssl refuses each leaf as expired, and accepts it without the time check.
    let (_, not_afters) = assert_profiles(
        &root,
        &dir.join("scratch"),
        &wants,
        &cas,
        "ECDSA-P256",
        true,
    );
    assert_leaf_expiry(&not_afters, before, after, -DAY);
    for (ca, _) in cas {
        let o = Ossl::read(&root.join(ca));
        assert!(
            o.not_after > after + 8 * YEAR,
            "CA {ca} must stay valid for years"
        );
    }

    let inv = check_json(&root, &[], 2);
    for r in inv["certificates"].as_array().unwrap() {
        if r["kind"] == "ca" {
            assert_eq!(s(r, "status"), "ok", "{r:#}");
        } else {
            assert_eq!(s(r, "status"), "expired", "{r:#}");
            assert!(s(r, "error").contains("expired on"), "{r:#}");
            assert!(r["residual_seconds"].as_i64().unwrap() < 0, "{r:#}");
        }
    }
}

#[test]
fn lab_init_writes_only_into_a_new_or_empty_folder() {
    let dir = TestDir::new("lab-nonempty");
    std::fs::write(dir.join("keep.txt"), "mine").unwrap();
    let run = certrotor(&["lab", "init", dir.path().to_str().unwrap()]);
    run.expect(2);
    assert!(run.stderr.contains("is not empty"), "{run}");
    assert_eq!(
        std::fs::read_to_string(dir.join("keep.txt")).unwrap(),
        "mine"
    );
    assert_eq!(walk(dir.path()).len(), 1, "nothing written");
    // An existing empty folder is fine.
    std::fs::create_dir(dir.join("empty")).unwrap();
    dir.lab("empty", &["--key-algorithm", "ecdsa-p256"]);
}

#[test]
fn lab_init_rejects_bad_flags_with_exit_64() {
    let dir = TestDir::new("lab-flags");
    let target = dir.join("node");
    let t = target.to_str().unwrap();
    for (flags, words) in [
        (
            vec!["--layout", "ubuntu"],
            "'--layout' with value 'ubuntu': use kubeadm or bottlerocket",
        ),
        (
            vec!["--topology", "mesh"],
            "'--topology' with value 'mesh': use stacked or external-etcd",
        ),
        (
            vec!["--key-algorithm", "dsa"],
            "'--key-algorithm' with value 'dsa': use rsa-2048",
        ),
        (
            vec!["--expires-in", "soon"],
            "'--expires-in' with value 'soon': invalid duration 'soon'",
        ),
        (
            vec!["--advertise-address", "x.y"],
            "'--advertise-address' with value 'x.y': not an IP address",
        ),
        (
            vec!["--no-such-flag"],
            "Unrecognized argument: --no-such-flag",
        ),
    ] {
        let mut args = vec!["lab", "init", t];
        args.extend(flags);
        let run = certrotor(&args);
        run.expect(64);
        assert!(
            run.stderr.contains(words),
            "want '{words}' in stderr\n{run}"
        );
        assert!(!target.exists(), "nothing written on a usage error\n{run}");
    }
}

/// `certrotor demo` tells one true story (issue 27.7): every certificate it says it renewed is
/// renewed on the kept node, its count is theirs, and every certificate `check` still reports
/// is named at the end with the reason.
#[test]
fn the_demo_says_only_what_holds_on_its_node() {
    let run = certrotor(&["demo", "--keep"]);
    run.expect(0);
    let out = &run.stdout;
    let kept = out
        .lines()
        .find_map(|l| l.strip_prefix("The lab node is kept at "))
        .unwrap_or_else(|| panic!("no kept node\n{run}"));
    let root = PathBuf::from(kept.trim());
    let after = check_json(&root, &[], 1);
    let certs = after["certificates"].as_array().unwrap();
    let by_name = |name: &str| {
        certs
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in check\n{after:#}"))
    };
    let mut renewed = Vec::new();
    for line in out.lines().map(str::trim_start) {
        if let Some(rest) = line.strip_prefix("renewed ") {
            renewed.push(rest.split_whitespace().next().unwrap().to_string());
        } else if let Some(rest) = line.strip_prefix("Reissued ") {
            renewed.push(rest.split_whitespace().next().unwrap().to_string());
        }
    }
    assert!(renewed.len() > 10, "{run}");
    for name in &renewed {
        let c = by_name(name);
        assert!(
            c["residual_seconds"].as_i64().unwrap() > 360 * DAY,
            "{name}: {c:#}"
        );
        assert_eq!(c["status"], "ok", "{name}");
    }
    let count = format!("   {} certificates in ", renewed.len());
    assert!(out.contains(&count), "'{count}' not said\n{run}");
    let still: Vec<&Value> = certs.iter().filter(|c| c["status"] != "ok").collect();
    assert!(
        !still.is_empty(),
        "check exits 1, so something is due\n{after:#}"
    );
    for c in still {
        let said = format!("   {} is {}: ", s(c, "name"), s(c, "status"));
        assert!(out.contains(&said), "'{said}' not said\n{run}");
    }
    assert!(!out.contains("rotates its own client certificate"), "{run}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The PEM label of the lab's private keys for an algorithm (`RSA-2048`, `ECDSA-P256`, ...):
/// PKCS#1 for RSA, SEC 1 for ECDSA, as kubeadm writes them.
fn pem_key_label(alg: &str) -> &'static str {
    if alg.starts_with("RSA") {
        "RSA PRIVATE KEY"
    } else {
        "EC PRIVATE KEY"
    }
}
