//! Waiting until a component serves the certificate now on disk and answers healthy: after its
//! restart ([`wait_verified`]) or, without one, after a live reload ([`wait_reloaded`]).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::node::manifests::Component;
use crate::pki::Cert;
use crate::restart::target::read_file;
use crate::restart::{RestartError, RestartOptions, Target, fail, verify};

/// A component that took its renewed files without a restart.
#[derive(Debug, Clone, Serialize)]
pub struct Reloaded {
    pub component: Component,
    pub pod: String,
    /// From the end of the renewal to the first probe that saw the new certificate.
    pub reloaded_after_ms: u128,
    pub served_sha256: Option<String>,
}

/// The SHA-256 of the certificate in `rel` now.
fn file_sha256(root: &Path, rel: &str) -> Result<String, String> {
    let bytes = read_file(root, rel)?;
    Cert::from_pem(&bytes)
        .map(|c| c.sha256_hex())
        .map_err(|e| format!("'{rel}': {e}"))
}

/// Waits until the target is healthy and (etcd, apiserver) serves the certificate now on disk.
pub fn wait_verified(
    root: &Path,
    target: &Target,
    opts: &RestartOptions,
) -> Result<Option<String>, RestartError> {
    wait_serving(root, target, opts.timeout, opts.poll)
}

/// Waits, without restarting anything, until the target serves the renewed certificate now on
/// disk and is healthy, at most `opts.reload_timeout`. `None` when it did not within the bound
/// (the caller restarts it), or when nothing it serves can be compared (no served file).
pub fn wait_reloaded(root: &Path, target: &Target, opts: &RestartOptions) -> Option<Reloaded> {
    target.served_file.as_ref()?;
    let t0 = Instant::now();
    match wait_serving(root, target, opts.reload_timeout, opts.poll) {
        Ok(served) => {
            let reloaded_after_ms = t0.elapsed().as_millis();
            log::info!(
                "{} reloaded live in {:.1} s{}, not restarted",
                target.component.name(),
                reloaded_after_ms as f64 / 1000.0,
                served
                    .as_deref()
                    .map(|s| format!(", serving sha256 {s}"))
                    .unwrap_or_default()
            );
            Some(Reloaded {
                component: target.component,
                pod: target.pod.clone(),
                reloaded_after_ms,
                served_sha256: served,
            })
        }
        Err(e) => {
            log::warn!(
                "{} did not serve its renewed certificate within {} s ({e}); restarting it",
                target.component.name(),
                opts.reload_timeout.as_secs()
            );
            None
        }
    }
}

fn wait_serving(
    root: &Path,
    target: &Target,
    timeout: Duration,
    poll: Duration,
) -> Result<Option<String>, RestartError> {
    let want = match &target.served_file {
        Some(rel) => Some(file_sha256(root, rel).map_err(|e| fail(Some(target.component), e))?),
        None => None,
    };
    let seen = verify::wait_for(&target.probe, timeout, poll, |o| {
        o.healthy() && want.as_deref().is_none_or(|w| w == o.served_sha256)
    })
    .map_err(|e| {
        let expected = match (&want, &target.served_file) {
            (Some(w), Some(f)) => format!(" (expected '{f}' with sha256 {w})"),
            _ => String::new(),
        };
        fail(Some(target.component), format!("{}{expected}", e.0))
    })?;
    Ok(want.map(|_| seen.served_sha256))
}
