//! Installing an apiserver-etcd-client pair on an external-etcd control plane: from a bundle
//! (`certrotor etcd-client import`), or from the pair the etcd nodes published through etcd
//! (cluster mode, the first step of a pass). Either way one transaction with a backup, then a
//! verified restart of kube-apiserver (rolled back when it does not come back), the restart
//! owed in the pass state from before the files change until it is verified.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::cluster::{self, ClusterReport, Session};
use crate::node::Node;
use crate::node::manifests::Component;
use crate::pass::ensure;
use crate::pass::ops::{self, OpsError};
use crate::pass::run::{RolledBack, RunOptions, restart_verified};
use crate::pass::state::{PassState, Restarts};
use crate::restart::{self, Platform, Restarted};

/// What `etcd-client import` did.
#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub files: Vec<String>,
    pub backup_id: String,
    pub platform: String,
    pub restarted: Vec<Restarted>,
    pub rolled_back: Option<RolledBack>,
    /// Static pods found stopped at the end and started again (owed to the next pass).
    pub re_enabled: Vec<String>,
    /// Static pods that could not be started again at the end: a person must look.
    pub left_disabled: Vec<String>,
}

/// Installs an exported apiserver-etcd-client bundle on a control plane, then restarts
/// kube-apiserver and verifies it (rolling back the import when it does not come back).
pub fn from_bundle(
    root: &Path,
    bundle: &[u8],
    opts: &RunOptions,
) -> Result<ImportReport, OpsError> {
    let (_lock, _) =
        ops::lock_and_recover_with(root, opts.write.lock_timeout, Some(&opts.restart))?;
    let platform = restart::detect(root, &opts.restart).map_err(OpsError::Platform)?;
    // Found after the recovery, which may have put files back; the import replaces files the
    // node has.
    let node = Node::discover(root);
    let mut state = match platform {
        Platform::None => PassState::default(),
        _ => PassState::load(root)?,
    };
    let target = Import {
        node: &node,
        platform: &platform,
        opts,
        session: None,
    };
    let installed = target.install(bundle, &mut state, &mut None);
    // On every path: no pod this import stopped stays stopped while certrotor runs.
    let ensured = match platform {
        Platform::None => Default::default(),
        _ => ensure::all_enabled(root, &mut state, &opts.restart),
    };
    installed.map(|mut report| {
        report.re_enabled = ensured.re_enabled;
        report.left_disabled = ensured.left_disabled;
        report
    })
}

/// Installs the pair published through etcd (cluster mode, external etcd); a refused pair is
/// reported in `cluster` and nothing is installed.
pub fn published(
    node: &Node,
    platform: &Platform,
    session: &Session,
    opts: &RunOptions,
    state: &mut PassState,
    cluster: &mut Option<ClusterReport>,
) -> Option<ImportReport> {
    let refused = |cluster: &mut Option<ClusterReport>, m: String| {
        let m = format!("the apiserver-etcd-client pair published through etcd was refused: {m}");
        log::warn!("{}", m);
        cluster.get_or_insert_with(Default::default).pair_error = Some(m);
    };
    let mut bundle = match cluster::published_bundle(session, node) {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(e) => {
            refused(cluster, e.0);
            return None;
        }
    };
    let target = Import {
        node,
        platform,
        opts,
        session: Some(session),
    };
    let result = target.install(&bundle, state, cluster);
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

/// Where an import happens: the node, its platform, and in cluster mode the session whose lock
/// the restart takes.
struct Import<'a> {
    node: &'a Node,
    platform: &'a Platform,
    opts: &'a RunOptions,
    session: Option<&'a Session>,
}

impl Import<'_> {
    /// The import under the node lock the caller holds.
    fn install(
        &self,
        bundle: &[u8],
        state: &mut PassState,
        cluster: &mut Option<ClusterReport>,
    ) -> Result<ImportReport, OpsError> {
        let (root, restarts) = (self.node.root(), !matches!(self.platform, Platform::None));
        let components = [Component::KubeApiserver];
        if restarts {
            restart::targets(self.node, self.platform, &components, &self.opts.restart)
                .map_err(OpsError::NotRestartable)?;
            let planned = Restarts {
                components: components.to_vec(),
                pods: vec![],
            };
            state.plan(root, planned)?;
        }
        let installed =
            crate::pass::etcd_client::install(self.node, bundle, &self.opts.write, &mut |id| {
                if restarts {
                    state.committing(root, id)
                } else {
                    Ok(())
                }
            });
        let (files, backup_id) = match installed {
            Ok(done) => done,
            Err(e) => {
                if restarts {
                    let _ = state.unplanned(root);
                }
                return Err(OpsError::Import(Box::new(e)));
            }
        };
        let mut report = ImportReport {
            files,
            backup_id: backup_id.clone(),
            platform: self.platform.name().into(),
            restarted: vec![],
            rolled_back: None,
            re_enabled: vec![],
            left_disabled: vec![],
        };
        if restarts {
            state.written(root, &backup_id)?;
            self.restart(state, &mut report, cluster)?;
        }
        Ok(report)
    }

    /// Restarts kube-apiserver under the cluster lock (when there is a session) and settles its
    /// owed restart; put off to the next pass when the lock or a gate says so.
    fn restart(
        &self,
        state: &mut PassState,
        report: &mut ImportReport,
        cluster: &mut Option<ClusterReport>,
    ) -> Result<(), OpsError> {
        let components = [Component::KubeApiserver];
        let Ok(_cluster_lock) = cluster::before_restart(
            self.node,
            self.session,
            &components,
            &self.opts.cluster,
            cluster,
        ) else {
            // The restart stays owed to the next pass.
            return Ok(());
        };
        let reasons = BTreeMap::from([(
            Component::KubeApiserver,
            "an imported apiserver-etcd-client pair is verified by a restart (import does not \
             wait for a live reload)"
                .to_string(),
        )]);
        state.restarting(self.node.root())?;
        let (restarted, rolled_back) = restart_verified(
            self.node,
            self.platform,
            (&components, &reasons),
            &report.backup_id,
            self.opts,
            &mut state.recorder(self.node.root()),
        );
        if rolled_back.as_ref().is_none_or(|r| r.error.is_none()) {
            // Only the apiserver restart is settled here; other owed restarts stay for `run`.
            let mut owed = state.owed.clone();
            owed.components.retain(|c| *c != Component::KubeApiserver);
            state.owe(self.node.root(), owed)?;
        }
        report.restarted = restarted;
        report.rolled_back = rolled_back;
        Ok(())
    }
}
