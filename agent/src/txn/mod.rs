//! Transactions: every change certrotor makes to a node's PKI is all-or-nothing, even across a
//! crash or a power loss.
//!
//! A transaction takes a list of [`Change`]s (new content for a file, or its removal) and:
//! 1. writes every new file into a staging folder next to its live file (same folder, so the same
//!    filesystem, so `rename` is atomic), with the live file's mode and owner;
//! 2. copies every live file it will replace into a backup (`var/lib/certrotor/backups/<id>`,
//!    mode 0700), with a manifest; then fsyncs each staged file and copy, and each folder that
//!    got a new entry, all at once ([`fsutil::SyncBatch`]), and waits for all of them;
//! 3. writes a journal (`var/lib/certrotor/journal.json`) naming every staged file, fsynced;
//! 4. renames each staged file over its live file, then fsyncs each folder renamed into once;
//! 5. removes the journal, then the staging folders, then old backups beyond the retention.
//!
//! Durability rests on order, not on syncing after every step: everything the journal names is
//! durable before the journal is written, and every rename is durable before the journal is
//! removed (ARCHITECTURE.md "Durability").
//!
//! Before step 3 the live PKI is untouched; a crash leaves only staging leftovers, which the
//! next run removes. From step 3 on the journal exists, and the next certrotor command of any
//! kind (all of them call [`recover`] under the lock) rolls the transaction forward: every
//! staged file was validated and synced before the journal was written, so finishing the
//! renames is always possible. Each staged copy still waiting is checked against its journaled
//! SHA-256 first: one damaged since makes recovery restore the backup instead, so nothing
//! damaged goes live (issue 30.10). An exclusive lock (`var/lib/certrotor/lock`) keeps two runs from
//! interleaving.
//!
//! What this module does not do: decide what to write (renewal does), or check certificates
//! (validation happens before a transaction starts).
//!
//! Implementation note: failpoints (`CERTROTOR_FAILPOINT`, see [`failpoint`]) stop the process
//! at every step, so tests can prove the claims above.

use std::fmt;
use std::fs::{self};
use std::io;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sys::state::StateError;

/// Name of the staging folder created next to live files during a transaction.
const STAGING_PREFIX: &str = ".certrotor-staging-";
/// The journal file, relative to the state folder.
const JOURNAL: &str = "journal.json";
/// A backup's manifest, inside its folder.
const MANIFEST: &str = "manifest.json";
/// Kinds of transactions (journal and manifest `kind`).
const KINDS: [&str; 4] = ["renew", "rollback", "import", "ca"];
/// How often a waiting run retries the lock. Waiting is bounded by the caller's timeout.
const LOCK_POLL: Duration = Duration::from_millis(100);
/// Backups kept by default.
pub const DEFAULT_RETENTION: usize = 5;

/// `Change::mode_if_new` of a symbolic link (the file-type bits of `st_mode`): the change's
/// content is the link's target, and the live path is the link itself, never resolved (the
/// kubelet's `kubelet-client-current.pem`, see [`crate::node::kubelet`]).
pub const SYMLINK: u32 = 0o120_000;

/// New content for one live file.
pub struct Change {
    /// Path relative to the node root.
    pub rel: String,
    /// The new bytes, or `None` to remove the file.
    pub content: Option<Vec<u8>>,
    /// Mode for a file that does not exist yet (existing files keep theirs).
    pub mode_if_new: u32,
}

impl fmt::Debug for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Content may be a private key: never print it.
        write!(
            f,
            "Change({}, {} bytes)",
            self.rel,
            self.content.as_ref().map_or(0, Vec::len)
        )
    }
}

impl Drop for Change {
    fn drop(&mut self) {
        // Volatile writes (zeroize), which the optimiser cannot remove before the free.
        zeroize::Zeroize::zeroize(&mut self.content);
    }
}

/// A transaction failure. Every variant says whether the live PKI was touched.
#[derive(Debug)]
pub enum TxnError {
    /// Another run holds the lock.
    Locked {
        path: String,
        holder: String,
        waited: Duration,
    },
    /// Preparing failed (staging, backup, journal): the live PKI is unchanged.
    Prepare {
        step: &'static str,
        path: String,
        source: io::Error,
    },
    /// Committing failed half-way; the journal remains and the next run completes it.
    Commit { path: String, source: io::Error },
    /// A rename failed after the journal, and the files already replaced were restored from the
    /// backup: the live PKI is as before.
    RolledBack {
        path: String,
        source: io::Error,
        backup_id: String,
    },
    /// The state folder or a backup could not be read.
    State { path: String, detail: String },
    /// A state file (journal, backup manifest) is unreadable, of an unknown version, or names
    /// something it must not; nothing was changed.
    StateFile(StateError),
}

impl From<StateError> for TxnError {
    fn from(e: StateError) -> TxnError {
        TxnError::StateFile(e)
    }
}

impl fmt::Display for TxnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TxnError::Locked {
                path,
                holder,
                waited,
            } => write!(
                f,
                "another certrotor ({holder}) holds the lock '{path}'; gave up after {}s. \
                 Wait for it to finish, or raise --lock-timeout",
                waited.as_secs()
            ),
            TxnError::Prepare { step, path, source } => write!(
                f,
                "failed to {step} '{path}': {source}; nothing was changed on the node{}",
                hint(source)
            ),
            TxnError::Commit { path, source } => write!(
                f,
                "failed to replace '{path}': {source}; the journal is kept and the next certrotor \
                 command completes the change{}",
                hint(source)
            ),
            TxnError::RolledBack {
                path,
                source,
                backup_id,
            } => write!(
                f,
                "failed to replace '{path}': {source}{}; the files already replaced were \
                 restored from backup {backup_id}, so the live PKI is unchanged",
                hint(source)
            ),
            TxnError::State { path, detail } => write!(f, "certrotor state '{path}': {detail}"),
            TxnError::StateFile(e) => write!(f, "{e}; nothing was changed"),
        }
    }
}

impl std::error::Error for TxnError {}

fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => " (the disk is full: free space, then run again)",
        Some(libc::EROFS) => " (the filesystem is read-only: run where the PKI is writable)",
        Some(libc::EACCES) | Some(libc::EPERM) if !running_as_root() => {
            " (permission denied: run as root)"
        }
        Some(libc::EPERM) => {
            " (refused even to root: an immutable or append-only attribute ('lsattr'), or a \
             bind-mounted file ('findmnt'))"
        }
        _ => "",
    }
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective user).
fn running_as_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// The journal: what a committing transaction is doing (state file, see [`crate::sys::state`]).
#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    #[serde(default)]
    version: u32,
    kind: String,
    backup_id: String,
    files: Vec<JournalFile>,
    staging_dirs: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
struct JournalFile {
    rel: String,
    /// Staged file (relative to the root); `None` when the file is removed.
    staged: Option<String>,
    new_sha256: Option<String>,
}

/// One file in a backup manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupFile {
    pub path: String,
    /// Whether the file existed before the transaction (if not, restoring removes it).
    pub existed: bool,
    pub sha256: Option<String>,
    /// Size in bytes (manifest version 2 on; version 1 recorded only the SHA-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    pub mode: Option<u32>,
    /// A symbolic link: its target (no copy in `files/`; `sha256` and `size` are the target's
    /// text). Absent for regular files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// A backup's manifest (`manifest.json`, state file, see [`crate::sys::state`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackupManifest {
    /// 1 (no `version` field, no sizes) or 2.
    #[serde(default)]
    pub version: u32,
    pub id: String,
    pub created_at: String,
    pub kind: String,
    pub files: Vec<BackupFile>,
}

/// What a committed transaction did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub backup_id: String,
    pub files: Vec<String>,
}

/// What recovery found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// No journal, no leftovers.
    Clean,
    /// Staging folders left by an earlier run were removed: `with_files` still held staged
    /// files (a preparation interrupted before its journal: the PKI was untouched), `empty`
    /// held none (a transaction that completed, killed before it removed them, or one
    /// interrupted before it staged anything: the PKI is whole either way).
    DiscardedStaging { with_files: usize, empty: usize },
    /// An interrupted commit was completed.
    RolledForward {
        kind: String,
        backup_id: String,
        files: usize,
    },
    /// A staged file of an interrupted commit was damaged (its SHA-256 is not the journaled
    /// one): the transaction was undone from its backup instead, before that file went live.
    Undone {
        kind: String,
        backup_id: String,
        /// The live file whose staged copy was damaged.
        damaged: String,
    },
}

use apply::{Txn, damaged_staged_file, live_content, restore_journaled, sha256_hex};
use backups::{backups_dir, prune_backups};
use protocol::{commit, finalize_backup, prepare_and_commit, remove_staging};
use recovery::remove_incomplete_backups;
mod lock;
pub use lock::{Lock, lock, rotation_lock, state_dir};
mod failpoints;
pub use failpoints::failpoint;
mod apply;
pub use apply::{apply, apply_with, backup_complete, resolve_and_probe};
mod protocol;
#[cfg(test)]
pub(crate) use protocol::next_backup_id;
mod recovery;
pub use recovery::recover;
mod backups;
pub use backups::{BackupInfo, list_backups, newest_restorable, restore_changes};
/// Tests of transactions against a hostile node: renames that fail after the journal, and other
/// failures the commit protocol must undo.
#[cfg(test)]
mod hostile_tests {
    use super::apply::undo_failed_commit;
    use super::*;
    use crate::lab::LabOptions;
    use std::fs::{self};
    use std::time::Duration;

    /// 15.3: a rename that fails after the journal (here: `etcd/peer.crt` made immutable after
    /// the probe, which this test bypasses) rolls back the files already replaced, from the
    /// backup, and says so; nothing is left for the next run to "complete".
    #[test]
    fn a_failed_rename_rolls_the_transaction_back() {
        let root = std::env::temp_dir().join(format!("certrotor-undo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let now = crate::sys::clock::Clock::now(&crate::sys::clock::SystemClock);
        crate::lab::init(&root, &LabOptions::for_tests(now)).unwrap();
        let pki = "etc/kubernetes/pki/etcd";
        let rels = [format!("{pki}/peer.key"), format!("{pki}/peer.crt")];
        let before: Vec<Vec<u8>> = rels
            .iter()
            .map(|r| fs::read(root.join(r)).unwrap())
            .collect();
        // New content: the pair swapped with the server pair (valid PEM, different bytes).
        let changes: Vec<Change> = ["server.key", "server.crt"]
            .iter()
            .zip(&rels)
            .map(|(src, rel)| Change {
                rel: rel.clone(),
                content: Some(fs::read(root.join(pki).join(src)).unwrap()),
                mode_if_new: 0o600,
            })
            .collect();
        let crt = root.join(&rels[1]);
        let chattr = |flag: &str| {
            std::process::Command::new("chattr")
                .args([flag, &crt.display().to_string()])
                .status()
                .expect("chattr (e2fsprogs) is needed")
                .success()
        };
        assert!(chattr("+i"), "chattr +i failed: needs root on ext4/xfs");
        let _lock = lock(&root, Duration::ZERO).unwrap();
        let result = undo_failed_commit(
            &root,
            prepare_and_commit(
                &root,
                &changes,
                &Txn {
                    kind: "renew",
                    now,
                    retention: 5,
                    txid: "undo-test",
                },
                &mut |_| Ok(()),
            ),
        );
        chattr("-i");
        let Err(err) = result else {
            panic!("the rename must fail")
        };
        assert!(matches!(err, TxnError::RolledBack { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("peer.crt") && text.contains("restored from backup"),
            "{text}"
        );
        assert!(!text.contains("run as root"), "{text}");
        for (rel, old) in rels.iter().zip(&before) {
            assert_eq!(&fs::read(root.join(rel)).unwrap(), old, "{rel} restored");
        }
        assert!(!state_dir(&root).join(JOURNAL).exists(), "journal removed");
        assert!(matches!(recover(&root), Ok(Recovery::Clean)));
        let _ = fs::remove_dir_all(&root);
    }
}
