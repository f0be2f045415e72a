//! Live verification against a real TLS server (`openssl s_server`): the served certificate's
//! SHA-256, mutual TLS, a wrong CA, and waiting for a port to close.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use certrotor::restart::verify::{self, Probe};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn lab(name: &str) -> std::path::PathBuf {
    lab_with(name, &crate::renew_util::LOOPBACK_ECDSA)
}

fn lab_with(name: &str, args: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("certrotor-verify-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    crate::renew_util::lab(&dir, args)
}

fn s_server(pki: &Path, port: u16) -> Server {
    s_server_with(pki, port, &[])
}

fn s_server_with(pki: &Path, port: u16, extra: &[&str]) -> Server {
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-www"])
        .args(extra)
        .arg("-accept")
        .arg(port.to_string())
        .arg("-cert")
        .arg(pki.join("apiserver.crt"))
        .arg("-key")
        .arg(pki.join("apiserver.key"))
        .arg("-CAfile")
        .arg(pki.join("ca.crt"))
        .args(["-Verify", "1", "-verify_return_error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server(child)
}

fn probe(pki: &Path, port: u16, ca: &str) -> Probe {
    Probe {
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        path: "/".into(),
        ca_pem: Some(std::fs::read(pki.join(ca)).unwrap()),
        client_cert_pem: Some(std::fs::read(pki.join("apiserver-kubelet-client.crt")).unwrap()),
        client_key_pem: Some(std::fs::read(pki.join("apiserver-kubelet-client.key")).unwrap()),
        timeout: Duration::from_secs(5),
    }
}

/// The first answer 200 of the server `p` probes (it may still be starting).
fn answered(p: &Probe) -> verify::Observation {
    verify::wait_for(
        p,
        Duration::from_secs(20),
        Duration::from_millis(100),
        |o| o.status == 200,
    )
    .unwrap()
}

/// certrotor's TLS provider (`pki::tls`: P-256/P-384 key exchange, RSA and ECDSA) with kubeadm's
/// RSA keys, client and server, over TLS 1.3 and 1.2, against OpenSSL.
#[test]
fn probe_with_rsa_keys_over_tls_1_3_and_1_2() {
    let root = lab_with(
        "rsa",
        &[
            "--key-algorithm",
            "rsa-2048",
            "--advertise-address",
            "127.0.0.1",
        ],
    );
    let pki = root.join("etc/kubernetes/pki");
    let file =
        certrotor::pki::Cert::from_pem(&std::fs::read(pki.join("apiserver.crt")).unwrap()).unwrap();
    for version in [&["-tls1_3"][..], &["-tls1_2"][..]] {
        let port = free_port();
        let _server = s_server_with(&pki, port, version);
        let seen = answered(&probe(&pki, port, "ca.crt"));
        assert_eq!(seen.served_sha256, file.sha256_hex(), "{version:?}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn probe_reports_the_served_certificate_and_waits_for_close() {
    let root = lab("served");
    let pki = root.join("etc/kubernetes/pki");
    let port = free_port();
    let server = s_server(&pki, port);
    let p = probe(&pki, port, "ca.crt");
    let seen = answered(&p);
    let file =
        certrotor::pki::Cert::from_pem(&std::fs::read(pki.join("apiserver.crt")).unwrap()).unwrap();
    assert_eq!(seen.served_sha256, file.sha256_hex());
    assert!(seen.healthy());

    // A CA that did not sign the server certificate is refused.
    let wrong = probe(&pki, port, "front-proxy-ca.crt");
    let err = verify::probe(&wrong).unwrap_err();
    assert!(err.0.contains("TLS handshake"), "{err}");

    // Without a client certificate the server (which requires one) refuses us.
    let mut anonymous = probe(&pki, port, "ca.crt");
    anonymous.client_cert_pem = None;
    anonymous.client_key_pem = None;
    assert!(verify::probe(&anonymous).is_err());

    drop(server);
    verify::wait_closed(
        p.address,
        Duration::from_secs(10),
        Duration::from_millis(50),
    )
    .unwrap();
    assert!(verify::probe(&p).unwrap_err().0.contains("connect"));
    let _ = std::fs::remove_dir_all(&root);
}
