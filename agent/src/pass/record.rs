//! The record of the last pass: every `run`/`daemon` pass ends by writing
//! `var/lib/certrotor/last-pass.json` (a versioned state file, [`crate::sys::state`]), through
//! [`run_pass`], which also posts the pass's Kubernetes Event ([`crate::pass::events`]).
//! `certrotor status` and the events read it.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::node::Node;
use crate::pass::ops::OpsError;
use crate::pass::run::{RunOptions, RunReport};
use crate::sys::clock;
use crate::sys::state::{self, Kind, StateError};
use crate::txn;

/// The record's file name under `var/lib/certrotor`.
pub const LAST_PASS: &str = "last-pass.json";

/// What the last `run`/`daemon` pass did (`last-pass.json`, version 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastPass {
    pub version: u32,
    /// `run` or `daemon`.
    pub command: String,
    pub started_at: String,
    pub finished_at: String,
    /// `finished_at` as Unix seconds.
    pub finished_unix: i64,
    /// `nothing-due`, `renewed`, `rolled-back`, `rollback-failed`, `deferred`, `locked` or
    /// `failed`.
    pub result: String,
    /// The exit code `run --once` gave (or would give) for this pass.
    pub exit_code: u8,
    /// The certificates and kubeconfigs renewed (or installed) by the pass.
    pub renewed: Vec<String>,
    /// notAfter of what was renewed.
    pub new_not_after: Option<String>,
    pub backup_id: Option<String>,
    pub platform: Option<String>,
    /// Components and static pods (by manifest name) restarted.
    pub restarted: Vec<String>,
    /// Components (and static pods such as kube-vip, by manifest name) the pass should have
    /// restarted but did not (owed to the next pass).
    pub owed: Vec<String>,
    /// Why verification failed, when the pass rolled back.
    pub rollback_reason: Option<String>,
    /// The error of a failed pass.
    pub error: Option<String>,
    /// The renewal policy of the pass: what expires within this many seconds is renewed.
    pub within_seconds: i64,
    /// `--all`: everything renewable, due or not.
    pub all: bool,
    /// The daemon's interval between passes (none for `run --once`).
    pub interval_seconds: Option<u64>,
}

impl LastPass {
    /// The record of a pass that returned `result`.
    pub fn of(
        result: &Result<RunReport, OpsError>,
        opts: &RunOptions,
        started: i64,
        finished: i64,
        interval: Option<Duration>,
    ) -> LastPass {
        let mut p = LastPass {
            version: Kind::LastPass.current(),
            command: if interval.is_some() { "daemon" } else { "run" }.into(),
            started_at: clock::rfc3339(started),
            finished_at: clock::rfc3339(finished),
            finished_unix: finished,
            result: String::new(),
            exit_code: 0,
            renewed: vec![],
            new_not_after: None,
            backup_id: None,
            platform: None,
            restarted: vec![],
            owed: vec![],
            rollback_reason: None,
            error: None,
            within_seconds: opts.policy.within,
            all: opts.policy.all,
            interval_seconds: interval.map(|d| d.as_secs()),
        };
        match result {
            Err(e) => p.record_error(e),
            Ok(r) => p.record_report(r),
        }
        p
    }

    /// A pass that returned an error: `locked` or `failed`, with the error.
    fn record_error(&mut self, e: &OpsError) {
        self.exit_code = crate::pass::outcome::for_error(e);
        self.result = if self.exit_code == crate::pass::outcome::EXIT_LOCKED {
            "locked"
        } else {
            "failed"
        }
        .into();
        self.error = Some(e.to_string());
    }

    /// A pass that returned a report: what it renewed and restarted, its result, its error
    /// and what it owes the next pass.
    fn record_report(&mut self, r: &RunReport) {
        self.exit_code = crate::pass::outcome::for_run(r);
        self.renewed = renewed_names(r);
        if !self.renewed.is_empty() {
            self.new_not_after = Some(r.renew.plan.not_after.clone());
        }
        self.backup_id = r.renew.backup_id.clone();
        self.platform = Some(r.platform.clone());
        self.restarted = r
            .restarted
            .iter()
            .map(|x| x.component.name().to_string())
            .chain(r.restarted_pods.iter().map(|x| x.pod.clone()))
            .collect();
        let cluster = r.cluster.as_ref();
        self.result = match &r.rolled_back {
            Some(rb) if rb.error.is_some() => "rollback-failed",
            Some(_) => "rolled-back",
            None if cluster.is_some_and(|c| c.deferred) => "deferred",
            None if self.exit_code == crate::pass::outcome::EXIT_FAILED => "failed",
            None if self.renewed.is_empty() => "nothing-due",
            None => "renewed",
        }
        .into();
        self.record_report_error(r);
        if r.rolled_back.is_none() && r.platform != "none" {
            self.owed = owed_names(r);
        }
    }

    /// The error of a pass that returned a report: the rollback's, else the cluster step's,
    /// else the static pods', else what was left disabled.
    fn record_report_error(&mut self, r: &RunReport) {
        if let Some(rb) = &r.rolled_back {
            self.rollback_reason = Some(rb.failure.clone());
            self.error = rb.error.clone();
        } else if let Some(c) = r.cluster.as_ref() {
            self.error = c.pair_error.clone().or_else(|| c.error.clone());
        }
        if self.error.is_none() && !r.pod_errors.is_empty() {
            self.error = Some(r.pod_errors.join("; "));
        }
        if self.error.is_none() && !r.left_disabled.is_empty() {
            self.error = Some(r.left_disabled.join("; "));
        }
    }
}

/// What a pass that did not roll back owes the next: the components neither restarted nor
/// reloaded live, and the static pods it could not restart.
fn owed_names(r: &RunReport) -> Vec<String> {
    r.components
        .iter()
        .filter(|c| !r.restarted.iter().any(|x| x.component == **c))
        // Reloaded live (reload.rs): served without a restart, not owed.
        .filter(|c| !r.reloaded.iter().any(|x| x.component == **c))
        .map(|c| c.name().to_string())
        .chain(r.owed_pods.iter().cloned())
        .collect()
}

/// What a pass renewed: the plan's items when a backup was made, and the apiserver-etcd-client
/// pair a pass installed from etcd.
pub fn renewed_names(r: &RunReport) -> Vec<String> {
    let mut names: Vec<String> = if r.renew.backup_id.is_some() && !r.renew.dry_run {
        r.renew.plan.items.iter().map(|i| i.name.clone()).collect()
    } else {
        vec![]
    };
    if let Some(i) = &r.import {
        names.extend(i.files.iter().cloned());
    }
    names
}

/// The record's path.
pub fn last_pass_path(root: &Path) -> std::path::PathBuf {
    txn::state_dir(root).join(LAST_PASS)
}

/// Reads the last-pass record: `Ok(None)` only when no pass has written one.
pub fn read_last_pass(root: &Path) -> Result<Option<LastPass>, StateError> {
    Ok(state::read::<LastPass>(Kind::LastPass, &last_pass_path(root))?.map(|(_, p)| p))
}

/// One `run`/`daemon` pass as the commands run it: [`crate::pass::run::run_once`], then the
/// last-pass record (not for `--dry-run`, which writes nothing) and the Kubernetes Event.
/// Neither changes the pass's result: failing to record or to post is a warning.
/// `interval`: the daemon's, `None` for `run --once`.
pub fn run_pass(
    root: &Path,
    opts: &RunOptions,
    interval: Option<Duration>,
) -> Result<RunReport, OpsError> {
    let started = opts.write.clock.now();
    let result = crate::pass::run::run_once(root, opts);
    if opts.dry_run {
        return result;
    }
    let pass = LastPass::of(&result, opts, started, opts.write.clock.now(), interval);
    let dir = txn::state_dir(root);
    let written = crate::sys::fsutil::create_dir_all_mode(&dir, 0o700)
        .and_then(|()| state::write(&last_pass_path(root), &pass));
    if let Err(e) = written {
        log::warn!(
            "cannot record the pass in '{}': {e}; 'certrotor status' will show an older pass",
            last_pass_path(root).display()
        );
    }
    // Found again: a first pass may have made the node's kubeconfigs appear.
    crate::pass::events::after_pass(&Node::discover(root), &pass, &*opts.write.clock);
    result
}
