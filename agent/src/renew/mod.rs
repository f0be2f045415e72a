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

use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::sync::OnceLock;

use serde::Serialize;

use crate::node::catalog::{Entry, Flavor, Kind};
use crate::node::inventory::{Inventory, Record, Status};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::pki::{self, Cert, Issuance, MAX_PEM_FILE_BYTES, PrivateKey, Profile, SanOrder, Signer};
use crate::sys::clock;
use crate::sys::fsutil;
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

/// Why no plan could be made. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanError(pub String);

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlanError {}

/// Decides what to renew. Pure: reads only the inventory, the policy and `now`.
pub fn plan(inv: &Inventory, policy: &Policy, now: i64) -> Result<Plan, PlanError> {
    if inv.layouts.is_empty() {
        return Err(PlanError(format!(
            "no kubeadm or etcdadm PKI found under '{}'; give the node's root with --root",
            inv.root
        )));
    }
    check_names(inv, policy)?;
    let window = Window {
        now,
        not_before: now - BACKDATE,
        not_after: now + policy.validity,
    };
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    let mut problems = Vec::new();
    for (entry, record) in inv.entries.iter().zip(&inv.certificates) {
        match decide(inv, policy, &window, entry, record) {
            Decision::Renew(item) => items.push(*item),
            Decision::Skip(skip) => skipped.push(skip),
            Decision::Problem(problem) => problems.push(problem),
            Decision::Leave => {}
        }
    }
    if !problems.is_empty() {
        return Err(PlanError(format!(
            "cannot renew; nothing was changed:\n  {}",
            problems.join("\n  ")
        )));
    }
    Ok(Plan {
        items,
        skipped,
        not_before: clock::rfc3339(window.not_before),
        not_after: clock::rfc3339(window.not_after),
        not_before_unix: window.not_before,
        not_after_unix: window.not_after,
        reuse_keys: policy.reuse_keys,
    })
}

/// The clock and the new validity of one plan.
struct Window {
    now: i64,
    not_before: i64,
    not_after: i64,
}

/// What [`plan`] does with one catalog entry.
enum Decision {
    Renew(Box<Item>),
    Skip(Skip),
    Problem(String),
    /// Not renewable, not selected, or a missing optional file: not mentioned.
    Leave,
}

fn skip(entry: &Entry, why: impl Into<String>) -> Decision {
    Decision::Skip(Skip {
        name: entry.name.clone(),
        why: why.into(),
    })
}

/// Refuses a `--cert` name that is not in the catalog or cannot be renewed.
fn check_names(inv: &Inventory, policy: &Policy) -> Result<(), PlanError> {
    for name in &policy.names {
        // The kubelet's files are planned by `kubelet::plan`.
        if [crate::node::kubelet::CLIENT, crate::node::kubelet::SERVING].contains(&name.as_str())
            && inv.entries.iter().any(|e| &e.name == name)
        {
            continue;
        }
        match inv.entries.iter().position(|e| &e.name == name) {
            None => {
                let known: Vec<&str> = inv
                    .entries
                    .iter()
                    .filter(|e| e.renewable)
                    .map(|e| e.name.as_str())
                    .collect();
                return Err(PlanError(format!(
                    "--cert '{name}': no such certificate; renewable names: {}",
                    known.join(", ")
                )));
            }
            Some(i) if inv.entries[i].renewable && !inv.certificates[i].renewable => {
                return Err(PlanError(format!(
                    "--cert '{name}' cannot be renewed: {}",
                    inv.certificates[i].warnings.join("; ")
                )));
            }
            Some(i) if !inv.entries[i].renewable => {
                let why = match inv.entries[i].kind {
                    Kind::Ca => "it is a CA; certrotor never renews CAs",
                    Kind::Other => "it is not a kubeadm or etcdadm certificate",
                    _ => "the kubelet rotates its own client certificate",
                };
                return Err(PlanError(format!(
                    "--cert '{name}' cannot be renewed: {why}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// One catalog entry: renewed (and why), skipped, refused, or left out.
fn decide(
    inv: &Inventory,
    policy: &Policy,
    window: &Window,
    entry: &Entry,
    record: &Record,
) -> Decision {
    if !entry.renewable {
        return Decision::Leave;
    }
    if !record.renewable {
        return skip(entry, record.warnings.join("; "));
    }
    let reason = match reason(policy, entry, record) {
        Ok(reason) => reason,
        Err(decision) => return decision,
    };
    if record.status == Status::Missing {
        return Decision::Problem(format!("{}: '{}' does not exist", entry.name, entry.path));
    }
    // A pair whose key does not match its certificate is what `check` advises renewing by
    // name: the certificate keeps its identity and gets a new key.
    let mismatched_pair = reason == Reason::Named
        && !policy.reuse_keys
        && record.key_matches == Some(false)
        && record.chain_ok == Some(true);
    if record.status == Status::Invalid && !mismatched_pair {
        return Decision::Problem(format!(
            "{}: {}",
            entry.name,
            record.error.as_deref().unwrap_or("invalid")
        ));
    }
    let Some(ca_name) = &entry.ca else {
        return Decision::Leave;
    };
    let Some(ca_index) = inv.entries.iter().position(|e| &e.name == ca_name) else {
        return Decision::Problem(format!(
            "{}: its CA '{ca_name}' is not in the catalog",
            entry.name
        ));
    };
    let ca_entry = &inv.entries[ca_index];
    let ca_record = &inv.certificates[ca_index];
    if ca_record.externally_managed || ca_record.status == Status::Missing {
        let why = format!("externally managed: the key of CA '{ca_name}' is not on this node");
        if reason == Reason::Named {
            return Decision::Problem(format!(
                "{}: {why}; renew it where the CA key is (e.g. the etcd node) and import it",
                entry.name
            ));
        }
        return skip(entry, why);
    }
    if let Some(problem) = signer_problem(policy, window, entry, ca_name, ca_record) {
        return Decision::Problem(problem);
    }
    Decision::Renew(Box::new(Item {
        name: entry.name.clone(),
        kind: entry.kind,
        path: entry.path.clone(),
        key_path: entry.key_path.clone(),
        signer: ca_name.clone(),
        signer_cert_path: ca_entry.path.clone(),
        signer_key_path: ca_entry.key_path.clone().unwrap_or_default(),
        reason,
        residual_seconds: record.residual_seconds,
        flavor: entry.flavor,
        description: entry.description.to_string(),
    }))
}

/// Why a renewable entry is selected, or what to do with it instead.
fn reason(policy: &Policy, entry: &Entry, record: &Record) -> Result<Reason, Decision> {
    if !policy.names.is_empty() {
        if !policy.names.contains(&entry.name) {
            return Err(Decision::Leave);
        }
        Ok(Reason::Named)
    } else if record.status == Status::Missing {
        if entry.required {
            return Err(skip(entry, "missing"));
        }
        Err(Decision::Leave)
    } else if record.status == Status::Expired {
        Ok(Reason::Expired)
    } else if policy.all {
        Ok(Reason::All)
    } else {
        match record.residual_seconds {
            Some(r) if r < policy.within => Ok(Reason::Due),
            Some(r) => Err(skip(
                entry,
                format!("valid for {}", clock::human_duration(r)),
            )),
            // Unreadable: its expiry is unknown, so it cannot be skipped silently.
            None => Ok(Reason::Due),
        }
    }
}

/// Why the entry's CA cannot sign it now: invalid, not yet valid by the clock, expired, or
/// ending before the new notAfter (unless allowed).
fn signer_problem(
    policy: &Policy,
    window: &Window,
    entry: &Entry,
    ca_name: &str,
    ca_record: &Record,
) -> Option<String> {
    if ca_record.status == Status::Invalid {
        return Some(format!(
            "{}: its CA '{ca_name}' is invalid: {}",
            entry.name,
            ca_record.error.as_deref().unwrap_or("?")
        ));
    }
    let ca_nb = ca_record
        .not_before
        .as_deref()
        .and_then(clock::parse_rfc3339)?;
    let ca_na = ca_record.not_after_unix?;
    let (now, not_after) = (window.now, window.not_after);
    if now < ca_nb {
        return Some(format!(
            "{}: the system clock ({}) is earlier than CA '{ca_name}' notBefore ({}); fix the clock first",
            entry.name,
            clock::rfc3339(now),
            clock::rfc3339(ca_nb)
        ));
    }
    if now >= ca_na {
        return Some(format!(
            "{}: its CA '{ca_name}' expired on {}: certificates issued under it are \
             rejected by every verifier, so certrotor refuses to issue them (even with \
             --allow-beyond-ca); the CA must be rotated first (kubeadm: \
             https://kubernetes.io/docs/tasks/tls/manual-rotation-of-ca-certificates/)",
            entry.name,
            clock::rfc3339(ca_na)
        ));
    }
    if not_after > ca_na && !policy.allow_beyond_ca {
        return Some(format!(
            "{}: the new notAfter {} would pass CA '{ca_name}' notAfter {}; shorten --validity, \
             rotate the CA, or pass --allow-beyond-ca",
            entry.name,
            clock::rfc3339(not_after),
            clock::rfc3339(ca_na)
        ));
    }
    None
}

/// A renewal failure while issuing or validating. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueError(pub String);

impl fmt::Display for IssueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for IssueError {}

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
}

fn load_ca(root: &Path, item: &Item) -> Result<LoadedCa, IssueError> {
    let ctx = |e: &dyn fmt::Display| IssueError(e.to_string());
    let cert = Cert::from_pem(&read(root, &item.signer_cert_path)?).map_err(|e| ctx(&e))?;
    let key = PrivateKey::from_pem(&read(root, &item.signer_key_path)?).map_err(|e| ctx(&e))?;
    if !key.matches(&cert) {
        return Err(ctx(&format!(
            "CA key '{}' does not match '{}'",
            item.signer_key_path, item.signer_cert_path
        )));
    }
    Ok(LoadedCa { cert, key })
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
    let files = files_of(plan, item, ca, &new, &key, kubeconfig)?;
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
    if item.kind != Kind::Kubeconfig {
        let old = Cert::from_pem(&read(root, &item.path)?).map_err(|e| ctx(&e))?;
        let key_path = item.key_path.as_deref().unwrap_or_default();
        let key = PrivateKey::read_pem(&read(root, key_path)?).map_err(|e| ctx(&e))?;
        return Ok((old, key, None));
    }
    let kc = Kubeconfig::parse(&zeroize::Zeroizing::new(read(root, &item.path)?))
        .map_err(|e| ctx(&e))?;
    let creds = kc.credentials().map_err(|e| ctx(&e))?;
    let (Source::Embedded(cert), Source::Embedded(key)) =
        (&creds.client_certificate, &creds.client_key)
    else {
        return Err(ctx(
            &"the client certificate is not embedded; certrotor renews embedded credentials only",
        ));
    };
    let old = Cert::from_pem(cert).map_err(|e| ctx(&e))?;
    let key = PrivateKey::read_pem(key).map_err(|e| ctx(&e))?;
    Ok((old, key, Some(kc)))
}

/// The files to write for a new certificate: the kubeconfig with the new pair and CA, or the
/// certificate file and (unless the key is kept) the new key's.
fn files_of(
    plan: &Plan,
    item: &Item,
    ca: &Cert,
    new: &Cert,
    key: &PrivateKey,
    kubeconfig: Option<Kubeconfig>,
) -> Result<Vec<(String, Vec<u8>, u32)>, IssueError> {
    let ctx = |e: &dyn fmt::Display| item_error(item, e);
    let cert_pem = new.to_pem().map_err(|e| ctx(&e))?;
    let key_pem = key.to_pem(key.encoding).map_err(|e| ctx(&e))?;
    Ok(match kubeconfig {
        Some(mut kc) => {
            let ca_pem = ca.to_pem().map_err(|e| ctx(&e))?;
            kc.replace_credentials(cert_pem.as_bytes(), key_pem.0.as_bytes(), ca_pem.as_bytes())
                .map_err(|e| ctx(&e))?;
            vec![(
                item.path.clone(),
                kc.to_yaml().map_err(|e| ctx(&e))?.into_bytes(),
                0o600,
            )]
        }
        None => {
            let mut files = Vec::new();
            if !plan.reuse_keys {
                let key_path = item.key_path.clone().unwrap_or_default();
                files.push((key_path, key_pem.0.as_bytes().to_vec(), 0o600));
            }
            files.push((item.path.clone(), cert_pem.into_bytes(), 0o644));
            files
        }
    })
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

/// Proves each new certificate right before anything live is touched: signed by its CA, the key
/// matches, the identity equals the old certificate's, and the validity window is the planned
/// one (native engine) or the one the tool chose (`validity`, kubeadm engine).
pub fn validate_with(
    issued: &[Issued],
    plan: &Plan,
    validity: ValidityCheck,
) -> Result<(), IssueError> {
    let mut problems = Vec::new();
    for i in issued {
        let name = &i.item.name;
        problems.extend(
            problems_of(i, plan, validity)
                .into_iter()
                .map(|what| format!("{name}: {what}")),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(IssueError(format!(
            "validation failed; nothing was changed:\n  {}",
            problems.join("\n  ")
        )))
    }
}

/// What is wrong with one issued certificate, in the order [`validate_with`] reports it.
fn problems_of(i: &Issued, plan: &Plan, validity: ValidityCheck) -> Vec<String> {
    let mut problems = Vec::new();
    let mut fail = |what: String| problems.push(what);
    match written_cert(i) {
        Some(c) if c.der == i.new.der => {}
        _ => fail("the file written does not hold the new certificate".into()),
    }
    if let Err(e) = i.new.verify_signed_by(&i.ca, &i.item.signer) {
        fail(e.to_string());
    }
    if !i.key.matches(&i.new) {
        fail("the new key does not match the new certificate".into());
    }
    identity_problems(i, &mut fail);
    if i.old.ext_key_usage_oids() != i.new.ext_key_usage_oids() {
        fail("extended key usage changed".into());
    }
    if i.old.key_usage().map(|k| k.0.bits()) != i.new.key_usage().map(|k| k.0.bits())
        && i.old.key_usage().is_some()
    {
        fail("key usage changed".into());
    }
    if i.new.is_ca() {
        fail("the new certificate is a CA".into());
    }
    if let Some(problem) = validity_problem(i, plan, validity) {
        fail(problem);
    }
    if i.old.public_key_algorithm() != i.new.public_key_algorithm() {
        fail(format!(
            "key algorithm changed from {} to {}",
            i.old.public_key_algorithm(),
            i.new.public_key_algorithm()
        ));
    }
    problems
}

/// The certificate in the file written for the item, read back.
fn written_cert(i: &Issued) -> Option<Cert> {
    match i.files.iter().find(|(p, _, _)| p == &i.item.path) {
        Some((_, bytes, _)) if i.item.kind == Kind::Kubeconfig => Kubeconfig::parse(bytes)
            .and_then(|k| k.credentials())
            .ok()
            .and_then(|c| match &c.client_certificate {
                Source::Embedded(b) => Cert::from_pem(b).ok(),
                Source::File(_) => None,
            }),
        Some((_, bytes, _)) => Cert::from_pem(bytes).ok(),
        None => None,
    }
}

/// The subject and SANs, compared with the old certificate's when the identity must be kept
/// (logged when etcdadm issued it as the node is configured).
fn identity_problems(i: &Issued, fail: &mut impl FnMut(String)) {
    let name = &i.item.name;
    let (old_t, new_t) = (&i.old.x509.tbs_certificate, &i.new.x509.tbs_certificate);
    let same_identity = i.identity == IdentityCheck::SameAsOld;
    if i.identity == IdentityCheck::EtcdadmAsNodeConfigured
        && (old_t.subject != new_t.subject || i.old.sans() != i.new.sans())
    {
        log::info!(
            "{name}: etcdadm issued it as the node is configured: subject '{}' SANs {:?} \
             (was '{}' {:?})",
            new_t.subject,
            i.new.sans(),
            old_t.subject,
            i.old.sans()
        );
    }
    if same_identity && old_t.subject != new_t.subject {
        fail(format!(
            "subject changed from '{}' to '{}'",
            old_t.subject, new_t.subject
        ));
    }
    let set = |(d, ip): (Vec<String>, Vec<IpAddr>)| {
        let mut d = d;
        d.sort();
        d.dedup();
        let mut ip: Vec<String> = ip.iter().map(|x| x.to_string()).collect();
        ip.sort();
        ip.dedup();
        (d, ip)
    };
    if same_identity && set(i.old.sans()) != set(i.new.sans()) {
        fail("subject alternative names changed".into());
    }
    if same_identity && i.old.other_sans() != i.new.other_sans() {
        fail("URI, email or other subject alternative names changed".into());
    }
}

/// Whether the validity window is the planned one, or the one the tool chose as it ran.
fn validity_problem(i: &Issued, plan: &Plan, validity: ValidityCheck) -> Option<String> {
    let (nb, na) = (i.new.not_before(), i.new.not_after());
    match validity {
        ValidityCheck::Planned => (nb != plan.not_before_unix || na != plan.not_after_unix)
            .then(|| "validity differs from the plan".into()),
        ValidityCheck::ToolChosen { started, finished } => {
            let wanted = plan.not_after_unix - plan.not_before_unix - BACKDATE;
            // kubeadm >= 1.31 backdates 5 min; kubeadm <= 1.30 (and etcdadm) copy the CA's
            // notBefore (reference/pki-profiles.md §1.4), measured with kubeadm v1.20.2.
            let backdated = i.item.flavor == Flavor::Etcdadm
                || nb >= started - BACKDATE - 2
                || nb == i.ca.not_before();
            (na < started + wanted - 2 || na > finished + wanted + 2 || nb > finished + 1 || !backdated)
                .then(|| {
                    format!(
                        "the tool issued it valid {} .. {} ({} after issue), but --validity asks for {}; \
                         the tool decides the validity: give --validity to match it",
                        clock::rfc3339(nb),
                        clock::rfc3339(na),
                        clock::human_duration(na - started),
                        clock::human_duration(wanted)
                    )
                })
        }
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
