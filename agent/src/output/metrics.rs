//! Prometheus metrics: the text exposition format (version 0.0.4) of
//!
//! - the certificate gauges of enix's x509-certificate-exporter, with its names, HELP texts,
//!   types and labels, so that its dashboards and alert rules work unchanged on certrotor's
//!   output: `x509_cert_not_before`, `x509_cert_not_after`, `x509_cert_expired` per certificate
//!   (labels `filename`, `filepath`, `serial_number` in decimal, `issuer_*`/`subject_*` for the
//!   C, ST, L, O, OU and CN present, and for a kubeconfig `embedded_kind` = `user` or `cluster`
//!   and `embedded_key` = the user or cluster name), `x509_read_errors` (v3's count of failed
//!   reads) and `x509_cert_error` per file (v3's and v4's `CertificateError` rule: 1 for a file
//!   that failed, 0 for one read);
//! - the per-source families enix v4 replaced `x509_read_errors` with, a source being what
//!   certrotor reads: a folder of certificate files (`source_kind="file"`, `source_name` = the
//!   folder, `/etc/kubernetes/pki`) or one kubeconfig (`source_kind="kubeconfig"`, the file):
//!   `x509_source_up` (the folder can be listed, the kubeconfig gave its certificate),
//!   `x509_source_bundles` (its files present) and, in the daemon, the counter
//!   `x509_source_errors_total{reason}`, one per failed file at each scrape (v4's file source
//!   counts one per failed file at each of its walks);
//! - certrotor's own, under `certrotor_`: the last pass (time, result, duration), the last
//!   successful pass, renewals, rollbacks, restarts and live reloads per component, the
//!   unavailability of the last restart of each component, the time spent waiting for the
//!   cluster lock, the daemon's start, `--interval` and `--within`, the restarts owed
//!   (the pass state `pass.json`, read at each scrape) and when each certificate certrotor renews
//!   falls due (its notAfter minus `--within`): what the alert rules of
//!   `bottlerocket/packaging/monitoring/` need.
//!
//! `check --output prometheus` prints the certificate gauges (node-exporter's textfile
//! collector); `daemon --metrics-address` serves both on `/metrics` with [`serve`], a small
//! server on `std::net` (no HTTP crate): one thread accepts, each connection gets its own
//! short-lived thread (at most [`MAX_CONNECTIONS`] at once: when all are taken, the oldest is
//! closed for the new one), reads at most [`MAX_REQUEST_BYTES`], the whole exchange within
//! [`IO_TIMEOUT`], so a slow or hostile client neither stalls the daemon's passes nor other
//! scrapes. The certificate gauges are read fresh from the node's
//! files at each scrape (an inventory of a node takes milliseconds), so they never lag a
//! renewal or a hand-made change; the pass counters live in memory for the daemon's life.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::node::catalog::Kind;
use crate::node::inventory::{self, Inventory, Record, Status};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::pass::ops::OpsError;
use crate::pass::run::RunReport;
use crate::pki::{Cert, MAX_PEM_FILE_BYTES};

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Connections served at once; more are closed without an answer.
pub const MAX_CONNECTIONS: usize = 8;
/// The most of a request read (a scrape's request is a few hundred bytes).
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Bound on a whole exchange: reading the request and writing the answer, together.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

// === the x509-certificate-exporter family ===

const NOT_BEFORE_HELP: &str = "Indicates the certificate's not before timestamp";
const NOT_AFTER_HELP: &str = "Indicates the certificate's not after timestamp";
const EXPIRED_HELP: &str = "Indicates if the certificate is expired";
const READ_ERRORS_HELP: &str = "Indicates the number of read failure(s)";
/// v3's HELP of `x509_cert_error`, verbatim (its spelling included).
const CERT_ERROR_HELP: &str = "Indicates wether the corresponding secret has read failure(s)";
const SOURCE_UP_HELP: &str =
    "1 if the source (a folder of certificate files, or a kubeconfig) could be read, 0 otherwise";
const SOURCE_BUNDLES_HELP: &str = "Files of the source present on the node";
const SOURCE_ERRORS_HELP: &str =
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
    if r.kind == Kind::Kubeconfig {
        return SourceName {
            kind: "kubeconfig",
            name: abs.to_string(),
        };
    }
    let dir = abs.rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
    SourceName {
        kind: "file",
        name: if dir.is_empty() {
            "/".into()
        } else {
            dir.into()
        },
    }
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
                    if r.kind == Kind::Kubeconfig {
                        "decode_failed"
                    } else {
                        "bad_pem"
                    }
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
    let creds = if r.kind == Kind::Kubeconfig {
        kubeconfig_credentials(root, &r.path)
    } else {
        None
    };
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
fn dn_labels(labels: &mut Vec<(String, String)>, prefix: &str, name: &str) {
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
fn hex_to_decimal(hex: &str) -> String {
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

// === certrotor's own ===

/// What the daemon counts over its life.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub passes: BTreeMap<&'static str, u64>,
    pub last_pass_unix: Option<i64>,
    pub last_result: Option<&'static str>,
    pub last_pass_seconds: f64,
    pub renewed: u64,
    pub rollbacks: u64,
    pub restarts: BTreeMap<String, u64>,
    pub live_reloads: BTreeMap<String, u64>,
    pub last_unavailable_seconds: BTreeMap<String, f64>,
    pub lock_wait_seconds_total: f64,
    pub last_lock_wait_seconds: f64,
    /// When the last pass with result `ok` ended.
    pub last_success_unix: Option<i64>,
    /// When the daemon started serving metrics (set by [`Shared::new`]).
    pub started_unix: Option<i64>,
    /// The daemon's `--interval` and `--within` (set by [`Counters::schedule`]).
    pub interval_seconds: Option<f64>,
    pub within_seconds: Option<i64>,
    /// `x509_source_errors_total`: (source kind, source name, reason) -> count.
    pub source_errors: BTreeMap<(String, String, String), u64>,
}

/// The results a pass can have.
pub const RESULTS: [&str; 4] = ["ok", "deferred", "rolled_back", "failed"];

impl Counters {
    /// Counts one pass that ended at `now`.
    pub fn record_pass(&mut self, result: &Result<RunReport, OpsError>, now: i64, took: Duration) {
        use crate::pass::outcome::{EXIT_OK, for_run};
        let label = match result {
            Err(_) => "failed",
            Ok(r) if r.rolled_back.is_some() => "rolled_back",
            Ok(r) if r.cluster.as_ref().is_some_and(|c| c.deferred) => "deferred",
            // Renewed, but a static pod was not restarted, the pair published through etcd was
            // refused or an installed one rolled back: the pass's exit code says failed, and
            // so does `status` (`last-pass.json`); the rules count it as no success.
            Ok(r) if for_run(r) != EXIT_OK => "failed",
            Ok(_) => "ok",
        };
        *self.passes.entry(label).or_default() += 1;
        self.last_pass_unix = Some(now);
        if label == "ok" {
            self.last_success_unix = Some(now);
        }
        self.last_result = Some(label);
        self.last_pass_seconds = took.as_secs_f64();
        let Ok(r) = result else { return };
        if r.renew.backup_id.is_some() && !r.renew.dry_run {
            self.renewed += r.renew.plan.items.len() as u64;
        }
        if let Some(rb) = &r.rolled_back {
            self.rollbacks += 1;
            self.count_restarts(&rb.restarted);
        }
        self.count_restarts(&r.restarted);
        for x in &r.reloaded {
            self.record_live_reload(x.component.name());
        }
        for p in &r.restarted_pods {
            *self.restarts.entry(p.pod.clone()).or_default() += 1;
            self.last_unavailable_seconds
                .insert(p.pod.clone(), p.unavailable_ms as f64 / 1000.0);
        }
        if let Some(c) = &r.cluster {
            let s = c.waited_ms as f64 / 1000.0;
            self.lock_wait_seconds_total += s;
            self.last_lock_wait_seconds = s;
        }
    }

    fn count_restarts(&mut self, restarted: &[crate::restart::Restarted]) {
        for x in restarted {
            let name = x.component.name().to_string();
            *self.restarts.entry(name.clone()).or_default() += 1;
            self.last_unavailable_seconds
                .insert(name, x.unavailable_ms as f64 / 1000.0);
        }
    }

    /// The daemon's `--interval` and `--within`: the rules compare the time since the last
    /// successful pass with the interval, and a certificate falls due `within` before notAfter.
    pub fn schedule(&mut self, interval: Duration, within: i64) {
        self.interval_seconds = Some(interval.as_secs_f64());
        self.within_seconds = Some(within);
    }

    /// Counts the failed reads of one scrape in `x509_source_errors_total`.
    pub fn count_read_failures(&mut self, failures: &[ReadFailure]) {
        for f in failures {
            let key = (
                f.source.kind.to_string(),
                f.source.name.clone(),
                f.reason.to_string(),
            );
            *self.source_errors.entry(key).or_default() += 1;
        }
    }

    /// `x509_source_errors_total`, enix v4's counter; absent until a read fails, as in v4.
    pub fn render_source_errors(&self) -> String {
        let mut o = String::new();
        if self.source_errors.is_empty() {
            return o;
        }
        header(
            &mut o,
            "x509_source_errors_total",
            SOURCE_ERRORS_HELP,
            "counter",
        );
        for ((kind, name, reason), n) in &self.source_errors {
            sample(
                &mut o,
                "x509_source_errors_total",
                &[
                    l("source_kind", kind),
                    l("source_name", name),
                    l("reason", reason),
                ],
                &n.to_string(),
            );
        }
        o
    }

    /// Counts a component that took its renewed files without a restart.
    pub fn record_live_reload(&mut self, component: &str) {
        *self.live_reloads.entry(component.to_string()).or_default() += 1;
    }

    /// certrotor's own families.
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.render_passes(&mut o);
        unlabelled(
            &mut o,
            "certrotor_renewed_certificates_total",
            "Certificates and kubeconfigs renewed",
            "counter",
            &self.renewed.to_string(),
        );
        unlabelled(
            &mut o,
            "certrotor_rollbacks_total",
            "Automatic rollbacks after a failed verification",
            "counter",
            &self.rollbacks.to_string(),
        );
        per_component(
            &mut o,
            "certrotor_restarts_total",
            "Component restarts, by component",
            "counter",
            &self.restarts,
            |v| v.to_string(),
        );
        per_component(
            &mut o,
            "certrotor_live_reloads_total",
            "Components that took renewed files without a restart, by component",
            "counter",
            &self.live_reloads,
            |v| v.to_string(),
        );
        per_component(
            &mut o,
            "certrotor_last_restart_unavailable_seconds",
            "How long the component was unavailable in its last restart (stop to verified healthy)",
            "gauge",
            &self.last_unavailable_seconds,
            |v| float(*v),
        );
        unlabelled(
            &mut o,
            "certrotor_cluster_lock_wait_seconds_total",
            "Time spent waiting for the cluster lock and health gates",
            "counter",
            &float(self.lock_wait_seconds_total),
        );
        unlabelled(
            &mut o,
            "certrotor_last_cluster_lock_wait_seconds",
            "Time the last pass waited for the cluster lock and health gates",
            "gauge",
            &float(self.last_lock_wait_seconds),
        );
        unlabelled(
            &mut o,
            "certrotor_last_success_timestamp_seconds",
            "When the last pass with result ok ended (Unix seconds; 0 before the first)",
            "gauge",
            &self.last_success_unix.unwrap_or(0).to_string(),
        );
        self.render_settings(&mut o);
        o
    }

    /// The families of the passes: by result, and the last one's end, result and duration.
    fn render_passes(&self, o: &mut String) {
        header(
            o,
            "certrotor_passes_total",
            "Passes the daemon ran, by result (ok, deferred, rolled_back, failed)",
            "counter",
        );
        for r in RESULTS {
            let n = self.passes.get(r).copied().unwrap_or(0);
            sample(
                o,
                "certrotor_passes_total",
                &[l("result", r)],
                &n.to_string(),
            );
        }
        unlabelled(
            o,
            "certrotor_last_pass_timestamp_seconds",
            "When the last pass ended (Unix seconds; 0 before the first pass)",
            "gauge",
            &self.last_pass_unix.unwrap_or(0).to_string(),
        );
        header(
            o,
            "certrotor_last_pass_result",
            "The result of the last pass: 1 for its result, 0 for the others",
            "gauge",
        );
        for r in RESULTS {
            let v = u8::from(self.last_result == Some(r));
            sample(
                o,
                "certrotor_last_pass_result",
                &[l("result", r)],
                &v.to_string(),
            );
        }
        unlabelled(
            o,
            "certrotor_last_pass_duration_seconds",
            "How long the last pass took",
            "gauge",
            &float(self.last_pass_seconds),
        );
    }

    /// The daemon's start and settings, when known.
    fn render_settings(&self, o: &mut String) {
        if let Some(t) = self.started_unix {
            unlabelled(
                o,
                "certrotor_daemon_start_timestamp_seconds",
                "When the daemon started (Unix seconds)",
                "gauge",
                &t.to_string(),
            );
        }
        if let Some(i) = self.interval_seconds {
            unlabelled(
                o,
                "certrotor_interval_seconds",
                "The daemon's --interval between two passes",
                "gauge",
                &float(i),
            );
        }
        if let Some(w) = self.within_seconds {
            unlabelled(
                o,
                "certrotor_renewal_window_seconds",
                "The daemon's --within: what expires within this many seconds is renewed",
                "gauge",
                &w.to_string(),
            );
        }
    }
}

/// What the daemon reads from the node at each scrape besides the certificates: the restarts
/// owed (the pass state `pass.json`: 1 for each component or static pod owed, 0 for the other
/// components) and, given `--within`, when each certificate certrotor renews falls due.
fn node_state(root: &Path, inv: &Inventory, within: Option<i64>) -> String {
    use crate::node::manifests::Component;
    let mut o = String::new();
    let mut owed: BTreeMap<String, u8> = Component::ALL
        .iter()
        .map(|c| (c.name().to_string(), 0))
        .collect();
    match crate::pass::state::owed(root) {
        Ok((record, _)) => {
            let names = (record.components.iter().map(|c| c.name().to_string()))
                .chain(record.pods.iter().cloned());
            for name in names {
                owed.insert(name, 1);
            }
        }
        // A record that cannot be read owes something unknown: the alert shows it and
        // `certrotor status` says what is wrong with the record.
        Err(e) => {
            log::debug!("metrics: the pass state: {e}");
            owed.insert("unknown".into(), 1);
        }
    }
    per_component(
        &mut o,
        "certrotor_restarts_owed",
        "Restarts owed to the next pass (the pass state, pass.json): 1 for each component or \
         static pod owed, 0 for the other components",
        "gauge",
        &owed,
        |v| v.to_string(),
    );
    let Some(within) = within else { return o };
    header(
        &mut o,
        "certrotor_certificate_renewal_due_timestamp_seconds",
        "When a certificate certrotor renews falls due: its notAfter minus --within (Unix seconds)",
        "gauge",
    );
    // What `certrotor status` counts for its next due: renewable, with its CA's key here.
    for r in inv
        .certificates
        .iter()
        .filter(|r| r.renewable && !r.externally_managed)
    {
        let Some(not_after) = r.not_after_unix else {
            continue;
        };
        let abs = format!("/{}", r.path.trim_start_matches('/'));
        sample(
            &mut o,
            "certrotor_certificate_renewal_due_timestamp_seconds",
            &[l("name", &r.name), l("filepath", &abs)],
            &(not_after - within).to_string(),
        );
    }
    o
}

fn per_component<T>(
    o: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    map: &BTreeMap<String, T>,
    value: impl Fn(&T) -> String,
) {
    header(o, name, help, kind);
    for (c, v) in map {
        sample(o, name, &[l("component", c)], &value(v));
    }
}

fn l(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

fn float(v: f64) -> String {
    format!("{v:.3}")
}

/// A family of one sample without labels.
fn unlabelled(o: &mut String, name: &str, help: &str, kind: &str, value: &str) {
    header(o, name, help, kind);
    sample(o, name, &[], value);
}

fn header(o: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(
        o,
        "# HELP {name} {}",
        help.replace('\\', "\\\\").replace('\n', "\\n")
    );
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

fn sample(o: &mut String, name: &str, labels: &[(String, String)], value: &str) {
    o.push_str(name);
    if !labels.is_empty() {
        o.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(o, "{k}=\"{v}\"");
        }
        o.push('}');
    }
    let _ = writeln!(o, " {value}");
}

// === the server ===

/// What the server reads: the node root (for fresh certificate gauges) and the counters.
#[derive(Debug)]
pub struct Shared {
    pub root: PathBuf,
    pub counters: Mutex<Counters>,
}

impl Shared {
    pub fn new(root: &Path) -> Arc<Shared> {
        Arc::new(Shared {
            root: root.to_path_buf(),
            counters: Mutex::new(Counters {
                started_unix: Some(crate::sys::clock::now()),
                ..Counters::default()
            }),
        })
    }

    /// The whole page: certificate gauges read now (their failed reads counted), then the
    /// counters, then the restarts owed and the certificates' due dates read now.
    ///
    /// The counters are copied before the files are read: a pass that ends between the two
    /// reads then shows its renewed files beside the counters of before it, never a counted
    /// pass beside the files it replaced (a page is never older on disk than in its counts).
    pub fn page(&self) -> String {
        let mut counters = Counters::default();
        self.update(|c| counters = c.clone());
        let now = crate::sys::clock::now();
        let inv = inventory::take(&self.root, now, 0);
        let (mut page, failures) = certificate_read(&self.root, &inv, now);
        self.update(|c| c.count_read_failures(&failures));
        counters.count_read_failures(&failures);
        page.push_str(&counters.render_source_errors());
        page.push_str(&counters.render());
        page.push_str(&node_state(&self.root, &inv, counters.within_seconds));
        page
    }

    /// Runs `f` on the counters.
    pub fn update(&self, f: impl FnOnce(&mut Counters)) {
        match self.counters.lock() {
            Ok(mut c) => f(&mut c),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }
}

/// The connections being served, oldest first: (id, when accepted, a handle to close it).
#[derive(Default)]
struct Connections {
    next: u64,
    open: Vec<(u64, std::time::Instant, TcpStream)>,
}

/// Binds `addr` and serves `/metrics` from a background thread. Errors only on bind.
///
/// At most [`MAX_CONNECTIONS`] are served at once. When all are taken, the oldest gives its
/// slot to the new one (it is closed): a scrape takes milliseconds, so the oldest is a client
/// that is slow on purpose or stuck, and scrapes never wait behind slow clients (issue 30.6).
/// Each connection has [`IO_TIMEOUT`] in all to send its request and take the answer, however
/// it trickles.
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let conns: Arc<Mutex<Connections>> = Arc::default();
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let Ok(handle) = stream.try_clone() else {
                    continue;
                };
                let id = {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    if c.open.len() >= MAX_CONNECTIONS {
                        let (_, since, oldest) = c.open.remove(0);
                        log::debug!(
                            "metrics: closing a connection open for {:?} to serve a new one",
                            since.elapsed()
                        );
                        let _ = oldest.shutdown(std::net::Shutdown::Both);
                    }
                    c.next += 1;
                    let id = c.next;
                    c.open.push((id, std::time::Instant::now(), handle));
                    id
                };
                let (shared, mine) = (Arc::clone(&shared), Arc::clone(&conns));
                let done = move |conns: &Mutex<Connections>| {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    c.open.retain(|(i, _, _)| *i != id);
                };
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        if let Err(e) = answer(stream, &shared) {
                            log::debug!("metrics: connection ended: {e}");
                        }
                        done(&mine);
                    });
                if spawned.is_err() {
                    let mut c = conns.lock().unwrap_or_else(|p| p.into_inner());
                    c.open.retain(|(i, _, _)| *i != id);
                }
            }
        })?;
    Ok(bound)
}

/// The time left before `deadline`, or a timeout error when none is left.
fn left(deadline: std::time::Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    if left.is_zero() {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the request and its answer took longer than the metrics server allows",
        ))
    } else {
        Ok(left)
    }
}

/// Reads one request and answers it, the whole exchange bounded by [`IO_TIMEOUT`] (not each
/// read: a client sending a byte now and then would otherwise hold its slot for ever).
fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return respond(
                &mut stream,
                deadline,
                "431 Request Header Fields Too Large",
                "",
                "",
            );
        }
        stream.set_read_timeout(Some(left(deadline)?))?;
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let page = shared.page();
            let body = if method == "HEAD" { "" } else { page.as_str() };
            respond_len(
                &mut stream,
                deadline,
                "200 OK",
                CONTENT_TYPE,
                body,
                page.len(),
            )
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            deadline,
            "200 OK",
            "text/plain; charset=utf-8",
            "certrotor: metrics at /metrics\n",
        ),
        ("GET" | "HEAD", _) => respond(
            &mut stream,
            deadline,
            "404 Not Found",
            "text/plain",
            "not found\n",
        ),
        _ => respond(
            &mut stream,
            deadline,
            "405 Method Not Allowed",
            "text/plain",
            "use GET\n",
        ),
    }
}

fn respond(
    stream: &mut TcpStream,
    deadline: std::time::Instant,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    respond_len(stream, deadline, status, ctype, body, body.len())
}

fn respond_len(
    stream: &mut TcpStream,
    deadline: std::time::Instant,
    status: &str,
    ctype: &str,
    body: &str,
    len: usize,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    // Written in pieces, each bounded by the time left: a client that reads slowly cannot hold
    // the connection past the deadline either.
    for part in [head.as_bytes(), body.as_bytes()] {
        for chunk in part.chunks(16 * 1024) {
            stream.set_write_timeout(Some(left(deadline)?))?;
            stream.write_all(chunk)?;
        }
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_print_in_decimal_as_the_exporter_does() {
        assert_eq!(hex_to_decimal("2a"), "42");
        assert_eq!(hex_to_decimal("0"), "0");
        assert_eq!(hex_to_decimal("ffffffffffffffff"), "18446744073709551615");
        assert_eq!(
            hex_to_decimal("0100000000000000000000"),
            "1208925819614629174706176"
        );
    }

    #[test]
    fn names_give_the_exporter_labels_unescaped() {
        let mut v = Vec::new();
        dn_labels(
            &mut v,
            "subject",
            "CN=kube-apiserver-kubelet-client,O=system\\,masters",
        );
        assert_eq!(
            v,
            [
                l("subject_O", "system,masters"),
                l("subject_CN", "kube-apiserver-kubelet-client")
            ]
        );
    }

    /// A pass in which etcd reloaded live, the apiserver was restarted and a kube-vip pod was
    /// restarted: each is counted under its own name (issue 12.1).
    #[test]
    fn a_pass_counts_live_reloads_restarts_and_restarted_pods_per_component() {
        let report = sample_report();
        let mut c = Counters::default();
        c.record_pass(&Ok(report.clone()), 1, Duration::from_secs(1));
        let page = c.render();
        for line in [
            "certrotor_live_reloads_total{component=\"etcd\"} 1\n",
            "certrotor_restarts_total{component=\"kube-apiserver\"} 1\n",
            "certrotor_restarts_total{component=\"kube-vip\"} 1\n",
            "certrotor_last_restart_unavailable_seconds{component=\"kube-vip\"} 1.500\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        assert!(
            !page.contains("certrotor_restarts_total{component=\"etcd\"}"),
            "{page}"
        );
        c.record_pass(&Ok(report), 2, Duration::from_secs(1));
        assert!(
            c.render()
                .contains("certrotor_live_reloads_total{component=\"etcd\"} 2\n")
        );
    }

    /// A pass in which etcd reloaded live, the apiserver was restarted and a kube-vip pod was
    /// restarted.
    fn sample_report() -> RunReport {
        use crate::node::manifests::Component;
        RunReport {
            renew: crate::pass::ops::RenewReport {
                root: "/".into(),
                dry_run: false,
                plan: crate::renew::Plan {
                    items: Vec::new(),
                    skipped: Vec::new(),
                    not_before: String::new(),
                    not_after: String::new(),
                    not_before_unix: 0,
                    not_after_unix: 0,
                    reuse_keys: false,
                },
                backup_id: Some("b".into()),
                files_written: Vec::new(),
                kubelet: Default::default(),
                duration_ms: 0,
            },
            platform: "kubeadm".into(),
            components: vec![Component::Etcd, Component::KubeApiserver],
            reloaded: vec![crate::restart::Reloaded {
                component: Component::Etcd,
                pod: "etcd".into(),
                reloaded_after_ms: 120,
                served_sha256: None,
            }],
            restarted: vec![crate::restart::Restarted {
                component: Component::KubeApiserver,
                pod: "kube-apiserver".into(),
                unavailable_ms: 2500,
                served_sha256: None,
                reason: "test".into(),
                api: Default::default(),
            }],
            versions: Vec::new(),
            reload_notes: Vec::new(),
            other_consumers: Vec::new(),
            restarted_pods: vec![crate::restart::RestartedPod {
                pod: "kube-vip".into(),
                file: "etc/kubernetes/admin.conf".into(),
                unavailable_ms: 1500,
                reason: "test".into(),
                evidence: Default::default(),
                api: Default::default(),
            }],
            pod_errors: Vec::new(),
            owed_pods: Vec::new(),
            rolled_back: None,
            cluster: None,
            import: None,
            discarded_transactions: Vec::new(),
            re_enabled: Vec::new(),
            left_disabled: Vec::new(),
            api: Default::default(),
            duration_ms: 0,
        }
    }

    /// The schedule and the last successful pass are rendered for the rules; a pass that is not
    /// `ok` leaves the last success where it was.
    #[test]
    fn counters_render_the_schedule_and_the_last_successful_pass() {
        let mut c = Counters::default();
        let page = c.render();
        assert!(
            page.contains("\ncertrotor_last_success_timestamp_seconds 0\n"),
            "{page}"
        );
        assert!(!page.contains("certrotor_interval_seconds"), "{page}");
        c.schedule(Duration::from_secs(6 * 3600), 60 * 86_400);
        c.record_pass(&Ok(sample_report()), 1_000, Duration::from_secs(1));
        let mut rolled_back = sample_report();
        rolled_back.rolled_back = Some(crate::pass::run::RolledBack {
            failure: "test".into(),
            backup_id: "b".into(),
            restarted: Vec::new(),
            error: None,
        });
        c.record_pass(&Ok(rolled_back), 2_000, Duration::from_secs(1));
        let page = c.render();
        for line in [
            "\ncertrotor_last_success_timestamp_seconds 1000\n",
            "\ncertrotor_last_pass_timestamp_seconds 2000\n",
            "\ncertrotor_interval_seconds 21600.000\n",
            "\ncertrotor_renewal_window_seconds 5184000\n",
            "certrotor_last_pass_result{result=\"rolled_back\"} 1\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
    }

    fn lab_node(tag: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("certrotor-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = crate::lab::LabOptions::for_tests(crate::sys::clock::now());
        crate::lab::init(&root, &opts).unwrap();
        root
    }

    fn lines_of<'a>(page: &'a str, name: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|x| x.starts_with(&format!("{name}{{")) || x.starts_with(&format!("{name} ")))
            .collect()
    }

    /// enix v3's `x509_cert_error` and v4's per-source families on a lab node, sound then with
    /// a damaged certificate, a damaged kubeconfig and a missing required certificate: each
    /// failure has its reason, and the daemon's counter grows by one per failed file and scrape.
    #[test]
    fn sources_and_read_failures_as_enix_v3_and_v4_name_them() {
        let root = lab_node("sources");
        let now = crate::sys::clock::now();
        let (page, failures) = certificate_read(&root, &inventory::take(&root, now, 0), now);
        assert!(failures.is_empty(), "{failures:?}");
        let errors = lines_of(&page, "x509_cert_error");
        assert!(errors.len() >= 15, "{page}");
        assert!(errors.iter().all(|x| x.ends_with(" 0")), "{page}");
        for line in [
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki\"} 1\n",
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\"} 1\n",
            "x509_source_up{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/admin.conf\"} 1\n",
            "x509_source_bundles{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/admin.conf\"} 1\n",
            "x509_cert_error{filename=\"apiserver.crt\",filepath=\"/etc/kubernetes/pki/apiserver.crt\"} 0\n",
            "\nx509_read_errors 0\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        let pki = root.join("etc/kubernetes/pki");
        std::fs::write(pki.join("front-proxy-client.crt"), "garbage").unwrap();
        std::fs::write(root.join("etc/kubernetes/scheduler.conf"), "garbage").unwrap();
        std::fs::remove_file(pki.join("etcd/peer.crt")).unwrap();
        let shared = Shared::new(&root);
        let _ = shared.page();
        let page = shared.page();
        for line in [
            "x509_cert_error{filename=\"front-proxy-client.crt\",filepath=\"/etc/kubernetes/pki/front-proxy-client.crt\"} 1\n",
            "x509_cert_error{filename=\"scheduler.conf\",filepath=\"/etc/kubernetes/scheduler.conf\"} 1\n",
            "x509_cert_error{filename=\"peer.crt\",filepath=\"/etc/kubernetes/pki/etcd/peer.crt\"} 1\n",
            "x509_source_up{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/scheduler.conf\"} 0\n",
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\"} 1\n",
            "\nx509_read_errors 3\n",
            "x509_source_errors_total{source_kind=\"file\",source_name=\"/etc/kubernetes/pki\",reason=\"bad_pem\"} 2\n",
            "x509_source_errors_total{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/scheduler.conf\",reason=\"decode_failed\"} 2\n",
            "x509_source_errors_total{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\",reason=\"not_found\"} 2\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        assert_eq!(
            lines_of(&page, "x509_source_errors_total").len(),
            3,
            "{page}"
        );
        assert_eq!(
            lines_of(&page, "x509_cert_error")
                .iter()
                .filter(|x| x.ends_with(" 1"))
                .count(),
            3,
            "{page}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The restarts owed are 0 for every component on a node that owes none; the due dates
    /// appear once the daemon's --within is known, one per renewable certificate (not the CAs).
    #[test]
    fn restarts_owed_and_renewal_due_dates() {
        let root = lab_node("due");
        let shared = Shared::new(&root);
        let page = shared.page();
        let owed = lines_of(&page, "certrotor_restarts_owed");
        assert_eq!(owed.len(), 4, "{page}");
        assert!(owed.iter().all(|x| x.ends_with(" 0")), "{page}");
        assert!(
            !page.contains("certrotor_certificate_renewal_due"),
            "{page}"
        );
        shared.update(|c| c.schedule(Duration::from_secs(3600), 30 * 86_400));
        let page = shared.page();
        let due = lines_of(&page, "certrotor_certificate_renewal_due_timestamp_seconds");
        assert!(due.len() >= 10, "{page}");
        assert!(!due.iter().any(|x| x.contains("ca.crt")), "{page}");
        let now = crate::sys::clock::now();
        let inv = inventory::take(&root, now, 0);
        let apiserver = inv.record("apiserver").unwrap().not_after_unix.unwrap();
        let want = format!(
            "certrotor_certificate_renewal_due_timestamp_seconds{{name=\"apiserver\",filepath=\"/etc/kubernetes/pki/apiserver.crt\"}} {}\n",
            apiserver - 30 * 86_400
        );
        assert!(page.contains(&want), "{want}\n{page}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut o = String::new();
        sample(&mut o, "m", &[l("a", "x\"y\\z\nw")], "1");
        assert_eq!(o, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }
}
