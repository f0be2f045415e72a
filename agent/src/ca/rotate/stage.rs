//! A stage's files: its transaction (with the restarts it causes recorded first), its pass,
//! and for the front-proxy and cluster CAs the wait for kube-apiserver to publish the new trust.

use std::path::Path;

use super::files::{self, CaPair, Target};
use super::guard::with_shared;
use super::shared::Shared;
use super::{RotateError, StageDone, ca_files, live, pass_failure, plan_here};
use super::{bottlerocket, cluster};
use crate::ca::consumers::CaName;
use crate::ca::plan::CaPlan;
use crate::ca::rotation::{Rotation, Stage};
use crate::node::Node;
use crate::node::manifests::Component;
use crate::pass::ops::{self, OpsError};
use crate::pass::outcome;
use crate::pass::run::{RunOptions, run_once};
use crate::pass::state::{PassState, Restarts};
use crate::restart::{self, Platform};
use crate::txn;

pub(super) fn stage_files(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    doing: Stage,
    target: Target,
) -> Result<StageDone, RotateError> {
    stage_files_with(root, r, opts, doing, target, None)
}

/// The stage's transaction, then its pass.
pub(super) fn stage_files_with(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    doing: Stage,
    target: Target,
    minted: Option<CaPair>,
) -> Result<StageDone, RotateError> {
    let (backup_id, written, leaves) = write_stage(root, r, opts, (doing, target), minted)?;
    // The issue (and an abort's re-issue) renews every leaf of the CA; every stage's pass makes
    // the restarts owed.
    // A node that only trusts the CA issues nothing: its pass installs the pair the etcd nodes
    // published ([`crate::pass::import`]).
    let reissue = !leaves.is_empty()
        && (matches!(target, Target::Issue)
            || (doing == Stage::Abort && target == Target::TrustIn));
    let mut pass_opts = opts.clone();
    pass_opts.policy.all = false;
    if reissue {
        pass_opts.policy.names = leaves;
    } else {
        // Only what has expired (a component may not start on it).
        pass_opts.policy.names = vec![];
        pass_opts.policy.within = 0;
    }
    let pass = run_once(root, &pass_opts)?;
    let exit = outcome::for_run(&pass);
    if exit != outcome::EXIT_OK {
        return Err(RotateError::Pass {
            stage: doing,
            exit,
            detail: pass_failure(&pass),
        });
    }
    if r.ca == CaName::Ca
        && let Some(api) = bottlerocket::api(&Node::discover(root), opts)?
    {
        // The settings follow the files the pass verified.
        let _lock = ops::lock_and_recover_with(root, opts.write.lock_timeout, Some(&opts.restart))?;
        let node = Node::discover(root);
        let files = ca_files(&node, r.ca)?;
        let failed = |detail| RotateError::Check {
            stage: doing,
            detail,
        };
        // The signer first: the kubelet's restart that the trust change causes keeps the API's
        // applier busy for seconds, and the manifest would wait behind it.
        if matches!(target, Target::TrustOut | Target::Abort) {
            bottlerocket::place_signer(&node, &api, &files, opts, false).map_err(failed)?;
        }
        bottlerocket::kubelet_trust(&node, &api, &files, opts).map_err(failed)?;
    }
    Ok(StageDone {
        stage: doing.name(),
        backup_id,
        files: written,
        renewed: pass
            .renew
            .plan
            .items
            .iter()
            .map(|i| i.name.clone())
            .collect(),
        restarted: pass
            .restarted
            .iter()
            .map(|x| x.component.name().to_string())
            .collect(),
        reloaded: pass
            .reloaded
            .iter()
            .map(|x| x.component.name().to_string())
            .collect(),
        published_after_ms: None,
    })
}

/// Front-proxy and cluster CAs, on a platform that runs the apiserver: waits until it publishes
/// the trust bundle the files now hold ([`live::settle_published`]). The issue changes no trust:
/// nothing to wait for.
pub(super) fn published(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    target: Target,
) -> Result<Option<u128>, String> {
    let Some(key) = live::key_of(r.ca).filter(|_| target != Target::Issue) else {
        return Ok(None);
    };
    let platform = restart::detect(root, &opts.restart).map_err(|e| e.to_string())?;
    if matches!(platform, Platform::None) {
        return Ok(None);
    }
    let node = Node::discover(root);
    let started = std::time::Instant::now();
    let bound = opts.restart.timeout.max(opts.restart.reload_timeout);
    if r.ca == CaName::Ca && target == Target::TrustIn {
        accepts_new_clients(&node, r, opts, bound)?;
    }
    let (_, want) = super::check::held(&node, r.ca)?;
    // What the stage took out of the files: the old CA at trust-out, the new one at an abort;
    // removed from the ConfigMap by the last node only (the others' apiservers still add it).
    let mut gone = match target {
        Target::TrustOut => vec![r.old_sha256.clone()],
        Target::Abort => vec![r.new_sha256.clone()],
        Target::TrustIn | Target::Issue => vec![],
    };
    if !gone.is_empty()
        && let Some(s) = with_shared(root, opts, r.ca).map_err(|e| e.to_string())?
    {
        let others = others_not_at(&s, r, target)?;
        if !others.is_empty() {
            log::info!(
                "{} still trusted by the apiservers of {}: the last node to finish removes it \
                 from extension-apiserver-authentication",
                if target == Target::TrustOut {
                    "the old CA is"
                } else {
                    "the new CA is"
                },
                others.join(", ")
            );
            gone.clear();
        }
    }
    let waited = live::settle_published(&node, key, &want, &gone, bound, opts.restart.poll)?;
    Ok(waited.map(|_| started.elapsed().as_millis()))
}

/// Cluster CA, trust-in: this node's kube-apiserver authenticates clients of the new CA
/// ([`live::wait_accepts_clients_of`]) before any node issues them.
fn accepts_new_clients(
    node: &Node,
    r: &Rotation,
    opts: &RunOptions,
    bound: std::time::Duration,
) -> Result<(), String> {
    let pods = super::pods_here(node, opts).map_err(|e| e.to_string())?;
    let Some(address) = pods
        .iter()
        .find(|(_, p)| p.component() == Some(Component::KubeApiserver))
        .and_then(|(_, p)| p.endpoint())
    else {
        return Ok(());
    };
    let files = ca_files(node, r.ca).map_err(|e| e.to_string())?;
    let new = files::pair(node.root(), &files, &r.new_sha256)?
        .ok_or("the new CA or its key is not on the node")?;
    let trust = files::read(node.root(), &files.cert)?.ok_or("the CA file is missing")?;
    let waited = live::wait_accepts_clients_of(
        address,
        &trust,
        &new,
        (bound, opts.restart.poll),
        opts.write.clock.now(),
    )?;
    log::info!(
        "kube-apiserver authenticates clients of the new CA ({} ms after trust-in)",
        waited.as_millis()
    );
    Ok(())
}

/// The other members that have not finished the stage `target` ends (trust-out: done; abort:
/// aborted).
fn others_not_at(s: &Shared, r: &Rotation, target: Target) -> Result<Vec<String>, String> {
    let me = s.me().to_string();
    let pending = if target == Target::TrustOut {
        s.behind(r.ca, &r.old_sha256, Stage::Done)?
    } else {
        s.not_aborted(r.ca, &r.old_sha256)?
    };
    Ok(pending.into_iter().filter(|m| *m != me).collect())
}

/// A stage's transaction: its backup (when files changed), the files written, and the leaves
/// of the CA certrotor renews.
type Written = (Option<String>, Vec<String>, Vec<String>);

/// Under the lock, after recovery: the stage's files in one transaction.
fn write_stage(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    (doing, target): (Stage, Target),
    minted: Option<CaPair>,
) -> Result<Written, RotateError> {
    let _lock = ops::lock_and_recover_with(root, opts.write.lock_timeout, Some(&opts.restart))?;
    let node = Node::discover(root);
    let (plan, pods) = plan_here(&node, r.ca, opts)?;
    let files = ca_files(&node, r.ca)?;
    let old = files::pair(root, &files, &r.old_sha256).map_err(RotateError::Refused)?;
    let new = match minted {
        Some(n) => Some(n),
        None if r.new_sha256.is_empty() => None,
        None => files::pair(root, &files, &r.new_sha256).map_err(RotateError::Refused)?,
    };
    let failed = |detail| RotateError::Check {
        stage: doing,
        detail,
    };
    if r.ca == CaName::Ca
        && matches!(target, Target::TrustIn | Target::Issue)
        && let Some(api) = bottlerocket::api(&node, opts)?
    {
        // Before the stage's transaction, and not undone by its rollback.
        bottlerocket::place_signer(&node, &api, &files, opts, true).map_err(failed)?;
    }
    let mut changes =
        files::changes(root, &files, target, old.as_ref(), new.as_ref()).map_err(failed)?;
    if r.ca == CaName::Ca {
        // The kubeconfigs' CA data and the signer's move, after the CA file (the manifest last).
        let bundle = files::bundle(&files, target, old.as_ref(), new.as_ref()).map_err(failed)?;
        changes.extend(cluster::changes(&node, &pods, &files, target, &bundle).map_err(failed)?);
    }
    let restarts = trust_restarts(&plan, target);
    let (id, written) = write(root, &node, &changes, &restarts, opts)?;
    // The kubelet's client certificate too: the kubelet rotates it by itself only late in its
    // life, and a control plane has the CA key to issue it now (`crate::renew::kubelet`).
    let leaves = plan
        .leaves
        .iter()
        .filter(|_| !files.trust_only)
        .filter(|l| l.renewable || l.name == crate::node::kubelet::CLIENT)
        .map(|l| l.name.clone())
        .collect();
    Ok((id, written, leaves))
}

/// The stage's transaction, its restarts recorded first (as a renewal records its own).
fn write(
    root: &Path,
    node: &Node,
    changes: &[txn::Change],
    restarts: &Restarts,
    opts: &RunOptions,
) -> Result<(Option<String>, Vec<String>), RotateError> {
    if changes.is_empty() {
        return Ok((None, vec![]));
    }
    let platform = restart::detect(root, &opts.restart).map_err(OpsError::Platform)?;
    let record = !matches!(platform, Platform::None) && !restarts.is_empty();
    let mut state = PassState::load(root)?;
    if record {
        restart::targets(node, &platform, &restarts.components, &opts.restart)
            .map_err(OpsError::NotRestartable)?;
        state.plan(root, restarts.clone())?;
    }
    let now = opts.write.clock.now();
    let applied = txn::apply_with(root, changes, "ca", now, opts.write.retention, &mut |id| {
        if record {
            state.committing(root, id)
        } else {
            Ok(())
        }
    });
    let outcome = match applied {
        Ok(o) => o,
        Err(e) => {
            if record {
                let _ = state.unplanned(root);
            }
            return Err(OpsError::Txn(e).into());
        }
    };
    if record {
        state.written(root, &outcome.backup_id)?;
    }
    Ok((Some(outcome.backup_id), outcome.files))
}

/// The restarts a change of the trust files causes: the plan's trust-in (and trust-out)
/// restarts. Swapping [old, new] for [new, old] changes no consumer's trust.
fn trust_restarts(plan: &CaPlan, target: Target) -> Restarts {
    if matches!(target, Target::Issue) {
        return Restarts::default();
    }
    let mut out = Restarts::default();
    let names = plan
        .stages
        .iter()
        .find(|s| s.stage == "trust-in")
        .map(|s| s.restarts.clone())
        .unwrap_or_default();
    // The kubelet is no static pod: certrotor cannot restart it on a kubeadm node, and the
    // stage's check waits until it has been ([`super::cluster`]).
    for name in names.into_iter().filter(|n| n != "kubelet") {
        match Component::ALL.iter().find(|c| c.name() == name) {
            Some(c) => out.components.push(*c),
            None => out.pods.push(name),
        }
    }
    out
}
