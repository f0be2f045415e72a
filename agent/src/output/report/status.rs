//! The table of `certrotor status` ([`crate::output::status`] gathers what it shows): the last
//! pass, the next one, what is owed, the locks and the backups.

use crate::output::report::{align, backups_table};
use crate::sys::clock::human_duration;

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
    if let Some(c) = &r.ca_rotation {
        let since = c.history.last().map(|h| h.at.as_str()).unwrap_or("?");
        rows.field(
            "CA ROTATION",
            format!(
                "{} at stage {} (since {since})",
                c.ca.name(),
                c.stage.name()
            ),
        );
    }
    if let Some(members) = &r.ca_rotation_members {
        let each: Vec<String> = members
            .iter()
            .map(|m| format!("{} {}", m.member, m.stage.unwrap_or("(not begun)")))
            .collect();
        rows.field("CA ROTATION NODES", each.join(", "));
    }
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
