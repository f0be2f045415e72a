//! What the commands print: the inventory as a table in the manner of `kubeadm certs
//! check-expiration`, the results of renew, run, rollback, backups and etcd-client import, or any
//! of them as JSON. Pure functions from reports to text; the command line prints them. The
//! text of a `run` pass is in `report/run.rs`, the `status` table in `report/status.rs`.

mod ca;
mod run;
mod status;

pub use ca::{ca_plan_text, ca_rotate_text, ca_status_text};
pub use run::{cluster_table, run_table};
pub use status::status_table;

use crate::node::catalog::Kind;
use crate::node::inventory::{Inventory, Record, Status};
use crate::pass::import::ImportReport;
use crate::pass::ops::RenewReport;
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
