//! Live proof of a trust change that no restart verifies: kube-apiserver reloads its
//! `--requestheader-client-ca-file` and `--client-ca-file` by itself (about once a minute,
//! measured: 58-60 s) and publishes them in `kube-system/extension-apiserver-authentication`,
//! where aggregated API servers read whom to trust as a front proxy and as a client. Until the
//! new CA is published there, a `front-proxy-client` issued by it would be refused by them, and
//! a client certificate of the new cluster CA by kube-apiserver itself (measured: 401 for 50 s
//! when the issue did not wait): the issue waits for it.
//!
//! The apiserver publishes the *union* of what the ConfigMap holds and what its files hold
//! (`combineCertLists` in `clusterauthenticationtrust`, Kubernetes v1.20.2; expired
//! certificates dropped): a CA leaves the ConfigMap only when someone removes it. So when a
//! stage takes a CA out of the files (trust-out: the old one; abort: the new one), this removes
//! that CA from the ConfigMap too, and checks the apiserver does not publish it again.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::node::Node;
use crate::pki::{Cert, MAX_BUNDLE_CERTS};

/// Where kube-apiserver publishes its request-header CA bundle.
const CONFIGMAP: &str =
    "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
/// The ConfigMap's key of a CA's bundle.
pub fn key_of(ca: crate::ca::consumers::CaName) -> Option<&'static str> {
    match ca {
        crate::ca::consumers::CaName::Ca => Some("client-ca-file"),
        crate::ca::consumers::CaName::FrontProxyCa => Some("requestheader-client-ca-file"),
        crate::ca::consumers::CaName::EtcdCa => None,
    }
}

/// Waits until the bundle kube-apiserver publishes holds every certificate of `want` (SHA-256)
/// and none of `gone`, removing those of `gone` from the ConfigMap itself; polls every `poll`,
/// at most `bound`. `Ok(None)` when the node has no admin kubeconfig (nothing to ask);
/// `Ok(Some(waited))` once published.
pub fn settle_published(
    node: &Node,
    key: &str,
    want: &[String],
    gone: &[String],
    bound: Duration,
    poll: Duration,
) -> Result<Option<Duration>, String> {
    let Some(admin) = crate::pass::events::admin_conf(node) else {
        return Ok(None);
    };
    let start = Instant::now();
    let mut last;
    loop {
        match published(node, &admin, key) {
            Ok((map, certs)) => {
                let has = |sha: &String| certs.iter().any(|c| &c.sha256_hex() == sha);
                let stale = certs.iter().any(|c| gone.contains(&c.sha256_hex()));
                if want.iter().all(has) && !stale {
                    return Ok(Some(start.elapsed()));
                }
                last = format!("it publishes {} certificate(s), not these", certs.len());
                if want.iter().all(has) && stale {
                    remove(node, &admin, (map, key), &certs, gone)?;
                }
            }
            Err(e) => last = e,
        }
        if start.elapsed() >= bound {
            return Err(format!(
                "kube-apiserver did not publish the CA bundle of the files in \
                 kube-system/extension-apiserver-authentication ({key}) within {}s ({last}): it \
                 has not loaded the bundle, and would refuse a certificate of the CA the files \
                 hold",
                bound.as_secs()
            ));
        }
        std::thread::sleep(poll);
    }
}

/// The ConfigMap and the certificates of its bundle.
fn published(node: &Node, admin: &str, key: &str) -> Result<(Value, Vec<Cert>), String> {
    let map = crate::pass::events::get(node, admin, CONFIGMAP)?;
    let pem = map["data"][key]
        .as_str()
        .ok_or_else(|| format!("the ConfigMap has no {key}"))?;
    let certs = Cert::all_from_pem(pem.as_bytes(), MAX_BUNDLE_CERTS).map_err(|e| e.to_string())?;
    Ok((map, certs))
}

/// Writes the ConfigMap back without the certificates of `gone` (its resourceVersion kept: a
/// conflict is read again at the next poll).
fn remove(
    node: &Node,
    admin: &str,
    (mut map, key): (Value, &str),
    certs: &[Cert],
    gone: &[String],
) -> Result<(), String> {
    let mut pem = String::new();
    for c in certs.iter().filter(|c| !gone.contains(&c.sha256_hex())) {
        pem.push_str(&c.to_pem().map_err(|e| e.to_string())?);
    }
    map["data"][key] = Value::String(pem);
    if crate::pass::events::put(node, admin, CONFIGMAP, &map)? {
        log::info!(
            "removed {} certificate(s) from kube-system/extension-apiserver-authentication \
             ({key}): kube-apiserver publishes what the ConfigMap holds and its files add",
            gone.len()
        );
    }
    Ok(())
}
