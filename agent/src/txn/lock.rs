//! The exclusive lock (`var/lib/certrotor/lock`) that keeps two certrotor commands from
//! interleaving, and the state folder it lives in.

use super::*;
use crate::node::catalog::paths::STATE_DIR;
use crate::sys::fsutil::{self};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    lock_named(root, "lock", timeout)
}

/// Takes the lock of CA rotation commands (`ca-rotation.lock`), waiting at most `timeout`: one
/// `ca rotate|continue|abort` (or the daemon's step of a rotation) at a time on a node. Beside
/// [`lock`], which each of them takes for each transaction and pass: a rotation command waits
/// for other nodes without it, and must not interleave with another meanwhile.
pub fn rotation_lock(root: &Path, timeout: Duration) -> Result<Lock, TxnError> {
    lock_named(root, "ca-rotation.lock", timeout)
}

fn lock_named(root: &Path, name: &str, timeout: Duration) -> Result<Lock, TxnError> {
    let prep = |path: &Path, source| TxnError::Prepare {
        step: "create the lock",
        path: path.display().to_string(),
        source,
    };
    let dir = checked_state_dir(root).map_err(|e| prep(&root.join(STATE_DIR), e))?;
    let path = dir.join(name);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::tmpdir::TmpDir;

    #[test]
    fn one_rotation_command_at_a_time_beside_the_transaction_lock() {
        let root = TmpDir::new("lock", "rotation");
        let held = rotation_lock(&root, Duration::ZERO).unwrap();
        // Another rotation command (another open of the file, as another process) waits, then
        // names the lock and its holder.
        match rotation_lock(&root, Duration::from_millis(30)) {
            Err(TxnError::Locked { path, holder, .. }) => {
                assert!(
                    path.ends_with("var/lib/certrotor/ca-rotation.lock"),
                    "{path}"
                );
                assert_eq!(holder, format!("pid {}", std::process::id()));
            }
            other => panic!("not refused: {other:?}"),
        }
        // The transactions and passes of the command holding it take their own lock.
        drop(lock(&root, Duration::ZERO).unwrap());
        drop(held);
        drop(rotation_lock(&root, Duration::ZERO).unwrap());
        let mode = fs::metadata(root.join("var/lib/certrotor/ca-rotation.lock")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
    }
}
