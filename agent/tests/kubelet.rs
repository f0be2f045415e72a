//! The kubelet's certificates (issue 11.4): the client certificate reissued from the cluster CA
//! as the kubelet's own rotation installs it (a new dated file, the `kubelet-client-current.pem`
//! link swapped), in the renew transaction with backup and rollback; refused on a node without
//! the CA key; the expired self-signed serving pair backed up and removed; and the new
//! credentials accepted by the real kube-apiserver v1.20.2 as `system:node:<name>`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::renew_util::*;

const PKI: &str = "var/lib/kubelet/pki";
const LINK: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";

/// The link's target as the kubelet wrote it (absolute, as on the node).
fn link_target(root: &Path) -> String {
    fs::read_link(root.join(LINK))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// The file the link names, under the node root.
fn linked_file(root: &Path) -> PathBuf {
    root.join(link_target(root).trim_start_matches('/'))
}

/// The dated client files in the cert dir.
fn dated_files(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root.join(PKI))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("kubelet-client-2"))
        .collect();
    v.sort();
    v
}

/// openssl's view of a certificate file: (subject, text).
fn x509_text(pem: &Path) -> (String, String) {
    let subject = openssl(&[
        "x509",
        "-in",
        s(pem),
        "-noout",
        "-subject",
        "-nameopt",
        "compat",
    ]);
    let text = openssl(&["x509", "-in", s(pem), "-noout", "-text"]);
    (subject.trim().to_string(), text)
}

/// The public key of the certificate and of the key in one combined PEM file, by openssl.
fn pair_public_keys(pem: &Path) -> (String, String) {
    let cert = openssl(&["x509", "-in", s(pem), "-noout", "-pubkey"]);
    let key = openssl(&["pkey", "-in", s(pem), "-pubout"]);
    (cert, key)
}

/// Checks the file the link names holds what the kubelet's CSR gets from the signer.
#[track_caller]
fn assert_kubelet_client(root: &Path, ca: &Path, node: &str, key_type: &str) {
    let pem = linked_file(root);
    let verified = openssl(&["verify", "-CAfile", s(ca), "-purpose", "sslclient", s(&pem)]);
    assert!(verified.trim().ends_with(": OK"), "{verified}");
    let (subject, text) = x509_text(&pem);
    assert_eq!(
        subject,
        format!("subject=/O=system:nodes/CN=system:node:{node}")
    );
    assert!(
        text.contains(
            "X509v3 Extended Key Usage: \n                TLS Web Client Authentication\n"
        ),
        "client auth only:\n{text}"
    );
    assert!(
        text.contains("Digital Signature, Key Encipherment"),
        "key usage:\n{text}"
    );
    assert!(text.contains("CA:FALSE"), "{text}");
    assert!(
        !text.contains("Subject Alternative Name"),
        "no SANs:\n{text}"
    );
    assert!(text.contains(key_type), "key type {key_type}:\n{text}");
    let (c, k) = pair_public_keys(&pem);
    assert_eq!(c, k, "the key in the file matches its certificate");
    let mode = fs::metadata(&pem).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "written 0600 as the kubelet writes it");
}

/// An expired control-plane node: `check` lists both kubelet certificates as expired, `renew`
/// reissues the client certificate (new dated file, link swapped, old file kept), removes the
/// expired serving pair and backs both up; `rollback` restores the old link, the serving pair,
/// and removes the new file.
#[test]
fn expired_kubelet_client_is_reissued_linked_and_rolled_back() {
    let (_t, root) = lab_in(
        "kubelet-client",
        &["--expires-in", "-2d", "--key-algorithm", "ecdsa-p256"],
    );
    let ca = root.join("etc/kubernetes/pki/ca.crt");
    let old_target = link_target(&root);
    let old_serving = fs::read(root.join(PKI).join("kubelet.crt")).unwrap();
    let old_serving_key = fs::read(root.join(PKI).join("kubelet.key")).unwrap();

    let check = certrotor(&["check", "--root", s(&root), "--output", "json"]).run();
    let inv: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
    let status = |name: &str| {
        inv["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} in check:\n{check}"))["status"]
            .clone()
    };
    assert_eq!(status("kubelet-client"), "expired");
    assert_eq!(status("kubelet-serving"), "expired");

    let plan = certrotor(&["renew", "--root", s(&root), "--dry-run"])
        .run()
        .ok();
    assert!(
        plan.stdout
            .contains("Would reissue kubelet-client (expired) for system:node:cp-1"),
        "{plan}"
    );
    assert!(
        plan.stdout
            .contains("Would remove the expired kubelet-serving"),
        "{plan}"
    );
    assert_eq!(link_target(&root), old_target, "a dry run writes nothing");

    let out = certrotor(&["renew", "--root", s(&root), "--output", "json"])
        .run()
        .ok();
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let new_file = report["kubelet"]["client"]["new_file"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}"))
        .to_string();
    let backup = report["backup_id"].as_str().unwrap().to_string();
    // The kubelet's naming and link: absolute target, a new dated file, the old one kept.
    assert_eq!(link_target(&root), format!("/{new_file}"));
    assert_ne!(link_target(&root), old_target);
    let name = new_file.rsplit('/').next().unwrap();
    assert!(
        name.len() == "kubelet-client-2026-01-01-00-00-00.pem".len()
            && name.starts_with("kubelet-client-2"),
        "{name}"
    );
    assert_eq!(dated_files(&root).len(), 2, "{:?}", dated_files(&root));
    assert!(
        fs::symlink_metadata(root.join(LINK))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_kubelet_client(&root, &ca, "cp-1", "id-ecPublicKey");
    assert!(
        !root.join(PKI).join("kubelet-client-updated.pem").exists(),
        "no leftover link"
    );
    // The expired serving pair: removed, and in the backup.
    assert!(!root.join(PKI).join("kubelet.crt").exists());
    assert!(!root.join(PKI).join("kubelet.key").exists());
    let saved = root.join(format!(
        "var/lib/certrotor/backups/{backup}/files/{PKI}/kubelet.crt"
    ));
    assert_eq!(fs::read(&saved).unwrap(), old_serving);
    // check: the client certificate is fine now; the serving pair waits for the kubelet.
    let check = certrotor(&["check", "--root", s(&root), "--output", "json"]).run();
    let inv: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
    let rec = inv["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "kubelet-client")
        .unwrap()
        .clone();
    assert_eq!(rec["status"], "ok", "{rec}");

    // Rollback: the previous link, the serving pair, and the new file gone.
    let rb = certrotor(&["rollback", "--root", s(&root), "--backup", &backup])
        .run()
        .ok();
    assert_eq!(link_target(&root), old_target, "{rb}");
    assert!(
        !root.join(&new_file).exists(),
        "the new dated file is removed"
    );
    assert_eq!(dated_files(&root).len(), 1);
    assert_eq!(
        fs::read(root.join(PKI).join("kubelet.crt")).unwrap(),
        old_serving
    );
    assert_eq!(
        fs::read(root.join(PKI).join("kubelet.key")).unwrap(),
        old_serving_key
    );
}

/// A node whose client certificate is due (not expired) with an RSA key (kubeadm's first pair):
/// the new key is RSA too; the valid serving pair stays.
#[test]
fn due_kubelet_client_keeps_its_key_type() {
    let (_t, root) = lab_in(
        "kubelet-rsa",
        &["--expires-in", "30d", "--key-algorithm", "rsa-2048"],
    );
    let old_target = link_target(&root);
    certrotor(&["renew", "--root", s(&root)]).run().ok();
    assert_ne!(link_target(&root), old_target);
    assert_kubelet_client(
        &root,
        &root.join("etc/kubernetes/pki/ca.crt"),
        "cp-1",
        "rsaEncryption",
    );
    assert!(
        root.join(PKI).join("kubelet.crt").exists(),
        "a valid serving pair stays"
    );
}

/// `renew --reuse-keys` keeps every key, the kubelet client's too (the kubelet's own rotation
/// makes a new one; an operator who asks to keep keys gets that here as well).
#[test]
fn reuse_keys_keeps_the_kubelet_client_key() {
    let t = TempDir::new("kubelet-reuse");
    let root = lab(&t.join("node"), &["--expires-in", "30d"]);
    let old_file = linked_file(&root);
    let (_, old_key) = pair_public_keys(&old_file);
    let out = certrotor(&["renew", "--root", s(&root), "--all", "--reuse-keys"])
        .run()
        .ok()
        .says(&["reissued kubelet-client", "keeping its"]);
    assert!(
        !out.stdout.contains("new RSA") && !out.stdout.contains("new ECDSA"),
        "no new key\n{out}"
    );
    let new_file = linked_file(&root);
    assert_ne!(new_file, old_file, "a new dated file is linked");
    let (cert_key, new_key) = pair_public_keys(&new_file);
    assert_eq!(new_key, old_key, "the kubelet client key is kept");
    assert_eq!(cert_key, new_key, "the new certificate is for the kept key");
    assert_kubelet_client(
        &root,
        &root.join("etc/kubernetes/pki/ca.crt"),
        "cp-1",
        "rsaEncryption",
    );
}

/// Without the cluster CA key (a worker, or a control plane whose CA key is kept elsewhere), the
/// client certificate is not reissued, nothing of the kubelet's is touched, and the output
/// says why and what to do instead (never admin.conf's credentials).
#[test]
fn node_without_the_ca_key_refuses_with_what_to_do() {
    let t = TempDir::new("kubelet-noca");
    let root = lab(&t.join("node"), &["--expires-in", "-2d"]);
    fs::remove_file(root.join("etc/kubernetes/pki/ca.key")).unwrap();
    let old_target = link_target(&root);
    let out = certrotor(&["renew", "--root", s(&root), "--cert", "kubelet-client"]).run();
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        text.contains("not renewed kubelet-client")
            && text.contains("is not on this node")
            && text.contains("bootstrap")
            && text.contains("admin.conf"),
        "{out}"
    );
    assert_eq!(link_target(&root), old_target);
    assert_eq!(dated_files(&root).len(), 1);
}

/// The renewed kubelet credentials against the real kube-apiserver v1.20.2
/// (`--authorization-mode=Node,RBAC`, run by kubelet-sim from the lab node's manifest, with
/// Debian's etcd): a node switched off past every expiry is renewed by `certrotor renew`; the
/// old kubelet certificate is refused (Unauthorized), the new one reads its own node object,
/// and a forbidden request names the identity the apiserver gave it: `system:node:cp-1`.
#[test]
fn renewed_kubelet_credentials_are_accepted_by_the_real_apiserver() {
    testkit::prereq::require_tools(
        "renewed_kubelet_credentials_are_accepted_by_the_real_apiserver",
        &[("etcd", "etcd-server")],
    );
    let kubectl = testkit::k8s::kubectl_path();
    let t = TempDir::new("kubelet-real");
    let off = crate::cluster::offsets(1)[0];
    let root = lab(
        &t.join("node"),
        &[
            "--advertise-address",
            "127.0.0.1",
            "--expires-in",
            "-2d",
            "--key-algorithm",
            "ecdsa-p256",
            "--port-offset",
            &off.to_string(),
        ],
    );
    let old_pem = fs::read(linked_file(&root)).unwrap();
    // Switched off past every expiry: renew everything before anything starts.
    let out = certrotor(&["renew", "--root", s(&root)]).run().ok();
    assert!(out.stdout.contains("Reissued kubelet-client"), "{out}");

    // etcd and the real kube-apiserver only.
    for m in ["kube-controller-manager.yaml", "kube-scheduler.yaml"] {
        fs::remove_file(root.join("etc/kubernetes/manifests").join(m)).unwrap();
    }
    testkit::k8s::cut_apiserver_start_up_under(&root);
    let bin_dir = t.join("bin");
    let path = testkit::k8s::path_with_control_plane(&bin_dir);
    let mut kubelet = Some(crate::cluster::kubelet_for(&root, &t.path, "kl", &path));
    struct Stop<'a>(&'a mut Option<Background>);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            crate::cluster::stop_kubelet(self.0);
        }
    }
    let _stop = Stop(&mut kubelet);

    // kubeconfigs usable from the host: the node's absolute paths re-rooted (the link's
    // absolute target only exists inside the node).
    // super-admin.conf: O=system:masters (the lab writes kubeadm >= 1.29 subjects, and admin.conf
    // 's kubeadm:cluster-admins group has no binding on a cluster kubeadm did not set up).
    let admin = root.join("etc/kubernetes/super-admin.conf");
    let kubelet_conf = fs::read_to_string(root.join("etc/kubernetes/kubelet.conf")).unwrap();
    assert!(
        kubelet_conf
            .contains("client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem")
    );
    let with_pem = |pem: &Path, name: &str| {
        let p = t.join(name);
        fs::write(
            &p,
            kubelet_conf.replace("/var/lib/kubelet/pki/kubelet-client-current.pem", s(pem)),
        )
        .unwrap();
        p
    };
    let new_conf = with_pem(&linked_file(&root), "kubelet-new.conf");
    let old_file = t.join("old-kubelet-client.pem");
    fs::write(&old_file, &old_pem).unwrap();
    let old_conf = with_pem(&old_file, "kubelet-old.conf");
    let kc = |conf: &Path, args: &[&str]| {
        Cmd::new(&kubectl)
            .args(&["--kubeconfig", s(conf), "--request-timeout=10s"])
            .args(args)
            .run()
    };
    wait_for(
        "the real kube-apiserver ready (admin.conf)",
        Duration::from_secs(180),
        || {
            kc(&admin, &["get", "--raw", "/readyz"])
                .stdout
                .contains("ok")
                .then_some(())
        },
    );
    // The node object, as the kubelet would have registered it.
    let node = "apiVersion: v1\nkind: Node\nmetadata:\n  name: cp-1\n";
    let created = Cmd::new(&kubectl)
        .args(&[
            "--kubeconfig",
            s(&admin),
            "--request-timeout=10s",
            "create",
            "-f",
            "-",
        ])
        .stdin(node.as_bytes())
        .run()
        .ok();
    assert!(created.stdout.contains("node/cp-1 created"), "{created}");

    let old = kc(&old_conf, &["get", "node", "cp-1"]);
    assert!(
        !old.status.success() && old.stderr.contains("Unauthorized"),
        "the expired kubelet certificate must be refused:\n{old}"
    );
    let got = kc(&new_conf, &["get", "node", "cp-1", "-o", "name"]).ok();
    assert_eq!(got.stdout.trim(), "node/cp-1", "{got}");
    let denied = kc(&new_conf, &["get", "secrets", "-n", "kube-system"]);
    assert!(
        !denied.status.success()
            && denied
                .stderr
                .contains("User \"system:node:cp-1\" cannot list resource \"secrets\""),
        "the apiserver names the kubelet's identity:\n{denied}"
    );
}
