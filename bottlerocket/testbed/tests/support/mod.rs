//! Shared harness for the kubelet-sim and k8s-sim integration tests.
//!
//! Gives each test a fresh directory, a PKI made by the real `openssl` CLI (and checked with
//! `openssl verify`), free loopback ports, a real etcd 3.4 with TLS and client-certificate auth, and
//! child processes that are killed on drop and whose logs are printed when the test fails.
//! Waiting is always "poll until a deadline".

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testbed::k8s_sim::{self, HttpResponse};
use ureq::tls::TlsConfig;

/// Default deadline for things that should happen within a few seconds.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A directory removed when dropped (kept when the test fails, for inspection).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        TempDir(testkit::fresh_dir("br-pods", name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("test directory kept: {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `probe` every 50 ms until it returns `Ok`, failing with `what` and the last
/// observation after `deadline` (the shared [`testkit::wait_for`]).
#[track_caller]
pub fn wait_for<T>(what: &str, deadline: Duration, probe: impl FnMut() -> Result<T, String>) -> T {
    testkit::wait_for(what, deadline, Duration::from_millis(50), probe)
}

/// Whether a process is gone (no /proc entry) or a zombie.
pub fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// A child process killed on drop; its log is printed if the test is failing.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, command: Command, log: &Path) -> Proc {
        let child = testkit::spawn_logged(name, command, log);
        Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let name = self.name.clone();
        wait_for(&format!("{name} to exit"), deadline, || {
            match self.child.try_wait().unwrap() {
                Some(status) => Ok(status),
                None => Err("still running".to_string()),
            }
        })
    }

    /// Signals our own, not yet reaped child.
    pub fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.pid()).expect("pid");
        kill(Pid::from_raw(pid), signal).expect("kill");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            eprintln!(
                "----- log of {} ({}) -----\n{}\n----- end of log -----",
                self.name,
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Generates the test PKI in `dir` with openssl:
///
/// * `ca.*` (RSA), `apiserver.*` (RSA, PKCS#1 key, IP SAN 127.0.0.1), `client.*` (EC, SEC1 key,
///   CN kubernetes-admin), `apiserver-kubelet-client.*`, `other-apiserver.key` (a key that matches
///   nothing), `expired-client.*` (notAfter in the past);
/// * `other-ca.*` and `other-client.*`: a second, unrelated CA and a client it signed;
/// * `front-proxy-ca.*`, `front-proxy-client.*`;
/// * `etcd/ca.*`, `etcd/server.*`, `etcd/peer.*`, `apiserver-etcd-client.*` (signed by etcd/ca).
pub fn generate_pki(dir: &Path) {
    const SCRIPT: &str = r#"
set -eu
cd "$1"
mkdir -p etcd
ca() { # file cn
  openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$1.key" -out "$1.crt" -days 3650 \
    -subj "/CN=$2" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign
}
leaf() { # file ca subject eku san keyspec days
  if [ "$6" = rsa ]; then newkey="-newkey rsa:2048"; else newkey="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1"; fi
  openssl req -new -nodes $newkey -keyout "$1.key" -out "$1.csr" -subj "$3"
  { echo basicConstraints=critical,CA:FALSE
    echo keyUsage=critical,digitalSignature,keyEncipherment
    echo extendedKeyUsage=$4
    if [ -n "$5" ]; then echo subjectAltName=$5; fi; } > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days "$7" \
    -extfile "$1.ext" -out "$1.crt"
  rm -f "$1.csr" "$1.ext"
}
ca ca kubernetes
ca other-ca other
ca front-proxy-ca front-proxy-ca
ca etcd/ca etcd-ca
leaf apiserver ca /CN=kube-apiserver serverAuth IP:127.0.0.1,DNS:localhost,DNS:kubernetes rsa 365
openssl rsa -in apiserver.key -traditional -out apiserver.key
leaf apiserver-kubelet-client ca "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client" clientAuth "" rsa 365
leaf client ca "/O=system:masters/CN=kubernetes-admin" clientAuth "" ec 365
openssl ec -in client.key -out client.key
leaf expired-client ca /CN=expired clientAuth "" ec -1
leaf other-client other-ca /CN=intruder clientAuth "" ec 365
leaf front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth "" ec 365
leaf etcd/server etcd/ca /CN=node1 serverAuth,clientAuth IP:127.0.0.1,IP:0:0:0:0:0:0:0:1,DNS:localhost,DNS:node1 ec 365
leaf etcd/peer etcd/ca /CN=node1 serverAuth,clientAuth IP:127.0.0.1,DNS:localhost,DNS:node1 ec 365
leaf apiserver-etcd-client etcd/ca /CN=kube-apiserver-etcd-client clientAuth "" ec 365
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out other-apiserver.key
openssl verify -CAfile ca.crt apiserver.crt client.crt apiserver-kubelet-client.crt
openssl verify -CAfile etcd/ca.crt etcd/server.crt etcd/peer.crt apiserver-etcd-client.crt
openssl verify -CAfile other-ca.crt other-client.crt
openssl verify -CAfile front-proxy-ca.crt front-proxy-client.crt
"#;
    fs::create_dir_all(dir).unwrap();
    let output = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("gen-pki")
        .arg(dir)
        .output()
        .expect("openssl must be installed");
    testkit::assert_succeeded("PKI generation failed", &output);
}

/// The real etcd must be installed: without it the test fails saying what to install.
/// Returns true (kept as a predicate for the callers).
pub fn etcd_available(test: &str) -> bool {
    testkit::prereq::require_tools(test, &[("etcd", "etcd-server")]);
    true
}

/// A real etcd with TLS on both client and peer URLs and client-certificate auth.
pub struct Etcd {
    pub process: Proc,
    pub url: String,
}

impl Etcd {
    /// Starts etcd on free ports with the PKI in `pki` and waits until `/health` says true.
    pub fn start(work: &Path, pki: &Path) -> Etcd {
        let client_port = free_port();
        let peer_port = free_port();
        let url = format!("https://127.0.0.1:{client_port}");
        let peer = format!("https://127.0.0.1:{peer_port}");
        let mut command = Command::new("/usr/bin/etcd");
        let etcd_pki = pki.join("etcd");
        command
            .arg("--name=node1")
            .arg(format!("--data-dir={}", work.join("etcd-data").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=node1={peer}"))
            .arg("--initial-cluster-state=new")
            .arg("--client-cert-auth=true")
            .arg("--peer-client-cert-auth=true");
        for (flag, file) in [
            ("cert-file", "server.crt"),
            ("key-file", "server.key"),
            ("trusted-ca-file", "ca.crt"),
            ("peer-cert-file", "peer.crt"),
            ("peer-key-file", "peer.key"),
            ("peer-trusted-ca-file", "ca.crt"),
        ] {
            command.arg(format!("--{flag}={}", etcd_pki.join(file).display()));
        }
        let process = Proc::spawn("etcd", command, &work.join("etcd.log"));
        let client = client(
            &etcd_pki.join("ca.crt"),
            Some((
                &pki.join("apiserver-etcd-client.crt"),
                &pki.join("apiserver-etcd-client.key"),
            )),
        );
        let health = format!("{url}/health");
        wait_for("etcd to report healthy", DEADLINE, || {
            let response = get(&health, &client)?;
            if response.status == 200 && response.body.contains(r#""health":"true""#) {
                Ok(())
            } else {
                Err(format!("{response:?}"))
            }
        });
        Etcd { process, url }
    }

    pub fn stop(&mut self) {
        self.process.kill();
    }
}

/// A client trusting `ca`, presenting `pair` if given.
pub fn client(ca: &Path, pair: Option<(&Path, &Path)>) -> TlsConfig {
    k8s_sim::client_config(ca, pair, SystemTime::now()).unwrap()
}

/// A client that accepts any server certificate and presents none (for the self-signed
/// kube-controller-manager and kube-scheduler endpoints).
pub fn insecure_client() -> TlsConfig {
    TlsConfig::builder()
        .disable_verification(true)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .build()
}

/// One HTTPS GET with a short timeout.
pub fn get(url: &str, client: &TlsConfig) -> Result<HttpResponse, String> {
    k8s_sim::https_get(url, client, Duration::from_secs(3))
}

/// Waits until `url` answers `status` with a body containing `body`.
pub fn wait_for_status(url: &str, client: &TlsConfig, status: u16, body: &str) -> HttpResponse {
    wait_for(&format!("{url} to answer {status}"), DEADLINE, || {
        let response = get(url, client)?;
        if response.status == status && response.body.contains(body) {
            Ok(response)
        } else {
            Err(format!("{response:?}"))
        }
    })
}

/// The k8s-sim binary under test.
pub fn k8s_sim_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_k8s-sim"))
}

/// A folder of `kube-apiserver`, `kube-controller-manager` and `kube-scheduler` symlinks to
/// k8s-sim, to put first on `PATH`.
pub fn component_bin_dir(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for name in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        std::os::unix::fs::symlink(k8s_sim_bin(), bin.join(name)).unwrap();
    }
    bin
}

/// `PATH` with `dir` first.
pub fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// kube-apiserver flags as kubeadm writes them, with the PKI under `pki`.
pub fn apiserver_flags(pki: &Path, port: u16, etcd_url: &str) -> Vec<String> {
    let file = |name: &str| pki.join(name).display().to_string();
    vec![
        "--advertise-address=127.0.0.1".to_string(),
        "--allow-privileged=true".to_string(),
        "--authorization-mode=Node,RBAC".to_string(),
        format!("--client-ca-file={}", file("ca.crt")),
        "--enable-admission-plugins=NodeRestriction".to_string(),
        "--enable-bootstrap-token-auth=true".to_string(),
        format!("--etcd-cafile={}", file("etcd/ca.crt")),
        format!("--etcd-certfile={}", file("apiserver-etcd-client.crt")),
        format!("--etcd-keyfile={}", file("apiserver-etcd-client.key")),
        format!("--etcd-servers={etcd_url}"),
        format!(
            "--kubelet-client-certificate={}",
            file("apiserver-kubelet-client.crt")
        ),
        format!(
            "--kubelet-client-key={}",
            file("apiserver-kubelet-client.key")
        ),
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".to_string(),
        format!(
            "--proxy-client-cert-file={}",
            file("front-proxy-client.crt")
        ),
        format!("--proxy-client-key-file={}", file("front-proxy-client.key")),
        format!(
            "--requestheader-client-ca-file={}",
            file("front-proxy-ca.crt")
        ),
        "--requestheader-allowed-names=front-proxy-client".to_string(),
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={port}"),
        "--service-cluster-ip-range=10.96.0.0/12".to_string(),
        format!("--tls-cert-file={}", file("apiserver.crt")),
        format!("--tls-private-key-file={}", file("apiserver.key")),
    ]
}
