//! The cluster CA on Bottlerocket, where two of its consumers are the API's settings, not files
//! certrotor may write (`/etc` is rendered from settings):
//!
//! - kube-controller-manager's manifest is `settings.kubernetes.static-pods.<pod>.manifest`; the
//!   API renders it to `/etc/kubernetes/static-pods/<pod>`, and the kubelet runs that;
//! - the kubelet's client CA, and the CA its kubeconfig trusts, is
//!   `settings.kubernetes.cluster-certificate`, rendered to `/etc/kubernetes/pki/ca.crt`; a
//!   change restarts the kubelet (`systemctl try-restart kubelet.service`).
//!
//! The settings follow the files. Each change is committed through the API in a transaction of
//! its own ([`crate::restart::api::set_setting`]) and watched until the config applier rendered
//! it, running the applier again when it did not ([`crate::restart::api::follow_setting`]):
//!
//! 1. before a stage that signs (trust-in, the issue, an abort's issue by the old CA), the signer
//!    moves to `ca.signer.crt` ([`place_signer`]): the file first, holding the CA that signs now
//!    (a transaction of its own), then the manifest setting. The move is its own step, before the
//!    stage's transaction, so that a stage rolled back keeps the signer file the manifest names;
//!    the stage's transaction changes the file's content only (the new CA at the issue);
//! 2. after a stage's pass, the kubelet's trust follows the CA file ([`kubelet_trust`]): the same
//!    certificates in another order (the issue's [new, old]) change nothing; a change waits until
//!    a kubelet this node runs has been restarted since the file was rendered;
//! 3. after trust-out and an abort, the manifest names `ca.crt` again, then the signer file goes
//!    ([`place_signer`]).
//!
//! Each step reads what is live and changes only what differs: a step interrupted (a crash, the
//! API restarting) is completed by the same command again.

use std::path::Path;
use std::time::{Duration, Instant};

use bottlerocket::ApiClient;
use serde_json::Value;

use super::cluster::{SignerFlag, edit_manifest, shas, signer_flag, stale_kubelet};
use super::files::{self, CaFiles};
use super::{RotateError, pods_here};
use crate::node::Node;
use crate::node::kubeconfig::{base64_decode_public, base64_encode};
use crate::pass::ops::OpsError;
use crate::pass::run::RunOptions;
use crate::pki::{Cert, MAX_BUNDLE_CERTS};
use crate::restart::api::{self, APPLY_WAIT, ApiStats, MAX_REAPPLIES};
use crate::restart::{self, Platform};
use crate::txn::{self, Change};

/// The kubelet's client CA file, rendered from [`CLUSTER_CERTIFICATE`].
pub(super) const KUBELET_CA: &str = "etc/kubernetes/pki/ca.crt";
/// The setting the kubelet's client CA is rendered from.
pub(super) const CLUSTER_CERTIFICATE: &str = "settings.kubernetes.cluster-certificate";

/// The Bottlerocket API of a node whose cluster CA rotates.
pub(super) struct Api {
    client: ApiClient,
    /// Bound on each step (the restart timeout).
    bound: Duration,
    poll: Duration,
}

/// Whether the node has the Bottlerocket layout (EKS Anywhere's `/var/lib/kubeadm`).
pub(super) fn is_bottlerocket(node: &Node) -> bool {
    node.layouts().iter().any(|l| l.name == "bottlerocket")
}

/// The API on a Bottlerocket node (`None` elsewhere); refused where the platform is not the
/// API: the settings cannot be changed otherwise.
pub(super) fn api(node: &Node, opts: &RunOptions) -> Result<Option<Api>, RotateError> {
    if !is_bottlerocket(node) {
        return Ok(None);
    }
    match restart::detect(node.root(), &opts.restart).map_err(OpsError::Platform)? {
        Platform::Bottlerocket { client, .. } => Ok(Some(Api {
            client,
            bound: opts.restart.timeout,
            poll: opts.restart.poll,
        })),
        _ => Err(RotateError::Refused(
            "the cluster CA of a Bottlerocket node moves kube-controller-manager's signer and the \
             kubelet's trust through the Bottlerocket API's settings: run certrotor with \
             '--platform bottlerocket' (or 'auto') where it reaches the API's socket \
             (/run/api.sock)"
                .into(),
        )),
    }
}

fn manifest_key(pod: &str) -> String {
    let enabled = bottlerocket::static_pod_enabled_key(pod);
    let prefix = enabled.strip_suffix(".enabled").unwrap_or(&enabled);
    format!("{prefix}.manifest")
}

/// The live text of `pod`'s manifest setting.
fn live_manifest(api: &Api, pod: &str, stats: &mut ApiStats) -> Result<String, String> {
    let key = manifest_key(pod);
    let deadline = Instant::now() + api.bound;
    let live = api::call(&api.client, deadline, stats, |c| c.setting(&key))
        .map_err(|e| format!("cannot read {key} from the Bottlerocket API: {e}"))?;
    let text = live
        .as_ref()
        .and_then(Value::as_str)
        .and_then(base64_decode_public)
        .and_then(|b| String::from_utf8(b).ok());
    text.ok_or_else(|| format!("{key} is not the base64 of a manifest"))
}

/// Makes the manifest setting name `to` as the signer's file (it names `from` or `to`), and
/// waits until the API rendered it.
fn set_signer(
    root: &Path,
    api: &Api,
    (pod, f): (&str, &SignerFlag),
    to: &str,
) -> Result<ApiStats, String> {
    let mut stats = ApiStats::default();
    let key = manifest_key(pod);
    let text = live_manifest(api, pod, &mut stats)?;
    let from = [&f.ca_value, &f.signer_value]
        .into_iter()
        .find(|v| *v != to)
        .map_or(to, |v| v.as_str());
    let want = if super::cluster::names(&text, to) {
        text
    } else {
        edit_manifest(&text, &key, from, to)?
    };
    let value = Value::String(base64_encode(want.as_bytes()));
    let deadline = Instant::now() + api.bound;
    if api::set_setting(&api.client, &key, &value, deadline, &mut stats)? {
        log::info!("kube-controller-manager's manifest ({key}) names '{to}' as its signer");
    }
    api::follow_setting(
        (root, &f.manifest),
        &api.client,
        (&key, &value),
        &|b| b == Some(want.as_bytes()),
        (deadline, api.poll),
        &mut stats,
    )?;
    Ok(stats)
}

/// kube-controller-manager's signer flag and the static pod whose manifest setting holds it,
/// where this node runs it through the API.
fn signer_setting(
    node: &Node,
    files: &CaFiles,
    opts: &RunOptions,
) -> Result<Option<(SignerFlag, String)>, String> {
    let pods = pods_here(node, opts).map_err(|e| e.to_string())?;
    Ok(signer_flag(node, &pods, files)?.and_then(|f| f.setting.clone().map(|pod| (f, pod))))
}

/// Writes (`Some`) or removes (`None`) the signer file in a transaction of its own.
fn write_signer(
    node: &Node,
    f: &SignerFlag,
    content: Option<Vec<u8>>,
    opts: &RunOptions,
) -> Result<(), String> {
    let change = Change {
        rel: f.signer_rel.clone(),
        content,
        mode_if_new: 0o644,
    };
    let now = opts.write.clock.now();
    txn::apply(node.root(), &[change], "ca", now, opts.write.retention)
        .map(drop)
        .map_err(|e| format!("'{}': {e}", f.signer_rel))
}

/// Before a stage that signs (`own_file`): kube-controller-manager signs from the signer file,
/// written first, holding the CA that signs now. After trust-out or an abort (not `own_file`):
/// the manifest names the CA file again, then the signer file goes. Under the node lock.
pub(super) fn place_signer(
    node: &Node,
    api: &Api,
    files: &CaFiles,
    opts: &RunOptions,
    own_file: bool,
) -> Result<(), String> {
    let Some((f, pod)) = signer_setting(node, files, opts)? else {
        return Ok(());
    };
    let exists = files::read(node.root(), &f.signer_rel)?.is_some();
    let stats = if own_file {
        if !exists {
            let certs = files::certs(node.root(), files)?;
            let signing = certs.first().ok_or("the CA file holds no certificate")?;
            let pem = signing.to_pem().map_err(|e| e.to_string())?;
            write_signer(node, &f, Some(pem.into_bytes()), opts)?;
        }
        txn::failpoint("ca-signer-file-written");
        set_signer(node.root(), api, (&pod, &f), &f.signer_value)?
    } else {
        let stats = set_signer(node.root(), api, (&pod, &f), &f.ca_value)?;
        txn::failpoint("ca-signer-restored");
        if exists {
            write_signer(node, &f, None, opts)?;
        }
        stats
    };
    log_stats(&stats);
    Ok(())
}

/// After a stage's pass: `settings.kubernetes.cluster-certificate` holds the certificates of the
/// CA file (in any order), the API rendered it, and a kubelet this node runs has been restarted
/// since. A node whose settings have no cluster certificate has nothing to follow.
pub(super) fn kubelet_trust(
    node: &Node,
    api: &Api,
    files: &CaFiles,
    opts: &RunOptions,
) -> Result<(), String> {
    let mut stats = ApiStats::default();
    let result = follow_trust(node, api, files, opts, &mut stats);
    log_stats(&stats);
    result
}

fn follow_trust(
    node: &Node,
    api: &Api,
    files: &CaFiles,
    opts: &RunOptions,
    stats: &mut ApiStats,
) -> Result<(), String> {
    let deadline = Instant::now() + api.bound;
    let live = api::call(&api.client, deadline, stats, |c| {
        c.setting(CLUSTER_CERTIFICATE)
    })
    .map_err(|e| format!("cannot read {CLUSTER_CERTIFICATE} from the Bottlerocket API: {e}"))?;
    let Some(live) = live else {
        log::info!(
            "{CLUSTER_CERTIFICATE} is not set: the kubelet does not take its trust from the API"
        );
        return Ok(());
    };
    let certs = files::certs(node.root(), files)?;
    let want = shas(&certs);
    let held =
        |pem: &[u8]| Cert::all_from_pem(pem, MAX_BUNDLE_CERTS).is_ok_and(|c| shas(&c) == want);
    let value = match live.as_str().and_then(base64_decode_public) {
        Some(pem) if held(&pem) => live,
        _ => {
            let mut pem = String::new();
            for c in &certs {
                pem.push_str(&c.to_pem().map_err(|e| e.to_string())?);
            }
            Value::String(base64_encode(pem.as_bytes()))
        }
    };
    if api::set_setting(&api.client, CLUSTER_CERTIFICATE, &value, deadline, stats)? {
        txn::failpoint("ca-kubelet-trust-set");
        log::info!(
            "{CLUSTER_CERTIFICATE} holds the {} certificate(s) of '{}': the API renders \
             /{KUBELET_CA} and restarts the kubelet",
            certs.len(),
            files.cert
        );
    }
    api::follow_setting(
        (node.root(), KUBELET_CA),
        &api.client,
        (CLUSTER_CERTIFICATE, &value),
        &|b| b.is_some_and(held),
        (deadline, api.poll),
        stats,
    )?;
    kubelet_restarted(node, api, opts, (deadline, stats))
}

/// Waits until no kubelet this node runs started before the kubelet's CA file was rendered;
/// runs the applier again (which restarts the kubelet) when one has not been restarted within
/// [`APPLY_WAIT`], at most [`MAX_REAPPLIES`] times.
fn kubelet_restarted(
    node: &Node,
    api: &Api,
    opts: &RunOptions,
    (deadline, stats): (Instant, &mut ApiStats),
) -> Result<(), String> {
    let stale = || kubelet_before_render(node, opts.write.clock.now());
    let mut reapplies = 0u32;
    loop {
        let round = (Instant::now() + APPLY_WAIT).min(deadline);
        while stale().is_some() && Instant::now() < round {
            std::thread::sleep(
                api.poll
                    .min(round.saturating_duration_since(Instant::now())),
            );
        }
        let Some(pid) = stale() else {
            return Ok(());
        };
        if Instant::now() >= deadline || reapplies >= MAX_REAPPLIES {
            return Err(format!(
                "the kubelet (PID {pid}) started before /{KUBELET_CA} was rendered from \
                 {CLUSTER_CERTIFICATE} and was not restarted by the API's config applier \
                 (systemctl try-restart kubelet.service) after {reapplies} re-applies: run \
                 'journalctl -u apiserver -u kubelet' in the admin container (sudo sheltie), then \
                 the same certrotor command again"
            ));
        }
        reapplies += 1;
        stats.reapplies += 1;
        log::warn!(
            "the kubelet (PID {pid}) has not been restarted since /{KUBELET_CA} was rendered; \
             re-running the API's config applier for {CLUSTER_CERTIFICATE}, {reapplies} of \
             {MAX_REAPPLIES}"
        );
        api::call(&api.client, deadline, stats, |c| {
            c.apply(&[CLUSTER_CERTIFICATE])
        })
        .map_err(|e| format!("cannot re-run the config applier: {e}"))?;
    }
}

/// A kubelet this node runs (its root shows this node's rendered CA file) that started before
/// the file was rendered.
fn kubelet_before_render(node: &Node, now: i64) -> Option<u32> {
    stale_kubelet(node, KUBELET_CA, &|_| Some(format!("/{KUBELET_CA}")), now)
}

/// The stage's check: the rendered kubelet CA holds the CA file's certificates (where the
/// setting renders one), and no kubelet runs that started before it was rendered.
pub(super) fn check(node: &Node, bundle: &[Cert], now: i64) -> Result<(), String> {
    if let Some(b) = files::read(node.root(), KUBELET_CA)? {
        let held = Cert::all_from_pem(&b, MAX_BUNDLE_CERTS).map_err(|e| e.to_string())?;
        if shas(&held) != shas(bundle) {
            return Err(format!(
                "/{KUBELET_CA} (rendered from {CLUSTER_CERTIFICATE}) holds {} certificate(s), \
                 not the {} of the CA file",
                held.len(),
                bundle.len()
            ));
        }
    }
    match kubelet_before_render(node, now) {
        Some(pid) => Err(format!(
            "the kubelet (PID {pid}) started before /{KUBELET_CA} was rendered: it still trusts \
             what it read then"
        )),
        None => Ok(()),
    }
}

fn log_stats(stats: &ApiStats) {
    if let Some(d) = stats.describe() {
        log::warn!("Bottlerocket API: {d}");
    }
}
