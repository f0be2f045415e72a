//! The kubelet's own certificates under `/var/lib/kubelet/pki` (its `--cert-dir`, the same on a
//! kubeadm host and on Bottlerocket).
//!
//! **Client certificate.** The kubelet's certificate manager (client-go
//! `util/certificate/certificate_store.go`) keeps its client pair as one PEM file per rotation,
//! `kubelet-client-YYYY-MM-DD-HH-MM-SS.pem` (certificate blocks then the key, mode 0600), and
//! the symbolic link `kubelet-client-current.pem` to it (absolute target), swapped by creating
//! `kubelet-client-updated.pem` and renaming it over the current link. kubeadm's `kubelet.conf`
//! names that link as both `client-certificate` and `client-key`. The kubelet renews the pair
//! itself only when client rotation is on (kubeadm turns it on; Bottlerocket's kubelet
//! configuration template does not set `rotateCertificates`, whose default is off) and only
//! while its current certificate is still valid. A node that was off past the expiry, or whose
//! kubelet does not rotate, needs the pair reissued: here, from the cluster CA, only where its
//! key is (a control-plane node), with what the kube-controller-manager's
//! `kubernetes.io/kube-apiserver-client-kubelet` signer gives the kubelet's own CSR
//! (`O=system:nodes, CN=system:node:<node>`, keyUsage digitalSignature + keyEncipherment,
//! extKeyUsage clientAuth, CA:FALSE, no SANs, notBefore backdated 5 minutes, notAfter the
//! signing duration later (default one year) minus the backdate and never past the CA's), with
//! a new key of the current key's type. It is installed as the kubelet installs it: a new dated
//! file and the link renamed over, both in one certrotor transaction with a backup (so
//! `rollback` restores the previous link and removes the new file). Never copied from
//! `admin.conf`: the kubelet must not run as cluster admin.
//!
//! **Serving certificate.** Without `--tls-cert-file` (and without server certificate
//! bootstrap), the kubelet writes a self-signed `kubelet.crt`/`kubelet.key` at start, only
//! when they are absent, and never replaces an expired pair. certrotor does not forge the
//! kubelet's self-signed certificate: an expired pair is backed up and removed (one
//! transaction), so that the kubelet makes a new one, with its own names, at its next start.

use std::path::Path;

use crate::node::catalog::{Entry, Flavor, Kind};
use crate::sys::clock;

/// The kubelet's `--cert-dir`, relative to the node root.
pub const PKI_DIR: &str = "var/lib/kubelet/pki";
/// The link to the current client pair.
pub const CLIENT_CURRENT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";
/// The self-signed serving certificate and key.
pub const SERVING_CERT: &str = "var/lib/kubelet/pki/kubelet.crt";
pub const SERVING_KEY: &str = "var/lib/kubelet/pki/kubelet.key";
/// Catalog names.
pub const CLIENT: &str = "kubelet-client";
pub const SERVING: &str = "kubelet-serving";

const CLIENT_PREFIX: &str = "kubelet-client-";
const PEM: &str = ".pem";

/// Whether `name` is one of the kubelet's dated client files (`kubelet-client-` followed by
/// Go's `2006-01-02-15-04-05` and `.pem`).
pub fn is_dated_client(name: &str) -> bool {
    let Some(stamp) = name
        .strip_prefix(CLIENT_PREFIX)
        .and_then(|s| s.strip_suffix(PEM))
    else {
        return false;
    };
    let b = stamp.as_bytes();
    b.len() == 19
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 | 10 | 13 | 16 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// The files certrotor may write for the kubelet: the link, the dated client files, the
/// serving pair (all directly in [`PKI_DIR`]).
pub fn is_node_file(rel: &str) -> bool {
    let Some(name) = rel.strip_prefix(PKI_DIR).and_then(|s| s.strip_prefix('/')) else {
        return false;
    };
    rel == CLIENT_CURRENT || rel == SERVING_CERT || rel == SERVING_KEY || is_dated_client(name)
}

/// A link target certrotor accepts from a state file: the kubelet's absolute path of a dated
/// client file.
pub fn check_link_target(target: &str) -> Result<(), String> {
    let ok = target
        .strip_prefix('/')
        .and_then(|t| t.strip_prefix(PKI_DIR))
        .and_then(|t| t.strip_prefix('/'))
        .is_some_and(is_dated_client);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "link target '{target}' is not a kubelet client file '/{PKI_DIR}/{CLIENT_PREFIX}<date>{PEM}'"
        ))
    }
}

/// The catalog entries of the kubelet's files, when its cert dir exists. `ca` is the catalog
/// name of the cluster CA, `layout` the kubeadm layout it belongs to.
pub fn entries(root: &Path, ca: &str, layout: &'static str) -> Vec<Entry> {
    if !root.join(PKI_DIR).is_dir() {
        return vec![];
    }
    let entry = |name: &str, path: &str, key: &str, ca: Option<String>, description| Entry {
        name: name.into(),
        kind: Kind::Leaf,
        path: path.into(),
        key_path: Some(key.into()),
        ca,
        required: false,
        // Not through the generic renewal (one file holds both halves, and a link must be
        // swapped): the renew stage (`renew::kubelet`) renews these.
        renewable: false,
        flavor: Flavor::Kubeadm,
        layout,
        description,
    };
    vec![
        entry(
            CLIENT,
            CLIENT_CURRENT,
            CLIENT_CURRENT,
            Some(ca.into()),
            "client certificate of the kubelet (reissued from the cluster CA when the kubelet did not rotate it)",
        ),
        entry(
            SERVING,
            SERVING_CERT,
            SERVING_KEY,
            None,
            "self-signed serving certificate of the kubelet (removed when expired: the kubelet makes a new one at start)",
        ),
    ]
}

/// The dated file name the kubelet would write at `secs` (it formats its local time; nodes
/// run on UTC).
pub fn dated_name(secs: i64) -> String {
    let (y, mo, d, h, mi, s) = clock::civil(secs);
    format!("{CLIENT_PREFIX}{y:04}-{mo:02}-{d:02}-{h:02}-{mi:02}-{s:02}{PEM}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_names_are_the_kubelets() {
        assert!(is_dated_client("kubelet-client-2026-11-23-04-26-56.pem"));
        assert!(!is_dated_client("kubelet-client-current.pem"));
        assert!(!is_dated_client("kubelet-client-2026-11-23-04-26-5x.pem"));
        assert!(!is_dated_client(
            "kubelet-client-2026-11-23-04-26-56.pem.bak"
        ));
        assert_eq!(dated_name(0), "kubelet-client-1970-01-01-00-00-00.pem");
        assert!(is_node_file(
            "var/lib/kubelet/pki/kubelet-client-2026-11-23-04-26-56.pem"
        ));
        assert!(!is_node_file("var/lib/kubelet/pki/../x/kubelet.crt"));
        assert!(
            check_link_target("/var/lib/kubelet/pki/kubelet-client-2026-11-23-04-26-56.pem")
                .is_ok()
        );
        assert!(check_link_target("/etc/kubernetes/pki/ca.key").is_err());
        assert!(
            check_link_target("var/lib/kubelet/pki/kubelet-client-2026-11-23-04-26-56.pem")
                .is_err()
        );
    }
}
