//! Printing the inventory: a table in the manner of `kubeadm certs check-expiration`, or JSON.

use crate::catalog::Kind;
use crate::clock::{human_duration, kubeadm_date};
use crate::inventory::{Inventory, Record, Status};

/// The kubeadm-style table: certificates, then CAs, then what is wrong and what to do.
pub fn table(inv: &Inventory) -> String {
    let mut out = String::new();
    if inv.layouts.is_empty() {
        out.push_str(&format!(
            "No kubeadm or etcdadm PKI found under '{}'. Looked for {}.\n\
             Give the node's root with --root.\n",
            inv.root,
            crate::catalog::layout_summary()
        ));
        return out;
    }
    out.push_str(&format!(
        "Node root '{}', layouts: {}\n\n",
        inv.root,
        inv.layouts.join(", ")
    ));
    let mut leaves: Vec<&Record> = inv
        .certificates
        .iter()
        .filter(|r| r.kind != Kind::Ca)
        .collect();
    leaves.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = vec![row(&[
        "CERTIFICATE",
        "EXPIRES",
        "RESIDUAL TIME",
        "CERTIFICATE AUTHORITY",
        "EXTERNALLY MANAGED",
        "STATUS",
    ])];
    for r in &leaves {
        rows.push(cells(r, true));
    }
    out.push_str(&align(&rows));
    out.push('\n');
    let mut cas: Vec<&Record> = inv
        .certificates
        .iter()
        .filter(|r| r.kind == Kind::Ca)
        .collect();
    cas.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = vec![row(&[
        "CERTIFICATE AUTHORITY",
        "EXPIRES",
        "RESIDUAL TIME",
        "EXTERNALLY MANAGED",
        "STATUS",
    ])];
    for r in &cas {
        rows.push(cells(r, false));
    }
    out.push_str(&align(&rows));
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

/// The inventory as pretty JSON.
pub fn json(inv: &Inventory) -> String {
    serde_json::to_string_pretty(inv)
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot serialize: {e}\"}}"))
}
