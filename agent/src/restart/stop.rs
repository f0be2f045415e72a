//! Stopping a static pod and starting it again, crash-safe: the stop is recorded before it
//! happens ([`StopRecord`], [`Stopped`]), the pod is started again whatever happened to the stop,
//! and a pod a crashed run left stopped is started by the next command ([`ensure_enabled`]).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::node::catalog;
use crate::node::manifests::Component;
use crate::restart::api::{self, ApiStats};
use crate::restart::{KUBEADM_MANIFESTS, Platform, RestartError, RestartOptions, fail};
use crate::sys::fsutil;

/// Where kubeadm-platform manifests are parked while their pod is stopped (same filesystem).
pub(super) const PARKED: &str = catalog::paths::PARKED_MANIFESTS;

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
pub(super) struct StopFailed {
    pub(super) error: RestartError,
    pub(super) never_stopped: bool,
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
pub(super) fn stop_and_start(
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
