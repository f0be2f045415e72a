//! TEST DOUBLES of the two servers kube-apiserver is a TLS client of with a renewable client
//! certificate, recording which certificate it presents on which connection:
//!
//! * [`Personality::Kubelet`]: the kubelet's API port (10250), kubelet-sim's `--serve-api`:
//!   what kube-apiserver meets with its kubelet client certificate (`kubectl logs`, node
//!   proxy). It answers `GET /healthz` and `GET /containerLogs/{namespace}/{pod}/{container}`
//!   (the log kubelet-sim keeps of the static pod named by the container, else by the pod).
//! * [`Personality::Aggregated`]: an aggregated API server (what an APIService points to):
//!   what kube-apiserver's aggregator meets with its front-proxy client certificate. It
//!   authenticates the front proxy as `k8s.io/apiserver` does (the request-header client CA,
//!   and a CN among the allowed names) and serves one group-version with one list resource
//!   `echoes`: `GET /apis/<group>/<version>` (also the aggregator's availability check) and
//!   `GET /apis/<group>/<version>/echoes`.
//!
//! What matters is the apiserver's client side: which certificate it presents, on which
//! connection. The server side that decides it is reproduced: TLS with a self-signed serving
//! certificate (kubeadm gives the apiserver no `--kubelet-certificate-authority`; the tests'
//! APIService skips verification), HTTP/1.1 keep-alive, and x509 authentication **per
//! request** against the client CA (the kubelet's `authentication.x509.clientCAFile`, the
//! aggregated server's `--requestheader-client-ca-file`): a certificate that does not pass gets
//! 401 and the connection stays open, as their authentication filters do. Every certificate is
//! accepted at the handshake so that it is recorded.
//!
//! Each request is a JSON line in the record file: `t_ms`, `conn` (the connection's number),
//! `peer`, `sha256` of the client certificate's DER, `issuer_cn`, `status`, `path`, `user` (the
//! front proxy's `X-Remote-User`). [`Server::drop_connections`] closes every open connection, as
//! a kubelet restart does (kubelet-sim calls it on SIGUSR1).
//!
//! Where they differ from the real servers: no authorization (the kubelet asks the apiserver
//! with a SubjectAccessReview), no exec/attach/port-forward, no streaming (`follow`), only the
//! first container of a pod has a log; the aggregated server has no storage and no OpenAPI.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConnection, WebPkiClientVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme, StreamOwned,
};
use x509_cert::der::Decode;

use crate::k8s_sim;

/// Largest request body read (requests here have none).
const MAX_BODY: usize = 64 * 1024;

/// Which server to stand in for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Personality {
    /// The kubelet's API port; `log_dir` is where kubelet-sim keeps the pods' logs.
    Kubelet { log_dir: Option<PathBuf> },
    /// An aggregated API server of `group_version` (`certrotor.test/v1`); the client
    /// certificate's CN must be one of `allowed_names` (`--requestheader-allowed-names`).
    Aggregated {
        group_version: String,
        allowed_names: Vec<String>,
    },
}

/// Where to listen, what to trust, where to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Where to listen (`--serve-api`; port 0: any free port, see [`Server::address`]).
    pub address: SocketAddr,
    /// The client CA requests are authenticated against (`--client-ca-file`).
    pub client_ca_file: PathBuf,
    /// Where each request is recorded (`--api-record`).
    pub record_file: PathBuf,
}

/// A running stand-in.
pub struct Server {
    address: SocketAddr,
    open: Arc<Mutex<BTreeMap<u64, TcpStream>>>,
}

impl Server {
    /// Binds, and serves in threads until the process ends.
    pub fn start(config: &ApiConfig, personality: Personality) -> Result<Server, String> {
        let provider = Arc::new(k8s_sim::provider());
        let ca_label = config.client_ca_file.display().to_string();
        let ca = k8s_sim::read_file(&config.client_ca_file).map_err(|e| e.to_string())?;
        let roots =
            k8s_sim::load_roots(&ca, &ca_label, SystemTime::now()).map_err(|e| e.to_string())?;
        let authenticator = WebPkiClientVerifier::builder_with_provider(
            Arc::new(k8s_sim::root_store(roots)),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("client CA '{ca_label}': {e}"))?;
        let self_signed =
            rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
                .map_err(|e| format!("cannot make a serving certificate: {e}"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            self_signed.signing_key.serialize_der(),
        ));
        let tls = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(Arc::new(RecordAny { provider }))
            .with_single_cert(vec![self_signed.cert.der().clone()], key)
            .map_err(|e| e.to_string())?;
        let listener = TcpListener::bind(config.address)
            .map_err(|e| format!("cannot listen on {}: {e}", config.address))?;
        let address = listener.local_addr().map_err(|e| e.to_string())?;
        let record = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&config.record_file)
            .map_err(|e| format!("cannot open '{}': {e}", config.record_file.display()))?;
        let open = Arc::new(Mutex::new(BTreeMap::new()));
        let shared = Arc::new(Shared {
            tls: Arc::new(tls),
            authenticator,
            record: Mutex::new(record),
            personality,
            next: AtomicU64::new(1),
            open: open.clone(),
        });
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let shared = shared.clone();
                thread::spawn(move || shared.connection(stream));
            }
        });
        Ok(Server { address, open })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Closes every open connection (what a kubelet restart does to the apiserver's pool);
    /// how many there were.
    pub fn drop_connections(&self) -> usize {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.len();
        for (_, s) in std::mem::take(&mut *open) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        n
    }
}

/// What the connection threads share.
struct Shared {
    tls: Arc<ServerConfig>,
    authenticator: Arc<dyn ClientCertVerifier>,
    record: Mutex<File>,
    personality: Personality,
    next: AtomicU64,
    open: Arc<Mutex<BTreeMap<u64, TcpStream>>>,
}

impl Shared {
    fn connection(&self, stream: TcpStream) {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "unknown".into(), |a| a.to_string());
        if let Ok(clone) = stream.try_clone() {
            self.open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, clone);
        }
        if let Err(e) = self.serve(id, &peer, stream) {
            eprintln!("recording API stand-in: connection {id} from {peer}: {e}");
        }
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }

    /// Serves requests on one connection until the peer closes it (keep-alive).
    fn serve(&self, id: u64, peer: &str, stream: TcpStream) -> io::Result<()> {
        let conn = ServerConnection::new(self.tls.clone()).map_err(io::Error::other)?;
        let mut tls = StreamOwned::new(conn, stream);
        loop {
            let (target, head) = {
                let mut reader = BufReader::new(&mut tls);
                let (_, target, head) = match crate::http::read_request_head(&mut reader) {
                    Ok(None) => return Ok(()),
                    Ok(Some(request)) => request,
                    Err(e) => return Err(io::Error::other(e.to_string())),
                };
                crate::http::read_request_body(&mut reader, &head, MAX_BODY)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                if !reader.buffer().is_empty() {
                    return Err(io::Error::other("pipelined requests are not served"));
                }
                (target, head)
            };
            let path = target.split('?').next().unwrap_or_default().to_string();
            let cert = tls
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .cloned();
            let authenticated = cert.as_ref().is_some_and(|c| self.authenticates(c));
            let (status, body, content_type) = if authenticated {
                self.answer(&path)
            } else {
                (
                    401,
                    br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
                        .to_vec(),
                    "application/json",
                )
            };
            let user = head.header("x-remote-user").map(str::to_string);
            self.record(id, peer, cert.as_ref(), (status, &path, user.as_deref()));
            let close = head
                .header("connection")
                .is_some_and(|v| v.eq_ignore_ascii_case("close"));
            crate::http::write_response(&mut tls, status, Some(content_type), &body, close)?;
            if close {
                tls.conn.send_close_notify();
                return tls.flush();
            }
        }
    }

    /// x509 authentication of one request: the certificate chains to the client CA (and, for
    /// an aggregated server, names an allowed front proxy).
    fn authenticates(&self, cert: &CertificateDer<'_>) -> bool {
        let chains = self
            .authenticator
            .verify_client_cert(cert, &[], UnixTime::now())
            .is_ok();
        chains
            && match &self.personality {
                Personality::Kubelet { .. } => true,
                Personality::Aggregated { allowed_names, .. } => {
                    cert_cn(cert.as_ref(), CnOf::Subject)
                        .is_some_and(|cn| allowed_names.contains(&cn))
                }
            }
    }

    /// What an authenticated request gets.
    fn answer(&self, path: &str) -> (u16, Vec<u8>, &'static str) {
        match &self.personality {
            Personality::Kubelet { log_dir } => kubelet_answer(log_dir.as_deref(), path),
            Personality::Aggregated { group_version, .. } => aggregated_answer(group_version, path),
        }
    }

    fn record(
        &self,
        id: u64,
        peer: &str,
        cert: Option<&CertificateDer<'_>>,
        (status, path, user): (u16, &str, Option<&str>),
    ) {
        let sha256 = cert.map(|c| {
            base16ct::lower::encode_string(
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, c.as_ref()).as_ref(),
            )
        });
        let issuer_cn = cert.and_then(|c| cert_cn(c.as_ref(), CnOf::Issuer));
        let t_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let line = serde_json::json!({
            "t_ms": t_ms,
            "conn": id,
            "peer": peer,
            "sha256": sha256,
            "issuer_cn": issuer_cn,
            "status": status,
            "path": path,
            "user": user,
        });
        let mut f = self.record.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(f, "{line}");
    }
}

/// The kubelet's answers: `/healthz`, and the log of a static pod kubelet-sim runs.
fn kubelet_answer(log_dir: Option<&Path>, path: &str) -> (u16, Vec<u8>, &'static str) {
    if path == "/healthz" {
        return (200, b"ok".to_vec(), "text/plain; charset=utf-8");
    }
    if let Some(rest) = path.strip_prefix("/containerLogs/")
        && let [_, pod, container] = rest.split('/').collect::<Vec<_>>().as_slice()
    {
        let log = [container, pod].iter().find_map(|name| {
            let safe = !name.is_empty() && !name.contains("..") && !name.starts_with('.');
            let dir = log_dir.filter(|_| safe)?;
            std::fs::read(dir.join(format!("{name}.log"))).ok()
        });
        return match log {
            Some(bytes) => (200, bytes, "text/plain"),
            None => (
                404,
                format!("container \"{container}\" in pod \"{pod}\" is not available\n")
                    .into_bytes(),
                "text/plain",
            ),
        };
    }
    (404, b"404 page not found\n".to_vec(), "text/plain")
}

/// The aggregated API server's answers: its group-version's resource list, and an empty list of
/// `echoes`.
fn aggregated_answer(group_version: &str, path: &str) -> (u16, Vec<u8>, &'static str) {
    let base = format!("/apis/{group_version}");
    let body = if path.trim_end_matches('/') == base {
        serde_json::json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [{
                "name": "echoes",
                "singularName": "",
                "namespaced": false,
                "kind": "Echo",
                "verbs": ["get", "list"],
            }],
        })
    } else if path == format!("{base}/echoes") {
        serde_json::json!({
            "kind": "EchoList",
            "apiVersion": group_version,
            "metadata": {},
            "items": [],
        })
    } else {
        return (404, b"404 page not found\n".to_vec(), "text/plain");
    };
    (200, body.to_string().into_bytes(), "application/json")
}

/// Which name of a certificate.
#[derive(Clone, Copy)]
enum CnOf {
    Subject,
    Issuer,
}

/// The subject's or issuer's common name of a DER certificate.
fn cert_cn(der: &[u8], of: CnOf) -> Option<String> {
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    let cn = x509_cert::der::oid::db::rfc4519::CN;
    let name = match of {
        CnOf::Subject => &cert.tbs_certificate.subject,
        CnOf::Issuer => &cert.tbs_certificate.issuer,
    };
    name.0.iter().find_map(|rdn| {
        rdn.0.iter().find(|atv| atv.oid == cn).and_then(|atv| {
            x509_cert::der::asn1::Utf8StringRef::try_from(&atv.value)
                .map(|s| s.as_str().to_string())
                .or_else(|_| {
                    x509_cert::der::asn1::PrintableStringRef::try_from(&atv.value)
                        .map(|s| s.as_str().to_string())
                })
                .ok()
        })
    })
}

/// Accepts any client certificate at the handshake (and none): authentication happens per
/// request. Signatures are still checked, so the peer holds the key of what it presents.
#[derive(Debug)]
struct RecordAny {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ClientCertVerifier for RecordAny {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Parses `--serve-api`'s address.
pub fn parse_address(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("'--serve-api' needs IP:PORT, got '{text}'"))
}
