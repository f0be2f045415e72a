//! k8s-sim: test doubles for kube-apiserver, kube-controller-manager and kube-scheduler.
//!
//! certrotor's verify step needs live control-plane endpoints that really use the certificates on
//! disk: a stale or mismatched certificate must fail the way it fails in a cluster. This module
//! imitates the certificate-facing behaviour of the three components, busybox-style (one binary,
//! dispatching on `argv[0]` or on its first argument):
//!
//! * **kube-apiserver** loads every certificate and key it is given at startup and refuses to start
//!   (exit 1) when a file is missing, a key does not match its certificate or a certificate has
//!   expired. It serves HTTPS with the serving pair, requires a client certificate signed by
//!   `--client-ca-file`, and answers `/livez` (always `ok`), `/readyz` and `/healthz` (`ok` only when
//!   an mTLS `GET /health` to etcd, with the etcd client certificate loaded at startup, returns
//!   `{"health":"true"}`).
//! * **kube-controller-manager**, **kube-scheduler** and a **kube-vip** stand-in load their kubeconfig(s) (embedded or file
//!   certificate data) with the same checks, serve HTTPS with an in-memory self-signed certificate,
//!   and answer `/healthz` with `ok` only when an mTLS `GET <server>/readyz` with the kubeconfig's
//!   client certificate succeeds.
//!
//! Every flag of the real components is accepted (`--flag=value` or `--flag value`); the ones not
//! listed in [`USAGE`] are ignored, so realistic kubeadm manifests work unchanged.
//!
//! # Where it differs from the real components
//!
//! * No Kubernetes API at all: only the health endpoints above; other paths return 404.
//! * The real kube-apiserver asks for but does not require a client certificate (anonymous
//!   requests may read `/readyz`); this stand-in requires one, so a wrong client CA really fails.
//! * Startup checks are stricter: the real apiserver starts with an expired serving certificate.
//! * Nothing is reloaded: the real apiserver reloads its serving certificate and client CA from
//!   disk; here every certificate needs a restart, like the etcd client certificate really does.
//! * Results of the health checks are cached for at most [`HEALTH_CACHE`].
//! * Test switch `--sim-reject-serving-cert-issued-after=<RFC3339>` (or the environment variable
//!   [`REJECT_ENV`]): the apiserver refuses to start when its serving certificate's notBefore is
//!   later, to exercise certrotor's rollback.
//! * HTTP is minimal: one request per connection, any method treated like GET.
//! * Keys are never logged; errors name files, never contents.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::server::{ServerConnection, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig, StreamOwned};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::Deserialize;
use ureq::tls::TlsConfig;
use x509_cert::der::Decode;

/// Command-line help.
pub const USAGE: &str = "\
Usage: k8s-sim COMPONENT [FLAGS...]   or   COMPONENT [FLAGS...] (via a symlink named COMPONENT)

Test double for control-plane components. COMPONENT is kube-apiserver, kube-controller-manager
or kube-scheduler. Flags of the real components are accepted; these are used:

kube-apiserver:
  --secure-port (6443) --bind-address|--advertise-address (0.0.0.0)
  --tls-cert-file --tls-private-key-file --client-ca-file
  --etcd-servers --etcd-cafile --etcd-certfile --etcd-keyfile
  --kubelet-client-certificate --kubelet-client-key
  --proxy-client-cert-file --proxy-client-key-file --requestheader-client-ca-file
  --sim-reject-serving-cert-issued-after=RFC3339 (test switch; env K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER)
kube-controller-manager / kube-scheduler (and kube-vip with --kubeconfig, the lab's probe-ful
stand-in, port 2112):
  --kubeconfig --authentication-kubeconfig --authorization-kubeconfig
  --secure-port (10257 / 10259) --bind-address (127.0.0.1)
kube-vip manager: EKS Anywhere's kube-vip (testbed::kube_vip): its environment (vip_*, port,
  address, prometheus_server), the kubeconfig /etc/kubernetes/admin.conf read once, the
  plndr-cp-lock Lease through the real apiserver; exits 1 when it loses leadership

Exit codes: 1 failed to start, 2 usage error; otherwise it serves until killed.";

/// Environment variable that sets the apiserver's reject switch when the flag is absent.
pub const REJECT_ENV: &str = "K8S_SIM_REJECT_SERVING_CERT_ISSUED_AFTER";

/// How long a health-check result is reused: short, so a stopped etcd or apiserver shows within
/// a second, yet long enough that a burst of probes does not hammer the upstream.
pub const HEALTH_CACHE: Duration = Duration::from_millis(500);

/// Connect, read and write timeout for outgoing health checks.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Read and write timeout for incoming connections.
const SERVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest accepted request head or response.
const MAX_MESSAGE: usize = 1 << 20;

/// The component to imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// kube-apiserver.
    ApiServer,
    /// kube-controller-manager.
    ControllerManager,
    /// kube-scheduler.
    Scheduler,
    /// A kube-vip stand-in: what matters to certrotor is that kube-vip reads a kubeconfig
    /// (admin.conf, mounted as a single file) at start; it behaves as the scheduler does (the
    /// kubeconfig checked at start, `/healthz` ok only while its client certificate reaches the
    /// apiserver), default port 2112. Real kube-vip serves no HTTPS health endpoint.
    KubeVip,
}

impl Component {
    /// The component named `name` (a program file name).
    pub fn from_name(name: &str) -> Option<Component> {
        match name {
            "kube-apiserver" => Some(Component::ApiServer),
            "kube-controller-manager" => Some(Component::ControllerManager),
            "kube-scheduler" => Some(Component::Scheduler),
            "kube-vip" => Some(Component::KubeVip),
            _ => None,
        }
    }

    /// The component's program name.
    pub fn name(self) -> &'static str {
        match self {
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::KubeVip => "kube-vip",
        }
    }
}

/// Parsed flags: name without dashes -> value (`true` for a bare boolean flag). The last one wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags(BTreeMap<String, String>);

impl Flags {
    /// The value of flag `name` (without dashes), if given and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }
}

/// Errors that keep a component from starting.
#[derive(Debug)]
pub enum Error {
    /// Bad command line.
    Usage(String),
    /// A required flag is missing.
    MissingFlag {
        /// The flag, with dashes.
        flag: &'static str,
    },
    /// A flag has a value that cannot be used.
    InvalidFlag {
        /// The flag, with dashes.
        flag: &'static str,
        /// Its value.
        value: String,
        /// Why it is unusable.
        reason: String,
    },
    /// A file could not be read.
    ReadFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A certificate file holds no certificate or one that cannot be parsed.
    ParseCert {
        /// Where it came from.
        source_name: String,
        /// Why.
        reason: String,
    },
    /// A certificate is past its notAfter.
    Expired {
        /// Where it came from.
        source_name: String,
        /// Its notAfter.
        not_after: String,
    },
    /// A key file holds no usable private key.
    ParseKey {
        /// Where it came from.
        source_name: String,
        /// Why.
        reason: String,
    },
    /// A key does not belong to its certificate.
    KeyMismatch {
        /// Where the key came from.
        key: String,
        /// Where the certificate came from.
        cert: String,
    },
    /// The apiserver's test switch rejected the serving certificate.
    RejectedByTestSwitch {
        /// The serving certificate file.
        cert: String,
        /// Its notBefore.
        not_before: String,
        /// The switch's instant.
        after: String,
    },
    /// A kubeconfig could not be used.
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A TLS configuration could not be built.
    Tls(String),
    /// The listening socket could not be opened.
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        source: io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(message) => write!(f, "{message}; run 'k8s-sim --help' for usage"),
            Error::MissingFlag { flag } => write!(f, "flag '{flag}' is required"),
            Error::InvalidFlag {
                flag,
                value,
                reason,
            } => write!(f, "invalid value '{value}' for flag '{flag}': {reason}"),
            Error::ReadFile { path, source } => {
                write!(f, "failed to read '{}': {source}", path.display())
            }
            Error::ParseCert {
                source_name,
                reason,
            } => write!(f, "failed to parse certificate '{source_name}': {reason}"),
            Error::Expired {
                source_name,
                not_after,
            } => write!(f, "certificate '{source_name}' expired at {not_after}"),
            Error::ParseKey {
                source_name,
                reason,
            } => write!(f, "failed to load private key '{source_name}': {reason}"),
            Error::KeyMismatch { key, cert } => {
                write!(f, "private key '{key}' does not match certificate '{cert}'")
            }
            Error::RejectedByTestSwitch {
                cert,
                not_before,
                after,
            } => write!(
                f,
                "serving certificate rejected by test switch: '{cert}' notBefore {not_before} is \
                 after {after}"
            ),
            Error::Kubeconfig { path, reason } => {
                write!(f, "failed to use kubeconfig '{}': {reason}", path.display())
            }
            Error::Tls(reason) => write!(f, "failed to set up TLS: {reason}"),
            Error::Bind { address, source } => {
                write!(f, "failed to listen on '{address}': {source}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// An HTTP response received by [`https_get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Body as text (lossy UTF-8).
    pub body: String,
}

/// Picks the component from `argv[0]`'s file name or, failing that, from the first argument, and
/// returns it with the remaining arguments.
pub fn select(argv: &[String]) -> Result<(Component, &[String]), Error> {
    let program = argv
        .first()
        .and_then(|arg0| Path::new(arg0).file_name())
        .and_then(|name| name.to_str())
        .unwrap_or_default();
    if let Some(component) = Component::from_name(program) {
        return Ok((component, argv.get(1..).unwrap_or_default()));
    }
    match argv.get(1) {
        Some(first) => match Component::from_name(first) {
            Some(component) => Ok((component, argv.get(2..).unwrap_or_default())),
            None => Err(Error::Usage(format!("unknown component '{first}'"))),
        },
        None => Err(Error::Usage("no component given".to_string())),
    }
}

/// Parses `--flag=value`, `--flag value` and bare boolean `--flag`; single dashes work too.
pub fn parse_flags(args: &[String]) -> Result<Flags, Error> {
    let mut flags = BTreeMap::new();
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        index += 1;
        let Some(stripped) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(Error::Usage(format!("unexpected argument '{arg}'")));
        };
        if let Some((name, value)) = stripped.split_once('=') {
            flags.insert(name.to_string(), value.to_string());
            continue;
        }
        match args.get(index) {
            Some(next) if !next.starts_with('-') => {
                flags.insert(stripped.to_string(), next.clone());
                index += 1;
            }
            _ => {
                flags.insert(stripped.to_string(), "true".to_string());
            }
        }
    }
    Ok(Flags(flags))
}

/// Loads everything `component` needs (failing like the real component would), then serves until
/// the process is killed. Returns only on a startup error or when accepting connections fails.
pub fn run(component: Component, flags: &Flags, reject_env: Option<&str>) -> Result<(), Error> {
    let now = SystemTime::now();
    let prefix = component.name();
    let (listener, tls, handler) = match component {
        Component::ApiServer => start_apiserver(flags, reject_env, now)?,
        Component::ControllerManager => start_kubeconfig_component(flags, 10257, now)?,
        Component::Scheduler => start_kubeconfig_component(flags, 10259, now)?,
        Component::KubeVip => start_kubeconfig_component(flags, 2112, now)?,
    };
    let address = listener.local_addr().map_or_else(
        |error| format!("unknown address ({error})"),
        |address| address.to_string(),
    );
    eprintln!("{prefix} (k8s-sim): serving on https://{address}");
    serve(prefix, listener, tls, handler);
    Ok(())
}

/// An mTLS-capable HTTPS GET through ureq (chunked or sized body, at most 1 MiB).
pub fn https_get(url: &str, tls: &TlsConfig, timeout: Duration) -> Result<HttpResponse, String> {
    if !url.starts_with("https://") {
        return Err(format!("URL '{url}' is not https"));
    }
    let agent = ureq::Agent::config_builder()
        .tls_config(tls.clone())
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .user_agent("k8s-sim")
        .build()
        .new_agent();
    let mut response = agent
        .get(url)
        .call()
        .map_err(|error| format!("request to '{url}' failed: {error}"))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_MESSAGE as u64)
        .read_to_vec()
        .map_err(|error| format!("bad response from '{url}': {error}"))?;
    Ok(HttpResponse {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// A client TLS configuration trusting only the certificates in `ca_file`, optionally presenting
/// the client pair `(cert_file, key_file)`. Checks the pair like the components do at startup.
pub fn client_config(
    ca_file: &Path,
    client_pair: Option<(&Path, &Path)>,
    now: SystemTime,
) -> Result<TlsConfig, Error> {
    let roots = load_roots(&read_file(ca_file)?, &ca_file.display().to_string(), now)?;
    let pair = match client_pair {
        Some((cert_file, key_file)) => Some(load_pair_files(cert_file, key_file, now)?),
        None => None,
    };
    build_client_config(roots, pair)
}

/// Parses an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, fractions and `±hh:mm` offsets
/// allowed). The calendar part is der's `DateTime`; fraction and offset are applied here.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let calendar = text.get(..19)?;
    let date_time: x509_cert::der::DateTime = format!("{calendar}Z").parse().ok()?;
    let mut rest = text.get(19..)?;
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded: String = fraction.chars().take(digits.min(9)).collect();
        let scale = 10u32.pow(9 - u32::try_from(padded.len()).ok()?);
        nanos = padded.parse::<u32>().ok()? * scale;
        rest = fraction.get(digits..)?;
    }
    let offset_seconds: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes().get(3) != Some(&b':') {
                return None;
            }
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (hours * 3600 + minutes * 60)
        }
    };
    let local = date_time.to_system_time();
    let offset = Duration::from_secs(offset_seconds.unsigned_abs());
    let utc = if offset_seconds >= 0 {
        local.checked_sub(offset)?
    } else {
        local.checked_add(offset)?
    };
    utc.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// Formats an instant as RFC 3339 in UTC, whole seconds (der's `DateTime` format; instants
/// outside 1970..=9999 show the nearest end of that range).
pub fn format_rfc3339(instant: SystemTime) -> String {
    use x509_cert::der::DateTime;
    let since = instant
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .min(DateTime::INFINITY.unix_duration());
    let whole = Duration::from_secs(since.as_secs());
    DateTime::from_unix_duration(whole)
        .unwrap_or(DateTime::INFINITY)
        .to_string()
}

// === kube-apiserver ===

type Handler = Arc<dyn Fn(&str) -> (u16, String) + Send + Sync>;

fn start_apiserver(
    flags: &Flags,
    reject_env: Option<&str>,
    now: SystemTime,
) -> Result<(TcpListener, Arc<ServerConfig>, Handler), Error> {
    let required = |flag: &'static str| {
        flags
            .get(flag.trim_start_matches('-'))
            .ok_or(Error::MissingFlag { flag })
    };
    let cert_file = PathBuf::from(required("--tls-cert-file")?);
    let key_file = PathBuf::from(required("--tls-private-key-file")?);
    let client_ca_file = PathBuf::from(required("--client-ca-file")?);
    let etcd_servers: Vec<String> = required("--etcd-servers")?
        .split(',')
        .map(|server| server.trim().trim_end_matches('/').to_string())
        .filter(|server| !server.is_empty())
        .collect();
    let etcd_ca_file = PathBuf::from(required("--etcd-cafile")?);
    let etcd_cert_file = PathBuf::from(required("--etcd-certfile")?);
    let etcd_key_file = PathBuf::from(required("--etcd-keyfile")?);
    let reject_after = match flags
        .get("sim-reject-serving-cert-issued-after")
        .or(reject_env.filter(|value| !value.is_empty()))
    {
        Some(value) => Some(parse_rfc3339(value).ok_or_else(|| Error::InvalidFlag {
            flag: "--sim-reject-serving-cert-issued-after",
            value: value.to_string(),
            reason: "expected RFC 3339, e.g. 2026-01-02T03:04:05Z".to_string(),
        })?),
        None => None,
    };
    let address = listen_address(flags, &["bind-address", "advertise-address"], 6443)?;

    let serving = load_pair_files(&cert_file, &key_file, now)?;
    if let Some(after) = reject_after {
        let not_before = serving.not_before;
        if not_before > after {
            return Err(Error::RejectedByTestSwitch {
                cert: cert_file.display().to_string(),
                not_before: format_rfc3339(not_before),
                after: format_rfc3339(after),
            });
        }
    }
    let client_roots = load_roots(
        &read_file(&client_ca_file)?,
        &client_ca_file.display().to_string(),
        now,
    )?;
    let etcd_roots = load_roots(
        &read_file(&etcd_ca_file)?,
        &etcd_ca_file.display().to_string(),
        now,
    )?;
    let etcd_client = load_pair_files(&etcd_cert_file, &etcd_key_file, now)?;
    for (cert_flag, key_flag) in [
        ("kubelet-client-certificate", "kubelet-client-key"),
        ("proxy-client-cert-file", "proxy-client-key-file"),
    ] {
        match (flags.get(cert_flag), flags.get(key_flag)) {
            (Some(cert), Some(key)) => {
                load_pair_files(Path::new(cert), Path::new(key), now)?;
            }
            (None, None) => {}
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::Usage(format!(
                    "'--{cert_flag}' and '--{key_flag}' must be given together"
                )));
            }
        }
    }
    if let Some(ca) = flags.get("requestheader-client-ca-file") {
        load_roots(&read_file(Path::new(ca))?, ca, now)?;
    }

    let provider = Arc::new(provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(
        Arc::new(root_store(client_roots)),
        provider.clone(),
    )
    .build()
    .map_err(|error| Error::Tls(error.to_string()))?;
    let server_config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| Error::Tls(error.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(serving.chain.clone(), serving.key.clone_key())
        .map_err(|error| Error::Tls(error.to_string()))?;
    eprintln!(
        "kube-apiserver (k8s-sim): serving certificate '{}' serial {} valid {} to {}",
        cert_file.display(),
        serving.serial,
        format_rfc3339(serving.not_before),
        format_rfc3339(serving.not_after)
    );
    eprintln!(
        "kube-apiserver (k8s-sim): etcd client certificate '{}' serial {}",
        etcd_cert_file.display(),
        etcd_client.serial
    );
    let etcd_tls = build_client_config(etcd_roots, Some(etcd_client))?;
    let etcd_check = CachedCheck::new(move || check_etcd(&etcd_servers, &etcd_tls));
    let handler: Handler = Arc::new(move |path: &str| match path {
        "/livez" => (200, "ok".to_string()),
        "/readyz" | "/healthz" => match etcd_check.run() {
            Ok(()) => (200, "ok".to_string()),
            Err(reason) => (
                500,
                format!(
                    "[-]etcd failed: {reason}\n{} check failed\n",
                    path.trim_start_matches('/')
                ),
            ),
        },
        _ => (404, "404 page not found\n".to_string()),
    });
    let listener = bind(address)?;
    Ok((listener, Arc::new(server_config), handler))
}

fn check_etcd(servers: &[String], tls: &TlsConfig) -> Result<(), String> {
    let mut failures = Vec::new();
    for server in servers {
        let url = format!("{server}/health");
        match https_get(&url, tls, CHECK_TIMEOUT) {
            Ok(response) if response.status == 200 => {
                let health = serde_json::from_str::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|value| value.get("health").cloned());
                if health == Some(serde_json::Value::String("true".to_string())) {
                    return Ok(());
                }
                failures.push(format!("'{url}' answered {}", response.body.trim()));
            }
            Ok(response) => failures.push(format!(
                "'{url}' answered HTTP {}: {}",
                response.status,
                response.body.trim()
            )),
            Err(reason) => failures.push(reason),
        }
    }
    Err(failures.join("; "))
}

// === kube-controller-manager and kube-scheduler ===

fn start_kubeconfig_component(
    flags: &Flags,
    default_port: u16,
    now: SystemTime,
) -> Result<(TcpListener, Arc<ServerConfig>, Handler), Error> {
    let kubeconfig_path = PathBuf::from(flags.get("kubeconfig").ok_or(Error::MissingFlag {
        flag: "--kubeconfig",
    })?);
    let address = listen_address(flags, &["bind-address"], default_port)?;
    let kubeconfig = load_kubeconfig(&kubeconfig_path, now)?;
    for flag in ["authentication-kubeconfig", "authorization-kubeconfig"] {
        if let Some(path) = flags.get(flag) {
            load_kubeconfig(Path::new(path), now)?;
        }
    }
    let self_signed =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .map_err(|error| {
                Error::Tls(format!("failed to create self-signed certificate: {error}"))
            })?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        self_signed.signing_key.serialize_der(),
    ));
    let server_config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()
        .map_err(|error| Error::Tls(error.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![self_signed.cert.der().clone()], key)
        .map_err(|error| Error::Tls(error.to_string()))?;
    let url = format!("{}/readyz", kubeconfig.server.trim_end_matches('/'));
    let tls = kubeconfig.tls;
    let check = CachedCheck::new(move || match https_get(&url, &tls, CHECK_TIMEOUT) {
        Ok(response) if response.status == 200 => Ok(()),
        Ok(response) => Err(format!(
            "'{url}' answered HTTP {}: {}",
            response.status,
            response.body.trim()
        )),
        Err(reason) => Err(reason),
    });
    let handler: Handler = Arc::new(move |path: &str| match path {
        "/healthz" => match check.run() {
            Ok(()) => (200, "ok".to_string()),
            Err(reason) => (
                500,
                format!("[-]apiserver failed: {reason}\nhealthz check failed\n"),
            ),
        },
        _ => (404, "404 page not found\n".to_string()),
    });
    let listener = bind(address)?;
    Ok((listener, Arc::new(server_config), handler))
}

struct Kubeconfig {
    server: String,
    tls: TlsConfig,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeconfigYaml {
    current_context: Option<String>,
    #[serde(default)]
    contexts: Vec<NamedContext>,
    #[serde(default)]
    clusters: Vec<NamedCluster>,
    #[serde(default)]
    users: Vec<NamedUser>,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: ContextYaml,
}

#[derive(Deserialize)]
struct ContextYaml {
    cluster: String,
    user: String,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    cluster: ClusterYaml,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterYaml {
    server: String,
    certificate_authority_data: Option<String>,
    certificate_authority: Option<String>,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    user: UserYaml,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct UserYaml {
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    client_certificate: Option<String>,
    client_key: Option<String>,
}

/// What a kubeconfig's current context names: the server and the credentials (as read, with
/// where each came from), for the stand-ins that build their own TLS client.
pub(crate) struct KubeconfigMaterial {
    pub(crate) server: String,
    /// PEM and a label (file or field) for messages.
    pub(crate) ca: (Vec<u8>, String),
    pub(crate) cert: (Vec<u8>, String),
    pub(crate) key: (Vec<u8>, String),
}

fn load_kubeconfig(path: &Path, now: SystemTime) -> Result<Kubeconfig, Error> {
    let m = read_kubeconfig(path)?;
    let roots = load_roots(&m.ca.0, &m.ca.1, now)?;
    let pair = load_pair(&m.cert.0, &m.cert.1, &m.key.0, &m.key.1, now)?;
    Ok(Kubeconfig {
        server: m.server,
        tls: build_client_config(roots, Some(pair))?,
    })
}

/// Reads the current context's server and credentials (embedded data, or files relative to the
/// kubeconfig's folder).
pub(crate) fn read_kubeconfig(path: &Path) -> Result<KubeconfigMaterial, Error> {
    let fail = |reason: String| Error::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let text = read_file(path)?;
    let config: KubeconfigYaml =
        serde_norway::from_slice(&text).map_err(|error| fail(error.to_string()))?;
    let context_name = config
        .current_context
        .filter(|name| !name.is_empty())
        .ok_or_else(|| fail("current-context is not set".to_string()))?;
    let context = config
        .contexts
        .iter()
        .find(|context| context.name == context_name)
        .map(|context| &context.context)
        .ok_or_else(|| fail(format!("context '{context_name}' not found")))?;
    let cluster = config
        .clusters
        .iter()
        .find(|cluster| cluster.name == context.cluster)
        .map(|cluster| &cluster.cluster)
        .ok_or_else(|| fail(format!("cluster '{}' not found", context.cluster)))?;
    let user = config
        .users
        .iter()
        .find(|user| user.name == context.user)
        .map(|user| &user.user)
        .ok_or_else(|| fail(format!("user '{}' not found", context.user)))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let label = |field: &str| format!("{}: {field}", path.display());
    let material = |data: &Option<String>, file: &Option<String>, field: &str| match (data, file) {
        (Some(data), _) => decode_base64(data)
            .map(|bytes| (bytes, label(&format!("{field}-data"))))
            .ok_or_else(|| fail(format!("'{field}-data' is not valid base64"))),
        (None, Some(file)) => {
            let file_path = base.join(file);
            read_file(&file_path).map(|bytes| (bytes, file_path.display().to_string()))
        }
        (None, None) => Err(fail(format!("'{field}' is missing"))),
    };
    let (ca_pem, ca_label) = material(
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
        "certificate-authority",
    )?;
    let (cert_pem, cert_label) = material(
        &user.client_certificate_data,
        &user.client_certificate,
        "client-certificate",
    )?;
    let (key_pem, key_label) = material(&user.client_key_data, &user.client_key, "client-key")?;
    Ok(KubeconfigMaterial {
        server: cluster.server.clone(),
        ca: (ca_pem, ca_label),
        cert: (cert_pem, cert_label),
        key: (key_pem, key_label),
    })
}

// === Certificates and TLS ===

pub(crate) fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

/// A certificate chain with its key, checked to match.
pub(crate) struct Pair {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
    serial: String,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl fmt::Debug for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of Debug output.
        f.debug_struct("Pair")
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

/// Validity and serial of one certificate.
struct CertInfo {
    serial: String,
    not_before: SystemTime,
    not_after: SystemTime,
}

fn cert_info(der: &CertificateDer<'_>, source_name: &str) -> Result<CertInfo, Error> {
    let cert =
        x509_cert::Certificate::from_der(der.as_ref()).map_err(|error| Error::ParseCert {
            source_name: source_name.to_string(),
            reason: error.to_string(),
        })?;
    let tbs = cert.tbs_certificate;
    Ok(CertInfo {
        serial: base16ct::lower::encode_string(tbs.serial_number.as_bytes()),
        not_before: tbs.validity.not_before.to_system_time(),
        not_after: tbs.validity.not_after.to_system_time(),
    })
}

fn parse_certs(
    pem: &[u8],
    source_name: &str,
    now: SystemTime,
) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|error| Error::ParseCert {
            source_name: source_name.to_string(),
            reason: error.to_string(),
        })?;
    if certs.is_empty() {
        return Err(Error::ParseCert {
            source_name: source_name.to_string(),
            reason: "no CERTIFICATE block found".to_string(),
        });
    }
    for cert in &certs {
        let info = cert_info(cert, source_name)?;
        if info.not_after < now {
            return Err(Error::Expired {
                source_name: source_name.to_string(),
                not_after: format_rfc3339(info.not_after),
            });
        }
    }
    Ok(certs)
}

pub(crate) fn load_roots(
    pem: &[u8],
    source_name: &str,
    now: SystemTime,
) -> Result<Vec<CertificateDer<'static>>, Error> {
    let roots = parse_certs(pem, source_name, now)?;
    // Refuse what rustls would not accept as a trust anchor, at startup as the components do.
    let mut store = RootCertStore::empty();
    for cert in &roots {
        store.add(cert.clone()).map_err(|error| Error::ParseCert {
            source_name: source_name.to_string(),
            reason: format!("not usable as a CA: {error}"),
        })?;
    }
    Ok(roots)
}

/// A rustls trust store of certificates [`load_roots`] already accepted.
pub(crate) fn root_store(roots: Vec<CertificateDer<'static>>) -> RootCertStore {
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(roots);
    store
}

fn load_pair_files(cert_file: &Path, key_file: &Path, now: SystemTime) -> Result<Pair, Error> {
    load_pair(
        &read_file(cert_file)?,
        &cert_file.display().to_string(),
        &read_file(key_file)?,
        &key_file.display().to_string(),
        now,
    )
}

pub(crate) fn load_pair(
    cert_pem: &[u8],
    cert_name: &str,
    key_pem: &[u8],
    key_name: &str,
    now: SystemTime,
) -> Result<Pair, Error> {
    let chain = parse_certs(cert_pem, cert_name, now)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| Error::ParseKey {
        source_name: key_name.to_string(),
        reason: error.to_string(),
    })?;
    match CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider()) {
        Ok(_) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(Error::KeyMismatch {
                key: key_name.to_string(),
                cert: cert_name.to_string(),
            });
        }
        Err(error) => {
            return Err(Error::ParseKey {
                source_name: key_name.to_string(),
                reason: error.to_string(),
            });
        }
    }
    let leaf = chain.first().ok_or_else(|| Error::ParseCert {
        source_name: cert_name.to_string(),
        reason: "no CERTIFICATE block found".to_string(),
    })?;
    let info = cert_info(leaf, cert_name)?;
    Ok(Pair {
        chain,
        key,
        serial: info.serial,
        not_before: info.not_before,
        not_after: info.not_after,
    })
}

fn build_client_config(
    roots: Vec<CertificateDer<'static>>,
    pair: Option<Pair>,
) -> Result<TlsConfig, Error> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts};
    let roots: Vec<Certificate<'static>> = roots
        .iter()
        .map(|cert| Certificate::from_der(cert.as_ref()).to_owned())
        .collect();
    let client_cert = match pair {
        Some(pair) => {
            // ureq takes a key as PEM (or DER of a kind it does not export): re-armour it.
            let label = match &pair.key {
                PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
                PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
                PrivateKeyDer::Pkcs8(_) => "PRIVATE KEY",
                _ => return Err(Error::Tls("unsupported client key type".into())),
            };
            let pem = x509_cert::der::pem::encode_string(
                label,
                x509_cert::der::pem::LineEnding::LF,
                pair.key.secret_der(),
            )
            .map_err(|error| Error::Tls(format!("client key: {error}")))?;
            let key = PrivateKey::from_pem(pem.as_bytes())
                .map_err(|error| Error::Tls(format!("client key: {error}")))?;
            let chain: Vec<Certificate<'static>> = pair
                .chain
                .iter()
                .map(|cert| Certificate::from_der(cert.as_ref()).to_owned())
                .collect();
            Some(ClientCert::new_with_certs(&chain, key))
        }
        None => None,
    };
    Ok(TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&roots))
        .client_cert(client_cert)
        .unversioned_rustls_crypto_provider(Arc::new(provider()))
        .build())
}

pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

// === Serving ===

fn listen_address(
    flags: &Flags,
    address_flags: &[&str],
    default_port: u16,
) -> Result<SocketAddr, Error> {
    let port = match flags.get("secure-port") {
        Some(value) => value.parse::<u16>().map_err(|error| Error::InvalidFlag {
            flag: "--secure-port",
            value: value.to_string(),
            reason: error.to_string(),
        })?,
        None => default_port,
    };
    let default_ip = if address_flags.contains(&"advertise-address") {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    let mut ip = default_ip;
    for flag in address_flags.iter().rev() {
        if let Some(value) = flags.get(flag) {
            ip = value
                .parse()
                .map_err(|error: std::net::AddrParseError| Error::InvalidFlag {
                    flag: if *flag == "bind-address" {
                        "--bind-address"
                    } else {
                        "--advertise-address"
                    },
                    value: value.to_string(),
                    reason: error.to_string(),
                })?;
        }
    }
    Ok(SocketAddr::new(ip, port))
}

fn bind(address: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(address).map_err(|source| Error::Bind { address, source })
}

fn serve(prefix: &'static str, listener: TcpListener, tls: Arc<ServerConfig>, handler: Handler) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(error) => {
                eprintln!("{prefix} (k8s-sim): accept failed: {error}");
                continue;
            }
        };
        let tls = tls.clone();
        let handler = handler.clone();
        thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map_or_else(|_| "unknown".to_string(), |address| address.to_string());
            if let Err(error) = handle_connection(stream, tls, &handler) {
                eprintln!("{prefix} (k8s-sim): connection from {peer}: {error}");
            }
        });
    }
}

fn handle_connection(
    stream: TcpStream,
    tls: Arc<ServerConfig>,
    handler: &Handler,
) -> io::Result<()> {
    stream.set_read_timeout(Some(SERVE_TIMEOUT))?;
    stream.set_write_timeout(Some(SERVE_TIMEOUT))?;
    let connection = ServerConnection::new(tls).map_err(io::Error::other)?;
    let mut tls_stream = StreamOwned::new(connection, stream);
    let mut request = Vec::new();
    let mut buffer = [0u8; 4096];
    while !request.windows(4).any(|window| window == b"\r\n\r\n") {
        let count = tls_stream.read(&mut buffer)?;
        if count == 0 {
            return Ok(());
        }
        request.extend_from_slice(buffer.get(..count).unwrap_or_default());
        if request.len() > MAX_MESSAGE {
            return Err(io::Error::other("request head too large"));
        }
    }
    let head = String::from_utf8_lossy(&request);
    let target = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("/");
    let path = target.split('?').next().unwrap_or(target);
    let (status, body) = handler(path);
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls_stream.write_all(response.as_bytes())?;
    tls_stream.conn.send_close_notify();
    tls_stream.flush()
}

/// A health check whose result is reused for [`HEALTH_CACHE`].
struct CachedCheck {
    check: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
    last: Mutex<Option<(Instant, Result<(), String>)>>,
}

impl CachedCheck {
    fn new(check: impl Fn() -> Result<(), String> + Send + Sync + 'static) -> CachedCheck {
        CachedCheck {
            check: Box::new(check),
            last: Mutex::new(None),
        }
    }

    fn run(&self) -> Result<(), String> {
        // A poisoned lock only means another check panicked; its cached value is still usable.
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((at, result)) = last.as_ref()
            && at.elapsed() < HEALTH_CACHE
        {
            return result.clone();
        }
        let result = (self.check)();
        *last = Some((Instant::now(), result.clone()));
        result
    }
}

/// Kubeconfig `*-data` fields: standard base64; line breaks from YAML folding are dropped.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    crate::base64::decode(&compact).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn selects_component_from_argv0_or_first_argument() {
        let argv = strings(&["/tmp/bin/kube-apiserver", "--secure-port=1"]);
        let (component, rest) = select(&argv).unwrap();
        assert_eq!(component, Component::ApiServer);
        assert_eq!(rest, ["--secure-port=1"]);
        let argv = strings(&["k8s-sim", "kube-scheduler", "--kubeconfig", "k"]);
        let (component, rest) = select(&argv).unwrap();
        assert_eq!(component, Component::Scheduler);
        assert_eq!(rest, ["--kubeconfig", "k"]);
        assert!(select(&strings(&["k8s-sim", "etcd"])).is_err());
        assert!(select(&strings(&["k8s-sim"])).is_err());
    }

    #[test]
    fn parses_both_flag_forms() {
        let flags = parse_flags(&strings(&[
            "--secure-port=6443",
            "--bind-address",
            "127.0.0.1",
            "--allow-privileged=true",
            "--profiling",
            "-v=2",
            "--kubeconfig",
            "/k",
        ]))
        .unwrap();
        assert_eq!(flags.get("secure-port"), Some("6443"));
        assert_eq!(flags.get("bind-address"), Some("127.0.0.1"));
        assert_eq!(flags.get("profiling"), Some("true"));
        assert_eq!(flags.get("v"), Some("2"));
        assert_eq!(flags.get("kubeconfig"), Some("/k"));
        assert!(parse_flags(&strings(&["positional"])).is_err());
    }

    #[test]
    fn listen_address_defaults_and_overrides() {
        let flags = |list: &[&str]| parse_flags(&strings(list)).unwrap();
        let api = ["bind-address", "advertise-address"];
        assert_eq!(
            listen_address(&flags(&[]), &api, 6443).unwrap().to_string(),
            "0.0.0.0:6443"
        );
        assert_eq!(
            listen_address(
                &flags(&["--advertise-address=10.0.0.1", "--secure-port=7"]),
                &api,
                6443
            )
            .unwrap()
            .to_string(),
            "10.0.0.1:7"
        );
        assert_eq!(
            listen_address(
                &flags(&["--advertise-address=10.0.0.1", "--bind-address=127.0.0.1"]),
                &api,
                6443
            )
            .unwrap()
            .to_string(),
            "127.0.0.1:6443"
        );
        assert_eq!(
            listen_address(&flags(&[]), &["bind-address"], 10259)
                .unwrap()
                .to_string(),
            "127.0.0.1:10259"
        );
        assert!(listen_address(&flags(&["--secure-port=x"]), &api, 1).is_err());
    }

    fn check_time(text: &str, expected_unix: Option<i64>) {
        let parsed = parse_rfc3339(text)
            .map(|time| i64::try_from(time.duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap());
        assert_eq!(parsed, expected_unix, "{text}");
    }

    #[test]
    fn parses_rfc3339() {
        check_time("1970-01-01T00:00:00Z", Some(0));
        check_time("2000-03-01T00:00:00Z", Some(951_868_800));
        check_time("2026-11-22T14:15:16Z", Some(1_795_356_916));
        check_time("2026-11-22T14:15:16.999Z", Some(1_795_356_916));
        check_time("2026-11-22T16:15:16+02:00", Some(1_795_356_916));
        check_time("2026-11-22T12:15:16-02:00", Some(1_795_356_916));
        check_time("2026-11-22", None);
        check_time("2026-13-22T14:15:16Z", None);
        check_time("2026-11-22T14:15:16", None);
        check_time("2026-11-22T14:15:16+0200", None);
    }

    #[test]
    fn formats_rfc3339() {
        let time = UNIX_EPOCH + Duration::from_secs(1_795_356_916);
        assert_eq!(format_rfc3339(time), "2026-11-22T14:15:16Z");
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(parse_rfc3339(&format_rfc3339(time)), Some(time));
    }
}
