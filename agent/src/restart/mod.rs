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
//! Other static pods that mount a renewed file (kube-vip) are restarted the same way and
//! verified by their processes in `/proc`, probe or not ([`consumer`]).
//!
//! Verification connects over TLS to the component's endpoint (from its manifest, or
//! `--endpoint`): etcd's client port with the healthcheck client certificate, the apiserver's
//! `/readyz` with a client certificate, the controller-manager's and scheduler's `/healthz`. For
//! etcd and the apiserver the SHA-256 of the served certificate must equal the file's.
//!
//! Here: the options, the errors, and [`restart_all`] (one target at a time: stop, wait until
//! the old process is gone, start, verify). Beside it: `platform` (which platform, detected; the
//! pods it runs), `target` (what is restarted and how each is probed), `stop` (stopping and
//! starting one pod, its stop recorded first), `serving` (waits for the served certificate).

pub mod api;
pub mod consumer;
pub mod lease;
pub mod pairs;
mod platform;
pub mod process;
pub mod reload;
mod serving;
mod stop;
mod target;
pub mod verify;

pub use consumer::{PodRestartError, RestartedPod, manual_restart, restart_pod};
pub use platform::{KUBEADM_MANIFESTS, Platform, PlatformChoice, bottlerocket_mark, detect, pods};
pub use serving::{Reloaded, wait_reloaded, wait_verified};
pub use stop::{Ensured, StopRecord, Stopped, ensure_enabled};
pub use target::{Target, components_for, parse_endpoint, targets};

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::node::manifests::Component;
use crate::restart::api::ApiStats;
use crate::restart::stop::stop_and_start;

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
    /// How long a restarted static pod without a probe of certrotor's (kube-vip) must keep its
    /// new process before its restart counts as verified ([`consumer`]).
    pub settle: Duration,
}

/// `--settle`'s default.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(10);

/// `--restart-timeout`'s default, and the bound of recovery's API calls for commands that have
/// no restart options.
pub const DEFAULT_RESTART_TIMEOUT: Duration = Duration::from_secs(300);

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

/// Before a component is stopped: one whose port is closed is starting again by itself (the
/// scheduler and controller-manager exit when they lose their leader lease while the apiserver
/// restarts, and the kubelet starts them again). Stopping it then would prove nothing: its port
/// is already closed, so the stop is not waited for, and a manifest moved away and back between
/// two looks of the kubelet is never seen (measured with the kubelet double: the scheduler
/// "restarted" in 979 ms without being stopped). So the restart first waits, within the
/// restart timeout, for it to accept connections again; one that never does is stopped and
/// started all the same, and verification decides.
fn wait_up(what: &str, address: std::net::SocketAddr, opts: &RestartOptions) {
    if verify::wait_open(address, Duration::ZERO, opts.poll).is_ok() {
        return;
    }
    log::info!(
        "{what}: nothing accepts connections on {address} (starting again by itself?); waiting for it before stopping it"
    );
    let t = Instant::now();
    match verify::wait_open(address, opts.timeout, opts.poll) {
        Ok(()) => log::info!(
            "{what}: accepts connections again after {} ms",
            t.elapsed().as_millis()
        ),
        Err(e) => log::warn!("{what}: {}; stopping and starting it all the same", e.0),
    }
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
    if target.expect_up {
        wait_up(target.component.name(), target.probe.address, opts);
    }
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

#[cfg(test)]
mod tests;
