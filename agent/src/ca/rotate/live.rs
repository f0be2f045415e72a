//! Live proof of a trust change that no restart verifies: kube-apiserver reloads its
//! `--requestheader-client-ca-file` by itself (about once a minute, measured: 58-60 s) and
//! publishes it in `kube-system/extension-apiserver-authentication`, where aggregated API
//! servers read whom to trust as a front proxy. Until the new front-proxy CA is published
//! there, a `front-proxy-client` issued by it would be refused by them: the issue waits for it.

use std::time::{Duration, Instant};

use crate::node::Node;
use crate::pki::{Cert, MAX_BUNDLE_CERTS};

/// Where kube-apiserver publishes its request-header CA bundle.
const CONFIGMAP: &str =
    "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
const KEY: &str = "requestheader-client-ca-file";

/// Waits until the bundle kube-apiserver publishes holds exactly the certificates `want`
/// (SHA-256), polling every `poll`, at most `bound`. `Ok(None)` when the node has no admin
/// kubeconfig (nothing to ask); `Ok(Some(waited))` once published.
pub fn wait_published(
    node: &Node,
    want: &[String],
    bound: Duration,
    poll: Duration,
) -> Result<Option<Duration>, String> {
    let Some(admin) = crate::pass::events::admin_conf(node) else {
        return Ok(None);
    };
    let start = Instant::now();
    let mut last;
    loop {
        match published(node, &admin) {
            Ok(got) if same(&got, want) => return Ok(Some(start.elapsed())),
            Ok(got) => last = format!("it publishes {} certificate(s), not these", got.len()),
            Err(e) => last = e,
        }
        if start.elapsed() >= bound {
            return Err(format!(
                "kube-apiserver did not publish the front-proxy CA bundle of the files in \
                 kube-system/extension-apiserver-authentication within {}s ({last}); aggregated \
                 API servers would refuse a front-proxy-client of the new CA",
                bound.as_secs()
            ));
        }
        std::thread::sleep(poll);
    }
}

fn same(got: &[String], want: &[String]) -> bool {
    let mut a = got.to_vec();
    let mut b = want.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// The SHA-256 of each certificate of the published bundle.
fn published(node: &Node, admin: &str) -> Result<Vec<String>, String> {
    let v = crate::pass::events::get(node, admin, CONFIGMAP)?;
    let pem = v["data"][KEY]
        .as_str()
        .ok_or_else(|| format!("the ConfigMap has no {KEY}"))?;
    let certs = Cert::all_from_pem(pem.as_bytes(), MAX_BUNDLE_CERTS).map_err(|e| e.to_string())?;
    Ok(certs.iter().map(Cert::sha256_hex).collect())
}
