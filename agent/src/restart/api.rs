//! The Bottlerocket API as it really behaves (issue 26): the server restarts (systemd
//! `Restart=always`), so any call can meet a refused or dropped connection for seconds; its
//! config applier is forked after the commit and can be lost or fail without the API ever
//! saying so; pending transactions persist across its restarts. Everything the restart stage
//! asks of the API goes through here:
//!
//! - [`call`]: one call retried with backoff while the error is transient, within the caller's
//!   deadline, counting what it met ([`ApiStats`]);
//! - [`set_enabled`]: one change of `settings.kubernetes.static-pods.<pod>.enabled` in a
//!   transaction of its own whose name is never reused; after an answer that was lost (the call
//!   may have committed), the live value is read back before anything is sent again; a failed
//!   change discards its transaction and says what the live value is;
//! - [`wait_manifest`]: waits until the applier wrote or removed the pod's manifest; when it
//!   does not follow within [`APPLY_WAIT`] although the live value says it should, runs the
//!   applier again for that key (`POST /tx/apply?keys=`), at most [`MAX_REAPPLIES`] times, then
//!   fails naming the applier and where its log is;
//! - [`discard_stale`]: `certrotor-*` transactions left pending by an interrupted run, found
//!   under the node lock, are deleted and reported.

use std::path::Path;
use std::time::{Duration, Instant};

use bottlerocket::{ApiClient, ApiError, ApiResult, Retry};
use serde::Serialize;

use crate::node::catalog;
use crate::node::manifests::Component;
use crate::restart::{RestartError, fail};

/// How long the applier may take to write or remove a manifest before it is run again (the
/// real `static-pods` takes 43-185 ms to remove one and 35-65 ms to write one).
pub const APPLY_WAIT: Duration = Duration::from_secs(5);
/// Re-runs of the config applier for one change before the change fails.
pub const MAX_REAPPLIES: u32 = 3;
/// Bound on one API request (a commit on a healthy node takes milliseconds).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on the clean-up after a change failed within its own bound: reading the live value
/// back and discarding the transaction.
const CLEANUP_BOUND: Duration = Duration::from_secs(10);
/// The prefix of certrotor's transaction names (`certrotor-<pid>-<16 hex>`; earlier releases
/// used `certrotor-<pid>`).
pub const TX_PREFIX: &str = "certrotor";

/// What the API calls of one restart (or of a whole pass) met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ApiStats {
    /// Calls sent again after a transient error (the API restarting, a dropped connection).
    pub api_retries: u32,
    /// Re-runs of the API's config applier (`POST /tx/apply`) because a manifest did not follow
    /// the committed value.
    pub reapplies: u32,
    /// Time the API did not answer: from a call's first transient error to its success or to
    /// giving up, summed over calls.
    pub api_unreachable_ms: u128,
    /// Changes that were committed although their answer was lost (read back live).
    pub committed_unanswered: u32,
}

impl ApiStats {
    /// Adds `other` to these.
    pub fn add(&mut self, other: &ApiStats) {
        self.api_retries += other.api_retries;
        self.reapplies += other.reapplies;
        self.api_unreachable_ms += other.api_unreachable_ms;
        self.committed_unanswered += other.committed_unanswered;
    }

    /// Whether every call was answered at once and every apply acted.
    pub fn is_clean(&self) -> bool {
        *self == ApiStats::default()
    }

    /// What the API did to a restart, in words: "the API was unreachable for 5.1 s (retried 9
    /// times); its config applier did not act once and was run again"; `None` when clean.
    pub fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.api_retries > 0 || self.api_unreachable_ms > 0 {
            parts.push(format!(
                "the API was unreachable for {:.1} s (retried {} time{})",
                self.api_unreachable_ms as f64 / 1000.0,
                self.api_retries,
                if self.api_retries == 1 { "" } else { "s" }
            ));
        }
        if self.committed_unanswered > 0 {
            parts.push(format!(
                "{} change{} committed although the answer was lost",
                self.committed_unanswered,
                if self.committed_unanswered == 1 {
                    " was"
                } else {
                    "s were"
                }
            ));
        }
        if self.reapplies > 0 {
            parts.push(format!(
                "its config applier did not act {} and was run again",
                match self.reapplies {
                    1 => "once".to_string(),
                    n => format!("{n} times"),
                }
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// A client for `socket` whose requests are bounded by `bound` (at most [`REQUEST_TIMEOUT`]).
pub fn client(socket: &Path, bound: Duration) -> ApiClient {
    ApiClient::new(socket).with_timeout(bound.min(REQUEST_TIMEOUT))
}

/// Calls `f` until it succeeds, fails permanently, or `deadline` passes, backing off between
/// tries; each request is bounded by the time left. Retries and the time the API did not
/// answer are added to `stats`.
pub fn call<T>(
    client: &ApiClient,
    deadline: Instant,
    stats: &mut ApiStats,
    mut f: impl FnMut(&ApiClient) -> ApiResult<T>,
) -> ApiResult<T> {
    // One body per result type, not per closure: the static binary stays small.
    call_dyn(client, deadline, stats, &mut f)
}

fn call_dyn<T>(
    client: &ApiClient,
    deadline: Instant,
    stats: &mut ApiStats,
    f: &mut dyn FnMut(&ApiClient) -> ApiResult<T>,
) -> ApiResult<T> {
    let mut retry = Retry::until(deadline);
    let mut first_transient: Option<Instant> = None;
    let result = retry.run(|left| {
        let r = f(&client.bounded(left));
        if let Err(e) = &r
            && e.is_transient()
            && first_transient.is_none()
        {
            first_transient = Some(Instant::now());
        }
        r
    });
    stats.api_retries += retry.attempts().saturating_sub(1);
    if let Some(t) = first_transient {
        stats.api_unreachable_ms += t.elapsed().as_millis();
    }
    result
}

/// Stages a change in `tx` with `stage` and commits it; `uncertain` notes an error after which
/// the change may stand all the same (the answer was lost).
fn commit(
    c: &ApiClient,
    tx: &str,
    uncertain: &mut bool,
    stage: impl FnOnce(&ApiClient) -> ApiResult<()>,
) -> ApiResult<()> {
    let sent = stage(c).and_then(|()| c.commit_and_apply(tx).map(drop));
    if let Err(e) = &sent {
        *uncertain |= e.may_have_taken_effect();
    }
    sent
}

fn verb(enabled: bool) -> &'static str {
    if enabled { "enable" } else { "disable" }
}

/// Sets `settings.kubernetes.static-pods.<pod>.enabled` and commits it (the applier is started
/// by the commit; [`wait_manifest`] watches it act), retrying within `deadline`.
///
/// Each change has a transaction of its own ([`bottlerocket::unique_tx_name`]). Staging the
/// same value again is idempotent, so a retry after a refused or dropped call stages and
/// commits again; but after a call that may have committed (the answer was lost), the live
/// value is read first, and a value already as wanted counts as committed. When the change
/// fails, its transaction is discarded and the live value read back (a last answer may have
/// been lost after the commit): as wanted, the change stands; else the error says what was
/// tried, for how long, and what the live value is.
pub fn set_enabled(
    client: &ApiClient,
    pod: &str,
    enabled: bool,
    component: Option<Component>,
    deadline: Instant,
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    let tx = bottlerocket::unique_tx_name(TX_PREFIX);
    let t0 = Instant::now();
    let (mut uncertain, mut unanswered) = (false, false);
    let result = call(client, deadline, stats, |c| {
        if uncertain {
            if c.static_pod_enabled(pod)? == Some(enabled) {
                unanswered = true;
                return Ok(());
            }
            uncertain = false;
        }
        commit(c, &tx, &mut uncertain, |c| {
            c.set_static_pod_enabled(&tx, pod, enabled)
        })
    });
    let last = match result {
        Ok(()) if !unanswered => return Ok(()),
        Ok(()) => None,
        Err(e) => Some(e),
    };
    // Whatever happened, nothing of this change may stay pending: a later commit of the
    // transaction would apply it.
    let cleanup = deadline.max(Instant::now() + CLEANUP_BOUND);
    discard(client, &tx, cleanup, stats);
    let Some(error) = last else {
        stats.committed_unanswered += 1;
        log::warn!(
            "static pod '{pod}': enabled={enabled} was committed although the answer was lost \
             (read back live)"
        );
        return Ok(());
    };
    read_back(
        client,
        (pod, enabled, component),
        (&tx, error, t0),
        cleanup,
        stats,
    )
}

/// Sets the setting `key` (a full key) to `value` and commits it, as [`set_enabled`] does a
/// static pod's `enabled`: a transaction of its own, retried within `deadline`, the live value
/// read back after an answer that may have been lost, the transaction discarded when the change
/// fails. `Ok(true)`: committed now; `Ok(false)`: it already had that value (nothing sent).
pub fn set_setting(
    client: &ApiClient,
    key: &str,
    value: &serde_json::Value,
    deadline: Instant,
    stats: &mut ApiStats,
) -> Result<bool, String> {
    let live = call(client, deadline, stats, |c| c.setting(key))
        .map_err(|e| format!("cannot read {key} from the Bottlerocket API: {e}"))?;
    if live.as_ref() == Some(value) {
        return Ok(false);
    }
    let tx = bottlerocket::unique_tx_name(TX_PREFIX);
    let t0 = Instant::now();
    let mut uncertain = false;
    let result = call(client, deadline, stats, |c| {
        if uncertain && c.setting(key)?.as_ref() == Some(value) {
            return Ok(());
        }
        commit(c, &tx, &mut uncertain, |c| c.set_setting(&tx, key, value))
    });
    let cleanup = deadline.max(Instant::now() + CLEANUP_BOUND);
    discard(client, &tx, cleanup, stats);
    let Err(error) = result else {
        return Ok(true);
    };
    match call(client, cleanup, stats, |c| c.setting(key)) {
        Ok(Some(v)) if v == *value => {
            stats.committed_unanswered += 1;
            log::warn!("{key} was committed although the last answer was an error ({error})");
            Ok(true)
        }
        live => Err(format!(
            "cannot set {key} through the Bottlerocket API (transaction '{tx}', tried for \
             {:.1} s): {error}; {}",
            t0.elapsed().as_secs_f64(),
            match live {
                Ok(_) => "its live value is still another".to_string(),
                Err(e) => format!("its live value could not be read back: {e}"),
            }
        )),
    }
}

/// Waits until the file the config applier renders from the setting `key` is as `rendered`
/// wants (`file` relative to `root`), the setting having been set to `value`. When it does not
/// follow within [`APPLY_WAIT`], the setting is set again if its live value is another (the
/// commit did not stand), else the applier is run again for the key, at most
/// [`MAX_REAPPLIES`] times, each wait twice the one before (an applier restarting the kubelet
/// for an earlier change is busy for seconds: 5 + 10 + 20 + 40 s in all); then the wait fails,
/// naming the applier and its log.
pub fn follow_setting(
    (root, file): (&Path, &str),
    client: &ApiClient,
    (key, value): (&str, &serde_json::Value),
    rendered: &dyn Fn(Option<&[u8]>) -> bool,
    (deadline, poll): (Instant, Duration),
    stats: &mut ApiStats,
) -> Result<(), String> {
    let path = root.join(file);
    // Bounded, non-blocking, as every read of a node's files (a FIFO or a huge file put there
    // reads as not rendered).
    let read =
        || crate::sys::fsutil::read_limited(&path, file, crate::pki::MAX_PEM_FILE_BYTES).ok();
    let is_rendered = || rendered(read().as_deref());
    let (t0, mut reapplies) = (Instant::now(), 0u32);
    loop {
        let round = (Instant::now() + APPLY_WAIT * (1 << reapplies)).min(deadline);
        while !is_rendered() && Instant::now() < round {
            std::thread::sleep(poll.min(round.saturating_duration_since(Instant::now())));
        }
        if is_rendered() {
            return Ok(());
        }
        if Instant::now() >= deadline || reapplies >= MAX_REAPPLIES {
            return Err(format!(
                "the Bottlerocket API has {key} as certrotor set it, but its config applier \
                 (thar-be-settings) did not render '/{file}' from it after {reapplies} \
                 re-applies in {:.0} s; its log is in the API server's journal: run 'journalctl \
                 -u apiserver' in the admin container (sudo sheltie)",
                t0.elapsed().as_secs_f64()
            ));
        }
        if set_setting(client, key, value, deadline, stats)? {
            log::warn!("{key}: the commit did not stand; set again");
            continue;
        }
        reapplies += 1;
        stats.reapplies += 1;
        log::warn!(
            "{key} is set but '/{file}' does not follow it after {:.1} s; re-running the API's \
             config applier for it (POST /tx/apply), {reapplies} of {MAX_REAPPLIES}",
            t0.elapsed().as_secs_f64()
        );
        call(client, deadline, stats, |c| c.apply(&[key]))
            .map_err(|e| format!("cannot re-run the config applier for {key}: {e}"))?;
    }
}

/// After a change failed: the live value, read back within `deadline`, says whether it stands
/// after all (a last answer lost after the commit); if not, the error says what was tried.
fn read_back(
    client: &ApiClient,
    (pod, enabled, component): (&str, bool, Option<Component>),
    (tx, error, t0): (&str, ApiError, Instant),
    deadline: Instant,
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    let live = call(client, deadline, stats, |c| c.static_pod_enabled(pod));
    if let Ok(Some(v)) = live
        && v == enabled
    {
        stats.committed_unanswered += 1;
        log::warn!(
            "static pod '{pod}': enabled={enabled} was committed although the last answer was an \
             error ({error}; read back live)"
        );
        return Ok(());
    }
    let live = match live {
        Ok(Some(v)) => format!("its live value is enabled={v}"),
        Ok(None) => "it has no live enabled value".to_string(),
        Err(e) => format!("its live value could not be read back: {e}"),
    };
    Err(fail(
        component,
        format!(
            "cannot {} static pod '{pod}' through the Bottlerocket API (transaction '{tx}', \
             tried for {:.1} s): {error}; {live}",
            verb(enabled),
            t0.elapsed().as_secs_f64()
        ),
    ))
}

/// Deletes transaction `tx`, best effort within `deadline`, saying what it removed.
fn discard(client: &ApiClient, tx: &str, deadline: Instant, stats: &mut ApiStats) {
    match call(client, deadline, stats, |c| c.delete_tx(tx)) {
        Ok(keys) if keys.is_empty() => {}
        Ok(keys) => log::warn!(
            "discarded the Bottlerocket API transaction '{tx}' after a failed commit (it would \
             have set {})",
            keys.join(", ")
        ),
        Err(e) => log::warn!(
            "cannot discard the Bottlerocket API transaction '{tx}': {e}; it stays pending until \
             the next certrotor command discards it"
        ),
    }
}

/// Where `pod`'s manifest is written by the applier, when this root shows it.
pub fn manifest_path(root: &Path, pod: &str) -> Option<std::path::PathBuf> {
    let dir = root.join(catalog::paths::BOTTLEROCKET_STATIC_PODS);
    dir.is_dir().then(|| dir.join(pod))
}

/// Waits until the applier has written (`present`) or removed `pod`'s manifest, where the root
/// shows the static pods folder (else returns at once). When the manifest does not follow
/// within [`APPLY_WAIT`]: if the live value is not the wanted one (the commit did not stand),
/// it is set again; if it is, the applier is run again for that key, at most
/// [`MAX_REAPPLIES`] times; then the wait fails, naming the applier and its log.
pub fn wait_manifest(
    root: &Path,
    client: &ApiClient,
    want: (&str, bool, Option<Component>),
    deadline: Instant,
    poll: Duration,
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    follow(root, client, want, deadline, (poll, APPLY_WAIT), stats)
}

/// [`wait_manifest`], giving the applier `apply_wait` each time.
fn follow(
    root: &Path,
    client: &ApiClient,
    (pod, present, component): (&str, bool, Option<Component>),
    deadline: Instant,
    (poll, apply_wait): (Duration, Duration),
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    let Some(file) = manifest_path(root, pod) else {
        return Ok(());
    };
    let (t0, mut reapplies) = (Instant::now(), 0u32);
    let key = bottlerocket::static_pod_enabled_key(pod);
    let what = if present { "written" } else { "removed" };
    loop {
        let round = (Instant::now() + apply_wait).min(deadline);
        while file.exists() != present && Instant::now() < round {
            std::thread::sleep(poll.min(round.saturating_duration_since(Instant::now())));
        }
        if file.exists() == present {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let m = format!(
                "the static pod manifest '{}' was not {what} within {:.0} s of {}ing it \
                 ({reapplies} re-run(s) of the config applier)",
                file.display(),
                t0.elapsed().as_secs_f64(),
                verb(present),
            );
            return Err(fail(component, m));
        }
        let live = call(client, deadline, stats, |c| c.static_pod_enabled(pod)).map_err(|e| {
            let m = format!("static pod '{pod}': cannot read {key} back from the API: {e}");
            fail(component, m)
        })?;
        if live != Some(present) {
            log::warn!(
                "static pod '{pod}': the API has {key}={} although it was set to {present} \
                 (the commit did not stand); setting it again",
                live.map_or("(none)".to_string(), |v| v.to_string())
            );
            set_enabled(client, pod, present, component, deadline, stats)?;
            continue;
        }
        if reapplies >= MAX_REAPPLIES {
            let want = (pod, key.as_str(), present);
            return Err(applier_failed(&file, want, reapplies, t0, component));
        }
        reapplies += 1;
        stats.reapplies += 1;
        log::warn!(
            "static pod '{pod}': settings say enabled={present} but '{}' was not {what} within \
             {:.1} s; re-running the API's config applier for {key} (POST /tx/apply), \
             {reapplies} of {MAX_REAPPLIES}",
            file.display(),
            apply_wait.as_secs_f64()
        );
        call(client, deadline, stats, |c| c.apply(&[&key])).map_err(|e| {
            let m = format!("static pod '{pod}': cannot re-run the config applier for {key}: {e}");
            fail(component, m)
        })?;
    }
}

fn applier_failed(
    file: &Path,
    (pod, key, present): (&str, &str, bool),
    reapplies: u32,
    t0: Instant,
    component: Option<Component>,
) -> RestartError {
    fail(
        component,
        format!(
            "static pod '{pod}': the Bottlerocket API has {key}={present} but its config applier \
             (thar-be-settings running /usr/bin/static-pods) did not {} '{}' after {reapplies} \
             re-applies in {:.0} s; its log is in the API server's journal: run 'journalctl -u \
             apiserver' in the admin container (sudo sheltie)",
            if present { "write" } else { "remove" },
            file.display(),
            t0.elapsed().as_secs_f64()
        ),
    )
}

/// A transaction an interrupted run left pending, discarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardedTx {
    pub name: String,
    /// What it would have set: `key=value`, sorted.
    pub sets: Vec<String>,
}

/// Bottlerocket 1.46+ can turn static pods off altogether (`settings.kubernetes.static-pods-enabled
/// = false`: the kubelet is given no static pod folder, so no control-plane pod runs, and disabling
/// and enabling one restarts nothing). Read before anything changes, so that such a node is refused
/// with its files untouched; an API that does not answer within `deadline` is refused too (a pass
/// must be able to restart what it renews).
pub fn require_static_pods(
    client: &ApiClient,
    deadline: Instant,
    stats: &mut ApiStats,
) -> Result<(), RestartError> {
    let key = bottlerocket::STATIC_PODS_ENABLED_KEY;
    match call(client, deadline, stats, |c| c.static_pods_enabled()) {
        Ok(Some(false)) => Err(fail(
            None,
            format!(
                "the Bottlerocket setting {key} is false: the kubelet runs no static pod on this \
                 node, so its control plane is not running and no restart could take effect; \
                 nothing was renewed or restarted. If this node is a control plane, turn static \
                 pods back on from the admin container ('apiclient set {key}=true'); to renew the \
                 files without restarting anything, run with --platform none"
            ),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(fail(
            None,
            format!(
                "cannot read {key} from the Bottlerocket API at '{}': {e}; nothing was renewed \
                 or restarted; the next pass tries again (the API server's log: 'journalctl -u \
                 apiserver' in the admin container after 'sudo sheltie')",
                client.socket().display()
            ),
        )),
    }
}

/// Deletes every pending `certrotor-*` transaction (under the node lock no other certrotor
/// runs, so each was left by an interrupted run: committing it later would apply a stale
/// change); never touches other writers' transactions (`default`, `apiclient-set-*`).
pub fn discard_stale(
    client: &ApiClient,
    deadline: Instant,
    stats: &mut ApiStats,
) -> Result<Vec<DiscardedTx>, ApiError> {
    let names = call(client, deadline, stats, |c| c.list_tx())?;
    let mut out = Vec::new();
    for name in names {
        if !name.starts_with(&format!("{TX_PREFIX}-")) {
            continue;
        }
        let pending = call(client, deadline, stats, |c| c.pending(&name))?;
        let keys = call(client, deadline, stats, |c| c.delete_tx(&name))?;
        let sets = keys
            .iter()
            .map(|k| match value_of(&pending, k) {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            })
            .collect::<Vec<_>>();
        log::warn!(
            "discarded the Bottlerocket API transaction '{name}' left pending by an interrupted \
             run (it would have set {})",
            if sets.is_empty() {
                "nothing".to_string()
            } else {
                sets.join(", ")
            }
        );
        out.push(DiscardedTx { name, sets });
    }
    Ok(out)
}

/// The value at full key `key` (`settings.a.b`) in a pending Settings object (no wrapper);
/// plain segments only (certrotor's keys).
fn value_of<'a>(settings: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    key.strip_prefix("settings.")?
        .split('.')
        .try_fold(settings, |v, segment| v.get(segment))
}

#[cfg(test)]
mod tests;
