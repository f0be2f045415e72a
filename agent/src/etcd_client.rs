//! External etcd: carry the apiserver-etcd-client pair from an etcd node to a control plane.
//!
//! On an external-etcd cluster the control plane holds only the etcd CA certificate, so it
//! cannot sign its own etcd client certificate. The etcd node renews it (`certrotor renew`),
//! `export` writes the pair as one PEM bundle, and `import` on each control-plane node checks it
//! (chains to `pki/etcd/ca.crt`, matches its key, carries clientAuth, outlives the one it
//! replaces) and installs it in one transaction, under the names the layout uses (Bottlerocket:
//! `pki/server-etcd-client.crt` with `pki/apiserver-etcd-client.key`).

use std::path::Path;

use crate::catalog::{self, EtcdTopology, Kind};
use crate::cli::Failure;
use crate::fsutil;
use crate::ops::{self, WriteOptions};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES, PrivateKey, oid};
use crate::txn::{self, Change};

/// The bundle `export` writes: the certificate, then its key.
pub fn export(root: &Path) -> Result<Vec<u8>, Failure> {
    crate::recover_before_reading(root)?;
    let layouts = catalog::detect(root);
    let entries = catalog::entries(root, &layouts);
    let entry = entries
        .iter()
        .find(|e| e.name == catalog::names::ETCDADM_APISERVER_ETCD_CLIENT)
        .or_else(|| entries.iter().find(|e| e.name == catalog::names::APISERVER_ETCD_CLIENT && e.kind == Kind::Leaf))
        .ok_or_else(|| {
            Failure::failed(format!(
                "no apiserver-etcd-client certificate under '{}'; export runs on the etcd node ({})",
                root.display(),
                catalog::layout_summary()
            ))
        })?;
    let cert_bytes = read(root, &entry.path)?;
    let key_path = entry.key_path.clone().unwrap_or_default();
    let key_bytes = read(root, &key_path)?;
    let cert = Cert::from_pem(&cert_bytes)
        .map_err(|e| Failure::failed(format!("'{}': {e}", entry.path)))?;
    let key = PrivateKey::from_pem(&key_bytes)
        .map_err(|e| Failure::failed(format!("'{key_path}': {e}")))?;
    if !key.matches(&cert) {
        return Err(Failure::failed(format!(
            "'{key_path}' does not match '{}'; renew it first",
            entry.path
        )));
    }
    if cert.not_after() <= crate::clock::now() {
        return Err(Failure::failed(format!(
            "'{}' has expired; run 'certrotor renew' on this node first",
            entry.path
        )));
    }
    let mut bundle = cert
        .to_pem()
        .map_err(|e| Failure::failed(e.to_string()))?
        .into_bytes();
    bundle.extend_from_slice(
        key.to_pem(key.encoding)
            .map_err(|e| Failure::failed(e.to_string()))?
            .0
            .as_bytes(),
    );
    log::info!(
        "exported '{}' (serial {}, expires {})",
        entry.path,
        cert.facts().serial,
        crate::clock::rfc3339(cert.not_after())
    );
    Ok(bundle)
}

fn read(root: &Path, rel: &str) -> Result<Vec<u8>, Failure> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(Failure::failed(format!(
            "'{rel}' does not exist under '{}'",
            root.display()
        ))),
        Err(e) => Err(Failure::failed(e.to_string())),
    }
}

/// Installs a bundle on a control-plane node, under a lock the caller holds; returns the files
/// written and the backup id.
pub fn install(
    root: &Path,
    bundle: &[u8],
    opts: &WriteOptions,
) -> Result<(Vec<String>, String), Failure> {
    let bad = |m: String| Failure::failed(format!("{m}; nothing was changed"));
    let cert = Cert::from_pem(bundle).map_err(|e| bad(format!("the bundle: {e}")))?;
    let key = PrivateKey::from_pem(bundle).map_err(|e| bad(format!("the bundle's key: {e}")))?;
    let layout = catalog::detect(root)
        .into_iter()
        .find(|l| l.etcd == EtcdTopology::External)
        .ok_or_else(|| {
            bad(format!(
                "no external-etcd control plane under '{}' (a kubeadm folder with pki/etcd/ca.crt and no etcd CA key)",
                root.display()
            ))
        })?;
    let ca_path = format!("{}/pki/etcd/ca.crt", layout.dir);
    let ca =
        Cert::from_pem(&read(root, &ca_path)?).map_err(|e| bad(format!("'{ca_path}': {e}")))?;
    cert.verify_signed_by(&ca, "etcd-ca")
        .map_err(|e| bad(format!("the bundle's certificate: {e}")))?;
    if !key.matches(&cert) {
        return Err(bad("the bundle's key does not match its certificate".into()));
    }
    if !cert.ext_key_usage_oids().contains(&oid::CLIENT_AUTH) {
        return Err(bad(
            "the bundle's certificate does not carry clientAuth".into()
        ));
    }
    let now = crate::clock::now();
    if cert.not_after() <= now || cert.not_before() > now + 300 {
        return Err(bad(format!(
            "the bundle's certificate is not valid now ({} .. {})",
            crate::clock::rfc3339(cert.not_before()),
            crate::clock::rfc3339(cert.not_after())
        )));
    }
    let entries = catalog::entries(root, std::slice::from_ref(&layout));
    let entry = entries
        .iter()
        .find(|e| e.name == catalog::names::APISERVER_ETCD_CLIENT)
        .ok_or_else(|| bad("the layout has no apiserver-etcd-client entry".into()))?;
    // Every name the certificate lives under: the catalog's, plus the other name if present.
    let mut cert_paths = vec![entry.path.clone()];
    for alt in ["apiserver-etcd-client.crt", "server-etcd-client.crt"] {
        let p = format!("{}/pki/{alt}", layout.dir);
        if p != entry.path && root.join(&p).exists() {
            cert_paths.push(p);
        }
    }
    if let Ok(Some(old_bytes)) = fsutil::read_in_root(root, &entry.path, MAX_PEM_FILE_BYTES)
        && let Ok(old) = Cert::from_pem(&old_bytes)
        && cert.not_after() <= old.not_after()
    {
        return Err(bad(format!(
            "the bundle's certificate expires {} which is not later than the installed one ({}); export a renewed one",
            crate::clock::rfc3339(cert.not_after()),
            crate::clock::rfc3339(old.not_after())
        )));
    }
    let key_path = entry.key_path.clone().unwrap_or_default();
    let cert_pem = cert.to_pem().map_err(|e| bad(e.to_string()))?.into_bytes();
    let mut changes = vec![Change {
        rel: key_path,
        content: Some(
            key.to_pem(key.encoding)
                .map_err(|e| bad(e.to_string()))?
                .0
                .as_bytes()
                .to_vec(),
        ),
        mode_if_new: 0o600,
    }];
    for p in cert_paths {
        changes.push(Change {
            rel: p,
            content: Some(cert_pem.clone()),
            mode_if_new: 0o644,
        });
    }
    let outcome =
        txn::apply(root, &changes, "import", now, opts.retention).map_err(ops::txn_failure)?;
    Ok((outcome.files, outcome.backup_id))
}
