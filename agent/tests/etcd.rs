//! A real etcd on a lab node's certificates: it serves and accepts the renewed certificates
//! after a restart, keeps its data, refuses a client certificate from another CA, and lets it
//! in once its CA file is the bundle [old, other] and it is restarted (a CA rotation's
//! trust-in).
//! Needs Debian's `etcd-server` and `etcd-client` (without them the tests fail saying what to install).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::renew_util::*;

/// A running etcd member, killed on drop (also when the test fails).
struct Etcd {
    process: Option<Background>,
    args: Vec<String>,
    client_port: u16,
    log_dir: PathBuf,
    starts: usize,
}

impl Etcd {
    fn new(root: &Path, log_dir: &Path) -> Etcd {
        let pki = root.join("etc/kubernetes/pki/etcd");
        let (client, peer) = (free_port(), free_port());
        let data = root.join("var/lib/etcd");
        let args = one_member_etcd_args("cp-1", &data, &pki, client, peer);
        Etcd {
            process: None,
            args,
            client_port: client,
            log_dir: log_dir.to_path_buf(),
            starts: 0,
        }
    }

    fn start(&mut self) {
        self.starts += 1;
        self.process = Some(
            Cmd::new("etcd")
                .args(&self.args)
                .spawn(&self.log_dir, &format!("etcd-{}", self.starts)),
        );
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    fn log(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.describe())
            .unwrap_or_default()
    }

    fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    /// `etcdctl` with a client certificate (`base`.crt/.key) and the etcd CA.
    fn ctl(&self, ca: &Path, base: &Path, args: &[&str]) -> Output {
        let (cert, key) = (base.with_extension("crt"), base.with_extension("key"));
        etcdctl(&self.endpoint(), ca, &cert, &key)
            .args(&["--dial-timeout", "2s", "--command-timeout", "3s"])
            .args(args)
            .run()
    }

    /// Polls `endpoint health` with this client certificate until healthy (60 s deadline).
    fn wait_healthy(&mut self, ca: &Path, base: &Path) {
        wait_for("etcd to be healthy", Duration::from_secs(60), || {
            let running = self.process.as_mut().is_some_and(|p| p.running());
            assert!(running, "etcd exited\n{}", self.log());
            let out = self.ctl(ca, base, &["endpoint", "health"]);
            out.status.success().then_some(())
        });
    }
}

impl Etcd {
    /// Restarts etcd, waits until `health` (a client certificate base) finds it healthy, then
    /// reads the probe key back with each of `clients`.
    fn restart_reading(&mut self, ca: &Path, health: &Path, clients: &[&Path]) {
        self.stop();
        self.start();
        self.wait_healthy(ca, health);
        for client in clients {
            let out = self
                .ctl(
                    ca,
                    client,
                    &["get", "certrotor/probe", "--print-value-only"],
                )
                .ok();
            assert_eq!(out.stdout.trim(), "kept-across-renewal", "{out}");
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
        self.stop();
    }
}

fn have(program: &str, arg: &str) -> bool {
    std::process::Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The first certificate a TLS server at `port` presents to a client with `base`.crt/.key.
fn served_certificate(port: u16, ca: &Path, base: &Path) -> Vec<u8> {
    let out = Cmd::new("openssl")
        .args(&[
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-CAfile",
            s(ca),
            "-cert",
            s(&base.with_extension("crt")),
            "-key",
            s(&base.with_extension("key")),
            "-showcerts",
        ])
        .stdin(b"")
        .run();
    assert!(
        out.stdout.contains("Verify return code: 0 (ok)"),
        "the served chain does not verify with the etcd CA\n{out}"
    );
    let begin = out
        .stdout
        .find("-----BEGIN CERTIFICATE-----")
        .unwrap_or_else(|| panic!("no certificate served\n{out}"));
    let end_marker = "-----END CERTIFICATE-----";
    let end = out.stdout[begin..].find(end_marker).unwrap() + begin + end_marker.len();
    format!("{}\n", &out.stdout[begin..end]).into_bytes()
}

#[test]
fn etcd_serves_and_accepts_the_renewed_certificates() {
    if !have("etcd", "--version") || !have("etcdctl", "version") {
        prerequisite_missing(
            "real etcd",
            "etcd or etcdctl not installed (apt-get install -y etcd-server etcd-client)",
        );
    }
    let (t, root) = lab_in(
        "etcd",
        &["--expires-in", "2d", "--advertise-address", "127.0.0.1"],
    );
    let pki = root.join("etc/kubernetes/pki");
    let ca = pki.join("etcd/ca.crt");
    let healthcheck = pki.join("etcd/healthcheck-client");
    let apiserver = pki.join("apiserver-etcd-client");
    let mut etcd = Etcd::new(&root, &t.path);
    etcd.start();
    etcd.wait_healthy(&ca, &healthcheck);
    let old_healthcheck = std::fs::read(healthcheck.with_extension("crt")).unwrap();
    etcd.ctl(
        &ca,
        &healthcheck,
        &["put", "certrotor/probe", "kept-across-renewal"],
    )
    .ok();

    certrotor(&["renew", "--root", s(&root)])
        .run()
        .ok()
        .says(&["Renewed 11 certificate(s)"]);
    assert_ne!(
        std::fs::read(healthcheck.with_extension("crt")).unwrap(),
        old_healthcheck,
        "healthcheck-client was not renewed"
    );

    // Restart with the same flags: etcd loads the new server and peer certificates.
    etcd.restart_reading(&ca, &healthcheck, &[&healthcheck, &apiserver]);
    let served = served_certificate(etcd.client_port, &ca, &healthcheck);
    assert_eq!(
        fingerprint(&served),
        fingerprint(&std::fs::read(pki.join("etcd/server.crt")).unwrap()),
        "etcd does not serve the renewed server.crt"
    );

    // A client certificate from another CA is refused.
    let foreign = t.join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    let (fca, fca_key) = (foreign.join("ca.crt"), foreign.join("ca.key"));
    let ca_rest = ["-subj", "/CN=etcd-ca", "-days", "30", "-out", s(&fca)];
    openssl(&[&["req", "-x509"][..], &new_p256_key(s(&fca_key)), &ca_rest].concat());
    let client = foreign.join("client");
    let client_key = client.with_extension("key");
    let csr = client.with_extension("csr");
    let client_rest = ["-subj", "/CN=kube-etcd-healthcheck-client", "-out", s(&csr)];
    openssl(
        &[
            &["req", "-new"][..],
            &new_p256_key(s(&client_key)),
            &client_rest,
        ]
        .concat(),
    );
    std::fs::write(
        foreign.join("client.ext"),
        "keyUsage = critical,digitalSignature,keyEncipherment\nextendedKeyUsage = clientAuth\n",
    )
    .unwrap();
    sign_csr(
        &client.with_extension("csr"),
        &fca,
        &fca_key,
        "30",
        &foreign.join("client.ext"),
        &[],
        &client.with_extension("crt"),
    );
    let out = etcd.ctl(
        &ca,
        &client,
        &["get", "certrotor/probe", "--print-value-only"],
    );
    assert!(
        !out.status.success() && !out.stdout.contains("kept-across-renewal"),
        "etcd accepted a client certificate from another CA\n{out}"
    );
    // The renewed client still works afterwards (the refusal was about the certificate).
    etcd.ctl(&ca, &healthcheck, &["endpoint", "health"]).ok();

    // A CA rotation's trust-in (`ca plan --ca etcd-ca`): etcd/ca.crt becomes [old, new] and
    // etcd, which reads its CA pool only at start, is restarted: a client of either CA is let
    // in, and the data is kept.
    let old_ca = std::fs::read(&ca).unwrap();
    let bundle = [old_ca.as_slice(), &std::fs::read(&fca).unwrap()].concat();
    std::fs::write(&ca, bundle).unwrap();
    etcd.restart_reading(&ca, &healthcheck, &[&healthcheck, &client]);
}
