//! Renewal: decide what is due ([`plan`]), issue the new certificates in memory ([`issue_all`]),
//! prove they are right ([`validate_with`]), and turn them into a transaction's changes.
//!
//! Parity with `kubeadm certs renew` (`reference/pki-profiles.md` §7): the subject is kept byte
//! for byte (RDN order, string types, every O), the SANs, KeyUsage and ExtKeyUsage are those of
//! the existing certificate, kubeadm leaves get a critical BasicConstraints CA:FALSE and sorted
//! DNS SANs, the issuer and AKI come from the CA file, the signature algorithm from the CA key,
//! and a new key of the same algorithm and size is made (`--reuse-keys` keeps the old one) and
//! written in the old key's PEM encoding. All certificates of one run share notBefore
//! (now − 5 min) and notAfter (now + validity). etcdadm leaves keep their identity too, without
//! BasicConstraints and with their SAN order.
//!
//! [`plan`] reads no files and no clock; [`issue_all`] reads the files the plan names.

pub mod engine;
#[cfg(feature = "failpoints")]
pub mod foreign_ca;
pub mod kubelet;

mod plan;
pub use plan::plan;
mod validate;
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;
pub use validate::validate_with;

use serde::Serialize;

use crate::node::carrier::{Carrier, CarrierError, NewFile};
use crate::node::catalog::{Flavor, Kind};
use crate::node::kubeconfig::Kubeconfig;
use crate::pki::{self, Cert, Issuance, MAX_PEM_FILE_BYTES, PrivateKey, Profile, SanOrder, Signer};
use crate::sys::fsutil;
use crate::sys::message_error::message_error;
use crate::txn::Change;

/// kubeadm's backdate of notBefore.
pub const BACKDATE: i64 = 5 * 60;

/// What to renew and how.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Renew what expires within this many seconds (default 90 days).
    pub within: i64,
    /// Renew everything renewable.
    pub all: bool,
    /// Renew exactly these names.
    pub names: Vec<String>,
    pub reuse_keys: bool,
    /// New validity in seconds (default one year).
    pub validity: i64,
    pub allow_beyond_ca: bool,
}

/// Why an item was selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    Expired,
    Due,
    All,
    Named,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Expired => "expired",
            Reason::Due => "due",
            Reason::All => "--all",
            Reason::Named => "--cert",
        })
    }
}

/// One certificate to renew.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub name: String,
    pub kind: Kind,
    pub path: String,
    pub key_path: Option<String>,
    pub signer: String,
    #[serde(skip)]
    pub signer_cert_path: String,
    #[serde(skip)]
    pub signer_key_path: String,
    pub reason: Reason,
    pub residual_seconds: Option<i64>,
    pub flavor: Flavor,
    pub description: String,
}

impl Item {
    /// Where its certificate and key live.
    pub fn carrier(&self) -> Carrier<'_> {
        Carrier::of(self.kind, &self.path, self.key_path.as_deref())
    }
}

/// A certificate not renewed, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skip {
    pub name: String,
    pub why: String,
}

/// The plan of one run: what, why, which signer, the new validity.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    pub items: Vec<Item>,
    pub skipped: Vec<Skip>,
    pub not_before: String,
    pub not_after: String,
    #[serde(skip)]
    pub not_before_unix: i64,
    #[serde(skip)]
    pub not_after_unix: i64,
    pub reuse_keys: bool,
}

message_error!(
    /// Why no plan could be made. Nothing was changed.
    #[derive(Debug, Clone, PartialEq, Eq)]
    PlanError
);

message_error!(
    /// A renewal failure while issuing or validating. Nothing was changed.
    #[derive(Debug, Clone, PartialEq, Eq)]
    IssueError
);

/// One renewed certificate, in memory, with the old one it replaces.
pub struct Issued {
    pub item: Item,
    pub old: Cert,
    pub new: Cert,
    pub key: PrivateKey,
    /// The CA certificate it was validated against.
    pub ca: Cert,
    /// The bytes to write: (path, content, mode if new).
    pub files: Vec<(String, Vec<u8>, u32)>,
    /// How [`validate_with`] compares its identity with the old certificate's.
    pub identity: IdentityCheck,
}

impl Drop for Issued {
    fn drop(&mut self) {
        // The contents hold key PEM (and kubeconfigs embedding keys): scrubbed, not just freed.
        for (_, content, _) in &mut self.files {
            zeroize::Zeroize::zeroize(content);
        }
    }
}

/// How [`validate_with`] compares a new certificate's identity with the old one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentityCheck {
    /// Subject (byte for byte) and SANs equal the old certificate's: kubeadm's renewal and
    /// certrotor's own.
    SameAsOld,
    /// etcdadm's `join phase certificates` makes subject and SANs from the node's current
    /// configuration (member name, default-route IP), not from the old certificate: they may
    /// differ and are logged. Everything else is still checked.
    EtcdadmAsNodeConfigured,
}

/// How [`validate_with`] checks the validity window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValidityCheck {
    /// Exactly the plan's notBefore and notAfter (certrotor issued them).
    Planned,
    /// A tool (kubeadm, etcdadm) chose the window while it ran, between these Unix times:
    /// notAfter must be that time plus the planned validity (±2 s), notBefore not later than
    /// the run, and for kubeadm certificates kubeadm's 5-minute backdate.
    ToolChosen { started: i64, finished: i64 },
}

impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Issued({})", self.item.name)
    }
}

fn read(root: &Path, rel: &str) -> Result<Vec<u8>, IssueError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(IssueError(format!(
            "'{rel}' disappeared while renewing; run again"
        ))),
        Err(e) => Err(IssueError(e.to_string())),
    }
}

/// Issues every planned certificate. New keys are generated in parallel (RSA key generation
/// dominates the run time).
pub fn issue_all(root: &Path, plan: &Plan) -> Result<Vec<Issued>, IssueError> {
    // Each CA is read, parsed and checked once per run, not once per certificate, by the first
    // worker that needs it (the others wait for it): the CAs' key checks are spread over the
    // cores too.
    let mut cas: Vec<(&str, OnceLock<Result<LoadedCa, IssueError>>)> = Vec::new();
    for item in &plan.items {
        if !cas.iter().any(|(path, _)| *path == item.signer_cert_path) {
            cas.push((item.signer_cert_path.as_str(), OnceLock::new()));
        }
    }
    let ca_of = |item: &Item| -> Result<&LoadedCa, IssueError> {
        match cas.iter().find(|(path, _)| *path == item.signer_cert_path) {
            Some((_, ca)) => match ca.get_or_init(|| load_ca(root, item)) {
                Ok(ca) => Ok(ca),
                Err(e) => Err(IssueError(format!("{}: {}", item.name, e.0))),
            },
            None => Err(IssueError(format!("{}: internal error: no CA", item.name))),
        }
    };
    // Key generation dominates: the items are spread over the cores, each worker taking the
    // next one as it finishes (an RSA key takes a variable time to find).
    crate::sys::par::map(&plan.items, crate::sys::par::cpus(), |item| {
        ca_of(item).and_then(|ca| issue_one(root, plan, item, ca))
    })
    .into_iter()
    .collect()
}

/// A signing CA, read and checked once per run.
struct LoadedCa {
    cert: Cert,
    key: PrivateKey,
    /// Every certificate of the CA file, `cert` first (a bundle in the middle of a rotation).
    trust: Vec<Cert>,
}

fn load_ca(root: &Path, item: &Item) -> Result<LoadedCa, IssueError> {
    let ctx = |e: &dyn fmt::Display| IssueError(e.to_string());
    let bytes = read(root, &item.signer_cert_path)?;
    let cert = Cert::from_pem(&bytes).map_err(|e| ctx(&e))?;
    let trust = ca_file_certs(&bytes, &cert);
    let key = PrivateKey::from_pem(&read(root, &item.signer_key_path)?).map_err(|e| ctx(&e))?;
    if !key.matches(&cert) {
        return Err(ctx(&format!(
            "CA key '{}' does not match '{}'",
            item.signer_key_path, item.signer_cert_path
        )));
    }
    Ok(LoadedCa { cert, key, trust })
}

/// Every certificate of a CA file whose first is `first`: the trust a kubeconfig embeds.
pub(crate) fn ca_file_certs(bytes: &[u8], first: &Cert) -> Vec<Cert> {
    match Cert::all_from_pem(bytes, pki::MAX_BUNDLE_CERTS) {
        Ok(all) if all.first().is_some_and(|c| c.der == first.der) => all,
        _ => vec![first.clone()],
    }
}

/// The error of renewing `item`, naming it.
fn item_error(item: &Item, e: &dyn fmt::Display) -> IssueError {
    IssueError(format!("{}: {e}", item.name))
}

/// A file's (or a kubeconfig's embedded) old certificate and key, and the parsed kubeconfig.
type Old = (Cert, PrivateKey, Option<Kubeconfig>);

fn issue_one(
    root: &Path,
    plan: &Plan,
    item: &Item,
    signer: &LoadedCa,
) -> Result<Issued, IssueError> {
    let ctx = |e: &dyn fmt::Display| item_error(item, e);
    let (ca, ca_key) = (&signer.cert, &signer.key);
    let (old, old_key, kubeconfig) = read_old(root, item)?;
    // The old key is read for its encoding; its private parts are checked only when it is
    // carried into the new certificate.
    let key = if plan.reuse_keys {
        old_key.check_private_parts().map_err(|e| ctx(&e))?;
        old_key
    } else {
        let mut k = PrivateKey::generate(old.public_key_algorithm()).map_err(|e| ctx(&e))?;
        k.encoding = old_key.encoding;
        k
    };
    let profile = profile_of(&old, item.flavor);
    let issuance = Issuance {
        serial: pki::random_serial().map_err(|e| ctx(&e))?,
        not_before: plan.not_before_unix,
        not_after: plan.not_after_unix,
    };
    let spki = key.spki().map_err(|e| ctx(&e))?;
    let new = pki::issue(
        &profile,
        &spki,
        Some(&Signer {
            cert: ca,
            key: ca_key,
        }),
        &key,
        issuance,
    )
    .map_err(|e| ctx(&e))?;
    let files = files_of(plan, item, &signer.trust, &new, &key, kubeconfig)?;
    Ok(Issued {
        item: item.clone(),
        old,
        new,
        key,
        ca: ca.clone(),
        files,
        identity: IdentityCheck::SameAsOld,
    })
}

/// The certificate and key being renewed: a kubeconfig's embedded pair, or a pair of files.
fn read_old(root: &Path, item: &Item) -> Result<Old, IssueError> {
    let ctx = |e: &dyn fmt::Display| item_error(item, e);
    let held = item
        .carrier()
        .read_held(
            |rel| read(root, rel),
            |pem| Cert::from_pem(&pem).map_err(|e| ctx(&e)),
        )
        .map_err(|e| match e {
            CarrierError::Given(e) => e,
            CarrierError::NotEmbedded => ctx(
                &"the client certificate is not embedded; certrotor renews embedded credentials only",
            ),
            e => ctx(&e),
        })?;
    let key = PrivateKey::read_pem(&held.key_pem).map_err(|e| ctx(&e))?;
    Ok((held.cert, key, held.kubeconfig))
}

/// The files to write for a new certificate: the kubeconfig with the new pair and CA, or the
/// certificate file and (unless the key is kept) the new key's.
fn files_of(
    plan: &Plan,
    item: &Item,
    trust: &[Cert],
    new: &Cert,
    key: &PrivateKey,
    kubeconfig: Option<Kubeconfig>,
) -> Result<Vec<NewFile>, IssueError> {
    let ctx = |e: &dyn fmt::Display| item_error(item, e);
    let cert_pem = new.to_pem().map_err(|e| ctx(&e))?;
    let key_pem = key.to_pem(key.encoding).map_err(|e| ctx(&e))?;
    item.carrier()
        .new_files(
            kubeconfig,
            cert_pem.into_bytes(),
            key_pem.0.as_bytes(),
            trust,
            !plan.reuse_keys,
        )
        .map_err(|e| ctx(&e))
}

/// The profile of a renewed certificate: the old certificate's identity, in the flavor's form.
pub fn profile_of(old: &Cert, flavor: Flavor) -> Profile {
    let (dns_names, ip_addresses) = old.sans();
    Profile {
        subject: old.x509.tbs_certificate.subject.clone(),
        dns_names,
        ip_addresses,
        other_sans: old.other_sans(),
        san_order: match flavor {
            Flavor::Kubeadm => SanOrder::Kubeadm,
            Flavor::Etcdadm => SanOrder::AsGiven,
        },
        key_usage: old.key_usage().unwrap_or_else(pki::leaf_key_usage),
        ext_key_usage: old.ext_key_usage_oids(),
        basic_constraints: match flavor {
            Flavor::Kubeadm => Some(false),
            Flavor::Etcdadm => None,
        },
        subject_key_id: false,
    }
}

/// The transaction changes for the issued certificates.
pub fn changes(issued: &[Issued]) -> Vec<Change> {
    issued
        .iter()
        .flat_map(|i| i.files.iter())
        .map(|(rel, bytes, mode)| Change {
            rel: rel.clone(),
            content: Some(bytes.clone()),
            mode_if_new: *mode,
        })
        .collect()
}
