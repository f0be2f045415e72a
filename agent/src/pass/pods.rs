//! The other static pods of a pass (kube-vip, and any pod that mounts a renewed file): which
//! mount a renewed file, which to restart (one restart per pod, with those an earlier pass
//! still owes), and their restarts one at a time, a failed one owed to the next pass.

use std::path::Path;

use crate::node::manifests::Consumer;
use crate::pass::run::Pass;
use crate::restart::{self, Platform};

impl Pass<'_> {
    /// One restart per consumer pod, even when it mounts several renewed files; with the pods
    /// an earlier pass still owes.
    pub(super) fn pods_to_restart(&self) -> Vec<Consumer> {
        let mut pods: Vec<Consumer> = Vec::new();
        for c in &self.other_consumers {
            match pods.iter_mut().find(|p| p.pod == c.pod) {
                Some(p) => {
                    p.file = format!("{}, {}", p.file, c.file);
                    p.reason = format!("{}; {}", p.reason, c.reason);
                }
                None => pods.push(c.clone()),
            }
        }
        for pod in &self.owed_before.pods {
            if self.work.pods.contains(pod) && !pods.iter().any(|p| &p.pod == pod) {
                pods.push(Consumer {
                    pod: pod.clone(),
                    file: String::new(),
                    single_file: false,
                    reason: format!(
                        "an earlier pass renewed a file that static pod '{pod}' mounts and did \
                         not finish restarting it"
                    ),
                });
            }
        }
        pods.retain(|p| !self.state.started_by_recovery.contains(&p.pod));
        pods
    }

    /// The other consumers, one at a time, each verified by its health.
    pub(super) fn restart_pods(&mut self, pods: &[Consumer]) {
        let mut record = self.state.recorder(self.root);
        for c in pods {
            match restart::restart_pod(
                &self.node,
                &self.platform,
                c,
                &self.opts.restart,
                &mut record,
            ) {
                Ok(r) => self.restarted_pods.push(r),
                Err(e) => {
                    log::error!("{e}");
                    if e.owed {
                        self.owed_pods.push(c.pod.clone());
                    }
                    self.pod_errors.push(e.to_string());
                }
            }
        }
    }
}

/// The static pods other than the four components that mount one of `files` (paths relative
/// to `root`), from their manifests; none when the pods cannot be listed (a warning).
pub(super) fn consumers_of(root: &Path, platform: &Platform, files: &[String]) -> Vec<Consumer> {
    if files.is_empty() || matches!(platform, Platform::None) {
        return vec![];
    }
    match restart::pods(platform) {
        Ok(pods) => crate::node::manifests::other_consumers(root, &pods, files),
        Err(e) => {
            log::warn!("cannot list the static pods that mount renewed files: {e}");
            vec![]
        }
    }
}
