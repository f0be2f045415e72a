//! Where things live: workspace, cargo target dir, images dir, per-scenario work dirs.
//!
//! Environment overrides (all optional):
//! * `CARGO_TARGET_DIR`   — cargo target dir (default `<workspace>/target`)
//! * `QEMU_TESTS_IMAGES`  — output dir of `images/build-vm.sh` (default `<target>/images`)
//! * `QEMU_TESTS_WORK`    — root of the per-scenario work dirs (default `<target>/qemu-tests`)

use std::env;
use std::path::{Path, PathBuf};

/// The workspace root (parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// `images/` in the workspace (build-vm.sh, oci-image.sh, ...).
pub fn images_src_dir() -> PathBuf {
    workspace_root().join("images")
}

fn env_path(var: &str) -> Option<PathBuf> {
    env::var_os(var).filter(|v| !v.is_empty()).map(|v| {
        let p = PathBuf::from(v);
        if p.is_absolute() {
            p
        } else {
            workspace_root().join(p)
        }
    })
}

/// The cargo target dir: `CARGO_TARGET_DIR` or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    env_path("CARGO_TARGET_DIR").unwrap_or_else(|| workspace_root().join("target"))
}

/// Output dir of the VM image build.
pub fn images_out_dir() -> PathBuf {
    env_path("QEMU_TESTS_IMAGES").unwrap_or_else(|| target_dir().join("images"))
}

/// Root of the scenario work dirs (`<root>/<scenario>/serial.log`, ...).
pub fn work_root() -> PathBuf {
    env_path("QEMU_TESTS_WORK").unwrap_or_else(|| target_dir().join("qemu-tests"))
}

/// A path from an environment variable, if set and non-empty (relative to the workspace).
pub fn path_from_env(var: &str) -> Option<PathBuf> {
    env_path(var)
}
