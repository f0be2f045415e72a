//! Validation: each new certificate proved right before anything live is touched (signed by its
//! CA, key matching, identity equal to the old certificate's, validity window as planned).

use super::*;
use crate::node::catalog::Flavor;
use crate::pki::Cert;
use crate::sys::clock;
use std::net::IpAddr;

/// Proves each new certificate right before anything live is touched: signed by its CA, the key
/// matches, the identity equals the old certificate's, and the validity window is the planned
/// one (native engine) or the one the tool chose (`validity`, kubeadm engine).
pub fn validate_with(
    issued: &[Issued],
    plan: &Plan,
    validity: ValidityCheck,
) -> Result<(), IssueError> {
    let mut problems = Vec::new();
    for i in issued {
        let name = &i.item.name;
        problems.extend(
            problems_of(i, plan, validity)
                .into_iter()
                .map(|what| format!("{name}: {what}")),
        );
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(IssueError(format!(
            "validation failed; nothing was changed:\n  {}",
            problems.join("\n  ")
        )))
    }
}

/// What is wrong with one issued certificate, in the order [`validate_with`] reports it.
fn problems_of(i: &Issued, plan: &Plan, validity: ValidityCheck) -> Vec<String> {
    let mut problems = Vec::new();
    let mut fail = |what: String| problems.push(what);
    match written_cert(i) {
        Some(c) if c.der == i.new.der => {}
        _ => fail("the file written does not hold the new certificate".into()),
    }
    if let Err(e) = i.new.verify_signed_by(&i.ca, &i.item.signer) {
        fail(e.to_string());
    }
    if !i.key.matches(&i.new) {
        fail("the new key does not match the new certificate".into());
    }
    identity_problems(i, &mut fail);
    if i.old.ext_key_usage_oids() != i.new.ext_key_usage_oids() {
        fail("extended key usage changed".into());
    }
    if i.old.key_usage().map(|k| k.0.bits()) != i.new.key_usage().map(|k| k.0.bits())
        && i.old.key_usage().is_some()
    {
        fail("key usage changed".into());
    }
    if i.new.is_ca() {
        fail("the new certificate is a CA".into());
    }
    if let Some(problem) = validity_problem(i, plan, validity) {
        fail(problem);
    }
    if i.old.public_key_algorithm() != i.new.public_key_algorithm() {
        fail(format!(
            "key algorithm changed from {} to {}",
            i.old.public_key_algorithm(),
            i.new.public_key_algorithm()
        ));
    }
    problems
}

/// The certificate in the file written for the item, read back.
fn written_cert(i: &Issued) -> Option<Cert> {
    let carrier = i.item.carrier();
    let (_, bytes, _) = i.files.iter().find(|(p, _, _)| p == carrier.path())?;
    carrier.cert_in(bytes).ok().map(|(cert, _)| cert)
}

/// The subject and SANs, compared with the old certificate's when the identity must be kept
/// (logged when etcdadm issued it as the node is configured).
fn identity_problems(i: &Issued, fail: &mut impl FnMut(String)) {
    let name = &i.item.name;
    let (old_t, new_t) = (&i.old.x509.tbs_certificate, &i.new.x509.tbs_certificate);
    let same_identity = i.identity == IdentityCheck::SameAsOld;
    if i.identity == IdentityCheck::EtcdadmAsNodeConfigured
        && (old_t.subject != new_t.subject || i.old.sans() != i.new.sans())
    {
        log::info!(
            "{name}: etcdadm issued it as the node is configured: subject '{}' SANs {:?} \
             (was '{}' {:?})",
            new_t.subject,
            i.new.sans(),
            old_t.subject,
            i.old.sans()
        );
    }
    if same_identity && old_t.subject != new_t.subject {
        fail(format!(
            "subject changed from '{}' to '{}'",
            old_t.subject, new_t.subject
        ));
    }
    let set = |(d, ip): (Vec<String>, Vec<IpAddr>)| {
        let mut d = d;
        d.sort();
        d.dedup();
        let mut ip: Vec<String> = ip.iter().map(|x| x.to_string()).collect();
        ip.sort();
        ip.dedup();
        (d, ip)
    };
    if same_identity && set(i.old.sans()) != set(i.new.sans()) {
        fail("subject alternative names changed".into());
    }
    if same_identity && i.old.other_sans() != i.new.other_sans() {
        fail("URI, email or other subject alternative names changed".into());
    }
}

/// Whether the validity window is the planned one, or the one the tool chose as it ran.
fn validity_problem(i: &Issued, plan: &Plan, validity: ValidityCheck) -> Option<String> {
    let (nb, na) = (i.new.not_before(), i.new.not_after());
    match validity {
        ValidityCheck::Planned => (nb != plan.not_before_unix || na != plan.not_after_unix)
            .then(|| "validity differs from the plan".into()),
        ValidityCheck::ToolChosen { started, finished } => {
            let wanted = plan.not_after_unix - plan.not_before_unix - BACKDATE;
            // kubeadm >= 1.31 backdates 5 min; kubeadm <= 1.30 (and etcdadm) copy the CA's
            // notBefore (reference/pki-profiles.md §1.4), measured with kubeadm v1.20.2.
            let backdated = i.item.flavor == Flavor::Etcdadm
                || nb >= started - BACKDATE - 2
                || nb == i.ca.not_before();
            (na < started + wanted - 2 || na > finished + wanted + 2 || nb > finished + 1 || !backdated)
                .then(|| {
                    format!(
                        "the tool issued it valid {} .. {} ({} after issue), but --validity asks for {}; \
                         the tool decides the validity: give --validity to match it",
                        clock::rfc3339(nb),
                        clock::rfc3339(na),
                        clock::human_duration(na - started),
                        clock::human_duration(wanted)
                    )
                })
        }
    }
}
