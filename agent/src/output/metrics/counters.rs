//! certrotor's own metrics (`certrotor_*`): the daemon's counters of passes, renewals,
//! rollbacks, restarts and reloads, and the node's state read at each scrape (owed restarts,
//! when each renewed certificate falls due).

use super::*;
use crate::node::inventory::Inventory;
use crate::pass::ops::OpsError;
use crate::pass::run::RunReport;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

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

/// The CA rotation recorded on the node (`ca-rotation.json`): 1 for its CA and stage; no
/// sample when there is none, `stage="unknown"` when the file cannot be used.
fn ca_rotation(o: &mut String, root: &Path) {
    let (ca, stage) = match crate::ca::rotation::Rotation::load(root) {
        Ok(None) => return,
        Ok(Some(r)) => (r.ca.name(), r.stage.name()),
        Err(e) => {
            log::debug!("metrics: the CA rotation state: {e}");
            ("unknown", "unknown")
        }
    };
    header(
        o,
        "certrotor_ca_rotation_stage",
        "The CA rotation recorded on this node (ca-rotation.json): 1 for its CA and stage",
        "gauge",
    );
    sample(
        o,
        "certrotor_ca_rotation_stage",
        &[l("ca", ca), l("stage", stage)],
        "1",
    );
}

/// What the daemon reads from the node at each scrape besides the certificates: the restarts
/// owed (the pass state `pass.json`: 1 for each component or static pod owed, 0 for the other
/// components) and, given `--within`, when each certificate certrotor renews falls due.
pub(super) fn node_state(root: &Path, inv: &Inventory, within: Option<i64>) -> String {
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
    ca_rotation(&mut o, root);
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
