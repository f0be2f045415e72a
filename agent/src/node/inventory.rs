//! The inventory: every certificate, key and kubeconfig of a node, who signed it, when it
//! expires, and whether it is sound. This is `certrotor check`, and the input of renewal.
//!
//! Bad input never stops the inventory: a damaged file becomes a record with status `invalid`
//! and an error a person can act on, and every other file is still reported.
//!
//! Reading an entry's files is `inventory/load.rs`; the service-account key pair is
//! `inventory/service_account.rs`; this file decides each record's status.

mod load;
mod service_account;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::node::Node;
use crate::node::carrier::Carrier;
use crate::node::catalog::{self, Entry, Kind, Layout};
use crate::node::inventory::load::{Loaded, load};
use crate::node::inventory::service_account::service_account;
use crate::pki::{Cert, CertFacts, PkiError};
use crate::sys::fsutil;

/// The state of one certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Expiring,
    Expired,
    Invalid,
    Missing,
}

/// One row of `check`: the JSON schema of `certificates[]`.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub name: String,
    /// The certificate or kubeconfig, relative to the root.
    pub path: String,
    /// Where the certificate really is, when not in `path` (kubelet.conf's PEM file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_path: Option<String>,
    pub key_path: Option<String>,
    pub kind: Kind,
    pub layout: String,
    pub subject: Option<String>,
    pub issuer: Option<String>,
    pub serial: Option<String>,
    pub not_before: Option<String>,
    pub not_after: Option<String>,
    pub residual_seconds: Option<i64>,
    pub ca: Option<String>,
    pub externally_managed: bool,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub key_usage: Vec<String>,
    pub ext_key_usage: Vec<String>,
    pub public_key: Option<String>,
    pub key_matches: Option<bool>,
    pub chain_ok: Option<bool>,
    pub renewable: bool,
    pub status: Status,
    pub error: Option<String>,
    /// Problems that do not stop renewal (a private key readable by others).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Unix notAfter, for sorting and policy (not serialized).
    #[serde(skip)]
    pub not_after_unix: Option<i64>,
}

impl Record {
    /// The record of `entry` before anything is read: what the catalog says, no facts, status
    /// OK, no error.
    pub fn blank(entry: &Entry) -> Record {
        Record {
            name: entry.name.clone(),
            path: entry.path.clone(),
            cert_path: None,
            key_path: entry.key_path.clone(),
            kind: entry.kind,
            layout: entry.layout.to_string(),
            subject: None,
            issuer: None,
            serial: None,
            not_before: None,
            not_after: None,
            residual_seconds: None,
            ca: None,
            externally_managed: false,
            dns_names: vec![],
            ip_addresses: vec![],
            key_usage: vec![],
            ext_key_usage: vec![],
            public_key: None,
            key_matches: None,
            chain_ok: None,
            renewable: entry.renewable,
            status: Status::Ok,
            error: None,
            warnings: Vec::new(),
            not_after_unix: None,
        }
    }

    /// Where its certificate and key live.
    pub fn carrier(&self) -> Carrier<'_> {
        Carrier::of(self.kind, &self.path, self.key_path.as_deref())
    }
}

/// A key pair that is not a certificate (`sa.key`/`sa.pub`).
#[derive(Debug, Clone, Serialize)]
pub struct KeyRecord {
    pub name: String,
    pub path: String,
    pub public_path: String,
    pub public_key: Option<String>,
    pub key_matches: Option<bool>,
    pub status: Status,
    pub error: Option<String>,
}

/// The whole inventory of a node.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    pub root: String,
    pub layouts: Vec<String>,
    pub generated_at: String,
    pub warn_within_seconds: i64,
    pub certificates: Vec<Record>,
    pub keys: Vec<KeyRecord>,
    /// Entries behind the records, in the same order (not serialized).
    #[serde(skip)]
    pub entries: Vec<Entry>,
    #[serde(skip)]
    pub detected: Vec<Layout>,
    #[serde(skip)]
    pub now: i64,
}

impl Inventory {
    /// The worst status: drives the exit code of `check`. An absent optional file
    /// (`super-admin.conf` on a control plane other than the first, `kubelet.conf`) is listed
    /// as missing, as kubeadm does, but is not a problem.
    pub fn worst(&self) -> Option<Status> {
        let optional_absent = |i: usize, r: &Record| {
            r.status == Status::Missing && self.entries.get(i).is_some_and(|e| !e.required)
        };
        self.certificates
            .iter()
            .enumerate()
            .filter(|(i, r)| !optional_absent(*i, r))
            .map(|(_, r)| r.status)
            .chain(self.keys.iter().map(|k| k.status))
            .max()
    }

    /// The record with this name.
    pub fn record(&self, name: &str) -> Option<&Record> {
        self.certificates.iter().find(|r| r.name == name)
    }
}

/// Picks the root when `--root` is not given: the host's root inside a Bottlerocket host
/// container, else `/`.
pub fn default_root() -> PathBuf {
    let host = Path::new(catalog::paths::BOTTLEROCKET_HOST_ROOT);
    if host.is_dir() {
        host.to_path_buf()
    } else {
        PathBuf::from("/")
    }
}

/// Takes the inventory of `node` at time `now`, flagging certificates that expire within
/// `warn_within` seconds.
pub fn take(node: &Node, now: i64, warn_within: i64) -> Inventory {
    fsutil::with_pinned_root(node.root(), || take_pinned(node, now, warn_within))
}

fn take_pinned(node: &Node, now: i64, warn_within: i64) -> Inventory {
    let root = node.root();
    let detected = node.layouts().to_vec();
    let mut entries = node.entries().to_vec();
    entries.extend(unknown_certificates(root, &detected, &entries));
    let loaded: Vec<Loaded> = entries.iter().map(|e| load(root, e)).collect();

    let mut records = Vec::with_capacity(entries.len());
    for (entry, item) in entries.iter().zip(&loaded) {
        records.push(record(entry, item, &entries, &loaded, now, warn_within));
    }
    let keys = detected
        .iter()
        .filter_map(|l| service_account(root, l))
        .collect();
    Inventory {
        root: root.display().to_string(),
        layouts: detected.iter().map(|l| l.name.to_string()).collect(),
        generated_at: crate::sys::clock::rfc3339(now),
        warn_within_seconds: warn_within,
        certificates: records,
        keys,
        entries,
        detected,
        now,
    }
}

fn record(
    entry: &Entry,
    item: &Loaded,
    entries: &[Entry],
    loaded: &[Loaded],
    now: i64,
    warn: i64,
) -> Record {
    let mut r = blank_record(entry, item);
    if !item.present {
        r.status = Status::Missing;
        r.error = Some(format!("'{}' does not exist", entry.path));
        return r;
    }
    let ca_index = signer_index(entry, item, entries, loaded);
    if let Some(i) = ca_index {
        r.ca = Some(entries[i].name.clone());
        r.externally_managed = loaded[i].key.is_none() && !loaded[i].key_present;
    } else if entry.kind == Kind::Ca {
        r.externally_managed = item.key.is_none() && !item.key_present;
    }
    let names_a_file = Carrier::of_entry(entry).kubeconfig().is_some() && item.cert_path.is_some();
    if entry.renewable && names_a_file {
        // certrotor replaces embedded credentials only; a kubeconfig naming files is renewed by
        // renewing those files with whatever made them.
        r.renewable = false;
        r.warnings.push(format!(
            "'{}' names its client certificate as a file ('{}'), not embedded data, so \
             certrotor does not renew it; renew that file with the tool that issued it, or \
             embed the credentials ('kubectl config set-credentials --embed-certs')",
            entry.path,
            item.cert_path.as_deref().unwrap_or("?")
        ));
    }
    let Some(cert) = &item.cert else {
        r.status = Status::Invalid;
        return r;
    };
    let (not_before, not_after) = fill_facts(&mut r, cert.facts(), now);

    let mut problems: Vec<String> = r.error.take().into_iter().collect();
    check_key(entry, item, cert, &mut r, &mut problems);
    let signer = ca_index.map(|i| (&entries[i], &loaded[i]));
    check_chain(entry, cert, signer, now, &mut r, &mut problems);
    if not_before > now {
        problems.push(format!(
            "not valid before {}; the system clock may be behind",
            crate::sys::clock::rfc3339(not_before)
        ));
    }
    r.status = if !problems.is_empty() {
        Status::Invalid
    } else if not_after <= now {
        Status::Expired
    } else if not_after - now < warn {
        Status::Expiring
    } else {
        Status::Ok
    };
    if not_after <= now && r.status == Status::Invalid {
        problems.push(format!(
            "also expired on {}",
            crate::sys::clock::rfc3339(not_after)
        ));
    }
    r.error = if problems.is_empty() {
        None
    } else {
        Some(problems.join("; "))
    };
    if r.status == Status::Expired {
        r.error = Some(expired_error(entry, &r, not_after));
    }
    r
}

/// Copies what the certificate says into the record; its notBefore and notAfter.
fn fill_facts(r: &mut Record, facts: CertFacts, now: i64) -> (i64, i64) {
    let (not_before, not_after) = (facts.not_before, facts.not_after);
    r.subject = Some(facts.subject);
    r.issuer = Some(facts.issuer);
    r.serial = Some(facts.serial);
    r.not_before = Some(crate::sys::clock::rfc3339(not_before));
    r.not_after = Some(crate::sys::clock::rfc3339(not_after));
    r.residual_seconds = Some(not_after - now);
    r.not_after_unix = Some(not_after);
    r.dns_names = facts.dns_names;
    r.ip_addresses = facts.ip_addresses;
    r.key_usage = facts.key_usage;
    r.ext_key_usage = facts.ext_key_usage;
    r.public_key = Some(facts.public_key);
    (not_before, not_after)
}

/// The record of an entry before its certificate is looked at: what the catalog and the read
/// say.
fn blank_record(entry: &Entry, item: &Loaded) -> Record {
    Record {
        cert_path: item.cert_path.clone(),
        error: item.error.clone(),
        warnings: item.warnings.clone(),
        ..Record::blank(entry)
    }
}

/// The signer, by catalog name; unknown certificates are matched by issuer name.
fn signer_index(
    entry: &Entry,
    item: &Loaded,
    entries: &[Entry],
    loaded: &[Loaded],
) -> Option<usize> {
    match &entry.ca {
        Some(ca) => entries
            .iter()
            .position(|e| &e.name == ca && e.kind == Kind::Ca),
        None if entry.kind == Kind::Other => item.cert.as_ref().and_then(|c| {
            entries.iter().zip(loaded).position(|(e, l)| {
                e.kind == Kind::Ca
                    && l.cert.as_ref().is_some_and(|ca| {
                        ca.x509.tbs_certificate.subject == c.x509.tbs_certificate.issuer
                    })
            })
        }),
        None => None,
    }
}

/// Whether the private key matches the certificate.
fn check_key(
    entry: &Entry,
    item: &Loaded,
    cert: &Cert,
    r: &mut Record,
    problems: &mut Vec<String>,
) {
    let Some(key) = &item.key else { return };
    let ok = key.matches(cert);
    r.key_matches = Some(ok);
    if !ok {
        let where_key = entry
            .key_path
            .clone()
            .unwrap_or_else(|| format!("{} (embedded client-key-data)", entry.path));
        problems.push(format!(
            "private key '{where_key}' does not match the certificate '{}'; restore the pair \
             from a backup ('certrotor backups') or renew it with 'certrotor renew --cert {}'",
            item.cert_path.as_deref().unwrap_or(&entry.path),
            entry.name
        ));
    }
}

/// Whether a CA is one, and whether a leaf is signed by its CA, valid now.
fn check_chain(
    entry: &Entry,
    cert: &Cert,
    signer: Option<(&Entry, &Loaded)>,
    now: i64,
    r: &mut Record,
    problems: &mut Vec<String>,
) {
    if entry.kind == Kind::Ca {
        if !cert.is_ca() {
            problems.push(format!(
                "'{}' is not a CA certificate (BasicConstraints CA:TRUE missing)",
                entry.path
            ));
        }
    } else if let Some((ca_entry, ca_loaded)) = signer {
        match &ca_loaded.cert {
            Some(ca_cert) => match signed_by_one(cert, ca_cert, &ca_loaded.also, &ca_entry.name) {
                Ok(()) if ca_cert.not_after() <= now || ca_cert.not_before() > now => {
                    r.chain_ok = Some(false);
                    problems.push(ca_out_of_validity(&ca_entry.name, ca_cert, now));
                }
                Ok(()) => r.chain_ok = Some(true),
                Err(e) => {
                    r.chain_ok = Some(false);
                    problems.push(format!(
                        "{e}; the certificate belongs to another cluster or its CA was replaced"
                    ));
                }
            },
            None => problems.push(format!("its CA '{}' could not be read", ca_entry.name)),
        }
    } else if entry.ca.is_some() {
        problems.push(format!(
            "its CA '{}' is not on this node",
            entry.ca.as_deref().unwrap_or("?")
        ));
    }
}

/// Whether `ca` signed `cert`, or one of the further certificates of its file (`also`: the CA's
/// other certificate while a rotation has both in the file); the first CA's error otherwise.
fn signed_by_one(cert: &Cert, ca: &Cert, also: &[Cert], name: &str) -> Result<(), PkiError> {
    let first = cert.verify_signed_by(ca, name);
    if first.is_err() && also.iter().any(|c| cert.verify_signed_by(c, name).is_ok()) {
        return Ok(());
    }
    first
}

/// What an expired certificate's error says: why and how to renew it, by what it is.
fn expired_error(entry: &Entry, r: &Record, not_after: i64) -> String {
    let on = crate::sys::clock::rfc3339(not_after);
    match entry.kind {
        Kind::Ca => format!(
            "expired on {on}; certrotor never renews a CA: it must be rotated (kubeadm: \
             https://kubernetes.io/docs/tasks/tls/manual-rotation-of-ca-certificates/)"
        ),
        Kind::Other => format!(
            "expired on {on}; it is not a kubeadm or etcdadm certificate: renew it with the \
             tool that issued it"
        ),
        _ if entry.name == crate::node::kubelet::CLIENT => format!(
            "expired on {on}; the kubelet cannot rotate an expired client certificate: \
             'certrotor renew' reissues it from the cluster CA on a control-plane node"
        ),
        _ if entry.name == crate::node::kubelet::SERVING => format!(
            "expired on {on}; 'certrotor renew' backs it up and removes it, and the kubelet \
             makes a new self-signed one at its next start"
        ),
        _ if !entry.renewable => format!(
            "expired on {on}; the kubelet rotates its own client certificate and cannot once \
             it has expired: see https://kubernetes.io/docs/setup/production-environment/\
             tools/kubeadm/troubleshooting-kubeadm/#kubelet-client-cert"
        ),
        _ if !r.renewable => format!("expired on {on}; {}", r.warnings.join("; ")),
        _ => format!(
            "expired on {on}; renew with 'certrotor renew --cert {}'",
            entry.name
        ),
    }
}

/// Why a chain through an expired or not yet valid CA is invalid, and what can fix it.
pub fn ca_out_of_validity(ca_name: &str, ca: &Cert, now: i64) -> String {
    if ca.not_before() > now {
        format!(
            "its CA '{ca_name}' is not valid before {}, so no verifier accepts the chain; the \
             system clock may be behind: fix the clock",
            crate::sys::clock::rfc3339(ca.not_before())
        )
    } else {
        format!(
            "its CA '{ca_name}' expired on {}, so no verifier accepts the chain and renewing \
             under it cannot help; the CA must be rotated (kubeadm: \
             https://kubernetes.io/docs/tasks/tls/manual-rotation-of-ca-certificates/), which \
             certrotor does not do",
            crate::sys::clock::rfc3339(ca.not_after())
        )
    }
}

/// `*.crt` files in the PKI folders that the catalog does not name.
fn unknown_certificates(root: &Path, layouts: &[Layout], known: &[Entry]) -> Vec<Entry> {
    let mut out = Vec::new();
    for dir in catalog::scanned_dirs(layouts) {
        let Ok(Some(real)) = fsutil::resolve_in_root(root, &dir) else {
            continue;
        };
        let Ok(list) = std::fs::read_dir(&real) else {
            continue;
        };
        let mut names: Vec<String> = list
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        for file in names.into_iter().filter(|n| n.ends_with(".crt")) {
            let path = format!("{dir}/{file}");
            let claimed = known.iter().any(|e| e.path == path)
                // The Bottlerocket/EKS-A pair: whichever name the catalog did not pick.
                || (file == "server-etcd-client.crt" || file == "apiserver-etcd-client.crt")
                    && known.iter().any(|e| e.name.starts_with("apiserver-etcd-client") && e.path.starts_with(&dir));
            if claimed {
                continue;
            }
            let key = format!("{dir}/{}.key", file.trim_end_matches(".crt"));
            out.push(Entry {
                name: path.clone(),
                kind: Kind::Other,
                path,
                key_path: root.join(&key).exists().then_some(key),
                ca: None,
                required: false,
                renewable: false,
                flavor: catalog::Flavor::Kubeadm,
                layout: layouts
                    .iter()
                    .find(|l| dir.starts_with(l.dir))
                    .map(|l| l.name)
                    .unwrap_or("other"),
                description: "certificate not known to kubeadm or etcdadm",
            });
        }
    }
    out
}
