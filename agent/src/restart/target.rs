//! What a restart acts on: the components that read the renewed certificates, the static pod
//! that runs each, and how each is probed (endpoint from its manifest or `--endpoint`, CA and
//! client pair from the catalog, the certificate it must serve).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::node::Node;
use crate::node::catalog::{self, names};
use crate::node::manifests::Component;
use crate::pki::MAX_PEM_FILE_BYTES;
use crate::restart::verify::Probe;
use crate::restart::{Platform, RestartError, RestartOptions, fail, pods};
use crate::sys::fsutil;

/// One component to restart, with where its manifest is and how to probe it.
#[derive(Debug, Clone)]
pub struct Target {
    pub component: Component,
    /// Bottlerocket: the static-pods setting name; kubeadm: the manifest file name.
    pub pod: String,
    pub probe: Probe,
    /// The certificate file the component must serve (etcd, apiserver), relative to the root.
    pub served_file: Option<String>,
    /// Why it is restarted (printed: "restarted because ...").
    pub reason: String,
    /// Whether it was up before the pass changed anything (a forward restart): one whose port
    /// is closed when its turn comes is then starting again by itself, and is waited for before
    /// it is stopped. False after a rollback: a component the renewal broke is not waited for.
    pub expect_up: bool,
}

/// The components that read these renewed certificates, in restart order.
pub fn components_for(cert_names: &[String]) -> Vec<Component> {
    let mut v: Vec<Component> = cert_names
        .iter()
        .filter_map(|n| Component::reading(n))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Builds the restart targets for `components` from the platform's manifests and the node's
/// catalog entries.
pub fn targets(
    node: &Node,
    platform: &Platform,
    components: &[Component],
    opts: &RestartOptions,
) -> Result<Vec<Target>, RestartError> {
    let found = pods(platform)?;
    let mut out = Vec::new();
    for &component in components {
        let (pod, info) = found
            .iter()
            .find(|(_, info)| info.component() == Some(component))
            .cloned()
            .ok_or_else(|| {
                fail(
                    Some(component),
                    format!("no static pod runs it on platform {}", platform.name()),
                )
            })?;
        let endpoint = opts
            .endpoints
            .get(&component)
            .copied()
            .or_else(|| info.endpoint())
            .ok_or_else(|| {
                fail(
                    Some(component),
                    "no endpoint in its manifest; give --endpoint",
                )
            })?;
        let (probe, served_file) = probe_for(node, component, endpoint, opts.timeout)?;
        out.push(Target {
            component,
            pod,
            probe,
            served_file,
            reason: "its files changed".into(),
            expect_up: true,
        });
    }
    Ok(out)
}

pub(super) fn read_file(root: &Path, rel: &str) -> Result<Vec<u8>, String> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(format!("'{rel}' does not exist")),
        Err(e) => Err(e.to_string()),
    }
}

fn probe_for(
    node: &Node,
    component: Component,
    address: SocketAddr,
    timeout: Duration,
) -> Result<(Probe, Option<String>), RestartError> {
    let err = |m: String| fail(Some(component), m);
    let (root, entries) = (node.root(), node.entries());
    // The first of `names` that the catalog has here, with its certificate and key paths.
    let find = |names: &[&str]| {
        names.iter().find_map(|n| {
            entries
                .iter()
                .find(|e| e.name == *n && root.join(&e.path).exists())
        })
    };
    let pair = |e: &catalog::Entry| Some((e.path.clone(), e.key_path.clone().unwrap_or_default()));
    // What each component is probed with: (health path, CA, client certificate, served
    // certificate), by catalog name; the stacked kubeadm names first, then etcdadm's.
    let (path, ca, client, served) = match component {
        Component::Etcd => {
            let ca = find(&[names::ETCD_CA, names::ETCDADM_CA])
                .filter(|e| e.key_path.as_ref().is_some_and(|k| root.join(k).exists()));
            let ca = ca.ok_or_else(|| err("no etcd certificates on this node".into()))?;
            let (client, served) = if ca.name == names::ETCD_CA {
                (
                    find(&[names::ETCD_HEALTHCHECK_CLIENT]),
                    find(&[names::ETCD_SERVER]),
                )
            } else {
                (
                    find(&[names::ETCDADM_ETCDCTL_CLIENT]),
                    find(&[names::ETCDADM_SERVER]),
                )
            };
            (
                "/health",
                Some(ca.path.clone()),
                client.and_then(pair),
                served.map(|e| e.path.clone()),
            )
        }
        Component::KubeApiserver => {
            let ca = find(&[names::CA]).ok_or_else(|| err("no kubeadm PKI on this node".into()))?;
            let client = find(&[names::APISERVER_KUBELET_CLIENT]).and_then(pair);
            (
                "/readyz",
                Some(ca.path.clone()),
                client,
                find(&[names::APISERVER]).map(|e| e.path.clone()),
            )
        }
        Component::KubeControllerManager | Component::KubeScheduler => {
            ("/healthz", None, None, None)
        }
    };
    let ca_pem = match ca {
        Some(ca) => Some(read_file(root, &ca).map_err(err)?),
        None => None,
    };
    let (client_cert_pem, client_key_pem) = match client {
        Some((c, k)) => (
            Some(read_file(root, &c).map_err(err)?),
            Some(read_file(root, &k).map_err(err)?),
        ),
        None => (None, None),
    };
    let probe = Probe {
        address,
        path: path.into(),
        ca_pem,
        client_cert_pem,
        client_key_pem,
        timeout: timeout.min(Duration::from_secs(5)),
    };
    Ok((probe, served))
}

/// Parses `--endpoint COMPONENT=IP:PORT`.
pub fn parse_endpoint(text: &str) -> Result<(Component, SocketAddr), String> {
    let (name, addr) = text.split_once('=').ok_or_else(|| {
        format!("--endpoint '{text}': use COMPONENT=IP:PORT, e.g. etcd=127.0.0.1:2379")
    })?;
    let component = Component::ALL
        .into_iter()
        .find(|c| c.name() == name)
        .ok_or_else(|| format!("--endpoint '{text}': unknown component '{name}' (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)"))?;
    let addr = addr
        .parse()
        .map_err(|_| format!("--endpoint '{text}': '{addr}' is not IP:PORT"))?;
    Ok((component, addr))
}
