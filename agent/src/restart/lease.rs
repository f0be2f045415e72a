//! `coordination.k8s.io/v1` Leases read through a kube-apiserver of the cluster: kube-vip's
//! `plndr-cp-lock` (its restart is verified by a renewal after it), and the leader Leases of
//! kube-controller-manager and kube-scheduler (cluster mode restarts their holders last).
//!
//! Read with the node's cluster CA and its apiserver-kubelet-client pair, the credentials of
//! certrotor's own `/readyz` probe (`system:masters` before Kubernetes 1.29,
//! `kubeadm:cluster-admins` after, pki-profiles §1), over [`crate::restart::verify::probe`]:
//! one GET per connection, the served certificate chained to the cluster CA.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::node::Node;
use crate::node::catalog::names;
use crate::node::manifests::{Component, PodInfo};
use crate::pki::MAX_PEM_FILE_BYTES;
use crate::restart::verify::{self, Probe};
use crate::sys::fsutil;

/// What a Lease said when it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// `namespace/name`.
    pub lease: String,
    /// `spec.holderIdentity`; empty when none holds it (released).
    pub holder: String,
    /// `metadata.resourceVersion`: changes at every write (a renewal), on the apiserver's
    /// side: an order of observations that no node's clock can skew.
    pub resource_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<i64>,
}

/// A client of one kube-apiserver for Leases.
pub struct Reader {
    probe: Probe,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "lease::Reader({})", self.probe.address)
    }
}

impl Reader {
    /// A reader of the kube-apiserver at `address` with the credentials of `node`; the error
    /// says which file is missing.
    pub fn at(node: &Node, address: SocketAddr) -> Result<Reader, String> {
        let root = node.root();
        let find = |name: &str| {
            node.entries()
                .iter()
                .find(|e| e.name == name && root.join(&e.path).exists())
        };
        let read = |rel: &str| match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(format!("'{rel}' does not exist")),
            Err(e) => Err(e.to_string()),
        };
        let ca = find(names::CA).ok_or("no cluster CA (kubeadm's ca.crt) on this node")?;
        let client = find(names::APISERVER_KUBELET_CLIENT)
            .ok_or("no apiserver-kubelet-client pair on this node")?;
        let key = client.key_path.as_deref().ok_or("no key path")?;
        Ok(Reader {
            probe: Probe {
                address,
                path: String::new(),
                ca_pem: Some(read(&ca.path)?),
                client_cert_pem: Some(read(&client.path)?),
                client_key_pem: Some(read(key)?),
                timeout: Duration::from_secs(5),
            },
        })
    }

    /// A reader of this node's own kube-apiserver (its manifest's endpoint).
    pub fn own(node: &Node, pods: &[(String, PodInfo)]) -> Result<Reader, String> {
        let address = pods
            .iter()
            .find(|(_, p)| p.component() == Some(Component::KubeApiserver))
            .and_then(|(_, p)| p.endpoint())
            .ok_or("no kube-apiserver static pod on this node")?;
        Reader::at(node, address)
    }

    /// The apiserver it reads from.
    pub fn address(&self) -> SocketAddr {
        self.probe.address
    }

    /// Lease `namespace/name`; `Ok(None)` when it does not exist.
    pub fn get(&self, namespace: &str, name: &str) -> Result<Option<Lease>, String> {
        let mut probe = self.probe.clone();
        probe.path = format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}");
        let seen = verify::probe(&probe).map_err(|e| e.0)?;
        match seen.status {
            200 => {}
            404 => return Ok(None),
            status => {
                let message = serde_json::from_str::<Value>(&seen.body)
                    .ok()
                    .and_then(|v| v.get("message")?.as_str().map(str::to_string))
                    .unwrap_or(seen.body);
                return Err(format!("{}: HTTP {status}: {message}", probe.path));
            }
        }
        let v: Value = serde_json::from_str(&seen.body)
            .map_err(|e| format!("{}: not JSON: {e}", probe.path))?;
        let spec = v.get("spec");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        Ok(Some(Lease {
            lease: format!("{namespace}/{name}"),
            holder: text(spec.and_then(|s| s.get("holderIdentity"))).unwrap_or_default(),
            resource_version: text(v.get("metadata").and_then(|m| m.get("resourceVersion")))
                .unwrap_or_default(),
            renew_time: text(spec.and_then(|s| s.get("renewTime"))),
            duration_seconds: spec
                .and_then(|s| s.get("leaseDurationSeconds"))
                .and_then(Value::as_i64),
        }))
    }
}

/// Whether `holder` names this node, whose names are `names`: client-go's leader identity is
/// `<host name>_<uuid>` (kube-controller-manager, kube-scheduler); kube-vip's is the node name
/// (`vip_nodename`) or host name alone.
pub fn held_by(holder: &str, names: &[String]) -> bool {
    if holder.is_empty() {
        return false;
    }
    let host = holder.rsplit_once('_').map_or(holder, |(h, _)| h);
    names.iter().any(|n| n == holder || n == host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_by_host_name_or_whole_identity() {
        let names = vec!["cp-1".to_string(), "node.example".to_string()];
        assert!(held_by("cp-1_4f3e0b7a-1c2d-4e5f-8a9b-0c1d2e3f4a5b", &names));
        assert!(held_by("cp-1", &names));
        assert!(held_by("node.example_x", &names));
        assert!(!held_by("cp-10_x", &names));
        assert!(!held_by("cp-2_x", &names));
        assert!(!held_by("", &names));
        assert!(!held_by("x", &[]));
    }
}
