//! `certrotor ca plan` (issue 29, its first part): what rotating a CA touches on a node. The
//! leaves it lists are checked against openssl (every certificate of the node that openssl
//! verifies against the CA, and no other), the consumers against the static pod manifests,
//! the lab's and those the real kubeadm v1.20.2 writes.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::kubeadm_parity_util::{CONFIG, k8s_bin, kubeadm, kubeadm_node, require_root};
use crate::renew_util::new_p256_key;
use crate::util::{
    TestDir, certrotor, each_field, find_certificates, listing, openssl_ok, openssl_verify,
    str_items,
};

/// `certrotor ca plan --ca <ca> --root <root> --output json`, expecting exit 0.
fn plan(root: &Path, ca: &str) -> Value {
    certrotor(&[
        "ca",
        "plan",
        "--ca",
        ca,
        "--root",
        root.to_str().unwrap(),
        "--output",
        "json",
    ])
    .expect(0)
    .json()
}

/// The node's certificates (files and kubeconfigs' client certificates) that openssl verifies
/// against `ca` (a file under the root), the CA itself left out: what the issue stage issues
/// again.
fn signed_by(root: &Path, ca: &str, scratch: &Path) -> BTreeSet<String> {
    let ca_file = root.join(ca);
    find_certificates(root, scratch)
        .into_iter()
        .filter(|f| f.path != ca && !is_ca(f))
        .filter(|f| openssl_verify(&ca_file, &f.cert_file, false).is_ok())
        .map(|f| f.path)
        .collect()
}

fn is_ca(f: &crate::util::Found) -> bool {
    f.ossl
        .ext
        .get("Basic Constraints")
        .is_some_and(|e| e.value.contains("CA:TRUE"))
}

/// The plan's leaves, by path.
fn leaves(p: &Value) -> BTreeSet<String> {
    each_field(&p["leaves"], "path")
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// The trust entry of `consumer` through `source`; panics, showing the plan, when absent.
#[track_caller]
fn trust<'a>(p: &'a Value, consumer: &str, source: &str) -> &'a Value {
    p["trust"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["consumer"] == consumer && t["source"] == source)
        .unwrap_or_else(|| panic!("no trust entry {consumer} {source} in\n{p:#}"))
}

/// The `restarts` (or `reloads`) of stage `stage`.
fn stage<'a>(p: &'a Value, stage: &str, what: &str) -> Vec<&'a str> {
    let s = p["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["stage"] == stage)
        .unwrap_or_else(|| panic!("no stage {stage} in\n{p:#}"));
    str_items(&s[what])
}

/// The paths a manifest's flag names (`--flag=/abs/path`), relative to the root.
fn flag_paths(manifest: &str, flag: &str) -> Vec<String> {
    let prefix = format!("--{flag}=");
    manifest
        .lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix(&prefix))
        .map(|v| v.trim().trim_start_matches('/').to_string())
        .collect()
}

#[test]
fn ca_plan_lists_what_openssl_finds_signed_by_each_ca_and_each_consumers_flag() {
    let dir = TestDir::new("ca-plan");
    let root = dir.lab("node", &["--kube-vip", "eks-anywhere"]);
    let before = listing(&root);
    let manifests = root.join("etc/kubernetes/manifests");
    let read = |m: &str| std::fs::read_to_string(manifests.join(m)).unwrap();
    let (apiserver, kcm, etcd) = (
        read("kube-apiserver.yaml"),
        read("kube-controller-manager.yaml"),
        read("etcd.yaml"),
    );

    // The cluster CA.
    let p = plan(&root, "ca");
    assert_eq!(p["version"], 1);
    assert_eq!(p["certificates"][0]["path"], "etc/kubernetes/pki/ca.crt");
    assert_eq!(p["certificates"][0]["signer_here"], true);
    assert_eq!(
        leaves(&p),
        signed_by(&root, "etc/kubernetes/pki/ca.crt", &dir.join("s1"))
    );
    for (consumer, manifest, flag, reloads) in [
        ("kube-apiserver", &apiserver, "client-ca-file", true),
        ("kube-controller-manager", &kcm, "client-ca-file", true),
        ("kube-controller-manager", &kcm, "root-ca-file", false),
        (
            "kube-controller-manager",
            &kcm,
            "cluster-signing-cert-file",
            true,
        ),
    ] {
        let t = trust(&p, consumer, &format!("--{flag}"));
        assert_eq!(
            vec![t["file"].as_str().unwrap().to_string()],
            flag_paths(manifest, flag)
        );
        assert_eq!(t["reloads"], reloads, "{consumer} --{flag}");
        assert_eq!(t["holds_ca"], true);
    }
    assert_eq!(
        trust(&p, "kube-vip.yaml", "certificate-authority-data")["file"],
        "etc/kubernetes/admin.conf"
    );
    assert_eq!(
        trust(&p, "kubelet", "certificate-authority-data")["reloads"],
        false
    );
    // Trust-in: the apiserver reloads; what reads a kubeconfig or --root-ca-file restarts,
    // and the controller-manager's signer moves out of the bundle.
    assert_eq!(stage(&p, "trust-in", "reloads"), ["kube-apiserver"]);
    let restarts = stage(&p, "trust-in", "restarts");
    for c in [
        "kube-controller-manager",
        "kube-scheduler",
        "kube-vip.yaml",
        "kubelet",
    ] {
        assert!(restarts.contains(&c), "trust-in restarts {c}: {restarts:?}");
    }
    assert!(!restarts.contains(&"kube-apiserver"));
    assert!(!restarts.contains(&"etcd"));
    assert_eq!(stage(&p, "trust-out", "restarts"), restarts);

    // The front-proxy CA: both readers of the bundle reload, nothing restarts at trust-in.
    let p = plan(&root, "front-proxy-ca");
    assert_eq!(
        leaves(&p),
        signed_by(
            &root,
            "etc/kubernetes/pki/front-proxy-ca.crt",
            &dir.join("s2")
        )
    );
    assert_eq!(leaves(&p).len(), 1, "front-proxy-client only: {p:#}");
    for consumer in ["kube-apiserver", "kube-controller-manager"] {
        assert_eq!(
            trust(&p, consumer, "--requestheader-client-ca-file")["reloads"],
            true
        );
    }
    assert!(stage(&p, "trust-in", "restarts").is_empty());

    // The etcd CA: etcd and the apiserver's etcd client restart at trust-in and trust-out.
    let p = plan(&root, "etcd-ca");
    assert_eq!(
        leaves(&p),
        signed_by(&root, "etc/kubernetes/pki/etcd/ca.crt", &dir.join("s3"))
    );
    for (consumer, manifest, flag) in [
        ("etcd", &etcd, "trusted-ca-file"),
        ("etcd", &etcd, "peer-trusted-ca-file"),
        ("kube-apiserver", &apiserver, "etcd-cafile"),
    ] {
        let t = trust(&p, consumer, &format!("--{flag}"));
        assert_eq!(
            vec![t["file"].as_str().unwrap().to_string()],
            flag_paths(manifest, flag)
        );
        assert_eq!(t["reloads"], false);
    }
    let restarts = stage(&p, "trust-in", "restarts");
    assert_eq!(restarts, ["etcd", "kube-apiserver"]);

    // A plan changes nothing.
    assert_eq!(listing(&root), before);
}

#[test]
fn ca_plan_of_the_etcd_ca_on_external_etcd_nodes() {
    let dir = TestDir::new("ca-plan-external");
    let lab = dir.lab("lab", &["--topology", "external-etcd"]);
    let (cp, etcd) = (lab.join("control-plane"), lab.join("etcd"));

    // The control plane holds the etcd CA's certificate, not its key.
    let p = plan(&cp, "etcd-ca");
    assert_eq!(p["certificates"][0]["signer_here"], false);
    assert_eq!(
        leaves(&p),
        signed_by(&cp, "etc/kubernetes/pki/etcd/ca.crt", &dir.join("s1"))
    );
    assert_eq!(
        trust(&p, "kube-apiserver", "--etcd-cafile")["reloads"],
        false
    );
    assert_eq!(stage(&p, "trust-in", "restarts"), ["kube-apiserver"]);

    // The etcd node: etcdadm's CA, its four leaves, etcd restarted at trust-in and trust-out.
    let p = plan(&etcd, "etcd-ca");
    assert_eq!(p["certificates"][0]["name"], "etcdadm-ca");
    assert_eq!(p["certificates"][0]["signer_here"], true);
    let openssl = signed_by(&etcd, "etc/etcd/pki/ca.crt", &dir.join("s2"));
    assert_eq!(leaves(&p), openssl);
    assert_eq!(openssl.len(), 4, "{openssl:?}");
    assert_eq!(stage(&p, "trust-in", "restarts"), ["etcd"]);
    assert_eq!(stage(&p, "trust-out", "restarts"), ["etcd"]);
}

#[test]
fn ca_plan_refuses_a_ca_the_node_does_not_have_and_an_unknown_ca() {
    let dir = TestDir::new("ca-plan-refused");
    let lab = dir.lab("lab", &["--topology", "external-etcd"]);
    let etcd = lab.join("etcd");
    let run = certrotor(&[
        "ca",
        "plan",
        "--ca",
        "front-proxy-ca",
        "--root",
        etcd.to_str().unwrap(),
    ]);
    run.expect(2);
    assert!(
        run.stderr.contains("no front-proxy-ca on this node")
            && run.stderr.contains("the CAs here: etcdadm-ca")
            && run.stderr.contains("certrotor check"),
        "{run}"
    );
    let run = certrotor(&["ca", "plan", "--ca", "sa", "--root", etcd.to_str().unwrap()]);
    run.expect(64);
    assert!(
        run.stderr
            .contains("expected ca, front-proxy-ca or etcd-ca"),
        "{run}"
    );
}

/// The manifests and PKI written by the real kubeadm v1.20.2 (`init phase certs`, `kubeconfig`,
/// `control-plane` and `etcd local`): the plan finds each consumer's flag there.
#[test]
fn ca_plan_reads_the_manifests_the_real_kubeadm_writes() {
    require_root("ca_plan_reads_the_manifests_the_real_kubeadm_writes");
    let _ = k8s_bin();
    let dir = TestDir::new("ca-plan-kubeadm");
    let root = dir.join("node");
    kubeadm_node(&root, false);
    let cfg = format!("/{CONFIG}");
    kubeadm(
        &root,
        &["init", "phase", "control-plane", "all", "--config", &cfg],
    );
    kubeadm(&root, &["init", "phase", "etcd", "local", "--config", &cfg]);
    let before = listing(&root);
    for (ca, file, flags) in [
        (
            "ca",
            "etc/kubernetes/pki/ca.crt",
            &[
                ("kube-apiserver", "client-ca-file", true),
                ("kube-controller-manager", "client-ca-file", true),
                ("kube-controller-manager", "root-ca-file", false),
                ("kube-controller-manager", "cluster-signing-cert-file", true),
            ][..],
        ),
        (
            "front-proxy-ca",
            "etc/kubernetes/pki/front-proxy-ca.crt",
            &[
                ("kube-apiserver", "requestheader-client-ca-file", true),
                (
                    "kube-controller-manager",
                    "requestheader-client-ca-file",
                    true,
                ),
            ][..],
        ),
        (
            "etcd-ca",
            "etc/kubernetes/pki/etcd/ca.crt",
            &[
                ("etcd", "trusted-ca-file", false),
                ("etcd", "peer-trusted-ca-file", false),
                ("kube-apiserver", "etcd-cafile", false),
            ][..],
        ),
    ] {
        let p = plan(&root, ca);
        assert_eq!(
            leaves(&p),
            signed_by(&root, file, &dir.join(&format!("s-{ca}"))),
            "{ca}"
        );
        let found: Vec<(String, String)> = p["trust"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["source"].as_str().unwrap().starts_with("--"))
            .map(|t| {
                (
                    t["consumer"].as_str().unwrap().to_string(),
                    t["source"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = flags
            .iter()
            .map(|(c, f, _)| (c.to_string(), format!("--{f}")))
            .collect();
        assert_eq!(found, want, "{ca}: the flags kubeadm wrote\n{p:#}");
        for (consumer, flag, reloads) in flags {
            let t = trust(&p, consumer, &format!("--{flag}"));
            assert_eq!(t["file"], file, "{ca} {consumer} --{flag}");
            assert_eq!(t["holds_ca"], true, "{ca} {consumer} --{flag}");
            assert_eq!(t["reloads"], *reloads, "{ca} {consumer} --{flag}");
        }
        // kubeadm's manifests name v1.20.2: the issue stage uses the reload table for it.
        assert!(
            p["notes"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| !n.as_str().unwrap().contains("does not hold"))
        );
    }
    assert_eq!(listing(&root), before, "a plan changes nothing");
}

/// A new CA (ECDSA P-256, as the lab's nodes use) and a client certificate it signs for
/// `system:masters`, made with openssl in `dir`: (ca.crt, client.crt, client.key).
fn new_ca_and_client(dir: &Path, cn: &str) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    std::fs::create_dir_all(dir).unwrap();
    let (ca_key, client_key) = (p("ca.key"), p("client.key"));
    let subject = format!("/CN={cn}");
    let ca = [&["req", "-x509"][..], &new_p256_key(&ca_key)].concat();
    openssl_ok(
        &[
            &ca[..],
            &["-out", &p("ca.crt"), "-subj", &subject, "-days", "3650"],
            &["-addext", "basicConstraints=critical,CA:TRUE"],
            &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ]
        .concat(),
    );
    let csr = [&["req", "-new"][..], &new_p256_key(&client_key)].concat();
    openssl_ok(
        &[
            &csr[..],
            &["-out", &p("client.csr")],
            &["-subj", "/O=system:masters/CN=ca-rotation-check"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("client.ext"),
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    .unwrap();
    openssl_ok(&[
        "x509",
        "-req",
        "-in",
        &p("client.csr"),
        "-CA",
        &p("ca.crt"),
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &p("client.crt"),
        "-days",
        "30",
        "-extfile",
        &p("client.ext"),
    ]);
    (
        dir.join("ca.crt"),
        std::fs::read(dir.join("client.crt")).unwrap(),
        std::fs::read(&client_key).unwrap(),
    )
}

/// admin.conf with its client pair replaced by `cert` and `key`.
fn kubeconfig_with(admin: &str, cert: &[u8], key: &[u8]) -> String {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    admin
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("client-certificate-data:") {
                format!("    client-certificate-data: {}", b64(cert))
            } else if l.trim_start().starts_with("client-key-data:") {
                format!("    client-key-data: {}", b64(key))
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `kubectl get namespaces` with `kubeconfig`: Ok, or the error text.
fn kubectl_get_ns(kubeconfig: &Path) -> Result<(), String> {
    let out = std::process::Command::new(testkit::k8s::kubectl_path())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["--request-timeout=20s", "get", "namespaces", "-o", "name"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("kubectl runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A CertificateSigningRequest for a client certificate (signer
/// `kubernetes.io/kube-apiserver-client`), created and approved with kubectl; its name.
fn approved_csr(node: &crate::platform::platform_util::Node, name: &str) -> String {
    use base64::Engine;
    let dir = node.dir.join(format!("csr-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (key, csr) = (dir.join("k.key"), dir.join("k.csr"));
    let subject = format!("/CN=ca-rotation-{name}");
    let req = [
        &["req", "-new"][..],
        &new_p256_key(key.to_str().unwrap()),
        &["-out", csr.to_str().unwrap(), "-subj", &subject],
    ]
    .concat();
    openssl_ok(&req);
    let request = base64::engine::general_purpose::STANDARD.encode(std::fs::read(&csr).unwrap());
    let object = format!("ca-rotation-{name}");
    let yaml = format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  \
         name: {object}\nspec:\n  request: {request}\n  signerName: \
         kubernetes.io/kube-apiserver-client\n  usages: [\"client auth\", \"digital signature\"]\n"
    );
    let file = dir.join("csr.yaml");
    std::fs::write(&file, yaml).unwrap();
    node.kubectl_ok(&["create", "-f", file.to_str().unwrap()]);
    node.kubectl_ok(&["certificate", "approve", &object]);
    object
}

/// The certificate of CSR `name` (base64), empty while unsigned.
fn csr_certificate(node: &crate::platform::platform_util::Node, name: &str) -> String {
    node.kubectl_ok(&["get", "csr", name, "-o", "jsonpath={.status.certificate}"])
}

/// Replaces `file` by `bytes` as a rotation writes it: a new file renamed over the old one.
fn replace(file: &Path, bytes: &[u8]) {
    let tmp = file.with_extension("certrotor-test-tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// What the plan's table says of the cluster CA's consumers, proven with the real
/// kube-apiserver and kube-controller-manager v1.20.2: the apiserver takes a client CA bundle
/// [old, new] without a restart (a client certificate of the new CA is let in, the old ones
/// still are) and, at trust-out, the new CA alone (the old client certificates are refused);
/// the controller-manager's CSR signer signs an approved CSR before, and refuses the bundle
/// ("expected 1 certificate") after, signing nothing while it lasts, which is why its signer must move to a file of its own before `ca.crt` becomes a bundle. And the
/// front-proxy CA's bundle is reloaded and published in
/// `kube-system/extension-apiserver-authentication`, where aggregated API servers read it.
#[test]
fn the_real_apiserver_reloads_client_ca_bundles_and_the_signer_refuses_one() {
    use crate::platform::platform_util::{Node, Platform};
    let node = Node::start("ca-bundle", Platform::Kubeadm);
    let scratch = node.dir.join("new-ca");
    let (new_ca, cert, key) = new_ca_and_client(&scratch, "kubernetes-next");
    let admin = std::fs::read_to_string(node.kfile("admin.conf")).unwrap();
    let next = scratch.join("next.conf");
    std::fs::write(&next, kubeconfig_with(&admin, &cert, &key)).unwrap();
    let old_ca = std::fs::read(node.kfile("pki/ca.crt")).unwrap();
    let new_ca = std::fs::read(new_ca).unwrap();
    let before = node.states();
    // The controller-manager signs an approved CSR while ca.crt holds one certificate.
    let csr = approved_csr(&node, "before");
    testkit::wait_for(
        "kube-controller-manager to sign an approved CSR",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || match csr_certificate(&node, &csr) {
            c if c.is_empty() => Err("not signed yet".to_string()),
            _ => Ok(()),
        },
    );
    let err = kubectl_get_ns(&next).expect_err("a client of a CA nobody trusts yet is let in");
    assert!(err.contains("Unauthorized"), "{err}");

    // The front-proxy CA's trust-in: the apiserver reloads its requestheader bundle and
    // publishes it where aggregated API servers read it.
    let (new_fp, _, _) = new_ca_and_client(&node.dir.join("new-fp"), "front-proxy-next");
    let old_fp = std::fs::read(node.kfile("pki/front-proxy-ca.crt")).unwrap();
    let new_fp = std::fs::read(new_fp).unwrap();
    replace(
        &node.kfile("pki/front-proxy-ca.crt"),
        &[old_fp.as_slice(), &new_fp].concat(),
    );
    let bodies = |pem: &[u8]| -> Vec<String> {
        String::from_utf8_lossy(pem)
            .split("-----")
            .filter(|b| b.len() > 64)
            .map(|b| b.split_whitespace().collect())
            .collect()
    };
    let want = [bodies(&old_fp), bodies(&new_fp)].concat();
    testkit::wait_for(
        "kube-apiserver to publish [old, new] in extension-apiserver-authentication",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || {
            let out = node.kubectl(&[
                "get",
                "configmap",
                "--namespace=kube-system",
                "extension-apiserver-authentication",
                "-o",
                "jsonpath={.data.requestheader-client-ca-file}",
            ]);
            let got = bodies(&out.stdout);
            (got == want).then_some(()).ok_or(format!("{got:?}"))
        },
    );

    // Trust-in: ca.crt holds [old, new].
    replace(
        &node.kfile("pki/ca.crt"),
        &[old_ca.as_slice(), &new_ca].concat(),
    );
    let trust_in = std::time::Instant::now();
    testkit::wait_for(
        "kube-apiserver to let a client of the new CA in",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || kubectl_get_ns(&next),
    );
    let trust_in = trust_in.elapsed();
    kubectl_get_ns(&node.kfile("admin.conf")).expect("a client of the old CA is still let in");
    // The signer signs nothing while ca.crt is a bundle: an approved CSR stays unsigned and the
    // controller-manager says why.
    let csr = approved_csr(&node, "after-trust-in");
    testkit::wait_for(
        "kube-controller-manager's CSR signer to refuse the bundle",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || {
            let log = node.pod_log("kube-controller-manager");
            log.contains("expected 1 certificate, found 2")
                .then_some(())
                .ok_or_else(|| "not yet in its log".to_string())
        },
    );
    assert_eq!(
        csr_certificate(&node, &csr),
        "",
        "signed with ca.crt a bundle"
    );

    // Trust-out: ca.crt holds the new CA alone.
    replace(&node.kfile("pki/ca.crt"), &new_ca);
    let trust_out = std::time::Instant::now();
    testkit::wait_for(
        "kube-apiserver to refuse a client of the old CA",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || match kubectl_get_ns(&node.kfile("admin.conf")) {
            Err(e) if e.contains("Unauthorized") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let trust_out = trust_out.elapsed();
    kubectl_get_ns(&next).expect("a client of the new CA is let in");
    let after = node.states();
    assert_eq!(
        before["kube-apiserver"].history, after["kube-apiserver"].history,
        "kube-apiserver was restarted"
    );
    eprintln!(
        "FIGURES ca bundle: kube-apiserver let a client of the new CA in {} ms after ca.crt \
         became [old, new], and refused the old CA's clients {} ms after it became [new] \
         (wall clock, kubectl every 500 ms); no restart",
        trust_in.as_millis(),
        trust_out.as_millis()
    );
}
