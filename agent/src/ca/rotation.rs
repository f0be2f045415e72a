//! A CA rotation's state on this node, persisted (`var/lib/certrotor/ca-rotation.json`,
//! versioned): which CA, its old and new certificates (SHA-256, never a key), and the stage
//! reached. One rotation at a time; this module is its only reader and writer.
//!
//! A stage is written *before* its files change (`trust-in`, `issue`, `trust-out`, `abort`:
//! in progress) and again once its files are written and what reads them restarted and
//! verified (`trusted`, `issued`, `done`, `aborted`). A command finding a stage in progress
//! does it again: each stage makes the files what they must be, so doing it twice is doing it
//! once ([`crate::ca::rotate`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ca::consumers::CaName;
use crate::sys::fsutil;
use crate::sys::state::{self, Kind, StateError};
use crate::txn;

/// The state file, under the state folder.
pub const ROTATION_STATE: &str = "ca-rotation.json";

/// The stages, in order (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Every trust file gets [old, new]; the new CA's key waits beside the old one.
    TrustIn,
    Trusted,
    /// The new CA signs ([new, old], its key the CA key) and every leaf is issued again.
    Issue,
    Issued,
    /// Every trust file holds the new CA alone; the old key is removed.
    TrustOut,
    Done,
    /// Back to the old CA alone (before trust-out only).
    Abort,
    Aborted,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::TrustIn => "trust-in",
            Stage::Trusted => "trusted",
            Stage::Issue => "issue",
            Stage::Issued => "issued",
            Stage::TrustOut => "trust-out",
            Stage::Done => "done",
            Stage::Abort => "abort",
            Stage::Aborted => "aborted",
        }
    }

    /// Whether the rotation is over (a new one may begin).
    pub fn finished(self) -> bool {
        matches!(self, Stage::Done | Stage::Aborted)
    }
}

/// When a stage was reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reached {
    pub stage: Stage,
    /// RFC 3339.
    pub at: String,
}

/// The persisted rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotation {
    pub version: u32,
    pub ca: CaName,
    pub stage: Stage,
    /// SHA-256 of the old CA certificate (hex).
    pub old_sha256: String,
    /// SHA-256 of the new CA certificate (hex); empty until one is made.
    pub new_sha256: String,
    /// Every stage reached, in order.
    #[serde(default)]
    pub history: Vec<Reached>,
}

/// The state file of the node under `root`.
pub fn path(root: &Path) -> PathBuf {
    txn::state_dir(root).join(ROTATION_STATE)
}

impl Rotation {
    pub fn new(ca: CaName, old_sha256: String) -> Rotation {
        Rotation {
            version: Kind::CaRotation.current(),
            ca,
            stage: Stage::TrustIn,
            old_sha256,
            new_sha256: String::new(),
            history: Vec::new(),
        }
    }

    /// The rotation recorded on the node under `root`: `None` when there is none. A file that
    /// exists but cannot be used is an error, never "no rotation".
    pub fn load(root: &Path) -> Result<Option<Rotation>, StateError> {
        let path = path(root);
        let Some((_, r)) = state::read::<Rotation>(Kind::CaRotation, &path)? else {
            return Ok(None);
        };
        let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(&r.old_sha256) || !(r.new_sha256.is_empty() || hex(&r.new_sha256)) {
            return Err(StateError::new(
                Kind::CaRotation,
                &path,
                "names a certificate by something other than a SHA-256; it is damaged",
            ));
        }
        Ok(Some(r))
    }

    /// Moves to `stage` and writes the file (durably: renamed into place, folder synced).
    pub fn enter(&mut self, root: &Path, stage: Stage, now: i64) -> std::io::Result<()> {
        self.stage = stage;
        self.version = Kind::CaRotation.current();
        // Entered again (a new CA made after a crash): the first time stays the record.
        if self.history.last().map(|h| h.stage) != Some(stage) {
            self.history.push(Reached {
                stage,
                at: crate::sys::clock::rfc3339(now),
            });
        }
        fsutil::create_dir_all_mode(&txn::state_dir(root), 0o700)?;
        state::write(&path(root), self)
    }
}
