//! Live verification: connect to a component over TLS, take the certificate it serves, and ask
//! its health endpoint, so that a renewal is proven by the running process, not by the files.
//!
//! The server certificate must chain to the given CA (webpki), but its names are not checked:
//! the endpoint is often reached on an address the certificate does not name (kubeadm's
//! apiserver certificate has no 127.0.0.1), and what matters is which certificate is served,
//! compared by SHA-256 with the file on disk.
//!
//! What this module does not do: retry. [`wait_for`] polls a probe until a deadline.

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, SignatureScheme};
use rustls_pki_types::pem::PemObject;

/// Largest HTTP response read from a health endpoint.
const MAX_RESPONSE: usize = 64 * 1024;

/// One TLS health probe.
#[derive(Clone)]
pub struct Probe {
    pub address: SocketAddr,
    /// The health path, e.g. `/readyz` (kube-apiserver) or `/health` (etcd).
    pub path: String,
    /// PEM of the CA the served certificate must chain to. `None` accepts any certificate: only
    /// for health checks of components that serve an in-memory self-signed certificate
    /// (kube-controller-manager, kube-scheduler), where nothing is compared.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate and key (mTLS), if the endpoint requires one.
    pub client_cert_pem: Option<Vec<u8>>,
    /// Zeroed when the probe is dropped.
    pub client_key_pem: Option<Vec<u8>>,
    pub timeout: Duration,
}

impl Drop for Probe {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.client_key_pem);
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Probe(https://{}{})", self.address, self.path)
    }
}

/// What a probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// SHA-256 of the DER of the certificate the server presented (lower-case hex).
    pub served_sha256: String,
    pub status: u16,
    pub body: String,
}

impl Observation {
    /// HTTP 200, and for etcd's `/health` a `"health":"true"` body.
    pub fn healthy(&self) -> bool {
        self.status == 200
            && (!self.body.contains("\"health\"") || self.body.contains("\"health\":\"true\""))
    }
}

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeError(pub String);

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProbeError {}

/// Connects, completes the TLS handshake, records the served certificate, and GETs the path.
pub fn probe(p: &Probe) -> Result<Observation, ProbeError> {
    let err = |what: &str, e: &dyn fmt::Display| {
        ProbeError(format!("https://{}{}: {what}: {e}", p.address, p.path))
    };
    let config = client_config(p).map_err(|e| err("TLS setup", &e))?;
    let name = ServerName::IpAddress(p.address.ip().into());
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| err("TLS setup", &e))?;
    let mut sock =
        TcpStream::connect_timeout(&p.address, p.timeout).map_err(|e| err("connect", &e))?;
    sock.set_read_timeout(Some(p.timeout))
        .map_err(|e| err("socket", &e))?;
    sock.set_write_timeout(Some(p.timeout))
        .map_err(|e| err("socket", &e))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)
            .map_err(|e| err("TLS handshake", &e))?;
    }
    let served = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| {
            crate::pki::hex(
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, c.as_ref()).as_ref(),
            )
        })
        .ok_or_else(|| err("TLS handshake", &"the server presented no certificate"))?;
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: certrotor\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        p.path, p.address
    );
    tls.write_all(request.as_bytes())
        .map_err(|e| err("send", &e))?;
    let mut response = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tls.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                response.extend_from_slice(&chunk[..n]);
                if response.len() > MAX_RESPONSE {
                    break;
                }
            }
            // A peer that closes without close_notify still sent a complete response.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) if !response.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
                break;
            }
            Err(e) => return Err(err("read", &e)),
        }
    }
    let text = String::from_utf8_lossy(&response);
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| err("response", &"not an HTTP response"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.trim().to_string())
        .unwrap_or_default();
    Ok(Observation {
        served_sha256: served,
        status,
        body,
    })
}

/// Polls `probe` until `accept` says yes or `timeout` passes; returns the last observation or
/// error in the failure message.
pub fn wait_for(
    p: &Probe,
    timeout: Duration,
    poll: Duration,
    accept: impl Fn(&Observation) -> bool,
) -> Result<Observation, ProbeError> {
    let start = Instant::now();
    loop {
        let last = match probe(p) {
            Ok(o) if accept(&o) => return Ok(o),
            Ok(o) => format!(
                "served certificate sha256 {}, HTTP {} '{}'",
                o.served_sha256, o.status, o.body
            ),
            Err(e) => e.0,
        };
        if start.elapsed() >= timeout {
            return Err(ProbeError(format!(
                "https://{}{} not as expected after {}s; last: {last}",
                p.address,
                p.path,
                timeout.as_secs()
            )));
        }
        std::thread::sleep(poll);
    }
}

/// Waits until nothing accepts TCP connections on `address` (the old process is gone).
pub fn wait_closed(
    address: SocketAddr,
    timeout: Duration,
    poll: Duration,
) -> Result<(), ProbeError> {
    let start = Instant::now();
    loop {
        if TcpStream::connect_timeout(&address, poll.max(Duration::from_millis(100))).is_err() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(ProbeError(format!(
                "{address} still accepts connections after {}s: the old process did not stop",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(poll);
    }
}

fn client_config(p: &Probe) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match &p.ca_pem {
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem) {
                let cert = cert.map_err(|e| format!("CA PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("CA certificate: {e}"))?;
            }
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("verifier: {e}"))?;
            Arc::new(ChainOnly { inner })
        }
        None => Arc::new(AnyCert(provider.clone())),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&p.client_cert_pem, &p.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// Verifies the chain to the given CA and the handshake signatures; accepts any name.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

/// Accepts any server certificate but still checks the handshake signatures with it (so the
/// peer holds the key of what it presents). Health checks of self-signed servers only.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls12_signature(m, c, d)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.inner.verify_tls13_signature(m, c, d)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
