//! The backup store (`var/lib/certrotor/backups/<id>`): list, verify and restore backups, and
//! prune the ones beyond the retention.

use super::*;
use crate::node::files::NodeFiles;
use crate::sys::fsutil::{self};
use crate::sys::state::{self, Kind, StateError};
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::{self};
use std::io::{self};
use std::path::{Path, PathBuf};

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

pub(super) fn backups_dir(root: &Path) -> PathBuf {
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
        changes.push(restore_change(&node, &dir, version, f).map_err(|d| bad(&f.path, d))?);
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

/// The change that restores one file a backup kept, once it is proved intact: `Err` says what
/// is wrong with it.
fn restore_change(
    node: &NodeFiles,
    dir: &Path,
    version: u32,
    f: &BackupFile,
) -> Result<Change, String> {
    if !f.existed {
        return Ok(Change {
            rel: f.path.clone(),
            content: None,
            mode_if_new: 0o600,
        });
    }
    if let Some(target) = &f.link {
        if !node.is_link(&f.path) {
            return Err("recorded as a link, which it never is".into());
        }
        node.check_link_target(target)?;
        if f.sha256.as_deref() != Some(&sha256_hex(target.as_bytes())) {
            return Err(
                "the link target does not match its recorded SHA-256: it was altered".into(),
            );
        }
        return Ok(Change {
            rel: f.path.clone(),
            content: Some(target.as_bytes().to_vec()),
            mode_if_new: SYMLINK,
        });
    }
    let data = state::read_no_symlinks(
        dir,
        &format!("files/{}", f.path),
        crate::pki::MAX_PEM_FILE_BYTES,
    )?;
    match (version, f.size) {
        (1, _) => {}
        (_, None) => return Err("no size recorded".into()),
        (_, Some(size)) if size != data.len() as u64 => {
            return Err(format!(
                "the copy in the backup is {} bytes, {size} were recorded: it was altered",
                data.len()
            ));
        }
        _ => {}
    }
    match &f.sha256 {
        None => return Err("no SHA-256 recorded".into()),
        Some(want) if *want != sha256_hex(&data) => {
            return Err(
                "the copy in the backup does not match its recorded SHA-256: it was altered".into(),
            );
        }
        Some(_) => {}
    }
    Ok(Change {
        rel: f.path.clone(),
        content: Some(data),
        mode_if_new: f.mode.unwrap_or(0o600) & 0o777,
    })
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
pub(super) fn prune_backups(root: &Path, retention: usize) {
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
