//! The pass's restarts of the components, verified one at a time, and the automatic rollback
//! when one fails: the backup restored, what was restarted restarted again on the previous
//! files (a component whose stop never took effect verified instead), and the reload table's
//! rollback rule. Used by a `run` pass ([`crate::pass::run`]) and by the import of an
//! apiserver-etcd-client pair ([`crate::pass::import`]); the `rollback` command is
//! [`crate::pass::ops`]'s.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::node::Node;
use crate::node::manifests::Component;
use crate::pass::ops;
use crate::pass::run::RunOptions;
use crate::restart::api::ApiStats;
use crate::restart::reload::{self, ComponentVersion};
use crate::restart::{self, Platform, RestartOptions, Restarted, StopRecord};

/// What an automatic rollback did.
#[derive(Debug, Clone, Serialize)]
pub struct RolledBack {
    pub failure: String,
    pub backup_id: String,
    pub restarted: Vec<Restarted>,
    /// The rollback itself failed: a person must look.
    pub error: Option<String>,
}

/// Restarts `components` one at a time (each with its reason) and verifies each; when one
/// fails, restores `backup_id`, restarts again what was restarted and the one that failed, and
/// checks that the previous certificates are served.
pub fn restart_verified(
    node: &Node,
    platform: &Platform,
    (components, reasons): (&[Component], &BTreeMap<Component, String>),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
) -> (Vec<Restarted>, Option<RolledBack>) {
    restart_verified_after(
        node,
        platform,
        (components, reasons, &[]),
        backup_id,
        opts,
        record,
    )
}

/// [`restart_verified`], after `before` was restarted in the same pass (leaders last: what this
/// node holds no leader Lease for): a rollback restarts those again too.
pub(super) fn restart_verified_after(
    node: &Node,
    platform: &Platform,
    (components, reasons, before): (&[Component], &BTreeMap<Component, String>, &[Restarted]),
    backup_id: &str,
    opts: &RunOptions,
    record: &mut dyn StopRecord,
) -> (Vec<Restarted>, Option<RolledBack>) {
    // Probes read the renewed client certificates, so targets are built after the change.
    let reason = |c: Component| reasons.get(&c).cloned();
    let outcome = restart_with(
        node,
        platform,
        (components, reason, true),
        &opts.restart,
        record,
    );
    match outcome {
        Ok(done) => (done, None),
        Err((done, failed)) => {
            let mut all: Vec<Restarted> = before.to_vec();
            all.extend(done.iter().cloned());
            let mut every: Vec<Component> = before.iter().map(|r| r.component).collect();
            every.extend(components.iter().copied());
            let rolled = roll_back(
                node,
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
pub(super) fn restart_after_rollback(
    node: &Node,
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
        let reason = |_| Some(why.clone());
        let restarted = restart_with(node, platform, (&[c], reason, false), &opts.restart, record);
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
    node: &Node,
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
    // The backup puts back files the node has: `node` stays what detection sees.
    if let Err(e) = ops::rollback_locked(node.root(), Some(backup_id), &opts.write) {
        rolled.error = Some(format!("restoring backup {backup_id} failed: {e}"));
        return rolled;
    }
    let restarted = restart_again(
        node,
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
    node: &Node,
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
    let reason = |_| Some(format!("backup {backup_id} was restored"));
    let mut back = restart_with(
        node,
        platform,
        (&again, reason, false),
        &opts.restart,
        record,
    )?;
    if let Some(c) = unstopped {
        match verify_unstopped(node, platform, c, backup_id, &opts.restart) {
            Ok(r) => back.push(r),
            Err(e) => return Err((back, restart::Failed::other(e))),
        }
    }
    Ok(back)
}

/// Restarts `components` one at a time, each verified, with the reason `reason` gives it (the
/// target's own when `None`); none when one of them cannot be targeted. `expect_up`: a forward
/// restart (each was up before the pass), not one after a rollback ([`restart::Target`]).
fn restart_with(
    node: &Node,
    platform: &Platform,
    (components, reason, expect_up): (&[Component], impl Fn(Component) -> Option<String>, bool),
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<Vec<Restarted>, (Vec<Restarted>, restart::Failed)> {
    restart::targets(node, platform, components, opts)
        .map(|mut targets| {
            for t in &mut targets {
                if let Some(r) = reason(t.component) {
                    t.reason = r;
                }
                t.expect_up = expect_up;
            }
            targets
        })
        .map_err(|e| (vec![], restart::Failed::other(e)))
        .and_then(|t| restart::restart_all(node.root(), platform, &t, opts, record))
}

/// After the restore: verifies `c`, whose stop never took effect (it kept the files it started
/// with, the restored ones), instead of restarting it.
fn verify_unstopped(
    node: &Node,
    platform: &Platform,
    c: Component,
    backup_id: &str,
    opts: &RestartOptions,
) -> Result<Restarted, restart::RestartError> {
    let targets = restart::targets(node, platform, &[c], opts)?;
    let Some(t) = targets.first() else {
        return Err(restart::RestartError {
            component: Some(c),
            message: "no restart target".into(),
        });
    };
    let served_sha256 = restart::wait_verified(node.root(), t, opts)?;
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
