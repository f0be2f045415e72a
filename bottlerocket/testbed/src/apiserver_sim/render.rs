//! What the emulator's config applier does with static pods, imitating Bottlerocket's
//! `/usr/bin/static-pods` (bottlerocket-api.md §2.1), plus the atomic file write it relies on.
//!
//! Like the real tool it processes *every* static pod on each run, not only changed ones:
//! enabled pods get their base64-decoded manifest written to
//! `<root>/etc/kubernetes/static-pods/<name>`, disabled pods have that file removed if present.
//! A pod missing `enabled` or `manifest` is a failure; the run continues with the other pods and
//! reports `Failed to manage N of M static pods`.
//!
//! Differs: the temporary file lives in the target directory itself (named `.<name>.tmp-…`,
//! which kubelet ignores as a hidden file) instead of a temporary directory under
//! `/etc/kubernetes`, and files and directory are fsynced. An identical manifest is still
//! rewritten and renamed over the old file (new inode, same content), which a content-watching
//! kubelet treats as no change, as on a real node.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// Static-pod manifest directory relative to the emulated root (kubelet's `staticPodPath`).
pub(crate) const STATIC_PODS_DIR: &str = "etc/kubernetes/static-pods";

/// The kubelet's client CA file relative to the emulated root, rendered from
/// `settings.kubernetes.cluster-certificate` (bottlerocket-api.md §2.5).
pub(crate) const KUBERNETES_CA: &str = "etc/kubernetes/pki/ca.crt";

/// Renders [`KUBERNETES_CA`] from `kubernetes.cluster-certificate` (base64 of a PEM bundle);
/// without the setting, nothing (the real template renders no file either).
pub(crate) fn render_kubernetes_ca(settings: &Value, root: &Path) -> Result<bool, String> {
    let Some(b64) = settings
        .pointer("/kubernetes/cluster-certificate")
        .and_then(Value::as_str)
    else {
        return Ok(false);
    };
    let pem = crate::base64::decode(b64)
        .map_err(|error| format!("Unable to base64 decode cluster-certificate: {error}"))?;
    write_atomically(&root.join(KUBERNETES_CA), &pem, 0o644)
        .map_err(|error| format!("Failed to write '{KUBERNETES_CA}': {error}"))?;
    Ok(true)
}

/// Outcome of one run over all static pods.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RenderReport {
    /// Pods whose manifest file was written.
    pub(crate) written: Vec<String>,
    /// Disabled pods (whether or not a file had to be removed).
    pub(crate) disabled: Vec<String>,
    /// Pods that could not be handled, with the reason.
    pub(crate) failed: Vec<(String, String)>,
}

impl RenderReport {
    /// A one-line summary for the log.
    pub(crate) fn summary(&self) -> String {
        let tried = self.written.len() + self.disabled.len() + self.failed.len();
        if self.failed.is_empty() {
            format!(
                "static pods: wrote {:?}, disabled {:?}",
                self.written, self.disabled
            )
        } else {
            let reasons: Vec<&str> = self.failed.iter().map(|(_, why)| why.as_str()).collect();
            format!(
                "Failed to manage {} of {tried} static pods: {}",
                self.failed.len(),
                reasons.join("; ")
            )
        }
    }
}

/// Renders every static pod in `settings` (the `Settings` object) under `root`.
pub(crate) fn render_static_pods(settings: &Value, root: &Path) -> RenderReport {
    let mut report = RenderReport::default();
    let Some(pods) = settings
        .pointer("/kubernetes/static-pods")
        .and_then(Value::as_object)
    else {
        return report;
    };
    let dir = root.join(STATIC_PODS_DIR);
    for (name, pod) in pods {
        match render_one(&dir, name, pod) {
            Ok(true) => report.written.push(name.clone()),
            Ok(false) => report.disabled.push(name.clone()),
            Err(reason) => report.failed.push((name.clone(), reason)),
        }
    }
    report
}

/// Replaces `path` with `bytes` atomically: write a hidden temporary file in the same
/// directory with `mode`, fsync it, rename it over `path`, fsync the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    fs::create_dir_all(dir)?;
    let temp: PathBuf = dir.join(format!(
        ".{}.tmp-{}-{}",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Handles one pod; `Ok(true)` = manifest written, `Ok(false)` = disabled.
fn render_one(dir: &Path, name: &str, pod: &Value) -> Result<bool, String> {
    // Names were validated as identifiers on input; re-check because they become file names.
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        return Err(format!("Invalid static pod name '{name}'"));
    }
    let enabled = pod
        .get("enabled")
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("Static pod '{name}' is missing field 'enabled'"))?;
    let manifest = pod
        .get("manifest")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("Static pod '{name}' is missing field 'manifest'"))?;
    let path = dir.join(name);
    if enabled {
        let bytes = crate::base64::decode(manifest)
            .map_err(|error| format!("Unable to base64 decode manifest '{name}': {error}"))?;
        // Mode 0600: what the real tool's NamedTempFile creates.
        write_atomically(&path, &bytes, 0o600).map_err(|error| {
            format!("Failed to write manifest for static pod '{name}': {error}")
        })?;
        Ok(true)
    } else {
        match fs::remove_file(&path) {
            Ok(()) => Ok(false),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(format!(
                "Failed to delete manifest for static pod '{name}': {error}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::MetadataExt;

    fn temp_root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("br-render-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        root
    }

    #[test]
    fn renders_every_pod_and_keeps_going_after_failures() {
        let root = temp_root("all");
        let dir = root.join(STATIC_PODS_DIR);
        fs::create_dir_all(&dir).expect("mkdir");
        fs::write(dir.join("old"), "stale").expect("seed");
        let settings = json!({"kubernetes": {"static-pods": {
            "etcd": {"enabled": true, "manifest": crate::base64::encode(b"kind: Pod\n")},
            "old": {"enabled": false, "manifest": "Zm9v"},
            "half": {"enabled": true},
        }}});
        let report = render_static_pods(&settings, &root);
        assert_eq!(report.written, ["etcd"]);
        assert_eq!(report.disabled, ["old"]);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(
            report.summary(),
            "Failed to manage 1 of 3 static pods: Static pod 'half' is missing field 'manifest'"
        );
        assert_eq!(
            fs::read(dir.join("etcd")).expect("manifest"),
            b"kind: Pod\n"
        );
        assert_eq!(
            fs::metadata(dir.join("etcd")).expect("meta").mode() & 0o777,
            0o600
        );
        assert!(!dir.join("old").exists());
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .expect("list")
            .filter_map(Result::ok)
            .map(|entry| entry.file_name())
            .collect();
        assert_eq!(leftovers, ["etcd"]);
        fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn the_kubelet_ca_file_follows_the_cluster_certificate() {
        let root = temp_root("ca");
        assert_eq!(
            render_kubernetes_ca(&json!({"kubernetes": {}}), &root),
            Ok(false)
        );
        assert!(!root.join(KUBERNETES_CA).exists());
        let settings =
            json!({"kubernetes": {"cluster-certificate": crate::base64::encode(b"PEM")}});
        assert_eq!(render_kubernetes_ca(&settings, &root), Ok(true));
        assert_eq!(fs::read(root.join(KUBERNETES_CA)).expect("ca.crt"), b"PEM");
        let bad = json!({"kubernetes": {"cluster-certificate": "!!"}});
        assert!(render_kubernetes_ca(&bad, &root).is_err());
        assert_eq!(fs::read(root.join(KUBERNETES_CA)).expect("ca.crt"), b"PEM");
        fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn rewriting_an_identical_manifest_keeps_content_but_replaces_the_file() {
        let root = temp_root("same");
        let settings = json!({"kubernetes": {"static-pods": {
            "etcd": {"enabled": true, "manifest": crate::base64::encode(b"same")},
        }}});
        render_static_pods(&settings, &root);
        let path = root.join(STATIC_PODS_DIR).join("etcd");
        let before = fs::metadata(&path).expect("meta").ino();
        render_static_pods(&settings, &root);
        assert_eq!(fs::read(&path).expect("read"), b"same");
        assert_ne!(fs::metadata(&path).expect("meta").ino(), before);
        fs::remove_dir_all(&root).expect("cleanup");
    }
}
