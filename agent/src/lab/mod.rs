//! `certrotor lab init`: writes a realistic node root for demos, tests and benchmarks.
//!
//! The files follow kubeadm's and etcdadm's profiles field by field (`reference/pki-profiles.md`
//! §1–§5): names, subjects, SANs, usages, PEM encodings and modes. The certificates look as if
//! the cluster was created a year before they expire: CAs valid ten years from then, leaves
//! valid one year. This is not a CA: keys are made on the spot and nothing is protected.
//!
//! This file holds the options and the order of the writing; `certs` makes and writes the
//! certificates, `control_plane` and `etcd_node` write the two kinds of node, `manifests` their
//! static pod manifests.

mod certs;
mod control_plane;
pub mod demo;
mod etcd_node;
pub mod manifests;

pub use manifests::KubeVipShape;

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::lab::certs::{Cas, LabClock, Writer, write_ca};
use crate::lab::control_plane::write_control_plane;
use crate::lab::etcd_node::{write_etcd_node, write_external_etcd_ca};
use crate::pki::{self, KeyAlgorithm};
use crate::sys::message_error::message_error;

/// Which node layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabLayout {
    /// `/etc/kubernetes`, `/etc/etcd/pki`.
    Kubeadm,
    /// `/var/lib/kubeadm`, `/var/lib/etcd/pki` (EKS Anywhere on Bottlerocket).
    Bottlerocket,
}

/// Where etcd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// kubeadm's local etcd on the control-plane node.
    Stacked,
    /// etcdadm nodes; two node roots are written: `control-plane/` and `etcd/`.
    ExternalEtcd,
}

/// Options of `lab init`.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub layout: LabLayout,
    pub topology: Topology,
    /// Seconds from `now` until the leaves expire (negative: already expired).
    pub expires_in: i64,
    pub key_algorithm: KeyAlgorithm,
    pub node_name: String,
    pub advertise_address: IpAddr,
    pub cluster_name: String,
    /// Added to every standard port (manifests and kubeconfig URLs), so that lab nodes can run
    /// side by side on one machine.
    pub port_offset: u16,
    /// The Kubernetes version whose images the static pod manifests name
    /// ([`manifests::DEFAULT_KUBERNETES_VERSION`] by default).
    pub kubernetes_version: crate::node::manifests::Version,
    pub now: i64,
}

message_error!(
    /// A failure while writing the lab node.
    #[derive(Debug)]
    LabError
);

impl From<pki::PkiError> for LabError {
    fn from(e: pki::PkiError) -> Self {
        LabError(e.to_string())
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct LabSummary {
    /// The node roots (one, or `control-plane` and `etcd`).
    pub roots: Vec<PathBuf>,
    pub files: usize,
}

/// The service subnet's first address, kubeadm's default (10.96.0.0/12).
const SERVICE_IP: &str = "10.96.0.1";
/// kubeadm's default API server port.
const API_PORT: u16 = 6443;

/// Writes the lab node(s) under `dir`, which must be absent or empty.
pub fn init(dir: &Path, opts: &LabOptions) -> Result<LabSummary, LabError> {
    check_empty(dir)?;
    let mut w = Writer { files: 0 };
    let clock = LabClock::new(opts.now, opts.expires_in);
    let (kdir, etcd_dir) = lab_dirs(opts.layout);
    // The control plane's own CAs are the same in both topologies.
    let (cp, etcd_root) = match opts.topology {
        Topology::Stacked => (dir.to_path_buf(), None),
        Topology::ExternalEtcd => (dir.join("control-plane"), Some(dir.join("etcd"))),
    };
    let (ca, ca_key) = write_ca(
        &mut w,
        &cp,
        &format!("{kdir}/pki/ca"),
        "kubernetes",
        opts,
        &clock,
    )?;
    let (fp, fp_key) = write_ca(
        &mut w,
        &cp,
        &format!("{kdir}/pki/front-proxy-ca"),
        "front-proxy-ca",
        opts,
        &clock,
    )?;
    let roots = match etcd_root {
        None => {
            let (etcd, etcd_key) = write_ca(
                &mut w,
                &cp,
                &format!("{kdir}/pki/etcd/ca"),
                "etcd-ca",
                opts,
                &clock,
            )?;
            let cas = Cas {
                ca: (&ca, &ca_key),
                front_proxy: (&fp, &fp_key),
                etcd: Some((&etcd, &etcd_key)),
            };
            write_control_plane(&mut w, &cp, kdir, opts, &clock, &cas, true)?;
            vec![cp]
        }
        Some(etcd_root) => {
            let (etcd, etcd_key) = write_external_etcd_ca(&mut w, &cp, &etcd_root, opts, &clock)?;
            let cas = Cas {
                ca: (&ca, &ca_key),
                front_proxy: (&fp, &fp_key),
                etcd: None,
            };
            write_control_plane(&mut w, &cp, kdir, opts, &clock, &cas, false)?;
            write_etcd_node(
                &mut w,
                &etcd_root,
                etcd_dir,
                &cp,
                kdir,
                opts,
                &clock,
                (&etcd, &etcd_key),
            )?;
            vec![cp, etcd_root]
        }
    };
    Ok(LabSummary {
        roots,
        files: w.files,
    })
}

/// Refuses a folder that exists and is not empty.
fn check_empty(dir: &Path) -> Result<(), LabError> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(LabError(format!(
            "'{}' exists and is not empty; lab init writes only into a new or empty folder",
            dir.display()
        )));
    }
    Ok(())
}

/// The kubeadm folder and the etcd node's PKI folder of a layout.
fn lab_dirs(layout: LabLayout) -> (&'static str, &'static str) {
    match layout {
        LabLayout::Kubeadm => (
            crate::node::catalog::paths::KUBEADM_DIR,
            crate::node::catalog::paths::ETCDADM_PKI,
        ),
        LabLayout::Bottlerocket => (
            crate::node::catalog::paths::BOTTLEROCKET_KUBEADM_DIR,
            crate::node::catalog::paths::BOTTLEROCKET_ETCD_PKI,
        ),
    }
}

/// Adds kube-vip to a control-plane node written by [`init`] (an etcd-only node, without
/// admin.conf, gets none): as EKS Anywhere renders it, or the lab's probe-ful stand-in. The
/// node is an init node: from Kubernetes 1.29 on, EKS Anywhere's kube-vip there mounts
/// super-admin.conf (bottlerocket-bootstrap's `patchKubeVipManifest`, or the `sed` of the
/// kubeadm layouts), because admin.conf is bound to its role only once the apiserver is up.
pub fn add_kube_vip(
    root: &Path,
    layout: LabLayout,
    port_offset: u16,
    shape: KubeVipShape,
    kubernetes_version: crate::node::manifests::Version,
) -> Result<(), LabError> {
    let (kdir, _) = lab_dirs(layout);
    if !root.join(kdir).join("admin.conf").is_file() {
        return Ok(());
    }
    let (file, yaml) = match shape {
        KubeVipShape::Probe => manifests::kube_vip_probe(&format!("/{kdir}"), port_offset),
        KubeVipShape::EksAnywhere => {
            let super_admin = kubernetes_version >= crate::node::manifests::Version::new(1, 29, 0);
            manifests::kube_vip_eks_anywhere(&manifests::KubeVipParams {
                bottlerocket: layout == LabLayout::Bottlerocket,
                kubeconfig: if super_admin {
                    "super-admin.conf"
                } else {
                    "admin.conf"
                },
                vip: manifests::LAB_VIP,
                port_offset,
            })
        }
    };
    let path = root.join(manifest_dir(layout)).join(file);
    crate::sys::fsutil::write_atomic(&path, yaml.as_bytes(), 0o600)
        .map_err(|e| LabError(format!("cannot write '{}': {e}", path.display())))
}

/// Where `lab init` writes static pod manifests: the kubelet's folder on a kubeadm host; on
/// Bottlerocket the manifests live in API settings, and EKS Anywhere keeps copies in
/// `/var/lib/kubeadm/manifests`, which tests load into the API emulator.
pub fn manifest_dir(layout: LabLayout) -> &'static str {
    match layout {
        LabLayout::Kubeadm => crate::node::catalog::paths::KUBEADM_MANIFESTS,
        LabLayout::Bottlerocket => crate::node::catalog::paths::BOTTLEROCKET_KUBEADM_MANIFESTS,
    }
}

/// `host:port` with IPv6 in brackets.
pub fn socket_text(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

#[cfg(test)]
impl LabOptions {
    /// The unit tests' node: kubeadm layout, stacked etcd, ECDSA keys, leaves expiring in three
    /// days from `now`.
    pub(crate) fn for_tests(now: i64) -> LabOptions {
        LabOptions {
            layout: LabLayout::Kubeadm,
            topology: Topology::Stacked,
            expires_in: 3 * 86_400,
            key_algorithm: KeyAlgorithm::EcdsaP256,
            node_name: "cp-1".into(),
            advertise_address: [10, 0, 0, 10].into(),
            cluster_name: "kubernetes".into(),
            port_offset: 0,
            kubernetes_version: manifests::DEFAULT_KUBERNETES_VERSION,
            now,
        }
    }
}
