//! A CA rotation on one node, with overlapping trust (issue 29): trust-in, issue, a pause for
//! what certrotor cannot reach, trust-out; or abort back to the old CA before trust-out.
//!
//! Each stage is:
//! 1. recorded (`ca-rotation.json`, [`crate::ca::rotation`]) before anything changes;
//! 2. under the lock, after recovery: the CA's files made what the stage wants
//!    ([`files::changes`]) in one transaction of kind `ca` with a backup, the restarts it
//!    causes recorded in the pass state first (as a renewal records its own), so that a crash
//!    after the transaction still owes them;
//! 3. a pass ([`crate::pass::run::run_once`]): it makes the owed restarts one at a time,
//!    verified, rolling back to the stage's backup by itself when a component fails; at the
//!    issue stage it also issues every leaf of the CA again, now from the new CA;
//! 4. checked from the files: every trust file holds what the stage says, every leaf is signed
//!    by the CA that must sign it; then recorded as reached.
//!
//! The CA file is both the trust bundle the consumers read and the signer's certificate
//! (kubeadm and etcdadm point both at one file), so its first certificate is always the one
//! whose key is the CA key: [old, new] at trust-in, [new, old] from the issue on. A renewal or
//! a check meanwhile reads the first certificate as the CA, and accepts a leaf signed by the
//! other ([`crate::node::inventory`]).
//!
//! On a stacked cluster (etcd has other members and answers), the nodes take turns through
//! etcd ([`shared`]): one new CA for all, the issue on no node before every member is trusted,
//! trust-out on none before every member issued; restarts wait for the cluster lock and its
//! gates as every pass's do.
//!
//! What is not built yet, and refused with the reason: the cluster CA (kube-controller-manager
//! signs with `ca.crt` and refuses a bundle, so its signer must first move to a file of its
//! own); an external etcd, or control planes outside the etcd members (they cannot take turns
//! through the members' records); a trust file other than the CA file itself.

pub mod files;
mod live;
mod shared;

use std::path::Path;

use serde::Serialize;

use crate::ca::consumers::CaName;
use crate::ca::plan::{CaPlan, plan};
use crate::ca::rotation::{Rotation, Stage};
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};
use crate::pass::events;
use crate::pass::ops::{self, OpsError};
use crate::pass::outcome;
use crate::pass::run::{RunOptions, RunReport, run_once};
use crate::pass::state::{PassState, Restarts};
use crate::restart::{self, Platform};
use crate::sys::state::StateError;
use crate::txn;
use files::{CaFiles, CaPair, Target};
use shared::Shared;

/// A rotation refused or failed; each says what happened to the files and what to do.
#[derive(Debug)]
pub enum RotateError {
    /// Refused before anything changed.
    Refused(String),
    /// Stopped after earlier stages of this command changed files (they stand, recorded).
    Stopped(String),
    /// The rotation state file cannot be used.
    State(StateError),
    /// Locking, recovery, the transaction or the pass state.
    Ops(OpsError),
    /// A stage's pass failed (exit code of `run --once`): the stage stays in progress.
    Pass {
        stage: Stage,
        exit: u8,
        detail: String,
    },
    /// The files after a stage are not what it wants.
    Check { stage: Stage, detail: String },
}

impl std::fmt::Display for RotateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RotateError::Refused(s) => write!(f, "{s}; nothing was changed"),
            RotateError::Stopped(s) => write!(
                f,
                "{s}; what the stages before did stands (recorded on this node): run the same \
                 command again"
            ),
            RotateError::State(e) => write!(f, "{e}"),
            RotateError::Ops(e) => write!(f, "{e}"),
            RotateError::Pass {
                stage,
                exit,
                detail,
            } => write!(
                f,
                "stage {}: the pass failed (exit {exit}): {detail}; the stage stays in progress: \
                 run the same command again, or 'certrotor ca abort'",
                stage.name()
            ),
            RotateError::Check { stage, detail } => write!(
                f,
                "stage {}: {detail}; the stage stays in progress: run the same command again, or \
                 'certrotor ca abort'",
                stage.name()
            ),
        }
    }
}

impl std::error::Error for RotateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RotateError::Ops(e) => Some(e),
            RotateError::State(e) => Some(e),
            _ => None,
        }
    }
}

impl From<OpsError> for RotateError {
    fn from(e: OpsError) -> Self {
        RotateError::Ops(e)
    }
}

impl From<StateError> for RotateError {
    fn from(e: StateError) -> Self {
        RotateError::State(e)
    }
}

/// What one stage did.
#[derive(Debug, Clone, Serialize)]
pub struct StageDone {
    pub stage: &'static str,
    /// The transaction's backup (undo of the stage's files), when files changed.
    pub backup_id: Option<String>,
    pub files: Vec<String>,
    /// Renewed by the stage's pass.
    pub renewed: Vec<String>,
    pub restarted: Vec<String>,
    pub reloaded: Vec<String>,
    /// Front-proxy CA: how long kube-apiserver took to publish the new trust bundle.
    pub published_after_ms: Option<u128>,
}

/// What a command did, and where the rotation stands.
#[derive(Debug, Clone, Serialize)]
pub struct RotateReport {
    pub ca: CaName,
    pub stage: &'static str,
    pub old_sha256: String,
    pub new_sha256: String,
    pub stages: Vec<StageDone>,
    /// What the operator is asked next.
    pub next: String,
    /// Outside the node: what may still trust or hold the old CA.
    pub outside: Vec<String>,
    /// Leaves still signed by the old CA that certrotor does not renew.
    pub old_leaves: Vec<String>,
}

/// The rotation recorded on this node (after recovery), if any.
pub fn status(root: &Path) -> Result<Option<Rotation>, RotateError> {
    ops::recover_before_reading(root)?;
    Ok(Rotation::load(root)?)
}

/// Starts or resumes the rotation of `ca`: trust-in, then the issue, then stops before
/// trust-out (`continue_rotation`).
pub fn rotate(root: &Path, ca: CaName, opts: &RunOptions) -> Result<RotateReport, RotateError> {
    failed(root, ca, opts, rotate_stages(root, ca, opts))
}

fn rotate_stages(root: &Path, ca: CaName, opts: &RunOptions) -> Result<RotateReport, RotateError> {
    let mut done = Vec::new();
    let mut r = match Rotation::load(root)? {
        Some(r) if !r.stage.finished() => in_progress(r, ca)?,
        _ => begin(root, ca, opts)?,
    };
    match r.stage {
        Stage::TrustIn | Stage::Trusted | Stage::Issue | Stage::Issued => {}
        Stage::TrustOut => {
            return Err(RotateError::Refused(format!(
                "the trust-out of {} is in progress: finish it with 'certrotor ca continue --ca {}'",
                ca.name(),
                ca.name()
            )));
        }
        _ => {
            return Err(RotateError::Refused(format!(
                "an abort of the rotation of {} is in progress: finish it with 'certrotor ca \
                 abort --ca {}'",
                ca.name(),
                ca.name()
            )));
        }
    }
    if r.stage == Stage::TrustIn {
        done.push(trust_in(root, &mut r, opts)?);
    }
    if matches!(r.stage, Stage::Trusted | Stage::Issue) {
        if let Some(waiting) = waiting(root, &r, opts, Stage::Trusted)? {
            return report(root, &r, done, opts).map(|mut rep| {
                rep.next = waiting;
                rep
            });
        }
        done.push(step(root, &mut r, opts, (Stage::Issue, Stage::Issued))?);
    }
    report(root, &r, done, opts)
}

/// Trust-out after the issue: every trust file holds the new CA alone.
pub fn continue_rotation(
    root: &Path,
    ca: CaName,
    opts: &RunOptions,
) -> Result<RotateReport, RotateError> {
    failed(root, ca, opts, trust_out(root, ca, opts))
}

fn trust_out(root: &Path, ca: CaName, opts: &RunOptions) -> Result<RotateReport, RotateError> {
    let mut r = recorded(root, ca)?;
    if !matches!(r.stage, Stage::Issued | Stage::TrustOut) {
        return Err(RotateError::Refused(format!(
            "the rotation of {} is at stage {}: trust-out follows the issue ('certrotor ca rotate \
             --ca {}' first)",
            ca.name(),
            r.stage.name(),
            ca.name()
        )));
    }
    if r.stage == Stage::Issued
        && let Some(waiting) = waiting(root, &r, opts, Stage::Issued)?
    {
        return Err(RotateError::Refused(waiting));
    }
    let done = vec![step(root, &mut r, opts, (Stage::TrustOut, Stage::Done))?];
    report(root, &r, done, opts)
}

/// Back to the old CA alone, before trust-out: after the issue, the leaves are issued again
/// from the old CA first.
pub fn abort(root: &Path, ca: CaName, opts: &RunOptions) -> Result<RotateReport, RotateError> {
    failed(root, ca, opts, abort_stages(root, ca, opts))
}

fn abort_stages(root: &Path, ca: CaName, opts: &RunOptions) -> Result<RotateReport, RotateError> {
    let mut r = recorded(root, ca)?;
    if matches!(r.stage, Stage::TrustOut | Stage::Done | Stage::Aborted) {
        return Err(RotateError::Refused(format!(
            "the rotation of {} is at stage {}: an abort is possible only before trust-out",
            ca.name(),
            r.stage.name()
        )));
    }
    let node = Node::discover(root);
    let files = ca_files(&node, ca)?;
    let mut done = Vec::new();
    let signs_new = !r.new_sha256.is_empty()
        && files::pair(root, &files, &r.new_sha256)
            .map_err(RotateError::Refused)?
            .is_some_and(|n| signer_is(root, &files, &n.cert));
    if r.stage != Stage::Abort {
        r.enter(root, Stage::Abort, opts.write.clock.now())
            .map_err(|e| state_io(root, e))?;
    }
    if signs_new {
        // The leaves were issued by the new CA: the old one signs again and issues them.
        let mut reissue = stage_files(root, &r, opts, Stage::Abort, Target::TrustIn)?;
        reissue.stage = "abort: issue by the old CA";
        done.push(reissue);
    }
    done.push(step(root, &mut r, opts, (Stage::Abort, Stage::Aborted))?);
    report(root, &r, done, opts)
}

/// Posts a Kubernetes Event on this node (best effort, [`events::post_event`]).
fn event(
    root: &Path,
    reason: &'static str,
    kind: &'static str,
    message: String,
    opts: &RunOptions,
) {
    let e = events::Event {
        reason,
        kind,
        message,
    };
    events::post_event(&Node::discover(root), &e, &*opts.write.clock);
}

/// A failed stage's Event, then the error.
fn failed<T>(
    root: &Path,
    ca: CaName,
    opts: &RunOptions,
    r: Result<T, RotateError>,
) -> Result<T, RotateError> {
    if let Err(e @ (RotateError::Pass { .. } | RotateError::Check { .. })) = &r {
        let message = format!(
            "certrotor: the rotation of {} failed on this node: {e}",
            ca.name()
        );
        event(root, events::CA_FAILED, "Warning", message, opts);
    }
    r
}

fn in_progress(r: Rotation, ca: CaName) -> Result<Rotation, RotateError> {
    if r.ca != ca {
        return Err(RotateError::Refused(format!(
            "a rotation of {} is in progress on this node (stage {}): finish it ('certrotor ca \
             rotate|continue --ca {}') or abort it ('certrotor ca abort --ca {}') first",
            r.ca.name(),
            r.stage.name(),
            r.ca.name(),
            r.ca.name()
        )));
    }
    Ok(r)
}

fn recorded(root: &Path, ca: CaName) -> Result<Rotation, RotateError> {
    match Rotation::load(root)? {
        Some(r) if !r.stage.finished() => in_progress(r, ca),
        _ => Err(RotateError::Refused(format!(
            "no rotation of {} is in progress on this node ('certrotor ca status')",
            ca.name()
        ))),
    }
}

/// Checks that this node can rotate `ca` alone, and records the rotation (stage trust-in).
fn begin(root: &Path, ca: CaName, opts: &RunOptions) -> Result<Rotation, RotateError> {
    let _lock = ops::lock_and_recover_with(root, opts.write.lock_timeout, Some(&opts.restart))?;
    let node = Node::discover(root);
    let (plan, pods) = plan_here(&node, ca, opts)?;
    let shared = connect(&node, &pods, opts)?;
    refuse_unbuilt(ca, &plan, &pods, shared.as_ref())?;
    alone(&node, opts, shared.as_ref())?;
    let files = ca_files(&node, ca)?;
    let certs = files::certs(root, &files).map_err(RotateError::Refused)?;
    if certs.len() != 1 {
        return Err(RotateError::Refused(format!(
            "'{}' holds {} certificates, and no rotation is recorded on this node: another tool \
             may be rotating this CA; make it hold the CA alone before certrotor rotates it",
            files.cert,
            certs.len()
        )));
    }
    let old = &certs[0];
    if files::pair(root, &files, &old.sha256_hex())
        .map_err(RotateError::Refused)?
        .is_none()
    {
        return Err(RotateError::Refused(format!(
            "the key of {} ('{}') is not on this node or does not match '{}': certrotor rotates a \
             CA only where its key is",
            ca.name(),
            files.key,
            files.cert
        )));
    }
    let mut r = Rotation::new(ca, old.sha256_hex());
    let now = opts.write.clock.now();
    r.enter(root, Stage::TrustIn, now)
        .map_err(|e| state_io(root, e))?;
    log::info!("rotation of {}: begun (old CA {})", ca.name(), r.old_sha256);
    Ok(r)
}

/// Trust-in: a new CA is made unless the files already hold the one recorded.
fn trust_in(root: &Path, r: &mut Rotation, opts: &RunOptions) -> Result<StageDone, RotateError> {
    let node = Node::discover(root);
    let files = ca_files(&node, r.ca)?;
    let have_new = !r.new_sha256.is_empty()
        && files::pair(root, &files, &r.new_sha256)
            .map_err(RotateError::Refused)?
            .is_some();
    if !have_new {
        let old = old_pair(root, &files, r)?;
        let mint = || files::mint(&old, opts.write.clock.now());
        let new = match with_shared(root, opts)? {
            Some(s) => s.new_ca(r.ca, &r.old_sha256, mint),
            None => mint(),
        }
        .map_err(RotateError::Refused)?;
        r.new_sha256 = new.cert.sha256_hex();
        // Recorded before the files: a crash in between makes another one, never a second
        // new CA in the files.
        r.enter(root, Stage::TrustIn, opts.write.clock.now())
            .map_err(|e| state_io(root, e))?;
        return stage_with(root, r, opts, (Stage::TrustIn, Stage::Trusted), Some(new));
    }
    stage_with(root, r, opts, (Stage::TrustIn, Stage::Trusted), None)
}

/// One stage from its record to its check: `(doing, reached)`.
fn step(
    root: &Path,
    r: &mut Rotation,
    opts: &RunOptions,
    stages: (Stage, Stage),
) -> Result<StageDone, RotateError> {
    if r.stage != stages.0 {
        r.enter(root, stages.0, opts.write.clock.now())
            .map_err(|e| state_io(root, e))?;
    }
    stage_with(root, r, opts, stages, None)
}

fn stage_with(
    root: &Path,
    r: &mut Rotation,
    opts: &RunOptions,
    (doing, reached): (Stage, Stage),
    minted: Option<CaPair>,
) -> Result<StageDone, RotateError> {
    let target = match doing {
        Stage::TrustIn => Target::TrustIn,
        Stage::Issue => Target::Issue,
        Stage::TrustOut => Target::TrustOut,
        _ => Target::Abort,
    };
    let mut done = stage_files_with(root, r, opts, doing, target, minted)?;
    check(root, r, target).map_err(|detail| RotateError::Check {
        stage: doing,
        detail,
    })?;
    done.published_after_ms =
        published(root, r, opts, target).map_err(|detail| RotateError::Check {
            stage: doing,
            detail,
        })?;
    r.enter(root, reached, opts.write.clock.now())
        .map_err(|e| state_io(root, e))?;
    log::info!("rotation of {}: {}", r.ca.name(), reached.name());
    let message = format!(
        "certrotor: the rotation of {} reached stage {} on this node (new CA SHA-256 {})",
        r.ca.name(),
        reached.name(),
        r.new_sha256
    );
    event(root, events::CA_STAGE, "Normal", message, opts);
    if let Some(s) = with_shared(root, opts)? {
        s.reached(r.ca, &r.old_sha256, reached, opts.write.clock.now())
            .map_err(|e| RotateError::Stopped(format!("recording the stage in etcd: {e}")))?;
    }
    Ok(done)
}

fn stage_files(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    doing: Stage,
    target: Target,
) -> Result<StageDone, RotateError> {
    stage_files_with(root, r, opts, doing, target, None)
}

/// The stage's transaction, then its pass.
fn stage_files_with(
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
    let reissue =
        matches!(target, Target::Issue) || (doing == Stage::Abort && target == Target::TrustIn);
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

/// Front-proxy CA, on a platform that runs the apiserver: waits until it publishes the trust
/// bundle the files now hold ([`live::wait_published`]). The issue changes no trust: nothing to
/// wait for.
fn published(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    target: Target,
) -> Result<Option<u128>, String> {
    if r.ca != CaName::FrontProxyCa || target == Target::Issue {
        return Ok(None);
    }
    let platform = restart::detect(root, &opts.restart).map_err(|e| e.to_string())?;
    if matches!(platform, Platform::None) {
        return Ok(None);
    }
    let node = Node::discover(root);
    let files = ca_files(&node, r.ca).map_err(|e| e.to_string())?;
    let want: Vec<String> = files::certs(root, &files)?
        .iter()
        .map(|c| c.sha256_hex())
        .collect();
    // What the stage took out of the files: the old CA at trust-out, the new one at an abort;
    // removed from the ConfigMap by the last node only (the others' apiservers still add it).
    let mut gone = match target {
        Target::TrustOut => vec![r.old_sha256.clone()],
        Target::Abort => vec![r.new_sha256.clone()],
        Target::TrustIn | Target::Issue => vec![],
    };
    if !gone.is_empty()
        && let Some(s) = with_shared(root, opts).map_err(|e| e.to_string())?
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
    let bound = opts.restart.timeout.max(opts.restart.reload_timeout);
    let waited = live::settle_published(&node, &want, &gone, bound, opts.restart.poll)?;
    Ok(waited.map(|d| d.as_millis()))
}

/// The other members that have not finished the stage `target` ends (trust-out: done; abort:
/// aborted).
fn others_not_at(s: &Shared, r: &Rotation, target: Target) -> Result<Vec<String>, String> {
    let me = s.me().to_string();
    let pending = if target == Target::TrustOut {
        s.behind(r.ca, &r.old_sha256, Stage::Done)?
    } else {
        let aborted = s.aborted(r.ca, &r.old_sha256)?;
        s.members
            .iter()
            .filter(|m| !aborted.contains(m))
            .cloned()
            .collect()
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
    let (plan, _) = plan_here(&node, r.ca, opts)?;
    let files = ca_files(&node, r.ca)?;
    let old = files::pair(root, &files, &r.old_sha256).map_err(RotateError::Refused)?;
    let new = match minted {
        Some(n) => Some(n),
        None if r.new_sha256.is_empty() => None,
        None => files::pair(root, &files, &r.new_sha256).map_err(RotateError::Refused)?,
    };
    let changes =
        files::changes(root, &files, target, old.as_ref(), new.as_ref()).map_err(|detail| {
            RotateError::Check {
                stage: doing,
                detail,
            }
        })?;
    let restarts = trust_restarts(&plan, target);
    let (id, written) = write(root, &node, &changes, &restarts, opts)?;
    let leaves = plan
        .leaves
        .iter()
        .filter(|l| l.renewable)
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
    for name in names {
        match Component::ALL.iter().find(|c| c.name() == name) {
            Some(c) => out.components.push(*c),
            None => out.pods.push(name),
        }
    }
    out
}

/// Checks the files after a stage: the CA file holds what the target says, and (from the
/// issue on) every renewable leaf is signed by the new CA (at an abort, by the old).
fn check(root: &Path, r: &Rotation, target: Target) -> Result<(), String> {
    let node = Node::discover(root);
    let files = ca_files(&node, r.ca).map_err(|e| e.to_string())?;
    let held: Vec<String> = files::certs(root, &files)?
        .iter()
        .map(|c| c.sha256_hex())
        .collect();
    let (old, new) = (r.old_sha256.clone(), r.new_sha256.clone());
    let want = match target {
        Target::TrustIn => vec![old, new],
        Target::Issue => vec![new, old],
        Target::TrustOut => vec![new],
        Target::Abort => vec![old],
    };
    if held != want {
        return Err(format!(
            "'{}' holds {} certificate(s), not the {} the stage wants",
            files.cert,
            held.len(),
            want.len()
        ));
    }
    if matches!(target, Target::TrustIn) {
        return Ok(());
    }
    let signer = &files::certs(root, &files)?[0];
    let unsigned = leaves_not_signed_by(&node, r.ca, signer, true);
    if unsigned.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not signed by the CA that signs now: {}",
            unsigned.join(", ")
        ))
    }
}

/// The leaves of `ca` on the node not signed by `signer` (renewable ones only, or all).
fn leaves_not_signed_by(
    node: &Node,
    ca: CaName,
    signer: &crate::pki::Cert,
    renewable: bool,
) -> Vec<String> {
    let inv = crate::node::inventory::take(node, 0, 0);
    let names = ca.catalog_names();
    inv.certificates
        .iter()
        .filter(|l| l.kind != crate::node::catalog::Kind::Ca)
        .filter(|l| {
            l.ca.as_deref()
                .is_some_and(|c| names.contains(&c.split('@').next().unwrap_or(c)))
        })
        .filter(|l| !renewable || l.renewable)
        .filter(|l| leaf_cert(node, l).is_none_or(|c| c.verify_signed_by(signer, "new").is_err()))
        .map(|l| l.name.clone())
        .collect()
}

fn leaf_cert(node: &Node, l: &crate::node::inventory::Record) -> Option<crate::pki::Cert> {
    if let Some(p) = &l.cert_path {
        return crate::pki::Cert::from_pem(&files::read(node.root(), p).ok()??).ok();
    }
    let entry = node.entries().iter().find(|e| e.name == l.name)?;
    let bytes = files::read(node.root(), &entry.path).ok()??;
    crate::node::carrier::Carrier::of_entry(entry)
        .cert_in(&bytes)
        .ok()
        .map(|(c, _)| c)
}

fn signer_is(root: &Path, files: &CaFiles, cert: &crate::pki::Cert) -> bool {
    files::certs(root, files).is_ok_and(|c| c.first().is_some_and(|f| f.der == cert.der))
}

fn old_pair(root: &Path, files: &CaFiles, r: &Rotation) -> Result<CaPair, RotateError> {
    files::pair(root, files, &r.old_sha256)
        .map_err(RotateError::Refused)?
        .ok_or_else(|| {
            RotateError::Refused(format!(
                "the old CA (SHA-256 {}) or its key is no longer in '{}' and the key files beside \
                 it: the files were changed outside certrotor; restore them from a backup \
                 ('certrotor backups')",
                r.old_sha256, files.cert
            ))
        })
}

/// The CA's files: its certificate file and key, as the catalog knows them.
fn ca_files(node: &Node, ca: CaName) -> Result<CaFiles, RotateError> {
    let names = ca.catalog_names();
    node.entries()
        .iter()
        .filter(|e| e.kind == crate::node::catalog::Kind::Ca)
        .filter(|e| names.contains(&e.name.split('@').next().unwrap_or(&e.name)))
        .find(|e| files::read(node.root(), &e.path).is_ok_and(|b| b.is_some()))
        .and_then(|e| Some(CaFiles::of(&e.path, e.key_path.as_deref()?)))
        .ok_or_else(|| {
            RotateError::Refused(format!("no {} with a key file on this node", ca.name()))
        })
}

/// The plan of `ca` on this node and its static pods.
fn plan_here(
    node: &Node,
    ca: CaName,
    opts: &RunOptions,
) -> Result<(CaPlan, Vec<(String, PodInfo)>), RotateError> {
    let pods = pods_here(node, opts)?;
    let versions = restart::reload::versions(&pods, &Default::default());
    let plan = plan(node, ca, &pods, &versions, opts.write.clock.now())
        .map_err(|e| RotateError::Refused(e.to_string()))?;
    Ok((plan, pods))
}

/// The static pods of this node as the platform lists them (platform none: the kubelet's
/// manifests, when the node has them).
fn pods_here(node: &Node, opts: &RunOptions) -> Result<Vec<(String, PodInfo)>, RotateError> {
    let mut platform = restart::detect(node.root(), &opts.restart).map_err(OpsError::Platform)?;
    if matches!(platform, Platform::None) {
        // Nothing is restarted, but what the node runs still decides what a rotation may do:
        // the kubelet's manifests, when the node has them.
        let manifests = node
            .root()
            .join(crate::node::catalog::paths::KUBEADM_MANIFESTS);
        if manifests.is_dir() {
            platform = Platform::Kubeadm { manifests };
        }
    }
    Ok(restart::pods(&platform).map_err(OpsError::Platform)?)
}

/// What this release cannot rotate yet, refused with the reason.
fn refuse_unbuilt(
    ca: CaName,
    plan: &CaPlan,
    pods: &[(String, PodInfo)],
    shared: Option<&Shared>,
) -> Result<(), RotateError> {
    if ca == CaName::Ca {
        return Err(RotateError::Refused(
            "rotating the cluster CA is not built yet: kube-controller-manager signs with \
             ca.crt and refuses a file of more than one certificate, so its signer must first \
             move to a file of its own ('certrotor ca plan --ca ca' lists what it touches)"
                .into(),
        ));
    }
    let runs = |c: Component| pods.iter().any(|(_, p)| p.component() == Some(c));
    if !runs(Component::KubeApiserver) || (ca == CaName::EtcdCa && !runs(Component::Etcd)) {
        return Err(RotateError::Refused(format!(
            "{} is shared with other nodes here ({}): rotating a CA across an external etcd \
             topology is not built yet; certrotor rotates a CA on stacked control planes (each \
             with its own etcd member), taking turns through etcd",
            ca.name(),
            if runs(Component::KubeApiserver) {
                "an external etcd"
            } else {
                "no kube-apiserver runs on this node: the control planes elsewhere trust it"
            }
        )));
    }
    let members = etcd_members(pods);
    if members > 1 && shared.is_none() {
        return Err(RotateError::Refused(format!(
            "this node's etcd names {members} members and cannot be reached (or --cluster \
             off): a rotation across nodes takes turns through etcd"
        )));
    }
    let ca_paths: Vec<&str> = plan.certificates.iter().map(|c| c.path.as_str()).collect();
    if let Some(t) = plan
        .trust
        .iter()
        .filter(|t| t.holds_ca)
        .find(|t| t.file.as_deref().is_some_and(|f| !ca_paths.contains(&f)))
    {
        return Err(RotateError::Refused(format!(
            "{} trusts {} through '{}', a file other than the CA's own: not built yet",
            t.consumer,
            ca.name(),
            t.file.as_deref().unwrap_or("?")
        )));
    }
    Ok(())
}

/// On a running cluster (a platform that restarts, and an admin kubeconfig): refuses when the
/// apiserver lists another control-plane Node, or cannot be asked.
fn alone(node: &Node, opts: &RunOptions, shared: Option<&Shared>) -> Result<(), RotateError> {
    let platform = restart::detect(node.root(), &opts.restart).map_err(OpsError::Platform)?;
    let Some(admin) = events::admin_conf(node) else {
        return Ok(());
    };
    if matches!(platform, Platform::None) {
        return Ok(());
    }
    let mut names = std::collections::BTreeSet::new();
    for role in ["control-plane", "master"] {
        let path = format!("/api/v1/nodes?labelSelector=node-role.kubernetes.io/{role}");
        let list = events::get(node, &admin, &path).map_err(|e| {
            RotateError::Refused(format!(
                "cannot ask kube-apiserver whether other control planes share the CA ({e})"
            ))
        })?;
        for item in list["items"].as_array().into_iter().flatten() {
            if let Some(n) = item["metadata"]["name"].as_str() {
                names.insert(n.to_string());
            }
        }
    }
    let members = shared.map_or(1, |s| s.members.len());
    if names.len() > members.max(1) {
        return Err(RotateError::Refused(format!(
            "the cluster has {} control-plane nodes ({}) and {members} etcd member(s) here: a \
             control plane outside the etcd members (external etcd) cannot take turns with this \
             one; rotating a CA across those nodes is not built yet",
            names.len(),
            names.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

/// The cluster, when this node's etcd has other members and answers: `None` acting alone.
fn connect(
    node: &Node,
    pods: &[(String, PodInfo)],
    opts: &RunOptions,
) -> Result<Option<Shared>, RotateError> {
    if etcd_members(pods) <= 1 {
        return Ok(None);
    }
    let session = match crate::cluster::Session::start(node, pods, &opts.cluster) {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        Err(e) => {
            log::warn!("rotation: etcd cannot be reached: {e}");
            return Ok(None);
        }
    };
    let members = match session.client.members() {
        Ok(m) => m,
        Err(e) => {
            log::warn!("rotation: etcd cannot be reached: {e}");
            return Ok(None);
        }
    };
    Ok(Some(Shared {
        members: members.into_iter().map(|m| m.name).collect(),
        session,
    }))
}

/// [`connect`] for a stage, found again each time: a stage changes the files the etcd client
/// trusts and presents.
fn with_shared(root: &Path, opts: &RunOptions) -> Result<Option<Shared>, RotateError> {
    let node = Node::discover(root);
    let pods = pods_here(&node, opts)?;
    connect(&node, &pods, opts)
}

/// What keeps this node from the stage after `stage`: the members that have not reached it
/// yet, or one that aborted (a text saying what to run); `None` to go on.
fn waiting(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    stage: Stage,
) -> Result<Option<String>, RotateError> {
    let Some(s) = with_shared(root, opts)? else {
        return Ok(None);
    };
    let e = |e: String| RotateError::Stopped(format!("the rotation in etcd: {e}"));
    // This node's own stage again: a run that reached it with etcd out of reach did not
    // record it there.
    s.reached(r.ca, &r.old_sha256, r.stage, opts.write.clock.now())
        .map_err(e)?;
    let aborted = s.aborted(r.ca, &r.old_sha256).map_err(e)?;
    if !aborted.is_empty() {
        return Err(RotateError::Stopped(format!(
            "the rotation of {} was aborted on {}: run 'certrotor ca abort --ca {}' on every node",
            r.ca.name(),
            aborted.join(", "),
            r.ca.name()
        )));
    }
    let behind = s.behind(r.ca, &r.old_sha256, stage).map_err(e)?;
    if behind.is_empty() {
        return Ok(None);
    }
    Ok(Some(format!(
        "this node reached {}; waiting for {} to reach it: run 'certrotor ca {} --ca {}' there, \
         then here again",
        r.stage.name(),
        behind.join(", "),
        "rotate",
        r.ca.name()
    )))
}

/// The members a node's etcd or kube-apiserver names (`--initial-cluster`, `--etcd-servers`).
fn etcd_members(pods: &[(String, PodInfo)]) -> usize {
    let count = |flag: &str| {
        pods.iter()
            .filter_map(|(_, p)| p.flag(flag))
            .map(|v| v.split(',').filter(|s| !s.trim().is_empty()).count())
            .max()
            .unwrap_or(0)
    };
    count("initial-cluster").max(count("etcd-servers"))
}

fn pass_failure(pass: &RunReport) -> String {
    if let Some(rb) = &pass.rolled_back {
        return format!(
            "{}; the stage's files were restored from backup {}",
            rb.failure, rb.backup_id
        );
    }
    if !pass.pod_errors.is_empty() {
        return pass.pod_errors.join("; ");
    }
    "see the log above".into()
}

fn state_io(root: &Path, e: std::io::Error) -> RotateError {
    RotateError::Stopped(format!(
        "cannot write '{}': {e}",
        crate::ca::rotation::path(root).display()
    ))
}

fn report(
    root: &Path,
    r: &Rotation,
    stages: Vec<StageDone>,
    opts: &RunOptions,
) -> Result<RotateReport, RotateError> {
    // After the stages: a failure here stops a command whose stages stand.
    let stopped = |e: RotateError| match e {
        RotateError::Refused(s) => RotateError::Stopped(s),
        other => other,
    };
    let node = Node::discover(root);
    let (plan, _) = plan_here(&node, r.ca, opts).map_err(stopped)?;
    let files = ca_files(&node, r.ca).map_err(stopped)?;
    let old_leaves = match files::pair(root, &files, &r.new_sha256) {
        Ok(Some(n)) if r.stage >= Stage::Issued && r.stage <= Stage::Done => {
            leaves_not_signed_by(&node, r.ca, &n.cert, false)
        }
        _ => vec![],
    };
    let next = match r.stage {
        Stage::Issued => format!(
            "every leaf on this node is issued by the new CA and every consumer trusts both; \
             update what trusts the old CA outside the node (below), then run 'certrotor ca \
             continue --ca {}' for trust-out (or 'certrotor ca abort --ca {}')",
            r.ca.name(),
            r.ca.name()
        ),
        Stage::Done => "done: the node trusts the new CA alone".into(),
        Stage::Aborted => "aborted: the node trusts the old CA alone".into(),
        s => format!("stage {} in progress: run the same command again", s.name()),
    };
    Ok(RotateReport {
        ca: r.ca,
        stage: r.stage.name(),
        old_sha256: r.old_sha256.clone(),
        new_sha256: r.new_sha256.clone(),
        stages,
        next,
        outside: plan.outside,
        old_leaves,
    })
}
