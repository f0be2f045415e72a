//! The x509-certificate-exporter family: enix's certificate gauges (`x509_cert_*`) and per-source
//! families (`x509_source_*`), with its names, HELP texts and labels, for each certificate and
//! kubeconfig of the inventory.

use super::*;
use crate::node::inventory::{Inventory, Record, Status};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES};
use std::collections::BTreeMap;
use std::path::Path;

const NOT_BEFORE_HELP: &str = "Indicates the certificate's not before timestamp";
const NOT_AFTER_HELP: &str = "Indicates the certificate's not after timestamp";
const EXPIRED_HELP: &str = "Indicates if the certificate is expired";
const READ_ERRORS_HELP: &str = "Indicates the number of read failure(s)";
/// v3's HELP of `x509_cert_error`, verbatim (its spelling included).
const CERT_ERROR_HELP: &str = "Indicates wether the corresponding secret has read failure(s)";
const SOURCE_UP_HELP: &str =
    "1 if the source (a folder of certificate files, or a kubeconfig) could be read, 0 otherwise";
const SOURCE_BUNDLES_HELP: &str = "Files of the source present on the node";
pub(super) const SOURCE_ERRORS_HELP: &str =
    "Failed reads of a source's files, by reason code (one per failed file at each scrape)";

/// The distinguished-name fields the exporter puts in labels, in its order.
const DN_FIELDS: [&str; 6] = ["C", "ST", "L", "O", "OU", "CN"];

/// One certificate's series: its labels and dates.
struct Series {
    labels: Vec<(String, String)>,
    not_before: i64,
    not_after: i64,
}

/// The certificate gauges of an inventory, `x509_cert_expired` against `now`.
pub fn certificate_gauges(root: &Path, inv: &Inventory, now: i64) -> String {
    certificate_read(root, inv, now).0
}

/// What certrotor reads, as enix v4 names it: a folder of certificate files or a kubeconfig.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourceName {
    /// `file` or `kubeconfig`.
    pub kind: &'static str,
    /// The folder or the kubeconfig, as an absolute path on the node.
    pub name: String,
}

/// A file of a source that could not be used, and why (a reason code of enix v4's
/// `x509_source_errors_total`, or `invalid`: read and parsed, but its key, its chain or its
/// dates make it unusable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    pub source: SourceName,
    pub reason: &'static str,
}

/// What one source gave at this read.
#[derive(Debug, Default)]
struct SourceState {
    up: bool,
    bundles: u64,
}

/// The certificate families of an inventory (the x509 gauges, `x509_read_errors`,
/// `x509_cert_error`, `x509_source_up`, `x509_source_bundles`), and the failed reads for the
/// daemon's `x509_source_errors_total`.
pub fn certificate_read(root: &Path, inv: &Inventory, now: i64) -> (String, Vec<ReadFailure>) {
    let read = CertificateRead::of(root, inv);
    let mut out = String::new();
    for (name, help) in [
        ("x509_cert_not_before", NOT_BEFORE_HELP),
        ("x509_cert_not_after", NOT_AFTER_HELP),
        ("x509_cert_expired", EXPIRED_HELP),
    ] {
        header(&mut out, name, help, "gauge");
        for s in &read.series {
            let v = match name {
                "x509_cert_not_before" => s.not_before,
                "x509_cert_not_after" => s.not_after,
                _ => i64::from(now > s.not_after),
            };
            sample(&mut out, name, &s.labels, &v.to_string());
        }
    }
    unlabelled(
        &mut out,
        "x509_read_errors",
        READ_ERRORS_HELP,
        "gauge",
        &read.errors.to_string(),
    );
    header(&mut out, "x509_cert_error", CERT_ERROR_HELP, "gauge");
    for (labels, failed) in &read.file_errors {
        sample(
            &mut out,
            "x509_cert_error",
            labels,
            &u8::from(*failed).to_string(),
        );
    }
    let source_labels = |s: &SourceName| vec![l("source_kind", s.kind), l("source_name", &s.name)];
    header(&mut out, "x509_source_up", SOURCE_UP_HELP, "gauge");
    for (s, state) in &read.sources {
        sample(
            &mut out,
            "x509_source_up",
            &source_labels(s),
            &u8::from(state.up).to_string(),
        );
    }
    header(
        &mut out,
        "x509_source_bundles",
        SOURCE_BUNDLES_HELP,
        "gauge",
    );
    for (s, state) in &read.sources {
        sample(
            &mut out,
            "x509_source_bundles",
            &source_labels(s),
            &state.bundles.to_string(),
        );
    }
    (out, read.failures)
}

/// What [`certificate_read`] gathers from an inventory before it writes the families.
#[derive(Default)]
struct CertificateRead {
    series: Vec<Series>,
    errors: u64,
    /// Each read file's labels, and whether it failed.
    file_errors: Vec<(Vec<(String, String)>, bool)>,
    sources: BTreeMap<SourceName, SourceState>,
    failures: Vec<ReadFailure>,
}

impl CertificateRead {
    fn of(root: &Path, inv: &Inventory) -> CertificateRead {
        let mut read = CertificateRead::default();
        for (i, r) in inv.certificates.iter().enumerate() {
            let required = inv.entries.get(i).is_some_and(|e| e.required);
            // An optional file that is absent (super-admin.conf on a second control plane) is
            // not read, so it is neither a failure nor part of a source.
            if r.status != Status::Missing || required {
                read.file(root, r);
            }
            read.series.extend(record_series(root, r));
        }
        read
    }

    /// One required or present file: its read, and its source's.
    fn file(&mut self, root: &Path, r: &Record) {
        let reason = failure_reason(root, r);
        if reason.is_some() {
            self.errors += 1;
        }
        let abs = format!("/{}", r.path.trim_start_matches('/'));
        let source = source_of(r, &abs);
        let state = self.sources.entry(source.clone()).or_default();
        if r.status != Status::Missing {
            state.bundles += 1;
        }
        state.up = if source.kind == "kubeconfig" {
            r.not_after_unix.is_some()
        } else {
            std::fs::read_dir(root.join(source.name.trim_start_matches('/'))).is_ok()
        };
        let name = abs.rsplit('/').next().unwrap_or_default().to_string();
        self.file_errors.push((
            vec![l("filename", &name), l("filepath", &abs)],
            reason.is_some(),
        ));
        if let Some(reason) = reason {
            self.failures.push(ReadFailure { source, reason });
        }
    }
}

/// The source a record is read from (`abs`: its path from `/`): a kubeconfig, or a file's
/// folder.
fn source_of(r: &Record, abs: &str) -> SourceName {
    let (kind, name) = r.carrier().metrics_source(abs);
    SourceName { kind, name }
}

/// Why a record (a required or present file) cannot be used; `None` when it can. A file that
/// gave no certificate is read again to tell a read failure from a parse failure.
fn failure_reason(root: &Path, r: &Record) -> Option<&'static str> {
    match r.status {
        Status::Missing => Some("not_found"),
        Status::Invalid if r.not_after_unix.is_some() => Some("invalid"),
        Status::Invalid => Some(
            match crate::sys::fsutil::read_in_root(root, &r.path, MAX_PEM_FILE_BYTES) {
                Ok(None) => "not_found",
                Err(crate::sys::fsutil::ReadError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::PermissionDenied =>
                {
                    "permission_denied"
                }
                Err(_) => "read_failed",
                // A kubeconfig holds the client key: its bytes are zeroed when dropped.
                Ok(Some(bytes)) => {
                    drop(zeroize::Zeroizing::new(bytes));
                    r.carrier().decode_error()
                }
            },
        ),
        _ => None,
    }
}

/// The series of one record: one for a certificate; for a kubeconfig, the user's certificate
/// and the cluster's embedded CA, as the exporter labels them.
fn record_series(root: &Path, r: &Record) -> Vec<Series> {
    let Some(not_before) = r
        .not_before
        .as_deref()
        .and_then(crate::sys::clock::parse_rfc3339)
    else {
        return vec![];
    };
    let Some(not_after) = r.not_after_unix else {
        return vec![];
    };
    let abs = format!("/{}", r.path.trim_start_matches('/'));
    let file = |labels: &mut Vec<(String, String)>| {
        let name = abs.rsplit('/').next().unwrap_or_default().to_string();
        labels.push(("filename".into(), name));
        labels.push(("filepath".into(), abs.clone()));
    };
    let mut out = Vec::new();
    let mut labels = Vec::new();
    file(&mut labels);
    let creds = (r.carrier().kubeconfig()).and_then(|path| kubeconfig_credentials(root, path));
    if let Some((user, _, _)) = &creds {
        labels.push(("embedded_kind".into(), "user".into()));
        labels.push(("embedded_key".into(), user.clone()));
    }
    labels.push((
        "serial_number".into(),
        r.serial.as_deref().map(hex_to_decimal).unwrap_or_default(),
    ));
    dn_labels(
        &mut labels,
        "issuer",
        r.issuer.as_deref().unwrap_or_default(),
    );
    dn_labels(
        &mut labels,
        "subject",
        r.subject.as_deref().unwrap_or_default(),
    );
    out.push(Series {
        labels,
        not_before,
        not_after,
    });
    if let Some((_, cluster, Some(ca))) = creds {
        let f = ca.facts();
        let mut labels = Vec::new();
        file(&mut labels);
        labels.push(("embedded_kind".into(), "cluster".into()));
        labels.push(("embedded_key".into(), cluster));
        labels.push(("serial_number".into(), hex_to_decimal(&f.serial)));
        dn_labels(&mut labels, "issuer", &f.issuer);
        dn_labels(&mut labels, "subject", &f.subject);
        out.push(Series {
            labels,
            not_before: f.not_before,
            not_after: f.not_after,
        });
    }
    out
}

/// A kubeconfig's user name, cluster name and embedded cluster CA.
fn kubeconfig_credentials(root: &Path, rel: &str) -> Option<(String, String, Option<Cert>)> {
    // The kubeconfig holds the client key: the buffer is zeroed when dropped.
    let bytes = zeroize::Zeroizing::new(
        crate::sys::fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES)
            .ok()
            .flatten()?,
    );
    let creds = Kubeconfig::parse(&bytes).ok()?.credentials().ok()?;
    let ca = match &creds.certificate_authority {
        Some(Source::Embedded(pem)) => Cert::from_pem(pem).ok(),
        _ => None,
    };
    Some((creds.user.clone(), creds.cluster.clone(), ca))
}

/// `issuer_CN="…"` and the others present in an RFC 4514 name (`CN=a,O=b`), in the
/// exporter's field order; the first value of a repeated field, as the exporter takes it.
pub(super) fn dn_labels(labels: &mut Vec<(String, String)>, prefix: &str, name: &str) {
    let attrs = split_dn(name);
    for field in DN_FIELDS {
        let found = attrs
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(field));
        if let Some((_, v)) = found {
            labels.push((format!("{prefix}_{field}"), v.clone()));
        }
    }
}

/// The attributes of an RFC 4514 string, unescaping `\,` and the like (most significant RDN
/// last, as RFC 4514 writes it).
fn split_dn(name: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = name.chars();
    let mut push = |cur: &mut String| {
        if let Some((k, v)) = cur.split_once('=') {
            out.push((k.trim().to_string(), v.to_string()));
        }
        cur.clear();
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ',' | '+' => push(&mut cur),
            c => cur.push(c),
        }
    }
    push(&mut cur);
    out
}

/// A lower-case hex serial as the decimal the exporter prints (Go's `big.Int.String`).
pub(super) fn hex_to_decimal(hex: &str) -> String {
    let Ok(bytes) = base16ct::mixed::decode_vec(if hex.len() % 2 == 1 {
        format!("0{hex}")
    } else {
        hex.to_string()
    }) else {
        return hex.to_string();
    };
    // Repeated division by 10^9 of the big-endian number.
    let mut num: Vec<u32> = bytes.iter().map(|b| u32::from(*b)).collect();
    let mut groups = Vec::new();
    while num.iter().any(|d| *d != 0) {
        let mut rem: u64 = 0;
        for d in num.iter_mut() {
            let cur = (rem << 8) | u64::from(*d);
            *d = u32::try_from(cur / 1_000_000_000).unwrap_or(0);
            rem = cur % 1_000_000_000;
        }
        groups.push(rem);
        // Normalise: each digit stays a byte (cur / 10^9 < 256 since rem < 10^9).
    }
    let mut s = groups
        .pop()
        .map(|g| g.to_string())
        .unwrap_or_else(|| "0".into());
    while let Some(g) = groups.pop() {
        let _ = write!(s, "{g:09}");
    }
    s
}
