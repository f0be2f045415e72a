//! The three CAs and what reads each on a node: the static pod flags that name a trust file,
//! and what each consumer does when that file changes (read in Kubernetes v1.20.2's source and
//! etcd's, module doc of [`crate::ca::plan`]), and what trusts a CA outside the node.

use serde::{Deserialize, Serialize};

use crate::node::catalog::names;
use crate::node::manifests::Component;

/// A CA certrotor can plan the rotation of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaName {
    /// The cluster CA (`ca.crt`).
    Ca,
    /// The front-proxy CA (`front-proxy-ca.crt`).
    FrontProxyCa,
    /// The etcd CA (kubeadm's `etcd/ca.crt`, etcdadm's `ca.crt`).
    EtcdCa,
}

impl CaName {
    /// `ca`, `front-proxy-ca` or `etcd-ca`.
    pub fn parse(s: &str) -> Option<CaName> {
        match s {
            "ca" => Some(CaName::Ca),
            "front-proxy-ca" => Some(CaName::FrontProxyCa),
            "etcd-ca" => Some(CaName::EtcdCa),
            _ => None,
        }
    }

    /// The name on the command line and in the plan.
    pub fn name(self) -> &'static str {
        match self {
            CaName::Ca => "ca",
            CaName::FrontProxyCa => "front-proxy-ca",
            CaName::EtcdCa => "etcd-ca",
        }
    }

    /// Its catalog names (without a `@layout` suffix).
    pub(super) fn catalog_names(self) -> &'static [&'static str] {
        match self {
            CaName::Ca => &[names::CA],
            CaName::FrontProxyCa => &["front-proxy-ca"],
            CaName::EtcdCa => &[names::ETCD_CA, names::ETCDADM_CA],
        }
    }

    /// The static pod flags that name a file of certificates of this CA to trust.
    pub(super) fn trust_flags(self) -> &'static [TrustFlag] {
        match self {
            CaName::Ca => CLUSTER_CA_FLAGS,
            CaName::FrontProxyCa => FRONT_PROXY_CA_FLAGS,
            CaName::EtcdCa => ETCD_CA_FLAGS,
        }
    }

    /// What holds or trusts this CA outside this node: certrotor cannot reach it from here.
    pub(super) fn outside(self) -> &'static [&'static str] {
        match self {
            CaName::Ca => &[
                "the other control-plane nodes (each runs its own plan)",
                "worker nodes: the kubelet's client CA and kubelet.conf (Bottlerocket: apiclient set kubernetes.cluster-certificate=<base64 of the PEM bundle>)",
                "ConfigMap kube-public/cluster-info (the CA that joining nodes trust)",
                "Secrets <cluster>-ca and <cluster>-kubeconfig in the management cluster (Cluster API, EKS Anywhere)",
                "kubeconfigs handed to people and tools",
                "in-cluster clients that read kube-root-ca.crt once: restart them after trust-in",
            ],
            CaName::FrontProxyCa => &[
                "the other control-plane nodes (each runs its own plan)",
                "aggregated API servers (metrics-server and others) that cached ConfigMap kube-system/extension-apiserver-authentication",
                "Secret <cluster>-proxy in the management cluster (Cluster API, EKS Anywhere)",
            ],
            CaName::EtcdCa => &[
                "the other etcd members and control planes (each runs its own plan; every member must trust both CAs before any peer certificate of the new one exists)",
                "Secrets <cluster>-etcd and <cluster>-apiserver-etcd-client in the management cluster (Cluster API, EKS Anywhere)",
            ],
        }
    }
}

/// A static pod flag naming a trust file, and what its component does when the file changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct TrustFlag {
    pub(super) component: Component,
    pub(super) flag: &'static str,
    pub(super) reloads: bool,
    /// The signer's own certificate: one certificate only, never a bundle.
    pub(super) signer: bool,
    pub(super) why: &'static str,
}

const fn flag(
    component: Component,
    flag: &'static str,
    reloads: bool,
    why: &'static str,
) -> TrustFlag {
    TrustFlag {
        component,
        flag,
        reloads,
        signer: false,
        why,
    }
}

const CLIENT_CA_RELOADS: &str =
    "reloads its client CA bundle within a minute (DynamicFileCAContent)";

const CLUSTER_CA_FLAGS: &[TrustFlag] = &[
    flag(
        Component::KubeApiserver,
        "client-ca-file",
        true,
        CLIENT_CA_RELOADS,
    ),
    flag(
        Component::KubeControllerManager,
        "client-ca-file",
        true,
        CLIENT_CA_RELOADS,
    ),
    flag(
        Component::KubeControllerManager,
        "root-ca-file",
        false,
        "read once at start (the service-account controller publishes it as kube-root-ca.crt)",
    ),
    TrustFlag {
        component: Component::KubeControllerManager,
        flag: "cluster-signing-cert-file",
        reloads: true,
        signer: true,
        why: "the CSR signer reloads its pair but signs nothing while the file holds more than \
              one certificate (signer/ca_provider.go: \"expected 1 certificate\")",
    },
];

const FRONT_PROXY_CA_FLAGS: &[TrustFlag] = &[
    flag(
        Component::KubeApiserver,
        "requestheader-client-ca-file",
        true,
        "reloads the bundle and publishes it in ConfigMap kube-system/extension-apiserver-authentication",
    ),
    flag(
        Component::KubeControllerManager,
        "requestheader-client-ca-file",
        true,
        CLIENT_CA_RELOADS,
    ),
];

const ETCD_CA_FLAGS: &[TrustFlag] = &[
    flag(
        Component::Etcd,
        "trusted-ca-file",
        false,
        "etcd reads its client CA pool once at start (etcd-io/etcd#11555)",
    ),
    flag(
        Component::Etcd,
        "peer-trusted-ca-file",
        false,
        "etcd reads its peer CA pool once at start (etcd-io/etcd#11555)",
    ),
    flag(
        Component::KubeApiserver,
        "etcd-cafile",
        false,
        "the etcd client's TLS configuration is built once at start (storagebackend/factory/etcd3.go)",
    ),
];
