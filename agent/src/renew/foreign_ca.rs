//! A test-only failpoint that breaks a renewal for real: `CERTROTOR_FAILPOINT=foreign-ca:NAME`
//! re-signs the renewed certificate NAME with a throwaway CA that nothing trusts, *after*
//! [`crate::renew::validate_with`] accepted it and before the transaction writes it.
//!
//! The live tests use it on `apiserver-etcd-client`: the real etcd then refuses the real
//! kube-apiserver's client certificate, the apiserver never becomes ready, and certrotor's
//! verification and rollback have to deal with a genuine failure instead of a test double that
//! pretends to reject a certificate. It shares `CERTROTOR_FAILPOINT` with the crash failpoints of
//! [`crate::txn::failpoint`] (a `foreign-ca:` value never matches one of their step names) and,
//! like them, is not documented for operators.
//!
//! The key stays the one validated (so the pair still matches); subject, SANs and usages are
//! kept; only the issuer differs.

use crate::pki::{self, Issuance, PrivateKey, Profile, Signer};
use crate::renew::{self, Issued};

/// The value prefix that selects this failpoint.
pub const PREFIX: &str = "foreign-ca:";

/// Subject CN of the throwaway CA.
pub const FOREIGN_CA_CN: &str = "certrotor-failpoint-foreign-ca";

/// Applies the failpoint to `issued` when `CERTROTOR_FAILPOINT` names one of its certificates.
pub fn apply(issued: &mut [Issued]) -> Result<(), String> {
    let Ok(wanted) = std::env::var("CERTROTOR_FAILPOINT") else {
        return Ok(());
    };
    let Some(name) = wanted.strip_prefix(PREFIX) else {
        return Ok(());
    };
    let Some(target) = issued.iter_mut().find(|i| i.item.name == name) else {
        log::warn!("failpoint {wanted}: '{name}' is not renewed in this run; nothing re-signed");
        return Ok(());
    };
    resign(target).map_err(|e| format!("failpoint {wanted}: {e}"))?;
    eprintln!("CERTROTOR-FAILPOINT {wanted}");
    log::warn!(
        "failpoint {wanted}: '{name}' re-signed by the throwaway CA '{FOREIGN_CA_CN}' after validation"
    );
    Ok(())
}

fn resign(target: &mut Issued) -> Result<(), String> {
    let Some(cert_file) = target.item.carrier().cert_file().map(str::to_string) else {
        return Err("only certificate files can be re-signed".into());
    };
    let e = |e: pki::PkiError| e.to_string();
    let ca_key = PrivateKey::generate(target.key.algorithm()).map_err(e)?;
    let window = |serial| Issuance {
        serial,
        not_before: target.new.not_before(),
        not_after: target.new.not_after(),
    };
    let ca_profile = Profile::ca(pki::kubeadm_subject(FOREIGN_CA_CN, &[]).map_err(e)?, vec![]);
    let ca = pki::issue(
        &ca_profile,
        &ca_key.spki().map_err(e)?,
        None,
        &ca_key,
        window(pki::random_serial().map_err(e)?),
    )
    .map_err(e)?;
    let profile = renew::profile_of(&target.new, target.item.flavor);
    let new = pki::issue(
        &profile,
        &target.key.spki().map_err(e)?,
        Some(&Signer {
            cert: &ca,
            key: &ca_key,
        }),
        &target.key,
        window(pki::random_serial().map_err(e)?),
    )
    .map_err(e)?;
    let pem = new.to_pem().map_err(e)?;
    let mut replaced = false;
    for (path, bytes, _) in &mut target.files {
        if *path == cert_file {
            *bytes = pem.clone().into_bytes();
            replaced = true;
        }
    }
    if !replaced {
        return Err(format!("no staged file '{cert_file}'"));
    }
    target.new = new;
    Ok(())
}
