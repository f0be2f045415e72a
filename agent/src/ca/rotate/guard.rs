//! What may rotate here: the refusals (what is not built yet, control planes outside the etcd
//! members) and the cluster a stacked node takes turns with.

use std::path::Path;

use super::shared::Shared;
use super::{RotateError, pods_here};
use crate::ca::consumers::CaName;
use crate::ca::plan::CaPlan;
use crate::ca::rotation::{Rotation, Stage};
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};
use crate::pass::events;
use crate::pass::ops::OpsError;
use crate::pass::run::RunOptions;
use crate::restart::{self, Platform};

/// What this release cannot rotate yet, refused with the reason.
pub(super) fn refuse_unbuilt(
    ca: CaName,
    plan: &CaPlan,
    pods: &[(String, PodInfo)],
) -> Result<(), RotateError> {
    // The etcd CA rotates on an external etcd too: its etcd nodes (no kube-apiserver) sign, its
    // control planes (no etcd member) follow them through etcd. The other CAs are the control
    // planes' own, and those take turns through etcd only as its members (stacked).
    if !stacked(pods) && ca != CaName::EtcdCa {
        return Err(RotateError::Refused(format!(
            "{} is shared with other nodes here ({}): rotating it across an external etcd \
             topology is not built yet; certrotor rotates the cluster and front-proxy CAs on \
             stacked control planes (each with its own etcd member), and the etcd CA on both",
            ca.name(),
            if runs(pods, Component::KubeApiserver) {
                "the control planes of an external etcd"
            } else {
                "no kube-apiserver runs on this node: the control planes elsewhere trust it"
            }
        )));
    }
    let ca_paths: Vec<&str> = plan.certificates.iter().map(|c| c.path.as_str()).collect();
    if let Some(t) = plan
        .trust
        .iter()
        // Kubeconfigs' embedded CA data is the cluster CA's own to change, and Bottlerocket's
        // kubelet trust follows the CA file through the API (`super::bottlerocket`).
        .filter(|t| t.holds_ca && t.source != "certificate-authority-data")
        .filter(|t| t.source != super::bottlerocket::CLUSTER_CERTIFICATE)
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

/// How long the control-plane Nodes are asked for before a rotation is refused.
const ASK_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// On a running cluster (a platform that restarts, and an admin kubeconfig): refuses when the
/// apiserver lists another control-plane Node, or cannot be asked.
pub(super) fn alone(
    node: &Node,
    opts: &RunOptions,
    shared: Option<&Shared>,
) -> Result<(), RotateError> {
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
        // A busy kube-apiserver may not answer at once: asked again for up to a minute.
        let ask_for = opts.restart.timeout.min(ASK_FOR);
        let deadline = std::time::Instant::now() + ask_for;
        let list = loop {
            match events::get(node, &admin, &path) {
                Ok(list) => break list,
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(RotateError::Refused(format!(
                        "cannot ask kube-apiserver whether other control planes share the CA \
                         ({e}; asked again for {} s)",
                        ask_for.as_secs()
                    )));
                }
                Err(e) => {
                    log::warn!("asking kube-apiserver for the control-plane Nodes: {e}; again");
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
            }
        };
        for item in list["items"].as_array().into_iter().flatten() {
            if let Some(n) = item["metadata"]["name"].as_str() {
                names.insert(n.to_string());
            }
        }
    }
    // An external etcd's control planes: the etcd nodes know of those that registered in etcd
    // only, and would issue server certificates a control plane they do not know of does not
    // trust yet.
    if let Some(s) = shared.filter(|s| !s.elsewhere.is_empty())
        && names.len() > s.elsewhere.len()
    {
        return Err(RotateError::Refused(format!(
            "the cluster has {} control-plane nodes ({}) and {} registered in etcd by certrotor \
             ({}): the etcd nodes would not wait for the others; run certrotor (its daemon, or \
             'certrotor run --once') on every control plane, then this command again",
            names.len(),
            names.iter().cloned().collect::<Vec<_>>().join(", "),
            s.elsewhere.len(),
            s.elsewhere.join(", ")
        )));
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

/// The cluster this node takes turns with: `None` when its etcd has no other member and no
/// control plane elsewhere trusts it. An etcd of several members that cannot be reached (or
/// `--cluster off`) is refused: a node acting alone there would mint a CA of its own, or issue
/// before the others trust it.
///
/// The nodes of the rotation are the etcd members; for the etcd CA, also the control planes
/// registered in etcd that are not members (an external etcd's: they trust the CA and present
/// its client certificates, so no member issues before they trust the new CA).
pub(super) fn connect(
    node: &Node,
    pods: &[(String, PodInfo)],
    opts: &RunOptions,
    ca: CaName,
) -> Result<Option<Shared>, RotateError> {
    let members = etcd_members(pods);
    if members <= 1 && (ca != CaName::EtcdCa || stacked(pods)) {
        return Ok(None);
    }
    let unreachable = |why: String| {
        RotateError::Refused(format!(
            "this node's etcd names {members} member{} and cannot be reached ({why}): a \
             rotation across nodes takes turns through etcd; run the same command again when \
             etcd answers",
            if members == 1 { "" } else { "s" }
        ))
    };
    let session = match crate::cluster::Session::start(node, pods, &opts.cluster) {
        Ok(Some(s)) => s,
        Ok(None) => return Err(unreachable("--cluster off".into())),
        Err(e) => return Err(unreachable(e.to_string())),
    };
    let now = opts.write.clock.now();
    let (mut names, elsewhere) = super::shared::participants(&session.client, ca, now)
        .map_err(|e| unreachable(e.to_string()))?;
    names.extend(elsewhere.iter().cloned());
    Ok(Some(Shared {
        members: names,
        elsewhere,
        session,
    }))
}

/// [`connect`] for a stage, found again each time: a stage changes the files the etcd client
/// trusts and presents.
pub(super) fn with_shared(
    root: &Path,
    opts: &RunOptions,
    ca: CaName,
) -> Result<Option<Shared>, RotateError> {
    let node = Node::discover(root);
    let pods = pods_here(&node, opts)?;
    connect(&node, &pods, opts, ca).map_err(|e| match e {
        RotateError::Refused(s) => RotateError::Stopped(s),
        other => other,
    })
}

/// What keeps this node from the stage after `stage`: the members that have not reached it
/// yet, or one that aborted (a text saying what to run); `None` to go on.
pub(super) fn waiting(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    stage: Stage,
) -> Result<Option<String>, RotateError> {
    let Some(s) = with_shared(root, opts, r.ca)? else {
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

/// An abort across nodes, before the new CA leaves this node's trust files: records that this
/// node's leaves are issued by the old CA again (stage `abort` in etcd), then names the members
/// that have not (they may still present leaves of the new CA); `None` to go on.
pub(super) fn abort_waiting(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
) -> Result<Option<String>, RotateError> {
    let Some(s) = with_shared(root, opts, r.ca)? else {
        return Ok(None);
    };
    let e = |e: String| RotateError::Stopped(format!("the rotation in etcd: {e}"));
    s.reached(r.ca, &r.old_sha256, Stage::Abort, opts.write.clock.now())
        .map_err(e)?;
    // The members that recorded a stage and have not aborted; one with no stage never trusted
    // the new CA, and has no leaf of it.
    let pending = s.not_aborting(r.ca, &r.old_sha256).map_err(e)?;
    if pending.is_empty() {
        return Ok(None);
    }
    Ok(Some(format!(
        "this node's leaves are issued by the old CA again; the new CA leaves its trust files \
         once {} have too: run 'certrotor ca abort --ca {}' there, then here again",
        pending.join(", "),
        r.ca.name()
    )))
}

/// Whether this node runs `c` as a static pod.
pub(super) fn runs(pods: &[(String, PodInfo)], c: Component) -> bool {
    pods.iter().any(|(_, p)| p.component() == Some(c))
}

/// A stacked control plane: kube-apiserver and an etcd member on one node.
fn stacked(pods: &[(String, PodInfo)]) -> bool {
    runs(pods, Component::KubeApiserver) && runs(pods, Component::Etcd)
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
