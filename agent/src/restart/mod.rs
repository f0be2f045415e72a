//! Restarting the components that read renewed files, one at a time, and proving that each
//! serves what is on disk.
//!
//! Platforms:
//! - `bottlerocket`: static pods are settings (`settings.kubernetes.static-pods.<name>.enabled`);
//!   a restart is: disable (commit_and_apply), wait until the kubelet's manifest file is gone and
//!   the old process no longer accepts connections, enable, wait until the manifest is back and
//!   the pod healthy. Every API call survives the API server restarting, and an apply that does
//!   not act is run again ([`api`]).
//! - `kubeadm`: the kubelet's manifest folder (`etc/kubernetes/manifests`); a restart is: move
//!   the manifest out, wait until the old process is gone, move it back, wait until healthy.
//! - `none`: nothing is restarted; what must be restarted is printed.
//!
//! Every wait is bounded and polls a condition; there are no fixed sleeps. Before a pod is
//! stopped, the caller's [`StopRecord`] records how to start it again ([`Stopped`]; the pass
//! stage keeps it in its state file), so that a crash between stop and start is repaired by the
//! next certrotor command ([`ensure_enabled`]), which reads what is live before acting.
//!
//! Verification connects over TLS to the component's endpoint (from its manifest, or
//! `--endpoint`): etcd's client port with the healthcheck client certificate, the apiserver's
//! `/readyz` with a client certificate, the controller-manager's and scheduler's `/healthz`. For
//! etcd and the apiserver the SHA-256 of the served certificate must equal the file's.

pub mod api;
pub mod pairs;
pub mod reload;
pub mod verify;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::node::catalog::{self, Layout, names};
use crate::node::manifests::{Component, PodInfo};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES};
use crate::restart::api::ApiStats;
use crate::restart::verify::Probe;
use crate::sys::fsutil;

/// The platform choice of `--platform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlatformChoice {
    Auto,
    Bottlerocket,
    Kubeadm,
    None,
}

impl PlatformChoice {
    /// Parses `auto|bottlerocket|kubeadm|none`.
    pub fn parse(s: &str) -> Option<PlatformChoice> {
        match s {
            "auto" => Some(PlatformChoice::Auto),
            "bottlerocket" => Some(PlatformChoice::Bottlerocket),
            "kubeadm" => Some(PlatformChoice::Kubeadm),
            "none" => Some(PlatformChoice::None),
            _ => None,
        }
    }
}

/// How to restart and verify.
#[derive(Debug, Clone)]
pub struct RestartOptions {
    pub platform: PlatformChoice,
    pub api_socket: PathBuf,
    /// Bound on each wait (pod gone, pod healthy).
    pub timeout: Duration,
    /// Interval between two polls of a condition.
    pub poll: Duration,
    /// Endpoints given on the command line, overriding the manifests.
    pub endpoints: BTreeMap<Component, SocketAddr>,
    /// `--restart`: wait for live reload where it happens (see [`crate::restart::reload`]), or restart
    /// every component whose files changed.
    pub mode: crate::restart::reload::RestartMode,
    /// Bound on the wait for a component to serve a renewed file by itself.
    pub reload_timeout: Duration,
    /// Versions given on the command line and the held-certificate margin of the reload
    /// decision ([`crate::restart::reload::decide`]).
    pub reload: crate::restart::reload::ReloadOptions,
}

/// `--restart-timeout`'s default, and the bound of recovery's API calls for commands that have
/// no restart options.
pub const DEFAULT_RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// The platform in use.
#[derive(Debug, Clone)]
pub enum Platform {
    /// `bound`: how long a call that meets a restarting API is retried (the restart timeout).
    Bottlerocket {
        client: bottlerocket::ApiClient,
        bound: Duration,
    },
    Kubeadm {
        manifests: PathBuf,
    },
    None,
}

impl Platform {
    /// The name printed in logs.
    pub fn name(&self) -> &'static str {
        match self {
            Platform::Bottlerocket { .. } => "bottlerocket",
            Platform::Kubeadm { .. } => "kubeadm",
            Platform::None => "none",
        }
    }
}

/// Why a restart or verification failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartError {
    pub component: Option<Component>,
    pub message: String,
}

impl fmt::Display for RestartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.component {
            Some(c) => write!(f, "{}: {}", c.name(), self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RestartError {}

fn fail(component: Option<Component>, message: impl Into<String>) -> RestartError {
    RestartError {
        component,
        message: message.into(),
    }
}

/// The kubelet's manifest folder on a kubeadm node.
pub const KUBEADM_MANIFESTS: &str = catalog::paths::KUBEADM_MANIFESTS;
/// Where kubeadm-platform manifests are parked while their pod is stopped (same filesystem).
const PARKED: &str = catalog::paths::PARKED_MANIFESTS;
/// Where Bottlerocket's static-pods helper writes manifests for the kubelet.
const BOTTLEROCKET_STATIC_PODS: &str = catalog::paths::BOTTLEROCKET_STATIC_PODS;
/// Picks the platform: the API socket means Bottlerocket; a kubelet manifest folder with
/// manifests means kubeadm; else none. A node that shows Bottlerocket's own marks
/// ([`bottlerocket_mark`]) is Bottlerocket even while its API socket is absent (the API server
/// restarting removes it): the socket is then waited for, within the restart timeout.
pub fn detect(root: &Path, opts: &RestartOptions) -> Result<Platform, RestartError> {
    let bottlerocket = || Platform::Bottlerocket {
        client: api::client(&opts.api_socket, opts.timeout),
        bound: opts.timeout,
    };
    let kubeadm = || Platform::Kubeadm {
        manifests: root.join(KUBEADM_MANIFESTS),
    };
    let mark = bottlerocket_mark(root);
    Ok(match opts.platform {
        PlatformChoice::Bottlerocket | PlatformChoice::Auto if opts.api_socket.exists() => {
            bottlerocket()
        }
        PlatformChoice::Bottlerocket | PlatformChoice::Auto if mark.is_some() => {
            wait_socket(opts, mark.as_deref().unwrap_or_default())?;
            bottlerocket()
        }
        PlatformChoice::Bottlerocket => {
            return Err(fail(
                None,
                format!(
                    "--platform bottlerocket: the API socket '{}' does not exist; mount it or give --api-socket",
                    opts.api_socket.display()
                ),
            ));
        }
        PlatformChoice::Kubeadm => kubeadm(),
        PlatformChoice::None => Platform::None,
        PlatformChoice::Auto => {
            if fs::read_dir(root.join(KUBEADM_MANIFESTS))
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
            {
                kubeadm()
            } else {
                Platform::None
            }
        }
    })
}

/// What shows that the node under `root` is Bottlerocket, whether or not its API answers now:
/// the folder its static-pods helper writes manifests to, or an os-release with
/// `ID=bottlerocket`.
pub fn bottlerocket_mark(root: &Path) -> Option<String> {
    let static_pods = root.join(BOTTLEROCKET_STATIC_PODS);
    if static_pods.is_dir() {
        return Some(format!("'{}' exists", static_pods.display()));
    }
    ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find(|rel| {
            fsutil::read_in_root(root, rel, 64 * 1024)
                .ok()
                .flatten()
                .is_some_and(|b| {
                    String::from_utf8_lossy(&b)
                        .lines()
                        .any(|l| matches!(l.trim(), "ID=bottlerocket" | "ID=\"bottlerocket\""))
                })
        })
        .map(|rel| format!("'{}' says ID=bottlerocket", root.join(rel).display()))
}

/// Waits, within the restart timeout, for the API socket of a node that is Bottlerocket by
/// `mark`.
fn wait_socket(opts: &RestartOptions, mark: &str) -> Result<(), RestartError> {
    let t0 = Instant::now();
    if opts.api_socket.exists() {
        return Ok(());
    }
    log::warn!(
        "this node is Bottlerocket ({mark}) but its API socket '{}' is absent (the API server \
         restarting?); waiting for it up to {} s",
        opts.api_socket.display(),
        opts.timeout.as_secs()
    );
    while !opts.api_socket.exists() {
        if t0.elapsed() >= opts.timeout {
            return Err(fail(
                None,
                format!(
                    "this node is Bottlerocket ({mark}) but its API socket '{}' did not appear \
                     within {} s; check the API server ('systemctl status apiserver' in the \
                     admin container) or give --api-socket",
                    opts.api_socket.display(),
                    opts.timeout.as_secs()
                ),
            ));
        }
        std::thread::sleep(opts.poll.min(Duration::from_millis(500)));
    }
    log::info!(
        "the API socket '{}' appeared after {} ms",
        opts.api_socket.display(),
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// One component to restart, with where its manifest is and how to probe it.
#[derive(Debug, Clone)]
pub struct Target {
    pub component: Component,
    /// Bottlerocket: the static-pods setting name; kubeadm: the manifest file name.
    pub pod: String,
    pub probe: Probe,
    /// The certificate file the component must serve (etcd, apiserver), relative to the root.
    pub served_file: Option<String>,
    /// Why it is restarted (printed: "restarted because ...").
    pub reason: String,
}

/// Timing of one component's restart.
#[derive(Debug, Clone, Serialize)]
pub struct Restarted {
    pub component: Component,
    pub pod: String,
    /// From stop to verified healthy: how long the component was unavailable.
    pub unavailable_ms: u128,
    pub served_sha256: Option<String>,
    /// Why it was restarted.
    pub reason: String,
    /// What its API calls met (Bottlerocket): retries, re-applies, time unreachable.
    #[serde(flatten)]
    pub api: ApiStats,
}

/// A component that took its renewed files without a restart.
#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    pub component: Component,
    pub pod: String,
    /// From the end of the renewal to the first probe that saw the new certificate.
    pub reloaded_after_ms: u128,
    pub served_sha256: Option<String>,
}

/// The components that read these renewed certificates, in restart order.
pub fn components_for(cert_names: &[String]) -> Vec<Component> {
    let mut v: Vec<Component> = cert_names
        .iter()
        .filter_map(|n| Component::reading(n))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Finds the manifests of the platform: (pod name, parsed manifest).
pub fn pods(platform: &Platform) -> Result<Vec<(String, PodInfo)>, RestartError> {
    match platform {
        Platform::None => Ok(vec![]),
        Platform::Kubeadm { manifests } => {
            let mut out = Vec::new();
            let list = fs::read_dir(manifests).map_err(|e| {
                fail(
                    None,
                    format!(
                        "cannot read the kubelet manifest folder '{}': {e}",
                        manifests.display()
                    ),
                )
            })?;
            let mut files: Vec<_> = list.flatten().collect();
            files.sort_by_key(|e| e.file_name());
            for entry in files {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with('.') {
                    continue;
                }
                let label = format!("{}/{name}", manifests.display());
                if let Ok(bytes) = fsutil::read_limited(&entry.path(), &label, MAX_PEM_FILE_BYTES)
                    && let Some(info) = PodInfo::parse(&bytes)
                {
                    out.push((name, info));
                }
            }
            Ok(out)
        }
        Platform::Bottlerocket { client, bound } => {
            let deadline = Instant::now() + *bound;
            let mut stats = ApiStats::default();
            let settings = api::call(client, deadline, &mut stats, |c| {
                c.settings_by_prefix("settings.kubernetes.static-pods")
            })
            .map_err(|e| {
                fail(
                    None,
                    format!("cannot read static pods from the Bottlerocket API: {e}"),
                )
            })?;
            let mut out = Vec::new();
            if let Some(map) = settings
                .get("kubernetes")
                .and_then(|k| k.get("static-pods"))
                .and_then(|p| p.as_object())
            {
                for (name, pod) in map {
                    let Some(b64) = pod.get("manifest").and_then(|m| m.as_str()) else {
                        continue;
                    };
                    if let Ok(bytes) = <base64ct::Base64 as base64ct::Encoding>::decode_vec(b64)
                        && let Some(info) = PodInfo::parse(&bytes)
                    {
                        out.push((name.clone(), info));
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Builds the restart targets for `components` from the platform's manifests and the catalog.
pub fn targets(
    root: &Path,
    platform: &Platform,
    components: &[Component],
    opts: &RestartOptions,
) -> Result<Vec<Target>, RestartError> {
    let found = pods(platform)?;
    let layouts = catalog::detect(root);
    let mut out = Vec::new();
    for &component in components {
        let (pod, info) = found
            .iter()
            .find(|(_, info)| info.component() == Some(component))
            .cloned()
            .ok_or_else(|| {
                fail(
                    Some(component),
                    format!("no static pod runs it on platform {}", platform.name()),
                )
            })?;
        let endpoint = opts
            .endpoints
            .get(&component)
            .copied()
            .or_else(|| info.endpoint())
            .ok_or_else(|| {
                fail(
                    Some(component),
                    "no endpoint in its manifest; give --endpoint",
                )
            })?;
        let (probe, served_file) = probe_for(root, &layouts, component, endpoint, opts.timeout)?;
        out.push(Target {
            component,
            pod,
            probe,
            served_file,
            reason: "its files changed".into(),
        });
    }
    Ok(out)
}

fn read_file(root: &Path, rel: &str) -> Result<Vec<u8>, String> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(format!("'{rel}' does not exist")),
        Err(e) => Err(e.to_string()),
    }
}

fn probe_for(
    root: &Path,
    layouts: &[Layout],
    component: Component,
    address: SocketAddr,
    timeout: Duration,
) -> Result<(Probe, Option<String>), RestartError> {
    let err = |m: String| fail(Some(component), m);
    let entries = catalog::entries(root, layouts);
    // The first of `names` that the catalog has here, with its certificate and key paths.
    let find = |names: &[&str]| {
        names.iter().find_map(|n| {
            entries
                .iter()
                .find(|e| e.name == *n && root.join(&e.path).exists())
        })
    };
    let pair = |e: &catalog::Entry| Some((e.path.clone(), e.key_path.clone().unwrap_or_default()));
    // What each component is probed with: (health path, CA, client certificate, served
    // certificate), by catalog name; the stacked kubeadm names first, then etcdadm's.
    let (path, ca, client, served) = match component {
        Component::Etcd => {
            let ca = find(&[names::ETCD_CA, names::ETCDADM_CA])
                .filter(|e| e.key_path.as_ref().is_some_and(|k| root.join(k).exists()));
            let ca = ca.ok_or_else(|| err("no etcd certificates on this node".into()))?;
            let (client, served) = if ca.name == names::ETCD_CA {
                (
                    find(&[names::ETCD_HEALTHCHECK_CLIENT]),
                    find(&[names::ETCD_SERVER]),
                )
            } else {
                (
                    find(&[names::ETCDADM_ETCDCTL_CLIENT]),
                    find(&[names::ETCDADM_SERVER]),
                )
            };
            (
                "/health",
                Some(ca.path.clone()),
                client.and_then(pair),
                served.map(|e| e.path.clone()),
            )
        }
        Component::KubeApiserver => {
            let ca = find(&[names::CA]).ok_or_else(|| err("no kubeadm PKI on this node".into()))?;
            let client = find(&[names::APISERVER_KUBELET_CLIENT]).and_then(pair);
            (
                "/readyz",
                Some(ca.path.clone()),
                client,
                find(&[names::APISERVER]).map(|e| e.path.clone()),
            )
        }
        Component::KubeControllerManager | Component::KubeScheduler => {
            ("/healthz", None, None, None)
        }
    };
    let ca_pem = match ca {
        Some(ca) => Some(read_file(root, &ca).map_err(err)?),
        None => None,
    };
    let (client_cert_pem, client_key_pem) = match client {
        Some((c, k)) => (
            Some(read_file(root, &c).map_err(err)?),
            Some(read_file(root, &k).map_err(err)?),
        ),
        None => (None, None),
    };
    let probe = Probe {
        address,
        path: path.into(),
        ca_pem,
        client_cert_pem,
        client_key_pem,
        timeout: timeout.min(Duration::from_secs(5)),
    };
    Ok((probe, served))
}

/// A static pod stopped for a restart: what is needed to start it again after a crash between
/// the stop and the start. The pass stage persists it (in its state file) through a
/// [`StopRecord`] before the pod is stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    /// `bottlerocket` or `kubeadm`.
    pub platform: String,
    /// Bottlerocket: the static-pods setting name; kubeadm: the manifest file name.
    pub pod: String,
    /// Bottlerocket: the API socket the pod was disabled through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_socket: Option<String>,
    /// The component the pod runs, when it is one of the four (absent for kube-vip and other
    /// consumers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<Component>,
}

impl Stopped {
    /// Checks every name read back from a state file: a known platform, a plain pod name, an
    /// absolute API socket path, a parked manifest inside the root. The error is `(entry,
    /// detail)`.
    pub fn check(&self, root: &Path) -> Result<(), (String, String)> {
        use crate::sys::state;
        match self.platform.as_str() {
            "bottlerocket" => {
                let socket = self
                    .api_socket
                    .as_deref()
                    .unwrap_or(catalog::paths::API_SOCKET);
                socket
                    .strip_prefix('/')
                    .ok_or_else(|| "the API socket path is not absolute".to_string())
                    .and_then(state::check_relative)
                    .map_err(|d| (format!("api_socket {socket}"), d))?;
            }
            "kubeadm" => {
                let parked = root.join(PARKED).join(&self.pod);
                state::check_inside_root(root, &root.join(KUBEADM_MANIFESTS))
                    .and_then(|_| state::check_inside_root(root, &parked))
                    .map_err(|d| (format!("pod {}", self.pod), d))?;
            }
            other => {
                return Err((format!("platform {other}"), "unknown platform".into()));
            }
        }
        state::check_name(&self.pod).map_err(|d| (format!("pod {}", self.pod), d))
    }

    /// The platform to start the pod again on; API calls retried within `bound`.
    fn platform(&self, root: &Path, bound: Duration) -> Platform {
        match self.platform.as_str() {
            "bottlerocket" => {
                let socket = self
                    .api_socket
                    .clone()
                    .unwrap_or_else(|| catalog::paths::API_SOCKET.into());
                Platform::Bottlerocket {
                    client: api::client(Path::new(&socket), bound),
                    bound,
                }
            }
            _ => Platform::Kubeadm {
                manifests: root.join(KUBEADM_MANIFESTS),
            },
        }
    }
}

/// Where a restart records the pod it is about to stop and that it started it again. Recording
/// the stop must succeed before the pod is stopped: a pod is never stopped without a record.
pub trait StopRecord {
    /// Before the pod is stopped.
    fn stopping(&mut self, stopped: &Stopped) -> Result<(), RestartError>;
    /// After the pod was started again (the record of its stop is no longer needed).
    fn started(&mut self, pod: &str);
    /// What one restart's API calls met (retries, re-applies, outage), for the caller's totals;
    /// called once per restart, whatever its outcome.
    fn api_used(&mut self, _stats: &ApiStats) {}
}

/// What [`ensure_enabled`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// Enabled, its manifest in place: nothing was done.
    Running,
    /// It was stopped (disabled, or its manifest parked) and is started again now.
    Started,
}

/// Makes sure a pod that was (or may have been) stopped is enabled again, reading what is live
/// before acting: Bottlerocket: the live `enabled` and the manifest (enabled and re-applied
/// when needed, see [`api::wait_manifest`]); kubeadm: a parked manifest is moved back. Called
/// by recovery (a crashed run's record) and as the last step of a pass that stopped pods.
pub fn ensure_enabled(
    root: &Path,
    stopped: &Stopped,
    (bound, poll): (Duration, Duration),
    stats: &mut ApiStats,
) -> Result<Ensured, RestartError> {
    let (pod, component) = (stopped.pod.as_str(), stopped.component);
    match stopped.platform(root, bound) {
        Platform::Bottlerocket { client, .. } => {
            let deadline = Instant::now() + bound;
            let live = api::call(&client, deadline, stats, |c| c.static_pod_enabled(pod)).map_err(
                |e| {
                    fail(
                        component,
                        format!("cannot read whether static pod '{pod}' is enabled: {e}"),
                    )
                },
            )?;
            let present = api::manifest_path(root, pod).is_none_or(|f| f.exists());
            if live == Some(true) && present {
                return Ok(Ensured::Running);
            }
            if live != Some(true) {
                api::set_enabled(&client, pod, true, component, deadline, stats)?;
            }
            let want = (pod, true, component);
            api::wait_manifest(root, &client, want, deadline, poll, stats)?;
            Ok(Ensured::Started)
        }
        platform => {
            let parked = root.join(PARKED).join(pod).exists();
            start(root, &platform, pod, component, (bound, poll), stats)?;
            Ok(if parked {
                Ensured::Started
            } else {
                Ensured::Running
            })
        }
    }
}

/// Records the stop of `pod` (before anything is stopped: an error means nothing was).
fn record_stop(
    platform: &Platform,
    pod: &str,
    component: Option<Component>,
    record: &mut dyn StopRecord,
) -> Result<(), RestartError> {
    let (name, api_socket) = match platform {
        Platform::None => return Ok(()),
        Platform::Bottlerocket { client, .. } => {
            ("bottlerocket", Some(client.socket().display().to_string()))
        }
        Platform::Kubeadm { .. } => ("kubeadm", None),
    };
    record.stopping(&Stopped {
        platform: name.into(),
        pod: pod.into(),
        api_socket,
        component,
    })
}

/// Why a stop failed, and whether it is known never to have taken effect (the pod's manifest
/// is still where the kubelet reads it: its process was never stopped).
struct StopFailed {
    error: RestartError,
    never_stopped: bool,
}

/// Stops `pod` (its stop recorded), within `deadline`: Bottlerocket: disables it and waits until
/// the applier has removed its manifest; kubeadm: moves its manifest out.
fn stop(
    root: &Path,
    platform: &Platform,
    (pod, component): (&str, Option<Component>),
    (deadline, poll): (Instant, Duration),
    stats: &mut ApiStats,
) -> Result<(), StopFailed> {
    let stopped = match platform {
        Platform::None => Ok(()),
        Platform::Bottlerocket { client, .. } => {
            api::set_enabled(client, pod, false, component, deadline, stats).and_then(|()| {
                let want = (pod, false, component);
                api::wait_manifest(root, client, want, deadline, poll, stats)
            })
        }
        Platform::Kubeadm { manifests } => park(root, manifests, pod, component),
    };
    stopped.map_err(|error| StopFailed {
        never_stopped: manifest_in_place(root, platform, pod),
        error,
    })
}

/// Whether `pod`'s manifest is where the kubelet reads it (where this root shows it).
fn manifest_in_place(root: &Path, platform: &Platform, pod: &str) -> bool {
    match platform {
        Platform::None => false,
        Platform::Bottlerocket { .. } => api::manifest_path(root, pod).is_some_and(|f| f.exists()),
        Platform::Kubeadm { manifests } => manifests.join(pod).exists(),
    }
}

/// kubeadm: moves `pod`'s manifest out of the kubelet's folder.
fn park(
    root: &Path,
    manifests: &Path,
    pod: &str,
    component: Option<Component>,
) -> Result<(), RestartError> {
    let parked = root.join(PARKED);
    fsutil::create_dir_all_mode(&parked, 0o700).map_err(|e| {
        fail(
            component,
            format!("cannot create '{}': {e}", parked.display()),
        )
    })?;
    fs::rename(manifests.join(pod), parked.join(pod))
        .and_then(|_| fsutil::sync_dir(manifests))
        .and_then(|_| fsutil::sync_dir(&parked))
        .map_err(|e| {
            fail(
                component,
                format!(
                    "cannot move manifest '{pod}' out of '{}': {e}",
                    manifests.display()
                ),
            )
        })
}

/// Starts `pod` again with a bound of its own (the stop may have used all of its own):
/// Bottlerocket: enables it and waits until the applier has written its manifest; kubeadm:
/// moves a parked manifest back.
fn start(
    root: &Path,
    platform: &Platform,
    pod: &str,
    component: Option<Component>,
    (bound, poll): (Duration, Duration),
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    let deadline = Instant::now() + bound;
    match platform {
        Platform::None => Ok(()),
        Platform::Bottlerocket { client, .. } => {
            api::set_enabled(client, pod, true, component, deadline, stats)?;
            api::wait_manifest(root, client, (pod, true, component), deadline, poll, stats)
        }
        Platform::Kubeadm { manifests } => {
            let parked = root.join(PARKED).join(pod);
            if !parked.exists() {
                return Ok(());
            }
            fs::rename(&parked, manifests.join(pod))
                .and_then(|_| fsutil::sync_dir(manifests))
                .map_err(|e| {
                    fail(
                        component,
                        format!(
                            "cannot move manifest '{pod}' back into '{}': {e}",
                            manifests.display()
                        ),
                    )
                })
        }
    }
}

/// Stops `pod` and starts it again, whatever happened to the stop (a pod must never be left
/// stopped; a stop whose answer was lost may have taken effect); clears the record of the stop
/// once the start succeeded, even when the stop failed. `wait_gone` waits, after the stop,
/// until the old process has stopped serving.
fn stop_and_start(
    root: &Path,
    platform: &Platform,
    (pod, component): (&str, Option<Component>),
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
    wait_gone: &mut dyn FnMut(Instant) -> Result<(), RestartError>,
) -> Result<ApiStats, (StopFailed, ApiStats)> {
    let mut stats = ApiStats::default();
    if let Err(error) = record_stop(platform, pod, component, record) {
        let never_stopped = true;
        return Err((
            StopFailed {
                error,
                never_stopped,
            },
            stats,
        ));
    }
    let deadline = Instant::now() + opts.timeout;
    let stopped = stop(
        root,
        platform,
        (pod, component),
        (deadline, opts.poll),
        &mut stats,
    )
    .and_then(|()| {
        wait_gone(deadline).map_err(|error| StopFailed {
            error,
            never_stopped: false,
        })
    });
    let started = start(
        root,
        platform,
        pod,
        component,
        (opts.timeout, opts.poll),
        &mut stats,
    );
    if started.is_ok() {
        record.started(pod);
    }
    record.api_used(&stats);
    if let Err(e) = stopped {
        return Err((e, stats));
    }
    match started {
        Ok(()) => Ok(stats),
        Err(error) => Err((
            StopFailed {
                error,
                never_stopped: false,
            },
            stats,
        )),
    }
}

/// After the port closed: waits (within what is left of the restart timeout) until the process
/// that listened has exited, so that the kubelet has finished with the old pod before it gets
/// it back (see [`crate::sys::procfs`]). A process still running then is logged, not an error: the
/// pod is given back all the same, and verification decides.
fn wait_exited(
    what: &str,
    listener: Option<crate::sys::procfs::Listener>,
    t0: Instant,
    opts: &RestartOptions,
) {
    let Some(l) = listener else {
        return;
    };
    let closed = Instant::now();
    let left = opts.timeout.saturating_sub(t0.elapsed());
    if l.wait_exited(left, opts.poll) {
        log::info!(
            "{what}: process {} exited {} ms after its port closed",
            l.pid,
            closed.elapsed().as_millis()
        );
    } else {
        log::warn!(
            "{what}: process {} still runs {} s after its port closed; starting it again anyway",
            l.pid,
            closed.elapsed().as_secs()
        );
    }
}

/// The SHA-256 of the certificate in `rel` now.
fn file_sha256(root: &Path, rel: &str) -> Result<String, String> {
    let bytes = read_file(root, rel)?;
    Cert::from_pem(&bytes)
        .map(|c| c.sha256_hex())
        .map_err(|e| format!("'{rel}': {e}"))
}

/// Waits until the target is healthy and (etcd, apiserver) serves the certificate now on disk.
pub fn wait_verified(
    root: &Path,
    target: &Target,
    opts: &RestartOptions,
) -> Result<Option<String>, RestartError> {
    wait_serving(root, target, opts.timeout, opts.poll)
}

/// Waits, without restarting anything, until the target serves the renewed certificate now on
/// disk and is healthy, at most `opts.reload_timeout`. `None` when it did not within the bound
/// (the caller restarts it), or when nothing it serves can be compared (no served file).
pub fn wait_reloaded(root: &Path, target: &Target, opts: &RestartOptions) -> Option<Reloaded> {
    target.served_file.as_ref()?;
    let t0 = Instant::now();
    match wait_serving(root, target, opts.reload_timeout, opts.poll) {
        Ok(served) => {
            let reloaded_after_ms = t0.elapsed().as_millis();
            log::info!(
                "{} reloaded live in {:.1} s{}, not restarted",
                target.component.name(),
                reloaded_after_ms as f64 / 1000.0,
                served
                    .as_deref()
                    .map(|s| format!(", serving sha256 {s}"))
                    .unwrap_or_default()
            );
            Some(Reloaded {
                component: target.component,
                pod: target.pod.clone(),
                reloaded_after_ms,
                served_sha256: served,
            })
        }
        Err(e) => {
            log::warn!(
                "{} did not serve its renewed certificate within {} s ({e}); restarting it",
                target.component.name(),
                opts.reload_timeout.as_secs()
            );
            None
        }
    }
}

fn wait_serving(
    root: &Path,
    target: &Target,
    timeout: Duration,
    poll: Duration,
) -> Result<Option<String>, RestartError> {
    let want = match &target.served_file {
        Some(rel) => Some(file_sha256(root, rel).map_err(|e| fail(Some(target.component), e))?),
        None => None,
    };
    let seen = verify::wait_for(&target.probe, timeout, poll, |o| {
        o.healthy() && want.as_deref().is_none_or(|w| w == o.served_sha256)
    })
    .map_err(|e| {
        let expected = match (&want, &target.served_file) {
            (Some(w), Some(f)) => format!(" (expected '{f}' with sha256 {w})"),
            _ => String::new(),
        };
        fail(Some(target.component), format!("{}{expected}", e.0))
    })?;
    Ok(want.map(|_| seen.served_sha256))
}

/// A restart that failed: why, and whether the pod's stop is known never to have taken effect
/// (its manifest never left: the process that runs still has the files it started with, so
/// after a rollback it only needs verifying).
#[derive(Debug, Clone)]
pub struct Failed {
    pub error: RestartError,
    pub never_stopped: bool,
}

impl Failed {
    /// A failure that says nothing of a stop (no targets, a verification).
    pub fn other(error: RestartError) -> Failed {
        Failed {
            error,
            never_stopped: false,
        }
    }
}

/// Restarts each target in order, one at a time, verifying each before the next.
pub fn restart_all(
    root: &Path,
    platform: &Platform,
    targets: &[Target],
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<Vec<Restarted>, (Vec<Restarted>, Failed)> {
    let mut done = Vec::new();
    for target in targets {
        match restart_one(root, platform, target, opts, record) {
            Ok(r) => done.push(r),
            Err(e) => return Err((done, e)),
        }
    }
    Ok(done)
}

fn restart_one(
    root: &Path,
    platform: &Platform,
    target: &Target,
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<Restarted, Failed> {
    let c = Some(target.component);
    log::info!(
        "restarting {} (static pod '{}', platform {}) because {}",
        target.component.name(),
        target.pod,
        platform.name(),
        target.reason
    );
    let t0 = Instant::now();
    let listener = crate::sys::procfs::listener(target.probe.address.port());
    let mut wait_gone = |deadline: Instant| {
        let left = deadline.saturating_duration_since(Instant::now());
        verify::wait_closed(target.probe.address, left, opts.poll)
            .map(|()| wait_exited(target.component.name(), listener, t0, opts))
            .map_err(|e| fail(c, e.0))
    };
    let pod = (target.pod.as_str(), c);
    let api = stop_and_start(root, platform, pod, opts, record, &mut wait_gone).map_err(
        |(f, stats)| {
            log_api(target.component.name(), &stats);
            Failed {
                error: f.error,
                never_stopped: f.never_stopped,
            }
        },
    )?;
    let served = wait_verified(root, target, opts).map_err(|error| Failed {
        error,
        never_stopped: false,
    })?;
    let unavailable_ms = t0.elapsed().as_millis();
    log::info!(
        "{} verified{} after {unavailable_ms} ms",
        target.component.name(),
        served
            .as_deref()
            .map(|s| format!(" serving sha256 {s}"))
            .unwrap_or_default()
    );
    log_api(target.component.name(), &api);
    Ok(Restarted {
        component: target.component,
        pod: target.pod.clone(),
        unavailable_ms,
        served_sha256: served,
        reason: target.reason.clone(),
        api,
    })
}

/// Says what the API did to a restart, when it was not clean.
fn log_api(what: &str, stats: &ApiStats) {
    if let Some(text) = stats.describe() {
        log::warn!("{what}: {text}");
    }
}

/// Parses `--endpoint COMPONENT=IP:PORT`.
pub fn parse_endpoint(text: &str) -> Result<(Component, SocketAddr), String> {
    let (name, addr) = text.split_once('=').ok_or_else(|| {
        format!("--endpoint '{text}': use COMPONENT=IP:PORT, e.g. etcd=127.0.0.1:2379")
    })?;
    let component = Component::ALL
        .into_iter()
        .find(|c| c.name() == name)
        .ok_or_else(|| format!("--endpoint '{text}': unknown component '{name}' (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("--endpoint '{text}': '{addr}' is not IP:PORT"))?;
    Ok((component, addr))
}

/// A static pod other than the four components, restarted because it mounts a renewed file.
#[derive(Debug, Clone, Serialize)]
pub struct RestartedPod {
    pub pod: String,
    pub file: String,
    /// From stop to healthy.
    pub unavailable_ms: u128,
    pub reason: String,
    /// What its API calls met (Bottlerocket): retries, re-applies, time unreachable.
    #[serde(flatten)]
    pub api: ApiStats,
}

/// Why a consumer pod's restart failed, and whether it stays owed to the next pass.
#[derive(Debug)]
pub struct PodRestartError {
    pub error: RestartError,
    /// The pod was (or may have been) stopped, started or found unhealthy: the next pass tries
    /// again. False when nothing was touched (the pod is gone, or has no health to verify a
    /// restart by: the error says to restart it by hand, and retrying could not do better).
    pub owed: bool,
}

impl fmt::Display for PodRestartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for PodRestartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Restarts the static pod of `consumer` (see [`crate::node::manifests::other_consumers`]) and
/// verifies it by its HTTPS liveness or readiness probe (its health, from its manifest). A pod
/// without such a probe is not restarted: nothing could prove that the kubelet stopped it and
/// that it came back; the error says to restart it by hand.
pub fn restart_pod(
    root: &Path,
    platform: &Platform,
    consumer: &crate::node::manifests::Consumer,
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<RestartedPod, PodRestartError> {
    let refused = |error| PodRestartError { error, owed: false };
    let pod = &consumer.pod;
    // Listing the pods failed: nothing touched, but the restart is still due.
    let found = pods(platform).map_err(|error| PodRestartError { error, owed: true })?;
    let info = found
        .iter()
        .find(|(p, _)| p == pod)
        .map(|(_, i)| i)
        .ok_or_else(|| refused(fail(None, format!("static pod '{pod}' is gone"))))?;
    let (address, path) = info.health.clone().ok_or_else(|| {
        refused(fail(
            None,
            format!(
                "static pod '{pod}' has no HTTPS liveness or readiness probe to verify a restart \
                 by; restart it yourself"
            ),
        ))
    })?;
    restart_pod_with_health(root, platform, consumer, opts, (address, path), record)
        .map_err(|error| PodRestartError { error, owed: true })
}

fn restart_pod_with_health(
    root: &Path,
    platform: &Platform,
    consumer: &crate::node::manifests::Consumer,
    opts: &RestartOptions,
    (address, path): (SocketAddr, String),
    record: &mut dyn StopRecord,
) -> Result<RestartedPod, RestartError> {
    let pod = &consumer.pod;
    // Its own serving certificate is not certrotor's: any is accepted, health is what counts.
    let probe = Probe {
        address,
        path,
        ca_pem: None,
        client_cert_pem: None,
        client_key_pem: None,
        timeout: opts.timeout.min(Duration::from_secs(5)),
    };
    log::info!(
        "restarting static pod '{pod}' (platform {}) because {}",
        platform.name(),
        consumer.reason
    );
    let t0 = Instant::now();
    let listener = crate::sys::procfs::listener(address.port());
    let what = format!("static pod '{pod}'");
    let mut wait_gone = |deadline: Instant| {
        let left = deadline.saturating_duration_since(Instant::now());
        verify::wait_closed(address, left, opts.poll)
            .map(|()| wait_exited(&what, listener, t0, opts))
            .map_err(|e| fail(None, format!("static pod '{pod}': {}", e.0)))
    };
    let api = stop_and_start(root, platform, (pod, None), opts, record, &mut wait_gone).map_err(
        |(f, stats)| {
            log_api(&format!("static pod '{pod}'"), &stats);
            f.error
        },
    )?;
    verify::wait_for(&probe, opts.timeout, opts.poll, |o| o.healthy())
        .map_err(|e| fail(None, format!("static pod '{pod}': {}", e.0)))?;
    let unavailable_ms = t0.elapsed().as_millis();
    log::info!("static pod '{pod}' healthy again after {unavailable_ms} ms");
    log_api(&format!("static pod '{pod}'"), &api);
    Ok(RestartedPod {
        pod: pod.clone(),
        file: consumer.file.clone(),
        unavailable_ms,
        reason: consumer.reason.clone(),
        api,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("certrotor-restart-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("root")).unwrap();
        dir
    }

    fn options(socket: PathBuf, timeout: Duration) -> RestartOptions {
        RestartOptions {
            platform: PlatformChoice::Auto,
            api_socket: socket,
            timeout,
            poll: Duration::from_millis(20),
            endpoints: BTreeMap::new(),
            mode: reload::RestartMode::Always,
            reload_timeout: Duration::ZERO,
            reload: Default::default(),
        }
    }

    #[test]
    fn a_bottlerocket_node_is_known_by_its_marks_while_its_api_socket_is_absent() {
        let dir = temp("marks");
        let (root, socket) = (dir.join("root"), dir.join("api.sock"));
        let opts = options(socket.clone(), Duration::from_millis(300));
        assert!(matches!(detect(&root, &opts), Ok(Platform::None)));
        // The static pods folder: Bottlerocket, and the socket does not come within the bound.
        fs::create_dir_all(root.join(BOTTLEROCKET_STATIC_PODS)).unwrap();
        let err = detect(&root, &opts).unwrap_err();
        assert!(err.message.contains("did not appear within"), "{err}");
        fs::remove_dir_all(root.join("etc")).unwrap();
        // os-release says so; the socket appears while certrotor waits for it.
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        fs::write(
            root.join("usr/lib/os-release"),
            "NAME=Bottlerocket\nID=bottlerocket\n",
        )
        .unwrap();
        assert!(bottlerocket_mark(&root).is_some());
        let opts = options(socket.clone(), Duration::from_secs(30));
        let binder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            std::os::unix::net::UnixListener::bind(&socket).unwrap()
        });
        assert!(matches!(
            detect(&root, &opts),
            Ok(Platform::Bottlerocket { .. })
        ));
        drop(binder.join().unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ensure_enabled_starts_a_parked_pod_and_leaves_a_running_one_alone() {
        let dir = temp("ensure");
        let root = dir.join("root");
        fs::create_dir_all(root.join(KUBEADM_MANIFESTS)).unwrap();
        fs::create_dir_all(root.join(PARKED)).unwrap();
        fs::write(root.join(PARKED).join("etcd.yaml"), "kind: Pod\n").unwrap();
        let stopped = |pod: &str| Stopped {
            platform: "kubeadm".into(),
            pod: pod.into(),
            api_socket: None,
            component: None,
        };
        let bound = (Duration::from_secs(1), Duration::from_millis(10));
        let mut stats = ApiStats::default();
        let first = ensure_enabled(&root, &stopped("etcd.yaml"), bound, &mut stats);
        assert_eq!(first.unwrap(), Ensured::Started);
        assert!(root.join(KUBEADM_MANIFESTS).join("etcd.yaml").exists());
        let again = ensure_enabled(&root, &stopped("etcd.yaml"), bound, &mut stats);
        assert_eq!(again.unwrap(), Ensured::Running);
        assert!(stats.is_clean());
        fs::remove_dir_all(&dir).unwrap();
    }
}
