//! The commit protocol's steps: stage every new file beside its live file, back up what it
//! replaces, make both durable, write the journal, rename, and clean up.

use super::*;
use crate::sys::fsutil::{self, FileMeta};
use crate::sys::state::{self, Kind};
use std::collections::BTreeSet;
use std::fs::{self};
use std::io::{self};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The error of a failed preparation step on `path`: nothing was changed on the node.
fn prep(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TxnError + use<> {
    let path = path.display().to_string();
    move |source| TxnError::Prepare { step, path, source }
}

/// What staging wrote: the journal's files and staging folders, and the batch to make durable.
struct Staged {
    journal_files: Vec<JournalFile>,
    staging_dirs: BTreeSet<String>,
    batch: fsutil::SyncBatch,
}

pub(super) fn prepare_and_commit(
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
    let mut staged = Staged {
        journal_files: Vec::new(),
        staging_dirs: BTreeSet::new(),
        batch: fsutil::SyncBatch::default(),
    };
    for change in changes {
        stage_one(root, change, txid, &mut staged)?;
    }
    let Staged {
        journal_files,
        staging_dirs,
        mut batch,
    } = staged;
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

/// Stages one change: its new file (or link) in the staging folder next to the live file,
/// created on first use; a removal only goes into the journal.
fn stage_one(
    root: &Path,
    change: &Change,
    txid: &str,
    staged: &mut Staged,
) -> Result<(), TxnError> {
    let live = root.join(&change.rel);
    let parent = live.parent().unwrap_or(root).to_path_buf();
    let Some(content) = &change.content else {
        staged.journal_files.push(JournalFile {
            rel: change.rel.clone(),
            staged: None,
            new_sha256: None,
        });
        return Ok(());
    };
    let staging = parent.join(format!("{STAGING_PREFIX}{txid}"));
    let staging_rel = rel_of(root, &staging);
    if staged.staging_dirs.insert(staging_rel.clone()) {
        let batch = &mut staged.batch;
        batch
            .dirs
            .extend(folders_changed_by_creating(&parent, root));
        fsutil::create_dir_all_mode(&parent, 0o755).map_err(prep("create the folder", &parent))?;
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
    let staged_path = staging.join(&file_name);
    if change.mode_if_new == SYMLINK {
        // The kubelet's way: a new link, renamed over the old one at commit.
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(content), &staged_path)
            .map_err(prep("write the staged link", &staged_path))?;
    } else {
        let (mode, owner) = match FileMeta::of(&live) {
            // A private key file is never wider than a new one (0600), even if the old one was.
            Ok(m) if change.rel.ends_with(".key") => {
                (m.mode & change.mode_if_new, Some((m.uid, m.gid)))
            }
            Ok(m) => (m.mode, Some((m.uid, m.gid))),
            Err(_) => (change.mode_if_new, None),
        };
        let file = fsutil::write_new_unsynced(&staged_path, content, mode, owner)
            .map_err(prep("write the staged file", &staged_path))?;
        staged.batch.files.push((staged_path, file));
        failpoint("staged-file");
    }
    staged.journal_files.push(JournalFile {
        rel: change.rel.clone(),
        staged: Some(format!("{staging_rel}/{file_name}")),
        new_sha256: Some(sha256_hex(content)),
    });
    Ok(())
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
        files.push(back_up_one(root, &change.rel, &tmp, batch)?);
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

/// Copies one live file (or link) into the backup being built in `tmp`, adding the copy and
/// the folders that got an entry to `batch`; what the manifest says of it.
fn back_up_one(
    root: &Path,
    rel: &str,
    tmp: &Path,
    batch: &mut fsutil::SyncBatch,
) -> Result<BackupFile, TxnError> {
    let live = root.join(rel);
    let dest = tmp.join("files").join(rel);
    match fs::symlink_metadata(&live) {
        Ok(meta) if meta.file_type().is_symlink() => {
            let target = fs::read_link(&live).map_err(prep("read for backup", &live))?;
            let text = target.to_string_lossy().into_owned();
            Ok(BackupFile {
                path: rel.to_string(),
                existed: true,
                sha256: Some(sha256_hex(text.as_bytes())),
                size: Some(text.len() as u64),
                mode: None,
                link: Some(text),
            })
        }
        Ok(_) => {
            if let Some(parent) = dest.parent() {
                fsutil::create_dir_all_mode(parent, 0o700)
                    .map_err(prep("create the backup", parent))?;
                // From the file's folder up to `files`: each holds a new entry.
                let mut d = parent;
                while d.starts_with(tmp) && d != tmp {
                    batch.dirs.insert(d.to_path_buf());
                    d = d.parent().unwrap_or(tmp);
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
            Ok(BackupFile {
                path: rel.to_string(),
                existed: true,
                sha256: Some(sha256_hex(&data)),
                size: Some(data.len() as u64),
                mode: Some(meta.mode),
                link: None,
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BackupFile {
            path: rel.to_string(),
            existed: false,
            sha256: None,
            size: None,
            mode: None,
            link: None,
        }),
        Err(e) => Err(prep("read for backup", &live)(e)),
    }
}

/// Gives a journaled transaction's backup its final name (idempotent).
pub(super) fn finalize_backup(root: &Path, id: &str) -> Result<(), TxnError> {
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
pub(super) fn commit(root: &Path, journal: &Journal) -> Result<(), TxnError> {
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

pub(super) fn remove_staging(root: &Path, changes: &[Change], txid: &str) {
    for change in changes {
        if let Some(parent) = root.join(&change.rel).parent() {
            let _ = fs::remove_dir_all(parent.join(format!("{STAGING_PREFIX}{txid}")));
        }
    }
}
