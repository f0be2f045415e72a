//! `certrotor status`: what the node's certrotor did last, what it will do next, and what it
//! still owes. Also the record that makes it possible: every `run`/`daemon` pass ends by writing
//! `var/lib/certrotor/last-pass.json` (a versioned state file, [`crate::state`]), through
//! [`run_pass`], which also posts the pass's Kubernetes Event ([`crate::events`]).
//!
//! Reading never guesses: a last-pass record that exists but cannot be read, or comes from a
//! newer certrotor, is an error (exit 2), never "no pass yet". The cluster lock holder is read
//! from etcd best effort (bounded by the etcd client's timeouts) and said to be unknown, with the
//! reason, when etcd cannot be reached.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock;
use crate::ops::{OpsError, RunOptions, RunReport};
use crate::state::{self, Kind, StateError};
use crate::txn;

/// The record's file name under `var/lib/certrotor`.
pub const LAST_PASS: &str = "last-pass.json";

/// Renewal window `status` assumes when no pass recorded one (`run`'s default `--within`).
pub const DEFAULT_WITHIN: i64 = 90 * clock::DAY;

/// What the last `run`/`daemon` pass did (`last-pass.json`, version 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastPass {
    pub version: u32,
    /// `run` or `daemon`.
    pub command: String,
    pub started_at: String,
    pub finished_at: String,
    /// `finished_at` as Unix seconds.
    pub finished_unix: i64,
    /// `nothing-due`, `renewed`, `rolled-back`, `rollback-failed`, `deferred`, `locked` or
    /// `failed`.
    pub result: String,
    /// The exit code `run --once` gave (or would give) for this pass.
    pub exit_code: u8,
    /// The certificates and kubeconfigs renewed (or installed) by the pass.
    pub renewed: Vec<String>,
    /// notAfter of what was renewed.
    pub new_not_after: Option<String>,
    pub backup_id: Option<String>,
    pub platform: Option<String>,
    /// Components and static pods (by manifest name) restarted.
    pub restarted: Vec<String>,
    /// Components (and static pods such as kube-vip, by manifest name) the pass should have
    /// restarted but did not (owed to the next pass).
    pub owed: Vec<String>,
    /// Why verification failed, when the pass rolled back.
    pub rollback_reason: Option<String>,
    /// The error of a failed pass.
    pub error: Option<String>,
    /// The renewal policy of the pass: what expires within this many seconds is renewed.
    pub within_seconds: i64,
    /// `--all`: everything renewable, due or not.
    pub all: bool,
    /// The daemon's interval between passes (none for `run --once`).
    pub interval_seconds: Option<u64>,
}

impl LastPass {
    /// The record of a pass that returned `result`.
    pub fn of(
        result: &Result<RunReport, OpsError>,
        opts: &RunOptions,
        started: i64,
        finished: i64,
        interval: Option<Duration>,
    ) -> LastPass {
        let mut p = LastPass {
            version: Kind::LastPass.current(),
            command: if interval.is_some() { "daemon" } else { "run" }.into(),
            started_at: clock::rfc3339(started),
            finished_at: clock::rfc3339(finished),
            finished_unix: finished,
            result: String::new(),
            exit_code: 0,
            renewed: vec![],
            new_not_after: None,
            backup_id: None,
            platform: None,
            restarted: vec![],
            owed: vec![],
            rollback_reason: None,
            error: None,
            within_seconds: opts.policy.within,
            all: opts.policy.all,
            interval_seconds: interval.map(|d| d.as_secs()),
        };
        match result {
            Err(e) => {
                p.exit_code = crate::outcome::for_error(e);
                p.result = if p.exit_code == crate::outcome::EXIT_LOCKED {
                    "locked"
                } else {
                    "failed"
                }
                .into();
                p.error = Some(e.to_string());
            }
            Ok(r) => {
                p.exit_code = crate::outcome::for_run(r);
                p.renewed = renewed_names(r);
                if !p.renewed.is_empty() {
                    p.new_not_after = Some(r.renew.plan.not_after.clone());
                }
                p.backup_id = r.renew.backup_id.clone();
                p.platform = Some(r.platform.clone());
                p.restarted = r
                    .restarted
                    .iter()
                    .map(|x| x.component.name().to_string())
                    .chain(r.restarted_pods.iter().map(|x| x.pod.clone()))
                    .collect();
                let cluster = r.cluster.as_ref();
                p.result = match &r.rolled_back {
                    Some(rb) if rb.error.is_some() => "rollback-failed",
                    Some(_) => "rolled-back",
                    None if cluster.is_some_and(|c| c.deferred) => "deferred",
                    None if p.exit_code == crate::outcome::EXIT_FAILED => "failed",
                    None if p.renewed.is_empty() => "nothing-due",
                    None => "renewed",
                }
                .into();
                if let Some(rb) = &r.rolled_back {
                    p.rollback_reason = Some(rb.failure.clone());
                    p.error = rb.error.clone();
                } else if let Some(c) = cluster {
                    p.error = c.pair_error.clone().or_else(|| c.error.clone());
                }
                if p.error.is_none() && !r.pod_errors.is_empty() {
                    p.error = Some(r.pod_errors.join("; "));
                }
                if r.rolled_back.is_none() && r.platform != "none" {
                    p.owed = r
                        .components
                        .iter()
                        .filter(|c| !r.restarted.iter().any(|x| x.component == **c))
                        // Reloaded live (reload.rs): served without a restart, not owed.
                        .filter(|c| !r.reloaded.iter().any(|x| x.component == **c))
                        .map(|c| c.name().to_string())
                        .chain(r.owed_pods.iter().cloned())
                        .collect();
                }
            }
        }
        p
    }
}

/// What a pass renewed: the plan's items when a backup was made, and the apiserver-etcd-client
/// pair a pass installed from etcd.
pub fn renewed_names(r: &RunReport) -> Vec<String> {
    let mut names: Vec<String> = if r.renew.backup_id.is_some() && !r.renew.dry_run {
        r.renew.plan.items.iter().map(|i| i.name.clone()).collect()
    } else {
        vec![]
    };
    if let Some(i) = &r.import {
        names.extend(i.files.iter().cloned());
    }
    names
}

/// The record's path.
pub fn last_pass_path(root: &Path) -> std::path::PathBuf {
    txn::state_dir(root).join(LAST_PASS)
}

/// Reads the last-pass record: `Ok(None)` only when no pass has written one.
pub fn read_last_pass(root: &Path) -> Result<Option<LastPass>, StateError> {
    Ok(state::read::<LastPass>(Kind::LastPass, &last_pass_path(root))?.map(|(_, p)| p))
}

/// One `run`/`daemon` pass as the commands run it: [`crate::ops::run_once`], then the
/// last-pass record (not for `--dry-run`, which writes nothing) and the Kubernetes Event.
/// Neither changes the pass's result: failing to record or to post is a warning.
/// `interval`: the daemon's, `None` for `run --once`.
pub fn run_pass(
    root: &Path,
    opts: &RunOptions,
    interval: Option<Duration>,
) -> Result<RunReport, OpsError> {
    let started = clock::now();
    let result = crate::ops::run_once(root, opts);
    if opts.dry_run {
        return result;
    }
    let pass = LastPass::of(&result, opts, started, clock::now(), interval);
    let dir = txn::state_dir(root);
    let written = crate::fsutil::create_dir_all_mode(&dir, 0o700)
        .and_then(|()| state::write(&last_pass_path(root), &pass));
    if let Err(e) = written {
        log::warn!(
            "cannot record the pass in '{}': {e}; 'certrotor status' will show an older pass",
            last_pass_path(root).display()
        );
    }
    crate::events::after_pass(root, &pass);
    result
}

// === status ===

/// The certificate that comes due first.
#[derive(Debug, Clone, Serialize)]
pub struct NextDue {
    pub name: String,
    pub not_after: String,
    pub residual_seconds: Option<i64>,
    /// When a pass will renew it: notAfter minus the renewal window (or now, if past).
    pub renewal_at: String,
    /// The renewal window used, and where it came from (`last pass`, `--within`, `default`).
    pub within_seconds: i64,
    pub within_from: String,
}

/// This node's lock file.
#[derive(Debug, Clone, Serialize)]
pub struct LocalLock {
    pub path: String,
    pub held: bool,
    /// What the holder wrote (`pid N`), when held.
    pub holder: Option<String>,
}

/// The cluster lock in etcd (cluster mode), best effort.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterLock {
    pub endpoints: Vec<String>,
    /// Whether etcd answered.
    pub reachable: bool,
    /// The holder, when held: node, pid, since.
    pub holder: Option<String>,
    /// Why the holder is unknown.
    pub error: Option<String>,
}

/// Restarts owed to the node (`pending-restarts.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Owed {
    pub components: Vec<String>,
    /// Other static pods (kube-vip) that mount a renewed file.
    pub pods: Vec<String>,
    pub backup_id: Option<String>,
}

/// Everything `status` shows; `--output json` is this object.
#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub root: String,
    pub generated_at: String,
    /// `None`: no pass recorded yet on this node.
    pub last_pass: Option<LastPass>,
    /// When the daemon's next pass is expected (last pass + interval), for a daemon.
    pub next_pass_at: Option<String>,
    pub next_due: Option<NextDue>,
    pub owed_restarts: Owed,
    pub lock: LocalLock,
    /// `None` when cluster mode does not apply here (no etcd endpoints, `--cluster off`).
    pub cluster_lock: Option<ClusterLock>,
    pub backups: Vec<txn::BackupInfo>,
}

/// Options of `status`.
#[derive(Debug, Clone, Default)]
pub struct StatusOptions {
    /// `--within`: overrides the last pass's renewal window.
    pub within: Option<i64>,
    /// `--cluster off`: do not ask etcd for the cluster lock.
    pub cluster: crate::cluster::ClusterOptions,
    pub restart: Option<crate::restart::RestartOptions>,
}

/// Why `status` could not say: a state file it reads cannot be used (nothing was changed).
#[derive(Debug)]
pub enum StatusError {
    /// Recovery, the owed-restarts record or the backups.
    Ops(OpsError),
    /// The last-pass record exists but cannot be read, or is of a newer certrotor.
    LastPass(StateError),
}

impl std::fmt::Display for StatusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusError::Ops(e) => write!(f, "{e}"),
            StatusError::LastPass(e) => write!(
                f,
                "{e}; nothing was changed. The next 'run' or 'daemon' pass rewrites it; remove \
                 it to see the status without the last pass"
            ),
        }
    }
}

impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StatusError::Ops(e) => Some(e),
            StatusError::LastPass(e) => Some(e),
        }
    }
}

impl From<OpsError> for StatusError {
    fn from(e: OpsError) -> Self {
        StatusError::Ops(e)
    }
}

/// Gathers the status of the node under `root`. Reads only (after the recovery every command
/// does), and never waits for the lock.
pub fn status(root: &Path, opts: &StatusOptions) -> Result<StatusReport, StatusError> {
    crate::recover_before_reading(root)?;
    let now = clock::now();
    let last_pass = read_last_pass(root).map_err(StatusError::LastPass)?;
    let (within, within_from) = match (opts.within, &last_pass) {
        (Some(w), _) => (w, "--within"),
        (None, Some(p)) => (p.within_seconds, "last pass"),
        (None, None) => (DEFAULT_WITHIN, "default"),
    };
    let inv = crate::inventory::take(root, now, within);
    let next_due = inv
        .certificates
        .iter()
        .filter(|r| r.renewable && !r.externally_managed)
        .filter_map(|r| r.not_after_unix.map(|t| (t, r)))
        .min_by_key(|(t, _)| *t)
        .map(|(t, r)| NextDue {
            name: r.name.clone(),
            not_after: clock::rfc3339(t),
            residual_seconds: r.residual_seconds,
            renewal_at: clock::rfc3339((t - within).max(now)),
            within_seconds: within,
            within_from: within_from.into(),
        });
    let next_pass_at = last_pass.as_ref().and_then(|p| {
        p.interval_seconds
            .and_then(|i| i64::try_from(i).ok())
            .map(|i| clock::rfc3339(p.finished_unix + i))
    });
    let owed = crate::ops::owed_restarts(root)?;
    let owed_restarts = Owed {
        components: owed
            .components
            .iter()
            .map(|c| c.name().to_string())
            .collect(),
        pods: owed.pods,
        backup_id: owed.backup_id,
    };
    Ok(StatusReport {
        root: root.display().to_string(),
        generated_at: clock::rfc3339(now),
        last_pass,
        next_pass_at,
        next_due,
        owed_restarts,
        lock: local_lock(root),
        cluster_lock: cluster_lock(root, opts),
        backups: txn::list_backups(root).map_err(OpsError::from)?,
    })
}

/// Whether another process holds the node's lock file, without taking it for long and without
/// creating it.
fn local_lock(root: &Path) -> LocalLock {
    let path = txn::state_dir(root).join("lock");
    let mut lock = LocalLock {
        path: path.display().to_string(),
        held: false,
        holder: None,
    };
    let Ok(file) = std::fs::File::open(&path) else {
        return lock;
    };
    if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock_shared() {
        lock.held = true;
        lock.holder = std::fs::read_to_string(&path)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .or_else(|| Some("unknown pid".into()));
    }
    lock
}

/// The cluster lock's holder from etcd, when cluster mode applies here.
fn cluster_lock(root: &Path, opts: &StatusOptions) -> Option<ClusterLock> {
    use crate::cluster::{self, Mode};
    if opts.cluster.mode == Mode::Off {
        return None;
    }
    let restart = opts.restart.clone()?;
    let platform = crate::restart::detect(root, &restart).ok()?;
    let pods = crate::restart::pods(&platform).unwrap_or_default();
    let node = match cluster::discover(root, &pods, &opts.cluster) {
        Ok(Some(n)) => n,
        Ok(None) => return None,
        Err(e) => {
            return Some(ClusterLock {
                endpoints: opts.cluster.endpoints.clone(),
                reachable: false,
                holder: None,
                error: Some(e.0),
            });
        }
    };
    let mut out = ClusterLock {
        endpoints: node.access.endpoints.clone(),
        reachable: false,
        holder: None,
        error: None,
    };
    let got = cluster::Client::new(&node.access).and_then(|c| c.get(cluster::LOCK_KEY));
    match got {
        Ok(value) => {
            out.reachable = true;
            out.holder = value.map(|v| {
                serde_json::from_slice::<cluster::Holder>(&v)
                    .map(|h| format!("{} (pid {}, since {})", h.node, h.pid, h.since))
                    .unwrap_or_else(|_| "unreadable holder record".into())
            });
        }
        Err(e) => out.error = Some(format!("unknown: etcd not reachable: {}", e.0)),
    }
    Some(out)
}
