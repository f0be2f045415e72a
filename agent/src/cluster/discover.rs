//! Who this node is in the cluster and how it reaches etcd: [`discover`] reads the endpoints
//! from the static pod manifests (or `--etcd-endpoint`) and the client pair and CA from the
//! node's PKI.

use super::client::Access;
use super::{ClusterError, ClusterOptions, Mode, err, read_rel};
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};

/// Who this node is, what it runs, and how it reaches etcd.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The holder name written in the lock: the etcd member name, else `kube-apiserver@IP:PORT`.
    pub name: String,
    /// This node's kube-apiserver health address, if it runs one.
    pub apiserver: Option<std::net::SocketAddr>,
    /// Whether this node runs an etcd member.
    pub etcd_member: bool,
    pub access: Access,
}

/// Finds this node's etcd endpoints and client pair: `--etcd-endpoint`, else kube-apiserver's
/// `--etcd-servers`, else the etcd member's `--advertise-client-urls`. `Ok(None)`: no etcd
/// endpoints here (cluster mode stays off).
pub fn discover(
    local: &Node,
    pods: &[(String, PodInfo)],
    opts: &ClusterOptions,
) -> Result<Option<NodeInfo>, ClusterError> {
    if opts.mode == Mode::Off {
        return Ok(None);
    }
    let find = |c: Component| pods.iter().find(|(_, p)| p.component() == Some(c));
    let apiserver = find(Component::KubeApiserver);
    let etcd = find(Component::Etcd);
    let endpoints: Vec<String> = if !opts.endpoints.is_empty() {
        opts.endpoints.clone()
    } else if let Some(urls) = apiserver.and_then(|(_, p)| p.flag("etcd-servers")) {
        split_urls(urls)
    } else if let Some(urls) = etcd.and_then(|(_, p)| p.flag("advertise-client-urls")) {
        split_urls(urls)
    } else {
        vec![]
    };
    if endpoints.is_empty() {
        return Ok(None);
    }
    let access = client_access(local, endpoints)?;
    let apiserver_addr = apiserver.and_then(|(_, p)| p.endpoint());
    let name = match (etcd.and_then(|(_, p)| p.flag("name")), apiserver_addr) {
        (Some(n), _) => n.to_string(),
        (None, Some(a)) => format!("kube-apiserver@{a}"),
        (None, None) => hostname(),
    };
    Ok(Some(NodeInfo {
        name,
        apiserver: apiserver_addr,
        etcd_member: etcd.is_some(),
        access,
    }))
}

/// The etcd client pair and CA of this node (the first present of kubeadm's and etcdadm's
/// client certificates, and the etcd CA), read inside the root, for `endpoints`.
fn client_access(local: &Node, endpoints: Vec<String>) -> Result<Access, ClusterError> {
    let (root, entries) = (local.root(), local.entries());
    let present = |n: &str| {
        entries
            .iter()
            .find(|e| e.name == n && root.join(&e.path).exists())
    };
    let client = [
        "apiserver-etcd-client",
        "etcdadm-etcdctl-etcd-client",
        "etcd-healthcheck-client",
        "etcdadm-apiserver-etcd-client",
    ]
    .iter()
    .find_map(|n| present(n))
    .ok_or_else(|| {
        err(format!(
            "cluster mode: no etcd client certificate under '{}' (apiserver-etcd-client, etcdctl-etcd-client or healthcheck-client); give --cluster off to act alone",
            root.display()
        ))
    })?;
    let ca = ["etcd-ca", "etcdadm-ca"]
        .iter()
        .find_map(|n| present(n))
        .ok_or_else(|| {
            err(format!(
                "cluster mode: no etcd CA certificate under '{}'; give --cluster off to act alone",
                root.display()
            ))
        })?;
    let read = |rel: &str| read_rel(root, rel).map_err(|e| err(format!("cluster mode: {e}")));
    let key_rel = client.key_path.clone().unwrap_or_default();
    Ok(Access::new(
        endpoints,
        client.path.clone(),
        read(&ca.path)?,
        read(&client.path)?,
        read(&key_rel)?,
    ))
}

pub(super) fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect()
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
