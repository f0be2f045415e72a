//! Unit tests' scratch folders: [`TmpDir`] removes its folder when dropped.

use std::fs;
use std::path::{Path, PathBuf};

/// A fresh folder `certrotor-<prefix>-<name>-<pid>` under the system's temporary folder, removed
/// with everything in it when the guard is dropped (at the end of the test, passed or failed).
pub struct TmpDir(PathBuf);

impl TmpDir {
    /// Creates the folder, empty (whatever an earlier run left there is removed first).
    pub fn new(prefix: &str, name: &str) -> TmpDir {
        let d =
            std::env::temp_dir().join(format!("certrotor-{prefix}-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        TmpDir(d)
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
