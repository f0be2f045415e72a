//! `certrotor status`: what the node's certrotor did last (the record
//! [`crate::pass::record`] keeps), what it will do next, and what it still owes.
//!
//! Reading never guesses: a last-pass record that exists but cannot be read, or comes from a
//! newer certrotor, is an error (exit 2), never "no pass yet". The cluster lock holder is read
//! from etcd best effort (bounded by the etcd client's timeouts) and said to be unknown, with the
//! reason, when etcd cannot be reached.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Serialize;

use crate::pass::ops::OpsError;
use crate::pass::record::{LastPass, read_last_pass};
use crate::sys::clock;
use crate::sys::state::StateError;
use crate::txn;

/// Renewal window `status` assumes when no pass recorded one (`run`'s default `--within`).
pub const DEFAULT_WITHIN: i64 = 90 * clock::DAY;

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
    /// The CA rotation recorded on this node (`ca-rotation.json`), if any.
    pub ca_rotation: Option<crate::ca::rotation::Rotation>,
    /// That rotation's stage on every etcd member, as etcd holds it (cluster mode, etcd
    /// reachable; `None` otherwise).
    pub ca_rotation_members: Option<Vec<crate::ca::rotate::MemberStage>>,
}

/// Options of `status`.
#[derive(Debug, Clone)]
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
    /// The CA rotation's state exists but cannot be read, or is of a newer certrotor.
    CaRotation(StateError),
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
            StatusError::CaRotation(e) => write!(
                f,
                "{e}; nothing was changed. It records a CA rotation in progress: restore it from \
                 the node's backup, or finish the rotation by hand ('certrotor ca plan')"
            ),
        }
    }
}

impl std::error::Error for StatusError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StatusError::Ops(e) => Some(e),
            StatusError::LastPass(e) => Some(e),
            StatusError::CaRotation(e) => Some(e),
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
    crate::pass::ops::recover_before_reading(root)?;
    let now = opts.cluster.clock.now();
    let last_pass = read_last_pass(root).map_err(StatusError::LastPass)?;
    let (within, within_from) = match (opts.within, &last_pass) {
        (Some(w), _) => (w, "--within"),
        (None, Some(p)) => (p.within_seconds, "last pass"),
        (None, None) => (DEFAULT_WITHIN, "default"),
    };
    // Found after the recovery above, which may have put files back.
    let node = crate::node::Node::discover(root);
    let inv = crate::node::inventory::take(&node, now, within);
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
    let (owed, backup_id) = crate::pass::state::owed(root)?;
    let owed_restarts = Owed {
        components: owed
            .components
            .iter()
            .map(|c| c.name().to_string())
            .collect(),
        pods: owed.pods,
        backup_id,
    };
    let (cluster_lock, client) = cluster_lock(&node, opts);
    let ca_rotation = crate::ca::rotation::Rotation::load(root).map_err(StatusError::CaRotation)?;
    // Best effort, as the cluster lock: etcd's view of every member's stage.
    let ca_rotation_members = match (&ca_rotation, &client) {
        (Some(r), Some(c)) => crate::ca::rotate::member_stages(c, r.ca, &r.old_sha256, now).ok(),
        _ => None,
    };
    Ok(StatusReport {
        root: root.display().to_string(),
        generated_at: clock::rfc3339(now),
        last_pass,
        next_pass_at,
        next_due,
        owed_restarts,
        lock: local_lock(root),
        cluster_lock,
        backups: txn::list_backups(root).map_err(OpsError::from)?,
        ca_rotation,
        ca_rotation_members,
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
    // Never through a symlink, never blocking on a FIFO, only a regular file (what
    // `txn::lock` takes).
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path);
    let Ok(file) = opened else {
        return lock;
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return lock;
    }
    if let Err(std::fs::TryLockError::WouldBlock) = file.try_lock_shared() {
        lock.held = true;
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&file, 256), &mut text);
        lock.holder = Some(text.trim().to_string())
            .filter(|s| !s.is_empty())
            .or_else(|| Some("unknown pid".into()));
    }
    lock
}

/// The cluster lock's holder from etcd, when cluster mode applies here, and the etcd client
/// when etcd answered.
fn cluster_lock(
    node: &crate::node::Node,
    opts: &StatusOptions,
) -> (Option<ClusterLock>, Option<crate::cluster::Client>) {
    use crate::cluster::{self, Mode};
    if opts.cluster.mode == Mode::Off {
        return (None, None);
    }
    let Some(restart) = opts.restart.clone() else {
        return (None, None);
    };
    let Ok(platform) = crate::restart::detect(node.root(), &restart) else {
        return (None, None);
    };
    let pods = crate::restart::pods(&platform).unwrap_or_default();
    let node = match cluster::discover(node, &pods, &opts.cluster) {
        Ok(Some(n)) => n,
        Ok(None) => return (None, None),
        Err(e) => {
            let lock = ClusterLock {
                endpoints: opts.cluster.endpoints.clone(),
                reachable: false,
                holder: None,
                error: Some(e.0),
            };
            return (Some(lock), None);
        }
    };
    let mut out = ClusterLock {
        endpoints: node.access.endpoints.clone(),
        reachable: false,
        holder: None,
        error: None,
    };
    let client = cluster::Client::new(&node.access);
    let got = client
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|c| c.get(cluster::LOCK_KEY));
    match got {
        Ok(value) => {
            out.reachable = true;
            out.holder = value.map(|v| {
                if serde_json::from_slice::<cluster::Holder>(&v).is_ok() {
                    cluster::holder_text(&v)
                } else {
                    "unreadable holder record".into()
                }
            });
        }
        Err(e) => out.error = Some(format!("unknown: etcd not reachable: {}", e.0)),
    }
    let client = client.ok().filter(|_| out.reachable);
    (Some(out), client)
}
