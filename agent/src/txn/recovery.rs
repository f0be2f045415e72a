//! Recovery after a crash: roll a journaled transaction forward (or restore its backup when a
//! staged file was damaged since), and discard the leftovers of one interrupted before its
//! journal.

use super::*;
use crate::node::files::NodeFiles;
use crate::sys::state::{self, Kind, StateError};
use std::collections::BTreeSet;
use std::fs::{self};
use std::io::{self};
use std::path::{Path, PathBuf};

/// Completes a journaled transaction (`path`: its journal), or restores its backup when a
/// staged file was damaged since it was validated.
fn roll_forward(root: &Path, path: &Path, journal: Journal) -> Result<Recovery, TxnError> {
    check_journal(root, path, &journal)?;
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
    Ok(Recovery::RolledForward {
        kind: journal.kind,
        backup_id: journal.backup_id,
        files: journal.files.len(),
    })
}

/// No journal: removes the staging folders and incomplete backups left by a crash.
fn discard_leftovers(root: &Path) -> Recovery {
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
    if with_files + empty > 0 {
        Recovery::DiscardedStaging { with_files, empty }
    } else {
        Recovery::Clean
    }
}

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
        return roll_forward(root, &path, journal);
    }
    let _ = fs::remove_file(dir.join(format!("{JOURNAL}.tmp")));
    Ok(discard_leftovers(root))
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
pub(super) fn remove_incomplete_backups(root: &Path) {
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
