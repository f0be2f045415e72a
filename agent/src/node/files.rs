//! The files certrotor may write on a node, as a check on paths read from its own state files
//! (a journal, a backup manifest): a path there must be one of the renewable files of the
//! node's layouts ([`crate::node::catalog`]), the kubelet's ([`crate::node::kubelet`]), or a
//! CA's pair and the keys a CA rotation keeps beside it ([`rotation_key`]) (for the cluster CA,
//! also kube-controller-manager's signer file and manifest and every kubeconfig), inside the
//! root. A state file is untrusted input; this is what keeps a tampered one from sending a
//! write anywhere else.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::node::carrier::Carrier;
use crate::node::catalog;
use crate::sys::state::{check_inside_root, check_relative};

/// [`rotation_key`]'s name of the new CA's key, kept beside the CA until it becomes the signer.
pub const NEXT: &str = "next";
/// [`rotation_key`]'s name of the old CA's key, kept beside the CA until trust-out (for abort).
pub const PREVIOUS: &str = "previous";

/// The file a CA rotation keeps another key of the CA in, beside its key file:
/// `pki/ca.key` → `pki/ca.next.key`.
pub fn rotation_key(key: &str, which: &str) -> String {
    match key.strip_suffix(".key") {
        Some(stem) => format!("{stem}.{which}.key"),
        None => format!("{key}.{which}"),
    }
}

/// The file kube-controller-manager's signer reads in a rotation of the cluster CA, beside the
/// CA file: `pki/ca.crt` → `pki/ca.signer.crt` (a host or a container path).
pub fn signer_cert(cert: &str) -> String {
    match cert.strip_suffix(".crt") {
        Some(stem) => format!("{stem}.signer.crt"),
        None => format!("{cert}.signer"),
    }
}

/// kube-controller-manager's manifest as kubeadm writes it: a rotation of the cluster CA moves
/// its signer flag ([`signer_cert`]).
pub const KCM_MANIFEST: &str = "etc/kubernetes/manifests/kube-controller-manager.yaml";

/// The files certrotor may write on a node: the certificates, keys and kubeconfigs of the
/// renewable catalog entries of the node's layouts (both names of the apiserver's etcd client
/// certificate on kubeadm layouts).
#[derive(Debug, Clone)]
pub struct NodeFiles {
    root: PathBuf,
    known: BTreeSet<String>,
    /// Certificate path → key path (the key is embedded for kubeconfigs: not listed).
    pairs: Vec<(String, String)>,
    kubeconfigs: BTreeSet<String>,
    /// The kubelet's files ([`crate::node::kubelet`]) on a node with a kubeadm layout.
    kubelet: bool,
}

/// What a rotation of the cluster CA whose file is `cert` writes besides its pair: its signer
/// file, kube-controller-manager's manifest, and every kubeconfig (their CA data; the
/// kubelet's too).
fn cluster_ca_rotation(root: &Path, layouts: &[catalog::Layout], cert: &str) -> Vec<String> {
    let mut out = vec![signer_cert(cert), KCM_MANIFEST.to_string()];
    out.extend(
        catalog::entries(root, layouts)
            .into_iter()
            .filter(|e| e.kind == catalog::Kind::Kubeconfig)
            .map(|e| e.path),
    );
    out
}

impl NodeFiles {
    /// The renewable files of the layouts found under `root`.
    pub fn of(root: &Path) -> NodeFiles {
        let layouts = catalog::detect(root);
        let mut known = BTreeSet::new();
        let mut pairs = Vec::new();
        let mut kubeconfigs = BTreeSet::new();
        for entry in catalog::entries(root, &layouts) {
            if entry.kind == catalog::Kind::Ca
                && let Some(key) = &entry.key_path
            {
                // A CA rotation (the `ca` stage) writes the CA's pair and keeps the other CA's key
                // beside it.
                known.insert(entry.path.clone());
                for k in [
                    key.clone(),
                    rotation_key(key, NEXT),
                    rotation_key(key, PREVIOUS),
                ] {
                    known.insert(k);
                }
                pairs.push((entry.path.clone(), key.clone()));
                if entry.name.split('@').next() == Some(catalog::names::CA) {
                    known.extend(cluster_ca_rotation(root, &layouts, &entry.path));
                }
                continue;
            }
            if !entry.renewable {
                continue;
            }
            known.insert(entry.path.clone());
            match Carrier::of_entry(&entry) {
                Carrier::Kubeconfig { path } => {
                    kubeconfigs.insert(path.to_string());
                }
                Carrier::Pair {
                    cert,
                    key: Some(key),
                } => {
                    known.insert(key.to_string());
                    pairs.push((cert.to_string(), key.to_string()));
                }
                Carrier::Pair { key: None, .. } => {}
            }
        }
        for layout in &layouts {
            if matches!(layout.name, "kubeadm" | "bottlerocket") {
                let key = format!("{}/pki/apiserver-etcd-client.key", layout.dir);
                if !known.contains(&key) {
                    continue;
                }
                for alt in ["apiserver-etcd-client.crt", "server-etcd-client.crt"] {
                    let cert = format!("{}/pki/{alt}", layout.dir);
                    if known.insert(cert.clone()) {
                        pairs.push((cert, key.clone()));
                    }
                }
            }
        }
        let kubelet = layouts
            .iter()
            .any(|l| matches!(l.name, "kubeadm" | "bottlerocket"));
        if kubelet {
            pairs.push((
                crate::node::kubelet::SERVING_CERT.to_string(),
                crate::node::kubelet::SERVING_KEY.to_string(),
            ));
        }
        NodeFiles {
            root: root.to_path_buf(),
            known,
            pairs,
            kubeconfigs,
            kubelet,
        }
    }

    /// Checks a node path read from a state file: see the module documentation.
    pub fn check(&self, rel: &str) -> Result<(), String> {
        check_relative(rel)?;
        let kubelet_file = self.kubelet && crate::node::kubelet::is_node_file(rel);
        if !(self.known.contains(rel) || kubelet_file) {
            return Err(format!(
                "the path is not a file certrotor writes on this node's layouts ({})",
                catalog::layout_summary()
            ));
        }
        if self.is_link(rel) {
            // The link itself is replaced, never followed: its folder must be inside the root,
            // and its target is checked on its own (`check_link_target`).
            let folder = rel.rsplit_once('/').map_or("", |(f, _)| f);
            return check_inside_root(&self.root, &self.root.join(folder));
        }
        check_inside_root(&self.root, &self.root.join(rel))
    }

    /// The key file of a certificate path, if it is a certificate.
    pub fn key_of(&self, cert: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(c, _)| c == cert)
            .map(|(_, k)| k.as_str())
    }

    /// Whether a path is a symbolic link certrotor swaps (the kubelet's current client pair).
    pub fn is_link(&self, rel: &str) -> bool {
        self.kubelet && rel == crate::node::kubelet::CLIENT_CURRENT
    }

    /// Whether a path is one of the kubelet's dated client files (certificate and key in one).
    pub fn is_kubelet_pair_file(&self, rel: &str) -> bool {
        self.kubelet
            && rel != crate::node::kubelet::CLIENT_CURRENT
            && rel.starts_with(crate::node::kubelet::PKI_DIR)
            && crate::node::kubelet::is_node_file(rel)
            && rel.ends_with(".pem")
    }

    /// Checks a link target read from a state file.
    pub fn check_link_target(&self, target: &str) -> Result<(), String> {
        crate::node::kubelet::check_link_target(target)?;
        check_inside_root(&self.root, &self.root.join(target.trim_start_matches('/')))
    }

    /// Whether a path is a kubeconfig.
    pub fn is_kubeconfig(&self, rel: &str) -> bool {
        self.kubeconfigs.contains(rel)
    }
}
