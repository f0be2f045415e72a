//! The operations behind the commands that change a node: renew, roll back, list backups.
//! Each takes the lock, completes any interrupted transaction, then does its work.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::cli::{EXIT_FAILED, EXIT_LOCKED, Failure};
use crate::clock;
use crate::inventory;
use crate::manifests::Component;
use crate::renew::{self, Plan, Policy};
use crate::restart::{self, Platform, RestartOptions, Restarted};
use crate::txn::{self, Lock, Recovery, TxnError};

/// Options shared by commands that write.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub lock_timeout: Duration,
    pub retention: usize,
    /// Who issues the new certificates (`--engine`).
    pub engine: crate::engine::Engine,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            lock_timeout: Duration::from_secs(60),
            retention: txn::DEFAULT_RETENTION,
            engine: crate::engine::Engine::Native,
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

/// Takes the lock and completes or discards an interrupted transaction, logging what it did;
/// starts again a static pod that an interrupted restart left stopped.
pub fn lock_and_recover(root: &Path, timeout: Duration) -> Result<Lock, Failure> {
    let lock = txn::lock(root, timeout).map_err(txn_failure)?;
    match crate::restart::recover(root) {
        Ok(Some(message)) => crate::log(&message),
        Ok(None) => {}
        Err(e) => {
            return Err(Failure::failed(format!(
                "recovering an interrupted restart: {e}"
            )));
        }
    }
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
    if dry_run {
        // A plan writes nothing, so it also works on a read-only node.
        crate::recover_before_reading(root)?;
        return renew_locked(root, policy, true, opts, |_| Ok(()));
    }
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    renew_locked(root, policy, dry_run, opts, |_| Ok(()))
}

/// Renews under a lock the caller holds. `before_write` sees the plan before anything is
/// written and may refuse it.
fn renew_locked(
    root: &Path,
    policy: &Policy,
    dry_run: bool,
    opts: &WriteOptions,
    before_write: impl FnOnce(&Plan) -> Result<(), Failure>,
) -> Result<RenewReport, Failure> {
    let started = std::time::Instant::now();
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
    before_write(&report.plan)?;
    let crate::engine::Output {
        mut issued,
        validity,
    } = crate::engine::issue(root, &report.plan, &opts.engine)
        .map_err(|e| Failure::failed(format!("{e}; nothing was changed")))?;
    renew::validate_with(&issued, &report.plan, validity)
        .map_err(|e| Failure::failed(e.to_string()))?;
    // Test-only: breaks a certificate after validation (CERTROTOR_FAILPOINT=foreign-ca:NAME).
    crate::foreign_ca::apply(&mut issued).map_err(Failure::failed)?;
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
    rollback_locked(root, id, opts)
}

fn rollback_locked(
    root: &Path,
    id: Option<&str>,
    opts: &WriteOptions,
) -> Result<(String, txn::Outcome), Failure> {
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

// === run --once / daemon ===

/// Options of `run` and `daemon`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub policy: Policy,
    pub dry_run: bool,
    pub write: WriteOptions,
    pub restart: RestartOptions,
}

/// What one pass did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub renew: RenewReport,
    pub platform: String,
    /// Components that read renewed files.
    pub components: Vec<Component>,
    pub restarted: Vec<Restarted>,
    /// Set when verification failed and the backup was restored.
    pub rolled_back: Option<RolledBack>,
    pub duration_ms: u128,
}

/// What an automatic rollback did.
#[derive(Debug, Clone, Serialize)]
pub struct RolledBack {
    pub failure: String,
    pub backup_id: String,
    pub restarted: Vec<Restarted>,
    /// The rollback itself failed: a person must look.
    pub error: Option<String>,
}

impl RunReport {
    /// The exit code: 0 done, 3 rolled back after a failed verification, 2 rollback failed.
    pub fn exit_code(&self) -> u8 {
        match &self.rolled_back {
            None => 0,
            Some(r) if r.error.is_none() => crate::cli::EXIT_ROLLED_BACK,
            Some(_) => EXIT_FAILED,
        }
    }
}

/// check → renew what is due → restart one at a time → verify; roll back by itself when
/// verification fails.
pub fn run_once(root: &Path, opts: &RunOptions) -> Result<RunReport, Failure> {
    let started = std::time::Instant::now();
    let _lock = lock_and_recover(root, opts.write.lock_timeout)?;
    let platform =
        restart::detect(root, &opts.restart).map_err(|e| Failure::failed(e.to_string()))?;
    // Restarts a crashed earlier pass still owes the node (its files are already renewed).
    let owed = if matches!(platform, Platform::None) {
        Pending::default()
    } else {
        read_pending(root)
    };
    if !owed.components.is_empty() {
        crate::log(&format!(
            "an earlier pass renewed files but did not finish restarting: {}",
            owed.components
                .iter()
                .map(|c| c.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Every component that will need a restart must be restartable before anything is written,
    // and the intent to restart it is recorded first, so that a crash after the files change
    // still gets the components restarted by the next pass.
    let before_write = |plan: &Plan| -> Result<(), Failure> {
        if matches!(platform, Platform::None) {
            return Ok(());
        }
        let mut components = restart::components_for(
            &plan
                .items
                .iter()
                .map(|i| i.name.clone())
                .collect::<Vec<_>>(),
        );
        restart::targets(root, &platform, &components, &opts.restart)
            .map_err(|e| Failure::failed(format!("{e}; nothing was changed")))?;
        components.extend(owed.components.iter().copied());
        components.sort();
        components.dedup();
        write_pending(
            root,
            &Pending {
                components,
                backup_id: owed.backup_id.clone(),
            },
        )
    };
    let renewed = renew_locked(root, &opts.policy, opts.dry_run, &opts.write, before_write)?;
    let names: Vec<String> = renewed.plan.items.iter().map(|i| i.name.clone()).collect();
    let mut components = if renewed.backup_id.is_some() {
        restart::components_for(&names)
    } else {
        vec![]
    };
    if !opts.dry_run {
        components.extend(owed.components.iter().copied());
    }
    components.sort();
    components.dedup();
    let backup_id = renewed
        .backup_id
        .clone()
        .or_else(|| owed.backup_id.clone())
        .unwrap_or_default();
    if renewed.backup_id.is_some() && !matches!(platform, Platform::None) {
        write_pending(
            root,
            &Pending {
                components: components.clone(),
                backup_id: Some(backup_id.clone()),
            },
        )?;
    }
    let mut report = RunReport {
        renew: renewed,
        platform: platform.name().into(),
        components: components.clone(),
        restarted: vec![],
        rolled_back: None,
        duration_ms: 0,
    };
    if components.is_empty() || matches!(platform, Platform::None) {
        if !components.is_empty() {
            crate::log(&format!(
                "platform none: restart {} so that they use the new certificates",
                components
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    let (restarted, rolled_back) = restart_verified(root, &platform, &components, &backup_id, opts);
    // Done, or rolled back to a consistent state: nothing is owed any more. A failed rollback
    // keeps the record, so that the next pass tries again.
    if rolled_back.as_ref().is_none_or(|r| r.error.is_none()) {
        clear_pending(root);
    }
    report.restarted = restarted;
    report.rolled_back = rolled_back;
    report.duration_ms = started.elapsed().as_millis();
    Ok(report)
}

/// Restarts owed to the node (`var/lib/certrotor/pending-restarts.json`).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
struct Pending {
    components: Vec<Component>,
    /// The backup to restore if a pending restart fails verification.
    backup_id: Option<String>,
}

const PENDING: &str = "pending-restarts.json";

fn read_pending(root: &Path) -> Pending {
    std::fs::read(txn::state_dir(root).join(PENDING))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_pending(root: &Path, pending: &Pending) -> Result<(), Failure> {
    let dir = txn::state_dir(root);
    let path = dir.join(PENDING);
    let tmp = dir.join(format!("{PENDING}.tmp"));
    let fail = |e: std::io::Error| {
        Failure::failed(format!(
            "cannot record the restarts to do in '{}': {e}; nothing was changed",
            path.display()
        ))
    };
    let json = serde_json::to_vec(pending).map_err(|e| Failure::failed(e.to_string()))?;
    crate::fsutil::create_dir_all_mode(&dir, 0o700).map_err(fail)?;
    let _ = std::fs::remove_file(&tmp);
    crate::fsutil::write_new(&tmp, &json, 0o600, None).map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)?;
    crate::fsutil::sync_dir(&dir).map_err(fail)
}

fn clear_pending(root: &Path) {
    let dir = txn::state_dir(root);
    if std::fs::remove_file(dir.join(PENDING)).is_ok() {
        let _ = crate::fsutil::sync_dir(&dir);
    }
}

/// Restarts `components` one at a time and verifies each; when one fails, restores
/// `backup_id`, restarts again what was restarted and the one that failed, and checks that the
/// previous certificates are served.
pub fn restart_verified(
    root: &Path,
    platform: &Platform,
    components: &[Component],
    backup_id: &str,
    opts: &RunOptions,
) -> (Vec<Restarted>, Option<RolledBack>) {
    // Probes read the renewed client certificates, so targets are built after the change.
    let outcome = restart::targets(root, platform, components, &opts.restart)
        .map_err(|e| (vec![], e))
        .and_then(|targets| restart::restart_all(root, platform, &targets, &opts.restart));
    let (done, error) = match outcome {
        Ok(done) => return (done, None),
        Err(x) => x,
    };
    crate::log(&format!(
        "verification failed: {error}; restoring the previous certificates"
    ));
    let mut rolled = RolledBack {
        failure: error.to_string(),
        backup_id: backup_id.to_string(),
        restarted: vec![],
        error: None,
    };
    if let Err(e) = rollback_locked(root, Some(backup_id), &opts.write) {
        rolled.error = Some(format!(
            "restoring backup {backup_id} failed: {}",
            e.message
        ));
        return (done, Some(rolled));
    }
    // Restart what was restarted, and the component that failed, with the old files.
    let mut again: Vec<Component> = done.iter().map(|r| r.component).collect();
    match error.component {
        Some(c) => again.push(c),
        None => again = components.to_vec(),
    }
    again.sort();
    again.dedup();
    match restart::targets(root, platform, &again, &opts.restart) {
        Err(e) => rolled.error = Some(format!("after restoring backup {backup_id}: {e}")),
        Ok(targets) => match restart::restart_all(root, platform, &targets, &opts.restart) {
            Ok(back) => {
                crate::log(&format!(
                    "rolled back to backup {backup_id}; the previous certificates are served again"
                ));
                rolled.restarted = back;
            }
            Err((back, e)) => {
                rolled.restarted = back;
                rolled.error = Some(format!("after restoring backup {backup_id}: {e}"));
            }
        },
    }
    (done, Some(rolled))
}

/// What `etcd-client import` did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub files: Vec<String>,
    pub backup_id: String,
    pub platform: String,
    pub restarted: Vec<Restarted>,
    pub rolled_back: Option<RolledBack>,
}

impl ImportReport {
    /// 0 done, 3 rolled back, 2 rollback failed.
    pub fn exit_code(&self) -> u8 {
        match &self.rolled_back {
            None => 0,
            Some(r) if r.error.is_none() => crate::cli::EXIT_ROLLED_BACK,
            Some(_) => EXIT_FAILED,
        }
    }
}

/// Installs an exported apiserver-etcd-client bundle on a control plane, then restarts
/// kube-apiserver and verifies it (rolling back the import when it does not come back).
pub fn import_etcd_client(
    root: &Path,
    bundle: &[u8],
    opts: &RunOptions,
) -> Result<ImportReport, Failure> {
    let _lock = lock_and_recover(root, opts.write.lock_timeout)?;
    let platform =
        restart::detect(root, &opts.restart).map_err(|e| Failure::failed(e.to_string()))?;
    let components = [Component::KubeApiserver];
    if !matches!(platform, Platform::None) {
        restart::targets(root, &platform, &components, &opts.restart)
            .map_err(|e| Failure::failed(format!("{e}; nothing was changed")))?;
    }
    if !matches!(platform, Platform::None) {
        let mut owed = read_pending(root);
        owed.components.push(Component::KubeApiserver);
        owed.components.sort();
        owed.components.dedup();
        write_pending(root, &owed)?;
    }
    let (files, backup_id) = crate::etcd_client::install(root, bundle, &opts.write)?;
    let mut report = ImportReport {
        files,
        backup_id: backup_id.clone(),
        platform: platform.name().into(),
        restarted: vec![],
        rolled_back: None,
    };
    if !matches!(platform, Platform::None) {
        let (restarted, rolled_back) =
            restart_verified(root, &platform, &components, &backup_id, opts);
        if rolled_back.as_ref().is_none_or(|r| r.error.is_none()) {
            // Only the apiserver restart is settled here; other owed restarts stay for `run`.
            let mut owed = read_pending(root);
            owed.components.retain(|c| *c != Component::KubeApiserver);
            if owed.components.is_empty() {
                clear_pending(root);
            } else {
                write_pending(root, &owed)?;
            }
        }
        report.restarted = restarted;
        report.rolled_back = rolled_back;
    }
    Ok(report)
}

/// The daemon: `run_once` every `interval` (± 10% jitter); after a failure, again sooner with
/// capped back-off. Stops on SIGTERM or SIGINT between passes.
pub fn daemon(root: &Path, opts: &RunOptions, interval: Duration) -> Result<u8, Failure> {
    install_stop_handler();
    let mut failures: u32 = 0;
    crate::log(&format!(
        "daemon started: root '{}', interval {}s",
        root.display(),
        interval.as_secs()
    ));
    while !stop_requested() {
        let wait = match run_once(root, opts) {
            Ok(report) => {
                let renewed = if report.renew.backup_id.is_some() {
                    report.renew.plan.items.len()
                } else {
                    0
                };
                crate::log(&format!(
                    "pass done: {renewed} renewed, {} restarted, platform {}{}",
                    report.restarted.len(),
                    report.platform,
                    report
                        .rolled_back
                        .as_ref()
                        .map(|r| format!(", ROLLED BACK: {}", r.failure))
                        .unwrap_or_default()
                ));
                if report.rolled_back.is_some() {
                    failures += 1;
                    backoff(failures, interval)
                } else {
                    failures = 0;
                    jitter(interval)
                }
            }
            Err(f) => {
                failures += 1;
                crate::log(&format!("pass failed: {}", f.message));
                backoff(failures, interval)
            }
        };
        crate::log(&format!("next pass in {}s", wait.as_secs()));
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until && !stop_requested() {
            std::thread::sleep(
                Duration::from_millis(250)
                    .min(until.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }
    crate::log("daemon stopping");
    Ok(0)
}

/// After `failures` failed passes: 1 min, 2 min, 4 min … capped at the interval.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let secs = 60u64.saturating_mul(1u64 << failures.saturating_sub(1).min(10));
    jitter(Duration::from_secs(secs).min(interval))
}

/// `d` ± 10%, so that nodes renewed together do not restart together.
fn jitter(d: Duration) -> Duration {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 2];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    let r = f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX); // 0..=1
    d.mul_f64(0.9 + 0.2 * r)
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn install_stop_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}

fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}
