//! The last step of every pass (and import) that stopped a static pod: no pod certrotor
//! stopped stays stopped while certrotor runs (issue 26). A restart starts its pod again
//! whatever happened to the stop, but the start itself can fail (the Bottlerocket API away for
//! the whole bound, an applier that does not act); the rollback may not reach it either. So
//! every pod this process stopped, or tried to, is checked at the end on every path, success or
//! failure, reading what is live before acting ([`restart::ensure_enabled`]):
//! - enabled and in place: nothing to do;
//! - stopped: started again; its restart was not verified, so it stays owed to the next pass;
//! - cannot be started: the pass state keeps the record of its stop (the next certrotor
//!   command starts it again) and the pass fails saying so.

use std::path::Path;

use crate::pass::state::{PassState, Restarts};
use crate::restart::{self, Ensured, RestartOptions};

/// What the last step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ensure {
    /// Pods found stopped and started again (owed to the next pass).
    pub re_enabled: Vec<String>,
    /// Pods that could not be started again, each with why: a person must look.
    pub left_disabled: Vec<String>,
}

/// Makes sure every pod this process stopped runs again; see the module documentation.
pub fn all_enabled(root: &Path, state: &mut PassState, opts: &RestartOptions) -> Ensure {
    let mut out = Ensure::default();
    let touched = std::mem::take(&mut state.this_process.stopped);
    if touched.is_empty() {
        return out;
    }
    let mut owed = Restarts::default();
    let mut still_stopped = None;
    for s in &touched {
        let mut api = Default::default();
        let ensured = restart::ensure_enabled(root, s, (opts.timeout, opts.poll), &mut api);
        state.this_process.api.add(&api);
        match ensured {
            Ok(Ensured::Running) => continue,
            Ok(Ensured::Started) => {
                log::warn!(
                    "static pod '{}' was still stopped at the end of the pass: started it again; \
                     its restart is not verified, so it stays owed to the next pass",
                    s.pod
                );
                out.re_enabled.push(s.pod.clone());
            }
            Err(e) => {
                let m = format!(
                    "static pod '{}' may still be stopped: {e}; the next certrotor command starts \
                     it again",
                    s.pod
                );
                log::error!("{m}");
                out.left_disabled.push(m);
                still_stopped.get_or_insert_with(|| s.clone());
            }
        }
        match s.component {
            Some(c) => owed.components.push(c),
            None => owed.pods.push(s.pod.clone()),
        }
    }
    if owed.is_empty() && state.stopped.is_none() {
        return out;
    }
    state.stopped = still_stopped;
    let mut all = state.owed.clone();
    all.merge(&owed);
    if let Err(e) = state.owe(root, all) {
        let m = format!("cannot record what the pass still owes: {e}");
        log::error!("{m}");
        out.left_disabled.push(m);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::catalog::paths;
    use crate::node::manifests::Component;
    use crate::restart::{PlatformChoice, Stopped};
    use std::time::Duration;

    #[test]
    fn a_pod_left_stopped_is_started_and_stays_owed_one_running_changes_nothing() {
        let dir = std::env::temp_dir().join(format!("certrotor-ensure-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (manifests, parked) = (
            dir.join(paths::KUBEADM_MANIFESTS),
            dir.join(paths::PARKED_MANIFESTS),
        );
        std::fs::create_dir_all(&manifests).unwrap();
        std::fs::create_dir_all(&parked).unwrap();
        std::fs::write(parked.join("etcd.yaml"), "kind: Pod\n").unwrap();
        std::fs::write(manifests.join("kube-scheduler.yaml"), "kind: Pod\n").unwrap();
        let stopped = |pod: &str, c| Stopped {
            platform: "kubeadm".into(),
            pod: pod.into(),
            api_socket: None,
            component: Some(c),
        };
        let opts = RestartOptions {
            platform: PlatformChoice::Kubeadm,
            api_socket: dir.join("api.sock"),
            timeout: Duration::from_secs(1),
            poll: Duration::from_millis(10),
            endpoints: Default::default(),
            mode: crate::restart::reload::RestartMode::Always,
            reload_timeout: Duration::ZERO,
            reload: Default::default(),
        };
        let mut state = PassState::default();
        state.this_process.stopped = vec![stopped("kube-scheduler.yaml", Component::KubeScheduler)];
        assert_eq!(all_enabled(&dir, &mut state, &opts), Ensure::default());
        assert!(!crate::txn::state_dir(&dir).join("pass.json").exists());

        state.this_process.stopped = vec![stopped("etcd.yaml", Component::Etcd)];
        state.stopped = Some(stopped("etcd.yaml", Component::Etcd));
        let ensured = all_enabled(&dir, &mut state, &opts);
        assert_eq!(ensured.re_enabled, ["etcd.yaml"]);
        assert!(ensured.left_disabled.is_empty());
        assert!(manifests.join("etcd.yaml").exists());
        let saved = PassState::load(&dir).unwrap();
        assert_eq!(saved.owed.components, [Component::Etcd]);
        assert_eq!(saved.stopped, None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
