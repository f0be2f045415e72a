//! The inventory: every certificate, key and kubeconfig of a node, who signed it, when it
//! expires, and whether it is sound. This is `certrotor check`, and the input of renewal.
//!
//! Bad input never stops the inventory: a damaged file becomes a record with status `invalid`
//! and an error a person can act on, and every other file is still reported.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::node::catalog::{self, Entry, Kind, Layout};
use crate::node::kubeconfig::{Kubeconfig, Source, file_under_root};
use crate::pki::{Cert, CertFacts, KeyPublic, MAX_PEM_FILE_BYTES};
use crate::sys::fsutil::{self, ReadError};

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

/// What was loaded for one entry, before statuses are decided.
struct Loaded {
    cert: Option<Cert>,
    key: Option<KeyPublic>,
    cert_path: Option<String>,
    error: Option<String>,
    warnings: Vec<String>,
    present: bool,
    /// Whether a key file exists (readable or not): a CA whose key is present but unusable is
    /// not "externally managed".
    key_present: bool,
}

/// A warning when the file holding a private key (of permission bits `mode`) is readable or
/// writable by group or others.
fn key_mode_warning(rel: &str, mode: u32) -> Option<String> {
    let mode = mode & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "'{rel}' holds a private key and has mode {mode:04o}: others on the node can read \
             it; run 'chmod 600 {}' (renewal writes keys 0600)",
            rel_abs(rel)
        )
    })
}

/// What to do when a file cannot be read for lack of permission.
fn permission_hint(e: &ReadError) -> &'static str {
    match e {
        ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            " (permission: run certrotor as root, or as the owner of the PKI)"
        }
        _ => "",
    }
}

fn rel_abs(rel: &str) -> String {
    format!("/{}", rel.trim_start_matches('/'))
}

/// Takes the inventory of `root` at time `now`, flagging certificates that expire within
/// `warn_within` seconds.
pub fn take(root: &Path, now: i64, warn_within: i64) -> Inventory {
    fsutil::with_pinned_root(root, || take_pinned(root, now, warn_within))
}

fn take_pinned(root: &Path, now: i64, warn_within: i64) -> Inventory {
    let detected = catalog::detect(root);
    let mut entries = catalog::entries(root, &detected);
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

fn read(root: &Path, rel: &str) -> Result<Option<Vec<u8>>, ReadError> {
    fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES)
}

/// Reads a file with its permission bits (a private key's are checked).
fn read_with_mode(root: &Path, rel: &str) -> Result<Option<(Vec<u8>, u32)>, ReadError> {
    fsutil::read_in_root_with_mode(root, rel, MAX_PEM_FILE_BYTES)
}

fn load(root: &Path, entry: &Entry) -> Loaded {
    let mut out = Loaded {
        cert: None,
        key: None,
        cert_path: None,
        error: None,
        warnings: Vec::new(),
        present: false,
        key_present: false,
    };
    let (bytes, mode) = match read_with_mode(root, &entry.path) {
        Ok(Some(read)) => read,
        Ok(None) => return out,
        Err(e) => {
            out.present = true;
            out.error = Some(e.to_string());
            return out;
        }
    };
    out.present = true;
    if entry.kind == Kind::Kubeconfig {
        // The text may embed the client key: scrubbed when read.
        load_kubeconfig(root, entry, &zeroize::Zeroizing::new(bytes), mode, &mut out);
        return out;
    }
    match Cert::from_pem(&bytes) {
        Ok(c) => out.cert = Some(c),
        Err(e) => {
            out.error = Some(format!("'{}': {e}", entry.path));
            return out;
        }
    }
    if let Some(key_path) = &entry.key_path {
        let key_read = read_with_mode(root, key_path);
        out.key_present = !matches!(key_read, Ok(None));
        match key_read {
            // The key's PEM is scrubbed when the match ends (`KeyPublic` keeps only the public part).
            Ok(Some((kb, mode))) => match KeyPublic::read_pem(&zeroize::Zeroizing::new(kb)) {
                Ok(k) => {
                    out.key = Some(k);
                    out.warnings.extend(key_mode_warning(key_path, mode));
                }
                Err(e) => out.error = Some(format!("key '{key_path}': {e}")),
            },
            Ok(None) if entry.kind == Kind::Leaf => {
                out.error = Some(format!(
                    "key '{key_path}' is missing; restore the pair from a backup (list them with \
                     'certrotor backups', restore with 'certrotor rollback --backup ID')"
                ));
            }
            Ok(None) => {}
            Err(e) => {
                out.error = Some(format!("key: {e}{}", permission_hint(&e)));
            }
        }
    }
    out
}

fn load_kubeconfig(root: &Path, entry: &Entry, bytes: &[u8], mode: u32, out: &mut Loaded) {
    let creds = match Kubeconfig::parse(bytes).and_then(|k| k.credentials()) {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("'{}': {e}", entry.path));
            return;
        }
    };
    /// The bytes, the file they are in when not embedded, and that file's permission bits.
    type Fetched<'a> = (std::borrow::Cow<'a, [u8]>, Option<String>, u32);
    fn fetch<'a>(
        root: &Path,
        entry: &Entry,
        mode: u32,
        source: &'a Source,
        what: &str,
    ) -> Result<Fetched<'a>, String> {
        match source {
            Source::Embedded(b) => Ok((b.as_slice().into(), None, mode)),
            Source::File(p) => match read_with_mode(root, &file_under_root(&entry.path, p)) {
                Ok(Some((b, file_mode))) => {
                    Ok((b.into(), Some(file_under_root(&entry.path, p)), file_mode))
                }
                Ok(None) => Err(format!(
                    "{what} '{p}' named by '{}' does not exist",
                    entry.path
                )),
                Err(e) => Err(e.to_string()),
            },
        }
    }
    let fetch = |source, what| fetch(root, entry, mode, source, what);
    match fetch(&creds.client_certificate, "client certificate") {
        Ok((b, path, _)) => {
            out.cert_path = path;
            match Cert::from_pem(&b) {
                Ok(c) => out.cert = Some(c),
                Err(e) => {
                    out.error = Some(format!("client certificate in '{}': {e}", entry.path));
                    return;
                }
            }
        }
        Err(e) => {
            out.error = Some(e);
            return;
        }
    }
    let key_file = match &creds.client_key {
        Source::Embedded(_) => entry.path.clone(),
        Source::File(p) => file_under_root(&entry.path, p),
    };
    match fetch(&creds.client_key, "client key").map(|(b, _, mode)| {
        let key = KeyPublic::read_pem(&b);
        // A key read from its own file is scrubbed here; an embedded one when `creds` drops.
        if let std::borrow::Cow::Owned(mut bytes) = b {
            zeroize::Zeroize::zeroize(&mut bytes);
        }
        (key, mode)
    }) {
        Ok((Ok(k), mode)) => {
            out.key = Some(k);
            out.warnings.extend(key_mode_warning(&key_file, mode));
        }
        Ok((Err(e), _)) => out.error = Some(format!("client key in '{}': {e}", entry.path)),
        Err(e) => out.error = Some(e),
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
    let mut r = Record {
        name: entry.name.clone(),
        path: entry.path.clone(),
        cert_path: item.cert_path.clone(),
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
        error: item.error.clone(),
        warnings: item.warnings.clone(),
        not_after_unix: None,
    };
    if !item.present {
        r.status = Status::Missing;
        r.error = Some(format!("'{}' does not exist", entry.path));
        return r;
    }
    // The signer, by catalog name; unknown certificates are matched by issuer name.
    let ca_index = match &entry.ca {
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
    };
    if let Some(i) = ca_index {
        r.ca = Some(entries[i].name.clone());
        r.externally_managed = loaded[i].key.is_none() && !loaded[i].key_present;
    } else if entry.kind == Kind::Ca {
        r.externally_managed = item.key.is_none() && !item.key_present;
    }
    if entry.kind == Kind::Kubeconfig && entry.renewable && item.cert_path.is_some() {
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
    let facts: CertFacts = cert.facts();
    r.subject = Some(facts.subject);
    r.issuer = Some(facts.issuer);
    r.serial = Some(facts.serial);
    r.not_before = Some(crate::sys::clock::rfc3339(facts.not_before));
    r.not_after = Some(crate::sys::clock::rfc3339(facts.not_after));
    r.residual_seconds = Some(facts.not_after - now);
    r.not_after_unix = Some(facts.not_after);
    r.dns_names = facts.dns_names;
    r.ip_addresses = facts.ip_addresses;
    r.key_usage = facts.key_usage;
    r.ext_key_usage = facts.ext_key_usage;
    r.public_key = Some(facts.public_key);

    let mut problems: Vec<String> = r.error.take().into_iter().collect();
    if let Some(key) = &item.key {
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
    if entry.kind == Kind::Ca {
        if !cert.is_ca() {
            problems.push(format!(
                "'{}' is not a CA certificate (BasicConstraints CA:TRUE missing)",
                entry.path
            ));
        }
    } else if let Some(i) = ca_index {
        match &loaded[i].cert {
            Some(ca_cert) => match cert.verify_signed_by(ca_cert, &entries[i].name) {
                Ok(()) if ca_cert.not_after() <= now || ca_cert.not_before() > now => {
                    r.chain_ok = Some(false);
                    problems.push(ca_out_of_validity(&entries[i].name, ca_cert, now));
                }
                Ok(()) => r.chain_ok = Some(true),
                Err(e) => {
                    r.chain_ok = Some(false);
                    problems.push(format!(
                        "{e}; the certificate belongs to another cluster or its CA was replaced"
                    ));
                }
            },
            None => problems.push(format!("its CA '{}' could not be read", entries[i].name)),
        }
    } else if entry.ca.is_some() {
        problems.push(format!(
            "its CA '{}' is not on this node",
            entry.ca.as_deref().unwrap_or("?")
        ));
    }
    if facts.not_before > now {
        problems.push(format!(
            "not valid before {}; the system clock may be behind",
            crate::sys::clock::rfc3339(facts.not_before)
        ));
    }
    r.status = if !problems.is_empty() {
        Status::Invalid
    } else if facts.not_after <= now {
        Status::Expired
    } else if facts.not_after - now < warn {
        Status::Expiring
    } else {
        Status::Ok
    };
    if facts.not_after <= now && r.status == Status::Invalid {
        problems.push(format!(
            "also expired on {}",
            crate::sys::clock::rfc3339(facts.not_after)
        ));
    }
    r.error = if problems.is_empty() {
        None
    } else {
        Some(problems.join("; "))
    };
    if r.status == Status::Expired {
        let on = crate::sys::clock::rfc3339(facts.not_after);
        r.error = Some(match entry.kind {
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
        });
    }
    r
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

fn service_account(root: &Path, layout: &Layout) -> Option<KeyRecord> {
    let (key_path, pub_path) = catalog::service_account_keys(layout)?;
    let mut rec = KeyRecord {
        name: "sa".into(),
        path: key_path.clone(),
        public_path: pub_path.clone(),
        public_key: None,
        key_matches: None,
        status: Status::Ok,
        error: None,
    };
    match read(root, &key_path) {
        Ok(None) => {
            rec.status = Status::Missing;
            rec.error = Some(format!("'{key_path}' does not exist"));
        }
        Err(e) => {
            rec.status = Status::Invalid;
            rec.error = Some(e.to_string());
        }
        Ok(Some(bytes)) => match KeyPublic::read_pem(&bytes) {
            Err(e) => {
                rec.status = Status::Invalid;
                rec.error = Some(format!("'{key_path}': {e}"));
            }
            Ok(key) => {
                rec.public_key = Some(key.algorithm().to_string());
                match read(root, &pub_path)
                    .ok()
                    .flatten()
                    .and_then(|p| public_key_bits(&p))
                {
                    Some(bits) => {
                        let ok = bits == key.public_key_bits();
                        rec.key_matches = Some(ok);
                        if !ok {
                            rec.status = Status::Invalid;
                            rec.error = Some(format!("'{pub_path}' does not match '{key_path}'"));
                        }
                    }
                    None => {
                        rec.status = Status::Invalid;
                        rec.error =
                            Some(format!("'{pub_path}' is missing or not a PUBLIC KEY PEM"));
                    }
                }
            }
        },
    }
    Some(rec)
}

/// The subjectPublicKey bits of a `PUBLIC KEY` PEM.
fn public_key_bits(pem: &[u8]) -> Option<Vec<u8>> {
    use der::Decode;
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::SubjectPublicKeyInfoDer::from_pem_slice(pem).ok()?;
    let spki = x509_cert::spki::SubjectPublicKeyInfoOwned::from_der(der.as_ref()).ok()?;
    Some(spki.subject_public_key.raw_bytes().to_vec())
}
