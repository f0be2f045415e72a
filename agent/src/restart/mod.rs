//! Restarting the components that read renewed files, one at a time, and proving that each
//! serves what is on disk.
//!
//! Platforms:
//! - `bottlerocket`: static pods are settings (`settings.kubernetes.static-pods.<name>.enabled`);
//!   a restart is: disable (commit_and_apply), wait until the kubelet's manifest file is gone and
//!   the old process no longer accepts connections, enable, wait until healthy.
//! - `kubeadm`: the kubelet's manifest folder (`etc/kubernetes/manifests`); a restart is: move
//!   the manifest out, wait until the old process is gone, move it back, wait until healthy.
//! - `none`: nothing is restarted; what must be restarted is printed.
//!
//! Every wait is bounded and polls a condition; there are no fixed sleeps. Before a pod is
//! stopped, the caller's [`StopRecord`] records how to start it again ([`Stopped`]; the pass
//! stage keeps it in its state file), so that a crash between stop and start is repaired by the
//! next certrotor command ([`start_again`]).
//!
//! Verification connects over TLS to the component's endpoint (from its manifest, or
//! `--endpoint`): etcd's client port with the healthcheck client certificate, the apiserver's
//! `/readyz` with a client certificate, the controller-manager's and scheduler's `/healthz`. For
//! etcd and the apiserver the SHA-256 of the served certificate must equal the file's.

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

/// The platform in use.
#[derive(Debug, Clone)]
pub enum Platform {
    Bottlerocket { client: bottlerocket::ApiClient },
    Kubeadm { manifests: PathBuf },
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
/// The private Bottlerocket API transaction certrotor uses, so it never commits another
/// writer's pending changes.
fn api_tx() -> String {
    format!("certrotor-{}", std::process::id())
}

/// Picks the platform: the API socket means Bottlerocket; a kubelet manifest folder with
/// manifests means kubeadm; else none.
pub fn detect(root: &Path, opts: &RestartOptions) -> Result<Platform, RestartError> {
    let bottlerocket = || Platform::Bottlerocket {
        client: bottlerocket::ApiClient::new(opts.api_socket.clone())
            .with_timeout(opts.timeout.min(Duration::from_secs(30))),
    };
    let kubeadm = || Platform::Kubeadm {
        manifests: root.join(KUBEADM_MANIFESTS),
    };
    Ok(match opts.platform {
        PlatformChoice::Bottlerocket => {
            if !opts.api_socket.exists() {
                return Err(fail(
                    None,
                    format!(
                        "--platform bottlerocket: the API socket '{}' does not exist; mount it or give --api-socket",
                        opts.api_socket.display()
                    ),
                ));
            }
            bottlerocket()
        }
        PlatformChoice::Kubeadm => kubeadm(),
        PlatformChoice::None => Platform::None,
        PlatformChoice::Auto => {
            if opts.api_socket.exists() {
                bottlerocket()
            } else if fs::read_dir(root.join(KUBEADM_MANIFESTS))
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
        Platform::Bottlerocket { client } => {
            let settings = client
                .settings_by_prefix("settings.kubernetes.static-pods")
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

    /// The platform to start the pod again on.
    fn platform(&self, root: &Path) -> Platform {
        match self.platform.as_str() {
            "bottlerocket" => Platform::Bottlerocket {
                client: bottlerocket::ApiClient::new(
                    self.api_socket
                        .clone()
                        .unwrap_or_else(|| catalog::paths::API_SOCKET.into()),
                ),
            },
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
}

/// Starts again a pod that a crashed run left stopped (called by recovery, under the lock).
pub fn start_again(root: &Path, stopped: &Stopped) -> Result<(), RestartError> {
    start(
        root,
        &stopped.platform(root),
        &stopped.pod,
        stopped.component,
    )
}

fn stop(
    root: &Path,
    platform: &Platform,
    pod: &str,
    component: Option<Component>,
    record: &mut dyn StopRecord,
) -> Result<(), RestartError> {
    let stopped = |name: &str, api_socket| Stopped {
        platform: name.into(),
        pod: pod.into(),
        api_socket,
        component,
    };
    match platform {
        Platform::None => Ok(()),
        Platform::Bottlerocket { client } => {
            let socket = client.socket().display().to_string();
            record.stopping(&stopped("bottlerocket", Some(socket)))?;
            set_enabled(client, pod, false, component)
        }
        Platform::Kubeadm { manifests } => {
            let parked = root.join(PARKED);
            fsutil::create_dir_all_mode(&parked, 0o700).map_err(|e| {
                fail(
                    component,
                    format!("cannot create '{}': {e}", parked.display()),
                )
            })?;
            record.stopping(&stopped("kubeadm", None))?;
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
    }
}

fn start(
    root: &Path,
    platform: &Platform,
    pod: &str,
    component: Option<Component>,
) -> Result<(), RestartError> {
    match platform {
        Platform::None => Ok(()),
        Platform::Bottlerocket { client } => set_enabled(client, pod, true, component),
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

/// Enables or disables a static pod through the API, in certrotor's own transaction.
fn set_enabled(
    client: &bottlerocket::ApiClient,
    pod: &str,
    enabled: bool,
    component: Option<Component>,
) -> Result<(), RestartError> {
    let tx = api_tx();
    client
        .set_static_pod_enabled(&tx, pod, enabled)
        .and_then(|_| client.commit_and_apply(&tx))
        .map(|_| ())
        .map_err(|e| {
            let verb = if enabled { "enable" } else { "disable" };
            fail(
                component,
                format!("cannot {verb} static pod '{pod}' through the API: {e}"),
            )
        })
}

/// Waits until the platform has stopped the pod: its kubelet manifest is gone (where visible)
/// and its endpoint no longer accepts connections.
fn wait_stopped(
    root: &Path,
    platform: &Platform,
    target: &Target,
    opts: &RestartOptions,
) -> Result<(), RestartError> {
    let started = Instant::now();
    if let Platform::Bottlerocket { .. } = platform {
        let dir = root.join(BOTTLEROCKET_STATIC_PODS);
        if dir.is_dir() {
            let file = dir.join(&target.pod);
            while file.exists() {
                if started.elapsed() >= opts.timeout {
                    return Err(fail(
                        Some(target.component),
                        format!(
                            "the static pod manifest '{}' was not removed within {}s of disabling it",
                            file.display(),
                            opts.timeout.as_secs()
                        ),
                    ));
                }
                std::thread::sleep(opts.poll);
            }
        }
    }
    let left = opts.timeout.saturating_sub(started.elapsed());
    verify::wait_closed(target.probe.address, left, opts.poll)
        .map_err(|e| fail(Some(target.component), e.0))
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

/// Restarts each target in order, one at a time, verifying each before the next.
pub fn restart_all(
    root: &Path,
    platform: &Platform,
    targets: &[Target],
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<Vec<Restarted>, (Vec<Restarted>, RestartError)> {
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
) -> Result<Restarted, RestartError> {
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
    stop(root, platform, &target.pod, c, record)?;
    let stopped = wait_stopped(root, platform, target, opts)
        .map(|()| wait_exited(target.component.name(), listener, t0, opts));
    // Start again whatever happened: a pod must never be left stopped.
    let started = start(root, platform, &target.pod, c);
    if started.is_ok() {
        record.started(&target.pod);
    }
    stopped?;
    started?;
    let served = wait_verified(root, target, opts)?;
    let unavailable_ms = t0.elapsed().as_millis();
    log::info!(
        "{} verified{} after {unavailable_ms} ms",
        target.component.name(),
        served
            .as_deref()
            .map(|s| format!(" serving sha256 {s}"))
            .unwrap_or_default()
    );
    Ok(Restarted {
        component: target.component,
        pod: target.pod.clone(),
        unavailable_ms,
        served_sha256: served,
        reason: target.reason.clone(),
    })
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
    stop(root, platform, pod, None, record)?;
    let stopped = verify::wait_closed(address, opts.timeout, opts.poll)
        .map(|()| wait_exited(&format!("static pod '{pod}'"), listener, t0, opts))
        .map_err(|e| fail(None, format!("static pod '{pod}': {}", e.0)));
    let started = start(root, platform, pod, None);
    if started.is_ok() {
        record.started(pod);
    }
    stopped?;
    started?;
    verify::wait_for(&probe, opts.timeout, opts.poll, |o| o.healthy())
        .map_err(|e| fail(None, format!("static pod '{pod}': {}", e.0)))?;
    let unavailable_ms = t0.elapsed().as_millis();
    log::info!("static pod '{pod}' healthy again after {unavailable_ms} ms");
    Ok(RestartedPod {
        pod: pod.clone(),
        file: consumer.file.clone(),
        unavailable_ms,
        reason: consumer.reason.clone(),
    })
}
