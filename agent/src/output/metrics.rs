//! Prometheus metrics: the text exposition format (version 0.0.4) of
//!
//! - the certificate gauges of enix's x509-certificate-exporter, with its names, HELP texts,
//!   types and labels, so that its dashboards and alert rules work unchanged on certrotor's
//!   output: `x509_cert_not_before`, `x509_cert_not_after`, `x509_cert_expired` per certificate
//!   (labels `filename`, `filepath`, `serial_number` in decimal, `issuer_*`/`subject_*` for the
//!   C, ST, L, O, OU and CN present, and for a kubeconfig `embedded_kind` = `user` or `cluster`
//!   and `embedded_key` = the user or cluster name), and `x509_read_errors`;
//! - certrotor's own, under `certrotor_`: the last pass (time, result, duration), renewals,
//!   rollbacks, restarts and live reloads per component, the unavailability of the last restart
//!   of each component, the time spent waiting for the cluster lock.
//!
//! `check --output prometheus` prints the certificate gauges (node-exporter's textfile
//! collector); `daemon --metrics-address` serves both on `/metrics` with [`serve`], a small
//! server on `std::net` (no HTTP crate): one thread accepts, each connection gets its own
//! short-lived thread (at most [`MAX_CONNECTIONS`] at once, more are closed at once), reads at
//! most [`MAX_REQUEST_BYTES`] with a timeout, so a slow or hostile client neither stalls the
//! daemon's passes nor other scrapes. The certificate gauges are read fresh from the node's
//! files at each scrape (an inventory of a node takes milliseconds), so they never lag a
//! renewal or a hand-made change; the pass counters live in memory for the daemon's life.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// Bound on reading a request and on writing the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

// === the x509-certificate-exporter family ===

const NOT_BEFORE_HELP: &str = "Indicates the certificate's not before timestamp";
const NOT_AFTER_HELP: &str = "Indicates the certificate's not after timestamp";
const EXPIRED_HELP: &str = "Indicates if the certificate is expired";
const READ_ERRORS_HELP: &str = "Indicates the number of read failure(s)";

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
    let mut series = Vec::new();
    let mut errors = 0u64;
    for (i, r) in inv.certificates.iter().enumerate() {
        let required = inv.entries.get(i).is_some_and(|e| e.required);
        match r.status {
            Status::Invalid => errors += 1,
            // A required file that is absent is a failure to read it; an optional one
            // (super-admin.conf on a second control plane) is not.
            Status::Missing if required => errors += 1,
            _ => {}
        }
        series.extend(record_series(root, r));
    }
    let mut out = String::new();
    for (name, help) in [
        ("x509_cert_not_before", NOT_BEFORE_HELP),
        ("x509_cert_not_after", NOT_AFTER_HELP),
        ("x509_cert_expired", EXPIRED_HELP),
    ] {
        header(&mut out, name, help, "gauge");
        for s in &series {
            let v = match name {
                "x509_cert_not_before" => s.not_before,
                "x509_cert_not_after" => s.not_after,
                _ => i64::from(now > s.not_after),
            };
            sample(&mut out, name, &s.labels, &v.to_string());
        }
    }
    header(&mut out, "x509_read_errors", READ_ERRORS_HELP, "gauge");
    sample(&mut out, "x509_read_errors", &[], &errors.to_string());
    out
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
}

/// The results a pass can have.
pub const RESULTS: [&str; 4] = ["ok", "deferred", "rolled_back", "failed"];

impl Counters {
    /// Counts one pass that ended at `now`.
    pub fn record_pass(&mut self, result: &Result<RunReport, OpsError>, now: i64, took: Duration) {
        let label = match result {
            Err(_) => "failed",
            Ok(r) if r.rolled_back.is_some() => "rolled_back",
            Ok(r) if r.cluster.as_ref().is_some_and(|c| c.deferred) => "deferred",
            Ok(_) => "ok",
        };
        *self.passes.entry(label).or_default() += 1;
        self.last_pass_unix = Some(now);
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

    /// Counts a component that took its renewed files without a restart.
    pub fn record_live_reload(&mut self, component: &str) {
        *self.live_reloads.entry(component.to_string()).or_default() += 1;
    }

    /// certrotor's own families.
    pub fn render(&self) -> String {
        let mut o = String::new();
        header(
            &mut o,
            "certrotor_passes_total",
            "Passes the daemon ran, by result (ok, deferred, rolled_back, failed)",
            "counter",
        );
        for r in RESULTS {
            let n = self.passes.get(r).copied().unwrap_or(0);
            sample(
                &mut o,
                "certrotor_passes_total",
                &[l("result", r)],
                &n.to_string(),
            );
        }
        header(
            &mut o,
            "certrotor_last_pass_timestamp_seconds",
            "When the last pass ended (Unix seconds; 0 before the first pass)",
            "gauge",
        );
        let t = self.last_pass_unix.unwrap_or(0);
        sample(
            &mut o,
            "certrotor_last_pass_timestamp_seconds",
            &[],
            &t.to_string(),
        );
        header(
            &mut o,
            "certrotor_last_pass_result",
            "The result of the last pass: 1 for its result, 0 for the others",
            "gauge",
        );
        for r in RESULTS {
            let v = u8::from(self.last_result == Some(r));
            sample(
                &mut o,
                "certrotor_last_pass_result",
                &[l("result", r)],
                &v.to_string(),
            );
        }
        header(
            &mut o,
            "certrotor_last_pass_duration_seconds",
            "How long the last pass took",
            "gauge",
        );
        sample(
            &mut o,
            "certrotor_last_pass_duration_seconds",
            &[],
            &float(self.last_pass_seconds),
        );
        header(
            &mut o,
            "certrotor_renewed_certificates_total",
            "Certificates and kubeconfigs renewed",
            "counter",
        );
        sample(
            &mut o,
            "certrotor_renewed_certificates_total",
            &[],
            &self.renewed.to_string(),
        );
        header(
            &mut o,
            "certrotor_rollbacks_total",
            "Automatic rollbacks after a failed verification",
            "counter",
        );
        sample(
            &mut o,
            "certrotor_rollbacks_total",
            &[],
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
        header(
            &mut o,
            "certrotor_cluster_lock_wait_seconds_total",
            "Time spent waiting for the cluster lock and health gates",
            "counter",
        );
        sample(
            &mut o,
            "certrotor_cluster_lock_wait_seconds_total",
            &[],
            &float(self.lock_wait_seconds_total),
        );
        header(
            &mut o,
            "certrotor_last_cluster_lock_wait_seconds",
            "Time the last pass waited for the cluster lock and health gates",
            "gauge",
        );
        sample(
            &mut o,
            "certrotor_last_cluster_lock_wait_seconds",
            &[],
            &float(self.last_lock_wait_seconds),
        );
        o
    }
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
            counters: Mutex::new(Counters::default()),
        })
    }

    /// The whole page: certificate gauges read now, then the counters.
    pub fn page(&self) -> String {
        let now = crate::sys::clock::now();
        let inv = inventory::take(&self.root, now, 0);
        let mut page = certificate_gauges(&self.root, &inv, now);
        let counters = match self.counters.lock() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        page.push_str(&counters.render());
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

/// Binds `addr` and serves `/metrics` from a background thread. Errors only on bind.
pub fn serve(addr: SocketAddr, shared: Arc<Shared>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::SeqCst);
                    drop(stream);
                    continue;
                }
                let (shared, mine) = (Arc::clone(&shared), Arc::clone(&active));
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        if let Err(e) = answer(stream, &shared) {
                            log::debug!("metrics: connection ended: {e}");
                        }
                        mine.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })?;
    Ok(bound)
}

/// Reads one request (bounded, with a timeout) and answers it.
fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return respond(&mut stream, "431 Request Header Fields Too Large", "", "");
        }
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
            respond_len(&mut stream, "200 OK", CONTENT_TYPE, body, page.len())
        }
        ("GET" | "HEAD", "/") => respond(
            &mut stream,
            "200 OK",
            "text/plain; charset=utf-8",
            "certrotor: metrics at /metrics\n",
        ),
        ("GET" | "HEAD", _) => respond(&mut stream, "404 Not Found", "text/plain", "not found\n"),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "use GET\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    respond_len(stream, status, ctype, body, body.len())
}

fn respond_len(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
    len: usize,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
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
        use crate::node::manifests::Component;
        let report = RunReport {
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
            }],
            versions: Vec::new(),
            reload_notes: Vec::new(),
            other_consumers: Vec::new(),
            restarted_pods: vec![crate::restart::RestartedPod {
                pod: "kube-vip".into(),
                file: "etc/kubernetes/admin.conf".into(),
                unavailable_ms: 1500,
                reason: "test".into(),
            }],
            pod_errors: Vec::new(),
            owed_pods: Vec::new(),
            rolled_back: None,
            cluster: None,
            import: None,
            duration_ms: 0,
        };
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

    #[test]
    fn label_values_are_escaped() {
        let mut o = String::new();
        sample(&mut o, "m", &[l("a", "x\"y\\z\nw")], "1");
        assert_eq!(o, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }
}
