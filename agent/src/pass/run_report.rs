//! What one pass reports ([`RunReport`]): the record the `run` table, the JSON, the metrics,
//! the last-pass record and the exit code are made from, and how a finished [`Pass`] becomes
//! one.

use std::time::Instant;

use serde::Serialize;

use crate::cluster::ClusterReport;
use crate::node::manifests::{Component, Consumer};
use crate::pass::import::ImportReport;
use crate::pass::ops::RenewReport;
use crate::pass::rollback::RolledBack;
use crate::pass::run::Pass;
use crate::restart::api::{ApiStats, DiscardedTx};
use crate::restart::reload::ComponentVersion;
use crate::restart::{self, Reloaded, Restarted};

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

impl Pass<'_> {
    pub(super) fn report(self, started: Instant) -> RunReport {
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
