//! What the commands print: the inventory as a table in the manner of `kubeadm certs
//! check-expiration`, the results of renew, run, rollback, backups and etcd-client import, or any
//! of them as JSON. Pure functions from reports to text; the command line prints them.

use crate::node::catalog::Kind;
use crate::node::inventory::{Inventory, Record, Status};
use crate::pass::import::ImportReport;
use crate::pass::ops::RenewReport;
use crate::pass::run::RunReport;
use crate::sys::clock::{human_duration, kubeadm_date};
use crate::txn::{BackupInfo, Outcome};

/// The kubeadm-style table: certificates, then CAs, then what is wrong and what to do.
pub fn table(inv: &Inventory) -> String {
    let mut out = String::new();
    if inv.layouts.is_empty() {
        out.push_str(&format!(
            "No kubeadm or etcdadm PKI found under '{}'. Looked for {}.\n\
             Give the node's root with --root.\n",
            inv.root,
            crate::node::catalog::layout_summary()
        ));
        return out;
    }
    out.push_str(&format!(
        "Node root '{}', layouts: {}\n\n",
        inv.root,
        inv.layouts.join(", ")
    ));
    let leaf_header = [
        "CERTIFICATE",
        "EXPIRES",
        "RESIDUAL TIME",
        "CERTIFICATE AUTHORITY",
        "EXTERNALLY MANAGED",
        "STATUS",
    ];
    out.push_str(&section(inv, false, &leaf_header));
    out.push('\n');
    let ca_header = [
        "CERTIFICATE AUTHORITY",
        "EXPIRES",
        "RESIDUAL TIME",
        "EXTERNALLY MANAGED",
        "STATUS",
    ];
    out.push_str(&section(inv, true, &ca_header));
    out.push_str(&notes(inv));
    out
}

/// The leaves (or the CAs) by name, aligned under `header`.
fn section(inv: &Inventory, cas: bool, header: &[&str]) -> String {
    let mut records: Vec<&Record> = (inv.certificates.iter())
        .filter(|r| (r.kind == Kind::Ca) == cas)
        .collect();
    records.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = vec![row(header)];
    rows.extend(records.iter().map(|r| cells(r, !cas)));
    align(&rows)
}

/// The table's WARNINGS and PROBLEMS, each when there are some.
fn notes(inv: &Inventory) -> String {
    let mut out = String::new();
    let problems: Vec<String> = inv
        .certificates
        .iter()
        .filter(|r| r.status != Status::Ok)
        .filter_map(|r| r.error.as_ref().map(|e| format!("  {}: {}", r.name, e)))
        .chain(
            inv.keys
                .iter()
                .filter_map(|k| k.error.as_ref().map(|e| format!("  {}: {}", k.name, e))),
        )
        .collect();
    let warnings: Vec<String> = inv
        .certificates
        .iter()
        .flat_map(|r| {
            r.warnings
                .iter()
                .map(move |w| format!("  {}: {}", r.name, w))
        })
        .collect();
    if !warnings.is_empty() {
        out.push_str("\nWARNINGS\n");
        for w in warnings {
            out.push_str(&w);
            out.push('\n');
        }
    }
    if !problems.is_empty() {
        out.push_str("\nPROBLEMS\n");
        for p in problems {
            out.push_str(&p);
            out.push('\n');
        }
    }
    out
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

fn cells(r: &Record, with_ca: bool) -> Vec<String> {
    let missing = r.status == Status::Missing;
    let name = if missing {
        format!("!MISSING! {}", r.name)
    } else {
        r.name.clone()
    };
    let expires = r.not_after_unix.map(kubeadm_date).unwrap_or_default();
    let residual = r.residual_seconds.map(human_duration).unwrap_or_default();
    let managed = if missing {
        String::new()
    } else if r.externally_managed {
        "yes".into()
    } else {
        "no".into()
    };
    let status = format!("{:?}", r.status).to_lowercase();
    let mut v = vec![name, expires, residual];
    if with_ca {
        v.push(r.ca.clone().unwrap_or_default());
    }
    v.push(managed);
    v.push(status);
    v
}

/// Aligns columns like Go's tabwriter(minwidth 10, padding 3).
fn align(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max((c.chars().count() + 3).max(10));
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                line.push_str(&format!("{c:<width$}", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A report as pretty JSON. A report that cannot be serialised is an error for the caller to
/// surface, never an empty or placeholder line.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    // The same JSON value, with no character a terminal would obey written raw (issue 30.12).
    serde_json::to_string_pretty(value)
        .map(|j| crate::output::logging::escape_controls_json(&j).into_owned())
}

/// What `renew` did (or would do with `--dry-run`); `restart_hint` adds the advice to restart
/// the components (for `renew`, which does not restart them itself).
pub fn renew_table(r: &RenewReport, restart_hint: bool) -> String {
    let mut out = String::new();
    let plan = &r.plan;
    if plan.items.is_empty() {
        if r.kubelet.is_empty() {
            out.push_str("Nothing to renew.\n");
        }
    } else {
        let verb = if r.dry_run { "Would renew" } else { "Renewed" };
        out.push_str(&format!(
            "{verb} {} certificate(s), valid {} .. {}{}:\n",
            plan.items.len(),
            plan.not_before,
            plan.not_after,
            if plan.reuse_keys {
                ", keeping their keys"
            } else {
                " with new keys"
            }
        ));
        for i in &plan.items {
            let residual = i
                .residual_seconds
                .map(human_duration)
                .unwrap_or_else(|| "?".into());
            out.push_str(&format!(
                "  {:<32} {:<8} residual {:<10} signer {:<16} {}\n",
                i.name,
                i.reason.to_string(),
                residual,
                i.signer,
                i.path
            ));
        }
    }
    for s in &plan.skipped {
        out.push_str(&format!("  skipped {}: {}\n", s.name, s.why));
    }
    // The kubelet's files (kubelet.rs).
    out.push_str(&crate::renew::kubelet::plan_text(&r.kubelet, r.dry_run));
    if let Some(id) = &r.backup_id {
        out.push_str(&format!(
            "Backup: {id} (undo with 'certrotor rollback --backup {id}')\n"
        ));
        if restart_hint {
            out.push_str(
                "Components read certificates at start: restart them so that they use the new files \
                 ('certrotor run --once' does it one at a time and verifies).\n",
            );
        }
    }
    out
}

/// The restart part of one `run` pass (after [`renew_table`]), then what the Bottlerocket API
/// did to it.
pub fn run_table(r: &RunReport) -> String {
    let mut out = restarts_table(r);
    out.push_str(&api_lines(r));
    out
}

/// What the pass met in the Bottlerocket API: transactions an interrupted run left pending,
/// pods found stopped at the end, the retries and re-applies of the whole pass.
fn api_lines(r: &RunReport) -> String {
    let mut out = String::new();
    for t in &r.discarded_transactions {
        out.push_str(&format!(
            "Discarded the Bottlerocket API transaction '{}' left pending by an interrupted run \
             (it would have set {}).\n",
            t.name,
            t.sets.join(", ")
        ));
    }
    if !r.re_enabled.is_empty() {
        out.push_str(&format!(
            "Found stopped at the end of the pass and started again (not verified; owed to the \
             next pass): {}\n",
            r.re_enabled.join(", ")
        ));
    }
    for e in &r.left_disabled {
        out.push_str(&format!("STILL STOPPED: {e}\n"));
    }
    if let Some(text) = r.api.describe() {
        out.push_str(&format!("Bottlerocket API during this pass: {text}.\n"));
    }
    out
}

fn restarts_table(r: &RunReport) -> String {
    let mut out = pods_text(r);
    if r.components.is_empty() {
        if let Some(c) = r
            .cluster
            .as_ref()
            .filter(|c| c.pair.is_some() || c.pair_error.is_some() || c.error.is_some())
        {
            out.push_str(&cluster_table(c));
        }
        return out;
    }
    let names = r
        .components
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ");
    if r.platform == "none" {
        out.push_str(&format!(
            "Platform none: restart {names} so that they use the new certificates.\n"
        ));
        return out;
    }
    if let Some(c) = &r.cluster {
        out.push_str(&cluster_table(c));
        if c.deferred {
            out.push_str(&format!(
                "Restarts of {names} put off: they stay owed to the next pass.\n"
            ));
            return out;
        }
    }
    out.push_str(&reloads_text(r));
    out.push_str(&component_restarts_text(r));
    out
}

/// The static pods restarted or owed besides the components, and the imported etcd client pair.
fn pods_text(r: &RunReport) -> String {
    let mut out = String::new();
    for c in &r.other_consumers {
        let done = r.restarted_pods.iter().find(|p| p.pod == c.pod);
        out.push_str(&match done {
            Some(p) => format!(
                "  {:<24} unavailable {:>6} ms  healthy; restarted because {}\n",
                c.pod, p.unavailable_ms, c.reason
            ),
            None if r.platform == "none" && !r.renew.dry_run => {
                let stem = c.pod.strip_suffix(".yaml").unwrap_or(&c.pod);
                let how = crate::restart::manual_restart(&crate::restart::Platform::None, stem);
                format!("NOTE: {}: restart it: {how}\n", c.reason)
            }
            None => format!("NOTE: {}: restart it\n", c.reason),
        });
    }
    for e in &r.pod_errors {
        out.push_str(&format!("NOT RESTARTED: {e}\n"));
    }
    if !r.owed_pods.is_empty() {
        out.push_str(&format!(
            "Owed to the next pass, which restarts them again: {}\n",
            r.owed_pods.join(", ")
        ));
    }
    if let Some(i) = &r.import {
        out.push_str(&format!(
            "Installed the apiserver-etcd-client pair published through etcd ({} files, backup {}); kube-apiserver: {}\n",
            i.files.len(),
            i.backup_id,
            if i.rolled_back.is_some() {
                "ROLLED BACK"
            } else if i.restarted.is_empty() {
                "restart put off"
            } else {
                "restarted and verified"
            }
        ));
    }
    out
}

/// The versions decided by, and the components reloaded live.
fn reloads_text(r: &RunReport) -> String {
    let mut out = String::new();
    if !r.versions.is_empty() {
        let list: Vec<String> = r
            .versions
            .iter()
            .map(|v| match &v.origin {
                crate::restart::reload::Origin::ImageTag(image) => {
                    format!("{} {} ({image})", v.component.name(), v.version)
                }
                crate::restart::reload::Origin::Flag => {
                    format!("{} {} (flag)", v.component.name(), v.version)
                }
            })
            .collect();
        out.push_str(&format!("Versions: {}\n", list.join(", ")));
    }
    for x in &r.reloaded {
        out.push_str(&format!(
            "  {:<24} reloaded live in {:.1} s, not restarted{}\n",
            x.component.name(),
            x.reloaded_after_ms as f64 / 1000.0,
            x.served_sha256
                .as_deref()
                .map(|s| format!("; serves sha256 {s}"))
                .unwrap_or_default()
        ));
    }
    for n in &r.reload_notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

/// The components restarted, and the rollback if verification failed.
fn component_restarts_text(r: &RunReport) -> String {
    let mut out = String::new();
    if !r.restarted.is_empty() || r.rolled_back.is_some() {
        out.push_str(&format!(
            "Restarted one at a time on platform {}:\n",
            r.platform
        ));
    }
    for x in &r.restarted {
        out.push_str(&format!(
            "  {:<24} unavailable {:>6} ms  {}; restarted because {}\n",
            x.component.name(),
            x.unavailable_ms,
            x.served_sha256
                .as_deref()
                .map(|s| format!("serves sha256 {s}"))
                .unwrap_or_else(|| "healthy".into()),
            x.reason
        ));
        if let Some(text) = x.api.describe() {
            out.push_str(&format!("  {:<24} {text}\n", ""));
        }
    }
    if let Some(rb) = &r.rolled_back {
        out.push_str(&format!("VERIFICATION FAILED: {}\n", rb.failure));
        out.push_str(&format!(
            "Restored backup {} and restarted:\n",
            rb.backup_id
        ));
        for x in &rb.restarted {
            out.push_str(&format!(
                "  {:<24} unavailable {:>6} ms  previous certificate served{}\n",
                x.component.name(),
                x.unavailable_ms,
                if x.reason.contains("not restarted") {
                    " (its stop had not taken effect: verified, not restarted)"
                } else {
                    ""
                }
            ));
        }
        if let Some(e) = &rb.error {
            out.push_str(&format!("ROLLBACK INCOMPLETE: {e}\n"));
        }
    } else {
        out.push_str(&format!("All verified in {} ms.\n", r.duration_ms));
    }
    out
}

/// What `rollback` restored.
pub fn rollback_text(id: &str, outcome: &Outcome) -> String {
    let mut out = format!(
        "Restored backup {id}: {} file(s). The state before the rollback is backup {}.\n",
        outcome.files.len(),
        outcome.backup_id
    );
    for f in &outcome.files {
        out.push_str(&format!("  {f}\n"));
    }
    out
}

/// The backups, newest first; `dir` is where they are kept (named when there are none).
pub fn backups_table(list: &[BackupInfo], dir: &str) -> String {
    if list.is_empty() {
        return format!("No backups under '{dir}'.\n");
    }
    let mut out = format!(
        "{:<22} {:<22} {:<10} {:<6} STATUS\n",
        "ID", "CREATED", "KIND", "FILES"
    );
    for b in list {
        out.push_str(&format!(
            "{:<22} {:<22} {:<10} {:<6} {}\n",
            b.id,
            b.created_at.as_deref().unwrap_or("?"),
            b.kind.as_deref().unwrap_or("?"),
            b.files.len(),
            b.status
        ));
    }
    for b in list {
        if let Some(problem) = &b.problem {
            out.push_str(&format!("\nDAMAGED {}: {problem}\n", b.id));
        } else if let Some(note) = &b.note {
            out.push_str(&format!("\nnote {}: {note}\n", b.id));
        }
    }
    out
}

/// What `etcd-client import` did.
pub fn import_text(report: &ImportReport) -> String {
    let mut out = format!(
        "Installed the apiserver-etcd-client pair (backup {}):\n",
        report.backup_id
    );
    for f in &report.files {
        out.push_str(&format!("  {f}\n"));
    }
    if report.platform == "none" {
        out.push_str(
            "Platform none: restart kube-apiserver so that it uses the new etcd client certificate.\n",
        );
    }
    for r in &report.restarted {
        out.push_str(&format!(
            "Restarted {} (unavailable {} ms), verified.\n",
            r.component.name(),
            r.unavailable_ms
        ));
    }
    if let Some(rb) = &report.rolled_back {
        out.push_str(&format!("VERIFICATION FAILED: {}\n", rb.failure));
        out.push_str(&format!(
            "Restored backup {}{}\n",
            rb.backup_id,
            rb.error
                .as_deref()
                .map(|e| format!("; ROLLBACK INCOMPLETE: {e}"))
                .unwrap_or_default()
        ));
    }
    out
}

/// The cluster part of a pass: the lock, the gates, what was waited for.
pub fn cluster_table(c: &crate::cluster::ClusterReport) -> String {
    let mut out = format!(
        "Cluster: node {}, lock {} after {} ms (etcd {})\n",
        c.node,
        c.lock,
        c.waited_ms,
        c.endpoints.join(",")
    );
    if let Some(e) = &c.error {
        out.push_str(&format!("  error: {e}\n"));
    }
    for g in &c.gates {
        out.push_str(&format!(
            "  gate {:<24} {:<6} {}\n",
            g.name,
            if g.passed { "passed" } else { "FAILED" },
            g.detail
        ));
    }
    for w in &c.waited_for {
        out.push_str(&format!("  waited for: {w}\n"));
    }
    for r in &c.roles {
        let holder = r.holder.as_deref().unwrap_or("none");
        let mine = if r.this_node { " (this node)" } else { "" };
        out.push_str(&format!("  lease {} held by {holder}{mine}\n", r.lease));
        if let Some(e) = &r.error {
            out.push_str(&format!("    {e}\n"));
        }
    }
    if let Some(l) = &c.leaders_last {
        out.push_str(&format!(
            "  leaders last: restarted {} after the others ({} ms{})\n",
            l.held.join(", "),
            l.waited_ms,
            if l.bound_reached {
                ", --leader-wait reached: proceeded"
            } else {
                ""
            }
        ));
        for w in &l.waited_for {
            out.push_str(&format!("    waited for: {w}\n"));
        }
    }
    if let Some(p) = &c.pair {
        out.push_str(&format!("  apiserver-etcd-client: {p}\n"));
    }
    if let Some(p) = &c.pair_error {
        out.push_str(&format!("  REFUSED: {p}\n"));
    }
    if c.lock_lost {
        out.push_str("  LOCK LOST while restarting (the lease expired)\n");
    }
    out
}

// === status (issue 12.3) ===

/// `certrotor status`: the last pass, what comes next, what is owed, the locks, the backups.
pub fn status_table(r: &crate::output::status::StatusReport) -> String {
    let mut out = format!("Node root '{}' at {}\n\n", r.root, r.generated_at);
    let mut rows = Fields::default();
    last_pass_fields(&mut rows, r.last_pass.as_ref());
    if let Some(n) = &r.next_pass_at {
        rows.field("NEXT PASS", format!("around {n} (daemon interval, ±10%)"));
    }
    next_due_fields(&mut rows, r.next_due.as_ref());
    rows.field("OWED RESTARTS", {
        let owed: Vec<&str> = (r.owed_restarts.components.iter())
            .chain(r.owed_restarts.pods.iter())
            .map(String::as_str)
            .collect();
        if owed.is_empty() {
            "none".into()
        } else {
            owed.join(", ")
        }
    });
    rows.field(
        "LOCK",
        if r.lock.held {
            format!(
                "held by {} ({})",
                r.lock.holder.as_deref().unwrap_or("?"),
                r.lock.path
            )
        } else {
            format!("free ({})", r.lock.path)
        },
    );
    if let Some(c) = &r.cluster_lock {
        rows.field(
            "CLUSTER LOCK",
            match (&c.holder, &c.error) {
                (Some(h), _) => format!("held by {h}"),
                (None, None) => "free".into(),
                (None, Some(e)) => e.clone(),
            },
        );
    }
    out.push_str(&align(&rows.0));
    out.push_str("\nBACKUPS\n");
    let dir = format!("{}/var/lib/certrotor/backups", r.root.trim_end_matches('/'));
    out.push_str(&backups_table(&r.backups, &dir));
    out
}

/// The two columns of the status table.
#[derive(Default)]
struct Fields(Vec<Vec<String>>);

impl Fields {
    fn field(&mut self, k: &str, v: String) {
        self.0.push(vec![k.to_string(), v]);
    }
}

/// The status table's LAST PASS and its details.
fn last_pass_fields(rows: &mut Fields, last: Option<&crate::pass::record::LastPass>) {
    let Some(p) = last else {
        rows.field(
            "LAST PASS",
            "none recorded yet ('run --once' or 'daemon' records one)".into(),
        );
        return;
    };
    rows.field(
        "LAST PASS",
        format!(
            "{} ({}), {} to {}",
            p.result, p.command, p.started_at, p.finished_at
        ),
    );
    rows.field("  exit code", p.exit_code.to_string());
    if !p.renewed.is_empty() {
        rows.field(
            "  renewed",
            format!(
                "{} (until {})",
                p.renewed.join(", "),
                p.new_not_after.as_deref().unwrap_or("?")
            ),
        );
    }
    if let Some(b) = &p.backup_id {
        rows.field("  backup", b.clone());
    }
    if !p.restarted.is_empty() {
        rows.field("  restarted", p.restarted.join(", "));
    }
    if let Some(reason) = &p.rollback_reason {
        rows.field("  rolled back", reason.clone());
    }
    if let Some(e) = &p.error {
        rows.field("  error", e.clone());
    }
}

/// The status table's NEXT DUE and NEXT RENEWAL.
fn next_due_fields(rows: &mut Fields, next: Option<&crate::output::status::NextDue>) {
    let Some(d) = next else {
        rows.field("NEXT DUE", "no renewable certificate found".into());
        return;
    };
    rows.field(
        "NEXT DUE",
        format!(
            "{} expires {} ({})",
            d.name,
            d.not_after,
            d.residual_seconds.map(human_duration).unwrap_or_default()
        ),
    );
    rows.field(
        "NEXT RENEWAL",
        format!(
            "first pass from {} (within {}, from {})",
            d.renewal_at,
            crate::sys::clock::format_duration(d.within_seconds),
            d.within_from
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::manifests::{Component, Version};
    use crate::restart::reload::{ComponentVersion, Origin};

    /// A live pass's table names the versions it decided by and prints the reload notes.
    #[test]
    fn the_run_table_shows_versions_and_reload_notes() {
        let report = RunReport {
            renew: crate::pass::ops::RenewReport::empty(std::path::Path::new("/"), false),
            platform: "kubeadm".into(),
            components: vec![Component::KubeApiserver],
            reloaded: vec![crate::restart::Reloaded {
                component: Component::KubeApiserver,
                pod: "kube-apiserver.yaml".into(),
                reloaded_after_ms: 41_000,
                served_sha256: None,
            }],
            restarted: Vec::new(),
            versions: vec![
                ComponentVersion {
                    component: Component::KubeApiserver,
                    version: Version::new(1, 20, 2),
                    origin: Origin::ImageTag("k8s.gcr.io/kube-apiserver:v1.20.2".into()),
                },
                ComponentVersion {
                    component: Component::Etcd,
                    version: Version::new(3, 5, 16),
                    origin: Origin::Flag,
                },
            ],
            reload_notes: vec!["front-proxy-client: taken within 60 s".into()],
            other_consumers: Vec::new(),
            restarted_pods: Vec::new(),
            pod_errors: Vec::new(),
            owed_pods: Vec::new(),
            rolled_back: None,
            discarded_transactions: Vec::new(),
            re_enabled: Vec::new(),
            left_disabled: Vec::new(),
            api: Default::default(),
            cluster: None,
            import: None,
            duration_ms: 5,
        };
        let text = run_table(&report);
        assert!(
            text.contains(
                "Versions: kube-apiserver 1.20.2 (k8s.gcr.io/kube-apiserver:v1.20.2), \
                 etcd 3.5.16 (flag)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("reloaded live in 41.0 s, not restarted"),
            "{text}"
        );
        assert!(
            text.contains("  note: front-proxy-client: taken within 60 s\n"),
            "{text}"
        );
        assert!(!text.contains("Restarted one at a time"), "{text}");
    }
}
