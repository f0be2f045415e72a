//! `certrotor ca rotate|continue|abort|status` (issue 29) on one node: trust-in, issue,
//! trust-out, abort, refusals, a crash at every step, checked with openssl on the files. The
//! same with the real etcd and kube-apiserver v1.20.2 is in `platform.rs`
//! (`ca_rotate_on_a_running_node…`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::renew_util::{Output, TempDir, certrotor, copy_tree, lab_in, s};
use crate::util::{find_certificates, listing, openssl_ok, openssl_verify};

const STATE: &str = "var/lib/certrotor/ca-rotation.json";

/// A CA of the lab node: its catalog name, certificate file and key file.
struct Ca {
    name: &'static str,
    cert: &'static str,
    key: &'static str,
    /// A leaf of it certrotor renews.
    leaf: &'static str,
}

const FRONT_PROXY: Ca = Ca {
    name: "front-proxy-ca",
    cert: "etc/kubernetes/pki/front-proxy-ca.crt",
    key: "etc/kubernetes/pki/front-proxy-ca.key",
    leaf: "etc/kubernetes/pki/front-proxy-client.crt",
};

const CLUSTER: Ca = Ca {
    name: "ca",
    cert: "etc/kubernetes/pki/ca.crt",
    key: "etc/kubernetes/pki/ca.key",
    leaf: "etc/kubernetes/pki/apiserver.crt",
};

const ETCD: Ca = Ca {
    name: "etcd-ca",
    cert: "etc/kubernetes/pki/etcd/ca.crt",
    key: "etc/kubernetes/pki/etcd/ca.key",
    leaf: "etc/kubernetes/pki/etcd/server.crt",
};

impl Ca {
    fn next_key(&self) -> String {
        self.key.replace(".key", ".next.key")
    }
    fn previous_key(&self) -> String {
        self.key.replace(".key", ".previous.key")
    }
}

/// `certrotor ca SUB --ca CA --root ROOT --platform none --output json EXTRA`.
fn ca(sub: &str, ca: &Ca, root: &Path) -> crate::renew_util::Cmd {
    certrotor(&[
        "ca",
        sub,
        "--ca",
        ca.name,
        "--root",
        s(root),
        "--platform",
        "none",
        "--output",
        "json",
    ])
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{out}"))
}

/// The certificates of the node (files and kubeconfigs' client certificates, not CAs, not
/// certrotor's backups) that openssl verifies against the PEM file `ca`.
fn verified_by(root: &Path, ca: &Path, scratch: &Path) -> BTreeSet<String> {
    find_certificates(root, scratch)
        .into_iter()
        .filter(|f| !f.path.starts_with("var/lib/certrotor"))
        .filter(|f| {
            !f.ossl
                .ext
                .get("Basic Constraints")
                .is_some_and(|e| e.value.contains("CA:TRUE"))
        })
        .filter(|f| openssl_verify(ca, &f.cert_file, false).is_ok())
        .map(|f| f.path)
        .collect()
}

/// The PEM blocks of a file, each as its own text.
fn blocks(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    text.split_inclusive("-----END CERTIFICATE-----\n")
        .filter(|b| b.contains("BEGIN CERTIFICATE"))
        .map(str::to_string)
        .collect()
}

/// Writes `pem` to `dir/name` and returns the path.
fn put(dir: &Path, name: &str, pem: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, pem).unwrap();
    p
}

fn x509(file: &Path, what: &str) -> String {
    openssl_ok(&["x509", "-noout", what, "-in", s(file)])
}

fn pubkey_of_key(key: &Path) -> String {
    openssl_ok(&["pkey", "-pubout", "-in", s(key)])
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// The cluster CA's own files on a lab node, as a stage leaves them: every kubeconfig's CA data
/// holds the certificates of `trusted` (any order), kube-controller-manager's manifest names its
/// signer file while `signer` is some (holding that certificate alone), the CA file after.
fn cluster_files(root: &Path, trusted: &[&Path], signer: Option<&Path>) {
    let pem = |p: &Path| std::fs::read_to_string(p).unwrap();
    let mut want: Vec<String> = trusted.iter().map(|p| pem(p)).collect();
    want.sort();
    let mut seen = 0;
    for entry in std::fs::read_dir(root.join("etc/kubernetes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "conf") {
            continue;
        }
        let text = pem(&path);
        let data = crate::util::kubeconfig_value(&text, "certificate-authority-data").unwrap();
        let scratch = put(&root.join("scratch-ca"), "kc.pem", "");
        std::fs::write(&scratch, crate::util::base64_decode(&data)).unwrap();
        let mut held = blocks(&scratch);
        held.sort();
        assert_eq!(held, want, "{}", path.display());
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} kubeconfigs");
    let manifest = pem(&root.join("etc/kubernetes/manifests/kube-controller-manager.yaml"));
    let file = root.join("etc/kubernetes/pki/ca.signer.crt");
    match signer {
        Some(s) => {
            assert!(
                manifest.contains("--cluster-signing-cert-file=/etc/kubernetes/pki/ca.signer.crt"),
                "{manifest}"
            );
            assert_eq!(blocks(&file), [pem(s)]);
        }
        None => {
            assert!(
                manifest.contains("--cluster-signing-cert-file=/etc/kubernetes/pki/ca.crt"),
                "{manifest}"
            );
            assert!(!file.exists());
        }
    }
    std::fs::remove_dir_all(root.join("scratch-ca")).unwrap();
}

fn history(root: &Path) -> Vec<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(root.join(STATE)).unwrap()).unwrap();
    assert_eq!(v["version"], 1, "{v}");
    v["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["stage"].as_str().unwrap().to_string())
        .collect()
}

/// One CA through the three stages on a lab node, every claim checked by openssl.
fn rotates(t: &TempDir, root: &Path, c: &Ca) {
    let scratch = t.join(&format!("{}-scratch", c.name));
    let old = put(
        &scratch,
        "old.crt",
        &std::fs::read_to_string(root.join(c.cert)).unwrap(),
    );
    let old_key = std::fs::read(root.join(c.key)).unwrap();
    let leaves = verified_by(root, &old, &scratch.join("a"));
    assert!(!leaves.is_empty(), "{}: no leaf of the old CA", c.name);

    // Trust-in and issue.
    let out = ca("rotate", c, root).run().ok();
    let r = json(&out);
    assert_eq!(r["stage"], "issued", "{out}");
    let stages: Vec<&str> = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["trust-in", "issue"], "{out}");
    assert!(!out.stdout.contains("PRIVATE KEY") && !out.stderr.contains("PRIVATE KEY"));
    let pems = blocks(&root.join(c.cert));
    assert_eq!(pems.len(), 2, "{}: [new, old] expected", c.name);
    assert_eq!(
        pems[1],
        std::fs::read_to_string(&old).unwrap(),
        "the old CA moved"
    );
    let new = put(&scratch, "new.crt", &pems[0]);
    // The new CA: like the old (subject, SANs, key type, validity period), its key the signer.
    assert_eq!(x509(&new, "-subject"), x509(&old, "-subject"));
    let ext = |f: &Path| {
        openssl_ok(&[
            "x509",
            "-noout",
            "-ext",
            "subjectAltName,basicConstraints,keyUsage",
            "-in",
            s(f),
        ])
    };
    assert_eq!(ext(&new), ext(&old));
    let span = |f: &Path| {
        let d = |w| crate::util::openssl_date(x509(f, w).split_once('=').unwrap().1.trim());
        d("-enddate") - d("-startdate")
    };
    assert_eq!(span(&new), span(&old), "validity period");
    assert_ne!(x509(&new, "-serial"), x509(&old, "-serial"));
    let pubkey = |f: &Path| openssl_ok(&["x509", "-noout", "-pubkey", "-in", s(f)]);
    assert_eq!(
        pubkey_of_key(&root.join(c.key)),
        pubkey(&new),
        "the CA key signs as the new CA"
    );
    let previous = root.join(c.previous_key());
    assert_eq!(
        pubkey_of_key(&previous),
        pubkey(&old),
        "the old key waits beside it"
    );
    assert_eq!(mode(&previous), 0o600);
    assert_eq!(mode(&root.join(c.key)), 0o600);
    assert!(!root.join(c.next_key()).exists());
    // Every leaf is issued again by the new CA: openssl verifies it with the new CA alone, not
    // with the old alone, and with the bundle the consumers read.
    assert_eq!(verified_by(root, &new, &scratch.join("b")), leaves, "{out}");
    assert!(
        verified_by(root, &old, &scratch.join("c")).is_empty(),
        "{out}"
    );
    assert_eq!(
        verified_by(root, &root.join(c.cert), &scratch.join("d")),
        leaves
    );
    if c.name == "ca" {
        cluster_files(root, &[&new, &old], Some(&new));
    }
    certrotor(&["check", "--root", s(root)]).run().ok();
    let renewed: BTreeSet<&str> = r["stages"][1]["renewed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(!renewed.is_empty(), "{out}");

    // Trust-out.
    let out = ca("continue", c, root).run().ok();
    assert_eq!(json(&out)["stage"], "done", "{out}");
    assert_eq!(
        blocks(&root.join(c.cert)),
        [std::fs::read_to_string(&new).unwrap()]
    );
    assert!(!previous.exists() && !root.join(c.next_key()).exists());
    assert_ne!(std::fs::read(root.join(c.key)).unwrap(), old_key);
    assert_eq!(
        verified_by(root, &root.join(c.cert), &scratch.join("e")),
        leaves
    );
    assert!(verified_by(root, &old, &scratch.join("f")).is_empty());
    if c.name == "ca" {
        cluster_files(root, &[&new], None);
    }
    assert_eq!(
        history(root),
        [
            "trust-in",
            "trusted",
            "issue",
            "issued",
            "trust-out",
            "done"
        ]
    );
    let status = certrotor(&["ca", "status", "--root", s(root)]).run().ok();
    assert!(
        status
            .stdout
            .contains(&format!("Rotation of {}: stage done", c.name)),
        "{status}"
    );
    certrotor(&["check", "--root", s(root)]).run().ok();
}

#[test]
fn ca_rotate_trusts_both_then_issues_every_leaf_from_the_new_ca_then_trusts_it_alone() {
    let (t, root) = lab_in("ca-rotate", &["--kube-vip", "eks-anywhere"]);
    rotates(&t, &root, &FRONT_PROXY);
    rotates(&t, &root, &ETCD);
    rotates(&t, &root, &CLUSTER);
    // Each stage's files are one transaction of kind "ca" with a backup.
    let backups = certrotor(&["backups", "--root", s(&root), "--output", "json"])
        .run()
        .ok();
    let kinds: Vec<String> = serde_json::from_str::<Value>(&backups.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(kinds.iter().any(|k| k == "ca"), "{backups}");
}

/// An abort puts back the old CA file and key byte for byte, before the issue and after it
/// (then every leaf is issued again by the old CA first).
#[test]
fn ca_abort_before_trust_out_returns_the_node_to_the_old_ca_alone() {
    let (t, pristine) = lab_in("ca-abort", &[]);
    let runs = [
        (&ETCD, false),
        (&ETCD, true),
        (&CLUSTER, false),
        (&CLUSTER, true),
    ];
    for (i, (c, after_issue)) in runs.into_iter().enumerate() {
        let root = t.join(&format!("node-{i}"));
        copy_tree(&pristine, &root);
        let old_cert = std::fs::read(root.join(c.cert)).unwrap();
        let old_key = std::fs::read(root.join(c.key)).unwrap();
        let old = put(
            &t.join(&format!("s{i}")),
            "old.crt",
            &String::from_utf8_lossy(&old_cert),
        );
        let leaves = verified_by(&root, &old, &t.join(&format!("s{i}/a")));
        if after_issue {
            ca("rotate", c, &root).run().ok();
            assert!(verified_by(&root, &old, &t.join(&format!("s{i}/b"))).is_empty());
        } else {
            // Stopped after trust-in: killed at the first step of the issue's transaction.
            let stage = |root: &Path| std::fs::read_to_string(root.join(STATE)).unwrap_or_default();
            for n in 1.. {
                copy_tree(&pristine, &root);
                ca("rotate", c, &root)
                    .env("CERTROTOR_FAILPOINT", &n.to_string())
                    .run()
                    .expect_sigkill();
                if stage(&root).contains("\"stage\": \"issue\"") {
                    break;
                }
                std::fs::remove_dir_all(&root).unwrap();
            }
            assert_eq!(blocks(&root.join(c.cert)).len(), 2, "{}", listing(&root));
        }
        let out = ca("abort", c, &root).run().ok();
        assert_eq!(json(&out)["stage"], "aborted", "{out}");
        assert_eq!(std::fs::read(root.join(c.cert)).unwrap(), old_cert, "{out}");
        assert_eq!(std::fs::read(root.join(c.key)).unwrap(), old_key, "{out}");
        assert!(!root.join(c.next_key()).exists() && !root.join(c.previous_key()).exists());
        assert_eq!(
            verified_by(&root, &old, &t.join(&format!("s{i}/c"))),
            leaves,
            "{out}"
        );
        assert_eq!(history(&root).last().unwrap(), "aborted");
        if c.name == "ca" {
            cluster_files(&root, &[&old], None);
        }
        certrotor(&["check", "--root", s(&root)]).run().ok();
        // A new rotation may begin after an abort.
        ca("rotate", c, &root).run().ok();
    }
}

/// What a rotation refuses, each with exit 2 (64 for usage) and nothing changed.
#[test]
fn ca_rotate_refuses_what_it_cannot_do_and_changes_nothing() {
    let (t, root) = lab_in("ca-refuse", &[]);
    // The node's files (certrotor's own state folder aside: a lock file may appear).
    let pki = |r: &Path| listing(&r.join("etc"));
    let before = pki(&root);
    // The cluster CA where a kubeconfig names its CA file instead of embedding it.
    let named = t.join("ca-refuse-named");
    copy_tree(&root, &named);
    let conf = named.join("etc/kubernetes/scheduler.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    let data = crate::util::kubeconfig_value(&text, "certificate-authority-data").unwrap();
    std::fs::write(
        &conf,
        text.replace(
            &format!("certificate-authority-data: {data}"),
            "certificate-authority: /etc/kubernetes/pki/ca.crt",
        ),
    )
    .unwrap();
    let before_named = pki(&named);
    let cluster = ca("rotate", &CLUSTER, &named).run().expect_code(2);
    assert!(
        cluster.stderr.contains("scheduler.conf")
            && cluster
                .stderr
                .contains("does not embed its certificate-authority-data"),
        "{cluster}"
    );
    assert_eq!(pki(&named), before_named, "a refusal changed the node");
    let usage = certrotor(&[
        "ca",
        "rotate",
        "--ca",
        "etcd-ca",
        "--all",
        "--root",
        s(&root),
    ])
    .run()
    .expect_code(64);
    assert!(usage.stderr.contains("--all"), "{usage}");
    for sub in ["continue", "abort"] {
        let out = ca(sub, &ETCD, &root).run().expect_code(2);
        assert!(
            out.stderr.contains("no rotation of etcd-ca is in progress"),
            "{out}"
        );
    }
    assert_eq!(pki(&root), before, "a refusal changed the node");

    // An etcd of more than one member: the stages must take turns across nodes.
    let multi = t.join("multi");
    copy_tree(&root, &multi);
    let manifest = multi.join("etc/kubernetes/manifests/etcd.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("--initial-cluster="))
        .unwrap();
    std::fs::write(
        &manifest,
        text.replace(line, &format!("{line},other=https://127.0.0.9:2380")),
    )
    .unwrap();
    let before = pki(&multi);
    let out = ca("rotate", &ETCD, &multi).run().expect_code(2);
    assert!(
        out.stderr.contains("2 members") && out.stderr.contains("cannot be reached"),
        "{out}"
    );
    assert_eq!(pki(&multi), before);

    // External etcd: the etcd CA is shared by the etcd nodes and the control planes, which
    // take turns through etcd (here out of reach); the front-proxy CA of a control plane of an
    // external etcd is not rotated yet.
    let ext = t.join("external");
    crate::renew_util::lab(&ext, &["--topology", "external-etcd"]);
    for (sub, which, says) in [
        ("control-plane", &ETCD, "cannot be reached"),
        ("etcd", &ETCD, "cannot be reached"),
        (
            "control-plane",
            &FRONT_PROXY,
            "the control planes of an external etcd",
        ),
    ] {
        let r = ext.join(sub);
        let before = pki(&r);
        let out = ca("rotate", which, &r).run().expect_code(2);
        assert!(out.stderr.contains(says), "{sub}: {out}");
        assert_eq!(pki(&r), before, "{out}");
    }

    // One rotation at a time.
    ca("rotate", &ETCD, &root).run().ok();
    let out = ca("rotate", &FRONT_PROXY, &root).run().expect_code(2);
    assert!(
        out.stderr.contains("a rotation of etcd-ca is in progress"),
        "{out}"
    );

    // A damaged or future state file is an error naming it, never "no rotation".
    let state = root.join(STATE);
    let good = std::fs::read(&state).unwrap();
    for (bytes, says) in [
        (b"{not json".to_vec(), "is not valid JSON"),
        (
            String::from_utf8(good.clone())
                .unwrap()
                .replacen("\"version\": 1", "\"version\": 9", 1)
                .into_bytes(),
            "is version 9",
        ),
    ] {
        std::fs::write(&state, &bytes).unwrap();
        for args in [
            vec!["ca", "status", "--root", s(&root)],
            vec![
                "ca",
                "continue",
                "--ca",
                "etcd-ca",
                "--root",
                s(&root),
                "--platform",
                "none",
            ],
        ] {
            let out = certrotor(&args).run().expect_code(2);
            assert!(
                out.stderr.contains("ca-rotation.json") && out.stderr.contains(says),
                "{out}"
            );
        }
    }
    std::fs::write(&state, &good).unwrap();
    ca("continue", &ETCD, &root).run().ok();
}

/// A crash (SIGKILL at each of the transactions' steps, in turn) anywhere in `ca rotate` and
/// in `ca continue`: the same command again completes the stage, and the files end as one
/// uninterrupted rotation leaves them.
#[test]
fn ca_rotate_killed_at_every_step_resumes_to_completion() {
    for c in [&FRONT_PROXY, &CLUSTER] {
        killed_at_every_step(c);
    }
}

fn killed_at_every_step(c: &Ca) {
    let (t, pristine) = lab_in(&format!("ca-crash-{}", c.name), &[]);
    let old_text = std::fs::read_to_string(pristine.join(c.cert)).unwrap();
    let mut kills = [0, 0];
    for (phase, sub) in ["rotate", "continue"].into_iter().enumerate() {
        for n in 1.. {
            let root = t.join(&format!("{sub}-{n}"));
            copy_tree(&pristine, &root);
            if phase == 1 {
                ca("rotate", c, &root).run().ok();
            }
            let out = ca(sub, c, &root)
                .env("CERTROTOR_FAILPOINT", &n.to_string())
                .run();
            if out.code() == Some(0) {
                std::fs::remove_dir_all(&root).unwrap();
                break;
            }
            out.expect_sigkill();
            kills[phase] += 1;
            let again = ca(sub, c, &root).run().ok();
            let want = if phase == 0 { "issued" } else { "done" };
            assert_eq!(
                json(&again)["stage"],
                want,
                "crash at failpoint #{n}\n{again}"
            );
            let pems = blocks(&root.join(c.cert));
            assert_eq!(pems.len(), 2 - phase, "#{n}");
            if phase == 0 {
                assert_eq!(pems[1], old_text, "#{n}: the old CA is not the one kept");
            }
            let new = put(&root.join("scratch"), "new.crt", &pems[0]);
            let pubkey = openssl_ok(&["x509", "-noout", "-pubkey", "-in", s(&new)]);
            assert_eq!(pubkey_of_key(&root.join(c.key)), pubkey, "#{n}");
            assert!(
                openssl_verify(&new, &root.join(c.leaf), false).is_ok(),
                "#{n}"
            );
            if c.name == "ca" {
                let old = put(&root.join("scratch"), "old.crt", &old_text);
                match phase {
                    0 => cluster_files(&root, &[&new, &old], Some(&new)),
                    _ => cluster_files(&root, &[&new], None),
                }
            }
            std::fs::remove_dir_all(&root).unwrap();
        }
    }
    eprintln!(
        "FIGURES ca crash ({}): rotate killed at {} steps, continue at {}; each resumed",
        c.name, kills[0], kills[1]
    );
    assert!(
        kills[0] >= 10 && kills[1] >= 5,
        "too few failpoints reached: {kills:?}"
    );
}

// === On a running node: the real etcd, kube-apiserver, controller-manager and scheduler ===

use crate::platform::platform_util::{Node, Platform, RESTART_TIMEOUT};

/// `certrotor ca SUB --ca CA` on the running node (platform kubeadm), JSON report, exit 0.
fn live(node: &Node, sub: &str, c: &Ca) -> Value {
    let args = node.pass_args(
        &["ca", sub, "--ca", c.name],
        node.platform.name(),
        RESTART_TIMEOUT,
        &["--output", "json", "--cluster", "off"],
    );
    let out = node.certrotor_env(
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("CERTROTOR_EVENTS", "on")],
    );
    out.expect(0);
    out.json()
}

/// Creates (or deletes) Node objects labelled as control planes, as other nodes would register.
fn control_plane_nodes(node: &Node, names: &[&str], create: bool) {
    for n in names {
        if create {
            let manifest = format!(
                "{{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{{\"name\":\"{n}\",\
                 \"labels\":{{\"node-role.kubernetes.io/master\":\"\"}}}}}}"
            );
            let file = node.dir.join(format!("{n}.json"));
            std::fs::write(&file, manifest).unwrap();
            node.kubectl_ok(&["create", "-f", file.to_str().unwrap()]);
        } else {
            node.kubectl_ok(&["delete", "node", n]);
        }
    }
}

/// Whether openssl verifies the certificate served on 127.0.0.1:`port` (+ the node's offset)
/// with the CA file `ca` alone, connecting with the client pair `client` (under the kubeadm
/// folder) as it is on disk now.
fn served_verifies(node: &Node, port: u16, ca: &Path, client: &str) -> bool {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-verify_return_error", "-connect"])
        .arg(format!("127.0.0.1:{}", port + node.offset))
        .arg("-CAfile")
        .arg(ca)
        .arg("-cert")
        .arg(node.kfile(&format!("pki/{client}.crt")))
        .arg("-key")
        .arg(node.kfile(&format!("pki/{client}.key")))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    out.status.success()
        && String::from_utf8_lossy(&out.stdout).contains("Verify return code: 0 (ok)")
}

/// The restarts ("manifest removed") of each pod since `before`, as (pod, stopped, started) in
/// milliseconds, in the order they happened; asserts each pod runs again.
fn restarts_since(
    before: &std::collections::BTreeMap<String, testbed::kubelet_sim::PodState>,
    after: &std::collections::BTreeMap<String, testbed::kubelet_sim::PodState>,
) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    for (pod, a) in after {
        let first = before[pod].history.len() - 1;
        let since = &a.history[first..];
        for (i, h) in since.iter().enumerate() {
            if h.reason.as_deref() == Some("manifest removed") {
                let next = since
                    .get(i + 1)
                    .unwrap_or_else(|| panic!("{pod} not started again"));
                out.push((pod.clone(), h.stopped_at_ms.unwrap(), next.started_at_ms));
            }
        }
        assert!(a.running, "{pod} is not running");
    }
    out.sort_by_key(|r| r.1);
    out
}

const KEY: &str = "/certrotor-test/before-the-rotation";

/// What was written before the rotation is read back: from etcd with the healthcheck pair on
/// disk now, and through kube-apiserver.
fn data_kept(node: &Node) {
    let get = node.etcdctl(&["get", KEY, "--print-value-only"]);
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim(),
        "written-before",
        "{get:?}"
    );
    node.kubectl_ok(&["get", "configmap", "before-rotation"]);
}

#[test]
fn ca_rotate_of_the_etcd_ca_on_a_running_node_restarts_one_at_a_time_and_keeps_the_data() {
    etcd_rotation("ca-rotate-etcd", Platform::Kubeadm);
}

/// The same on a Bottlerocket-shaped node (restarts through the API), killed in the middle of
/// trust-in (after its transaction, before its restarts): the same command again makes the
/// restarts it owes.
#[test]
fn ca_rotate_of_the_etcd_ca_on_bottlerocket_resumes_after_a_kill_in_the_middle_of_trust_in() {
    etcd_rotation("ca-rotate-etcd-br", Platform::Bottlerocket);
}

fn etcd_rotation(test: &str, platform: Platform) {
    let node = Node::start(test, platform);
    let c = &ETCD;
    let scratch = node.dir.join("ca-scratch");
    let old = put(
        &scratch,
        "old.crt",
        &std::fs::read_to_string(node.kfile("pki/etcd/ca.crt")).unwrap(),
    );
    let put_ = node.etcdctl(&["put", KEY, "written-before"]);
    assert!(put_.status.success(), "{put_:?}");
    node.kubectl_ok(&[
        "create",
        "configmap",
        "before-rotation",
        "--from-literal=k=v",
    ]);
    assert!(served_verifies(
        &node,
        2379,
        &old,
        "etcd/healthcheck-client"
    ));
    // Two control planes registered: the CA is shared, and rotating across nodes is not built.
    control_plane_nodes(&node, &["cp-a", "cp-b"], true);
    let args = node.pass_args(
        &["ca", "rotate", "--ca", c.name],
        platform.name(),
        RESTART_TIMEOUT,
        &[],
    );
    let refused = node.certrotor(&args.iter().map(String::as_str).collect::<Vec<_>>());
    refused.expect(2);
    assert!(
        refused
            .stderr
            .contains("2 control-plane nodes (cp-a, cp-b)"),
        "{refused}"
    );
    assert_eq!(blocks(&node.kfile("pki/etcd/ca.crt")).len(), 1);
    control_plane_nodes(&node, &["cp-a", "cp-b"], false);
    // kubeadm 1.31+ (v1beta4): the new CA follows the cluster's kubeadm configuration; on the
    // Bottlerocket node there is none, and the new CA follows the old.
    let old_algorithm = x509(&old, "-text")
        .lines()
        .find(|l| l.contains("Public Key Algorithm"))
        .expect("openssl names the old CA's key algorithm")
        .trim()
        .to_string();
    let (policy_algorithm, policy_text) = if old_algorithm.contains("rsa") {
        ("ECDSA-P256", "id-ecPublicKey")
    } else {
        ("RSA-3072", "rsaEncryption")
    };
    if platform == Platform::Kubeadm {
        let config = scratch.join("ClusterConfiguration");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n\
                 caCertificateValidityPeriod: 43800h0m0s\nencryptionAlgorithm: \
                 {policy_algorithm}\n"
            ),
        )
        .unwrap();
        node.kubectl_ok(&[
            "create",
            "configmap",
            "kubeadm-config",
            "--namespace=kube-system",
            &format!("--from-file=ClusterConfiguration={}", config.display()),
        ]);
    }
    let before = node.states();
    let poller = ApiserverPoller::start(&node);

    let started = std::time::Instant::now();
    if platform == Platform::Bottlerocket {
        let args = node.pass_args(
            &["ca", "rotate", "--ca", c.name],
            platform.name(),
            RESTART_TIMEOUT,
            &[],
        );
        let killed = node.certrotor_env(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            &[("CERTROTOR_FAILPOINT", "journal-removed")],
        );
        assert_eq!(killed.code, None, "not killed: {killed}");
        assert!(
            killed
                .stderr
                .contains("CERTROTOR-FAILPOINT journal-removed"),
            "{killed}"
        );
        assert_eq!(blocks(&node.kfile("pki/etcd/ca.crt")).len(), 2, "{killed}");
        let owed = std::fs::read_to_string(node.pass_state()).unwrap_or_default();
        assert!(
            owed.contains("etcd") && owed.contains("kube-apiserver"),
            "nothing owed: {owed}"
        );
    }
    let r = live(&node, "rotate", c);
    let rotate_s = started.elapsed().as_secs_f64();
    assert_eq!(r["stage"], "issued", "{r:#}");
    assert_eq!(
        r["stages"][0]["restarted"],
        serde_json::json!(["etcd", "kube-apiserver"]),
        "{r:#}"
    );
    let pems = blocks(&node.kfile("pki/etcd/ca.crt"));
    let new = put(&scratch, "new.crt", &pems[0]);
    let new_text = x509(&new, "-text");
    if platform == Platform::Kubeadm {
        assert!(new_text.contains(policy_text), "{new_text}");
        let o = crate::util::Ossl::read(&new);
        assert_eq!(
            o.not_after - o.not_before,
            43800 * 3600,
            "validity of the new CA"
        );
    } else {
        assert!(new_text.contains(&old_algorithm), "{new_text}");
    }
    // Served now: certificates of the new CA, which the old CA alone no longer verifies.
    for (port, client) in [(2379, "etcd/healthcheck-client"), (2380, "etcd/peer")] {
        assert!(
            served_verifies(&node, port, &new, client),
            "{port}: not of the new CA"
        );
        assert!(
            !served_verifies(&node, port, &old, client),
            "{port}: still of the old CA"
        );
    }
    data_kept(&node);

    let started = std::time::Instant::now();
    let r = live(&node, "continue", c);
    let continue_s = started.elapsed().as_secs_f64();
    assert_eq!(r["stage"], "done", "{r:#}");
    assert_eq!(
        blocks(&node.kfile("pki/etcd/ca.crt")),
        [std::fs::read_to_string(&new).unwrap()]
    );
    // Served: the new CA's certificates, which the old CA alone does not verify.
    for (port, client) in [(2379, "etcd/healthcheck-client"), (2380, "etcd/peer")] {
        assert!(served_verifies(
            &node,
            port,
            &node.kfile("pki/etcd/ca.crt"),
            client
        ));
        assert!(!served_verifies(&node, port, &old, client), "{port}");
    }
    data_kept(&node);
    node.wait_all_healthy();
    // Each stage reached is a Kubernetes Event on the node.
    let reasons = node.kubectl_ok(&[
        "get",
        "events",
        "--namespace=default",
        "--field-selector=reason=CARotationStage",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    for stage in ["trusted", "issued", "done"] {
        assert!(
            reasons.contains(&format!("etcd-ca reached stage {stage}")),
            "{reasons}"
        );
    }

    let (polled_ms, down_ms) = poller.stop();
    // Restarts: etcd and kube-apiserver once at trust-in and once at trust-out, one at a time.
    let restarts = restarts_since(&before, &node.states());
    let count = |pod: &str| restarts.iter().filter(|r| r.0 == pod).count();
    assert_eq!(
        (count("etcd"), count("kube-apiserver")),
        (2, 2),
        "{restarts:?}"
    );
    assert_eq!(
        count("kube-controller-manager") + count("kube-scheduler"),
        0,
        "{restarts:?}"
    );
    for w in restarts.windows(2) {
        assert!(w[0].2 <= w[1].1, "two pods down at once: {restarts:?}");
    }
    let down = |pod: &str| {
        restarts
            .iter()
            .filter(|r| r.0 == pod)
            .map(|r| r.2 - r.1)
            .sum::<u64>()
    };
    eprintln!(
        "FIGURES ca rotate etcd-ca ({}, one node, real etcd + kube-apiserver v1.20.2): trust-in + issue \
         {rotate_s:.1} s, trust-out {continue_s:.1} s; restarts etcd 2, kube-apiserver 2, others 0; \
         etcd down {} ms, kube-apiserver down {} ms in all (process stop to start); kube-apiserver \
         /readyz polled every 100 ms: not ready {down_ms} ms of {polled_ms} ms",
        platform.name(),
        down("etcd"),
        down("kube-apiserver")
    );
}

/// Polls kube-apiserver's `/readyz` every 100 ms (the credentials on disk when it starts: the
/// etcd CA's rotation does not change them) until stopped: (milliseconds polled, milliseconds
/// from a failed poll to the next good one: the time it was not ready).
struct ApiserverPoller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u128, u128)>,
}

impl ApiserverPoller {
    fn start(node: &Node) -> ApiserverPoller {
        Self::start_with(node, false)
    }

    /// `fresh`: the credentials are read from disk again at each poll (the cluster CA's rotation
    /// changes the CA that verifies the apiserver and the client pair), and a failed poll is
    /// tried again once with credentials read again (a pair read in the middle of its renewal).
    fn start_with(node: &Node, fresh: bool) -> ApiserverPoller {
        let first = node.probe("kube-apiserver");
        let reread = fresh.then(|| node.apiserver_prober());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let begun = std::time::Instant::now();
            let mut down_since: Option<std::time::Instant> = None;
            let mut down = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let once = |p: &certrotor::restart::verify::Probe| {
                    certrotor::restart::verify::probe(p).is_ok_and(|o| o.healthy())
                };
                let ok = match &reread {
                    None => once(&first),
                    Some(fresh) => once(&fresh()) || once(&fresh()),
                };
                match (ok, down_since) {
                    (false, None) => down_since = Some(std::time::Instant::now()),
                    (true, Some(t)) => {
                        down += t.elapsed().as_millis();
                        down_since = None;
                    }
                    _ => {}
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            down += down_since.map_or(0, |t| t.elapsed().as_millis());
            (begun.elapsed().as_millis(), down)
        });
        ApiserverPoller { stop, thread }
    }

    fn stop(self) -> (u128, u128) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

#[test]
fn ca_rotate_of_the_front_proxy_ca_waits_for_the_apiserver_to_publish_each_bundle() {
    let node = Node::start("ca-rotate-fp", Platform::Kubeadm);
    let c = &FRONT_PROXY;
    let published = || -> Vec<String> {
        let out = node.kubectl_ok(&[
            "get",
            "configmap",
            "--namespace=kube-system",
            "extension-apiserver-authentication",
            "-o",
            "jsonpath={.data.requestheader-client-ca-file}",
        ]);
        out.split_inclusive("-----END CERTIFICATE-----")
            .filter(|b| b.contains("BEGIN"))
            .map(|b| b.split_whitespace().collect())
            .collect()
    };
    let squash = |pems: Vec<String>| -> Vec<String> {
        pems.iter()
            .map(|b| b.split_whitespace().collect())
            .collect()
    };
    let before = node.states();
    let r = live(&node, "rotate", c);
    assert_eq!(r["stage"], "issued", "{r:#}");
    let waited_in = r["stages"][0]["published_after_ms"]
        .as_u64()
        .expect("waited for the bundle");
    // Waited for: the published bundle is the file's [old, new] as soon as the command returns.
    let mut file = squash(blocks(&node.kfile("pki/front-proxy-ca.crt")));
    let mut got = published();
    file.sort();
    got.sort();
    assert_eq!(got, file, "{r:#}");
    assert_eq!(got.len(), 2);
    let r = live(&node, "continue", c);
    assert_eq!(r["stage"], "done", "{r:#}");
    let waited_out = r["stages"][0]["published_after_ms"]
        .as_u64()
        .expect("waited");
    assert_eq!(
        published(),
        squash(blocks(&node.kfile("pki/front-proxy-ca.crt")))
    );
    let new = node.kfile("pki/front-proxy-ca.crt");
    openssl_verify(&new, &node.kfile("pki/front-proxy-client.crt"), true).unwrap();
    // Nothing restarted: the apiserver reloads both files.
    assert!(restarts_since(&before, &node.states()).is_empty());
    eprintln!(
        "FIGURES ca rotate front-proxy-ca (real kube-apiserver v1.20.2): published [old, new] \
         {waited_in} ms after trust-in, [new] {waited_out} ms after trust-out; no restart"
    );
}

/// Waits (bounded) until kube-controller-manager publishes ConfigMap `kube-root-ca.crt` (what
/// pods trust the apiserver with) holding the certificates of `cas` (any order).
fn root_ca_published(node: &Node, cas: &[&Path]) {
    let squash = |t: &str| -> String { t.split_whitespace().collect() };
    let mut want: Vec<String> = cas
        .iter()
        .map(|p| squash(&std::fs::read_to_string(p).unwrap()))
        .collect();
    want.sort();
    let mut got = vec![];
    for _ in 0..600 {
        let out = node.kubectl(&[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        got = text
            .split_inclusive("-----END CERTIFICATE-----")
            .filter(|b| b.contains("BEGIN"))
            .map(squash)
            .collect();
        got.sort();
        if got == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    panic!(
        "kube-root-ca.crt holds {} certificate(s), not the {} wanted",
        got.len(),
        want.len()
    );
}

/// A CSR for a client certificate, approved, as kube-controller-manager signs it: the signed
/// certificate in `dir/<name>.crt` (bounded polling: the controller may be taking its lease).
fn csr_signed(node: &Node, dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join(format!("{name}.key"));
    let req = dir.join(format!("{name}.csr"));
    let subject = format!("/CN={name}");
    let mut args = vec!["req", "-new"];
    args.extend(crate::renew_util::new_p256_key(s(&key)));
    args.extend(["-subj", &subject, "-out", s(&req)]);
    openssl_ok(&args);
    let request = openssl_ok(&["base64", "-A", "-in", s(&req)])
        .trim()
        .to_string();
    let manifest = dir.join(format!("{name}.json"));
    std::fs::write(
        &manifest,
        format!(
            "{{\"apiVersion\":\"certificates.k8s.io/v1\",\"kind\":\"CertificateSigningRequest\",\
             \"metadata\":{{\"name\":\"{name}\"}},\"spec\":{{\"request\":\"{request}\",\
             \"signerName\":\"kubernetes.io/kube-apiserver-client\",\"usages\":[\"client auth\"]}}}}"
        ),
    )
    .unwrap();
    node.kubectl_ok(&["create", "-f", s(&manifest)]);
    node.kubectl_ok(&["certificate", "approve", name]);
    let cert = dir.join(format!("{name}.crt"));
    for _ in 0..600 {
        let out = node.kubectl(&["get", "csr", name, "-o", "jsonpath={.status.certificate}"]);
        let b64 = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !b64.is_empty() {
            std::fs::write(&cert, crate::util::base64_decode(&b64)).unwrap();
            return cert;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let csr = node.kubectl(&["get", "csr", name, "-o", "yaml"]);
    panic!("kube-controller-manager did not sign CSR {name} in 600 polls: {csr:?}");
}

/// The cluster CA on a running node (the real etcd, kube-apiserver, kube-controller-manager and
/// kube-scheduler v1.20.2): kube-controller-manager signs CSRs all along, from the new CA once
/// it signs; kube-apiserver is never restarted and serves a certificate of the new CA.
#[test]
fn ca_rotate_of_the_cluster_ca_keeps_the_apiserver_and_the_csr_signer_serving() {
    cluster_rotation("ca-rotate-cluster", Platform::Kubeadm);
}

/// The same on a Bottlerocket-shaped node, where kube-controller-manager's manifest and the
/// kubelet's trust are settings of the API (apiserver-sim): the signer moves through
/// `settings.kubernetes.static-pods.kube-controller-manager.manifest`, the kubelet's client CA
/// follows the CA file through `settings.kubernetes.cluster-certificate` (rendered to
/// `/etc/kubernetes/pki/ca.crt`, the kubelet restarted by the API at trust-in and at trust-out,
/// not at the issue), and each command killed once between its file and its setting finishes
/// when run again.
#[test]
fn ca_rotate_of_the_cluster_ca_on_bottlerocket_moves_the_signer_and_the_kubelet_trust_through_the_api()
 {
    cluster_rotation("ca-rotate-cluster-br", Platform::Bottlerocket);
}

/// The value of `--cluster-signing-cert-file` in kube-controller-manager's manifest as the
/// kubelet runs it.
fn signing_file(node: &Node) -> String {
    let manifest =
        std::fs::read_to_string(node.kubelet_manifest("kube-controller-manager")).unwrap();
    manifest
        .split_whitespace()
        .find_map(|w| w.strip_prefix("--cluster-signing-cert-file="))
        .unwrap_or_else(|| panic!("no signer flag in {manifest}"))
        .trim_matches('"')
        .to_string()
}

/// Bottlerocket: the live `settings.kubernetes.cluster-certificate` and the file the API
/// rendered from it, each as its certificates' PEM blocks, sorted.
fn kubelet_trust(node: &Node) -> (Vec<String>, Vec<String>) {
    let live = node
        .api()
        .setting("settings.kubernetes.cluster-certificate")
        .unwrap()
        .expect("cluster-certificate set");
    let pem = crate::util::base64_decode(live.as_str().unwrap());
    let dir = node.dir.join("ca-scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cluster-certificate.pem");
    std::fs::write(&file, pem).unwrap();
    let mut setting = blocks(&file);
    let mut rendered = blocks(&node.root.join("etc/kubernetes/pki/ca.crt"));
    setting.sort();
    rendered.sort();
    (setting, rendered)
}

/// Bottlerocket: `ca <sub>` killed at `failpoint`, then run again to the end.
fn killed_then_again(node: &Node, sub: &str, c: &Ca, failpoint: &str) -> Value {
    let args = node.pass_args(
        &["ca", sub, "--ca", c.name],
        "bottlerocket",
        RESTART_TIMEOUT,
        &["--output", "json", "--cluster", "off"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let killed = node.certrotor_env(&args, &[("CERTROTOR_FAILPOINT", failpoint)]);
    assert_eq!(killed.code, None, "not killed: {killed}");
    assert!(
        killed
            .stderr
            .contains(&format!("CERTROTOR-FAILPOINT {failpoint}")),
        "{killed}"
    );
    live(node, sub, c)
}

/// An abort after the issue on a Bottlerocket-shaped node, while the API restarts after
/// committing the kubelet's trust (its applier lost: nothing rendered) and drops its answer to
/// the signer's manifest change: certrotor runs the applier again, and the node is back on the
/// old CA alone, its settings too (the kubelet restarted at trust-in and at the abort).
#[test]
fn ca_abort_of_the_cluster_ca_on_bottlerocket_restores_the_settings_through_a_restarting_api() {
    let node = Node::start("ca-abort-cluster-br", Platform::Bottlerocket);
    let c = &CLUSTER;
    let scratch = node.dir.join("ca-scratch");
    let old_pem = std::fs::read_to_string(node.kfile("pki/ca.crt")).unwrap();
    let old = put(&scratch, "old.crt", &old_pem);
    let signing_before = signing_file(&node);
    let manifest_key = "settings.kubernetes.static-pods.kube-controller-manager.manifest";
    let manifest_before = node.api().setting(manifest_key).unwrap().unwrap();
    let restarts_before = node.kubelet_restart_count();
    let leaves = verified_by(&node.root, &old, &scratch.join("before"));
    let r = live(&node, "rotate", c);
    assert_eq!(r["stage"], "issued", "{r:#}");
    assert_eq!(node.kubelet_restart_count() - restarts_before, 1);
    assert!(!served_verifies(
        &node,
        6443,
        &old,
        "apiserver-kubelet-client"
    ));

    node.api_faults(&serde_json::json!({"restarts": [
        {"method": "POST", "path": "/tx/commit_and_apply",
         "sets": "settings.kubernetes.cluster-certificate", "when": "after"},
        {"method": "POST", "path": "/tx/commit_and_apply", "sets": manifest_key,
         "when": "no-response"},
    ]}));
    let r = live(&node, "abort", c);
    assert_eq!(r["stage"], "aborted", "{r:#}");
    assert_eq!(
        blocks(&node.kfile("pki/ca.crt")),
        std::slice::from_ref(&old_pem)
    );
    assert_eq!(signing_file(&node), signing_before);
    assert!(!node.kfile("pki/ca.signer.crt").exists());
    assert_eq!(
        node.api().setting(manifest_key).unwrap().unwrap(),
        manifest_before,
        "the signer's manifest setting is EKS Anywhere's again"
    );
    let (setting, rendered) = kubelet_trust(&node);
    assert_eq!(setting, std::slice::from_ref(&old_pem));
    assert_eq!(rendered, setting);
    assert_eq!(node.kubelet_restart_count() - restarts_before, 2);
    let events = node.api_events();
    let fired = |what: &str| {
        events
            .iter()
            .any(|e| e["kind"] == "fault" && e["detail"].as_str().unwrap_or("").contains(what))
    };
    assert!(
        fired("settings.kubernetes.cluster-certificate") && fired(manifest_key),
        "{events:#?}"
    );
    let lost = events.iter().any(|e| {
        e["kind"] == "apply-lost"
            && e["detail"]
                .as_str()
                .unwrap_or("")
                .contains("cluster-certificate")
    });
    assert!(
        lost,
        "the kubelet trust's applier was not lost: {events:#?}"
    );
    // Every leaf is the old CA's again, served too.
    assert_eq!(
        verified_by(&node.root, &old, &scratch.join("after")),
        leaves
    );
    assert!(served_verifies(
        &node,
        6443,
        &old,
        "apiserver-kubelet-client"
    ));
    node.wait_all_healthy();
}

fn cluster_rotation(test: &str, platform: Platform) {
    let node = Node::start(test, platform);
    let br = platform == Platform::Bottlerocket;
    let c = &CLUSTER;
    let scratch = node.dir.join("ca-scratch");
    let old = put(
        &scratch,
        "old.crt",
        &std::fs::read_to_string(node.kfile("pki/ca.crt")).unwrap(),
    );
    node.kubectl_ok(&[
        "create",
        "configmap",
        "before-rotation",
        "--from-literal=k=v",
    ]);
    let signed = csr_signed(&node, &scratch, "before");
    openssl_verify(&old, &signed, false).unwrap();
    let client = "apiserver-kubelet-client";
    assert!(served_verifies(&node, 6443, &old, client));
    let before = node.states();
    let poller = ApiserverPoller::start_with(&node, true);

    let signing_before = signing_file(&node);
    assert!(signing_before.ends_with("/ca.crt"), "{signing_before}");
    if br {
        let (setting, rendered) = kubelet_trust(&node);
        assert_eq!(setting, [std::fs::read_to_string(&old).unwrap()]);
        assert_eq!(rendered, setting);
    }
    let restarts_before = node.kubelet_restart_count();

    let started = std::time::Instant::now();
    let r = match br {
        true => killed_then_again(&node, "rotate", c, "ca-signer-file-written"),
        false => live(&node, "rotate", c),
    };
    let rotate_s = started.elapsed().as_secs_f64();
    assert_eq!(r["stage"], "issued", "{r:#}");
    // The issue waited until kube-apiserver trusted the new CA's clients (it publishes what it
    // loaded): without the wait it refused them for about 50 s.
    let waited_in = r["stages"][0]["published_after_ms"]
        .as_u64()
        .expect("waited for kube-apiserver to load [old, new]");
    let pems = blocks(&node.kfile("pki/ca.crt"));
    assert_eq!(pems.len(), 2, "{r:#}");
    let new = put(&scratch, "new.crt", &pems[0]);
    // kube-controller-manager runs with its own signer file and signs with the new CA.
    assert_eq!(
        signing_file(&node),
        signing_before.replace("/ca.crt", "/ca.signer.crt")
    );
    if br {
        // The kubelet trusts [old, new], restarted once (the issue's [new, old] is the same
        // trust).
        let (setting, rendered) = kubelet_trust(&node);
        let mut both = pems.clone();
        both.sort();
        assert_eq!(setting, both);
        assert_eq!(rendered, both);
        assert_eq!(node.kubelet_restart_count() - restarts_before, 1, "{r:#}");
    }
    root_ca_published(&node, &[&old, &new]);
    let signed = csr_signed(&node, &scratch, "issued");
    openssl_verify(&new, &signed, false).unwrap();
    assert!(openssl_verify(&old, &signed, false).is_err());
    assert!(served_verifies(&node, 6443, &new, client));
    assert!(!served_verifies(&node, 6443, &old, client));
    node.kubectl_ok(&["get", "configmap", "before-rotation"]);

    let started = std::time::Instant::now();
    let r = match br {
        true => killed_then_again(&node, "continue", c, "ca-signer-restored"),
        false => live(&node, "continue", c),
    };
    let continue_s = started.elapsed().as_secs_f64();
    assert_eq!(r["stage"], "done", "{r:#}");
    assert_eq!(
        blocks(&node.kfile("pki/ca.crt")),
        [std::fs::read_to_string(&new).unwrap()]
    );
    assert_eq!(signing_file(&node), signing_before);
    assert!(!node.kfile("pki/ca.signer.crt").exists());
    if br {
        let (setting, rendered) = kubelet_trust(&node);
        assert_eq!(setting, [std::fs::read_to_string(&new).unwrap()]);
        assert_eq!(rendered, setting);
        assert_eq!(node.kubelet_restart_count() - restarts_before, 2, "{r:#}");
        // The signer's setting names the CA file again, as EKS Anywhere wrote it.
        let live = node
            .api()
            .setting("settings.kubernetes.static-pods.kube-controller-manager.manifest")
            .unwrap()
            .unwrap();
        let text = String::from_utf8(crate::util::base64_decode(live.as_str().unwrap())).unwrap();
        assert!(
            text.contains(&format!("--cluster-signing-cert-file={signing_before}")),
            "{text}"
        );
    }
    root_ca_published(&node, &[&new]);
    let signed = csr_signed(&node, &scratch, "done");
    openssl_verify(&new, &signed, false).unwrap();
    // After trust-out the old CA alone verifies no live certificate, served or on disk.
    assert!(served_verifies(&node, 6443, &new, client));
    assert!(!served_verifies(&node, 6443, &old, client));
    let on_disk = verified_by(&node.root, &old, &scratch.join("after"));
    assert!(on_disk.is_empty(), "{on_disk:?}");
    node.kubectl_ok(&["get", "configmap", "before-rotation"]);
    node.wait_all_healthy();

    let (polled_ms, down_ms) = poller.stop();
    let restarts = restarts_since(&before, &node.states());
    let count = |pod: &str| restarts.iter().filter(|r| r.0 == pod).count();
    assert_eq!(count("kube-apiserver") + count("etcd"), 0, "{restarts:?}");
    assert!(count("kube-controller-manager") >= 2, "{restarts:?}");
    for w in restarts.windows(2) {
        assert!(w[0].2 <= w[1].1, "two pods down at once: {restarts:?}");
    }
    eprintln!(
        "FIGURES ca rotate ca ({} node, real etcd, kube-apiserver, controller-manager, \
         scheduler v1.20.2): kubelet restarts by the API {}; trust-in + issue {rotate_s:.1} s \
         (kube-apiserver loaded [old, new] after {waited_in} ms), trust-out {continue_s:.1} s; restarts \
         kube-controller-manager {}, kube-scheduler {}, kube-apiserver 0, etcd 0; kube-apiserver \
         /readyz polled every 100 ms: not ready {down_ms} ms of {polled_ms} ms",
        platform.name(),
        node.kubelet_restart_count() - restarts_before,
        count("kube-controller-manager"),
        count("kube-scheduler")
    );
}

/// A process named `kubelet` reading the node's kubelet.conf (`--kubeconfig`), started now
/// (perl, which Debian always has and which keeps the name it is given; pyenv's python3
/// re-executes itself under its own).
fn fake_kubelet(root: &Path) -> std::process::Child {
    let conf = root.join("etc/kubernetes/kubelet.conf");
    std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec -a kubelet perl -e 'sleep 600' -- --kubeconfig={}",
            conf.display()
        ))
        .spawn()
        .expect("bash and perl run")
}

/// The cluster CA where a kubelet runs: it reads kubelet.conf's CA once, at start, so trust-in
/// does not end while a kubelet started before kubelet.conf changed runs (it would refuse the
/// apiserver's certificate of the new CA); once it has been restarted, the rotation goes on, and
/// the issue (the same certificates in kubelet.conf) does not ask for another restart.
#[test]
fn ca_rotate_of_the_cluster_ca_waits_for_the_kubelet_to_read_its_new_kubeconfig() {
    let (_t, root) = lab_in("ca-kubelet", &[]);
    let mut old_kubelet = fake_kubelet(&root);
    // Started a second before the rotation changes kubelet.conf (times are in seconds).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let held = ca("rotate", &CLUSTER, &root).run();
    assert_ne!(held.code(), Some(0), "{held}");
    assert!(
        held.stderr
            .contains(&format!("the kubelet (PID {})", old_kubelet.id()))
            && held.stderr.contains("systemctl restart kubelet"),
        "{held}"
    );
    assert_eq!(history(&root), ["trust-in"], "{held}");
    assert_eq!(blocks(&root.join(CLUSTER.cert)).len(), 2);
    old_kubelet.kill().unwrap();
    old_kubelet.wait().unwrap();
    let mut kubelet = fake_kubelet(&root);
    let out = ca("rotate", &CLUSTER, &root).run();
    let _ = kubelet.kill();
    let _ = kubelet.wait();
    assert_eq!(json(&out.ok())["stage"], "issued");
    let out = ca("continue", &CLUSTER, &root).run().ok();
    assert_eq!(json(&out)["stage"], "done", "{out}");
}
