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

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::node::catalog::paths::STATE_DIR;
use crate::node::files::NodeFiles;
use crate::sys::fsutil::{self, FileMeta};
use crate::sys::state::{self, Kind, StateError};

/// Name of the staging folder created next to live files during a transaction.
const STAGING_PREFIX: &str = ".certrotor-staging-";
/// The journal file, relative to the state folder.
const JOURNAL: &str = "journal.json";
/// A backup's manifest, inside its folder.
const MANIFEST: &str = "manifest.json";
/// Kinds of transactions (journal and manifest `kind`).
const KINDS: [&str; 3] = ["renew", "rollback", "import"];
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

// === Lock ===

/// The exclusive lock; released when dropped.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// The state folder (`var/lib/certrotor`) under the root, resolved as reads and PKI writes
/// resolve it ([`fsutil::resolve_for_write`]): symlinks followed inside the root, absolute
/// targets re-rooted, never above the root. Where it cannot be resolved inside the root, the
/// path as named: [`lock`], which every command that writes takes first, refuses it, so
/// nothing is ever written there.
pub fn state_dir(root: &Path) -> PathBuf {
    match fsutil::resolve_for_write(root, STATE_DIR) {
        Ok(rel) => root.join(rel),
        Err(_) => root.join(STATE_DIR),
    }
}

/// [`state_dir`], created (0700) if missing, or why it cannot hold certrotor's state: it leads
/// outside the root, or it is a symlink to nothing or something other than a folder.
fn checked_state_dir(root: &Path) -> Result<PathBuf, io::Error> {
    let rel = fsutil::resolve_for_write(root, STATE_DIR).map_err(|e| {
        io::Error::other(format!(
            "{e}; certrotor keeps its state (backups holding private keys, the journal) inside \
             the node root only"
        ))
    })?;
    let dir = root.join(rel);
    if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io::Error::other(
            "it is a symlink to a folder that does not exist inside the node root; remove it, \
             or create the folder it names inside the root",
        ));
    }
    fsutil::create_dir_all_mode(&dir, 0o700)?;
    if !fs::symlink_metadata(&dir)?.is_dir() {
        return Err(io::Error::other("it is not a folder"));
    }
    Ok(dir)
}

/// Opens the lock file without following a symlink at its name and without blocking (a FIFO
/// would block an open until a writer comes), created 0600 whatever the umask, and accepts only
/// a regular file.
fn open_lock(path: &Path) -> Result<File, io::Error> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::other(
                    "it is a symlink; certrotor makes its lock file itself, so something else \
                     put it there: remove it after checking what it points to",
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other(
            "it is not a regular file (a FIFO or a device?); certrotor makes its lock file \
             itself: remove it",
        ));
    }
    if meta.permissions().mode() & 0o7777 != 0o600 {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// Takes the exclusive lock, waiting at most `timeout`.
pub fn lock(root: &Path, timeout: Duration) -> Result<Lock, TxnError> {
    let prep = |path: &Path, source| TxnError::Prepare {
        step: "create the lock",
        path: path.display().to_string(),
        source,
    };
    let dir = checked_state_dir(root).map_err(|e| prep(&root.join(STATE_DIR), e))?;
    let path = dir.join("lock");
    let mut file = open_lock(&path).map_err(|e| prep(&path, e))?;
    let start = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) => {
                if start.elapsed() >= timeout {
                    // The holder's text, from the file opened (never through a name again).
                    let mut text = String::new();
                    let _ = io::Read::read_to_string(&mut io::Read::take(&file, 256), &mut text);
                    let holder = if text.trim().is_empty() {
                        "unknown pid".into()
                    } else {
                        text.trim().to_string()
                    };
                    return Err(TxnError::Locked {
                        path: path.display().to_string(),
                        holder,
                        waited: start.elapsed(),
                    });
                }
                std::thread::sleep(LOCK_POLL);
            }
            Err(fs::TryLockError::Error(e)) => return Err(prep(&path, e)),
        }
    }
    let _ = file.set_len(0);
    let _ = write!(file, "pid {}", std::process::id());
    Ok(Lock { _file: file })
}

// === Failpoints ===

/// Stops the process at a named step when `CERTROTOR_FAILPOINT` says so. Tests only; not
/// documented for operators.
///
/// `CERTROTOR_FAILPOINT=N` stops at the N-th failpoint reached, `=NAME` at the first with that
/// name. The process is killed with SIGKILL (no destructors, no flush: like a power loss, as far
/// as a process can tell). With `CERTROTOR_FAILPOINT_ACTION=pause` it prints
/// `CERTROTOR-FAILPOINT <name>` to stderr and waits forever, so that a VM test can cut the power
/// at that instant.
///
/// Only with the cargo feature `failpoints` (the tests enable it); the shipped binary has an
/// empty function here and does not read the variable.
#[cfg(feature = "failpoints")]
pub fn failpoint(name: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let Ok(wanted) = std::env::var("CERTROTOR_FAILPOINT") else {
        return;
    };
    let n = COUNTER.fetch_add(1, Ordering::SeqCst) + 1;
    let hit = match wanted.parse::<usize>() {
        Ok(k) => k == n,
        Err(_) => wanted == name,
    };
    if !hit {
        return;
    }
    eprintln!("CERTROTOR-FAILPOINT {name} (#{n})");
    if std::env::var("CERTROTOR_FAILPOINT_ACTION").as_deref() == Ok("pause") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    std::process::abort();
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn failpoint(_name: &str) {}

// === Applying ===

fn sha256_hex(data: &[u8]) -> String {
    crate::pki::hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data).as_ref())
}

/// Applies `changes` under `root` as one transaction of `kind` (`renew`, `rollback`,
/// `import`). The caller holds the lock. Keeps `retention` backups.
pub fn apply(
    root: &Path,
    changes: &[Change],
    kind: &str,
    now: i64,
    retention: usize,
) -> Result<Outcome, TxnError> {
    apply_with(root, changes, kind, now, retention, &mut |_| Ok(()))
}

/// [`apply`], calling `before_journal` with the backup id once the staged files and the backup
/// are durable and before the journal is written: what the caller records there is true from
/// the moment the transaction can no longer be discarded (until the journal exists, a crash or
/// an error discards everything; once it exists, the transaction completes, and its backup is
/// complete: [`backup_complete`]). An error from `before_journal` discards the transaction.
pub fn apply_with(
    root: &Path,
    changes: &[Change],
    kind: &str,
    now: i64,
    retention: usize,
    before_journal: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<Outcome, TxnError> {
    let txid = format!(
        "{}-{}",
        crate::sys::clock::compact_stamp(now),
        std::process::id()
    );
    let resolved = resolve_and_probe(root, changes)?;
    let changes = &resolved[..];
    let txn = Txn {
        kind,
        now,
        retention,
        txid: &txid,
    };
    let result = undo_failed_commit(
        root,
        prepare_and_commit(root, changes, &txn, before_journal),
    );
    if let Err(TxnError::Prepare { .. } | TxnError::Locked { .. }) = &result {
        // Nothing live was touched: remove what was staged, and the unjournaled backup (copies
        // of the old keys), as recovery would.
        remove_staging(root, changes, &txid);
        remove_incomplete_backups(root);
    }
    result
}

/// Whether backup `id` is complete: its transaction reached its journal (and so completes,
/// now or at the next recovery), or it was made before.
pub fn backup_complete(root: &Path, id: &str) -> bool {
    state::check_name(id).is_ok() && backups_dir(root).join(id).join(MANIFEST).is_file()
}

/// What a transaction is, besides its changes.
struct Txn<'a> {
    kind: &'a str,
    now: i64,
    retention: usize,
    txid: &'a str,
}

/// Before anything is staged: resolves every change's path as reads resolve it (symlinks inside
/// the root, absolute targets re-rooted, never above the root), and proves every live file can
/// be replaced by a rename: a regular file, not immutable or append-only, not a mount point (a
/// bind-mounted file), in a folder on the same filesystem. A refusal here leaves everything
/// unchanged.
pub fn resolve_and_probe(root: &Path, changes: &[Change]) -> Result<Vec<Change>, TxnError> {
    let mounts = mount_points();
    let mut out = Vec::with_capacity(changes.len());
    for change in changes {
        let refuse = |why: String| TxnError::Prepare {
            step: "check that it can be replaced",
            path: root.join(&change.rel).display().to_string(),
            source: io::Error::other(why),
        };
        if change.mode_if_new == SYMLINK {
            out.push(probe_link(root, change).map_err(refuse)?);
            continue;
        }
        let rel =
            fsutil::resolve_for_write(root, &change.rel).map_err(|e| refuse(e.to_string()))?;
        let live = root.join(&rel);
        match fs::symlink_metadata(&live) {
            Ok(meta) => {
                if !meta.file_type().is_file() {
                    return Err(refuse("it is not a regular file".into()));
                }
                let canonical = fs::canonicalize(&live).unwrap_or_else(|_| live.clone());
                if mounts.contains(&canonical) {
                    return Err(refuse(
                        "it is a mount point (a bind-mounted file), which a rename cannot \
                         replace; unmount it, or renew where the file really is"
                            .into(),
                    ));
                }
                let parent = live.parent().unwrap_or(root);
                let parent_dev =
                    fs::metadata(parent).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
                if parent_dev.ok() != Some(std::os::unix::fs::MetadataExt::dev(&meta)) {
                    return Err(refuse(
                        "it is on another filesystem than its folder (a mount), which a \
                         rename cannot replace"
                            .into(),
                    ));
                }
                // Opening for writing (without truncating) fails with EPERM on an immutable or
                // append-only file, even for root; rename would fail the same way.
                if let Err(e) = fs::OpenOptions::new().write(true).open(&live)
                    && e.raw_os_error() == Some(libc::EPERM)
                {
                    return Err(refuse(
                        "it is immutable or append-only (see 'lsattr'); remove the \
                         attribute with 'chattr -i -a' if that is intended, then run again"
                            .into(),
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(refuse(e.to_string())),
        }
        out.push(Change {
            rel,
            content: change.content.clone(),
            mode_if_new: change.mode_if_new,
        });
    }
    Ok(out)
}

/// A link change: its folder resolved as reads resolve it, the link itself never followed; the
/// live path must be a symlink or absent (the kubelet refuses a regular file there too).
fn probe_link(root: &Path, change: &Change) -> Result<Change, String> {
    let (folder, name) = change
        .rel
        .rsplit_once('/')
        .ok_or_else(|| "a link must be inside a folder".to_string())?;
    let folder = fsutil::resolve_for_write(root, folder).map_err(|e| e.to_string())?;
    let rel = format!("{folder}/{name}");
    match fs::symlink_metadata(root.join(&rel)) {
        Ok(m) if !m.file_type().is_symlink() => {
            return Err("it is not a symbolic link (the kubelet expects one there)".into());
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(Change {
        rel,
        content: change.content.clone(),
        mode_if_new: SYMLINK,
    })
}

/// The current content of a live path as a change sees it: a link's target, or a file's bytes.
fn live_content(live: &Path, link: bool) -> Option<Vec<u8>> {
    if link {
        fs::read_link(live)
            .ok()
            .map(|t| t.as_os_str().as_encoded_bytes().to_vec())
    } else {
        fs::read(live).ok()
    }
}

/// When a rename failed after the journal was written (a file became unreplaceable after the
/// probe), rolls the transaction back from its backup at once rather than leaving a
/// half-renewed PKI for the next run: every live file that differs from the backup is restored
/// by an atomic rename, then the journal and staging are removed. If the rollback itself fails,
/// the original error is returned and the journal kept.
fn undo_failed_commit(root: &Path, result: Result<Outcome, TxnError>) -> Result<Outcome, TxnError> {
    let Err(TxnError::Commit { path, source }) = result else {
        return result;
    };
    let journal_path = state_dir(root).join(JOURNAL);
    let undo = || -> Result<String, String> {
        let (_, journal) = state::read::<Journal>(Kind::Journal, &journal_path)
            .map_err(|e| e.to_string())?
            .ok_or("no journal")?;
        restore_journaled(root, &journal)
    };
    match undo() {
        Ok(backup_id) => Err(TxnError::RolledBack {
            path,
            source,
            backup_id,
        }),
        Err(why) => {
            log::error!("rolling back the failed transaction failed too: {why}");
            Err(TxnError::Commit { path, source })
        }
    }
}

/// Undoes a journaled transaction from its backup: every live file that differs from the
/// backup is restored by an atomic rename, then the journal and the staging folders are
/// removed. Returns the backup's id.
fn restore_journaled(root: &Path, journal: &Journal) -> Result<String, String> {
    let journal_path = state_dir(root).join(JOURNAL);
    let (_, restore) = restore_changes(root, &journal.backup_id).map_err(|e| e.to_string())?;
    for change in &restore {
        let live = root.join(&change.rel);
        let link = change.mode_if_new == SYMLINK;
        let current = live_content(&live, link);
        match &change.content {
            Some(old) if link && current.as_deref() != Some(&old[..]) => {
                let tmp = live.with_file_name(".certrotor-undo-link");
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(old), &tmp)
                    .and_then(|()| fs::rename(&tmp, &live))
                    .and_then(|()| fsutil::sync_dir(live.parent().unwrap_or(root)))
                    .map_err(|e| format!("'{}': {e}", live.display()))?;
            }
            Some(old) if current.as_deref() != Some(&old[..]) => {
                let parent = live.parent().unwrap_or(root);
                let tmp = parent.join(format!(
                    ".certrotor-undo-{}",
                    live.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default()
                ));
                let _ = fs::remove_file(&tmp);
                // The replaced file kept the old owner; the restored one keeps it too.
                let owner = FileMeta::of(&live).ok().map(|m| (m.uid, m.gid));
                fsutil::write_new(&tmp, old, change.mode_if_new, owner)
                    .and_then(|()| fs::rename(&tmp, &live))
                    .and_then(|()| fsutil::sync_dir(parent))
                    .map_err(|e| format!("'{}': {e}", live.display()))?;
            }
            None if current.is_some() || fs::symlink_metadata(&live).is_ok() => {
                fs::remove_file(&live).map_err(|e| format!("'{}': {e}", live.display()))?
            }
            _ => {}
        }
    }
    state::remove(&journal_path).map_err(|e| e.to_string())?;
    for d in &journal.staging_dirs {
        let _ = fs::remove_dir_all(root.join(d));
    }
    Ok(journal.backup_id.clone())
}

/// The first journaled file whose staged copy, still waiting to be renamed into place, does not
/// hold the journaled content (its SHA-256): damaged on disk since it was validated and synced.
fn damaged_staged_file(root: &Path, journal: &Journal) -> Option<String> {
    let node = NodeFiles::of(root);
    journal.files.iter().find_map(|file| {
        let staged = root.join(file.staged.as_ref()?);
        let want = file.new_sha256.as_ref()?;
        fs::symlink_metadata(&staged).ok()?;
        let got = live_content(&staged, node.is_link(&file.rel)).map(|b| sha256_hex(&b));
        (got.as_deref() != Some(want.as_str())).then(|| file.rel.clone())
    })
}

/// Every mount point of this process's mount namespace (from /proc/self/mountinfo).
fn mount_points() -> BTreeSet<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .collect()
}

/// Decodes mountinfo's octal escapes (`\040` for a space).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn prepare_and_commit(
    root: &Path,
    changes: &[Change],
    txn: &Txn<'_>,
    before_journal: &mut dyn FnMut(&str) -> io::Result<()>,
) -> Result<Outcome, TxnError> {
    let Txn {
        kind,
        now,
        retention,
        txid,
    } = *txn;
    // 1. Stage: write every staged file; the batch (each file once, and each folder that got a
    //    new entry once: the staging folders, the folders holding them, any folder created for
    //    them) is made durable with the backup's below. See ARCHITECTURE.md "Durability".
    let prep = |step, path: &Path| {
        let path = path.display().to_string();
        move |source| TxnError::Prepare { step, path, source }
    };
    let mut journal_files = Vec::new();
    let mut staging_dirs = BTreeSet::new();
    let mut batch = fsutil::SyncBatch::default();
    for change in changes {
        let live = root.join(&change.rel);
        let parent = live.parent().unwrap_or(root).to_path_buf();
        let Some(content) = &change.content else {
            journal_files.push(JournalFile {
                rel: change.rel.clone(),
                staged: None,
                new_sha256: None,
            });
            continue;
        };
        let staging = parent.join(format!("{STAGING_PREFIX}{txid}"));
        let staging_rel = rel_of(root, &staging);
        if staging_dirs.insert(staging_rel.clone()) {
            batch
                .dirs
                .extend(folders_changed_by_creating(&parent, root));
            fsutil::create_dir_all_mode(&parent, 0o755)
                .map_err(prep("create the folder", &parent))?;
            fs::create_dir(&staging).map_err(prep("create the staging folder", &staging))?;
            fs::set_permissions(
                &staging,
                std::os::unix::fs::PermissionsExt::from_mode(0o700),
            )
            .map_err(prep("protect the staging folder", &staging))?;
            batch.dirs.insert(parent.clone());
            batch.dirs.insert(staging.clone());
        }
        let file_name = live
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        let staged = staging.join(&file_name);
        if change.mode_if_new == SYMLINK {
            // The kubelet's way: a new link, renamed over the old one at commit.
            std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(content), &staged)
                .map_err(prep("write the staged link", &staged))?;
            journal_files.push(JournalFile {
                rel: change.rel.clone(),
                staged: Some(format!("{staging_rel}/{file_name}")),
                new_sha256: Some(sha256_hex(content)),
            });
            continue;
        }
        let (mode, owner) = match FileMeta::of(&live) {
            // A private key file is never wider than a new one (0600), even if the old one was.
            Ok(m) if change.rel.ends_with(".key") => {
                (m.mode & change.mode_if_new, Some((m.uid, m.gid)))
            }
            Ok(m) => (m.mode, Some((m.uid, m.gid))),
            Err(_) => (change.mode_if_new, None),
        };
        let file = fsutil::write_new_unsynced(&staged, content, mode, owner)
            .map_err(prep("write the staged file", &staged))?;
        batch.files.push((staged, file));
        failpoint("staged-file");
        journal_files.push(JournalFile {
            rel: change.rel.clone(),
            staged: Some(format!("{staging_rel}/{file_name}")),
            new_sha256: Some(sha256_hex(content)),
        });
    }
    // Every staged file written (not yet durable: a crash from here to the journal discards
    // them with the backup).
    failpoint("staged-all");

    // 2. Back up: the copies join the same batch, and one wait makes both durable before the
    //    journal exists (until then a crash discards staging and backup alike).
    let backup_id = write_backup(root, changes, kind, now, &mut batch)?;
    batch
        .sync()
        .map_err(|(path, e)| prep("sync the staged files and the backup", &path)(e))?;
    failpoint("backed-up");
    before_journal(&backup_id).map_err(|source| TxnError::Prepare {
        step: "record the renewal in the pass state",
        path: state_dir(root).display().to_string(),
        source,
    })?;

    // 3. Journal.
    let journal = Journal {
        version: 1,
        kind: kind.to_string(),
        backup_id: backup_id.clone(),
        files: journal_files,
        staging_dirs: staging_dirs.into_iter().collect(),
    };
    write_journal(root, &journal)?;
    failpoint("journaled");
    finalize_backup(root, &backup_id)?;

    // 4. Swap, 5. clean up.
    commit(root, &journal)?;
    prune_backups(root, retention);
    failpoint("pruned");
    Ok(Outcome {
        backup_id,
        files: changes.iter().map(|c| c.rel.clone()).collect(),
    })
}

/// The folders that get a new entry when `dir` is created with its missing parents (each
/// missing folder's parent), inside `root`; empty when `dir` exists.
fn folders_changed_by_creating(dir: &Path, root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut d = dir;
    while d.starts_with(root) && d != root && fs::symlink_metadata(d).is_err() {
        match d.parent() {
            Some(parent) => {
                out.push(parent.to_path_buf());
                d = parent;
            }
            None => break,
        }
    }
    out
}

fn rel_of(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .to_string()
}

/// The id of a new backup made at `stamp` (`clock::compact_stamp`), given the names in the
/// backup folder. Ids sort in creation order (pruning and rollback rely on it): within one
/// second, count on from the highest suffix present, counting `.incomplete-` ones (never reuse
/// the id of a pruned backup), padded so that "-010" sorts after "-009".
pub(crate) fn next_backup_id(stamp: &str, names: &[String]) -> String {
    let suffix_of = |name: &str| -> Option<u32> {
        let name = name.strip_prefix(".incomplete-").unwrap_or(name);
        if name == stamp {
            return Some(1);
        }
        name.strip_prefix(stamp)?.strip_prefix('-')?.parse().ok()
    };
    match names.iter().filter_map(|n| suffix_of(n)).max() {
        None => stamp.to_string(),
        Some(n) => format!("{stamp}-{:03}", n + 1),
    }
}

/// Writes the backup of the live files `changes` replace, under its `.incomplete-` name: the
/// copies are added to `batch` unsynced (the caller syncs the batch before the journal); the
/// manifest is written durably.
fn write_backup(
    root: &Path,
    changes: &[Change],
    kind: &str,
    now: i64,
    batch: &mut fsutil::SyncBatch,
) -> Result<String, TxnError> {
    let backups = state_dir(root).join("backups");
    let prep = |step, path: &Path| {
        let path = path.display().to_string();
        move |source| TxnError::Prepare { step, path, source }
    };
    fsutil::create_dir_all_mode(&backups, 0o700)
        .map_err(prep("create the backup folder", &backups))?;
    let stamp = crate::sys::clock::compact_stamp(now);
    let names: Vec<String> = fs::read_dir(&backups)
        .map(|list| {
            list.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let id = next_backup_id(&stamp, &names);
    // Build in a temporary folder, renamed into place once the journal names it.
    let tmp = backups.join(format!(".incomplete-{id}"));
    fsutil::create_dir_all_mode(&tmp.join("files"), 0o700)
        .map_err(prep("create the backup", &tmp))?;
    // Every copy and the manifest are written; the caller's batch fsyncs each once and each
    // folder of the backup that got a new entry once (not once per file), with the staged files.
    let mut files = Vec::new();
    for change in changes {
        let live = root.join(&change.rel);
        let dest = tmp.join("files").join(&change.rel);
        match fs::symlink_metadata(&live) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(&live).map_err(prep("read for backup", &live))?;
                let text = target.to_string_lossy().into_owned();
                files.push(BackupFile {
                    path: change.rel.clone(),
                    existed: true,
                    sha256: Some(sha256_hex(text.as_bytes())),
                    size: Some(text.len() as u64),
                    mode: None,
                    link: Some(text),
                });
            }
            Ok(_) => {
                if let Some(parent) = dest.parent() {
                    fsutil::create_dir_all_mode(parent, 0o700)
                        .map_err(prep("create the backup", parent))?;
                    // From the file's folder up to `files`: each holds a new entry.
                    let mut d = parent;
                    while d.starts_with(&tmp) && d != tmp {
                        batch.dirs.insert(d.to_path_buf());
                        d = d.parent().unwrap_or(&tmp);
                    }
                }
                let data = fs::read(&live).map_err(prep("read for backup", &live))?;
                let meta = FileMeta::of(&live).map_err(prep("read for backup", &live))?;
                let file = fsutil::write_new_unsynced(
                    &dest,
                    &data,
                    meta.mode & 0o700,
                    Some((meta.uid, meta.gid)),
                )
                .map_err(prep("write the backup of", &live))?;
                batch.files.push((dest.clone(), file));
                files.push(BackupFile {
                    path: change.rel.clone(),
                    existed: true,
                    sha256: Some(sha256_hex(&data)),
                    size: Some(data.len() as u64),
                    mode: Some(meta.mode),
                    link: None,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                files.push(BackupFile {
                    path: change.rel.clone(),
                    existed: false,
                    sha256: None,
                    size: None,
                    mode: None,
                    link: None,
                });
            }
            Err(e) => return Err(prep("read for backup", &live)(e)),
        }
        failpoint("backup-file");
    }
    let manifest = BackupManifest {
        version: Kind::BackupManifest.current(),
        id: id.clone(),
        created_at: crate::sys::clock::rfc3339(now),
        kind: kind.to_string(),
        files,
    };
    // Written in place, not through a temporary file and a rename: the folder keeps its
    // `.incomplete-` name until the journal exists ([`finalize_backup`]), and a crash before
    // that discards it whole (no backup of a transaction that never happened), so nothing reads
    // a half-written manifest. The batch makes it, the backup's folder and its entry in
    // `backups` durable before the journal is written.
    let manifest_path = tmp.join(MANIFEST);
    let file = state::encode(&manifest)
        .and_then(|json| fsutil::write_new_unsynced(&manifest_path, &json, 0o600, None))
        .map_err(prep("write the backup manifest", &manifest_path))?;
    batch.files.push((manifest_path, file));
    batch.dirs.insert(tmp.clone());
    batch.dirs.insert(backups.clone());
    Ok(id)
}

/// Gives a journaled transaction's backup its final name (idempotent).
fn finalize_backup(root: &Path, id: &str) -> Result<(), TxnError> {
    let backups = state_dir(root).join("backups");
    let incomplete = backups.join(format!(".incomplete-{id}"));
    if !incomplete.exists() {
        return Ok(());
    }
    let done = backups.join(id);
    let fail = |source| TxnError::Commit {
        path: done.display().to_string(),
        source,
    };
    // Made durable by [`commit`]'s batch, which always follows and ends before the journal is
    // removed: until then a crash finds the journal and renames again if the rename was lost.
    fs::rename(&incomplete, &done).map_err(fail)
}

fn write_journal(root: &Path, journal: &Journal) -> Result<(), TxnError> {
    let path = state_dir(root).join(JOURNAL);
    state::write(&path, journal).map_err(|source| TxnError::Prepare {
        step: "write the journal",
        path: path.display().to_string(),
        source,
    })
}

/// Renames every staged file over its live file, then removes the journal and staging.
/// Idempotent: a file already swapped (its staged copy gone) is skipped.
fn commit(root: &Path, journal: &Journal) -> Result<(), TxnError> {
    // Each folder is fsynced once after all the renames into it, before the journal is removed:
    // until then a crash rolls forward, and the renames already done are skipped.
    let mut folders: BTreeSet<PathBuf> = BTreeSet::new();
    for file in &journal.files {
        let live = root.join(&file.rel);
        let parent = live.parent().unwrap_or(root).to_path_buf();
        let commit_err = |source| TxnError::Commit {
            path: live.display().to_string(),
            source,
        };
        match &file.staged {
            Some(staged) => {
                let staged = root.join(staged);
                if fs::symlink_metadata(&staged).is_ok() {
                    fs::rename(&staged, &live).map_err(commit_err)?;
                }
            }
            None => match fs::remove_file(&live) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(commit_err(e)),
            },
        }
        // Test-only (feature `failpoints`): a power loss at the next failpoint must meet a
        // half-done swap on disk (one the kernel may have written back on its own), so the
        // renames so far are made durable first. The shipped binary syncs once per folder below.
        #[cfg(feature = "failpoints")]
        fsutil::sync_dir(&parent).map_err(|source| TxnError::Commit {
            path: parent.display().to_string(),
            source,
        })?;
        // Also when already done by an interrupted run: its rename may not be durable yet.
        folders.insert(parent);
        failpoint("renamed");
    }
    // The backup's final name ([`finalize_backup`]), with the renames over the live files (a
    // backups folder removed by hand since does not stop the roll forward).
    let backups = state_dir(root).join("backups");
    if backups.is_dir() {
        folders.insert(backups);
    }
    let folders = fsutil::SyncBatch {
        files: Vec::new(),
        dirs: folders,
    };
    folders.sync().map_err(|(path, source)| TxnError::Commit {
        path: path.display().to_string(),
        source,
    })?;
    let dir = state_dir(root);
    let path = dir.join(JOURNAL);
    fs::remove_file(&path).map_err(|source| TxnError::Commit {
        path: path.display().to_string(),
        source,
    })?;
    fsutil::sync_dir(&dir).map_err(|source| TxnError::Commit {
        path: dir.display().to_string(),
        source,
    })?;
    failpoint("journal-removed");
    for d in &journal.staging_dirs {
        let _ = fs::remove_dir_all(root.join(d));
    }
    failpoint("staging-removed");
    Ok(())
}

fn remove_staging(root: &Path, changes: &[Change], txid: &str) {
    for change in changes {
        if let Some(parent) = root.join(&change.rel).parent() {
            let _ = fs::remove_dir_all(parent.join(format!("{STAGING_PREFIX}{txid}")));
        }
    }
}

// === Recovery ===

/// Completes an interrupted transaction, or removes the leftovers of one that never reached its
/// journal. Call with the lock held, before reading the PKI.
pub fn recover(root: &Path) -> Result<Recovery, TxnError> {
    let dir = state_dir(root);
    let path = dir.join(JOURNAL);
    // Only a journal that does not exist means "no transaction": one that exists but cannot be
    // read, is of an unknown version or names what it must not stops recovery before anything
    // (staging folders included, which a roll forward needs) is touched.
    let journal = state::read::<Journal>(Kind::Journal, &path).map_err(|mut e| {
        e.detail.push_str(
            "; the live PKI may be half-renewed and the staged files are kept. Make the journal \
             readable (or inspect with 'certrotor check --root' on a copy) and run again",
        );
        e
    })?;
    if let Some((_, journal)) = journal {
        check_journal(root, &path, &journal)?;
        finalize_backup(root, &journal.backup_id)?;
        // Every staged file still to be renamed must hold what was validated: one damaged
        // since (a bad disk, a hand) never goes live; the backup is restored instead.
        if let Some(damaged) = damaged_staged_file(root, &journal) {
            return match restore_journaled(root, &journal) {
                Ok(backup_id) => Ok(Recovery::Undone {
                    kind: journal.kind,
                    backup_id,
                    damaged,
                }),
                Err(why) => Err(TxnError::State {
                    path: damaged,
                    detail: format!(
                        "its staged copy is damaged (not the journaled SHA-256), so the \
                         interrupted {} was not completed, and restoring backup {} failed: {why}; \
                         the PKI may be half-renewed: restore it with 'certrotor rollback \
                         --backup {}' once the backup is readable",
                        journal.kind, journal.backup_id, journal.backup_id
                    ),
                }),
            };
        }
        commit(root, &journal)?;
        // Verify that the live files are what the journal promised.
        let node = NodeFiles::of(root);
        for file in &journal.files {
            if let Some(want) = &file.new_sha256 {
                // A link holds its target.
                let got = live_content(&root.join(&file.rel), node.is_link(&file.rel))
                    .map(|b| sha256_hex(&b));
                if got.as_deref() != Some(want.as_str()) {
                    return Err(TxnError::State {
                        path: file.rel.clone(),
                        detail: format!(
                            "after completing the interrupted {} the file does not hold the \
                             journaled content; restore with 'certrotor rollback --backup {}'",
                            journal.kind, journal.backup_id
                        ),
                    });
                }
            }
        }
        return Ok(Recovery::RolledForward {
            kind: journal.kind,
            backup_id: journal.backup_id,
            files: journal.files.len(),
        });
    }
    let _ = fs::remove_file(dir.join(format!("{JOURNAL}.tmp")));
    // No journal: remove staging folders and incomplete backups left by a crash.
    let (mut with_files, mut empty) = (0, 0);
    for base in staging_search_dirs(root) {
        let Ok(list) = fs::read_dir(&base) else {
            continue;
        };
        for entry in list.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(STAGING_PREFIX)
            {
                let holds_files = fs::read_dir(entry.path())
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(false);
                let _ = fs::remove_dir_all(entry.path());
                if holds_files {
                    with_files += 1;
                } else {
                    empty += 1;
                }
            }
        }
    }
    remove_incomplete_backups(root);
    Ok(if with_files + empty > 0 {
        Recovery::DiscardedStaging { with_files, empty }
    } else {
        Recovery::Clean
    })
}

/// Checks every name and path a journal holds before recovery uses any of them: the kind, the
/// backup id, each live file (a file certrotor renews on this node, inside the root), its staged
/// copy (`<folder>/.certrotor-staging-<txid>/<name>`, a regular file if present) and the staging
/// folders (those of the staged files only).
fn check_journal(root: &Path, path: &Path, journal: &Journal) -> Result<(), StateError> {
    let bad = |entry: &str, detail: String| {
        StateError::entry(
            Kind::Journal,
            path,
            entry,
            format!(
                "{detail}; the journal is damaged or was not written by certrotor, so it is not \
                 used. Nothing was changed: inspect the node with 'certrotor check', restore a \
                 backup with 'certrotor rollback --backup ID' if needed, then remove the journal"
            ),
        )
    };
    if !KINDS.contains(&journal.kind.as_str()) {
        return Err(bad(
            &format!("kind {}", journal.kind),
            "unknown transaction kind".into(),
        ));
    }
    state::check_name(&journal.backup_id).map_err(|d| bad(&journal.backup_id, d))?;
    let node = NodeFiles::of(root);
    let mut dirs = BTreeSet::new();
    for file in &journal.files {
        node.check(&file.rel).map_err(|d| bad(&file.rel, d))?;
        if let Some(sha) = &file.new_sha256
            && (sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad(&file.rel, "new_sha256 is not a SHA-256".into()));
        }
        let Some(staged) = &file.staged else {
            continue;
        };
        let (folder, name) = file.rel.rsplit_once('/').unwrap_or(("", &file.rel));
        let txid = staged
            .strip_prefix(folder)
            .and_then(|s| s.strip_prefix('/'))
            .and_then(|s| s.strip_prefix(STAGING_PREFIX))
            .and_then(|s| s.strip_suffix(name))
            .and_then(|s| s.strip_suffix('/'))
            .filter(|t| state::check_name(t).is_ok())
            .ok_or_else(|| {
                bad(
                    staged,
                    format!("not a staged copy of '{}' in its own folder", file.rel),
                )
            })?;
        state::check_relative(staged).map_err(|d| bad(staged, d))?;
        let staged_path = root.join(staged);
        // A staged link is never followed: its folder must be inside the root.
        let inside = if node.is_link(&file.rel) {
            staged_path.parent().unwrap_or(root).to_path_buf()
        } else {
            staged_path.clone()
        };
        state::check_inside_root(root, &inside).map_err(|d| bad(staged, d))?;
        match fs::symlink_metadata(&staged_path) {
            Ok(m) if m.file_type().is_symlink() && node.is_link(&file.rel) => {}
            Ok(m) if !m.is_file() => {
                return Err(bad(staged, "the staged copy is not a regular file".into()));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(bad(staged, format!("cannot be examined: {e}"))),
        }
        dirs.insert(format!("{folder}/{STAGING_PREFIX}{txid}"));
    }
    for d in &journal.staging_dirs {
        if !dirs.contains(d) {
            return Err(bad(d, "not the staging folder of a journaled file".into()));
        }
    }
    Ok(())
}

/// Removes backups no journal names (only called when no journal exists, under the lock).
fn remove_incomplete_backups(root: &Path) {
    if let Ok(list) = fs::read_dir(state_dir(root).join("backups")) {
        for entry in list.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(".incomplete-")
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Folders where staging folders may be left: every folder of every layout, plus the PKI
/// sub-folders.
fn staging_search_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let kubelet = root.join(crate::node::kubelet::PKI_DIR);
    if kubelet.is_dir() {
        dirs.push(kubelet);
    }
    for base in crate::node::catalog::LAYOUT_DIRS {
        let b = root.join(base);
        if !b.is_dir() {
            continue;
        }
        let mut stack = vec![b];
        while let Some(d) = stack.pop() {
            if let Ok(list) = fs::read_dir(&d) {
                for e in list.flatten() {
                    let name = e.file_name().to_string_lossy().to_string();
                    if e.file_type().is_ok_and(|t| t.is_dir())
                        && !name.starts_with(STAGING_PREFIX)
                        && d.components().count() < 12
                    {
                        stack.push(e.path());
                    }
                }
            }
            dirs.push(d);
        }
    }
    dirs
}

// === Backups ===

/// One backup as `certrotor backups` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct BackupInfo {
    /// The backup's folder name (its id).
    pub id: String,
    pub created_at: Option<String>,
    pub kind: Option<String>,
    /// The manifest's version.
    pub version: Option<u32>,
    pub files: Vec<BackupFile>,
    /// `ok`, or `damaged` (never restored; `problem` says why).
    pub status: &'static str,
    pub problem: Option<String>,
    /// Set for a manifest of version 1: what could not be checked.
    pub note: Option<String>,
}

/// What a version-1 manifest does not allow to check.
const V1_NOTE: &str = "made by an earlier certrotor (manifest version 1): files are checked \
                       against their recorded SHA-256; sizes were not recorded";

fn backups_dir(root: &Path) -> PathBuf {
    state_dir(root).join("backups")
}

/// The names of the backup folders (complete ones), newest first. No folder means no backups;
/// a folder that cannot be listed is an error, never "no backups".
fn backup_dirs(root: &Path) -> Result<Vec<String>, TxnError> {
    let dir = backups_dir(root);
    let unreadable = |e: io::Error| TxnError::State {
        path: dir.display().to_string(),
        detail: format!("the backup folder cannot be listed: {e}"),
    };
    let list = match fs::read_dir(&dir) {
        Ok(list) => list,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(unreadable(e)),
    };
    let mut ids = Vec::new();
    for entry in list {
        let name = entry.map_err(unreadable)?.file_name();
        let name = name.to_string_lossy().to_string();
        if !name.starts_with('.') {
            ids.push(name);
        }
    }
    ids.sort_by(|a, b| b.cmp(a));
    Ok(ids)
}

/// Lists backups, newest first, each verified ([`verify_backup`]): a damaged one is listed as
/// such, with the reason.
pub fn list_backups(root: &Path) -> Result<Vec<BackupInfo>, TxnError> {
    let mut out = Vec::new();
    for id in backup_dirs(root)? {
        let info = match verify_backup(root, &id) {
            Ok(v) => BackupInfo {
                id,
                created_at: Some(v.manifest.created_at.clone()),
                kind: Some(v.manifest.kind.clone()),
                version: Some(v.manifest.version),
                files: v.manifest.files.clone(),
                status: "ok",
                problem: None,
                note: (v.manifest.version < 2).then(|| V1_NOTE.to_string()),
            },
            Err(e) => {
                // Whatever of the manifest can be read, for the operator's orientation only.
                let m = state::read::<BackupManifest>(
                    Kind::BackupManifest,
                    &backups_dir(root).join(&id).join(MANIFEST),
                )
                .ok()
                .flatten();
                BackupInfo {
                    id,
                    created_at: m.as_ref().map(|(_, m)| m.created_at.clone()),
                    kind: m.as_ref().map(|(_, m)| m.kind.clone()),
                    version: m.as_ref().map(|(v, _)| *v),
                    files: m.map(|(_, m)| m.files).unwrap_or_default(),
                    status: "damaged",
                    problem: Some(e.to_string()),
                    note: None,
                }
            }
        };
        out.push(info);
    }
    Ok(out)
}

/// The newest backup that is not a rollback's (damaged ones included: restoring one is
/// refused with its reason, rather than an older one silently chosen).
pub fn newest_restorable(root: &Path) -> Result<Option<String>, TxnError> {
    Ok(backup_dirs(root)?.into_iter().find(|id| {
        let m = state::read::<BackupManifest>(
            Kind::BackupManifest,
            &backups_dir(root).join(id).join(MANIFEST),
        );
        !matches!(m, Ok(Some((_, m))) if m.kind == "rollback")
    }))
}

/// A verified backup, as the changes that restore it.
struct Verified {
    manifest: BackupManifest,
    changes: Vec<Change>,
}

/// Verifies backup `id` before anything uses it: its folder is certrotor's (a plain folder
/// inside the root), its manifest is readable and of a known version, every path it names is a
/// file certrotor renews on this node, every file it kept is a regular file in the backup (no
/// symlink on the way) with the recorded size (version 2) and SHA-256, and every certificate
/// parses and matches its key (from the backup, or the live one when the transaction kept it).
fn verify_backup(root: &Path, id: &str) -> Result<Verified, StateError> {
    let dir = backups_dir(root).join(id);
    let manifest_path = dir.join(MANIFEST);
    let whole = |detail: String| StateError::new(Kind::BackupManifest, &manifest_path, detail);
    let bad = |entry: &str, detail: String| {
        StateError::entry(Kind::BackupManifest, &manifest_path, entry, detail)
    };
    state::check_name(id).map_err(|d| whole(format!("backup id '{id}': {d}")))?;
    match fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(whole(format!("'{}' is not a folder", dir.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(whole(format!(
                "no backup '{id}'; list them with 'certrotor backups'"
            )));
        }
        Err(e) => return Err(whole(format!("'{}' cannot be read: {e}", dir.display()))),
    }
    state::check_inside_root(root, &dir).map_err(whole)?;
    let (version, mut manifest) =
        state::read::<BackupManifest>(Kind::BackupManifest, &manifest_path)?
            .ok_or_else(|| whole("is missing".into()))?;
    manifest.version = version;
    if manifest.id != id {
        return Err(bad(
            "id",
            format!("names backup '{}', not '{id}'", manifest.id),
        ));
    }
    if !KINDS.contains(&manifest.kind.as_str()) {
        return Err(bad("kind", format!("unknown kind '{}'", manifest.kind)));
    }
    let node = NodeFiles::of(root);
    let mut seen = BTreeSet::new();
    let mut changes = Vec::new();
    for f in &manifest.files {
        node.check(&f.path).map_err(|d| bad(&f.path, d))?;
        if !seen.insert(f.path.as_str()) {
            return Err(bad(&f.path, "listed twice".into()));
        }
        if let Some(mode) = f.mode
            && mode & !0o7777 != 0
        {
            return Err(bad(&f.path, format!("mode {mode:o} is not a file mode")));
        }
        if !f.existed {
            changes.push(Change {
                rel: f.path.clone(),
                content: None,
                mode_if_new: 0o600,
            });
            continue;
        }
        if let Some(target) = &f.link {
            if !node.is_link(&f.path) {
                return Err(bad(&f.path, "recorded as a link, which it never is".into()));
            }
            node.check_link_target(target)
                .map_err(|d| bad(&f.path, d))?;
            if f.sha256.as_deref() != Some(&sha256_hex(target.as_bytes())) {
                return Err(bad(
                    &f.path,
                    "the link target does not match its recorded SHA-256: it was altered".into(),
                ));
            }
            changes.push(Change {
                rel: f.path.clone(),
                content: Some(target.as_bytes().to_vec()),
                mode_if_new: SYMLINK,
            });
            continue;
        }
        let data = state::read_no_symlinks(
            &dir,
            &format!("files/{}", f.path),
            crate::pki::MAX_PEM_FILE_BYTES,
        )
        .map_err(|d| bad(&f.path, d))?;
        let change = Change {
            rel: f.path.clone(),
            content: Some(data),
            mode_if_new: f.mode.unwrap_or(0o600) & 0o777,
        };
        let data = change.content.as_deref().unwrap_or_default();
        match (version, f.size) {
            (1, _) => {}
            (_, None) => return Err(bad(&f.path, "no size recorded".into())),
            (_, Some(size)) if size != data.len() as u64 => {
                return Err(bad(
                    &f.path,
                    format!(
                        "the copy in the backup is {} bytes, {size} were recorded: it was altered",
                        data.len()
                    ),
                ));
            }
            _ => {}
        }
        match &f.sha256 {
            None => return Err(bad(&f.path, "no SHA-256 recorded".into())),
            Some(want) if *want != sha256_hex(data) => {
                return Err(bad(
                    &f.path,
                    "the copy in the backup does not match its recorded SHA-256: it was altered"
                        .into(),
                ));
            }
            Some(_) => {}
        }
        changes.push(change);
    }
    // Links first: the kubelet's link goes back to its old file before the new file is removed,
    // so it never dangles.
    changes.sort_by_key(|c| c.mode_if_new != SYMLINK);
    for c in &changes {
        let Some(data) = c.content.as_deref() else {
            continue;
        };
        if c.mode_if_new == SYMLINK {
            continue;
        }
        check_backed_up_pki(root, &node, &changes, &c.rel, data).map_err(|d| bad(&c.rel, d))?;
    }
    Ok(Verified { manifest, changes })
}

/// A certificate in a backup parses and matches its key; a kubeconfig's embedded pair too; a
/// key parses.
fn check_backed_up_pki(
    root: &Path,
    node: &NodeFiles,
    changes: &[Change],
    rel: &str,
    data: &[u8],
) -> Result<(), String> {
    use crate::node::kubeconfig::{Kubeconfig, Source};
    use crate::pki::{Cert, PrivateKey};
    if node.is_kubeconfig(rel) {
        let creds = Kubeconfig::parse(data)
            .and_then(|k| k.credentials())
            .map_err(|e| e.to_string())?;
        if let (Source::Embedded(cert), Source::Embedded(key)) =
            (&creds.client_certificate, &creds.client_key)
        {
            let cert = Cert::from_pem(cert).map_err(|e| format!("client certificate: {e}"))?;
            let key = PrivateKey::from_pem(key).map_err(|e| format!("client key: {e}"))?;
            if !key.matches(&cert) {
                return Err("the embedded client key does not match its certificate".into());
            }
        }
        return Ok(());
    }
    if node.is_kubelet_pair_file(rel) {
        // The kubelet's combined file: its certificate and its key, which must match.
        let cert = Cert::from_pem(data).map_err(|e| e.to_string())?;
        let key = PrivateKey::from_pem(data).map_err(|e| e.to_string())?;
        if !key.matches(&cert) {
            return Err("the certificate does not match the key in the same file".into());
        }
        return Ok(());
    }
    let Some(key_rel) = node.key_of(rel) else {
        // A key: it must parse.
        PrivateKey::from_pem(data).map_err(|e| e.to_string())?;
        return Ok(());
    };
    let cert = Cert::from_pem(data).map_err(|e| e.to_string())?;
    let key = match changes.iter().find(|c| c.rel == key_rel) {
        Some(c) => match c.content.as_deref() {
            Some(k) => PrivateKey::from_pem(k).map_err(|e| format!("'{key_rel}': {e}"))?,
            None => return Err(format!("its key '{key_rel}' is recorded as absent")),
        },
        // The transaction kept the key (renewal with --reuse-keys): the live one.
        None => {
            let k = fsutil::read_in_root(root, key_rel, crate::pki::MAX_PEM_FILE_BYTES)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!("its key '{key_rel}' is neither in the backup nor on the node")
                })?;
            let parsed = PrivateKey::from_pem(&k);
            let mut k = k;
            k.iter_mut().for_each(|b| *b = 0);
            parsed.map_err(|e| format!("'{key_rel}': {e}"))?
        }
    };
    if !key.matches(&cert) {
        return Err(format!(
            "the certificate does not match its key '{key_rel}'"
        ));
    }
    Ok(())
}

/// Verifies a backup ([`verify_backup`]) and reads it back as the changes that restore it
/// (files that did not exist are removed). A backup that fails is refused, left in place, and
/// nothing is changed.
pub fn restore_changes(root: &Path, id: &str) -> Result<(BackupManifest, Vec<Change>), TxnError> {
    let v = verify_backup(root, id).map_err(|mut e| {
        e.detail.push_str(&format!(
            "; backup '{id}' is damaged and was not restored (it is kept for inspection). \
             Choose another with 'certrotor backups' and 'certrotor rollback --backup ID'"
        ));
        e
    })?;
    if v.manifest.version < 2 {
        log::warn!("backup {id}: {V1_NOTE}");
    }
    Ok((v.manifest, v.changes))
}

/// Removes the oldest backups beyond `retention` (by folder name, never a name read from a
/// manifest).
fn prune_backups(root: &Path, retention: usize) {
    // Pruning is housekeeping: a folder that cannot be listed is reported by the next
    // `backups` or `rollback`, not here.
    for old in backup_dirs(root)
        .unwrap_or_default()
        .iter()
        .skip(retention.max(1))
    {
        let _ = fs::remove_dir_all(backups_dir(root).join(old));
    }
}

#[cfg(test)]
mod hostile_tests {
    use super::*;
    use crate::lab::{LabLayout, LabOptions, Topology};
    use crate::pki::KeyAlgorithm;

    /// 15.3: a rename that fails after the journal (here: `etcd/peer.crt` made immutable after
    /// the probe, which this test bypasses) rolls back the files already replaced, from the
    /// backup, and says so; nothing is left for the next run to "complete".
    #[test]
    fn a_failed_rename_rolls_the_transaction_back() {
        let root = std::env::temp_dir().join(format!("certrotor-undo-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let now = crate::sys::clock::now();
        crate::lab::init(
            &root,
            &LabOptions {
                layout: LabLayout::Kubeadm,
                topology: Topology::Stacked,
                expires_in: 3 * 86_400,
                key_algorithm: KeyAlgorithm::EcdsaP256,
                node_name: "cp-1".into(),
                advertise_address: [10, 0, 0, 10].into(),
                cluster_name: "kubernetes".into(),
                port_offset: 0,
                kubernetes_version: crate::lab::manifests::DEFAULT_KUBERNETES_VERSION,
                now,
            },
        )
        .unwrap();
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
