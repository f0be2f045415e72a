//! certrotor's own state files, read as untrusted input and written atomically.
//!
//! Four files record what certrotor is doing or did (ARCHITECTURE.md, "State files", lists them
//! with their schemas):
//! - the journal (`var/lib/certrotor/journal.json`), while a transaction commits;
//! - the pass state (`var/lib/certrotor/pass.json`): a pass's stage, the restarts it owes and
//!   the static pod it has stopped (it replaces the restart marker `restart.json` and the owed
//!   restarts `pending-restarts.json` of earlier releases, which are still read);
//! - each backup's manifest (`var/lib/certrotor/backups/<id>/manifest.json`);
//! - the last pass of `run`/`daemon` (`var/lib/certrotor/last-pass.json`), for `status`.
//!
//! Every one carries a `version`, checked when read: a version this build does not know is
//! refused, never guessed. Reading distinguishes "absent" (the file does not exist: `Ok(None)`)
//! from every other failure (unreadable, a symlink, not a regular file, too big, not JSON,
//! damaged): those are errors, so that recovery stops instead of taking the "nothing to do"
//! branch. Writing is one atomic writer: temporary file (0600), fsync, rename, fsync of the
//! folder.
//!
//! Paths read from state files are untrusted too: the node stage's `NodeFiles::check` accepts only a relative
//! path, without `..`, that stays inside the node root on disk and is one of the files the
//! catalog knows for the node's layouts.

use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::sys::fsutil;

/// The largest state file certrotor reads (a manifest of a few dozen files is a few KiB).
pub const MAX_STATE_BYTES: u64 = 1024 * 1024;

/// The kinds of state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Journal,
    /// The pass's state (`pass.json`).
    PassState,
    /// Earlier releases' record of a stopped pod (`restart.json`), read to migrate it.
    RestartMarker,
    /// Earlier releases' record of owed restarts (`pending-restarts.json`), read to migrate it.
    OwedRestarts,
    BackupManifest,
    /// The record of the last `run`/`daemon` pass (`status.rs`).
    LastPass,
    /// A CA rotation's stage on this node (`ca-rotation.json`, the `ca` stage).
    CaRotation,
}

impl Kind {
    /// What the file is called in messages.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Journal => "journal",
            Kind::PassState => "pass state",
            Kind::RestartMarker => "restart marker",
            Kind::OwedRestarts => "owed-restarts record",
            Kind::BackupManifest => "backup manifest",
            Kind::LastPass => "last-pass record",
            Kind::CaRotation => "CA rotation state",
        }
    }

    /// The version this build writes.
    pub fn current(self) -> u32 {
        match self {
            Kind::Journal
            | Kind::PassState
            | Kind::RestartMarker
            | Kind::LastPass
            | Kind::CaRotation => 1,
            // 2: `pods`, the other static pods owed a restart (kube-vip); 1 had components only.
            Kind::OwedRestarts => 2,
            // 2: `version` and each file's `size`; 1 had neither (SHA-256 only).
            Kind::BackupManifest => 2,
        }
    }

    /// The version of a file without a `version` field: the files written before versions
    /// were added (restart marker, owed restarts and backup manifests of the first release).
    /// The journal always had one.
    fn unversioned(self) -> Option<u32> {
        match self {
            // The last-pass record always had one.
            Kind::Journal | Kind::PassState | Kind::LastPass | Kind::CaRotation => None,
            Kind::RestartMarker | Kind::OwedRestarts | Kind::BackupManifest => Some(1),
        }
    }
}

/// A state file that cannot be used; nothing was changed because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError {
    pub kind: Kind,
    /// The file, as a path on this machine.
    pub file: String,
    /// The entry of the file at fault, when one is.
    pub entry: Option<String>,
    pub detail: String,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} '{}'", self.kind.label(), self.file)?;
        if let Some(entry) = &self.entry {
            write!(f, ", entry '{entry}'")?;
        }
        write!(f, ": {}", self.detail)
    }
}

impl std::error::Error for StateError {}

impl StateError {
    pub fn new(kind: Kind, file: &Path, detail: impl Into<String>) -> StateError {
        StateError {
            kind,
            file: file.display().to_string(),
            entry: None,
            detail: detail.into(),
        }
    }

    pub fn entry(
        kind: Kind,
        file: &Path,
        entry: impl Into<String>,
        detail: impl Into<String>,
    ) -> StateError {
        StateError {
            kind,
            file: file.display().to_string(),
            entry: Some(entry.into()),
            detail: detail.into(),
        }
    }
}

/// Reads a state file. `Ok(None)` only when it does not exist; returns the file's version and
/// its content.
pub fn read<T: DeserializeOwned>(kind: Kind, path: &Path) -> Result<Option<(u32, T)>, StateError> {
    let Some(bytes) = read_bytes(kind, path)? else {
        return Ok(None);
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        StateError::new(
            kind,
            path,
            format!("is not valid JSON ({e}); it is damaged"),
        )
    })?;
    let version = match value.get("version") {
        None if value.is_object() => kind.unversioned().ok_or_else(|| {
            StateError::new(
                kind,
                path,
                "has no version; it is damaged or not certrotor's",
            )
        })?,
        None => {
            return Err(StateError::new(
                kind,
                path,
                "is not a JSON object; it is damaged",
            ));
        }
        Some(v) => v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| StateError::new(kind, path, format!("has version {v}, not a number")))?,
    };
    if version == 0 || version > kind.current() {
        return Err(StateError::new(
            kind,
            path,
            format!(
                "is version {version}, which this certrotor does not know (it reads versions 1 to \
                 {}); it was written by another certrotor release: run that release, or a newer \
                 one, on this node",
                kind.current()
            ),
        ));
    }
    let content = serde_json::from_value(value)
        .map_err(|e| StateError::new(kind, path, format!("is damaged ({e})")))?;
    Ok(Some((version, content)))
}

/// Reads the bytes of a state file without following a symlink. `Ok(None)` when absent.
/// Opened first (no symlink followed, never blocking: a FIFO opens at once), then the file
/// opened is examined: nothing can be swapped in between a look and the open (issue 30.9).
fn read_bytes(kind: Kind, path: &Path) -> Result<Option<Vec<u8>>, StateError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |detail: String| StateError::new(kind, path, detail);
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(err(
                "is a symlink; certrotor writes its state files itself, so it was put there by \
                 something else: remove it after checking what it points to"
                    .into(),
            ));
        }
        Err(e) => return Err(err(format!("cannot be read: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| err(format!("cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(err("is not a regular file".into()));
    }
    if meta.len() > MAX_STATE_BYTES {
        return Err(err(format!(
            "is {} bytes, more than a state file can be ({MAX_STATE_BYTES})",
            meta.len()
        )));
    }
    let mut buf = Vec::new();
    (&mut file)
        .take(MAX_STATE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| err(format!("cannot be read: {e}")))?;
    if buf.len() as u64 > MAX_STATE_BYTES {
        return Err(err("grew while being read; run again".into()));
    }
    Ok(Some(buf))
}

/// A state file's bytes: pretty JSON, as [`write`] writes them (for a file written inside a
/// folder that is itself made durable and published later, such as a backup's manifest).
pub fn encode<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(value).map_err(io::Error::other)
}

/// Writes a state file atomically and durably: `<name>.tmp` (0600), fsync, rename over the
/// file, fsync of the folder. The folder must exist.
pub fn write<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let json = encode(value)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fsutil::write_new(&tmp, &json, 0o600, None)?;
    fs::rename(&tmp, path)?;
    fsutil::sync_dir(dir)
}

/// Removes a state file durably; an absent file is fine.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => fsutil::sync_dir(path.parent().unwrap_or(Path::new("."))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

// === Untrusted paths ===

/// Checks the shape of a path read from a state file: relative, made of plain names only (no
/// `..`, `.`, empty or absolute part).
pub fn check_relative(rel: &str) -> Result<(), String> {
    if rel.is_empty() {
        return Err("the path is empty".into());
    }
    if rel.starts_with('/') {
        return Err(
            "the path is absolute; certrotor records paths relative to the node root".into(),
        );
    }
    if rel.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    for part in rel.split('/') {
        match part {
            "" => return Err("the path has an empty part ('//' or a trailing '/')".into()),
            "." | ".." => return Err(format!("the path has a '{part}' part")),
            _ => {}
        }
    }
    // The standard library must see the same plain names.
    if !Path::new(rel)
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err("the path is not made of plain names".into());
    }
    Ok(())
}

/// A name certrotor gives a folder or uses as an id (backup ids, transaction ids, pod names):
/// ASCII letters, digits, `-`, `_` and `.`, not starting with `.`, at most 253 bytes.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("the name is empty or longer than 253 bytes".into());
    }
    if name.starts_with('.') {
        return Err("the name starts with '.'".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("the name contains '{}'", c.escape_default()));
    }
    Ok(())
}

/// Checks that `path` (under `root`, which may not exist entirely) stays inside `root` as the
/// kernel resolves it: the deepest part that exists, with every symlink on the way followed,
/// must be inside the root's own real path.
pub fn check_inside_root(root: &Path, path: &Path) -> Result<(), String> {
    let real_root = fs::canonicalize(root)
        .map_err(|e| format!("the node root '{}' cannot be resolved: {e}", root.display()))?;
    let mut probe = path.to_path_buf();
    loop {
        match fs::symlink_metadata(&probe) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !probe.pop() {
                    return Ok(());
                }
            }
            Err(e) => return Err(format!("'{}' cannot be examined: {e}", probe.display())),
        }
    }
    let real = fs::canonicalize(&probe).map_err(|e| {
        format!(
            "'{}' cannot be resolved ({e}); a symlink on the way leads nowhere",
            probe.display()
        )
    })?;
    if !real.starts_with(&real_root) {
        return Err(format!(
            "'{}' leads to '{}', outside the node root, through a symlink",
            probe.display(),
            real.display()
        ));
    }
    Ok(())
}

/// Opens a file inside a folder certrotor made (a backup), refusing any symlink on the way from
/// `base` and anything but a regular file, and reads at most `limit` bytes.
pub fn read_no_symlinks(base: &Path, rel: &str, limit: u64) -> Result<Vec<u8>, String> {
    check_relative(rel)?;
    let mut path = base.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        path.push(part);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("'{}' is missing", path.display()));
            }
            Err(e) => return Err(format!("'{}' cannot be read: {e}", path.display())),
        };
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&path)
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            return Err(format!(
                "'{}' is a symlink (to '{target}'); a backup holds copies, never links",
                path.display()
            ));
        }
        let last = i + 1 == parts.len();
        if last && !meta.is_file() {
            return Err(format!("'{}' is not a regular file", path.display()));
        }
        if !last && !meta.is_dir() {
            return Err(format!("'{}' is not a folder", path.display()));
        }
    }
    let before = fs::symlink_metadata(&path).map_err(|e| format!("'{}': {e}", path.display()))?;
    let file = fs::File::open(&path).map_err(|e| format!("'{}': {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("'{}': {e}", path.display()))?;
    if meta.dev() != before.dev() || meta.ino() != before.ino() {
        return Err(format!(
            "'{}' was replaced while being read",
            path.display()
        ));
    }
    if meta.len() > limit {
        return Err(format!(
            "'{}' is {} bytes, more than {limit}",
            path.display(),
            meta.len()
        ));
    }
    let mut buf = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("'{}': {e}", path.display()))?;
    if buf.len() as u64 > limit {
        return Err(format!("'{}' grew while being read", path.display()));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tmpdir::TmpDir;

    fn tmp(name: &str) -> TmpDir {
        TmpDir::new("state", name)
    }

    #[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
    struct Doc {
        version: Option<u32>,
        a: String,
    }

    #[test]
    fn absent_is_none_and_everything_else_is_an_error() {
        let d = tmp("read");
        let p = d.join("restart.json");
        assert_eq!(read::<Doc>(Kind::RestartMarker, &p).unwrap(), None);
        // Unversioned files of the first release are version 1 (not the journal).
        fs::write(&p, r#"{"a":"x"}"#).unwrap();
        let (v, doc) = read::<Doc>(Kind::RestartMarker, &p).unwrap().unwrap();
        assert_eq!((v, doc.a.as_str()), (1, "x"));
        assert!(read::<Doc>(Kind::Journal, &p).is_err());
        // A future version is refused.
        fs::write(&p, r#"{"version":7,"a":"x"}"#).unwrap();
        let e = read::<Doc>(Kind::RestartMarker, &p).unwrap_err();
        assert!(e.to_string().contains("version 7"), "{e}");
        // Truncated.
        fs::write(&p, r#"{"version":1,"a":"#).unwrap();
        assert!(read::<Doc>(Kind::RestartMarker, &p).is_err());
        // A folder where the file should be.
        fs::remove_file(&p).unwrap();
        fs::create_dir(&p).unwrap();
        assert!(read::<Doc>(Kind::RestartMarker, &p).is_err());
        fs::remove_dir(&p).unwrap();
        // A symlink.
        fs::write(d.join("elsewhere"), r#"{"version":1,"a":"x"}"#).unwrap();
        std::os::unix::fs::symlink(d.join("elsewhere"), &p).unwrap();
        assert!(read::<Doc>(Kind::RestartMarker, &p).is_err());
    }

    #[test]
    fn writes_are_atomic_and_0600() {
        let d = tmp("write");
        let p = d.join("journal.json");
        let doc = Doc {
            version: Some(1),
            a: "x".into(),
        };
        write(&p, &doc).unwrap();
        write(&p, &doc).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().mode() & 0o777,
            0o600,
            "state files are 0600"
        );
        assert!(!d.join("journal.json.tmp").exists());
        assert_eq!(read::<Doc>(Kind::Journal, &p).unwrap().unwrap().1, doc);
        remove(&p).unwrap();
        remove(&p).unwrap();
    }

    #[test]
    fn relative_paths_only() {
        for bad in [
            "",
            "/etc/passwd",
            "../victim.txt",
            "etc/../../x",
            "etc//x",
            "etc/./x",
            "etc/x/",
        ] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
        assert!(check_relative("etc/kubernetes/pki/apiserver.crt").is_ok());
        for bad in ["", ".x", "a/b", "..", "a b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("20261123T004700Z-002").is_ok());
    }

    #[test]
    fn symlinks_out_of_the_root_are_refused() {
        let d = tmp("inside");
        let root = d.join("root");
        let outside = d.join("outside");
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc/kubernetes")).unwrap();
        assert!(check_inside_root(&root, &root.join("etc/kubernetes/pki/a.crt")).is_err());
        assert!(check_inside_root(&root, &root.join("etc/other/a.crt")).is_ok());
        // A symlink inside a backup is refused whatever it points to.
        fs::create_dir_all(root.join("b/files")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("b/files/x")).unwrap();
        assert!(read_no_symlinks(&root.join("b"), "files/x", 1024).is_err());
        fs::write(root.join("b/files/y"), "y").unwrap();
        assert_eq!(
            read_no_symlinks(&root.join("b"), "files/y", 1024).unwrap(),
            b"y"
        );
    }
}
