//! The catalog: which certificate and kubeconfig files kubeadm and etcdadm put where, under
//! which names, signed by which CA.
//!
//! This is the one place that knows the node layouts (`reference/pki-profiles.md` §1–§5):
//! - `kubeadm`: `/etc/kubernetes/pki`, `/etc/kubernetes/*.conf` (a kubeadm host);
//! - `bottlerocket`: `/var/lib/kubeadm/pki`, `/var/lib/kubeadm/*.conf` (EKS Anywhere on
//!   Bottlerocket), where the external-etcd client certificate may be stored as
//!   `server-etcd-client.crt` next to `apiserver-etcd-client.key`;
//! - `etcdadm`: `/etc/etcd/pki` and `etcdadm-bottlerocket`: `/var/lib/etcd/pki` (etcd nodes).
//!
//! Detection only looks at which files exist; it reads no certificate.

use std::path::Path;

/// Node paths that matter to certrotor, relative to the node root.
pub mod paths {
    /// kubeadm's folder on a kubeadm host.
    pub const KUBEADM_DIR: &str = "etc/kubernetes";
    /// kubeadm's folder on Bottlerocket (EKS Anywhere).
    pub const BOTTLEROCKET_KUBEADM_DIR: &str = "var/lib/kubeadm";
    /// etcdadm's certificate folder on a general-purpose host.
    pub const ETCDADM_PKI: &str = "etc/etcd/pki";
    /// etcdadm's certificate folder on Bottlerocket.
    pub const BOTTLEROCKET_ETCD_PKI: &str = "var/lib/etcd/pki";
    /// Where a superpowered Bottlerocket host container sees the host's root.
    pub const BOTTLEROCKET_HOST_ROOT: &str = "/.bottlerocket/rootfs";
    /// The Bottlerocket API socket (defined once, by the API client).
    pub const API_SOCKET: &str = bottlerocket::DEFAULT_SOCKET;
    /// certrotor's own state (journal, lock, backups), relative to the node root.
    pub const STATE_DIR: &str = "var/lib/certrotor";
    /// The kubelet's static pod folder on a kubeadm host.
    pub const KUBEADM_MANIFESTS: &str = "etc/kubernetes/manifests";
    /// Where the kubeadm platform parks a manifest while its pod is stopped (same filesystem).
    pub const PARKED_MANIFESTS: &str = "etc/kubernetes/.certrotor-parked";
    /// Where Bottlerocket's static-pods helper writes manifests for the kubelet.
    pub const BOTTLEROCKET_STATIC_PODS: &str = "etc/kubernetes/static-pods";
    /// EKS Anywhere's copies of the control plane's static pod manifests on Bottlerocket.
    pub const BOTTLEROCKET_KUBEADM_MANIFESTS: &str = "var/lib/kubeadm/manifests";
}

/// Every layout's folder, relative to the node root: all certificates and kubeconfigs the
/// catalog knows live below one of these (so do certrotor's staging folders, next to them).
pub const LAYOUT_DIRS: [&str; 4] = [
    paths::KUBEADM_DIR,
    paths::BOTTLEROCKET_KUBEADM_DIR,
    paths::ETCDADM_PKI,
    paths::BOTTLEROCKET_ETCD_PKI,
];

/// Catalog names that other modules look entries up by: one spelling, checked by the compiler.
pub mod names {
    /// kubeadm's cluster CA.
    pub const CA: &str = "ca";
    /// kubeadm's etcd CA (stacked or external etcd).
    pub const ETCD_CA: &str = "etcd-ca";
    /// kube-apiserver's serving certificate.
    pub const APISERVER: &str = "apiserver";
    /// kube-apiserver's client certificate towards kubelets.
    pub const APISERVER_KUBELET_CLIENT: &str = "apiserver-kubelet-client";
    /// Stacked etcd's serving certificate.
    pub const ETCD_SERVER: &str = "etcd-server";
    /// Stacked etcd's health-check client certificate.
    pub const ETCD_HEALTHCHECK_CLIENT: &str = "etcd-healthcheck-client";
    /// etcdadm's CA.
    pub const ETCDADM_CA: &str = "etcdadm-ca";
    /// etcdadm's serving certificate.
    pub const ETCDADM_SERVER: &str = "etcdadm-server";
    /// etcdadm's etcdctl client certificate.
    pub const ETCDADM_ETCDCTL_CLIENT: &str = "etcdadm-etcdctl-etcd-client";
    /// kube-apiserver's etcd client certificate on a kubeadm node.
    pub const APISERVER_ETCD_CLIENT: &str = "apiserver-etcd-client";
    /// The same pair as etcdadm writes it on the etcd node (exported to the control plane).
    pub const ETCDADM_APISERVER_ETCD_CLIENT: &str = "etcdadm-apiserver-etcd-client";
}

/// What a catalog entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Ca,
    Leaf,
    Kubeconfig,
    Other,
}

/// Which tool's profile a certificate follows on renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Flavor {
    /// kubeadm: BasicConstraints CA:FALSE, DNS SANs sorted.
    Kubeadm,
    /// etcdadm: no BasicConstraints, SAN order kept.
    Etcdadm,
}

/// A detected node layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// `kubeadm`, `bottlerocket`, `etcdadm` or `etcdadm-bottlerocket`.
    pub name: &'static str,
    /// Its folder relative to the node root.
    pub dir: &'static str,
    /// For kubeadm layouts: whether etcd's CA key is here (stacked etcd) or only its
    /// certificate (external etcd).
    pub etcd: EtcdTopology,
}

/// Where etcd lives, from a kubeadm folder's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdTopology {
    /// `pki/etcd/ca.key` present: kubeadm runs etcd here.
    Stacked,
    /// Only `pki/etcd/ca.crt`: etcd runs elsewhere (etcdadm nodes).
    External,
    /// No etcd CA at all, or not a kubeadm layout.
    None,
}

/// One file (or pair) the inventory looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// kubeadm's name (`apiserver`, `admin.conf`, `etcd-ca`) or `etcdadm-…`.
    pub name: String,
    pub kind: Kind,
    /// The certificate or kubeconfig, relative to the root.
    pub path: String,
    /// The private key, relative to the root (`None` for kubeconfigs, whose key is embedded).
    pub key_path: Option<String>,
    /// The catalog name of the signing CA.
    pub ca: Option<String>,
    /// Reported as missing when absent.
    pub required: bool,
    /// certrotor may renew it (never CAs, `sa.*`, or kubelet.conf).
    pub renewable: bool,
    pub flavor: Flavor,
    /// The layout it belongs to.
    pub layout: &'static str,
    /// kubeadm's long description, printed by renew.
    pub description: &'static str,
}

/// Whether `rel` exists under the root, resolved as reads resolve it.
/// A path that resolves out of the root (or cannot be resolved) counts as present when it exists
/// at all, so that reading it reports the problem instead of the layout silently shrinking.
fn exists_in_root(root: &Path, rel: &str) -> bool {
    match crate::sys::fsutil::resolve_in_root(root, rel) {
        Ok(found) => found.is_some(),
        Err(_) => root.join(rel).exists(),
    }
}

/// Finds the layouts present under `root`.
pub fn detect(root: &Path) -> Vec<Layout> {
    let mut found = Vec::new();
    for (name, dir) in [
        ("kubeadm", paths::KUBEADM_DIR),
        ("bottlerocket", paths::BOTTLEROCKET_KUBEADM_DIR),
    ] {
        // Paths resolve as reads resolve them (symlinks inside the root, absolute targets
        // re-rooted), so that detection, check and renew agree on a symlinked folder.
        let has = |rel: &str| exists_in_root(root, &format!("{dir}/{rel}"));
        // Bottlerocket's own /etc/kubernetes/pki holds only the kubelet's files and the cluster
        // CA certificate; a kubeadm control plane has the CA key, apiserver or admin.conf.
        let is_kubeadm = has("pki/ca.crt")
            && (has("pki/ca.key") || has("pki/apiserver.crt") || has("admin.conf"));
        if is_kubeadm {
            let etcd = if has("pki/etcd/ca.key") {
                EtcdTopology::Stacked
            } else if has("pki/etcd/ca.crt") {
                EtcdTopology::External
            } else {
                EtcdTopology::None
            };
            found.push(Layout { name, dir, etcd });
        }
    }
    for (name, dir) in [
        ("etcdadm", paths::ETCDADM_PKI),
        ("etcdadm-bottlerocket", paths::BOTTLEROCKET_ETCD_PKI),
    ] {
        let has = |rel: &str| exists_in_root(root, &format!("{dir}/{rel}"));
        if has("ca.crt") || has("server.crt") {
            found.push(Layout {
                name,
                dir,
                etcd: EtcdTopology::None,
            });
        }
    }
    found
}

/// The layout names and their folders, for `--help` and errors.
pub fn layout_summary() -> String {
    format!(
        "{} (kubeadm), {} (bottlerocket), {} (etcdadm), {} (etcdadm-bottlerocket)",
        paths::KUBEADM_DIR,
        paths::BOTTLEROCKET_KUBEADM_DIR,
        paths::ETCDADM_PKI,
        paths::BOTTLEROCKET_ETCD_PKI
    )
}

/// Every entry of the detected layouts. When two layouts of the same kind are present, the
/// second one's names get an `@<layout>` suffix so that names stay unique.
pub fn entries(root: &Path, layouts: &[Layout]) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for layout in layouts {
        let mut these = match layout.name {
            "kubeadm" | "bottlerocket" => kubeadm_entries(root, layout),
            _ => etcdadm_entries(layout),
        };
        if these.iter().any(|e| out.iter().any(|o| o.name == e.name)) {
            let suffix = format!("@{}", layout.name);
            for e in &mut these {
                e.name.push_str(&suffix);
                if let Some(ca) = &mut e.ca {
                    ca.push_str(&suffix);
                }
            }
        }
        out.extend(these);
    }
    // The kubelet's own files (one cert dir per node), signed by the first kubeadm layout's CA.
    if let Some(layout) = layouts
        .iter()
        .find(|l| matches!(l.name, "kubeadm" | "bottlerocket"))
    {
        let ca = out
            .iter()
            .find(|e| {
                e.layout == layout.name && e.kind == Kind::Ca && e.name.starts_with(names::CA)
            })
            .map(|e| e.name.clone())
            .unwrap_or_else(|| names::CA.into());
        out.extend(crate::node::kubelet::entries(root, &ca, layout.name));
    }
    out
}

struct Spec {
    name: &'static str,
    file: &'static str,
    ca: &'static str,
    description: &'static str,
}

const KUBEADM_CAS: [(&str, &str); 3] = [
    (names::CA, "pki/ca"),
    ("front-proxy-ca", "pki/front-proxy-ca"),
    (names::ETCD_CA, "pki/etcd/ca"),
];

const KUBEADM_LEAVES: [Spec; 7] = [
    Spec {
        name: names::APISERVER,
        file: "pki/apiserver",
        ca: names::CA,
        description: "certificate for serving the Kubernetes API",
    },
    Spec {
        name: names::APISERVER_KUBELET_CLIENT,
        file: "pki/apiserver-kubelet-client",
        ca: names::CA,
        description: "certificate for the API server to connect to kubelet",
    },
    Spec {
        name: "front-proxy-client",
        file: "pki/front-proxy-client",
        ca: "front-proxy-ca",
        description: "certificate for the front proxy client",
    },
    Spec {
        name: names::ETCD_SERVER,
        file: "pki/etcd/server",
        ca: names::ETCD_CA,
        description: "certificate for serving etcd",
    },
    Spec {
        name: "etcd-peer",
        file: "pki/etcd/peer",
        ca: names::ETCD_CA,
        description: "certificate for etcd nodes to communicate with each other",
    },
    Spec {
        name: names::ETCD_HEALTHCHECK_CLIENT,
        file: "pki/etcd/healthcheck-client",
        ca: names::ETCD_CA,
        description: "certificate for liveness probes to healthcheck etcd",
    },
    Spec {
        name: names::APISERVER_ETCD_CLIENT,
        file: "pki/apiserver-etcd-client",
        ca: names::ETCD_CA,
        description: "certificate the apiserver uses to access etcd",
    },
];

/// kubeconfigs: (file, required, renewable, description).
const KUBECONFIGS: [(&str, bool, bool, &str); 5] = [
    (
        "admin.conf",
        true,
        true,
        "certificate embedded in the kubeconfig file for the admin to use and for kubeadm itself",
    ),
    (
        "super-admin.conf",
        false,
        true,
        "certificate embedded in the kubeconfig file for the super-admin",
    ),
    (
        "controller-manager.conf",
        true,
        true,
        "certificate embedded in the kubeconfig file for the controller manager to use",
    ),
    (
        "scheduler.conf",
        true,
        true,
        "certificate embedded in the kubeconfig file for the scheduler manager to use",
    ),
    (
        "kubelet.conf",
        false,
        false,
        "client certificate of the kubelet (rotated by the kubelet itself)",
    ),
];

fn kubeadm_entries(root: &Path, layout: &Layout) -> Vec<Entry> {
    let dir = layout.dir;
    let mut out = Vec::new();
    for (name, file) in KUBEADM_CAS {
        if name == names::ETCD_CA && layout.etcd == EtcdTopology::None {
            continue;
        }
        out.push(Entry {
            name: name.into(),
            kind: Kind::Ca,
            path: format!("{dir}/{file}.crt"),
            key_path: Some(format!("{dir}/{file}.key")),
            ca: None,
            required: true,
            renewable: false,
            flavor: Flavor::Kubeadm,
            layout: layout.name,
            description: "certificate authority",
        });
    }
    for spec in &KUBEADM_LEAVES {
        let etcd_member = matches!(
            spec.name,
            "etcd-server" | "etcd-peer" | "etcd-healthcheck-client"
        );
        if etcd_member && layout.etcd != EtcdTopology::Stacked {
            continue;
        }
        if spec.name == names::APISERVER_ETCD_CLIENT && layout.etcd == EtcdTopology::None {
            continue;
        }
        let mut path = format!("{dir}/{}.crt", spec.file);
        // Bottlerocket/EKS-A external etcd: the certificate is `server-etcd-client.crt`.
        if spec.name == names::APISERVER_ETCD_CLIENT {
            let alt = format!("{dir}/pki/server-etcd-client.crt");
            if exists_in_root(root, &alt)
                || (layout.name == "bottlerocket" && !exists_in_root(root, &path))
            {
                path = alt;
            }
        }
        out.push(Entry {
            name: spec.name.into(),
            kind: Kind::Leaf,
            path,
            key_path: Some(format!("{dir}/{}.key", spec.file)),
            ca: Some(spec.ca.into()),
            required: true,
            renewable: true,
            flavor: Flavor::Kubeadm,
            layout: layout.name,
            description: spec.description,
        });
    }
    for (file, required, renewable, description) in KUBECONFIGS {
        out.push(Entry {
            name: file.into(),
            kind: Kind::Kubeconfig,
            path: format!("{dir}/{file}"),
            key_path: None,
            ca: Some("ca".into()),
            required,
            renewable,
            flavor: Flavor::Kubeadm,
            layout: layout.name,
            description,
        });
    }
    out
}

const ETCDADM_LEAVES: [(&str, &str, &str); 4] = [
    (
        names::ETCDADM_SERVER,
        "server",
        "certificate for serving etcd",
    ),
    (
        "etcdadm-peer",
        "peer",
        "certificate for etcd nodes to communicate with each other",
    ),
    (
        names::ETCDADM_ETCDCTL_CLIENT,
        "etcdctl-etcd-client",
        "certificate etcdctl uses to access etcd",
    ),
    (
        names::ETCDADM_APISERVER_ETCD_CLIENT,
        "apiserver-etcd-client",
        "certificate the apiserver uses to access etcd",
    ),
];

fn etcdadm_entries(layout: &Layout) -> Vec<Entry> {
    let dir = layout.dir;
    let mut out = vec![Entry {
        name: names::ETCDADM_CA.into(),
        kind: Kind::Ca,
        path: format!("{dir}/ca.crt"),
        key_path: Some(format!("{dir}/ca.key")),
        ca: None,
        required: true,
        renewable: false,
        flavor: Flavor::Etcdadm,
        layout: layout.name,
        description: "certificate authority",
    }];
    for (name, file, description) in ETCDADM_LEAVES {
        out.push(Entry {
            name: name.into(),
            kind: Kind::Leaf,
            path: format!("{dir}/{file}.crt"),
            key_path: Some(format!("{dir}/{file}.key")),
            ca: Some(names::ETCDADM_CA.into()),
            required: true,
            renewable: true,
            flavor: Flavor::Etcdadm,
            layout: layout.name,
            description,
        });
    }
    out
}

/// Folders whose unknown `*.crt` files are listed as kind `other`.
pub fn scanned_dirs(layouts: &[Layout]) -> Vec<String> {
    let mut dirs = Vec::new();
    for layout in layouts {
        match layout.name {
            "kubeadm" | "bottlerocket" => {
                dirs.push(format!("{}/pki", layout.dir));
                dirs.push(format!("{}/pki/etcd", layout.dir));
            }
            _ => dirs.push(layout.dir.to_string()),
        }
    }
    dirs
}

/// The service-account key pair of a kubeadm layout (never renewed; reported under `keys`).
pub fn service_account_keys(layout: &Layout) -> Option<(String, String)> {
    match layout.name {
        "kubeadm" | "bottlerocket" => Some((
            format!("{}/pki/sa.key", layout.dir),
            format!("{}/pki/sa.pub", layout.dir),
        )),
        _ => None,
    }
}
