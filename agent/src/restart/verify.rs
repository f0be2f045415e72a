//! Live verification: connect to a component over TLS, take the certificate it serves, and ask
//! its health endpoint, so that a renewal is proven by the running process, not by the files.
//!
//! The server certificate must chain to the given CA (webpki), but its names are not checked:
//! the endpoint is often reached on an address the certificate does not name (kubeadm's
//! apiserver certificate has no 127.0.0.1), and what matters is which certificate is served,
//! compared by SHA-256 with the file on disk.
//!
//! The handshake is certrotor's own (rustls, to see the served certificate); the health request
//! then runs through ureq on that same connection (a one-shot ureq transport).
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

use crate::sys::message_error::message_error;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, LazyBuffers, NextTimeout, Transport,
};

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

message_error!(
    /// Why a probe failed.
    #[derive(Debug, Clone, PartialEq, Eq)]
    ProbeError
);

/// Connects, completes the TLS handshake, records the served certificate, and GETs the path.
pub fn probe(p: &Probe) -> Result<Observation, ProbeError> {
    let err = |what: &str, e: &dyn fmt::Display| {
        ProbeError(format!("https://{}{}: {what}: {e}", p.address, p.path))
    };
    let config = client_config(p).map_err(|e| err("TLS setup", &e))?;
    let name = ServerName::IpAddress(p.address.ip().into());
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| err("TLS setup", &e))?;
    // `timeout` bounds the whole probe, not each read: a server that trickles its handshake a
    // byte at a time cannot hold the caller (issue 30.7).
    let deadline = std::time::Instant::now() + p.timeout;
    let left = || {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        (!left.is_zero())
            .then_some(left)
            .ok_or_else(|| err("timeout", &format!("no answer within {:?}", p.timeout)))
    };
    let mut sock =
        TcpStream::connect_timeout(&p.address, p.timeout).map_err(|e| err("connect", &e))?;
    while conn.is_handshaking() {
        let left = left()?;
        sock.set_read_timeout(Some(left))
            .map_err(|e| err("socket", &e))?;
        sock.set_write_timeout(Some(left))
            .map_err(|e| err("socket", &e))?;
        conn.complete_io(&mut sock)
            .map_err(|e| err("TLS handshake", &e))?;
    }
    let left = left()?;
    sock.set_read_timeout(Some(left))
        .map_err(|e| err("socket", &e))?;
    sock.set_write_timeout(Some(left))
        .map_err(|e| err("socket", &e))?;
    let served = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| {
            crate::pki::hex(
                aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, c.as_ref()).as_ref(),
            )
        })
        .ok_or_else(|| err("TLS handshake", &"the server presented no certificate"))?;
    // The HTTP exchange goes through ureq on this very connection: the certificate recorded
    // above is the one that answers.
    let stream = rustls::StreamOwned::new(conn, sock);
    let agent = ureq::Agent::with_parts(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(left))
            .max_redirects(0)
            .max_idle_connections(0)
            .user_agent("certrotor")
            .build(),
        Opened(std::sync::Mutex::new(Some(stream))),
        AtAddress(p.address),
    );
    let url = format!("https://{}{}", p.address, p.path);
    let mut response = agent.get(&url).call().map_err(|e| err("request", &e))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_RESPONSE as u64)
        .read_to_vec()
        .map_err(|e| err("response", &e))?;
    let body = String::from_utf8_lossy(&body).trim().to_string();
    Ok(Observation {
        served_sha256: served,
        status,
        body,
    })
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A ureq connector that hands out the probe's already-established TLS connection, once.
struct Opened(std::sync::Mutex<Option<TlsStream>>);

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Opened")
    }
}

impl<In: Transport> Connector<In> for Opened {
    type Out = Established;

    fn connect(
        &self,
        details: &ConnectionDetails,
        _chained: Option<In>,
    ) -> Result<Option<Established>, ureq::Error> {
        let stream = self
            .0
            .lock()
            .ok()
            .and_then(|mut slot| slot.take())
            .ok_or(ureq::Error::ConnectionFailed)?;
        let config = details.config;
        Ok(Some(Established {
            stream,
            buffers: LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size()),
        }))
    }
}

/// Resolves to the probed address (the URL names it too; no lookup happens).
#[derive(Debug)]
struct AtAddress(SocketAddr);

impl Resolver for AtAddress {
    fn resolve(
        &self,
        _uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addresses = self.empty();
        addresses.push(self.0);
        Ok(addresses)
    }
}

/// The probe's TLS connection as ureq's transport.
struct Established {
    stream: TlsStream,
    buffers: LazyBuffers,
}

impl fmt::Debug for Established {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Established({:?})", self.stream.sock.peer_addr().ok())
    }
}

/// The time left for the next I/O step, or ureq's timeout error if none is left.
fn time_left(timeout: NextTimeout) -> Result<Option<Duration>, ureq::Error> {
    if timeout.after.is_zero() {
        Err(ureq::Error::Timeout(timeout.reason))
    } else {
        Ok(timeout.not_zero().map(|left| *left))
    }
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

impl Transport for Established {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        self.stream.sock.set_write_timeout(time_left(timeout)?)?;
        let output = &self.buffers.output()[..amount];
        match self
            .stream
            .write_all(output)
            .and_then(|()| self.stream.flush())
        {
            Ok(()) => Ok(()),
            Err(e) if timed_out(&e) => Err(ureq::Error::Timeout(timeout.reason)),
            Err(e) => Err(e.into()),
        }
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let timeout = timeout.for_read();
        self.stream.sock.set_read_timeout(time_left(timeout)?)?;
        loop {
            match self.stream.read(self.buffers.input_append_buf()) {
                Ok(n) => {
                    self.buffers.input_appended(n);
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // A peer that closes without close_notify: the end of a close-delimited body.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) if timed_out(&e) => return Err(ureq::Error::Timeout(timeout.reason)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn is_open(&mut self) -> bool {
        // One request per probe: never reused.
        false
    }

    fn is_tls(&self) -> bool {
        true
    }
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
    wait_port(address, false, timeout, poll).map_err(|secs| {
        ProbeError(format!(
            "{address} still accepts connections after {secs}s: the old process did not stop"
        ))
    })
}

/// Waits until something accepts TCP connections on `address` (a component starting again).
pub fn wait_open(address: SocketAddr, timeout: Duration, poll: Duration) -> Result<(), ProbeError> {
    wait_port(address, true, timeout, poll).map_err(|secs| {
        ProbeError(format!(
            "nothing accepts connections on {address} after {secs}s"
        ))
    })
}

/// Polls `address` until accepting connections is `open`; `Err(seconds waited)` past `timeout`.
fn wait_port(
    address: SocketAddr,
    open: bool,
    timeout: Duration,
    poll: Duration,
) -> Result<(), u64> {
    let start = Instant::now();
    loop {
        let accepts =
            TcpStream::connect_timeout(&address, poll.max(Duration::from_millis(100))).is_ok();
        if accepts == open {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(timeout.as_secs());
        }
        std::thread::sleep(poll);
    }
}

fn client_config(p: &Probe) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(crate::pki::tls::provider());
    let chain = match &p.ca_pem {
        Some(ca_pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem) {
                let cert = cert.map_err(|e| format!("CA PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("CA certificate: {e}"))?;
            }
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            );
            Some(verifier.build().map_err(|e| format!("verifier: {e}"))?)
        }
        None => None,
    };
    let verifier = Arc::new(NamesIgnored {
        chain,
        provider: provider.clone(),
    });
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

/// Accepts any name; checks the chain to the given CA when there is one (`chain`), else accepts
/// any certificate (health checks of self-signed servers only); the handshake signatures are
/// always checked with the certificate presented (so the peer holds the key of what it
/// presents), with the provider's algorithms (what the WebPKI verifier uses too).
#[derive(Debug)]
struct NamesIgnored {
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for NamesIgnored {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
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
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(m, c, d, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(m, c, d, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
