//! External etcd: the apiserver-etcd-client pair through etcd. An etcd node publishes its
//! renewed pair under [`PAIR_KEY`]; a control plane reads it back as an import bundle. The value
//! holds the key PEM: it is never logged.

use serde::Serialize;

use super::session::Session;
use super::{ClusterError, PAIR_KEY, err, read_rel};
use crate::node::{Node, catalog};

/// The format of [`PublishedPair`] this build writes and reads.
const PUBLISHED_PAIR_VERSION: u32 = 1;

/// What [`PAIR_KEY`] holds. The key PEM is in it: never log this value.
#[derive(Serialize, serde::Deserialize)]
struct PublishedPair {
    version: u32,
    cert_pem: String,
    key_pem: String,
    published_by: String,
    published_at: String,
}

impl Drop for PublishedPair {
    fn drop(&mut self) {
        // Overwrite the key text before its buffer is freed.
        zeroize::Zeroize::zeroize(&mut self.key_pem);
    }
}

/// On an etcd node (etcdadm layout): publishes this node's apiserver-etcd-client pair when the
/// published one is absent, expired or due (within `within` seconds) and this node's own pair is
/// not. The write is a compare-and-swap on the key's revision, so that of the etcd nodes that
/// renewed in the same hour exactly one pair is published. `Ok(Some(what))` when published.
pub fn publish_if_due(
    s: &Session,
    local: &Node,
    within: i64,
) -> Result<Option<String>, ClusterError> {
    use crate::pki::{Cert, PrivateKey};
    let root = local.root();
    let Some(entry) = local
        .entries()
        .iter()
        .find(|e| e.name == "etcdadm-apiserver-etcd-client" && root.join(&e.path).exists())
    else {
        return Ok(None);
    };
    let now = s.clock.now();
    let cert_pem = read_rel(root, &entry.path)?;
    let cert = Cert::from_pem(&cert_pem).map_err(|e| err(format!("'{}': {e}", entry.path)))?;
    if cert.not_after() - now <= within {
        // Not renewed (yet): nothing worth publishing.
        return Ok(None);
    }
    let existing = s.client.get_versioned(PAIR_KEY)?;
    let revision = match &existing {
        None => 0,
        Some((bytes, rev)) => {
            let published = serde_json::from_slice::<PublishedPair>(bytes)
                .ok()
                .and_then(|p| Cert::from_pem(p.cert_pem.as_bytes()).ok());
            if let Some(p) = published
                && (p.sha256_hex() == cert.sha256_hex() || p.not_after() - now > within)
            {
                // Ours, or another etcd node's fresh pair: one pair cluster-wide.
                return Ok(None);
            }
            *rev
        }
    };
    let key_rel = entry.key_path.clone().unwrap_or_default();
    let mut key_pem = read_rel(root, &key_rel)?;
    let key = PrivateKey::from_pem(&key_pem).map_err(|e| err(format!("'{key_rel}': {e}")));
    let matches = key.as_ref().is_ok_and(|k| k.matches(&cert));
    let pair = PublishedPair {
        version: PUBLISHED_PAIR_VERSION,
        cert_pem: String::from_utf8_lossy(&cert_pem).into_owned(),
        key_pem: String::from_utf8_lossy(&key_pem).into_owned(),
        published_by: s.node.name.clone(),
        published_at: crate::sys::clock::rfc3339(now),
    };
    zeroize::Zeroize::zeroize(&mut key_pem);
    key?;
    if !matches {
        return Err(err(format!(
            "'{key_rel}' does not match '{}'; not published",
            entry.path
        )));
    }
    let mut value = serde_json::to_vec(&pair).map_err(|e| err(e.to_string()))?;
    let written = s.client.put_if(PAIR_KEY, &value, revision);
    zeroize::Zeroize::zeroize(&mut value);
    if !written? {
        return Ok(None);
    }
    let what = format!(
        "published serial {} (expires {}) under {PAIR_KEY}",
        cert.facts().serial,
        crate::sys::clock::rfc3339(cert.not_after())
    );
    log::info!("cluster mode: {what}");
    Ok(Some(what))
}

/// On an external-etcd control plane: the published pair as an `etcd-client import` bundle
/// (certificate, then key), when it differs from the installed certificate and does not expire
/// before it. The caller checks it as `import` does before installing. Zero the bundle after use.
pub fn published_bundle(s: &Session, local: &Node) -> Result<Option<Vec<u8>>, ClusterError> {
    use crate::pki::Cert;
    let root = local.root();
    let Some(layout) = local
        .layouts()
        .iter()
        .find(|l| l.etcd == catalog::EtcdTopology::External)
    else {
        return Ok(None);
    };
    let Some(bytes) = s.client.get(PAIR_KEY)? else {
        return Ok(None);
    };
    let bytes = zeroize::Zeroizing::new(bytes);
    let pair: PublishedPair = serde_json::from_slice(&bytes).map_err(|e| {
        err(format!(
            "the pair published under {PAIR_KEY} is not readable ({e}); nothing was installed, the current pair stays in use; run 'certrotor run' on an etcd node to publish it again, or use 'etcd-client export/import'"
        ))
    })?;
    if pair.version != PUBLISHED_PAIR_VERSION {
        return Err(err(format!(
            "the pair published under {PAIR_KEY} is version {}, which this certrotor does not know (it reads version {PUBLISHED_PAIR_VERSION}); nothing was installed, the current pair stays in use: run the certrotor release that published it on this node, or use 'etcd-client export/import'",
            pair.version
        )));
    }
    if let Some(entry) = local.entry_of(layout, catalog::names::APISERVER_ETCD_CLIENT)
        && let Ok(installed) = read_rel(root, &entry.path)
        && let Ok(installed) = Cert::from_pem(&installed)
        && let Ok(published) = Cert::from_pem(pair.cert_pem.as_bytes())
        && (published.sha256_hex() == installed.sha256_hex()
            || published.not_after() <= installed.not_after())
    {
        return Ok(None);
    }
    let mut bundle = pair.cert_pem.clone().into_bytes();
    if !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pair.key_pem.as_bytes());
    Ok(Some(bundle))
}
