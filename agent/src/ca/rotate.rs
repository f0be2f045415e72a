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
//! The cluster CA also changes every kubeconfig's CA data and moves kube-controller-manager's
//! signer to a file of its own until trust-out ([`cluster`]); its trust-in waits until this
//! node's kube-apiserver authenticates clients of the new CA ([`live`]).
//!
//! On an external etcd, the etcd CA's control planes follow the etcd nodes: they hold the CA's
//! certificate only ([`files::CaFiles::trust_only`]), take the new one from etcd and, at the
//! issue, the apiserver-etcd-client pair an etcd node publishes ([`external`]).
//!
//! On Bottlerocket the cluster CA's signer and the kubelet's trust are settings of the API: they
//! follow the files through it ([`bottlerocket`]).
//!
//! What is not built yet, and refused with the reason: the cluster and front-proxy CAs on an external etcd's control planes, or with control planes outside the
//! etcd members (they cannot take turns through the members' records); a trust file other than
//! the CA file itself.

mod bottlerocket;
mod check;
mod cluster;
mod error;
mod external;
pub mod files;
mod guard;
mod live;
mod shared;
pub use error::RotateError;
pub use shared::{MemberStage, member_stages};
mod stage;

use std::path::Path;

use serde::Serialize;

use crate::ca::consumers::CaName;
use crate::ca::kubeadm_config::CaPolicy;
use crate::ca::plan::{CaPlan, plan};
use crate::ca::rotation::{Rotation, Stage};
use crate::node::Node;
use crate::node::manifests::PodInfo;
use crate::pass::events;
use crate::pass::ops::{self, OpsError};
use crate::pass::run::{RunOptions, RunReport};
use crate::restart::{self, Platform};
use check::{check, leaves_not_signed_by, signer_is};
use external::{external_etcd_ready, no_record, pair_waiting, trust_only, trusts_external_etcd};
use files::{CaFiles, CaPair, Target};
use guard::{abort_waiting, alone, connect, refuse_unbuilt, waiting, with_shared};
use stage::{published, stage_files, stage_files_with};

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
    /// Front-proxy and cluster CAs: how long kube-apiserver took to publish the new trust bundle.
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
    let _one = one_command(root, opts)?;
    failed(root, ca, opts, rotate_stages(root, ca, opts))
}

/// The node's rotation lock ([`crate::txn::rotation_lock`]), waiting at most `--lock-timeout`:
/// a rotation command never interleaves with another, or with the daemon's step of it.
fn one_command(root: &Path, opts: &RunOptions) -> Result<crate::txn::Lock, RotateError> {
    crate::txn::rotation_lock(root, opts.write.lock_timeout)
        .map_err(|e| RotateError::Ops(OpsError::Txn(e)))
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
        let mut wait = waiting(root, &r, opts, Stage::Trusted)?;
        if wait.is_none() && r.stage == Stage::Trusted && trust_only(root, ca)? {
            wait = pair_waiting(root, &r, opts, &r.new_sha256)?;
        }
        if let Some(waiting) = wait {
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
    let _one = one_command(root, opts)?;
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
    let _one = one_command(root, opts)?;
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
    let mut signs_new = !r.new_sha256.is_empty()
        && files::pair(root, &files, &r.new_sha256)
            .map_err(RotateError::Refused)?
            .is_some_and(|n| signer_is(root, &files, &n.cert));
    if files.trust_only && !signs_new && !r.new_sha256.is_empty() {
        // A node that only trusts the CA issues nothing: its leaves say whether the old CA's
        // pair is still to be installed (an abort whose install failed after its files moved).
        let old = old_pair(root, &files, &r)?;
        signs_new = !leaves_not_signed_by(&node, ca, &old.cert, false).is_empty();
    }
    if r.stage != Stage::Abort {
        r.enter(root, Stage::Abort, opts.write.clock.now())
            .map_err(|e| state_io(root, e))?;
    }
    if signs_new && files.trust_only {
        // A control plane of an external etcd takes the old CA's pair from the etcd nodes.
        if let Some(waiting) = pair_waiting(root, &r, opts, &r.old_sha256)? {
            return report(root, &r, done, opts).map(|mut rep| {
                rep.next = waiting;
                rep
            });
        }
    }
    if signs_new {
        // The leaves were issued by the new CA: the old one signs again and issues them.
        let mut reissue = stage_files(root, &r, opts, Stage::Abort, Target::TrustIn)?;
        reissue.stage = "abort: issue by the old CA";
        done.push(reissue);
    }
    if let Some(waiting) = abort_waiting(root, &r, opts)? {
        return report(root, &r, done, opts).map(|mut rep| {
            rep.next = waiting;
            rep
        });
    }
    done.push(step(root, &mut r, opts, (Stage::Abort, Stage::Aborted))?);
    report(root, &r, done, opts)
}

/// How soon the daemon looks again at a rotation that waits for other nodes.
pub const ADVANCE_AGAIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The daemon's part in a rotation, between its passes: a stage in progress on this node is
/// resumed (after a crash), a trust-in that waits for the other members goes on to the issue
/// once they are trusted, an abort that waits for them finishes once they have aborted. It
/// never begins a rotation, trust-out or an abort: those stay the operator's ('ca rotate',
/// 'ca continue', 'ca abort'). `Some(d)`: the rotation still waits for other nodes, look again
/// within `d`; a failed stage waits for the daemon's next pass.
pub fn advance(root: &Path, opts: &RunOptions) -> Option<std::time::Duration> {
    if let Ok(loaded) = Rotation::load(root)
        && loaded.is_none_or(|r| r.stage.finished())
    {
        return None;
    }
    // An operator's command on this node has the rotation: look again soon.
    let _one = match crate::txn::rotation_lock(root, std::time::Duration::ZERO) {
        Ok(lock) => lock,
        Err(crate::txn::TxnError::Locked { .. }) => return Some(ADVANCE_AGAIN),
        Err(e) => {
            log::warn!("CA rotation: {e}");
            return None;
        }
    };
    // The stage as it is under the lock (the command before may have moved it).
    let r = match Rotation::load(root) {
        Ok(Some(r)) if !r.stage.finished() => r,
        Ok(_) => return None,
        Err(e) => {
            log::warn!("CA rotation: {e}");
            return None;
        }
    };
    let ca = r.ca;
    let result = match r.stage {
        Stage::TrustIn | Stage::Trusted | Stage::Issue => {
            failed(root, ca, opts, rotate_stages(root, ca, opts))
        }
        Stage::TrustOut => failed(root, ca, opts, trust_out(root, ca, opts)),
        Stage::Abort => failed(root, ca, opts, abort_stages(root, ca, opts)),
        Stage::Issued | Stage::Done | Stage::Aborted => return None,
    };
    match result {
        Ok(rep) => {
            log::info!(
                "CA rotation of {}: stage {}: {}",
                r.ca.name(),
                rep.stage,
                rep.next
            );
            matches!(rep.stage, "trusted" | "abort").then_some(ADVANCE_AGAIN)
        }
        Err(e) => {
            log::warn!("CA rotation of {}: {e}", r.ca.name());
            None
        }
    }
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
    let lock = ops::lock_and_recover_with(root, opts.write.lock_timeout, Some(&opts.restart))?;
    let node = Node::discover(root);
    let (plan, pods) = plan_here(&node, ca, opts)?;
    refuse_unbuilt(ca, &plan, &pods)?;
    let files = ca_files(&node, ca)?;
    if ca == CaName::Ca {
        cluster::refuse(&node, &pods, &files).map_err(RotateError::Refused)?;
        bottlerocket::api(&node, opts)?;
    }
    let shared = connect(&node, &pods, opts, ca)?;
    alone(&node, opts, shared.as_ref())?;
    if ca == CaName::EtcdCa {
        external_etcd_ready(&files, shared.as_ref(), &pods)?;
    }
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
    if let Some(s) = &shared {
        s.begin(ca, &old.sha256_hex())
            .map_err(RotateError::Refused)?;
        if files.trust_only {
            // A control plane of an external etcd follows: an etcd node mints the new CA. The
            // wait (up to --cluster-wait) does not hold the node lock: this node's daemon and
            // its passes go on meanwhile; nothing here has changed yet.
            drop(lock);
            let bound = (opts.cluster.wait, std::time::Duration::from_secs(1));
            if !s
                .wait_for_record(ca, &old.sha256_hex(), bound)
                .map_err(RotateError::Refused)?
            {
                return Err(RotateError::Refused(format!(
                    "no etcd node has begun the rotation of {} (waited {} s): the etcd nodes \
                     hold its key and make the new CA; run 'certrotor ca rotate --ca {}' on \
                     an etcd node, then here again",
                    ca.name(),
                    opts.cluster.wait.as_secs(),
                    ca.name()
                )));
            }
        }
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
    let mine = match r.new_sha256.is_empty() {
        true => None,
        false => files::pair(root, &files, &r.new_sha256).map_err(RotateError::Refused)?,
    };
    let shared = with_shared(root, opts, r.ca)?;
    let new = match (mine, shared) {
        // Resumed with its new CA in the files, alone: nothing to agree on.
        (Some(_), None) => {
            return stage_with(root, r, opts, (Stage::TrustIn, Stage::Trusted), None);
        }
        // Resumed on a cluster: its new CA must be the cluster's (published now if etcd holds
        // none, as when an aborted rotation was removed meanwhile). Another one is taken instead:
        // in trust-in no leaf of this node's is signed by it yet.
        (Some(mine), Some(s)) => {
            let theirs = s
                .new_ca(r.ca, &r.old_sha256, || match files.trust_only {
                    false => Ok(mine),
                    true => Err(no_record(r.ca)),
                })
                .map_err(RotateError::Stopped)?;
            if theirs.cert.sha256_hex() == r.new_sha256 {
                return stage_with(root, r, opts, (Stage::TrustIn, Stage::Trusted), None);
            }
            log::warn!(
                "rotation of {}: the cluster rotates to the new CA {}, not this node's {}: taking \
                 the cluster's",
                r.ca.name(),
                theirs.cert.sha256_hex(),
                r.new_sha256
            );
            theirs
        }
        (None, shared) => {
            let old = old_pair(root, &files, r)?;
            let mint = || {
                if files.trust_only {
                    return Err(no_record(r.ca));
                }
                let policy = ca_policy(root, opts)?;
                files::mint(&old, &policy, opts.write.clock.now())
            };
            match shared {
                Some(s) => s.new_ca(r.ca, &r.old_sha256, mint),
                None => mint(),
            }
            .map_err(RotateError::Refused)?
        }
    };
    // A node that only trusts the CA keeps no key of it.
    let new = match files.trust_only {
        true => CaPair::cert_only(new.cert.clone()),
        false => new,
    };
    r.new_sha256 = new.cert.sha256_hex();
    // Recorded before the files: a crash in between makes another one, never a second new CA in
    // the files.
    r.enter(root, Stage::TrustIn, opts.write.clock.now())
        .map_err(|e| state_io(root, e))?;
    stage_with(root, r, opts, (Stage::TrustIn, Stage::Trusted), Some(new))
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
    check(root, r, target, opts).map_err(|detail| RotateError::Check {
        stage: doing,
        detail,
    })?;
    // Recorded in etcd before the front-proxy's publish wait: of two nodes ending trust-out
    // (or an abort) at once, the later to record sees the other finished and removes the CA
    // from the published bundle.
    if let Some(s) = with_shared(root, opts, r.ca)? {
        s.reached(r.ca, &r.old_sha256, reached, opts.write.clock.now())
            .map_err(|e| RotateError::Stopped(format!("recording the stage in etcd: {e}")))?;
        if reached == Stage::Done {
            match s.forget_key(r.ca, &r.old_sha256) {
                Ok(true) => log::info!(
                    "rotation of {}: every node finished; the new CA's key was removed from etcd",
                    r.ca.name()
                ),
                Ok(false) => {}
                Err(e) => log::warn!(
                    "rotation of {}: removing its key from etcd: {e}",
                    r.ca.name()
                ),
            }
        }
    }
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
    Ok(done)
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

/// What the cluster's kubeadm configuration asks of a new CA (kubeadm 1.31+), read through
/// kube-apiserver where the platform runs one; a lab node follows the old CA.
fn ca_policy(root: &Path, opts: &RunOptions) -> Result<CaPolicy, String> {
    let platform = restart::detect(root, &opts.restart).map_err(|e| e.to_string())?;
    if matches!(platform, Platform::None) {
        return Ok(CaPolicy::default());
    }
    crate::ca::kubeadm_config::read(&Node::discover(root))
}

/// The CA's files: its certificate file and key, as the catalog knows them; on a control plane
/// of an external etcd, the etcd CA's certificate alone ([`CaFiles::trust_only`]).
fn ca_files(node: &Node, ca: CaName) -> Result<CaFiles, RotateError> {
    let names = ca.catalog_names();
    let entry = node
        .entries()
        .iter()
        .filter(|e| e.kind == crate::node::catalog::Kind::Ca)
        .filter(|e| names.contains(&e.name.split('@').next().unwrap_or(&e.name)))
        .find(|e| files::read(node.root(), &e.path).is_ok_and(|b| b.is_some()));
    let missing = || RotateError::Refused(format!("no {} with a key file on this node", ca.name()));
    let entry = entry.ok_or_else(missing)?;
    if trusts_external_etcd(node, ca) {
        return Ok(CaFiles::trust_only(&entry.path));
    }
    let key = entry.key_path.as_deref().ok_or_else(missing)?;
    Ok(CaFiles::of(&entry.path, key))
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
    if let Some(e) = pass.cluster.as_ref().and_then(|c| c.pair_error.as_ref()) {
        return format!("the apiserver-etcd-client pair: {e}");
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
