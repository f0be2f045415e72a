//! Which platform restarts static pods on this node (`--platform`): Bottlerocket's API, the
//! kubelet's manifest folder on a kubeadm node, or none; how it is detected (a Bottlerocket node
//! is known by its marks even while its API socket is absent), and the static pods it runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::node::catalog;
use crate::node::manifests::PodInfo;
use crate::pki::MAX_PEM_FILE_BYTES;
use crate::restart::api::{self, ApiStats};
use crate::restart::{RestartError, RestartOptions, fail};
use crate::sys::fsutil;

/// The platform choice of `--platform`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlatformChoice {
    Auto,
    Bottlerocket,
    Kubeadm,
    None,
}

impl PlatformChoice {
    /// Parses `auto|bottlerocket|kubeadm|none`.
    pub fn parse(s: &str) -> Option<PlatformChoice> {
        match s {
            "auto" => Some(PlatformChoice::Auto),
            "bottlerocket" => Some(PlatformChoice::Bottlerocket),
            "kubeadm" => Some(PlatformChoice::Kubeadm),
            "none" => Some(PlatformChoice::None),
            _ => None,
        }
    }
}

/// The platform in use.
#[derive(Debug, Clone)]
pub enum Platform {
    /// `bound`: how long a call that meets a restarting API is retried (the restart timeout).
    Bottlerocket {
        client: bottlerocket::ApiClient,
        bound: Duration,
    },
    Kubeadm {
        manifests: PathBuf,
    },
    None,
}

impl Platform {
    /// The name printed in logs.
    pub fn name(&self) -> &'static str {
        match self {
            Platform::Bottlerocket { .. } => "bottlerocket",
            Platform::Kubeadm { .. } => "kubeadm",
            Platform::None => "none",
        }
    }
}

/// The kubelet's manifest folder on a kubeadm node.
pub const KUBEADM_MANIFESTS: &str = catalog::paths::KUBEADM_MANIFESTS;
/// Where Bottlerocket's static-pods helper writes manifests for the kubelet.
pub(super) const BOTTLEROCKET_STATIC_PODS: &str = catalog::paths::BOTTLEROCKET_STATIC_PODS;

/// Picks the platform: the API socket means Bottlerocket; a kubelet manifest folder with
/// manifests means kubeadm; else none. A node that shows Bottlerocket's own marks
/// ([`bottlerocket_mark`]) is Bottlerocket even while its API socket is absent (the API server
/// restarting removes it): the socket is then waited for, within the restart timeout.
pub fn detect(root: &Path, opts: &RestartOptions) -> Result<Platform, RestartError> {
    let bottlerocket = || Platform::Bottlerocket {
        client: api::client(&opts.api_socket, opts.timeout),
        bound: opts.timeout,
    };
    let kubeadm = || Platform::Kubeadm {
        manifests: root.join(KUBEADM_MANIFESTS),
    };
    let mark = bottlerocket_mark(root);
    Ok(match opts.platform {
        PlatformChoice::Bottlerocket | PlatformChoice::Auto if opts.api_socket.exists() => {
            bottlerocket()
        }
        PlatformChoice::Bottlerocket | PlatformChoice::Auto if mark.is_some() => {
            wait_socket(opts, mark.as_deref().unwrap_or_default())?;
            bottlerocket()
        }
        PlatformChoice::Bottlerocket => {
            return Err(fail(
                None,
                format!(
                    "--platform bottlerocket: the API socket '{}' does not exist; mount it or give --api-socket",
                    opts.api_socket.display()
                ),
            ));
        }
        PlatformChoice::Kubeadm => kubeadm(),
        PlatformChoice::None => Platform::None,
        PlatformChoice::Auto => {
            if fs::read_dir(root.join(KUBEADM_MANIFESTS))
                .map(|mut d| d.next().is_some())
                .unwrap_or(false)
            {
                kubeadm()
            } else {
                Platform::None
            }
        }
    })
}

/// What shows that the node under `root` is Bottlerocket, whether or not its API answers now:
/// the folder its static-pods helper writes manifests to, or an os-release with
/// `ID=bottlerocket`.
pub fn bottlerocket_mark(root: &Path) -> Option<String> {
    let static_pods = root.join(BOTTLEROCKET_STATIC_PODS);
    if static_pods.is_dir() {
        return Some(format!("'{}' exists", static_pods.display()));
    }
    ["etc/os-release", "usr/lib/os-release"]
        .iter()
        .find(|rel| {
            fsutil::read_in_root(root, rel, 64 * 1024)
                .ok()
                .flatten()
                .is_some_and(|b| {
                    String::from_utf8_lossy(&b)
                        .lines()
                        .any(|l| matches!(l.trim(), "ID=bottlerocket" | "ID=\"bottlerocket\""))
                })
        })
        .map(|rel| format!("'{}' says ID=bottlerocket", root.join(rel).display()))
}

/// Waits, within the restart timeout, for the API socket of a node that is Bottlerocket by
/// `mark`.
fn wait_socket(opts: &RestartOptions, mark: &str) -> Result<(), RestartError> {
    let t0 = Instant::now();
    if opts.api_socket.exists() {
        return Ok(());
    }
    log::warn!(
        "this node is Bottlerocket ({mark}) but its API socket '{}' is absent (the API server \
         restarting?); waiting for it up to {} s",
        opts.api_socket.display(),
        opts.timeout.as_secs()
    );
    while !opts.api_socket.exists() {
        if t0.elapsed() >= opts.timeout {
            return Err(fail(
                None,
                format!(
                    "this node is Bottlerocket ({mark}) but its API socket '{}' did not appear \
                     within {} s; check the API server ('systemctl status apiserver' in the \
                     admin container) or give --api-socket",
                    opts.api_socket.display(),
                    opts.timeout.as_secs()
                ),
            ));
        }
        std::thread::sleep(opts.poll.min(Duration::from_millis(500)));
    }
    log::info!(
        "the API socket '{}' appeared after {} ms",
        opts.api_socket.display(),
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// Finds the manifests of the platform: (pod name, parsed manifest).
pub fn pods(platform: &Platform) -> Result<Vec<(String, PodInfo)>, RestartError> {
    match platform {
        Platform::None => Ok(vec![]),
        Platform::Kubeadm { manifests } => {
            let mut out = Vec::new();
            let list = fs::read_dir(manifests).map_err(|e| {
                fail(
                    None,
                    format!(
                        "cannot read the kubelet manifest folder '{}': {e}",
                        manifests.display()
                    ),
                )
            })?;
            let mut files: Vec<_> = list.flatten().collect();
            files.sort_by_key(|e| e.file_name());
            for entry in files {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with('.') {
                    continue;
                }
                let label = format!("{}/{name}", manifests.display());
                if let Ok(bytes) = fsutil::read_limited(&entry.path(), &label, MAX_PEM_FILE_BYTES)
                    && let Some(info) = PodInfo::parse(&bytes)
                {
                    out.push((name, info));
                }
            }
            Ok(out)
        }
        Platform::Bottlerocket { client, bound } => {
            let deadline = Instant::now() + *bound;
            let mut stats = ApiStats::default();
            let settings = api::call(client, deadline, &mut stats, |c| {
                c.settings_by_prefix("settings.kubernetes.static-pods")
            })
            .map_err(|e| {
                fail(
                    None,
                    format!("cannot read static pods from the Bottlerocket API: {e}"),
                )
            })?;
            let mut out = Vec::new();
            if let Some(map) = settings
                .get("kubernetes")
                .and_then(|k| k.get("static-pods"))
                .and_then(|p| p.as_object())
            {
                for (name, pod) in map {
                    let Some(b64) = pod.get("manifest").and_then(|m| m.as_str()) else {
                        continue;
                    };
                    if let Ok(bytes) = <base64ct::Base64 as base64ct::Encoding>::decode_vec(b64)
                        && let Some(info) = PodInfo::parse(&bytes)
                    {
                        out.push((name.clone(), info));
                    }
                }
            }
            Ok(out)
        }
    }
}
