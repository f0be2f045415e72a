//! A renewed client pair that its component reloads by itself is presented only on the
//! component's next connection, which may come much later: kube-apiserver opens a new
//! connection to etcd only when one breaks. A restart used to present it at once; a live reload
//! does not, so certrotor presents the renewed pair itself to the server that authenticates it,
//! and a pair that server refuses is found in the pass that wrote it (and leads to a restart,
//! whose verification fails, and to the rollback).
//!
//! What this proves is the pair, not its use by the component: which pair the apiserver holds
//! on an open connection is not observable from outside. kube-apiserver's
//! apiserver-kubelet-client needs no check here: it is the client certificate of the
//! apiserver's own probe (`/readyz`), whose client CA is the kubelets'.

use std::time::Duration;

use crate::node::Node;
use crate::node::catalog::names;
use crate::node::manifests::{Component, PodInfo, parse_https_url};
use crate::restart::verify::{self, Probe};
use crate::sys::fsutil;

/// The longest a check waits for etcd to answer (a member may be busy with its own reload).
const CHECK_BOUND: Duration = Duration::from_secs(30);

/// Checks the renewed client pairs of `component` among `names` (catalog names) that the
/// server authenticating them can be asked about: kube-apiserver's apiserver-etcd-client
/// against the first etcd of its `--etcd-servers`. `Ok` with what was checked (possibly
/// nothing); `Err` with the reason the pair cannot be trusted.
pub fn check_renewed(
    node: &Node,
    component: Component,
    names: &[String],
    pods: &[(String, PodInfo)],
    poll: Duration,
) -> Result<Vec<String>, String> {
    let renewed = |n: &str| names.iter().any(|x| x.split('@').next() == Some(n));
    if component != Component::KubeApiserver || !renewed(names::APISERVER_ETCD_CLIENT) {
        return Ok(vec![]);
    }
    let what = "the renewed apiserver-etcd-client";
    let address = pods
        .iter()
        .find(|(_, p)| p.component() == Some(Component::KubeApiserver))
        .and_then(|(_, p)| p.flag("etcd-servers"))
        .and_then(|urls| urls.split(',').find_map(parse_https_url))
        .ok_or_else(|| {
            format!(
                "{what} could not be checked: no https://IP:PORT in the kube-apiserver \
                 manifest's --etcd-servers"
            )
        })?;
    let (root, entries) = (node.root(), node.entries());
    let client = entries
        .iter()
        .find(|e| e.name == names::APISERVER_ETCD_CLIENT && root.join(&e.path).exists())
        .ok_or_else(|| format!("{what} could not be checked: it is not on this node"))?;
    let ca = client
        .ca
        .as_deref()
        .and_then(|ca| {
            entries
                .iter()
                .find(|e| e.name == ca && root.join(&e.path).exists())
        })
        .ok_or_else(|| format!("{what} could not be checked: its CA is not on this node"))?;
    let read = |rel: &str| -> Result<Vec<u8>, String> {
        match fsutil::read_in_root(root, rel, crate::pki::MAX_PEM_FILE_BYTES) {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(format!(
                "{what} could not be checked: '{rel}' does not exist"
            )),
            Err(e) => Err(format!("{what} could not be checked: {e}")),
        }
    };
    let key_path = client
        .key_path
        .as_deref()
        .ok_or_else(|| format!("{what} could not be checked: it has no key file"))?;
    let probe = Probe {
        address,
        path: "/health".into(),
        ca_pem: Some(read(&ca.path)?),
        client_cert_pem: Some(read(&client.path)?),
        client_key_pem: Some(read(key_path)?),
        timeout: Duration::from_secs(5),
    };
    verify::wait_for(&probe, CHECK_BOUND, poll, |o| o.healthy())
        .map(|_| {
            log::info!("etcd at {address} accepts {what} ('{}')", client.path);
            vec![format!("etcd at {address} accepts {what}")]
        })
        .map_err(|e| {
            format!(
                "etcd at {address} did not accept {what} ('{}') within {} s: {e}",
                client.path,
                CHECK_BOUND.as_secs()
            )
        })
}
