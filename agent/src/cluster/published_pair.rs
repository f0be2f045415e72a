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
/// published one is absent, expired or due (within `within` seconds), or of another CA than the
/// one that signs now (a rotation of the etcd CA), and this node's own pair is not. The write
/// is a compare-and-swap on the key's revision, so that of the etcd nodes that renewed in the
/// same hour exactly one pair is published. `Ok(Some(what))` when published.
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
    let signer = signer_of(local)?;
    let Some(revision) = replaceable(
        s.client.get_versioned(PAIR_KEY)?,
        &cert,
        signer,
        (now, within),
    ) else {
        return Ok(None);
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

/// The revision to replace (0: none published) when this node's pair `cert` should replace
/// the published one: the published one is absent, unreadable, expired or due, or (during a
/// rotation of the etcd CA, the signer changing) of another CA than `signer` that signed
/// `cert` and issued before `cert`; `None` to leave it (ours, another etcd node's fresh pair of
/// the same CA: one pair cluster-wide; ours not of the CA that signs now; or another CA's pair
/// newer than ours: an etcd node still at trust-in, its old pair from before the rotation,
/// leaves the new CA's pair that a node at the issue published, and at an abort the old CA's
/// pair issued again replaces the new CA's).
fn replaceable(
    existing: Option<(Vec<u8>, i64)>,
    cert: &crate::pki::Cert,
    signer: Option<crate::pki::Cert>,
    (now, within): (i64, i64),
) -> Option<i64> {
    let of_signer = |c: &crate::pki::Cert| {
        signer
            .as_ref()
            .is_none_or(|s| c.verify_signed_by(s, "etcd-ca").is_ok())
    };
    if !of_signer(cert) {
        return None;
    }
    let Some((bytes, revision)) = existing else {
        return Some(0);
    };
    match cert_of(bytes) {
        Some(p)
            if p.sha256_hex() == cert.sha256_hex()
                || (p.not_after() - now > within
                    && (of_signer(&p) || p.not_before() >= cert.not_before())) =>
        {
            None
        }
        _ => Some(revision),
    }
}

/// The etcd CA that signs on this etcd node: the first certificate of its CA file (during a
/// rotation the file holds two; the signer's comes first).
fn signer_of(local: &Node) -> Result<Option<crate::pki::Cert>, ClusterError> {
    let Some(ca) = local
        .entries()
        .iter()
        .find(|e| e.name == catalog::names::ETCDADM_CA && local.root().join(&e.path).exists())
    else {
        return Ok(None);
    };
    let pem = read_rel(local.root(), &ca.path)?;
    crate::pki::Cert::from_pem(&pem)
        .map(Some)
        .map_err(|e| err(format!("'{}': {e}", ca.path)))
}

/// The certificate of the published pair, if any (readable or not: `None` for either absent
/// or unreadable; the key is not looked at).
pub fn published_cert(s: &Session) -> Result<Option<crate::pki::Cert>, ClusterError> {
    Ok(s.client.get(PAIR_KEY)?.and_then(cert_of))
}

/// The certificate of a published pair's value (`None`: not readable); the value, which holds
/// the key, is zeroed.
fn cert_of(value: Vec<u8>) -> Option<crate::pki::Cert> {
    let value = zeroize::Zeroizing::new(value);
    let pair = serde_json::from_slice::<PublishedPair>(&value).ok()?;
    crate::pki::Cert::from_pem(pair.cert_pem.as_bytes()).ok()
}

/// On an external-etcd control plane: the published pair as an `etcd-client import` bundle
/// (certificate, then key), when it differs from the installed certificate and does not expire
/// before it, or is of the CA that signs now where the installed one is not (a rotation of the
/// etcd CA). The caller checks it as `import` does before installing. Zero the bundle after use.
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
    // The control plane's etcd CA file: the CA that signs now first (a rotation of the etcd
    // CA puts the new one first at its issue, the old one at an abort).
    let cas = read_rel(root, &format!("{}/pki/etcd/ca.crt", layout.dir))
        .ok()
        .and_then(|b| Cert::all_from_pem(&b, crate::pki::MAX_BUNDLE_CERTS).ok())
        .unwrap_or_default();
    let installed = local
        .entry_of(layout, catalog::names::APISERVER_ETCD_CLIENT)
        .and_then(|entry| read_rel(root, &entry.path).ok())
        .and_then(|b| Cert::from_pem(&b).ok());
    if let Ok(published) = Cert::from_pem(pair.cert_pem.as_bytes())
        && !installable(&published, installed.as_ref(), &cas)
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

/// Whether a control plane offers the `published` pair for installation over its `installed`
/// one, `cas` its etcd CA file (the CA that signs there first; empty when unreadable: the
/// installation checks the pair). Never a pair of the rotation's other CA (in the file, not
/// first): during a rotation the control plane trusts both CAs from its trust-in but takes the
/// new CA's pair at its own issue only, so that an abort before it never leaves it with a pair
/// the etcd members stop trusting. A pair of the signing CA replaces one of another CA, even a
/// longer-lived one; else only a longer-lived one is offered (one of a CA the file does not
/// hold is then refused by the installation, with the reason).
fn installable(
    published: &crate::pki::Cert,
    installed: Option<&crate::pki::Cert>,
    cas: &[crate::pki::Cert],
) -> bool {
    let signed_by =
        |c: &crate::pki::Cert, ca: &crate::pki::Cert| c.verify_signed_by(ca, "etcd-ca").is_ok();
    let of_signer = |c: &crate::pki::Cert| cas.first().is_none_or(|s| signed_by(c, s));
    if !of_signer(published) && cas.iter().skip(1).any(|ca| signed_by(published, ca)) {
        return false;
    }
    installed.is_none_or(|i| {
        published.sha256_hex() != i.sha256_hex()
            && (published.not_after() > i.not_after() || (of_signer(published) && !of_signer(i)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{self, Cert, Issuance, KeyAlgorithm, PrivateKey, Profile};

    const NOW: i64 = 1_800_000_000;
    const DAY: i64 = 86_400;

    fn ca(cn: &str) -> (Cert, PrivateKey) {
        pki::test_ca(cn, (NOW - DAY, NOW + 3650 * DAY))
    }

    /// An apiserver-etcd-client certificate of `ca`, valid for `days` from now, issued a day ago.
    fn client(ca: &(Cert, PrivateKey), days: i64) -> Cert {
        client_issued(ca, days, NOW - DAY)
    }

    /// An apiserver-etcd-client certificate of `ca`, valid from `not_before` to `days` from now.
    fn client_issued((ca, ca_key): &(Cert, PrivateKey), days: i64, not_before: i64) -> Cert {
        let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let subject = pki::kubeadm_subject("kube-apiserver-etcd-client", &[]).unwrap();
        let window = Issuance {
            serial: days as u64 + 2,
            not_before,
            not_after: NOW + days * DAY,
        };
        let spki = key.spki().unwrap();
        let signer = pki::Signer {
            cert: ca,
            key: ca_key,
        };
        pki::issue(
            &Profile::client(subject),
            &spki,
            Some(&signer),
            &key,
            window,
        )
        .unwrap()
    }

    fn published(c: &Cert, revision: i64) -> Option<(Vec<u8>, i64)> {
        let pair = PublishedPair {
            version: PUBLISHED_PAIR_VERSION,
            cert_pem: c.to_pem().unwrap(),
            key_pem: String::new(),
            published_by: "e-0".into(),
            published_at: String::new(),
        };
        Some((serde_json::to_vec(&pair).unwrap(), revision))
    }

    #[test]
    fn one_pair_of_the_signing_ca_is_published_and_a_rotation_replaces_it() {
        let (old, new) = (ca("etcd-ca"), ca("etcd-ca"));
        let within = 30 * DAY;
        let at = (NOW, within);
        let mine = client(&old, 365);
        // Nothing published: published (a create, revision 0).
        assert_eq!(replaceable(None, &mine, Some(old.0.clone()), at), Some(0));
        // Ours, or another node's fresh pair of the same CA: left alone.
        assert_eq!(
            replaceable(published(&mine, 5), &mine, Some(old.0.clone()), at),
            None
        );
        let theirs = client(&old, 300);
        assert_eq!(
            replaceable(published(&theirs, 5), &mine, Some(old.0.clone()), at),
            None
        );
        // Another node's pair due, or unreadable: replaced at its revision.
        let due = client(&old, 10);
        assert_eq!(
            replaceable(published(&due, 6), &mine, Some(old.0.clone()), at),
            Some(6)
        );
        let junk = Some((b"{not json".to_vec(), 7));
        assert_eq!(replaceable(junk, &mine, Some(old.0.clone()), at), Some(7));
        // The issue of a rotation: the new CA signs; a fresh pair of the old CA is replaced.
        let issued = client_issued(&new, 365, NOW);
        assert_eq!(
            replaceable(published(&theirs, 8), &issued, Some(new.0.clone()), at),
            Some(8)
        );
        // This node's own pair is not of the CA that signs now: never published.
        assert_eq!(
            replaceable(published(&due, 9), &mine, Some(new.0.clone()), at),
            None
        );
        assert_eq!(replaceable(None, &mine, Some(new.0.clone()), at), None);
        // A node still at trust-in (the old CA signs there) leaves the new CA's pair: its own
        // is from before the rotation.
        assert_eq!(
            replaceable(published(&issued, 10), &mine, Some(old.0.clone()), at),
            None
        );
        // An abort after the issue: the old CA signs again, and its pair issued again replaces
        // the new CA's.
        let again = client_issued(&old, 365, NOW + 60);
        assert_eq!(
            replaceable(published(&issued, 10), &again, Some(old.0.clone()), at),
            Some(10)
        );
    }

    #[test]
    fn a_control_plane_installs_only_a_pair_of_the_ca_that_signs_there() {
        let (old, new) = (ca("etcd-ca"), ca("etcd-ca"));
        let (installed, longer) = (client(&old, 100), client(&old, 365));
        let (one, old_first, new_first) = (
            [old.0.clone()],
            [old.0.clone(), new.0.clone()],
            [new.0.clone(), old.0.clone()],
        );
        // Outside a rotation: a longer-lived pair, not the same one nor a shorter one.
        assert!(installable(&longer, Some(&installed), &one));
        assert!(!installable(&installed, Some(&installed), &one));
        assert!(!installable(&installed, Some(&longer), &one));
        assert!(installable(&installed, None, &one));
        // A pair of a CA the file does not hold: offered when it lives longer, for the
        // installation to refuse it with the reason; never over a longer-lived one. A pair of
        // the CA replaces a foreign one installed.
        let stranger = ca("etcd-ca");
        let foreign = client(&stranger, 1000);
        assert!(installable(&foreign, Some(&installed), &one));
        assert!(!installable(&client(&stranger, 10), Some(&installed), &one));
        assert!(installable(&installed, Some(&foreign), &one));
        // Trust-in done, the old CA first: the new CA's pair waits for this node's issue,
        // however long it lives (an abort here must not leave it installed).
        let of_new = client(&new, 365);
        assert!(!installable(&of_new, Some(&installed), &old_first));
        // At the issue the new CA comes first: its pair replaces the old one.
        assert!(installable(&of_new, Some(&installed), &new_first));
        // At an abort the old CA comes first again: its pair replaces the new one, even a
        // shorter-lived one (the old CA's end near).
        let short = client(&old, 30);
        assert!(installable(&short, Some(&of_new), &old_first));
        // An unreadable CA file: as outside a rotation (the installation checks the chain).
        assert!(installable(&longer, Some(&installed), &[]));
        assert!(!installable(&installed, Some(&longer), &[]));
    }
}
