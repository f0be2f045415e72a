//! What a stage leaves on disk, checked from the files: the CA file's certificates and the
//! signer of every leaf of the CA.

use std::path::Path;

use super::files::{self, CaFiles, Target};
use super::{ca_files, pods_here};
use crate::ca::consumers::CaName;
use crate::ca::rotation::Rotation;
use crate::node::Node;
use crate::pass::run::RunOptions;

/// Checks the files after a stage: the CA file holds what the target says, and (from the
/// issue on) every renewable leaf is signed by the new CA (at an abort, by the old).
pub(super) fn check(
    root: &Path,
    r: &Rotation,
    target: Target,
    opts: &RunOptions,
) -> Result<(), String> {
    let node = Node::discover(root);
    let (files, held) = held(&node, r.ca)?;
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
    let certs = files::certs(root, &files)?;
    if r.ca == CaName::Ca {
        let pods = pods_here(&node, opts).map_err(|e| e.to_string())?;
        super::cluster::check(
            &node,
            &pods,
            &files,
            (target, &certs),
            opts.write.clock.now(),
        )?;
    }
    if matches!(target, Target::TrustIn) {
        return Ok(());
    }
    let signer = &certs[0];
    // A node that only trusts the CA renews none of its leaves: every one is checked (the
    // pair the etcd nodes published, installed by the stage's pass).
    let unsigned = leaves_not_signed_by(&node, r.ca, signer, !files.trust_only);
    if unsigned.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "not signed by the CA that signs now: {}",
            unsigned.join(", ")
        ))
    }
}

/// The CA's files and the SHA-256 of each certificate its file holds, in order.
pub(super) fn held(node: &Node, ca: CaName) -> Result<(CaFiles, Vec<String>), String> {
    let files = ca_files(node, ca).map_err(|e| e.to_string())?;
    let shas = files::certs(node.root(), &files)?
        .iter()
        .map(|c| c.sha256_hex())
        .collect();
    Ok((files, shas))
}

/// The leaves of `ca` on the node not signed by `signer` (renewable ones only, or all).
pub(super) fn leaves_not_signed_by(
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
        .filter(|l| !renewable || l.renewable || l.name == crate::node::kubelet::CLIENT)
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

pub(super) fn signer_is(root: &Path, files: &CaFiles, cert: &crate::pki::Cert) -> bool {
    files::certs(root, files).is_ok_and(|c| c.first().is_some_and(|f| f.der == cert.der))
}
