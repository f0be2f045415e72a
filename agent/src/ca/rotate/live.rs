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

/// How long the ConfigMap must stay without the CAs a stage took out of the files before the
/// stage ends. An apiserver that has not reloaded its files yet still holds such a CA and
/// publishes it again (the union) when the ConfigMap changes; each reloads about once a minute
/// (58-60 s measured), so once the ConfigMap has stayed clean past one reload of every
/// apiserver, none adds it again. Measured without this wait: the old front-proxy CA was back
/// in the ConfigMap seconds after the last node removed it (one CI run under load).
const REMOVED_FOR: Duration = Duration::from_secs(75);

/// Waits until the bundle kube-apiserver publishes holds every certificate of `want` (SHA-256)
/// and none of `gone`, removing those of `gone` from the ConfigMap itself (again whenever an
/// apiserver publishes one again) until it has stayed out for [`REMOVED_FOR`]; polls every
/// `poll`, at most `bound` (and [`REMOVED_FOR`] when `gone` holds a CA). `Ok(None)` when the
/// node has no admin kubeconfig (nothing to ask); `Ok(Some(waited))` once published.
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
    let mut clean_since: Option<Instant> = None;
    // Staying out adds its own time to the bound, only where something is to stay out.
    let limit = bound
        + if gone.is_empty() {
            Duration::ZERO
        } else {
            REMOVED_FOR
        };
    loop {
        match published(node, &admin, key) {
            Ok((map, certs)) => {
                let has = |sha: &String| certs.iter().any(|c| &c.sha256_hex() == sha);
                let stale = certs.iter().any(|c| gone.contains(&c.sha256_hex()));
                if want.iter().all(has) && !stale {
                    let since = *clean_since.get_or_insert_with(Instant::now);
                    if gone.is_empty() || since.elapsed() >= REMOVED_FOR {
                        return Ok(Some(start.elapsed()));
                    }
                    last = format!(
                        "what the stage took out has stayed out {} s of {} s",
                        since.elapsed().as_secs(),
                        REMOVED_FOR.as_secs()
                    );
                } else {
                    clean_since = None;
                    last = format!("it publishes {} certificate(s), not these", certs.len());
                    if want.iter().all(has) && stale {
                        remove(node, &admin, (map, key), &certs, gone)?;
                    }
                }
            }
            Err(e) => last = e,
        }
        if start.elapsed() >= limit {
            return Err(format!(
                "kube-apiserver did not publish the CA bundle of the files in \
                 kube-system/extension-apiserver-authentication ({key}) within {}s ({last}): it \
                 has not loaded the bundle, and would refuse a certificate of the CA the files \
                 hold",
                limit.as_secs()
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

/// Cluster CA, trust-in: waits until kube-apiserver at `address` authenticates a client
/// certificate of the new CA `new`, polling every `poll`, at most `bound`. The certificate is
/// made in memory for the probe and never written (CN `certrotor:trust-probe`, no group: an
/// authenticated request is refused 403 at worst, an unauthenticated one 401); its key is
/// scrubbed when dropped. The published bundle ([`settle_published`]) is the union of every
/// apiserver's: only a request to this node's own tells that it has loaded the new CA.
pub fn wait_accepts_clients_of(
    address: std::net::SocketAddr,
    trust_pem: &[u8],
    new: &super::files::CaPair,
    (bound, poll): (Duration, Duration),
    now: i64,
) -> Result<Duration, String> {
    use crate::pki::{
        Issuance, PrivateKey, Profile, Signer, issue, kubeadm_subject, random_serial,
    };
    let e = |e: crate::pki::PkiError| format!("making the trust probe's certificate: {e}");
    let ca_key = PrivateKey::read_pem(&new.key_pem).map_err(e)?;
    let key = PrivateKey::generate(crate::pki::KeyAlgorithm::EcdsaP256).map_err(e)?;
    let profile = Profile::client(kubeadm_subject("certrotor:trust-probe", &[]).map_err(e)?);
    let signer = Signer {
        cert: &new.cert,
        key: &ca_key,
    };
    let issuance = Issuance {
        serial: random_serial().map_err(e)?,
        not_before: now - crate::renew::BACKDATE,
        not_after: now + 3600,
    };
    let cert = issue(
        &profile,
        &key.spki().map_err(e)?,
        Some(&signer),
        &key,
        issuance,
    )
    .map_err(e)?;
    let probe = crate::restart::verify::Probe {
        address,
        path: "/readyz".into(),
        ca_pem: Some(trust_pem.to_vec()),
        client_cert_pem: Some(cert.to_pem().map_err(e)?.into_bytes()),
        client_key_pem: Some(key.to_pem(key.encoding).map_err(e)?.0.as_bytes().to_vec()),
        timeout: poll.max(Duration::from_secs(3)),
    };
    let start = Instant::now();
    loop {
        let last = match crate::restart::verify::probe(&probe) {
            Ok(o) if o.status != 401 => return Ok(start.elapsed()),
            Ok(_) => "HTTP 401: it does not trust the new CA yet".to_string(),
            Err(err) => err.to_string(),
        };
        if start.elapsed() >= bound {
            return Err(format!(
                "kube-apiserver ({address}) did not accept a client certificate of the new CA \
                 within {}s ({last}): it has not loaded the CA file's bundle, and would refuse \
                 the clients the issue gives certificates of the new CA",
                bound.as_secs()
            ));
        }
        std::thread::sleep(poll);
    }
}
