//! The operations behind the commands that change a node: renew, roll back, list backups.
//! Each takes the lock, completes any interrupted transaction, then does its work.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::node::inventory;
use crate::node::manifests::Component;
use crate::renew::{self, Plan, Policy};
use crate::restart::{self, Platform, Reloaded, RestartOptions, Restarted};
use crate::sys::clock;
use crate::txn::{self, Lock, Recovery, TxnError};
use std::collections::BTreeMap;

use std::fmt;

/// Options shared by commands that write.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub lock_timeout: Duration,
    pub retention: usize,
    /// Who issues the new certificates (`--engine`).
    pub engine: crate::renew::engine::Engine,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            lock_timeout: Duration::from_secs(60),
            retention: txn::DEFAULT_RETENTION,
            engine: crate::renew::engine::Engine::Native,
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
    /// The record of restarts still owed (`pending-restarts.json`) exists but cannot be used.
    OwedRestarts(crate::sys::state::StateError),
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
            OpsError::OwedRestarts(e) => Some(e),
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
    // A read-only root (a mounted snapshot, a read-only bind) can still be inspected; say so
    // when an interrupted transaction could not be completed first.
    let writable = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(state.join("lock"));
    if let Err(e) = writable {
        let journal = state.join("journal.json").exists();
        log::warn!(
            "cannot take the lock in '{}' ({e}); reading without it{}",
            state.display(),
            if journal {
                "; an interrupted transaction is pending and the PKI may be half-renewed: run certrotor where the root is writable"
            } else {
                ""
            }
        );
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
        Err(f) => Err(f),
    }
}

/// Takes the lock and completes or discards an interrupted transaction, logging what it did;
/// starts again a static pod that an interrupted restart left stopped.
pub fn lock_and_recover(root: &Path, timeout: Duration) -> Result<Lock, OpsError> {
    let lock = txn::lock(root, timeout)?;
    match crate::restart::recover(root) {
        Ok(Some(message)) => log::warn!("{message}"),
        Ok(None) => {}
        Err(e) => return Err(OpsError::RecoverRestart(e)),
    }
    match txn::recover(root)? {
        Recovery::Clean => {}
        Recovery::DiscardedStaging(n) => log::warn!(
            "removed {n} staging folder(s) of an interrupted run; the PKI was not touched"
        ),
        Recovery::RolledForward {
            kind,
            backup_id,
            files,
        } => log::warn!("completed an interrupted {kind} of {files} file(s) (backup {backup_id})"),
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
    /// The kubelet's client and serving certificates ([`crate::node::kubelet`]).
    pub kubelet: crate::renew::kubelet::Plan,
    pub duration_ms: u128,
}

/// Renews what `policy` selects under `root`.
pub fn renew(
    root: &Path,
    policy: &Policy,
    dry_run: bool,
    opts: &WriteOptions,
) -> Result<RenewReport, OpsError> {
    if dry_run {
        // A plan writes nothing, so it also works on a read-only node.
        crate::pass::ops::recover_before_reading(root)?;
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
    before_write: impl FnOnce(&Plan) -> Result<(), OpsError>,
) -> Result<RenewReport, OpsError> {
    let started = std::time::Instant::now();
    let now = clock::now();
    let inv = inventory::take(root, now, policy.within);
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
    let mut report = RenewReport {
        root: root.display().to_string(),
        dry_run,
        plan,
        backup_id: None,
        files_written: vec![],
        kubelet,
        duration_ms: 0,
    };
    if dry_run || (report.plan.items.is_empty() && report.kubelet.is_empty()) {
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    before_write(&report.plan)?;
    let mut changes = Vec::new();
    if !report.plan.items.is_empty() {
        let crate::renew::engine::Output { issued, validity } =
            crate::renew::engine::issue(root, &report.plan, &opts.engine)
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
    // The kubelet's files join the same transaction (one backup, one rollback).
    changes.extend(
        crate::renew::kubelet::changes(root, &mut report.kubelet, now)
            .map_err(|e| OpsError::Issue(renew::IssueError(e)))?,
    );
    let outcome = txn::apply(root, &changes, "renew", now, opts.retention)?;
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
) -> Result<(String, txn::Outcome), OpsError> {
    let _lock = lock_and_recover(root, opts.lock_timeout)?;
    rollback_locked(root, id, opts)
}

fn rollback_locked(
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
        clock::now(),
        opts.retention.max(2),
    )?;
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
    /// `--cluster`: coordinate restarts with the other nodes through etcd.
    pub cluster: crate::cluster::ClusterOptions,
}

/// What one pass did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub renew: RenewReport,
    pub platform: String,
    /// Components that read renewed files.
    pub components: Vec<Component>,
    /// Components that served their renewed files without a restart (see `reload`).
    pub reloaded: Vec<Reloaded>,
    /// Components restarted, each with its reason.
    pub restarted: Vec<Restarted>,
    /// Other static pods that mount a renewed file (from their manifests), and why they need a
    /// restart.
    pub other_consumers: Vec<crate::node::manifests::Consumer>,
    /// Those restarted and healthy again.
    pub restarted_pods: Vec<restart::RestartedPod>,
    /// Those that could not be restarted or did not come back healthy: a person must look.
    pub pod_errors: Vec<String>,
    /// Of those, the pods that stay owed to the next pass (`pending-restarts.json`): their
    /// restart was attempted and failed, so the next pass restarts them again.
    pub owed_pods: Vec<String>,
    /// Set when verification failed and the backup was restored.
    pub rolled_back: Option<RolledBack>,
    /// Cluster mode: the lock, the gates and what was waited for.
    pub cluster: Option<crate::cluster::ClusterReport>,
    /// External etcd: the published apiserver-etcd-client pair this pass installed.
    pub import: Option<ImportReport>,
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

/// check → renew what is due → restart one at a time → verify; roll back by itself when
/// verification fails.
pub fn run_once(root: &Path, opts: &RunOptions) -> Result<RunReport, OpsError> {
    let started = std::time::Instant::now();
    let _lock = lock_and_recover(root, opts.write.lock_timeout)?;
    let platform = restart::detect(root, &opts.restart).map_err(OpsError::Platform)?;
    // Cluster mode (cluster.rs): connect; on an external-etcd control plane, install the pair
    // the etcd nodes published, restarting kube-apiserver under the cluster lock.
    let mut cluster_report = None;
    let session =
        crate::cluster::start_for_pass(root, &platform, &opts.cluster, &mut cluster_report);
    let imported = match &session {
        Some(s) if !opts.dry_run => import_published(root, &platform, s, opts, &mut cluster_report),
        _ => None,
    };
    // Restarts a crashed earlier pass still owes the node (its files are already renewed).
    let owed = if matches!(platform, Platform::None) {
        Pending::default()
    } else {
        read_pending(root)?
    };
    if !owed.components.is_empty() || !owed.pods.is_empty() {
        log::warn!(
            "an earlier pass renewed files but did not finish restarting: {}",
            owed.components
                .iter()
                .map(|c| c.name())
                .chain(owed.pods.iter().map(|p| p.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // Every component that will need a restart must be restartable before anything is written,
    // and the intent to restart it is recorded first, so that a crash after the files change
    // still gets the components restarted by the next pass.
    let before_write = |plan: &Plan| -> Result<(), OpsError> {
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
            .map_err(OpsError::NotRestartable)?;
        components.extend(owed.components.iter().copied());
        components.sort();
        components.dedup();
        // The other static pods that mount a file about to be renewed (kube-vip and admin.conf)
        // are owed a restart too; narrowed after the renewal to those that mount a file written.
        let files: Vec<String> = plan
            .items
            .iter()
            .flat_map(|i| std::iter::once(i.path.clone()).chain(i.key_path.clone()))
            .collect();
        let pods = owed_pods(&consumers_of(root, &platform, &files), &owed.pods);
        write_pending(
            root,
            &Pending {
                components,
                pods,
                backup_id: owed.backup_id.clone(),
                ..Pending::default()
            },
        )
    };
    let renewed = renew_locked(root, &opts.policy, opts.dry_run, &opts.write, before_write)?;
    // External etcd, on an etcd node: publish the renewed apiserver-etcd-client pair.
    if let Some(s) = session.as_ref().filter(|_| !opts.dry_run) {
        match crate::cluster::publish_if_due(s, root, opts.policy.within) {
            Ok(published) => {
                if published.is_some() {
                    cluster_report.get_or_insert_with(Default::default).pair = published;
                }
            }
            Err(e) => {
                log::warn!("cluster mode: publishing apiserver-etcd-client: {e}");
                cluster_report.get_or_insert_with(Default::default).error = Some(e.0);
            }
        }
    }
    let names: Vec<String> = renewed.plan.items.iter().map(|i| i.name.clone()).collect();
    // Consumers from the manifests: static pods other than the four components that mount a
    // renewed file (kube-vip mounts admin.conf as a single file).
    let other_consumers = consumers_of(root, &platform, &renewed.files_written);
    for c in &other_consumers {
        log::warn!("{}", c.reason);
    }
    // With the pods an interrupted pass still owes a restart.
    let pods = if opts.dry_run {
        vec![]
    } else {
        owed_pods(&other_consumers, &owed.pods)
    };
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
                pods: pods.clone(),
                backup_id: Some(backup_id.clone()),
                ..Pending::default()
            },
        )?;
    }
    // Live reload (reload.rs): a component whose renewed files all reload by themselves is
    // waited for until it serves them; the others, and one that did not reload within the
    // bound, are restarted, each with its reason.
    let mut reasons = BTreeMap::new();
    let mut reloaded = vec![];
    let mut to_restart = vec![];
    if !matches!(platform, Platform::None) {
        for &c in &components {
            let action = if owed.components.contains(&c) {
                crate::restart::reload::Action::Restart {
                    because: "an earlier pass renewed its files and did not finish restarting it"
                        .into(),
                }
            } else {
                crate::restart::reload::decide(c, &names, opts.restart.mode)
            };
            let reason = match action {
                crate::restart::reload::Action::Restart { because } => because,
                crate::restart::reload::Action::WaitLive => {
                    match restart::targets(root, &platform, &[c], &opts.restart) {
                        Ok(t) => match t
                            .first()
                            .and_then(|t| restart::wait_reloaded(root, t, &opts.restart))
                        {
                            Some(r) => {
                                reloaded.push(r);
                                continue;
                            }
                            None => format!(
                                "it did not serve its renewed certificate within {} s",
                                opts.restart.reload_timeout.as_secs()
                            ),
                        },
                        Err(e) => format!("it could not be probed for a live reload: {e}"),
                    }
                }
            };
            reasons.insert(c, reason);
            to_restart.push(c);
        }
        if to_restart != components {
            write_pending(
                root,
                &Pending {
                    components: to_restart.clone(),
                    pods: pods.clone(),
                    backup_id: Some(backup_id.clone()),
                    ..Pending::default()
                },
            )?;
        }
    }
    let mut report = RunReport {
        renew: renewed,
        platform: platform.name().into(),
        components: components.clone(),
        reloaded,
        other_consumers,
        restarted_pods: vec![],
        pod_errors: vec![],
        owed_pods: vec![],
        restarted: vec![],
        rolled_back: None,
        cluster: cluster_report,
        import: imported,
        duration_ms: 0,
    };
    if (components.is_empty() && pods.is_empty()) || matches!(platform, Platform::None) {
        if !components.is_empty() {
            log::warn!(
                "platform none: restart {} so that they use the new certificates",
                components
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    // One restart per consumer pod, even when it mounts several renewed files.
    let mut pods_to_restart: Vec<crate::node::manifests::Consumer> = Vec::new();
    for c in &report.other_consumers {
        match pods_to_restart.iter_mut().find(|p| p.pod == c.pod) {
            Some(p) => {
                p.file = format!("{}, {}", p.file, c.file);
                p.reason = format!("{}; {}", p.reason, c.reason);
            }
            None => pods_to_restart.push(c.clone()),
        }
    }
    for pod in &owed.pods {
        if pods.contains(pod) && !pods_to_restart.iter().any(|p| &p.pod == pod) {
            pods_to_restart.push(crate::node::manifests::Consumer {
                pod: pod.clone(),
                file: String::new(),
                single_file: false,
                reason: format!(
                    "an earlier pass renewed a file that static pod '{pod}' mounts and did not \
                     finish restarting it"
                ),
            });
        }
    }
    if to_restart.is_empty() && pods_to_restart.is_empty() {
        // Everything reloaded live: no restart, so no cluster lock either.
        clear_pending(root);
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    }
    let components = to_restart;
    // Cluster mode: one node at a time restarts, and only when the gates pass; else the
    // restarts stay owed to the next pass. A new session: the client pair may just be renewed
    // (the old one may have expired); if etcd refuses the new pair while the session opened
    // before the renewal still reaches it, the old one holds the lock and checks the gates, and
    // verification finds what is wrong with the new pair.
    let renewed_session =
        crate::cluster::start_for_pass(root, &platform, &opts.cluster, &mut report.cluster);
    let session = crate::cluster::prefer_reachable(renewed_session, session);
    let Ok(_cluster_lock) = crate::cluster::before_restart(
        root,
        session.as_ref(),
        &components,
        &opts.cluster,
        &mut report.cluster,
    ) else {
        report.duration_ms = started.elapsed().as_millis();
        return Ok(report);
    };
    let (restarted, rolled_back) =
        restart_verified(root, &platform, &components, &reasons, &backup_id, opts);
    // Then the other consumers, one at a time, each verified by its health.
    if rolled_back.is_none() {
        // Test-only: a crash after the renewal, before the consumers' restarts.
        txn::failpoint("before-consumer-restarts");
        for c in &pods_to_restart {
            match restart::restart_pod(root, &platform, c, &opts.restart) {
                Ok(r) => report.restarted_pods.push(r),
                Err(e) => {
                    log::error!("{e}");
                    if e.owed {
                        report.owed_pods.push(c.pod.clone());
                    }
                    report.pod_errors.push(e.to_string());
                }
            }
        }
    }
    if let (Some(g), Some(c)) = (&_cluster_lock, report.cluster.as_mut()) {
        c.lock_lost = g.lost();
    }
    // Done, or rolled back to a consistent state: nothing is owed any more, but for the pods
    // whose restart failed (stopped, started or unhealthy): the next pass restarts them again.
    // A failed rollback keeps the whole record, so that the next pass tries again.
    if rolled_back.as_ref().is_none_or(|r| r.error.is_none()) {
        if report.owed_pods.is_empty() {
            clear_pending(root);
        } else {
            let still = Pending {
                version: 0,
                components: vec![],
                pods: report.owed_pods.clone(),
                backup_id: None,
            };
            if let Err(e) = write_pending(root, &still) {
                // The pods are still reported (and the pass fails): a person must look.
                log::error!("{e}");
                report.pod_errors.push(e.to_string());
            }
        }
    }
    report.restarted = restarted;
    report.rolled_back = rolled_back;
    report.duration_ms = started.elapsed().as_millis();
    Ok(report)
}

/// The static pods other than the four components that mount one of `files` (paths relative
/// to `root`), from their manifests; none when the pods cannot be listed (a warning).
fn consumers_of(
    root: &Path,
    platform: &Platform,
    files: &[String],
) -> Vec<crate::node::manifests::Consumer> {
    if files.is_empty() || matches!(platform, Platform::None) {
        return vec![];
    }
    match restart::pods(platform) {
        Ok(pods) => crate::node::manifests::other_consumers(root, &pods, files),
        Err(e) => {
            log::warn!("cannot list the static pods that mount renewed files: {e}");
            vec![]
        }
    }
}

/// The pods of `consumers` and those already `owed`, sorted, each once.
fn owed_pods(consumers: &[crate::node::manifests::Consumer], owed: &[String]) -> Vec<String> {
    let mut pods: Vec<String> = consumers
        .iter()
        .map(|c| c.pod.clone())
        .chain(owed.iter().cloned())
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

/// Restarts owed to the node (`var/lib/certrotor/pending-restarts.json`).
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
struct Pending {
    #[serde(default)]
    version: u32,
    components: Vec<Component>,
    /// Other static pods (kube-vip) that mount a renewed file (version 2).
    #[serde(default)]
    pods: Vec<String>,
    /// The backup to restore if a pending restart fails verification.
    backup_id: Option<String>,
}

const PENDING: &str = "pending-restarts.json";

/// The owed restarts; none when the file does not exist. A file that exists but cannot be read,
/// is of an unknown version or names an impossible backup stops the pass: dropping it would
/// leave a renewed component on its old certificate.
fn read_pending(root: &Path) -> Result<Pending, OpsError> {
    use crate::sys::state::{self, Kind, StateError};
    let path = txn::state_dir(root).join(PENDING);
    let pending = match state::read::<Pending>(Kind::OwedRestarts, &path) {
        Ok(None) => return Ok(Pending::default()),
        Ok(Some((_, p))) => p,
        Err(e) => return Err(OpsError::OwedRestarts(e)),
    };
    if let Some(id) = &pending.backup_id
        && let Err(d) = state::check_name(id)
    {
        let e = StateError::entry(Kind::OwedRestarts, &path, format!("backup_id {id}"), d);
        return Err(OpsError::OwedRestarts(e));
    }
    for pod in &pending.pods {
        if let Err(d) = state::check_name(pod) {
            let e = StateError::entry(Kind::OwedRestarts, &path, format!("pods {pod}"), d);
            return Err(OpsError::OwedRestarts(e));
        }
    }
    Ok(pending)
}

/// The restarts owed to the node (components, other static pods) and the backup they would
/// roll back to (`status`).
pub fn owed_restarts(root: &Path) -> Result<OwedRestarts, OpsError> {
    let p = read_pending(root)?;
    Ok(OwedRestarts {
        components: p.components,
        pods: p.pods,
        backup_id: p.backup_id,
    })
}

/// What [`owed_restarts`] returns.
#[derive(Debug, Clone, Default)]
pub struct OwedRestarts {
    pub components: Vec<Component>,
    /// Other static pods (kube-vip) that mount a renewed file.
    pub pods: Vec<String>,
    pub backup_id: Option<String>,
}

fn write_pending(root: &Path, pending: &Pending) -> Result<(), OpsError> {
    let dir = txn::state_dir(root);
    let path = dir.join(PENDING);
    let fail = |source: std::io::Error| OpsError::Pending {
        path: path.display().to_string(),
        source,
    };
    let pending = Pending {
        version: crate::sys::state::Kind::OwedRestarts.current(),
        ..pending.clone()
    };
    crate::sys::fsutil::create_dir_all_mode(&dir, 0o700).map_err(fail)?;
    crate::sys::state::write(&path, &pending).map_err(fail)
}

fn clear_pending(root: &Path) {
    let _ = crate::sys::state::remove(&txn::state_dir(root).join(PENDING));
}

/// Restarts `components` one at a time and verifies each; when one fails, restores
/// `backup_id`, restarts again what was restarted and the one that failed, and checks that the
/// previous certificates are served.
pub fn restart_verified(
    root: &Path,
    platform: &Platform,
    components: &[Component],
    reasons: &BTreeMap<Component, String>,
    backup_id: &str,
    opts: &RunOptions,
) -> (Vec<Restarted>, Option<RolledBack>) {
    // Probes read the renewed client certificates, so targets are built after the change.
    let outcome = restart::targets(root, platform, components, &opts.restart)
        .map(|mut targets| {
            for t in &mut targets {
                if let Some(r) = reasons.get(&t.component) {
                    t.reason = r.clone();
                }
            }
            targets
        })
        .map_err(|e| (vec![], e))
        .and_then(|targets| restart::restart_all(root, platform, &targets, &opts.restart));
    let (done, error) = match outcome {
        Ok(done) => return (done, None),
        Err(x) => x,
    };
    log::warn!("verification failed: {error}; restoring the previous certificates");
    let mut rolled = RolledBack {
        failure: error.to_string(),
        backup_id: backup_id.to_string(),
        restarted: vec![],
        error: None,
    };
    if let Err(e) = rollback_locked(root, Some(backup_id), &opts.write) {
        rolled.error = Some(format!("restoring backup {backup_id} failed: {e}"));
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
    let targets = restart::targets(root, platform, &again, &opts.restart).map(|mut targets| {
        for t in &mut targets {
            t.reason = format!("backup {backup_id} was restored");
        }
        targets
    });
    match targets {
        Err(e) => rolled.error = Some(format!("after restoring backup {backup_id}: {e}")),
        Ok(targets) => match restart::restart_all(root, platform, &targets, &opts.restart) {
            Ok(back) => {
                log::warn!(
                    "rolled back to backup {backup_id}; the previous certificates are served again"
                );
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

/// Installs an exported apiserver-etcd-client bundle on a control plane, then restarts
/// kube-apiserver and verifies it (rolling back the import when it does not come back).
pub fn import_etcd_client(
    root: &Path,
    bundle: &[u8],
    opts: &RunOptions,
) -> Result<ImportReport, OpsError> {
    let _lock = lock_and_recover(root, opts.write.lock_timeout)?;
    let platform = restart::detect(root, &opts.restart).map_err(OpsError::Platform)?;
    import_locked(root, bundle, &platform, opts, None, &mut None)
}

/// Installs the pair published through etcd (cluster mode, external etcd); a refused pair is
/// reported in `cluster` and nothing is installed.
fn import_published(
    root: &Path,
    platform: &Platform,
    session: &crate::cluster::Session,
    opts: &RunOptions,
    cluster: &mut Option<crate::cluster::ClusterReport>,
) -> Option<ImportReport> {
    let refused = |cluster: &mut Option<crate::cluster::ClusterReport>, m: String| {
        let m = format!("the apiserver-etcd-client pair published through etcd was refused: {m}");
        log::warn!("{}", m);
        cluster.get_or_insert_with(Default::default).pair_error = Some(m);
    };
    let mut bundle = match crate::cluster::published_bundle(session, root) {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(e) => {
            refused(cluster, e.0);
            return None;
        }
    };
    let result = import_locked(root, &bundle, platform, opts, Some(session), cluster);
    zeroize::Zeroize::zeroize(&mut bundle);
    match result {
        Ok(r) => {
            cluster.get_or_insert_with(Default::default).pair = Some(format!(
                "installed the pair published through etcd (backup {})",
                r.backup_id
            ));
            Some(r)
        }
        Err(e) => {
            refused(cluster, e.to_string());
            None
        }
    }
}

/// The import under the node lock the caller holds; kube-apiserver restarts under the cluster
/// lock when `session` is given.
fn import_locked(
    root: &Path,
    bundle: &[u8],
    platform: &Platform,
    opts: &RunOptions,
    session: Option<&crate::cluster::Session>,
    cluster: &mut Option<crate::cluster::ClusterReport>,
) -> Result<ImportReport, OpsError> {
    let platform = platform.clone();
    let components = [Component::KubeApiserver];
    if !matches!(platform, Platform::None) {
        restart::targets(root, &platform, &components, &opts.restart)
            .map_err(OpsError::NotRestartable)?;
    }
    if !matches!(platform, Platform::None) {
        let mut owed = read_pending(root)?;
        owed.components.push(Component::KubeApiserver);
        owed.components.sort();
        owed.components.dedup();
        write_pending(root, &owed)?;
    }
    let (files, backup_id) = crate::pass::etcd_client::install(root, bundle, &opts.write)
        .map_err(|e| OpsError::Import(Box::new(e)))?;
    let mut report = ImportReport {
        files,
        backup_id: backup_id.clone(),
        platform: platform.name().into(),
        restarted: vec![],
        rolled_back: None,
    };
    if !matches!(platform, Platform::None) {
        let Ok(_cluster_lock) =
            crate::cluster::before_restart(root, session, &components, &opts.cluster, cluster)
        else {
            // The restart stays owed to the next pass.
            return Ok(report);
        };
        let reasons = BTreeMap::from([(
            Component::KubeApiserver,
            "an imported apiserver-etcd-client pair is verified by a restart (import does not wait \
             for a live reload)"
                .to_string(),
        )]);
        let (restarted, rolled_back) =
            restart_verified(root, &platform, &components, &reasons, &backup_id, opts);
        if rolled_back.as_ref().is_none_or(|r| r.error.is_none()) {
            // Only the apiserver restart is settled here; other owed restarts stay for `run`.
            let mut owed = read_pending(root)?;
            owed.components.retain(|c| *c != Component::KubeApiserver);
            if owed.components.is_empty() && owed.pods.is_empty() {
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
pub fn daemon(root: &Path, opts: &RunOptions, interval: Duration) {
    daemon_observed(root, opts, interval, &mut |_, _| {});
}

/// [`daemon`], handing each pass's result and duration to `observe` (the metrics counters).
pub fn daemon_observed(
    root: &Path,
    opts: &RunOptions,
    interval: Duration,
    observe: &mut dyn FnMut(&Result<RunReport, OpsError>, Duration),
) {
    install_stop_handler();
    let mut failures: u32 = 0;
    log::info!(
        "daemon started: root '{}', interval {}s",
        root.display(),
        interval.as_secs()
    );
    while !stop_requested() {
        let started = std::time::Instant::now();
        let result = crate::pass::record::run_pass(root, opts, Some(interval));
        observe(&result, started.elapsed());
        let wait = match result {
            Ok(report) => {
                let renewed = if report.renew.backup_id.is_some() {
                    report.renew.plan.items.len()
                } else {
                    0
                };
                log::info!(
                    "pass done: {renewed} renewed, {} restarted, {} reloaded live, platform {}{}{}",
                    report.restarted.len(),
                    report.reloaded.len(),
                    report.platform,
                    report
                        .cluster
                        .as_ref()
                        .map(|c| format!(
                            ", cluster lock {} after {} ms{}",
                            c.lock,
                            c.waited_ms,
                            if c.deferred { ", restarts put off" } else { "" }
                        ))
                        .unwrap_or_default(),
                    report
                        .rolled_back
                        .as_ref()
                        .map(|r| format!(", ROLLED BACK: {}", r.failure))
                        .unwrap_or_default()
                );
                if report.rolled_back.is_some()
                    || report.cluster.as_ref().is_some_and(|c| c.deferred)
                {
                    failures += 1;
                    backoff(failures, interval)
                } else {
                    failures = 0;
                    jitter(interval)
                }
            }
            Err(f) => {
                failures += 1;
                log::error!("pass failed: {f}");
                backoff(failures, interval)
            }
        };
        log::info!("next pass in {}s", wait.as_secs());
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until && !stop_requested() {
            std::thread::sleep(
                Duration::from_millis(250)
                    .min(until.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }
    log::info!("daemon stopping");
}

/// After `failures` failed passes: 1 min, 2 min, 4 min … capped at the interval.
pub(crate) fn backoff(failures: u32, interval: Duration) -> Duration {
    let secs = 60u64.saturating_mul(1u64 << failures.saturating_sub(1).min(10));
    jitter(Duration::from_secs(secs).min(interval))
}

/// `d` ± 10%, so that nodes renewed together do not restart together.
pub(crate) fn jitter(d: Duration) -> Duration {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 2];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    let r = f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX); // 0..=1
    d.mul_f64(0.9 + 0.2 * r)
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn install_stop_handler() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    // A handler rather than a blocked set and sigwait: a blocked mask would be inherited by
    // every command certrotor runs (ctr). nix has no safe way to install a handler.
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        #[allow(unsafe_code)]
        let _ = unsafe { sigaction(signal, &action) };
    }
}

fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}
