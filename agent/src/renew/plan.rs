//! Planning: what is due and why, what is skipped and why, from the inventory, the policy and
//! `now` alone (no files, no clock).

use super::*;
use crate::node::catalog::{Entry, Kind};
use crate::node::inventory::{Inventory, Record, Status};
use crate::sys::clock;

/// Decides what to renew. Pure: reads only the inventory, the policy and `now`.
pub fn plan(inv: &Inventory, policy: &Policy, now: i64) -> Result<Plan, PlanError> {
    if inv.layouts.is_empty() {
        return Err(PlanError(format!(
            "no kubeadm or etcdadm PKI found under '{}'; give the node's root with --root",
            inv.root
        )));
    }
    check_names(inv, policy)?;
    let window = Window {
        now,
        not_before: now - BACKDATE,
        not_after: now + policy.validity,
    };
    let mut items = Vec::new();
    let mut skipped = Vec::new();
    let mut problems = Vec::new();
    for (entry, record) in inv.entries.iter().zip(&inv.certificates) {
        match decide(inv, policy, &window, entry, record) {
            Decision::Renew(item) => items.push(*item),
            Decision::Skip(skip) => skipped.push(skip),
            Decision::Problem(problem) => problems.push(problem),
            Decision::Leave => {}
        }
    }
    if !problems.is_empty() {
        return Err(PlanError(format!(
            "cannot renew; nothing was changed:\n  {}",
            problems.join("\n  ")
        )));
    }
    Ok(Plan {
        items,
        skipped,
        not_before: clock::rfc3339(window.not_before),
        not_after: clock::rfc3339(window.not_after),
        not_before_unix: window.not_before,
        not_after_unix: window.not_after,
        reuse_keys: policy.reuse_keys,
    })
}

/// The clock and the new validity of one plan.
struct Window {
    now: i64,
    not_before: i64,
    not_after: i64,
}

/// What [`plan`] does with one catalog entry.
enum Decision {
    Renew(Box<Item>),
    Skip(Skip),
    Problem(String),
    /// Not renewable, not selected, or a missing optional file: not mentioned.
    Leave,
}

fn skip(entry: &Entry, why: impl Into<String>) -> Decision {
    Decision::Skip(Skip {
        name: entry.name.clone(),
        why: why.into(),
    })
}

/// Refuses a `--cert` name that is not in the catalog or cannot be renewed.
fn check_names(inv: &Inventory, policy: &Policy) -> Result<(), PlanError> {
    for name in &policy.names {
        // The kubelet's files are planned by `kubelet::plan`.
        if [crate::node::kubelet::CLIENT, crate::node::kubelet::SERVING].contains(&name.as_str())
            && inv.entries.iter().any(|e| &e.name == name)
        {
            continue;
        }
        match inv.entries.iter().position(|e| &e.name == name) {
            None => {
                let known: Vec<&str> = inv
                    .entries
                    .iter()
                    .filter(|e| e.renewable)
                    .map(|e| e.name.as_str())
                    .collect();
                return Err(PlanError(format!(
                    "--cert '{name}': no such certificate; renewable names: {}",
                    known.join(", ")
                )));
            }
            Some(i) if inv.entries[i].renewable && !inv.certificates[i].renewable => {
                return Err(PlanError(format!(
                    "--cert '{name}' cannot be renewed: {}",
                    inv.certificates[i].warnings.join("; ")
                )));
            }
            Some(i) if !inv.entries[i].renewable => {
                let why = match inv.entries[i].kind {
                    Kind::Ca => "it is a CA; certrotor never renews CAs",
                    Kind::Other => "it is not a kubeadm or etcdadm certificate",
                    _ => "the kubelet rotates its own client certificate",
                };
                return Err(PlanError(format!(
                    "--cert '{name}' cannot be renewed: {why}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// One catalog entry: renewed (and why), skipped, refused, or left out.
fn decide(
    inv: &Inventory,
    policy: &Policy,
    window: &Window,
    entry: &Entry,
    record: &Record,
) -> Decision {
    if !entry.renewable {
        return Decision::Leave;
    }
    if !record.renewable {
        return skip(entry, record.warnings.join("; "));
    }
    let reason = match reason(policy, entry, record) {
        Ok(reason) => reason,
        Err(decision) => return decision,
    };
    if record.status == Status::Missing {
        return Decision::Problem(format!("{}: '{}' does not exist", entry.name, entry.path));
    }
    // A pair whose key does not match its certificate is what `check` advises renewing by
    // name: the certificate keeps its identity and gets a new key.
    let mismatched_pair = reason == Reason::Named
        && !policy.reuse_keys
        && record.key_matches == Some(false)
        && record.chain_ok == Some(true);
    if record.status == Status::Invalid && !mismatched_pair {
        return Decision::Problem(format!(
            "{}: {}",
            entry.name,
            record.error.as_deref().unwrap_or("invalid")
        ));
    }
    let Some(ca_name) = &entry.ca else {
        return Decision::Leave;
    };
    let Some(ca_index) = inv.entries.iter().position(|e| &e.name == ca_name) else {
        return Decision::Problem(format!(
            "{}: its CA '{ca_name}' is not in the catalog",
            entry.name
        ));
    };
    let ca_entry = &inv.entries[ca_index];
    let ca_record = &inv.certificates[ca_index];
    if ca_record.externally_managed || ca_record.status == Status::Missing {
        let why = format!("externally managed: the key of CA '{ca_name}' is not on this node");
        if reason == Reason::Named {
            return Decision::Problem(format!(
                "{}: {why}; renew it where the CA key is (e.g. the etcd node) and import it",
                entry.name
            ));
        }
        return skip(entry, why);
    }
    if let Some(problem) = signer_problem(policy, window, entry, ca_name, ca_record) {
        return Decision::Problem(problem);
    }
    Decision::Renew(Box::new(Item {
        name: entry.name.clone(),
        kind: entry.kind,
        path: entry.path.clone(),
        key_path: entry.key_path.clone(),
        signer: ca_name.clone(),
        signer_cert_path: ca_entry.path.clone(),
        signer_key_path: ca_entry.key_path.clone().unwrap_or_default(),
        reason,
        residual_seconds: record.residual_seconds,
        flavor: entry.flavor,
        description: entry.description.to_string(),
    }))
}

/// Why a renewable entry is selected, or what to do with it instead.
fn reason(policy: &Policy, entry: &Entry, record: &Record) -> Result<Reason, Decision> {
    if !policy.names.is_empty() {
        if !policy.names.contains(&entry.name) {
            return Err(Decision::Leave);
        }
        Ok(Reason::Named)
    } else if record.status == Status::Missing {
        if entry.required {
            return Err(skip(entry, "missing"));
        }
        Err(Decision::Leave)
    } else if record.status == Status::Expired {
        Ok(Reason::Expired)
    } else if policy.all {
        Ok(Reason::All)
    } else {
        match record.residual_seconds {
            Some(r) if r < policy.within => Ok(Reason::Due),
            Some(r) => Err(skip(
                entry,
                format!("valid for {}", clock::human_duration(r)),
            )),
            // Unreadable: its expiry is unknown, so it cannot be skipped silently.
            None => Ok(Reason::Due),
        }
    }
}

/// Why the entry's CA cannot sign it now: invalid, not yet valid by the clock, expired, or
/// ending before the new notAfter (unless allowed).
fn signer_problem(
    policy: &Policy,
    window: &Window,
    entry: &Entry,
    ca_name: &str,
    ca_record: &Record,
) -> Option<String> {
    if ca_record.status == Status::Invalid {
        return Some(format!(
            "{}: its CA '{ca_name}' is invalid: {}",
            entry.name,
            ca_record.error.as_deref().unwrap_or("?")
        ));
    }
    let ca_nb = ca_record
        .not_before
        .as_deref()
        .and_then(clock::parse_rfc3339)?;
    let ca_na = ca_record.not_after_unix?;
    let (now, not_after) = (window.now, window.not_after);
    if now < ca_nb {
        return Some(format!(
            "{}: the system clock ({}) is earlier than CA '{ca_name}' notBefore ({}); fix the clock first",
            entry.name,
            clock::rfc3339(now),
            clock::rfc3339(ca_nb)
        ));
    }
    if now >= ca_na {
        return Some(format!(
            "{}: its CA '{ca_name}' expired on {}: certificates issued under it are \
             rejected by every verifier, so certrotor refuses to issue them (even with \
             --allow-beyond-ca); the CA must be rotated first (kubeadm: \
             https://kubernetes.io/docs/tasks/tls/manual-rotation-of-ca-certificates/)",
            entry.name,
            clock::rfc3339(ca_na)
        ));
    }
    if not_after > ca_na && !policy.allow_beyond_ca {
        return Some(format!(
            "{}: the new notAfter {} would pass CA '{ca_name}' notAfter {}; shorten --validity, \
             rotate the CA, or pass --allow-beyond-ca",
            entry.name,
            clock::rfc3339(not_after),
            clock::rfc3339(ca_na)
        ));
    }
    None
}
