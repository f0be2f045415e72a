//! Renewal of the kubelet's own certificates (the files are described in
//! [`crate::node::kubelet`]): [`plan`] decides, from the inventory, whether the client pair is
//! reissued from the cluster CA (only where its key is on the node) or the expired serving pair
//! removed, and [`changes`] turns that plan into the renew transaction's changes, as client-go's
//! certificate store writes them (a new dated file and the `kubelet-client-current.pem` link).

use std::path::Path;

use serde::Serialize;

use crate::node::catalog::{self, Entry};
use crate::node::inventory::{Inventory, Status};
use crate::node::kubelet::{CLIENT, CLIENT_CURRENT, PKI_DIR, SERVING, dated_name};
use crate::pki::{self, Cert, Issuance, PrivateKey, Profile, SanOrder, Signer};
use crate::renew::{Policy, Reason};
use crate::sys::clock;
use crate::txn::{Change, SYMLINK};

/// What renewal does for the kubelet.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    /// The client certificate to reissue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientAction>,
    /// The expired serving pair to remove.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingAction>,
    /// Due but not done, and what to do instead.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.client.is_none() && self.serving.is_none()
    }
}

/// Reissue of the client certificate.
#[derive(Debug, Clone, Serialize)]
pub struct ClientAction {
    pub node_name: String,
    pub reason: Reason,
    pub residual_seconds: Option<i64>,
    pub signer: String,
    #[serde(skip)]
    pub signer_cert_path: String,
    #[serde(skip)]
    pub signer_key_path: String,
    pub key_algorithm: String,
    /// `--reuse-keys`: the current key is kept (the kubelet's own rotation makes a new one).
    pub reuse_key: bool,
    pub not_before: String,
    pub not_after: String,
    #[serde(skip)]
    pub not_before_unix: i64,
    #[serde(skip)]
    pub not_after_unix: i64,
    /// The link and (once written) the new dated file.
    pub link: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_file: Option<String>,
}

/// Removal of the expired self-signed serving pair.
#[derive(Debug, Clone, Serialize)]
pub struct ServingAction {
    pub cert: String,
    pub key: String,
    pub expired_on: String,
}

/// Decides what to do for the kubelet. Pure: the inventory, the policy and `now`.
pub fn plan(inv: &Inventory, policy: &Policy, now: i64) -> Plan {
    let mut out = Plan::default();
    let find = |name: &str| {
        inv.entries
            .iter()
            .position(|e| e.name == name)
            .map(|i| (&inv.entries[i], &inv.certificates[i]))
    };
    let selected = |name: &str, status: Status, residual: Option<i64>| -> Option<Reason> {
        if !policy.names.is_empty() {
            return policy
                .names
                .iter()
                .any(|n| n == name)
                .then_some(Reason::Named);
        }
        match status {
            Status::Missing => None,
            Status::Expired => Some(Reason::Expired),
            _ if policy.all => Some(Reason::All),
            _ => residual.filter(|r| *r < policy.within).map(|_| Reason::Due),
        }
    };
    if let Some((entry, record)) = find(CLIENT)
        && let Some(reason) = selected(CLIENT, record.status, record.residual_seconds)
    {
        match client_action(inv, entry, record, reason, policy, now) {
            Ok(a) => out.client = Some(a),
            Err(why) => out.refused.push(format!("{CLIENT}: {why}")),
        }
    }
    if let Some((entry, record)) = find(SERVING)
        && record.status != Status::Missing
        && let Some(reason) = selected(SERVING, record.status, record.residual_seconds)
    {
        // Only an expired pair is removed (the kubelet regenerates it only when absent); one
        // that is merely due keeps serving until it expires.
        if record.status == Status::Expired || reason == Reason::Named {
            out.serving = Some(ServingAction {
                cert: entry.path.clone(),
                key: entry.key_path.clone().unwrap_or_default(),
                expired_on: record.not_after.clone().unwrap_or_default(),
            });
        }
    }
    out
}

fn client_action(
    inv: &Inventory,
    entry: &Entry,
    record: &crate::node::inventory::Record,
    reason: Reason,
    policy: &Policy,
    now: i64,
) -> Result<ClientAction, String> {
    let subject = record.subject.as_deref().unwrap_or("");
    let node_name = subject
        .split(',')
        .map(str::trim)
        .find_map(|p| p.strip_prefix("CN=system:node:"))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            format!(
                "'{}' cannot be read as a kubelet client certificate (subject '{subject}'{}): \
                 the node name comes from its CN=system:node:<name>",
                entry.path,
                record
                    .error
                    .as_deref()
                    .map(|e| format!(", {e}"))
                    .unwrap_or_default()
            )
        })?
        .to_string();
    let ca_name = entry
        .ca
        .clone()
        .unwrap_or_else(|| catalog::names::CA.into());
    let i = inv
        .entries
        .iter()
        .position(|e| e.name == ca_name)
        .ok_or_else(|| format!("its CA '{ca_name}' is not in the catalog"))?;
    let (ca_entry, ca_record) = (&inv.entries[i], &inv.certificates[i]);
    if ca_record.externally_managed || ca_record.status == Status::Missing {
        return Err(format!(
            "the cluster CA key '{}' is not on this node, so certrotor cannot issue the \
             kubelet's client certificate here (it never copies admin.conf's credentials: the \
             kubelet would run as cluster admin). Run certrotor on a control-plane node for its \
             own kubelet; for this node, while its certificate is still valid turn on client \
             rotation (kubelet 'rotateCertificates: true'), else join it again with a bootstrap \
             token ('kubeadm token create', kubelet '--bootstrap-kubeconfig') so that it gets a \
             new certificate through a CSR",
            ca_entry.key_path.as_deref().unwrap_or("?")
        ));
    }
    if ca_record.status == Status::Invalid {
        return Err(format!(
            "its CA '{ca_name}' is invalid: {}",
            ca_record.error.as_deref().unwrap_or("?")
        ));
    }
    let ca_not_after = ca_record
        .not_after_unix
        .ok_or_else(|| format!("its CA '{ca_name}' has no readable expiry"))?;
    if now >= ca_not_after {
        return Err(format!(
            "its CA '{ca_name}' expired on {}: the CA must be rotated first",
            clock::rfc3339(ca_not_after)
        ));
    }
    // The signer's policy: backdate 5 minutes, the signing duration minus the backdate, never
    // past the CA.
    let not_before = now - crate::renew::BACKDATE;
    let not_after = (now + policy.validity - crate::renew::BACKDATE).min(ca_not_after);
    Ok(ClientAction {
        node_name,
        reason,
        residual_seconds: record.residual_seconds,
        signer: ca_name,
        signer_cert_path: ca_entry.path.clone(),
        signer_key_path: ca_entry.key_path.clone().unwrap_or_default(),
        key_algorithm: record.public_key.clone().unwrap_or_default(),
        reuse_key: policy.reuse_keys,
        not_before: clock::rfc3339(not_before),
        not_after: clock::rfc3339(not_after),
        not_before_unix: not_before,
        not_after_unix: not_after,
        link: CLIENT_CURRENT.into(),
        new_file: None,
    })
}

/// The profile the kube-controller-manager's kubelet client signer gives the kubelet's CSR.
pub fn client_profile(node_name: &str) -> Result<Profile, pki::PkiError> {
    Ok(Profile {
        subject: pki::kubeadm_subject(&format!("system:node:{node_name}"), &["system:nodes"])?,
        dns_names: vec![],
        ip_addresses: vec![],
        other_sans: vec![],
        san_order: SanOrder::Kubeadm,
        key_usage: pki::leaf_key_usage(),
        ext_key_usage: vec![pki::oid::CLIENT_AUTH],
        basic_constraints: Some(false),
        subject_key_id: false,
    })
}

fn read(root: &Path, rel: &str) -> Result<Vec<u8>, String> {
    crate::sys::fsutil::read_in_root(root, rel, pki::MAX_PEM_FILE_BYTES)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("'{rel}' does not exist"))
}

/// Issues what `plan` says and returns the transaction's changes (the new dated file, the link,
/// the removed serving pair). Validates the new certificate (signed by the CA, key matches,
/// subject and usages) before returning. Writes nothing.
pub fn changes(root: &Path, plan: &mut Plan, now: i64) -> Result<Vec<Change>, String> {
    let mut out = Vec::new();
    if let Some(a) = plan.client.as_mut() {
        out.extend(client_changes(root, a, now)?);
    }
    if let Some(s) = &plan.serving {
        for rel in [&s.cert, &s.key] {
            out.push(Change {
                rel: rel.clone(),
                content: None,
                mode_if_new: 0o600,
            });
        }
    }
    Ok(out)
}

/// Reissues the kubelet's client certificate: the new dated file and the link to it, in that
/// order; records the new file in `a`.
fn client_changes(root: &Path, a: &mut ClientAction, now: i64) -> Result<Vec<Change>, String> {
    let ctx = |e: &dyn std::fmt::Display| format!("{CLIENT}: {e}");
    let ca = Cert::from_pem(&read(root, &a.signer_cert_path)?).map_err(|e| ctx(&e))?;
    let mut ca_key_pem = read(root, &a.signer_key_path)?;
    let ca_key = PrivateKey::from_pem(&ca_key_pem);
    ca_key_pem.iter_mut().for_each(|b| *b = 0);
    let ca_key = ca_key.map_err(|e| ctx(&e))?;
    if !ca_key.matches(&ca) {
        return Err(ctx(&format!(
            "CA key '{}' does not match '{}'",
            a.signer_key_path, a.signer_cert_path
        )));
    }
    // The current pair: its key type is kept (a new key, as each kubelet rotation makes,
    // unless `--reuse-keys` keeps the key itself).
    let mut current = read(root, CLIENT_CURRENT)?;
    let old_key = PrivateKey::from_pem(&current);
    current.iter_mut().for_each(|b| *b = 0);
    let old_key = old_key.map_err(|e| ctx(&format!("current key: {e}")))?;
    let generated;
    let key = if a.reuse_key {
        &old_key
    } else {
        generated = PrivateKey::generate(old_key.algorithm()).map_err(|e| ctx(&e))?;
        &generated
    };
    let profile = client_profile(&a.node_name).map_err(|e| ctx(&e))?;
    let cert = pki::issue(
        &profile,
        &key.spki().map_err(|e| ctx(&e))?,
        Some(&Signer {
            cert: &ca,
            key: &ca_key,
        }),
        key,
        Issuance {
            serial: pki::random_serial().map_err(|e| ctx(&e))?,
            not_before: a.not_before_unix,
            not_after: a.not_after_unix,
        },
    )
    .map_err(|e| ctx(&e))?;
    cert.verify_signed_by(&ca, &a.signer).map_err(|e| ctx(&e))?;
    if !key.matches(&cert) {
        return Err(ctx(&"the new key does not match the new certificate"));
    }
    let name = free_dated_name(root, now).map_err(|e| ctx(&e))?;
    let mut bundle = cert.to_pem().map_err(|e| ctx(&e))?.into_bytes();
    let key_pem = key.to_pem(old_key.encoding).map_err(|e| ctx(&e))?;
    bundle.extend_from_slice(key_pem.0.as_bytes());
    drop(key_pem);
    let rel = format!("{PKI_DIR}/{name}");
    a.new_file = Some(rel.clone());
    Ok(vec![
        Change {
            rel: rel.clone(),
            content: Some(bundle),
            mode_if_new: 0o600,
        },
        // After the file (the transaction renames in order): the link never dangles.
        Change {
            rel: CLIENT_CURRENT.into(),
            content: Some(format!("/{rel}").into_bytes()),
            mode_if_new: SYMLINK,
        },
    ])
}

/// A dated file name not taken yet, from `now` on (the kubelet's names have one-second
/// resolution).
fn free_dated_name(root: &Path, now: i64) -> Result<String, &'static str> {
    let mut stamp = now;
    loop {
        let name = dated_name(stamp);
        let rel = format!("{PKI_DIR}/{name}");
        if std::fs::symlink_metadata(root.join(&rel)).is_err() {
            return Ok(name);
        }
        stamp += 1;
        if stamp > now + 120 {
            return Err("no free dated file name in the next two minutes");
        }
    }
}

/// The plan's lines for `renew` and `run`.
pub fn plan_text(plan: &Plan, dry_run: bool) -> String {
    let mut out = String::new();
    if let Some(a) = &plan.client {
        out.push_str(&format!(
            "{} {CLIENT} ({}) for system:node:{} from CA '{}', valid {} .. {}, {} {} key{}\n",
            if dry_run { "Would reissue" } else { "Reissued" },
            a.reason,
            a.node_name,
            a.signer,
            a.not_before,
            a.not_after,
            if a.reuse_key { "keeping its" } else { "new" },
            a.key_algorithm,
            a.new_file
                .as_deref()
                .map(|f| format!(": {f}, linked as {}", a.link))
                .unwrap_or_default()
        ));
    }
    if let Some(s) = &plan.serving {
        out.push_str(&format!(
            "{} the expired {SERVING} pair {} (expired {}); the kubelet makes a new self-signed \
             one at its next start\n",
            if dry_run { "Would remove" } else { "Removed" },
            s.cert,
            s.expired_on
        ));
    }
    for r in &plan.refused {
        out.push_str(&format!("  not renewed {r}\n"));
    }
    out
}
