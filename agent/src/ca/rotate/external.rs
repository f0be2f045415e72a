//! The etcd CA across an external etcd: its control planes hold the CA's certificate only
//! ([`CaFiles::trust_only`]) and follow the etcd nodes, which hold its key, through etcd: the
//! new CA's certificate from the rotation's record, at the issue (and at an abort after it)
//! the apiserver-etcd-client pair an etcd node publishes.

use std::path::Path;

use super::files::{self, CaFiles};
use super::guard::with_shared;
use super::shared::Shared;
use super::{RotateError, ca_files};
use crate::ca::consumers::CaName;
use crate::ca::rotation::Rotation;
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};
use crate::pass::run::RunOptions;

/// The etcd CA across an external etcd: a control plane (which holds no key of it) needs the
/// etcd nodes through etcd; an etcd node that runs no kube-apiserver needs the control planes
/// that trust it registered there (each one's certrotor registers it at every pass), or it
/// would issue server certificates their apiservers do not trust yet.
pub(super) fn external_etcd_ready(
    files: &CaFiles,
    shared: Option<&Shared>,
    pods: &[(String, PodInfo)],
) -> Result<(), RotateError> {
    let runs_apiserver = super::guard::runs(pods, Component::KubeApiserver);
    match shared {
        None if files.trust_only => Err(RotateError::Refused(
            "this control plane trusts an external etcd, and a rotation of its CA follows the \
             etcd nodes through etcd: run the same command again when etcd answers (not with \
             --cluster off)"
                .into(),
        )),
        Some(s) if !runs_apiserver && s.elsewhere.is_empty() => Err(RotateError::Refused(
            "no control plane that trusts this etcd has registered in etcd: run certrotor on \
             every control plane first ('certrotor run --once', or its daemon), so that the \
             etcd nodes wait for them to trust the new CA before they issue from it"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Why a node that only trusts a CA cannot go on without the etcd nodes' record of it.
pub(super) fn no_record(ca: CaName) -> String {
    format!(
        "the rotation of {} is no longer in etcd (aborted on every node meanwhile?): the etcd \
         nodes hold its key and make the new CA; run 'certrotor ca abort --ca {}' here, then \
         begin on an etcd node again",
        ca.name(),
        ca.name()
    )
}

/// Whether this node only trusts `ca` ([`CaFiles::trust_only`]).
pub(super) fn trust_only(root: &Path, ca: CaName) -> Result<bool, RotateError> {
    Ok(ca_files(&Node::discover(root), ca)?.trust_only)
}

/// Whether this node is a control plane of an external etcd rotating the etcd CA: it trusts
/// the CA (kube-apiserver's `--etcd-cafile`) and holds no key of it; it follows the etcd nodes.
pub(super) fn trusts_external_etcd(node: &Node, ca: CaName) -> bool {
    ca == CaName::EtcdCa
        && node
            .layouts()
            .iter()
            .any(|l| l.etcd == crate::node::catalog::EtcdTopology::External)
}

/// A control plane of an external etcd, before it takes the apiserver-etcd-client pair of the
/// CA of SHA-256 `signer` (at the issue the new CA, at an abort after it the old): what it
/// waits for while no etcd node has published a pair that CA signed; `None` to go on.
pub(super) fn pair_waiting(
    root: &Path,
    r: &Rotation,
    opts: &RunOptions,
    signer: &str,
) -> Result<Option<String>, RotateError> {
    let Some(s) = with_shared(root, opts, r.ca)? else {
        return Ok(None);
    };
    let node = Node::discover(root);
    let files = ca_files(&node, r.ca)?;
    let ca = files::pair(root, &files, signer)
        .map_err(RotateError::Stopped)?
        .ok_or_else(|| {
            RotateError::Stopped(format!(
                "'{}' no longer holds the CA {signer} that this node's rotation recorded \
                 (another tool changed it): 'certrotor backups' lists the stage's backup, \
                 'certrotor rollback' restores it",
                files.cert
            ))
        })?;
    let published = crate::cluster::published_cert(&s.session)
        .map_err(|e| RotateError::Stopped(format!("etcd: {e}")))?;
    if published.is_some_and(|p| p.verify_signed_by(&ca.cert, r.ca.name()).is_ok()) {
        return Ok(None);
    }
    let (which, run) = match signer == r.new_sha256 {
        true => ("new", "rotate"),
        false => ("old", "abort"),
    };
    Ok(Some(format!(
        "this node reached {}; waiting for an etcd node to publish an apiserver-etcd-client \
         pair of the {which} CA through etcd: run 'certrotor ca {run} --ca {}' on the etcd \
         nodes, then here again",
        r.stage.name(),
        r.ca.name()
    )))
}
