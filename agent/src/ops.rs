//! The operations behind the commands that change a node: renew, roll back, list backups.
//! Each takes the lock, completes any interrupted transaction, then does its work.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::cli::{EXIT_FAILED, EXIT_LOCKED, Failure};
use crate::clock;
use crate::inventory;
use crate::renew::{self, Plan, Policy};
use crate::txn::{self, Lock, Recovery, TxnError};

/// Options shared by commands that write.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub lock_timeout: Duration,
    pub retention: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            lock_timeout: Duration::from_secs(60),
            retention: txn::DEFAULT_RETENTION,
        }
    }
}

/// Maps a transaction error to the command's failure.
pub fn txn_failure(e: TxnError) -> Failure {
    let code = if matches!(e, TxnError::Locked { .. }) {
        EXIT_LOCKED
    } else {
        EXIT_FAILED
    };
    Failure {
        code,
        message: e.to_string(),
    }
}

/// Takes the lock and completes or discards an interrupted transaction, logging what it did.
pub fn lock_and_recover(root: &Path, timeout: Duration) -> Result<Lock, Failure> {
    let lock = txn::lock(root, timeout).map_err(txn_failure)?;
    match txn::recover(root).map_err(txn_failure)? {
        Recovery::Clean => {}
        Recovery::DiscardedStaging(n) => crate::log(&format!(
            "removed {n} staging folder(s) of an interrupted run; the PKI was not touched"
        )),
        Recovery::RolledForward {
            kind,
            backup_id,
            files,
        } => crate::log(&format!(
            "completed an interrupted {kind} of {files} file(s) (backup {backup_id})"
        )),
    }
    Ok(lock)
}

/// The result of a renewal.
#[derive(Debug, Clone, Serialize)]
pub struct RenewReport {
    pub root: String,
    pub dry_run: bool,
    pub plan: Plan,
    pub backup_id: Option<String>,
    pub files_written: Vec<String>,
    pub duration_ms: u128,
}

/// Renews what `policy` selects under `root`.
pub fn renew(
    root: &Path,
    policy: &Policy,
    dry_run: bool,
    opts: &WriteOptions,
) -> Result<RenewReport, Failure> {
    let started = std::time::Instant::now();
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    let now = clock::now();
    let inv = inventory::take(root, now, policy.within);
    let plan = renew::plan(&inv, policy, now).map_err(|e| Failure::failed(e.to_string()))?;
    let mut report = RenewReport {
        root: root.display().to_string(),
        dry_run,
        plan,
        backup_id: None,
        files_written: vec![],
        duration_ms: 0,
    };
    if dry_run || report.plan.items.is_empty() {
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    let issued = renew::issue_all(root, &report.plan)
        .map_err(|e| Failure::failed(format!("{e}; nothing was changed")))?;
    renew::validate(&issued, &report.plan).map_err(|e| Failure::failed(e.to_string()))?;
    let changes = renew::changes(&issued);
    let outcome = txn::apply(root, &changes, "renew", now, opts.retention).map_err(txn_failure)?;
    report.backup_id = Some(outcome.backup_id);
    report.files_written = outcome.files;
    report.duration_ms = started.elapsed().as_millis();
    Ok(report)
}

/// Restores a backup (the newest when `id` is `None`) as a transaction of its own.
pub fn rollback(
    root: &Path,
    id: Option<&str>,
    opts: &WriteOptions,
) -> Result<(String, txn::Outcome), Failure> {
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    let id = match id {
        Some(id) => id.to_string(),
        None => txn::list_backups(root)
            .into_iter()
            .find(|b| b.kind != "rollback")
            .map(|b| b.id)
            .ok_or_else(|| {
                Failure::failed(format!(
                    "no backups under '{}'",
                    txn::state_dir(root).join("backups").display()
                ))
            })?,
    };
    let (_manifest, changes) = txn::restore_changes(root, &id).map_err(txn_failure)?;
    let outcome = txn::apply(
        root,
        &changes,
        "rollback",
        clock::now(),
        opts.retention.max(2),
    )
    .map_err(txn_failure)?;
    Ok((id, outcome))
}
