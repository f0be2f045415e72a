//! External etcd: carry the apiserver-etcd-client pair from an etcd node to a control plane.
//!
//! On an external-etcd cluster the control plane holds only the etcd CA certificate, so it
//! cannot sign its own etcd client certificate. The etcd node renews it (`certrotor renew`),
//! `export` writes the pair as one PEM bundle, and `import` on each control-plane node checks it
//! (chains to `pki/etcd/ca.crt`, matches its key, carries clientAuth, outlives the one it
//! replaces) and installs it in one transaction, under the names the layout uses (Bottlerocket:
//! `pki/server-etcd-client.crt` with `pki/apiserver-etcd-client.key`).

use std::fmt;
use std::path::Path;

use crate::node::Node;
use crate::node::catalog::{self, EtcdTopology, Kind};
use crate::pass::ops::{OpsError, WriteOptions};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES, PkiError, PrivateKey, oid};
use crate::sys::fsutil::{self, ReadError};
use crate::txn::{self, Change, TxnError};

/// Why exporting or installing the apiserver-etcd-client pair failed, with its typed cause.
/// `Display` is the whole sentence (it includes the cause's text); `source()` is the cause.
#[derive(Debug)]
pub enum EtcdClientError {
    /// Completing an interrupted transaction before reading failed.
    Recover(Box<OpsError>),
    /// No apiserver-etcd-client certificate to export under the root.
    NothingToExport { root: String },
    /// A file could not be read.
    Read(ReadError),
    /// A file the layout names does not exist.
    Missing { path: String, root: String },
    /// A certificate or key of the node does not decode.
    Pem { path: String, source: PkiError },
    /// The key on the etcd node does not match its certificate.
    KeyMismatch { key: String, cert: String },
    /// The certificate to export has expired.
    Expired { path: String },
    /// Encoding the bundle failed.
    Encode(PkiError),
    /// The bundle is refused; nothing was changed.
    Refused {
        what: String,
        source: Option<PkiError>,
    },
    /// The transaction that installs the pair failed.
    Txn(TxnError),
}

impl fmt::Display for EtcdClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdClientError::Recover(e) => write!(f, "{e}"),
            EtcdClientError::NothingToExport { root } => write!(
                f,
                "no apiserver-etcd-client certificate under '{root}'; export runs on the etcd node ({})",
                catalog::layout_summary()
            ),
            EtcdClientError::Read(e) => write!(f, "{e}"),
            EtcdClientError::Missing { path, root } => {
                write!(f, "'{path}' does not exist under '{root}'")
            }
            EtcdClientError::Pem { path, source } => write!(f, "'{path}': {source}"),
            EtcdClientError::KeyMismatch { key, cert } => {
                write!(f, "'{key}' does not match '{cert}'; renew it first")
            }
            EtcdClientError::Expired { path } => write!(
                f,
                "'{path}' has expired; run 'certrotor renew' on this node first"
            ),
            EtcdClientError::Encode(e) => write!(f, "cannot encode the bundle: {e}"),
            EtcdClientError::Refused { what, source } => match source {
                Some(e) => write!(f, "{what}: {e}; nothing was changed"),
                None => write!(f, "{what}; nothing was changed"),
            },
            EtcdClientError::Txn(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EtcdClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EtcdClientError::Recover(e) => Some(e.as_ref()),
            EtcdClientError::Read(e) => Some(e),
            EtcdClientError::Pem { source, .. } => Some(source),
            EtcdClientError::Encode(e) => Some(e),
            EtcdClientError::Refused { source, .. } => source
                .as_ref()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            EtcdClientError::Txn(e) => Some(e),
            EtcdClientError::NothingToExport { .. }
            | EtcdClientError::Missing { .. }
            | EtcdClientError::KeyMismatch { .. }
            | EtcdClientError::Expired { .. } => None,
        }
    }
}

/// A refusal of the bundle with its cause.
fn refused(what: impl Into<String>) -> impl FnOnce(PkiError) -> EtcdClientError {
    let what = what.into();
    move |e| EtcdClientError::Refused {
        what,
        source: Some(e),
    }
}

/// A refusal of the bundle without an underlying error.
fn refuse(what: impl Into<String>) -> EtcdClientError {
    EtcdClientError::Refused {
        what: what.into(),
        source: None,
    }
}

/// The bundle `export` writes: the certificate, then its key. `now`: Unix seconds, from the
/// edge's clock (an expired certificate is refused).
pub fn export(root: &Path, now: i64) -> Result<Vec<u8>, EtcdClientError> {
    crate::pass::ops::recover_before_reading(root)
        .map_err(|e| EtcdClientError::Recover(Box::new(e)))?;
    // Found after the recovery above, which may have put files back.
    let node = Node::discover(root);
    let entries = node.entries();
    let entry = entries
        .iter()
        .find(|e| e.name == catalog::names::ETCDADM_APISERVER_ETCD_CLIENT)
        .or_else(|| {
            entries
                .iter()
                .find(|e| e.name == catalog::names::APISERVER_ETCD_CLIENT && e.kind == Kind::Leaf)
        })
        .ok_or_else(|| EtcdClientError::NothingToExport {
            root: root.display().to_string(),
        })?;
    let cert_bytes = read(root, &entry.path)?;
    let key_path = entry.key_path.clone().unwrap_or_default();
    let key_bytes = read(root, &key_path)?;
    let cert = Cert::from_pem(&cert_bytes).map_err(|source| EtcdClientError::Pem {
        path: entry.path.clone(),
        source,
    })?;
    let key = PrivateKey::from_pem(&key_bytes).map_err(|source| EtcdClientError::Pem {
        path: key_path.clone(),
        source,
    })?;
    if !key.matches(&cert) {
        return Err(EtcdClientError::KeyMismatch {
            key: key_path,
            cert: entry.path.clone(),
        });
    }
    if cert.not_after() <= now {
        return Err(EtcdClientError::Expired {
            path: entry.path.clone(),
        });
    }
    let mut bundle = cert.to_pem().map_err(EtcdClientError::Encode)?.into_bytes();
    bundle.extend_from_slice(
        key.to_pem(key.encoding)
            .map_err(EtcdClientError::Encode)?
            .0
            .as_bytes(),
    );
    log::info!(
        "exported '{}' (serial {}, expires {})",
        entry.path,
        cert.facts().serial,
        crate::sys::clock::rfc3339(cert.not_after())
    );
    Ok(bundle)
}

fn read(root: &Path, rel: &str) -> Result<Vec<u8>, EtcdClientError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(EtcdClientError::Missing {
            path: rel.to_string(),
            root: root.display().to_string(),
        }),
        Err(e) => Err(EtcdClientError::Read(e)),
    }
}

/// Whether a bundle's certificate is an apiserver-etcd-client certificate (issue 30.8: the etcd
/// member's server pair, signed by the same CA and carrying clientAuth too, was installed in its
/// place): a common name ending with `kube-apiserver-etcd-client` (kubeadm's name; etcdadm puts
/// the member's name before it), clientAuth as its only extended key usage, not a CA, and the
/// organizations of the certificate it replaces (kubeadm and etcdadm: `system:masters`).
fn check_identity(cert: &Cert, installed: Option<&Cert>) -> Result<(), EtcdClientError> {
    let cn = cert.subject_values(oid::COMMON_NAME);
    let what = |why: String| {
        refuse(format!(
            "the bundle's certificate ({}) is not the apiserver's etcd client identity: {why}",
            cert.subject()
        ))
    };
    if cn.len() != 1 || !cn[0].ends_with("kube-apiserver-etcd-client") {
        return Err(what(
            "its common name must end with 'kube-apiserver-etcd-client'".into(),
        ));
    }
    if cert.is_ca() {
        return Err(what("it is a CA".into()));
    }
    if cert.ext_key_usage_oids() != [oid::CLIENT_AUTH] {
        return Err(what(
            "its only extended key usage must be clientAuth (a server certificate is not a \
             client certificate)"
                .into(),
        ));
    }
    if let Some(old) = installed {
        let (new_o, old_o) = (
            cert.subject_values(oid::ORGANIZATION),
            old.subject_values(oid::ORGANIZATION),
        );
        if new_o != old_o {
            return Err(what(format!(
                "its organizations {new_o:?} are not those of the installed certificate {old_o:?}"
            )));
        }
    }
    Ok(())
}

/// A pair checked for installation ([`checked_pair`]).
struct Checked<'n> {
    cert: Cert,
    key: PrivateKey,
    /// The etcd CA of the control plane's CA file that signed it.
    ca: Cert,
    layout: &'n catalog::Layout,
    now: i64,
}

/// The bundle's pair, checked for installation on the external-etcd control plane `node`:
/// signed by its etcd CA, key matching, clientAuth, the apiserver's etcd client identity, valid
/// at `now`. With the CA that signed it, the layout it goes to and the time it was checked at.
fn checked_pair<'n>(
    node: &'n Node,
    bundle: &[u8],
    now: i64,
) -> Result<Checked<'n>, EtcdClientError> {
    let root = node.root();
    let cert = Cert::from_pem(bundle).map_err(refused("the bundle"))?;
    let key = PrivateKey::from_pem(bundle).map_err(refused("the bundle's key"))?;
    let layout = node
        .layouts()
        .iter()
        .find(|l| l.etcd == EtcdTopology::External)
        .ok_or_else(|| {
            refuse(format!(
                "no external-etcd control plane under '{}' (a kubeadm folder with pki/etcd/ca.crt and no etcd CA key)",
                root.display()
            ))
        })?;
    let ca_path = format!("{}/pki/etcd/ca.crt", layout.dir);
    // Any CA the file holds: during a rotation of the etcd CA it holds the old and the new.
    let cas = Cert::all_from_pem(&read(root, &ca_path)?, crate::pki::MAX_BUNDLE_CERTS)
        .map_err(refused(format!("'{ca_path}'")))?;
    let mut verdict = Err(refuse(format!("'{ca_path}' holds no certificate")));
    for ca in cas {
        match cert.verify_signed_by(&ca, "etcd-ca") {
            Ok(()) => {
                verdict = Ok(ca);
                break;
            }
            Err(e) => verdict = Err(refused("the bundle's certificate")(e)),
        }
    }
    let ca = verdict?;
    if !key.matches(&cert) {
        return Err(refuse("the bundle's key does not match its certificate"));
    }
    if !cert.ext_key_usage_oids().contains(&oid::CLIENT_AUTH) {
        return Err(refuse("the bundle's certificate does not carry clientAuth"));
    }
    let installed = node
        .entry_of(layout, catalog::names::APISERVER_ETCD_CLIENT)
        .and_then(|e| {
            fsutil::read_in_root(root, &e.path, MAX_PEM_FILE_BYTES)
                .ok()
                .flatten()
        })
        .and_then(|b| Cert::from_pem(&b).ok());
    check_identity(&cert, installed.as_ref())?;
    if cert.not_after() <= now || cert.not_before() > now + 300 {
        return Err(refuse(format!(
            "the bundle's certificate is not valid now ({} .. {})",
            crate::sys::clock::rfc3339(cert.not_before()),
            crate::sys::clock::rfc3339(cert.not_after())
        )));
    }
    Ok(Checked {
        cert,
        key,
        ca,
        layout,
        now,
    })
}

/// The files an installation writes: the key, and the certificate under every name it lives
/// under; refused when the certificate does not outlive an installed one of the same CA (an
/// installed pair of another CA is replaced whatever its end: during a rotation of the etcd
/// CA, the switch to the new CA at the issue, or back to the old one at an abort, whose fresh
/// pair may end with the old CA, before the new CA's pair).
fn install_changes(node: &Node, c: &Checked<'_>) -> Result<Vec<Change>, EtcdClientError> {
    let (layout, cert, key) = (c.layout, &c.cert, &c.key);
    let root = node.root();
    let entry = node
        .entry_of(layout, catalog::names::APISERVER_ETCD_CLIENT)
        .ok_or_else(|| refuse("the layout has no apiserver-etcd-client entry"))?;
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
        && old.verify_signed_by(&c.ca, "etcd-ca").is_ok()
    {
        return Err(refuse(format!(
            "the bundle's certificate expires {} which is not later than the installed one ({}); export a renewed one",
            crate::sys::clock::rfc3339(cert.not_after()),
            crate::sys::clock::rfc3339(old.not_after())
        )));
    }
    let key_path = entry.key_path.clone().unwrap_or_default();
    let cert_pem = cert.to_pem().map_err(EtcdClientError::Encode)?.into_bytes();
    let mut changes = vec![Change {
        rel: key_path,
        content: Some(
            key.to_pem(key.encoding)
                .map_err(EtcdClientError::Encode)?
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
    Ok(changes)
}

/// Installs a bundle on a control-plane node, under a lock the caller holds; returns the files
/// written and the backup id. `before_journal` as [`txn::apply_with`].
pub fn install(
    node: &Node,
    bundle: &[u8],
    opts: &WriteOptions,
    before_journal: &mut dyn FnMut(&str) -> std::io::Result<()>,
) -> Result<(Vec<String>, String), EtcdClientError> {
    let checked = checked_pair(node, bundle, opts.clock.now())?;
    let changes = install_changes(node, &checked)?;
    let outcome = txn::apply_with(
        node.root(),
        &changes,
        "import",
        checked.now,
        opts.retention,
        before_journal,
    )
    .map_err(EtcdClientError::Txn)?;
    Ok((outcome.files, outcome.backup_id))
}
