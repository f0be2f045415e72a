//! The text of `certrotor ca plan` ([`crate::ca::plan`] makes it).

use crate::ca::CaPlan;
use crate::ca::rotate::RotateReport;
use crate::ca::rotation::Rotation;
use crate::output::report::align;
use crate::sys::clock::human_duration;

/// `certrotor ca plan`: the CA, who trusts it, the leaves, the three stages, what is outside.
pub fn ca_plan_text(p: &CaPlan) -> String {
    let mut out = format!(
        "Rotating {} on the node under '{}' (nothing is changed by a plan)\n\n",
        p.ca.name(),
        p.root
    );
    let mut rows = vec![cells(&[
        "CA",
        "FILE",
        "SUBJECT",
        "EXPIRES IN",
        "KEY",
        "SIGNS HERE",
    ])];
    for c in &p.certificates {
        rows.push(vec![
            c.name.clone(),
            c.path.clone(),
            c.subject.clone().unwrap_or_default(),
            c.residual_seconds.map(human_duration).unwrap_or_default(),
            c.public_key.clone().unwrap_or_default(),
            yes_no(c.signer_here),
        ]);
    }
    out.push_str(&align(&rows));
    out.push_str("\nTRUSTED BY\n");
    let mut rows = vec![cells(&[
        "CONSUMER",
        "THROUGH",
        "FILE",
        "HOLDS IT",
        "ON CHANGE",
    ])];
    for t in &p.trust {
        rows.push(vec![
            t.consumer.clone(),
            t.source.clone(),
            t.file.clone().unwrap_or_else(|| "(a setting)".into()),
            yes_no(t.holds_ca),
            if t.reloads { "reloads" } else { "restart" }.into(),
        ]);
    }
    out.push_str(&align(&rows));
    out.push_str(&format!(
        "\nISSUED AGAIN FROM THE NEW CA ({})\n",
        p.leaves.len()
    ));
    for l in &p.leaves {
        let whose = if l.renewable {
            ""
        } else {
            " (not renewed by certrotor today)"
        };
        out.push_str(&format!("  {}  {}{whose}\n", l.name, l.path));
    }
    out.push_str(
        "\nSTAGES (no stage starts on any node before every node finished the one before)\n",
    );
    for s in &p.stages {
        out.push_str(&format!("  {}: {}\n", s.stage, s.changes));
        out.push_str(&format!("    reloads:  {}\n", list(&s.reloads)));
        out.push_str(&format!("    restarts: {}\n", list(&s.restarts)));
    }
    out.push_str("\nOUTSIDE THIS NODE (certrotor does not reach it from here)\n");
    for o in &p.outside {
        out.push_str(&format!("  - {o}\n"));
    }
    if !p.notes.is_empty() {
        out.push_str("\nNOTES\n");
        for n in &p.notes {
            out.push_str(&format!("  - {n}\n"));
        }
    }
    out
}

fn cells(headers: &[&str]) -> Vec<String> {
    headers.iter().map(|h| h.to_string()).collect()
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// `certrotor ca rotate|continue|abort`: the stages done now, where the rotation stands, what
/// is asked next.
pub fn ca_rotate_text(r: &RotateReport) -> String {
    let mut out = format!(
        "Rotation of {}: stage {}\n  old CA SHA-256 {}\n  new CA SHA-256 {}\n",
        r.ca.name(),
        r.stage,
        r.old_sha256,
        if r.new_sha256.is_empty() {
            "-"
        } else {
            &r.new_sha256
        }
    );
    if !r.stages.is_empty() {
        let mut rows = vec![cells(&[
            "STAGE",
            "BACKUP",
            "FILES",
            "RENEWED",
            "RESTARTED",
            "RELOADED",
        ])];
        for s in &r.stages {
            rows.push(vec![
                s.stage.to_string(),
                s.backup_id.clone().unwrap_or_else(|| "-".into()),
                list(&s.files),
                list(&s.renewed),
                list(&s.restarted),
                list(&s.reloaded),
            ]);
        }
        out.push('\n');
        out.push_str(&align(&rows));
    }
    if !r.old_leaves.is_empty() {
        out.push_str(&format!(
            "\nStill signed by the old CA (certrotor does not renew them): {}\n",
            r.old_leaves.join(", ")
        ));
    }
    if r.stage == "issued" && !r.outside.is_empty() {
        out.push_str("\nOutside this node, still trusting or holding the old CA:\n");
        for o in &r.outside {
            out.push_str(&format!("  - {o}\n"));
        }
    }
    out.push_str(&format!("\n{}\n", r.next));
    out
}

/// `certrotor ca status`.
pub fn ca_status_text(r: &Option<Rotation>) -> String {
    let Some(r) = r else {
        return "No CA rotation is recorded on this node.\n".into();
    };
    let mut out = format!(
        "Rotation of {}: stage {}\n  old CA SHA-256 {}\n  new CA SHA-256 {}\n\n",
        r.ca.name(),
        r.stage.name(),
        r.old_sha256,
        if r.new_sha256.is_empty() {
            "-"
        } else {
            &r.new_sha256
        }
    );
    let mut rows = vec![cells(&["STAGE", "AT"])];
    for h in &r.history {
        rows.push(vec![h.stage.name().to_string(), h.at.clone()]);
    }
    out.push_str(&align(&rows));
    out
}
