//! Integration tests of the k8s-sim binary against a real PKI (openssl) and a real etcd.
//!
//! Each test starts the binary as a process on free loopback ports and talks to it over mTLS.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

/// A kube-apiserver stand-in process with kubeadm-like flags plus `extra`.
fn apiserver(
    dir: &Path,
    pki: &Path,
    port: u16,
    etcd_url: &str,
    extra: &[String],
    env: &[(&str, &str)],
) -> Proc {
    let mut command = Command::new(k8s_sim_bin());
    command
        .arg("kube-apiserver")
        .args(apiserver_flags(pki, port, etcd_url))
        .args(extra)
        .env_remove("K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER")
        .envs(env.iter().copied());
    Proc::spawn(
        "kube-apiserver",
        command,
        &dir.join(format!("apiserver-{port}.log")),
    )
}

fn admin_client(pki: &Path) -> ureq::tls::TlsConfig {
    client(
        &pki.join("ca.crt"),
        Some((&pki.join("client.crt"), &pki.join("client.key"))),
    )
}

/// A new test folder `name` and the PKI [`generate_pki`] writes in it: (folder, PKI folder).
fn with_pki(name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(name);
    let pki = dir.path().join("pki");
    generate_pki(&pki);
    (dir, pki)
}

/// Starts an apiserver that must fail, and returns its log after checking exit code 1.
fn expect_start_failure(dir: &Path, pki: &Path, extra: &[String], env: &[(&str, &str)]) -> String {
    let mut process = apiserver(dir, pki, free_port(), "https://127.0.0.1:1", extra, env);
    let status = process.wait_exit(DEADLINE);
    let log = process.log_text();
    assert_eq!(status.code(), Some(1), "log: {log}");
    assert!(log.contains("failed to start"), "log: {log}");
    log
}

#[test]
fn apiserver_readyz_follows_etcd() {
    if !etcd_available("apiserver_readyz_follows_etcd") {
        return;
    }
    let (dir, pki) = with_pki("readyz");
    let mut etcd = Etcd::start(dir.path(), &pki);
    let port = free_port();
    let _apiserver = apiserver(dir.path(), &pki, port, &etcd.url, &[], &[]);
    let client = admin_client(&pki);
    let base = format!("https://127.0.0.1:{port}");

    let ready = wait_for_status(&format!("{base}/readyz"), &client, 200, "ok");
    assert_eq!(ready.body, "ok");
    assert_eq!(
        get(&format!("{base}/healthz"), &client).unwrap().status,
        200
    );
    assert_eq!(get(&format!("{base}/livez"), &client).unwrap().status, 200);
    assert_eq!(
        get(&format!("{base}/readyz?verbose"), &client)
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        get(&format!("{base}/api/v1/pods"), &client).unwrap().status,
        404
    );

    etcd.stop();
    let unready = wait_for_status(&format!("{base}/readyz"), &client, 500, "etcd failed");
    assert!(
        unready
            .body
            .contains(etcd.url.trim_start_matches("https://")),
        "{}",
        unready.body
    );
    assert_eq!(
        get(&format!("{base}/healthz"), &client).unwrap().status,
        500
    );
    let live = get(&format!("{base}/livez"), &client).unwrap();
    assert_eq!((live.status, live.body.as_str()), (200, "ok"));
}

#[test]
fn apiserver_requires_client_certificate_signed_by_client_ca() {
    let (dir, pki) = with_pki("client-auth");
    let port = free_port();
    let _apiserver = apiserver(dir.path(), &pki, port, "https://127.0.0.1:1", &[], &[]);
    let livez = format!("https://127.0.0.1:{port}/livez");
    // Proves the server is up and verifiable with the right client certificate.
    wait_for_status(&livez, &admin_client(&pki), 200, "ok");

    let anonymous = client(&pki.join("ca.crt"), None);
    let error = get(&livez, &anonymous).unwrap_err();
    assert!(error.contains("CertificateRequired"), "{error}");

    let intruder = client(
        &pki.join("ca.crt"),
        Some((&pki.join("other-client.crt"), &pki.join("other-client.key"))),
    );
    let error = get(&livez, &intruder).unwrap_err();
    assert!(
        error.contains("BadCertificate") || error.contains("UnknownCA"),
        "{error}"
    );

    // The serving certificate really comes from ca.crt: a client trusting another CA rejects it.
    let wrong_trust = client(
        &pki.join("other-ca.crt"),
        Some((&pki.join("client.crt"), &pki.join("client.key"))),
    );
    let error = get(&livez, &wrong_trust).unwrap_err();
    assert!(error.contains("UnknownIssuer"), "{error}");
}

#[test]
fn apiserver_refuses_to_start_with_mismatched_key() {
    let (dir, pki) = with_pki("mismatch");
    let key = pki.join("other-apiserver.key");
    let log = expect_start_failure(
        dir.path(),
        &pki,
        &[format!("--tls-private-key-file={}", key.display())],
        &[],
    );
    let expected = format!(
        "private key '{}' does not match certificate '{}'",
        key.display(),
        pki.join("apiserver.crt").display()
    );
    assert!(log.contains(&expected), "log: {log}");
    assert!(!log.contains("PRIVATE KEY"), "key material in log: {log}");
}

#[test]
fn apiserver_refuses_to_start_with_expired_or_missing_certificate() {
    let (dir, pki) = with_pki("expired");
    let cert = pki.join("expired-client.crt");
    let log = expect_start_failure(
        dir.path(),
        &pki,
        &[
            format!("--etcd-certfile={}", cert.display()),
            format!(
                "--etcd-keyfile={}",
                pki.join("expired-client.key").display()
            ),
        ],
        &[],
    );
    assert!(
        log.contains(&format!("certificate '{}' expired at", cert.display())),
        "log: {log}"
    );

    fs::remove_file(pki.join("apiserver-kubelet-client.key")).unwrap();
    let log = expect_start_failure(dir.path(), &pki, &[], &[]);
    assert!(
        log.contains(&format!(
            "failed to read '{}'",
            pki.join("apiserver-kubelet-client.key").display()
        )),
        "log: {log}"
    );
}

#[test]
fn apiserver_reject_switch_refuses_newer_serving_certificate() {
    let (dir, pki) = with_pki("reject");
    let log = expect_start_failure(
        dir.path(),
        &pki,
        &["--sim-reject-serving-cert-issued-after=2000-01-01T00:00:00Z".to_string()],
        &[],
    );
    assert!(
        log.contains("serving certificate rejected by test switch"),
        "log: {log}"
    );
    let log = expect_start_failure(
        dir.path(),
        &pki,
        &[],
        &[(
            "K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER",
            "2000-01-01T00:00:00+02:00",
        )],
    );
    assert!(
        log.contains("serving certificate rejected by test switch"),
        "log: {log}"
    );

    // An instant after notBefore lets the same certificate through.
    let port = free_port();
    let _apiserver = apiserver(
        dir.path(),
        &pki,
        port,
        "https://127.0.0.1:1",
        &["--sim-reject-serving-cert-issued-after=2999-01-01T00:00:00Z".to_string()],
        &[],
    );
    wait_for_status(
        &format!("https://127.0.0.1:{port}/livez"),
        &admin_client(&pki),
        200,
        "ok",
    );
}

/// A kubeconfig embedding `ca`, `cert` and `key` as base64, the way kubeadm writes them.
fn write_kubeconfig(path: &Path, server: &str, ca: &Path, cert: &Path, key: &Path) {
    let base64 = |file: &Path| {
        let output = Command::new("openssl")
            .args(["base64", "-A", "-in"])
            .arg(file)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8(output.stdout).unwrap()
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    \
         server: {server}\n  name: kubernetes\ncontexts:\n- context:\n    cluster: kubernetes\n    \
         user: system:kube-controller-manager\n  name: system:kube-controller-manager@kubernetes\n\
         current-context: system:kube-controller-manager@kubernetes\npreferences: {{}}\nusers:\n\
         - name: system:kube-controller-manager\n  user:\n    client-certificate-data: {}\n    \
         client-key-data: {}\n",
        base64(ca),
        base64(cert),
        base64(key)
    );
    fs::write(path, text).unwrap();
}

#[test]
fn controller_manager_and_scheduler_healthz_follow_apiserver() {
    if !etcd_available("controller_manager_and_scheduler_healthz_follow_apiserver") {
        return;
    }
    let (dir, pki) = with_pki("kcm");
    let _etcd = Etcd::start(dir.path(), &pki);
    let api_port = free_port();
    let mut apiserver = apiserver(dir.path(), &pki, api_port, &_etcd.url, &[], &[]);
    let kubeconfig = dir.path().join("controller-manager.conf");
    write_kubeconfig(
        &kubeconfig,
        &format!("https://127.0.0.1:{api_port}"),
        &pki.join("ca.crt"),
        &pki.join("client.crt"),
        &pki.join("client.key"),
    );

    // kube-controller-manager through an argv[0] symlink, kube-scheduler through the subcommand.
    let bin = component_bin_dir(dir.path());
    let kcm_port = free_port();
    let mut command = Command::new(bin.join("kube-controller-manager"));
    command
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg("--leader-elect=true")
        .arg("--use-service-account-credentials=true")
        .args(["--secure-port", &kcm_port.to_string()]);
    let _kcm = Proc::spawn(
        "kube-controller-manager",
        command,
        &dir.path().join("kcm.log"),
    );
    let scheduler_port = free_port();
    let mut command = Command::new(k8s_sim_bin());
    command
        .arg("kube-scheduler")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--secure-port={scheduler_port}"));
    let _scheduler = Proc::spawn("kube-scheduler", command, &dir.path().join("scheduler.log"));

    let insecure = insecure_client();
    for port in [kcm_port, scheduler_port] {
        let url = format!("https://127.0.0.1:{port}/healthz");
        let healthy = wait_for_status(&url, &insecure, 200, "ok");
        assert_eq!(healthy.body, "ok");
        assert_eq!(
            get(&format!("https://127.0.0.1:{port}/metrics"), &insecure)
                .unwrap()
                .status,
            404
        );
    }

    apiserver.kill();
    for port in [kcm_port, scheduler_port] {
        let url = format!("https://127.0.0.1:{port}/healthz");
        let unhealthy = wait_for_status(&url, &insecure, 500, "apiserver failed");
        assert!(
            unhealthy.body.contains(&format!("127.0.0.1:{api_port}")),
            "{}",
            unhealthy.body
        );
    }
}

#[test]
fn scheduler_refuses_kubeconfig_with_mismatched_or_expired_client_certificate() {
    let (dir, pki) = with_pki("kubeconfig-bad");
    for (cert, key, expected) in [
        (
            "client.crt",
            "apiserver-etcd-client.key",
            "does not match certificate",
        ),
        ("expired-client.crt", "expired-client.key", "expired at"),
    ] {
        let kubeconfig = dir.path().join("scheduler.conf");
        write_kubeconfig(
            &kubeconfig,
            "https://127.0.0.1:1",
            &pki.join("ca.crt"),
            &pki.join(cert),
            &pki.join(key),
        );
        let mut command = Command::new(k8s_sim_bin());
        command
            .arg("kube-scheduler")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--secure-port={}", free_port()));
        let mut process = Proc::spawn("kube-scheduler", command, &dir.path().join("s.log"));
        let status = process.wait_exit(DEADLINE);
        let log = process.log_text();
        assert_eq!(status.code(), Some(1), "log: {log}");
        assert!(log.contains(expected), "log: {log}");
        assert!(log.contains("client-certificate-data"), "log: {log}");
    }
}

#[test]
fn unknown_component_is_a_usage_error() {
    let output = Command::new(k8s_sim_bin()).arg("etcd").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown component 'etcd'"), "{stderr}");
}
