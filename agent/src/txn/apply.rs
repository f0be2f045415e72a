//! Applying a transaction: resolve and probe the changes, run the commit protocol, and undo the
//! files already replaced when a commit fails part-way.

use super::*;
use crate::node::files::NodeFiles;
use crate::sys::fsutil::{self, FileMeta};
use crate::sys::state::{self, Kind};
use std::collections::BTreeSet;
use std::fs::{self};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub(super) fn sha256_hex(data: &[u8]) -> String {
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
pub(super) struct Txn<'a> {
    pub(super) kind: &'a str,
    pub(super) now: i64,
    pub(super) retention: usize,
    pub(super) txid: &'a str,
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
pub(super) fn live_content(live: &Path, link: bool) -> Option<Vec<u8>> {
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
pub(super) fn undo_failed_commit(
    root: &Path,
    result: Result<Outcome, TxnError>,
) -> Result<Outcome, TxnError> {
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
pub(super) fn restore_journaled(root: &Path, journal: &Journal) -> Result<String, String> {
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
pub(super) fn damaged_staged_file(root: &Path, journal: &Journal) -> Option<String> {
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
