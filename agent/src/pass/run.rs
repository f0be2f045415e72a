//! One pass of `run --once` and the daemon, top to bottom: check, renew what is due in one
//! transaction, let each component reload or restart it one at a time, verify what is served,
//! and roll back by itself when verification fails; last, on every path, make sure every static
//! pod the pass stopped runs again ([`crate::pass::ensure`]). Every step is a method of [`Pass`]
//! in the order [`run_once`] calls them; the pass's state between steps is persisted by
//! [`crate::pass::state`] (planned → committing → written → restarting → done), so that a crash
//! at any step is finished by the next command.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::cluster::roles::{self, LeadersLast, RecordGuard, Role};
use crate::cluster::{self, ClusterOptions, ClusterReport, Session};
use crate::node::manifests::{Component, Consumer};
use crate::pass::ensure::{self, Ensure};
use crate::pass::import::{self, ImportReport};
use crate::pass::ops::{self, OpsError, Recovered, RenewReport, WriteOptions};
use crate::pass::state::{PassState, Restarts};
use crate::renew::{Plan, Policy};
use crate::restart::api::{ApiStats, DiscardedTx};
use crate::restart::reload::{self, Action, ComponentVersion};
use crate::restart::{self, Platform, Reloaded, RestartOptions, Restarted, StopRecord};
use crate::sys::clock;
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

/// What one pass did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub renew: RenewReport,
    pub platform: String,
    /// Components that read renewed files.
    pub components: Vec<Component>,
    /// Components that served their renewed files without a restart (see `reload`).
    pub reloaded: Vec<Reloaded>,
    /// The version of each component the reload decision used, and where it was read.
    pub versions: Vec<ComponentVersion>,
    /// What the reload decision says about files reloaded without a restart that nothing
    /// probes (front-proxy-client), or that open connections keep (apiserver-kubelet-client).
    pub reload_notes: Vec<String>,
    /// Components restarted, each with its reason.
    pub restarted: Vec<Restarted>,
    /// Other static pods that mount a renewed file (from their manifests), and why they need a
    /// restart.
    pub other_consumers: Vec<Consumer>,
    /// Those restarted and healthy again.
    pub restarted_pods: Vec<restart::RestartedPod>,
    /// Those that could not be restarted or did not come back healthy: a person must look.
    pub pod_errors: Vec<String>,
    /// Of those, the pods that stay owed to the next pass (the pass state): their restart was
    /// attempted and failed, so the next pass restarts them again.
    pub owed_pods: Vec<String>,
    /// Set when verification failed and the backup was restored.
    pub rolled_back: Option<RolledBack>,
    /// Cluster mode: the lock, the gates and what was waited for.
    pub cluster: Option<ClusterReport>,
    /// External etcd: the published apiserver-etcd-client pair this pass installed.
    pub import: Option<ImportReport>,
    /// Bottlerocket: certrotor transactions an interrupted run left pending in the API,
    /// discarded before the pass began.
    pub discarded_transactions: Vec<DiscardedTx>,
    /// Static pods found stopped at the end of the pass (a start that failed) and started
    /// again: owed to the next pass.
    pub re_enabled: Vec<String>,
    /// Static pods that could not be started again at the end of the pass: a person must look
    /// (the next certrotor command tries again).
    pub left_disabled: Vec<String>,
    /// What the pass's Bottlerocket API calls met, in total (recovery, restarts, rollback, the
    /// last step): retries, re-applies of the config applier, time the API was unreachable.
    #[serde(flatten)]
    pub api: ApiStats,
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
struct Pass<'a> {
    root: &'a Path,
    opts: &'a RunOptions,
    platform: Platform,
    /// Cluster mode: the session opened before the renewal (its client pair may be renewed).
    session: Option<Session>,
    /// Cluster mode: this node's restart record in etcd, deleted when dropped.
    restart_record: Option<RecordGuard>,
    cluster: Option<ClusterReport>,
    import: Option<ImportReport>,
    /// The persisted state; untouched on platform `none`, which restarts nothing.
    state: PassState,
    /// What earlier passes owed when this one began.
    owed_before: Restarts,
    renewed: RenewReport,
    /// Components whose files changed or whose restart was owed, and the other static pods.
    work: Restarts,
    other_consumers: Vec<Consumer>,
    reloaded: Vec<Reloaded>,
    versions: Vec<ComponentVersion>,
    reload_notes: Vec<String>,
    /// Verified without a restart: started again by recovery on the renewed files.
    recovered_restarts: Vec<Restarted>,
    to_restart: Vec<Component>,
    reasons: BTreeMap<Component, String>,
    restarted: Vec<Restarted>,
    restarted_pods: Vec<restart::RestartedPod>,
    pod_errors: Vec<String>,
    owed_pods: Vec<String>,
    rolled_back: Option<RolledBack>,
    /// What recovery did before the pass began.
    recovered: Recovered,
    /// What the last step did.
    ensured: Ensure,
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
        let mut cluster = None;
        let session = cluster::start_for_pass(root, &platform, &opts.cluster, &mut cluster);
        let state = match platform {
            Platform::None => PassState::default(),
            _ => PassState::load(root)?,
        };
        let owed_before = state.owed.clone();
        if !owed_before.is_empty() {
            let names: Vec<&str> = owed_before.components.iter().map(|c| c.name()).collect();
            let pods = owed_before.pods.iter().map(String::as_str);
            log::warn!(
                "an earlier pass renewed files but did not finish restarting: {}",
                names.into_iter().chain(pods).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(Pass {
            root,
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
                self.root,
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
        let now = clock::now();
        let mut report = ops::plan_renewal(self.root, &self.opts.policy, self.opts.dry_run, now)?;
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
        restart::targets(self.root, &self.platform, &components, &self.opts.restart)
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
        match cluster::publish_if_due(s, self.root, self.opts.policy.within) {
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

    /// Live reload ([`reload`]): a component whose renewed files all reload by themselves is
    /// waited for until it serves them; one started again by recovery on the renewed files is
    /// verified; the others, and one that did not reload within the bound, are restarted, each
    /// with its reason.
    fn decide_reloads(&mut self, names: &[String]) {
        // Pods that cannot be listed: versions only from flags, the others unknown (restart).
        let pods = restart::pods(&self.platform).unwrap_or_default();
        self.versions = reload::versions(&pods, &self.opts.restart.reload.versions);
        let held = self.held_certificates();
        for c in self.work.components.clone() {
            if self.verified_after_recovery(c) {
                continue;
            }
            let action = if self.owed_before.components.contains(&c) {
                Action::Restart {
                    because: "an earlier pass renewed its files and did not finish restarting it"
                        .into(),
                }
            } else {
                let ctx = reload::Context {
                    mode: self.opts.restart.mode,
                    version: self.versions.iter().find(|v| v.component == c),
                    held: &held,
                    now: clock::now(),
                    margin: self.opts.restart.reload.held_cert_margin,
                };
                let d = reload::decide(c, names, &ctx);
                self.reload_notes.extend(d.notes);
                d.action
            };
            let reason = match action {
                Action::Restart { because } => because,
                Action::WaitLive => match self.wait_live(c, names) {
                    Ok(r) => {
                        self.reloaded.push(r);
                        continue;
                    }
                    Err(reason) => reason,
                },
            };
            self.reasons.insert(c, reason);
            self.to_restart.push(c);
        }
    }

    /// The renewed certificates' NotAfter before this pass renewed them, by catalog name (for
    /// the reload decision: what open connections may still present).
    fn held_certificates(&self) -> Vec<(String, i64)> {
        let plan = &self.renewed.plan;
        let planned_at = plan.not_before_unix + crate::renew::BACKDATE;
        plan.items
            .iter()
            .filter_map(|i| Some((i.name.clone(), planned_at + i.residual_seconds?)))
            .collect()
    }

    /// Waits for `c` to serve its renewed files by itself (and, for a client pair it reloads,
    /// checks that the server it is for accepts it: [`restart::pairs`]); the reason to restart
    /// it otherwise.
    fn wait_live(&self, c: Component, names: &[String]) -> Result<Reloaded, String> {
        let targets = restart::targets(self.root, &self.platform, &[c], &self.opts.restart)
            .map_err(|e| format!("it could not be probed for a live reload: {e}"))?;
        let pods = restart::pods(&self.platform).unwrap_or_default();
        restart::pairs::check_renewed(self.root, c, names, &pods, self.opts.restart.poll)?;
        targets
            .first()
            .and_then(|t| restart::wait_reloaded(self.root, t, &self.opts.restart))
            .ok_or_else(|| {
                format!(
                    "it did not serve its renewed certificate within {} s",
                    self.opts.restart.reload_timeout.as_secs()
                )
            })
    }

    /// Whether `c` was started again by recovery after its files were renewed and now serves
    /// them: then it counts as restarted, and is not restarted again.
    fn verified_after_recovery(&mut self, c: Component) -> bool {
        if self.state.started_by_recovery.is_empty() {
            return false;
        }
        let Ok(targets) = restart::targets(self.root, &self.platform, &[c], &self.opts.restart)
        else {
            return false;
        };
        let Some(t) = targets.first() else {
            return false;
        };
        if !self.state.started_by_recovery.contains(&t.pod) {
            return false;
        }
        let t0 = Instant::now();
        match restart::wait_verified(self.root, t, &self.opts.restart) {
            Ok(served_sha256) => {
                log::info!(
                    "{} was started again by recovery on its renewed files",
                    c.name()
                );
                self.recovered_restarts.push(Restarted {
                    component: c,
                    pod: t.pod.clone(),
                    unavailable_ms: t0.elapsed().as_millis(),
                    served_sha256,
                    reason: "it was started again by recovery, on its renewed files".into(),
                    api: ApiStats::default(),
                });
                true
            }
            Err(e) => {
                log::warn!("{e}; restarting it");
                false
            }
        }
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
                self.root,
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
            self.root,
            &self.platform,
            &self.opts.cluster,
            &mut self.cluster,
        );
        let session = cluster::prefer_reachable(renewed, self.session.take());
        let guard = cluster::before_restart(
            self.root,
            session.as_ref(),
            &self.to_restart,
            &self.opts.cluster,
            &mut self.cluster,
        );
        self.session = session;
        guard
    }

    /// Cluster mode: writes (or rewrites) this node's restart record, `components` and `pods`
    /// with the leader Leases it holds among them ([`roles`]); a failure is only a warning
    /// (leaders then see no record of this node).
    fn publish_record(&mut self, components: &[Component], pods: &[String]) {
        let Some(session) = &self.session else {
            return;
        };
        let listed = restart::pods(&self.platform).unwrap_or_default();
        let roles = roles::read(self.root, session, &listed, (components, pods));
        let rec = roles::record(components, pods, &roles);
        let written = match &self.restart_record {
            Some(g) => g.update(&rec),
            None => {
                let c = &self.opts.cluster;
                roles::publish(session, &rec, c.lease_ttl.min(c.wait))
                    .map(|g| self.restart_record = Some(g))
            }
        };
        if let Err(e) = written {
            log::warn!("cluster mode: writing this node's restart record: {e}");
        }
        // The report keeps every Lease seen, each as last read.
        let seen = &mut self.cluster.get_or_insert_with(Default::default).roles;
        seen.retain(|r| !roles.iter().any(|n| n.lease == r.lease));
        seen.extend(roles);
        seen.sort_by(|a, b| a.lease.cmp(&b.lease));
    }

    /// The leader Leases last read.
    fn roles(&self) -> &[Role] {
        self.cluster.as_ref().map_or(&[], |c| &c.roles)
    }

    /// Those this node holds, of `components` and `pods`.
    fn held(&self, components: &[Component], pods: &[String]) -> Vec<Role> {
        let of = |r: &Role| {
            components.iter().any(|c| c.name() == r.restarts) || pods.contains(&r.restarts)
        };
        self.roles()
            .iter()
            .filter(|r| r.this_node && of(r))
            .cloned()
            .collect()
    }

    /// Under the lock: the Leases read again (leadership may have moved), and the components to
    /// restart split into those whose Lease this node does not hold (first) and those whose
    /// Lease it holds (last). Without the lock (acting alone), or on a single control plane
    /// (no other node a Lease could move to), all first, in the usual order.
    fn leaders_split(&mut self, locked: bool, pods: &[String]) -> (Vec<Component>, Vec<Component>) {
        if !locked || !self.session.as_ref().is_some_and(roles::others_may_lead) {
            return (self.to_restart.clone(), vec![]);
        }
        self.publish_record(&self.to_restart.clone(), pods);
        let roles = self.roles();
        let held = |c: &Component| roles.iter().any(|r| r.this_node && r.restarts == c.name());
        self.to_restart.iter().partition(|c| !held(c))
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
            self.root,
            &self.platform,
            (components, &self.reasons, before),
            backup_id,
            self.opts,
            &mut record,
        )
    }

    /// Leaders last ([`roles`]): this node holds a leader Lease; while another node still has
    /// to restart a component of a Lease this node holds, without holding it, the lock is
    /// released and taken again after a jittered pause, for at most `--leader-wait`; then it
    /// proceeds. `false`: the lock could not be taken again (what remains stays owed).
    fn leaders_last(
        &mut self,
        lock: &mut Option<cluster::LockGuard>,
        last: &[Component],
        pods: &[String],
    ) -> bool {
        let started = Instant::now();
        let c = &self.opts.cluster;
        let bound = c.leader_wait.min(c.wait);
        self.publish_record(last, pods);
        let mut ll = LeadersLast::default();
        loop {
            let roles = self.held(last, pods);
            ll.held = roles
                .iter()
                .map(|r| {
                    format!(
                        "{} ({}, holder {})",
                        r.restarts,
                        r.lease,
                        r.holder.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let Some(s) = self.session.as_ref().filter(|_| !ll.held.is_empty()) else {
                break;
            };
            let who = roles::blockers(&s.client, &s.node.name, &roles)
                .unwrap_or_else(|e| vec![format!("the restart records could not be read: {e}")]);
            if who.is_empty() {
                break;
            }
            let why = format!("leaders last: {}", who.join("; "));
            if started.elapsed() >= bound {
                log::warn!(
                    "cluster mode: leaders last: waited {} s (--leader-wait); proceeding: {why}",
                    bound.as_secs()
                );
                ll.bound_reached = true;
                break;
            }
            if ll.waited_for.last() != Some(&why) {
                log::info!("cluster mode: waiting: {why}");
                ll.waited_for.push(why);
            }
            // Release the lock, let the others take it, take it again.
            *lock = None;
            std::thread::sleep(cluster::jitter_between(
                std::time::Duration::from_millis(500),
                std::time::Duration::from_millis(2000),
            ));
            let waited_before = self.cluster.as_ref().map_or(0, |c| c.waited_ms);
            let again = cluster::before_restart(
                self.root,
                self.session.as_ref(),
                last,
                &self.opts.cluster,
                &mut self.cluster,
            );
            if let Some(c) = self.cluster.as_mut() {
                c.waited_ms += waited_before;
            }
            match again {
                Ok(g) => *lock = g,
                Err(()) => return false,
            }
            self.publish_record(last, pods);
        }
        ll.waited_ms = started.elapsed().as_millis();
        if !ll.held.is_empty() {
            self.cluster
                .get_or_insert_with(Default::default)
                .leaders_last = Some(ll);
        }
        true
    }

    /// One restart per consumer pod, even when it mounts several renewed files; with the pods
    /// an earlier pass still owes.
    fn pods_to_restart(&self) -> Vec<Consumer> {
        let mut pods: Vec<Consumer> = Vec::new();
        for c in &self.other_consumers {
            match pods.iter_mut().find(|p| p.pod == c.pod) {
                Some(p) => {
                    p.file = format!("{}, {}", p.file, c.file);
                    p.reason = format!("{}; {}", p.reason, c.reason);
                }
                None => pods.push(c.clone()),
            }
        }
        for pod in &self.owed_before.pods {
            if self.work.pods.contains(pod) && !pods.iter().any(|p| &p.pod == pod) {
                pods.push(Consumer {
                    pod: pod.clone(),
                    file: String::new(),
                    single_file: false,
                    reason: format!(
                        "an earlier pass renewed a file that static pod '{pod}' mounts and did \
                         not finish restarting it"
                    ),
                });
            }
        }
        pods.retain(|p| !self.state.started_by_recovery.contains(&p.pod));
        pods
    }

    /// The other consumers, one at a time, each verified by its health.
    fn restart_pods(&mut self, pods: &[Consumer]) {
        let mut record = self.state.recorder(self.root);
        for c in pods {
            match restart::restart_pod(
                self.root,
                &self.platform,
                c,
                &self.opts.restart,
                &mut record,
            ) {
                Ok(r) => self.restarted_pods.push(r),
                Err(e) => {
                    log::error!("{e}");
                    if e.owed {
                        self.owed_pods.push(c.pod.clone());
                    }
                    self.pod_errors.push(e.to_string());
                }
            }
        }
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

    fn report(self, started: Instant) -> RunReport {
        let mut api = self.recovered.api;
        api.add(&self.state.this_process.api);
        let mut restarted = self.recovered_restarts;
        restarted.extend(self.restarted);
        RunReport {
            renew: self.renewed,
            platform: self.platform.name().into(),
            components: self.work.components,
            reloaded: self.reloaded,
            restarted,
            versions: self.versions,
            reload_notes: self.reload_notes,
            other_consumers: self.other_consumers,
            restarted_pods: self.restarted_pods,
            pod_errors: self.pod_errors,
            owed_pods: self.owed_pods,
            rolled_back: self.rolled_back,
            cluster: self.cluster,
            import: self.import,
            discarded_transactions: self.recovered.discarded,
            re_enabled: self.ensured.re_enabled,
            left_disabled: self.ensured.left_disabled,
            api,
            duration_ms: started.elapsed().as_millis(),
        }
    }
}

/// The static pods other than the four components that mount one of `files` (paths relative
/// to `root`), from their manifests; none when the pods cannot be listed (a warning).
fn consumers_of(root: &Path, platform: &Platform, files: &[String]) -> Vec<Consumer> {
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

/// Restarts `components` one at a time (each with its reason) and verifies each; when one
/// fails, restores `backup_id`, restarts again what was restarted and the one that failed, and
/// checks that the previous certificates are served.
pub fn restart_verified(
    root: &Path,
    platform: &Platform,
    (components, reasons): (&[Component], &BTreeMap<Component, String>),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
) -> (Vec<Restarted>, Option<RolledBack>) {
    restart_verified_after(
        root,
        platform,
        (components, reasons, &[]),
        backup_id,
        opts,
        record,
    )
}

/// [`restart_verified`], after `before` was restarted in the same pass (leaders last: what this
/// node holds no leader Lease for): a rollback restarts those again too.
fn restart_verified_after(
    root: &Path,
    platform: &Platform,
    (components, reasons, before): (&[Component], &BTreeMap<Component, String>, &[Restarted]),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
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
        .map_err(|error| (vec![], restart::Failed::other(error)))
        .and_then(|targets| restart::restart_all(root, platform, &targets, &opts.restart, record));
    match outcome {
        Ok(done) => (done, None),
        Err((done, failed)) => {
            let mut all: Vec<Restarted> = before.to_vec();
            all.extend(done.iter().cloned());
            let mut every: Vec<Component> = before.iter().map(|r| r.component).collect();
            every.extend(components.iter().copied());
            let rolled = roll_back(
                root,
                platform,
                (&every, &all, &failed),
                backup_id,
                opts,
                record,
            );
            (done, Some(rolled))
        }
    }
}

/// The rollback rule of the reload table ([`reload::restart_after_rollback`]): after `rolled`
/// restored `names`, restarts a component that took them by itself but may keep the renewed
/// pair on open connections (kube-apiserver before 1.27 and apiserver-kubelet-client).
fn restart_after_rollback(
    root: &Path,
    platform: &Platform,
    (names, versions): (&[String], &[ComponentVersion]),
    opts: &RunOptions,
    rolled: &mut RolledBack,
    record: &mut dyn StopRecord,
) {
    for c in Component::ALL {
        if rolled.error.is_some() || rolled.restarted.iter().any(|r| r.component == c) {
            continue;
        }
        let version = versions.iter().find(|v| v.component == c);
        let Some(why) = reload::restart_after_rollback(c, names, version) else {
            continue;
        };
        let restarted = restart::targets(root, platform, &[c], &opts.restart)
            .map(|mut targets| {
                for t in &mut targets {
                    t.reason = why.clone();
                }
                targets
            })
            .map_err(|e| (vec![], restart::Failed::other(e)))
            .and_then(|t| restart::restart_all(root, platform, &t, &opts.restart, record));
        match restarted {
            Ok(done) => rolled.restarted.extend(done),
            Err((done, failed)) => {
                rolled.restarted.extend(done);
                rolled.error = Some(format!(
                    "after restoring backup {}: {}",
                    rolled.backup_id, failed.error
                ));
            }
        }
    }
}

/// After a failed verification: restores `backup_id` and restarts again, with the old files,
/// what was restarted and the component that failed; a component whose stop never took effect
/// still runs with the files it started with, so it is verified, not restarted.
fn roll_back(
    root: &Path,
    platform: &Platform,
    (components, done, failed): (&[Component], &[Restarted], &restart::Failed),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
) -> RolledBack {
    let error = &failed.error;
    log::warn!("verification failed: {error}; restoring the previous certificates");
    let mut rolled = RolledBack {
        failure: error.to_string(),
        backup_id: backup_id.to_string(),
        restarted: vec![],
        error: None,
    };
    if let Err(e) = ops::rollback_locked(root, Some(backup_id), &opts.write) {
        rolled.error = Some(format!("restoring backup {backup_id} failed: {e}"));
        return rolled;
    }
    let restarted = restart_again(
        root,
        platform,
        (components, done, failed),
        backup_id,
        opts,
        record,
    );
    match restarted {
        Ok(back) => {
            log::warn!(
                "rolled back to backup {backup_id}; the previous certificates are served again"
            );
            rolled.restarted = back;
        }
        Err((back, f)) => {
            rolled.restarted = back;
            rolled.error = Some(format!("after restoring backup {backup_id}: {}", f.error));
        }
    }
    rolled
}

/// After the restore: restarts again what was restarted and the component that failed (all of
/// them when the failure names none); verifies, instead, a failed component whose stop never
/// took effect.
fn restart_again(
    root: &Path,
    platform: &Platform,
    (components, done, failed): (&[Component], &[Restarted], &restart::Failed),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
) -> Result<Vec<Restarted>, (Vec<Restarted>, restart::Failed)> {
    let mut again: Vec<Component> = done.iter().map(|r| r.component).collect();
    let mut unstopped = None;
    match failed.error.component {
        Some(c) if failed.never_stopped && !again.contains(&c) => unstopped = Some(c),
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
    let mut back = targets
        .map_err(|e| (vec![], restart::Failed::other(e)))
        .and_then(|t| restart::restart_all(root, platform, &t, &opts.restart, record))?;
    if let Some(c) = unstopped {
        match verify_unstopped(root, platform, c, backup_id, &opts.restart) {
            Ok(r) => back.push(r),
            Err(e) => return Err((back, restart::Failed::other(e))),
        }
    }
    Ok(back)
}

/// After the restore: verifies `c`, whose stop never took effect (it kept the files it started
/// with, the restored ones), instead of restarting it.
fn verify_unstopped(
    root: &Path,
    platform: &Platform,
    c: Component,
    backup_id: &str,
    opts: &RestartOptions,
) -> Result<Restarted, restart::RestartError> {
    let targets = restart::targets(root, platform, &[c], opts)?;
    let Some(t) = targets.first() else {
        return Err(restart::RestartError {
            component: Some(c),
            message: "no restart target".into(),
        });
    };
    let served_sha256 = restart::wait_verified(root, t, opts)?;
    log::warn!(
        "{} was never stopped (its stop did not take effect): verified it serves the files of \
         backup {backup_id}, not restarted",
        c.name()
    );
    Ok(Restarted {
        component: c,
        pod: t.pod.clone(),
        // It never stopped serving.
        unavailable_ms: 0,
        served_sha256,
        reason: format!(
            "backup {backup_id} was restored; its stop had not taken effect, so it was verified, \
             not restarted"
        ),
        api: ApiStats::default(),
    })
}
