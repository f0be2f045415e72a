//! The operations behind the commands that change a node: renew, roll back, list backups.
//! Each takes the lock, completes any interrupted transaction, then does its work.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::node::Node;
use crate::node::inventory;
use crate::renew::{self, Plan, Policy};
use crate::restart::api::{ApiStats, DiscardedTx};
use crate::restart::{self, PlatformChoice, RestartOptions};
use crate::sys::clock::SharedClock;
use crate::txn::{self, Lock, Recovery, TxnError};

use std::fmt;

/// Options shared by commands that write.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub lock_timeout: Duration,
    pub retention: usize,
    /// Who issues the new certificates (`--engine`).
    pub engine: crate::renew::engine::Engine,
    /// The date for new certificates, backups and records, handed down by the edge.
    pub clock: SharedClock,
}

impl WriteOptions {
    /// The defaults, reading the date from `clock`.
    pub fn new(clock: SharedClock) -> Self {
        WriteOptions {
            lock_timeout: Duration::from_secs(60),
            retention: txn::DEFAULT_RETENTION,
            engine: crate::renew::engine::Engine::Native,
            clock,
        }
    }
}

/// Why an operation failed, with its typed cause. Every variant that can happen before the
/// transaction commits says so ("nothing was changed"). `Display` is the whole sentence for a
/// person (it includes the cause's text); `source()` gives the cause to programs (the exit code
/// is chosen from it, in [`crate::pass::outcome`]).
#[derive(Debug)]
pub enum OpsError {
    /// Locking, recovering, applying or reading a backup.
    Txn(TxnError),
    /// An interrupted restart could not be completed.
    RecoverRestart(crate::restart::RestartError),
    /// The restart platform could not be determined.
    Platform(crate::restart::RestartError),
    /// A component that would need a restart cannot be restarted; nothing was written.
    NotRestartable(crate::restart::RestartError),
    /// The renewal plan is refused (bad names, beyond the CA, …).
    Plan(renew::PlanError),
    /// Issuing the new certificates failed; nothing was written.
    Issue(renew::IssueError),
    /// A new certificate failed validation before anything was written.
    Invalid(renew::IssueError),
    /// `rollback` without `--backup`, and there is no backup to restore.
    NoBackups { dir: String },
    /// The record of restarts to do could not be written; nothing was changed.
    Pending {
        path: String,
        source: std::io::Error,
    },
    /// An earlier release's record of restarts still owed (`pending-restarts.json`) exists but
    /// cannot be used.
    OwedRestarts(crate::sys::state::StateError),
    /// The pass state (`pass.json`) exists but cannot be used.
    PassState(crate::sys::state::StateError),
    /// `etcd-client import` refused or failed to install the bundle.
    Import(Box<crate::pass::etcd_client::EtcdClientError>),
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpsError::Txn(e) => write!(f, "{e}"),
            OpsError::RecoverRestart(e) => write!(f, "recovering an interrupted restart: {e}"),
            OpsError::Platform(e) => write!(f, "{e}"),
            OpsError::NotRestartable(e) => write!(f, "{e}; nothing was changed"),
            OpsError::Plan(e) => write!(f, "{e}"),
            OpsError::Issue(e) => write!(f, "{e}; nothing was changed"),
            OpsError::Invalid(e) => write!(f, "{e}"),
            OpsError::NoBackups { dir } => write!(f, "no backups under '{dir}'"),
            OpsError::Pending { path, source } => write!(
                f,
                "cannot record the restarts to do in '{path}': {source}; nothing was changed"
            ),
            OpsError::OwedRestarts(e) => write!(
                f,
                "{e}; nothing was changed. Restart the components listed in it yourself (or \
                 repair the file), then remove it"
            ),
            OpsError::Import(e) => write!(f, "{e}"),
            OpsError::PassState(e) => write!(
                f,
                "{e}; nothing was changed. It records the restarts an interrupted pass owes and \
                 the static pod it stopped: make sure every static pod runs and restart those \
                 that read renewed files, then remove the file"
            ),
        }
    }
}

impl std::error::Error for OpsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpsError::Txn(e) => Some(e),
            OpsError::RecoverRestart(e) | OpsError::Platform(e) | OpsError::NotRestartable(e) => {
                Some(e)
            }
            OpsError::Plan(e) => Some(e),
            OpsError::Issue(e) | OpsError::Invalid(e) => Some(e),
            OpsError::NoBackups { .. } => None,
            OpsError::Pending { source, .. } => Some(source),
            OpsError::OwedRestarts(e) | OpsError::PassState(e) => Some(e),
            OpsError::Import(e) => Some(e.as_ref()),
        }
    }
}

impl From<TxnError> for OpsError {
    fn from(e: TxnError) -> Self {
        OpsError::Txn(e)
    }
}

/// Completes or undoes an interrupted transaction before any command reads the PKI.
pub fn recover_before_reading(root: &std::path::Path) -> Result<(), OpsError> {
    // Only where certrotor has state: a read-only inspection of a foreign root writes nothing.
    let state = txn::state_dir(root);
    if !state.is_dir() {
        return Ok(());
    }
    // Reading never waits for another run: a renewal holds the lock for seconds, a daemon's
    // restart pass for minutes. Say that one is in progress and read the files as they are.
    match lock_and_recover(root, std::time::Duration::ZERO) {
        Ok(_lock) => Ok(()),
        Err(OpsError::Txn(txn::TxnError::Locked { .. })) => {
            log::warn!(
                "another certrotor run is in progress (it holds '{}'); reading the PKI as it is \
                 now, without waiting: files being renewed may change in a moment",
                state.join("lock").display()
            );
            Ok(())
        }
        // A read-only root (a mounted snapshot, a read-only bind) or a user who may not write
        // there can still inspect it; say so when an interrupted transaction could not be
        // completed first. Anything else wrong with the lock (a symlink, a FIFO, a folder
        // leading out of the root) stops the command.
        Err(OpsError::Txn(txn::TxnError::Prepare { source, .. }))
            if matches!(
                source.raw_os_error(),
                Some(libc::EROFS | libc::EACCES | libc::EPERM)
            ) =>
        {
            let journal = state.join("journal.json").exists();
            log::warn!(
                "cannot take the lock in '{}' ({source}); reading without it{}",
                state.display(),
                if journal {
                    "; an interrupted transaction is pending and the PKI may be half-renewed: run certrotor where the root is writable"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Err(f) => Err(f),
    }
}

/// Takes the lock and completes or discards an interrupted transaction, logging what it did;
/// discards the Bottlerocket API transactions an interrupted run left pending; makes sure a
/// static pod that an interrupted restart left stopped runs again. For commands without
/// restart options (see [`lock_and_recover_with`]).
pub fn lock_and_recover(root: &Path, timeout: Duration) -> Result<Lock, OpsError> {
    lock_and_recover_with(root, timeout, None).map(|(lock, _)| lock)
}

/// What recovery did that a pass reports.
#[derive(Debug, Clone, Default)]
pub struct Recovered {
    /// Pending `certrotor-*` transactions of the Bottlerocket API, discarded.
    pub discarded: Vec<DiscardedTx>,
    /// What recovery's API calls met.
    pub api: ApiStats,
}

/// [`lock_and_recover`] for a command with restart options: recovery's API calls use their
/// socket (unless an interrupted restart recorded its own) and are retried within their
/// restart timeout (else [`restart::DEFAULT_RESTART_TIMEOUT`]).
pub fn lock_and_recover_with(
    root: &Path,
    timeout: Duration,
    restart: Option<&RestartOptions>,
) -> Result<(Lock, Recovered), OpsError> {
    let lock = txn::lock(root, timeout)?;
    // The transaction first: a pod started again below must start on the files as they stay.
    let recovery = txn::recover(root)?;
    match &recovery {
        Recovery::Clean => {}
        Recovery::DiscardedStaging { with_files, empty } => {
            if *with_files > 0 {
                log::warn!(
                    "removed {with_files} staging folder(s) holding the staged files of a run \
                     interrupted before it changed anything; the PKI was not touched"
                );
            }
            if *empty > 0 {
                log::info!(
                    "removed {empty} empty staging folder(s) left by an earlier run (its \
                     transaction had completed, or had not staged a file yet)"
                );
            }
        }
        Recovery::RolledForward {
            kind,
            backup_id,
            files,
        } => log::warn!("completed an interrupted {kind} of {files} file(s) (backup {backup_id})"),
        Recovery::Undone {
            kind,
            backup_id,
            damaged,
        } => log::error!(
            "an interrupted {kind} was undone: the staged copy of '{damaged}' is damaged (not \
             the content validated before the crash), so backup {backup_id} was restored and \
             nothing damaged went live; check the disk, then run again"
        ),
    }
    let bound = restart.map_or(restart::DEFAULT_RESTART_TIMEOUT, |r| r.timeout);
    let poll = restart.map_or(Duration::from_millis(200), |r| r.poll);
    let mut recovered = Recovered::default();
    // Then the stale transactions: the pod started below is started in a transaction of its
    // own, and nothing stale may be committed with it later.
    if let Some(socket) = recovery_api(root, restart) {
        let client = restart::api::client(&socket, bound);
        let deadline = std::time::Instant::now() + bound;
        match restart::api::discard_stale(&client, deadline, &mut recovered.api) {
            Ok(discarded) => recovered.discarded = discarded,
            Err(e) => log::warn!(
                "cannot list the Bottlerocket API's pending transactions through '{}': {e}; one \
                 an interrupted run left pending stays (certrotor never commits it)",
                socket.display()
            ),
        }
    }
    let said = crate::pass::state::recover(root, &recovery, (bound, poll), &mut recovered.api)?;
    for said in said {
        log::warn!("{said}");
    }
    Ok((lock, recovered))
}

/// The Bottlerocket API whose stale transactions recovery discards: the one an interrupted
/// restart recorded; else the one the command was given, on a Bottlerocket node; else, for
/// commands without restart options, the default socket where it exists.
fn recovery_api(root: &Path, restart: Option<&RestartOptions>) -> Option<PathBuf> {
    let recorded = crate::pass::state::PassState::load(root)
        .ok()
        .and_then(|s| s.stopped)
        .filter(|s| s.platform == "bottlerocket")
        .map(|s| {
            PathBuf::from(
                s.api_socket
                    .unwrap_or_else(|| crate::node::catalog::paths::API_SOCKET.into()),
            )
        });
    if recorded.is_some() {
        return recorded;
    }
    let given = match restart {
        Some(r) => match r.platform {
            PlatformChoice::Bottlerocket | PlatformChoice::Auto => r.api_socket.clone(),
            PlatformChoice::Kubeadm | PlatformChoice::None => return None,
        },
        None => PathBuf::from(crate::node::catalog::paths::API_SOCKET),
    };
    given.exists().then_some(given)
}

/// The result of a renewal.
#[derive(Debug, Clone, Serialize)]
pub struct RenewReport {
    pub root: String,
    pub dry_run: bool,
    pub plan: Plan,
    pub backup_id: Option<String>,
    pub files_written: Vec<String>,
    /// The kubelet's client and serving certificates ([`crate::node::kubelet`]).
    pub kubelet: crate::renew::kubelet::Plan,
    pub duration_ms: u128,
}

impl RenewReport {
    /// A renewal that planned nothing.
    pub fn empty(root: &Path, dry_run: bool) -> RenewReport {
        RenewReport {
            root: root.display().to_string(),
            dry_run,
            plan: Plan::default(),
            backup_id: None,
            files_written: vec![],
            kubelet: crate::renew::kubelet::Plan::default(),
            duration_ms: 0,
        }
    }

    /// Whether the plan renews anything.
    pub fn has_work(&self) -> bool {
        !(self.plan.items.is_empty() && self.kubelet.is_empty())
    }
}

/// Renews what `policy` selects under `root`.
pub fn renew(
    root: &Path,
    policy: &Policy,
    dry_run: bool,
    opts: &WriteOptions,
) -> Result<RenewReport, OpsError> {
    let started = std::time::Instant::now();
    let now = opts.clock.now();
    if dry_run {
        // A plan writes nothing, so it also works on a read-only node.
        recover_before_reading(root)?;
        // Found after the recovery, which may have put files back.
        let mut report = plan_renewal(&Node::discover(root), policy, true, now)?;
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    // Found after the recovery, which may have put files back.
    let mut report = plan_renewal(&Node::discover(root), policy, false, now)?;
    if report.has_work() {
        write_renewal(root, &mut report, opts, now, &mut |_| Ok(()))?;
    }
    report.duration_ms = started.elapsed().as_millis();
    Ok(report)
}

/// What a renewal would do at `now`: the inventory, the plan, the kubelet's certificates.
/// Reads only.
pub fn plan_renewal(
    node: &Node,
    policy: &Policy,
    dry_run: bool,
    now: i64,
) -> Result<RenewReport, OpsError> {
    let inv = inventory::take(node, now, policy.within);
    let plan = renew::plan(&inv, policy, now).map_err(OpsError::Plan)?;
    let kubelet = crate::renew::kubelet::plan(&inv, policy, now);
    for why in &kubelet.refused {
        log::warn!("not renewed {why}");
    }
    // Asked for by name and refused: an error, as for any named certificate.
    if let Some(why) = kubelet.refused.iter().find(|_| {
        policy
            .names
            .iter()
            .any(|n| n == crate::node::kubelet::CLIENT)
    }) {
        return Err(OpsError::Plan(renew::PlanError(format!(
            "cannot renew; nothing was changed:\n  not renewed {why}"
        ))));
    }
    Ok(RenewReport {
        plan,
        kubelet,
        ..RenewReport::empty(node.root(), dry_run)
    })
}

/// Issues what `report` plans, validates it, and writes it in one transaction (the kubelet's
/// files in the same one: one backup, one rollback). `before_journal` as
/// [`txn::apply_with`].
pub fn write_renewal(
    root: &Path,
    report: &mut RenewReport,
    opts: &WriteOptions,
    now: i64,
    before_journal: &mut dyn FnMut(&str) -> std::io::Result<()>,
) -> Result<(), OpsError> {
    let mut changes = Vec::new();
    if !report.plan.items.is_empty() {
        let crate::renew::engine::Output { issued, validity } =
            crate::renew::engine::issue(root, &report.plan, &opts.engine, &*opts.clock)
                .map_err(OpsError::Issue)?;
        renew::validate_with(&issued, &report.plan, validity).map_err(OpsError::Invalid)?;
        // Test-only (feature `failpoints`): CERTROTOR_FAILPOINT=foreign-ca:NAME breaks a
        // certificate after validation, so that the live tests meet a genuine failure.
        #[cfg(feature = "failpoints")]
        let issued = {
            let mut issued = issued;
            crate::renew::foreign_ca::apply(&mut issued)
                .map_err(|e| OpsError::Issue(renew::IssueError(e)))?;
            issued
        };
        changes = renew::changes(&issued);
    }
    changes.extend(
        crate::renew::kubelet::changes(root, &mut report.kubelet, now)
            .map_err(|e| OpsError::Issue(renew::IssueError(e)))?,
    );
    let outcome = txn::apply_with(root, &changes, "renew", now, opts.retention, before_journal)?;
    report.backup_id = Some(outcome.backup_id);
    report.files_written = outcome.files;
    Ok(())
}

/// Restores a backup (the newest when `id` is `None`) as a transaction of its own.
pub fn rollback(
    root: &Path,
    id: Option<&str>,
    opts: &WriteOptions,
) -> Result<(String, txn::Outcome), OpsError> {
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    rollback_locked(root, id, opts)
}

pub fn rollback_locked(
    root: &Path,
    id: Option<&str>,
    opts: &WriteOptions,
) -> Result<(String, txn::Outcome), OpsError> {
    let id = match id {
        Some(id) => id.to_string(),
        None => txn::newest_restorable(root)?.ok_or_else(|| OpsError::NoBackups {
            dir: txn::state_dir(root).join("backups").display().to_string(),
        })?,
    };
    let (_manifest, changes) = txn::restore_changes(root, &id)?;
    let outcome = txn::apply(
        root,
        &changes,
        "rollback",
        opts.clock.now(),
        opts.retention.max(2),
    )?;
    Ok((id, outcome))
}
