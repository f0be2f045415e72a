//! One pass of `run --once` and the daemon, top to bottom: check, renew what is due in one
//! transaction, let each component reload or restart it one at a time, verify what is served,
//! and roll back by itself when verification fails; last, on every path, make sure every static
//! pod the pass stopped runs again ([`crate::pass::ensure`]). Every step is a method of [`Pass`]
//! in the order [`run_once`] calls them; the pass's state between steps is persisted by
//! [`crate::pass::state`] (planned → committing → written → restarting → done), so that a crash
//! at any step is finished by the next command.
//!
//! What the steps call lives beside this file, in the order the pass needs it:
//! [`crate::pass::live_reload`] (which components reload by themselves, which restart),
//! [`crate::pass::leaders_last`] (cluster mode: this node's restart record, leaders last),
//! [`crate::pass::rollback`] (restarts verified one at a time, and the automatic rollback),
//! [`crate::pass::pods`] (the other static pods that mount a renewed file), and
//! [`crate::pass::run_report`] (what the pass reports).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use crate::cluster::roles::RecordGuard;
use crate::cluster::{self, ClusterOptions, ClusterReport, Session};
use crate::node::Node;
use crate::node::manifests::{Component, Consumer};
use crate::pass::ensure::{self, Ensure};
use crate::pass::import::{self, ImportReport};
use crate::pass::ops::{self, OpsError, Recovered, RenewReport, WriteOptions};
use crate::pass::pods::consumers_of;
use crate::pass::rollback::{restart_after_rollback, restart_verified_after};
use crate::pass::state::{PassState, Restarts};
use crate::renew::{Plan, Policy};
use crate::restart::reload::ComponentVersion;
use crate::restart::{self, Platform, Reloaded, RestartOptions, Restarted};
use crate::txn;

/// Options of `run` and `daemon`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub policy: Policy,
    pub dry_run: bool,
    pub write: WriteOptions,
    pub restart: RestartOptions,
    /// `--cluster`: coordinate restarts with the other nodes through etcd.
    pub cluster: ClusterOptions,
}

pub use crate::pass::rollback::{RolledBack, restart_verified};
pub use crate::pass::run_report::RunReport;

/// check → renew what is due → restart one at a time → verify; roll back by itself when
/// verification fails.
pub fn run_once(root: &Path, opts: &RunOptions) -> Result<RunReport, OpsError> {
    let started = Instant::now();
    let write = &opts.write;
    let (_lock, recovered) =
        ops::lock_and_recover_with(root, write.lock_timeout, Some(&opts.restart))?;
    let mut pass = Pass::begin(root, opts, recovered)?;
    let steps = pass.steps();
    // On every path: no pod this pass stopped stays stopped while certrotor runs.
    pass.ensure_enabled();
    steps?;
    Ok(pass.report(started))
}

/// A pass in progress: what the steps share.
pub(super) struct Pass<'a> {
    pub(super) root: &'a Path,
    /// The node, found once the recovery before the pass is done (it may have put files back).
    /// The pass's own writes (an installed pair, the renewal) replace files the node already
    /// has: what detection sees stays the same.
    pub(super) node: Node,
    pub(super) opts: &'a RunOptions,
    pub(super) platform: Platform,
    /// Cluster mode: the session opened before the renewal (its client pair may be renewed).
    pub(super) session: Option<Session>,
    /// Cluster mode: this node's restart record in etcd, deleted when dropped.
    pub(super) restart_record: Option<RecordGuard>,
    pub(super) cluster: Option<ClusterReport>,
    pub(super) import: Option<ImportReport>,
    /// The persisted state; untouched on platform `none`, which restarts nothing.
    pub(super) state: PassState,
    /// What earlier passes owed when this one began.
    pub(super) owed_before: Restarts,
    pub(super) renewed: RenewReport,
    /// Components whose files changed or whose restart was owed, and the other static pods.
    pub(super) work: Restarts,
    pub(super) other_consumers: Vec<Consumer>,
    pub(super) reloaded: Vec<Reloaded>,
    pub(super) versions: Vec<ComponentVersion>,
    pub(super) reload_notes: Vec<String>,
    /// Verified without a restart: started again by recovery on the renewed files.
    pub(super) recovered_restarts: Vec<Restarted>,
    pub(super) to_restart: Vec<Component>,
    pub(super) reasons: BTreeMap<Component, String>,
    pub(super) restarted: Vec<Restarted>,
    pub(super) restarted_pods: Vec<restart::RestartedPod>,
    pub(super) pod_errors: Vec<String>,
    pub(super) owed_pods: Vec<String>,
    pub(super) rolled_back: Option<RolledBack>,
    /// What recovery did before the pass began.
    pub(super) recovered: Recovered,
    /// What the last step did.
    pub(super) ensured: Ensure,
}

impl<'a> Pass<'a> {
    /// The platform, the cluster session, and what earlier passes still owe.
    fn begin(
        root: &'a Path,
        opts: &'a RunOptions,
        recovered: Recovered,
    ) -> Result<Pass<'a>, OpsError> {
        let platform = restart::detect(root, &opts.restart).map_err(OpsError::Platform)?;
        if let Platform::Bottlerocket { client, bound } = &platform {
            let mut stats = restart::api::ApiStats::default();
            restart::api::require_static_pods(client, Instant::now() + *bound, &mut stats)
                .map_err(OpsError::Platform)?;
        }
        let node = Node::discover(root);
        let mut cluster = None;
        let session = cluster::start_for_pass(&node, &platform, &opts.cluster, &mut cluster);
        let state = match platform {
            Platform::None => PassState::default(),
            _ => PassState::load(root)?,
        };
        let owed_before = state.owed.clone();
        if !owed_before.is_empty() {
            let names: Vec<&str> = owed_before.components.iter().map(|c| c.name()).collect();
            let pods = owed_before.pods.iter().map(String::as_str);
            log::warn!(
                "restarts owed for files already written (by a CA rotation's stage, which this \
                 pass completes, or by an earlier pass that did not finish): {}",
                names.into_iter().chain(pods).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(Pass {
            root,
            node,
            opts,
            platform,
            session,
            restart_record: None,
            cluster,
            import: None,
            state,
            owed_before,
            renewed: RenewReport::empty(root, opts.dry_run),
            work: Restarts::default(),
            other_consumers: vec![],
            reloaded: vec![],
            versions: vec![],
            reload_notes: vec![],
            recovered_restarts: vec![],
            to_restart: vec![],
            reasons: BTreeMap::new(),
            restarted: vec![],
            restarted_pods: vec![],
            pod_errors: vec![],
            owed_pods: vec![],
            rolled_back: None,
            recovered,
            ensured: Ensure::default(),
        })
    }

    /// The steps, in order: install a published pair, renew, publish, decide and make the
    /// restarts.
    fn steps(&mut self) -> Result<(), OpsError> {
        self.import_published();
        self.renew()?;
        self.publish_pair();
        self.decide_restarts()?;
        self.restart()
    }

    fn restarts(&self) -> bool {
        !matches!(self.platform, Platform::None)
    }

    /// Cluster mode, on an external-etcd control plane: installs the pair the etcd nodes
    /// published, restarting kube-apiserver under the cluster lock.
    fn import_published(&mut self) {
        if self.opts.dry_run {
            return;
        }
        if let Some(session) = &self.session {
            self.import = import::published(
                &self.node,
                &self.platform,
                session,
                self.opts,
                &mut self.state,
                &mut self.cluster,
            );
        }
    }

    /// Plans the renewal; records the restarts it will owe before any file changes (every
    /// component that will need one must be restartable); writes it in one transaction.
    fn renew(&mut self) -> Result<(), OpsError> {
        let now = self.opts.write.clock.now();
        let mut report = ops::plan_renewal(&self.node, &self.opts.policy, self.opts.dry_run, now)?;
        if !self.opts.dry_run && report.has_work() {
            if self.restarts() {
                self.record_plan(&report.plan)?;
            }
            let (root, record) = (self.root, self.restarts());
            let state = &mut self.state;
            let written = ops::write_renewal(root, &mut report, &self.opts.write, now, &mut |id| {
                if record {
                    state.committing(root, id)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = written {
                if record {
                    let _ = self.state.unplanned(root);
                }
                return Err(e);
            }
            if let (true, Some(id)) = (record, report.backup_id.as_deref()) {
                self.state.written(root, id)?;
            }
        }
        self.renewed = report;
        Ok(())
    }

    /// The restarts the plan will make due, recorded (stage `planned`) before anything is
    /// written; refused when a component that needs one cannot be restarted.
    fn record_plan(&mut self, plan: &Plan) -> Result<(), OpsError> {
        let names: Vec<String> = plan.items.iter().map(|i| i.name.clone()).collect();
        let components = restart::components_for(&names);
        restart::targets(&self.node, &self.platform, &components, &self.opts.restart)
            .map_err(OpsError::NotRestartable)?;
        // The other static pods that mount a file about to be renewed (kube-vip and
        // admin.conf); narrowed after the renewal to those that mount a file written.
        let files: Vec<String> = plan
            .items
            .iter()
            .flat_map(|i| std::iter::once(i.path.clone()).chain(i.key_path.clone()))
            .collect();
        let pods: Vec<String> = consumers_of(self.root, &self.platform, &files)
            .into_iter()
            .map(|c| c.pod)
            .collect();
        // Before anything is written, so that a node holding a leader Lease sees this one.
        self.publish_record(&components, &pods);
        self.state.plan(self.root, Restarts { components, pods })
    }

    /// External etcd, on an etcd node: publishes the renewed apiserver-etcd-client pair.
    fn publish_pair(&mut self) {
        let Some(s) = self.session.as_ref().filter(|_| !self.opts.dry_run) else {
            return;
        };
        match cluster::publish_if_due(s, &self.node, self.opts.policy.within) {
            Ok(None) => {}
            Ok(published) => self.cluster.get_or_insert_with(Default::default).pair = published,
            Err(e) => {
                log::warn!("cluster mode: publishing apiserver-etcd-client: {e}");
                self.cluster.get_or_insert_with(Default::default).error = Some(e.0);
            }
        }
    }

    /// What the renewal (and earlier passes) make due: the components that read a renewed file,
    /// the other static pods that mount one; then which components reload by themselves.
    fn decide_restarts(&mut self) -> Result<(), OpsError> {
        self.other_consumers = consumers_of(self.root, &self.platform, &self.renewed.files_written);
        for c in &self.other_consumers {
            log::warn!("{}", c.reason);
        }
        let renewed = self.renewed.backup_id.is_some();
        let names: Vec<String> = self
            .renewed
            .plan
            .items
            .iter()
            .map(|i| i.name.clone())
            .collect();
        let mut work = Restarts::default();
        if renewed {
            work.components = restart::components_for(&names);
        }
        if !self.opts.dry_run {
            work.components
                .extend(self.owed_before.components.iter().copied());
            work.pods = self.other_consumers.iter().map(|c| c.pod.clone()).collect();
            work.pods.extend(self.owed_before.pods.iter().cloned());
        }
        work.components.sort();
        work.components.dedup();
        work.pods.sort();
        work.pods.dedup();
        self.work = work;
        if !self.restarts() || self.opts.dry_run {
            return Ok(());
        }
        if renewed {
            self.state.owe(self.root, self.work.clone())?;
        }
        self.decide_reloads(&names);
        if self.to_restart != self.work.components || !self.state.started_by_recovery.is_empty() {
            self.state.started_by_recovery.clear();
            let owed = Restarts {
                components: self.to_restart.clone(),
                pods: self.work.pods.clone(),
            };
            self.state.owe(self.root, owed)?;
        }
        Ok(())
    }

    /// Restarts what is due, under the cluster lock in cluster mode: the components one at a
    /// time, verified (rolled back when one fails), then the other static pods.
    fn restart(&mut self) -> Result<(), OpsError> {
        if self.work.is_empty() || !self.restarts() {
            if !self.work.components.is_empty() {
                let names: Vec<&str> = self.work.components.iter().map(|c| c.name()).collect();
                log::warn!(
                    "platform none: restart {} so that they use the new certificates",
                    names.join(", ")
                );
            }
            return Ok(());
        }
        let pods = self.pods_to_restart();
        if self.to_restart.is_empty() && pods.is_empty() {
            // Everything reloaded live: no restart, so no cluster lock either.
            self.restart_record = None;
            return self.state.clear(self.root);
        }
        let pod_names: Vec<String> = pods.iter().map(|p| p.pod.clone()).collect();
        self.publish_record(&self.to_restart.clone(), &pod_names);
        let Ok(mut cluster_lock) = self.cluster_lock() else {
            // The restarts stay owed to the next pass.
            self.restart_record = None;
            return Ok(());
        };
        self.state.restarting(self.root)?;
        let backup_id = self.backup_id();
        let (first, last) = self.leaders_split(cluster_lock.is_some(), &pod_names);
        let (mut restarted, mut rolled_back) = self.restart_components(&first, &[], &backup_id);
        let leader = cluster_lock.is_some() && !self.held(&last, &pod_names).is_empty();
        if rolled_back.is_none() && leader {
            if !self.leaders_last(&mut cluster_lock, &last, &pod_names) {
                // The lock could not be taken again: what remains stays owed.
                self.restart_record = None;
                self.restarted = restarted;
                let owed = Restarts {
                    components: last,
                    pods: pod_names,
                };
                return self.state.owe(self.root, owed);
            }
            let (more, rb) = self.restart_components(&last, &restarted, &backup_id);
            restarted.extend(more);
            rolled_back = rb;
        }
        let mut record = self.state.recorder(self.root);
        if let Some(rolled) = rolled_back.as_mut() {
            let names: Vec<String> = match self.renewed.backup_id {
                Some(_) => self
                    .renewed
                    .plan
                    .items
                    .iter()
                    .map(|i| i.name.clone())
                    .collect(),
                None => vec![],
            };
            restart_after_rollback(
                &self.node,
                &self.platform,
                (&names, &self.versions),
                self.opts,
                rolled,
                &mut record,
            );
        }
        if rolled_back.is_none() {
            // Test-only: a crash after the renewal, before the consumers' restarts.
            txn::failpoint("before-consumer-restarts");
            self.restart_pods(&pods);
        }
        if let (Some(g), Some(c)) = (&cluster_lock, self.cluster.as_mut()) {
            c.lock_lost = g.lost();
        }
        // Done: the record goes before the lock, so a waiting leader sees this node finished.
        self.restart_record = None;
        self.restarted = restarted;
        self.rolled_back = rolled_back;
        self.settle()
    }

    /// The backup a failed verification restores: this pass's, else the one the owed restarts
    /// came with.
    fn backup_id(&self) -> String {
        self.renewed
            .backup_id
            .clone()
            .or_else(|| self.state.backup_id.clone())
            .unwrap_or_default()
    }

    /// Cluster mode: one node at a time restarts, and only when the gates pass; `Err` puts the
    /// restarts off. A new session: the client pair may just be renewed (the old one may have
    /// expired); if etcd refuses the new pair while the session opened before the renewal
    /// still reaches it, the old one holds the lock and checks the gates, and verification
    /// finds what is wrong with the new pair.
    fn cluster_lock(&mut self) -> Result<Option<cluster::LockGuard>, ()> {
        let renewed = cluster::start_for_pass(
            &self.node,
            &self.platform,
            &self.opts.cluster,
            &mut self.cluster,
        );
        let session = cluster::prefer_reachable(renewed, self.session.take());
        let guard = cluster::before_restart(
            &self.node,
            session.as_ref(),
            &self.to_restart,
            &self.opts.cluster,
            &mut self.cluster,
        );
        self.session = session;
        guard
    }

    /// Restarts `components` (in order), verified; `before`, restarted earlier in this pass, is
    /// restarted again too if a failure rolls back.
    fn restart_components(
        &mut self,
        components: &[Component],
        before: &[Restarted],
        backup_id: &str,
    ) -> (Vec<Restarted>, Option<RolledBack>) {
        if components.is_empty() {
            return (vec![], None);
        }
        let mut record = self.state.recorder(self.root);
        restart_verified_after(
            &self.node,
            &self.platform,
            (components, &self.reasons, before),
            backup_id,
            self.opts,
            &mut record,
        )
    }

    /// Done, or rolled back to a consistent state: nothing is owed any more, but for the pods
    /// whose restart failed (stopped, started or unhealthy): the next pass restarts them again.
    /// A failed rollback keeps the whole record, so that the next pass tries again.
    fn settle(&mut self) -> Result<(), OpsError> {
        if self.rolled_back.as_ref().is_some_and(|r| r.error.is_some()) {
            return Ok(());
        }
        if self.owed_pods.is_empty() {
            return self.state.clear(self.root);
        }
        let still = Restarts {
            components: vec![],
            pods: self.owed_pods.clone(),
        };
        if let Err(e) = self.state.owe(self.root, still) {
            // The pods are still reported (and the pass fails): a person must look.
            log::error!("{e}");
            self.pod_errors.push(e.to_string());
        }
        Ok(())
    }

    /// The last step, on every path: every pod this pass stopped runs again
    /// ([`ensure::all_enabled`]).
    fn ensure_enabled(&mut self) {
        if self.restarts() {
            self.ensured = ensure::all_enabled(self.root, &mut self.state, &self.opts.restart);
        }
    }
}
