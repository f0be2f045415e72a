//! The pass's state, persisted: which stage a pass has reached, the restarts it owes, and the
//! static pod it has stopped, in one versioned file (`var/lib/certrotor/pass.json`). This module
//! is its only reader and writer, and [`recover`] is what every command runs under the lock
//! after the transaction layer's own recovery ([`crate::txn::recover`]).
//!
//! Stages (ARCHITECTURE.md, "State files"):
//! - `planned`: the pass chose what to renew and recorded the restarts that will follow; no file
//!   has changed;
//! - `committing`: the renewal's transaction is about to journal backup `committing`; whether it
//!   reached its journal is told by that backup ([`crate::txn::backup_complete`]);
//! - `written`: the files are renewed; `owed` lists the restarts still due, `backup_id` what a
//!   failed verification restores;
//! - `restarting`: restarts one at a time; `stopped` names the pod stopped now, if any.
//!
//! A pass that ends verified or rolled back removes the file, or leaves `written` with the pods
//! whose restart failed. A stage never claims what did not happen: recovery of a `planned` pass,
//! or of a `committing` one whose backup never completed, owes nothing new (the files did not
//! change), and a pod started again by recovery after the renewal counts as restarted
//! (`started_by_recovery`), to be verified, not restarted again.
//!
//! Earlier releases kept the owed restarts in `pending-restarts.json` and the stopped pod in
//! `restart.json`; they are still read (with their own checks and messages) and replaced by
//! `pass.json` at the next write.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::node::manifests::Component;
use crate::pass::ops::OpsError;
use crate::restart::api::ApiStats;
use crate::restart::{self, Ensured, RestartError, StopRecord, Stopped};
use crate::sys::fsutil;
use crate::sys::state::{self, Kind, StateError};
use crate::txn::{self, Recovery};

/// The state file, under the state folder.
pub const PASS_STATE: &str = "pass.json";
/// Earlier releases' owed restarts, read and migrated.
pub const LEGACY_OWED: &str = "pending-restarts.json";
/// Earlier releases' record of a stopped pod, read and migrated.
pub const LEGACY_MARKER: &str = "restart.json";

/// The stages of a pass (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Nothing is owed and nothing is in progress (the file is absent).
    #[default]
    Idle,
    Planned,
    Committing,
    Written,
    Restarting,
}

/// Restarts: the four components, and other static pods (kube-vip) that mount a renewed file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restarts {
    #[serde(default)]
    pub components: Vec<Component>,
    #[serde(default)]
    pub pods: Vec<String>,
}

impl Restarts {
    pub fn is_empty(&self) -> bool {
        self.components.is_empty() && self.pods.is_empty()
    }

    /// Both sets, sorted, each once.
    pub fn merge(&mut self, other: &Restarts) {
        self.components.extend(other.components.iter().copied());
        self.components.sort();
        self.components.dedup();
        self.pods.extend(other.pods.iter().cloned());
        self.pods.sort();
        self.pods.dedup();
    }
}

/// The pass's state (`pass.json`, version 1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassState {
    #[serde(default)]
    pub version: u32,
    pub stage: Stage,
    /// The backup a failed verification of the owed restarts restores.
    #[serde(default)]
    pub backup_id: Option<String>,
    /// Restarts due because files they read were renewed.
    #[serde(default)]
    pub owed: Restarts,
    /// `planned`/`committing`: the restarts this pass's renewal will make due.
    #[serde(default)]
    pub planned: Restarts,
    /// `committing`: the backup id of the renewal's transaction.
    #[serde(default)]
    pub committing: Option<String>,
    /// `restarting`: the static pod stopped now.
    #[serde(default)]
    pub stopped: Option<Stopped>,
    /// Pods recovery started again after the renewal: they run on the renewed files.
    #[serde(default)]
    pub started_by_recovery: Vec<String>,
    /// Read from an earlier release's files: the next write replaces them.
    #[serde(skip)]
    legacy: bool,
    /// What this process did (not persisted; kept when the file is cleared).
    #[serde(skip)]
    pub this_process: InProcess,
}

/// What the running process did to static pods, for the end of its pass: every pod it stopped
/// (or tried to: a stop whose answer was lost may have taken effect), which the pass makes sure
/// is enabled again before it ends, and what its API calls met.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InProcess {
    pub stopped: Vec<Stopped>,
    pub api: ApiStats,
}

impl PassState {
    /// The state of the node under `root`: absent means idle. A file that exists but cannot be
    /// used (unreadable, damaged, a newer version, a name it must not hold) is an error.
    pub fn load(root: &Path) -> Result<PassState, OpsError> {
        let path = path(root, PASS_STATE);
        let read = state::read::<PassState>(Kind::PassState, &path);
        if let Some((_, s)) = read.map_err(OpsError::PassState)? {
            s.check(root, &path).map_err(OpsError::PassState)?;
            return Ok(s);
        }
        let mut s = PassState::default();
        if let Some(owed) = legacy_owed(root)? {
            s = owed;
        }
        if let Some(stopped) = legacy_marker(root)? {
            s.stage = Stage::Restarting;
            s.stopped = Some(stopped);
            s.legacy = true;
        }
        Ok(s)
    }

    /// Whether nothing is owed or in progress.
    pub fn is_idle(&self) -> bool {
        self.stage == Stage::Idle
    }

    /// Records this pass's plan before any file changes: the restarts it will owe.
    pub fn plan(&mut self, root: &Path, planned: Restarts) -> Result<(), OpsError> {
        self.stage = Stage::Planned;
        self.planned = planned;
        self.save(root)
    }

    /// Called by the transaction just before it journals backup `backup_id`.
    pub fn committing(&mut self, root: &Path, backup_id: &str) -> std::io::Result<()> {
        self.stage = Stage::Committing;
        self.committing = Some(backup_id.to_string());
        self.write(root)
    }

    /// The renewal is written: what it planned is owed, against its backup.
    pub fn written(&mut self, root: &Path, backup_id: &str) -> Result<(), OpsError> {
        let planned = std::mem::take(&mut self.planned);
        self.owed.merge(&planned);
        self.backup_id = Some(backup_id.to_string());
        self.committing = None;
        self.stage = Stage::Written;
        self.save(root)
    }

    /// Replaces what is owed (live reloads took some off; a pass settled some).
    pub fn owe(&mut self, root: &Path, owed: Restarts) -> Result<(), OpsError> {
        self.owed = owed;
        self.planned = Restarts::default();
        self.committing = None;
        if self.owed.is_empty() && self.stopped.is_none() {
            return self.clear(root);
        }
        if self.stage != Stage::Restarting {
            self.stage = Stage::Written;
        }
        self.save(root)
    }

    /// Restarts begin.
    pub fn restarting(&mut self, root: &Path) -> Result<(), OpsError> {
        self.stage = Stage::Restarting;
        self.save(root)
    }

    /// A pass that changed nothing (a dry run, nothing due) forgets its plan.
    pub fn unplanned(&mut self, root: &Path) -> Result<(), OpsError> {
        if self.stage == Stage::Planned {
            let owed = self.owed.clone();
            self.stage = Stage::Written;
            return self.owe(root, owed);
        }
        Ok(())
    }

    /// Removes the file: nothing is owed or in progress.
    pub fn clear(&mut self, root: &Path) -> Result<(), OpsError> {
        let this_process = std::mem::take(&mut self.this_process);
        *self = PassState {
            this_process,
            ..PassState::default()
        };
        remove(root, PASS_STATE)?;
        remove(root, LEGACY_OWED)?;
        remove(root, LEGACY_MARKER)
    }

    /// Writes the state; fails with the path and what to do.
    fn save(&mut self, root: &Path) -> Result<(), OpsError> {
        self.write(root).map_err(|source| OpsError::Pending {
            path: path(root, PASS_STATE).display().to_string(),
            source,
        })
    }

    fn write(&mut self, root: &Path) -> std::io::Result<()> {
        if self.stage == Stage::Idle {
            self.stage = Stage::Written;
        }
        self.version = Kind::PassState.current();
        fsutil::create_dir_all_mode(&txn::state_dir(root), 0o700)?;
        state::write(&path(root, PASS_STATE), self)?;
        if std::mem::take(&mut self.legacy) {
            state::remove(&path(root, LEGACY_OWED))?;
            state::remove(&path(root, LEGACY_MARKER))?;
        }
        Ok(())
    }

    /// Checks every name read back: backup ids, pod names, the stopped pod.
    fn check(&self, root: &Path, path: &Path) -> Result<(), StateError> {
        let bad = |entry: String, detail| StateError::entry(Kind::PassState, path, entry, detail);
        for id in self.backup_id.iter().chain(&self.committing) {
            state::check_name(id).map_err(|d| bad(format!("backup {id}"), d))?;
        }
        let pods = self.owed.pods.iter().chain(&self.planned.pods);
        for pod in pods.chain(&self.started_by_recovery) {
            state::check_name(pod).map_err(|d| bad(format!("pods {pod}"), d))?;
        }
        if let Some(s) = &self.stopped {
            s.check(root).map_err(|(entry, d)| bad(entry, d))?;
        }
        Ok(())
    }
}

/// The pass's record of the pod it stops ([`StopRecord`]): written before the stop, cleared
/// after the start.
pub struct Recorder<'a> {
    state: &'a mut PassState,
    root: &'a Path,
}

impl PassState {
    /// The [`StopRecord`] the restart stage writes through.
    pub fn recorder<'a>(&'a mut self, root: &'a Path) -> Recorder<'a> {
        Recorder { state: self, root }
    }
}

impl StopRecord for Recorder<'_> {
    fn stopping(&mut self, stopped: &Stopped) -> Result<(), RestartError> {
        let (state, root) = (&mut *self.state, self.root);
        let touched = &mut state.this_process.stopped;
        if !touched.iter().any(|s| s.pod == stopped.pod) {
            touched.push(stopped.clone());
        }
        state.stopped = Some(stopped.clone());
        state.stage = Stage::Restarting;
        state.write(root).map_err(|e| RestartError {
            component: stopped.component,
            message: format!(
                "cannot record the stop of static pod '{}' in '{}': {e}; it was not stopped",
                stopped.pod,
                path(root, PASS_STATE).display()
            ),
        })
    }

    fn started(&mut self, pod: &str) {
        let (state, root) = (&mut *self.state, self.root);
        if state.stopped.as_ref().is_some_and(|s| s.pod == pod) {
            state.stopped = None;
            if let Err(e) = state.write(root) {
                // The record still names the pod: the next command starts it again (a no-op
                // for a running pod) and says so.
                log::warn!("cannot record that static pod '{pod}' was started again: {e}");
            }
        }
    }

    fn api_used(&mut self, stats: &ApiStats) {
        self.state.this_process.api.add(stats);
    }
}

/// Recovery, under the lock and after the transaction's: settles the renewal a stopped run
/// was writing (owed only if its transaction was journaled), and makes sure the pod it left
/// stopped is enabled again, reading what is live first (its API calls retried within
/// `bound`; what they met is added to `stats`). Returns what it did, for the log.
pub fn recover(
    root: &Path,
    txn: &Recovery,
    (bound, poll): (std::time::Duration, std::time::Duration),
    stats: &mut ApiStats,
) -> Result<Vec<String>, OpsError> {
    let mut s = PassState::load(root)?;
    if s.is_idle() {
        return Ok(vec![]);
    }
    let mut said = Vec::new();
    if matches!(s.stage, Stage::Planned | Stage::Committing) {
        settle_interrupted_write(root, txn, &mut s, &mut said)?;
    }
    if let Some(stopped) = s.stopped.clone() {
        let ensured =
            restart::ensure_enabled(root, &stopped, (bound, poll), stats).map_err(|e| {
                OpsError::RecoverRestart(RestartError {
                    component: e.component,
                    message: format!(
                        "{}; static pod '{}' may be stopped: start it again (kubeadm: move its \
                     manifest back into the manifests folder; Bottlerocket: apiclient set \
                     settings.kubernetes.static-pods.{}.enabled=true from the admin container)",
                        e.message, stopped.pod, stopped.pod
                    ),
                })
            })?;
        let started = ensured == Ensured::Started;
        if started {
            said.push(format!(
                "started static pod '{}' again, which an interrupted run had {}",
                stopped.pod,
                if stopped.platform == "bottlerocket" {
                    "disabled"
                } else {
                    "stopped"
                }
            ));
        } else {
            log::info!(
                "the record of an interrupted run names static pod '{}' as stopped; it is enabled \
                 and its manifest is in place: nothing to do",
                stopped.pod
            );
        }
        s.stopped = None;
        let owed = s.owed.pods.contains(&stopped.pod)
            || stopped
                .component
                .is_some_and(|c| s.owed.components.contains(&c));
        if started && owed {
            s.started_by_recovery.push(stopped.pod.clone());
        }
        let owed = s.owed.clone();
        s.owe(root, owed)?;
    }
    Ok(said)
}

/// A pass stopped while `planned` or `committing`: its restarts are owed only if its
/// transaction reached its journal (the files changed).
fn settle_interrupted_write(
    root: &Path,
    txn: &Recovery,
    s: &mut PassState,
    said: &mut Vec<String>,
) -> Result<(), OpsError> {
    // A transaction recovery undid from its backup (a damaged staged file) renewed nothing.
    let journaled = s
        .committing
        .as_deref()
        .filter(|id| txn::backup_complete(root, id))
        .filter(|_| !matches!(txn, Recovery::Undone { .. }));
    match journaled {
        Some(id) => {
            let id = id.to_string();
            said.push(format!(
                "an interrupted pass renewed files (backup {id}); the restarts it planned are owed"
            ));
            s.written(root, &id)
        }
        None => {
            if !matches!(txn, Recovery::Clean) || !s.planned.is_empty() {
                said.push(
                    "an interrupted pass stopped before it changed any file; nothing new is owed"
                        .into(),
                );
            }
            s.planned = Restarts::default();
            s.committing = None;
            let owed = s.owed.clone();
            s.owe(root, owed)
        }
    }
}

fn path(root: &Path, name: &str) -> PathBuf {
    txn::state_dir(root).join(name)
}

fn remove(root: &Path, name: &str) -> Result<(), OpsError> {
    let p = path(root, name);
    state::remove(&p).map_err(|source| OpsError::Pending {
        path: p.display().to_string(),
        source,
    })
}

/// An earlier release's owed restarts (`pending-restarts.json`, versions 1 and 2), checked as
/// that release checked it.
fn legacy_owed(root: &Path) -> Result<Option<PassState>, OpsError> {
    #[derive(Deserialize)]
    struct Pending {
        components: Vec<Component>,
        #[serde(default)]
        pods: Vec<String>,
        backup_id: Option<String>,
    }
    let path = path(root, LEGACY_OWED);
    let Some((_, p)) =
        state::read::<Pending>(Kind::OwedRestarts, &path).map_err(OpsError::OwedRestarts)?
    else {
        return Ok(None);
    };
    let bad = |entry: String, d| {
        OpsError::OwedRestarts(StateError::entry(Kind::OwedRestarts, &path, entry, d))
    };
    if let Some(id) = &p.backup_id {
        state::check_name(id).map_err(|d| bad(format!("backup_id {id}"), d))?;
    }
    for pod in &p.pods {
        state::check_name(pod).map_err(|d| bad(format!("pods {pod}"), d))?;
    }
    Ok(Some(PassState {
        stage: Stage::Written,
        backup_id: p.backup_id,
        owed: Restarts {
            components: p.components,
            pods: p.pods,
        },
        legacy: true,
        ..PassState::default()
    }))
}

/// An earlier release's record of a stopped pod (`restart.json`), checked as that release
/// checked it.
fn legacy_marker(root: &Path) -> Result<Option<Stopped>, OpsError> {
    let path = path(root, LEGACY_MARKER);
    let stop = |e: StateError| {
        OpsError::RecoverRestart(RestartError {
            component: None,
            message: format!(
                "{e}; nothing was changed. A static pod may be stopped: start it again \
                 (kubeadm: move its manifest from {} back to {}; Bottlerocket: enable it with \
                 apiclient), then remove the marker",
                crate::node::catalog::paths::PARKED_MANIFESTS,
                crate::node::catalog::paths::KUBEADM_MANIFESTS
            ),
        })
    };
    let Some((_, stopped)) = state::read::<Stopped>(Kind::RestartMarker, &path).map_err(stop)?
    else {
        return Ok(None);
    };
    stopped.check(root).map_err(|(entry, detail)| {
        stop(StateError::entry(Kind::RestartMarker, &path, entry, detail))
    })?;
    Ok(Some(stopped))
}

/// The restarts owed to the node and the backup they would roll back to (`status`).
pub fn owed(root: &Path) -> Result<(Restarts, Option<String>), OpsError> {
    let s = PassState::load(root)?;
    Ok((s.owed, s.backup_id))
}
