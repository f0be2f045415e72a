//! Restarting a static pod other than the four components because it mounts a renewed file
//! (kube-vip and `admin.conf`), and proving that it restarted, probe or not.
//!
//! EKS Anywhere renders kube-vip with no probe (issue 25), and on Bottlerocket nobody has a shell
//! to restart it by hand, so a restart is proven from `/proc` ([`crate::restart::process`]):
//! 1. before the stop, the pod's processes (and, where its mount namespace shows it, that a
//!    single-file mount holds a file renamed over: `…//deleted`);
//! 2. stop (Bottlerocket `enabled=false`, kubeadm: the manifest parked); every old process must
//!    exit (bounded), and the moment they all had is recorded;
//! 3. start; a process of the pod must appear that started after that moment (its mount fresh
//!    where visible);
//! 4. kube-vip: its leader-election Lease (`plndr-cp-lock`) must be written by some holder
//!    after the new process started (the apiserver's resourceVersion changes: an order of
//!    observations, not of clocks), where this node's apiserver answers;
//! 5. a probe, when the manifest has one, must answer healthy;
//! 6. the new process must still run, with no newer one (a crash loop), after `settle`.
//!
//! Where certrotor cannot act or prove, the error says exactly what to run instead
//! ([`manual_restart`]).

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::node::Node;
use crate::node::manifests::{Consumer, PodInfo};
use crate::restart::api::ApiStats;
use crate::restart::lease::{Lease, Reader};
use crate::restart::process::Signature;
use crate::restart::verify::{self, Probe};
use crate::restart::{Platform, RestartError, RestartOptions, StopRecord, fail, pods};
use crate::sys::procfs::{self, Proc};

/// A static pod other than the four components, restarted because it mounts a renewed file.
#[derive(Debug, Clone, Serialize)]
pub struct RestartedPod {
    pub pod: String,
    pub file: String,
    /// From stop to verified.
    pub unavailable_ms: u128,
    pub reason: String,
    /// What proves the restart.
    pub evidence: Evidence,
    /// What its API calls met (Bottlerocket): retries, re-applies, time unreachable.
    #[serde(flatten)]
    pub api: ApiStats,
}

/// What proves that a pod restarted (see the module doc).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Evidence {
    /// How its processes were recognised.
    pub signature: String,
    /// Its processes before the stop; each exited.
    pub old_pids: Vec<u32>,
    pub new_pid: Option<u32>,
    /// From the moment every old process had exited (or the stop) to the new one's start.
    pub started_after_stop_ms: Option<u64>,
    /// How long the new process was watched alive, with no newer one.
    pub alive_for_ms: u64,
    /// What `/proc/PID/mountinfo` showed of its single-file mounts.
    pub mounts: Vec<String>,
    /// Its HTTPS probe, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<String>,
    /// kube-vip: its Lease before the stop and after the restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_before: Option<Lease>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_after: Option<Lease>,
    /// kube-vip: what the Lease showed, or why it was not checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// One line for people.
    pub summary: String,
}

/// Why a consumer pod's restart failed, and whether it stays owed to the next pass.
#[derive(Debug)]
pub struct PodRestartError {
    pub error: RestartError,
    /// The pod was (or may have been) stopped, started or found unhealthy: the next pass tries
    /// again. False when nothing was touched (the pod is gone, or certrotor cannot restart it
    /// here: the error says what to run instead, and retrying could not do better).
    pub owed: bool,
}

impl fmt::Display for PodRestartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for PodRestartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// What to run to restart static pod `pod` by hand where certrotor cannot: the platform's own
/// way, exactly.
pub fn manual_restart(platform: &Platform, pod: &str) -> String {
    let bottlerocket = format!(
        "from the admin container run 'apiclient set settings.kubernetes.static-pods.{pod}.enabled=false', \
         wait until its process is gone, then 'apiclient set settings.kubernetes.static-pods.{pod}.enabled=true'"
    );
    match platform {
        Platform::Bottlerocket { .. } => bottlerocket,
        Platform::Kubeadm { manifests } => format!(
            "move '{}' out of the kubelet's folder, wait until its process is gone, and move it \
             back",
            manifests.join(pod).display()
        ),
        Platform::None => format!(
            "on Bottlerocket {bottlerocket}; on a kubeadm node move its manifest out of \
             /etc/kubernetes/manifests and back"
        ),
    }
}

/// Restarts the static pod of `consumer` (see [`crate::node::manifests::other_consumers`])
/// through the platform and verifies it (module doc).
pub fn restart_pod(
    node: &Node,
    platform: &Platform,
    consumer: &Consumer,
    opts: &RestartOptions,
    record: &mut dyn StopRecord,
) -> Result<RestartedPod, PodRestartError> {
    let refused = |error| PodRestartError { error, owed: false };
    let pod = &consumer.pod;
    // Listing the pods failed: nothing touched, but the restart is still due.
    let found = pods(platform).map_err(|error| PodRestartError { error, owed: true })?;
    let info = found
        .iter()
        .find(|(p, _)| p == pod)
        .map(|(_, i)| i)
        .ok_or_else(|| refused(fail(None, format!("static pod '{pod}' is gone"))))?;
    let cannot = |why: &str| {
        let how = manual_restart(platform, pod);
        refused(fail(None, format!("static pod '{pod}': {why}; {how}")))
    };
    if matches!(platform, Platform::None) {
        return Err(cannot(
            "no platform to restart it through (--platform none)",
        ));
    }
    let root = node.root();
    let sig = Signature::of(root, info)
        .ok_or_else(|| cannot("its manifest names no command and no image"))?;
    let watch = Watch::before(node, &found, info, sig, opts);
    watch
        .restart(root, platform, consumer, record)
        .map_err(|error| PodRestartError { error, owed: true })
}

/// One pod's restart and what is watched to prove it.
struct Watch<'a> {
    info: &'a PodInfo,
    sig: Signature,
    opts: &'a RestartOptions,
    probe: Option<Probe>,
    /// kube-vip: `(namespace, name)` of its Lease, and a reader when an apiserver is known.
    lease: Option<((String, String), Result<Reader, String>)>,
    old: Vec<Proc>,
    evidence: Evidence,
}

impl<'a> Watch<'a> {
    /// What is seen before the stop: the old processes, their mounts, the Lease.
    fn before(
        node: &Node,
        pods: &[(String, PodInfo)],
        info: &'a PodInfo,
        sig: Signature,
        opts: &'a RestartOptions,
    ) -> Watch<'a> {
        let probe = info.health.clone().map(|(address, path)| Probe {
            address,
            path,
            // Its own serving certificate is not certrotor's: any is accepted.
            ca_pem: None,
            client_cert_pem: None,
            client_key_pem: None,
            timeout: opts.timeout.min(Duration::from_secs(5)),
        });
        let lease = info.kube_vip_lease().map(|l| (l, Reader::own(node, pods)));
        let old = sig.find();
        let mut evidence = Evidence {
            signature: sig.describe(),
            old_pids: old.iter().map(|p| p.pid).collect(),
            ..Evidence::default()
        };
        for p in &old {
            let seen = mounts_seen(node.root(), info, p, "old");
            evidence
                .mounts
                .extend(seen.into_iter().map(|(line, _)| line));
        }
        if let Some(((ns, name), Ok(reader))) = &lease {
            evidence.lease_before = reader.get(ns, name).ok().flatten();
        }
        Watch {
            info,
            sig,
            opts,
            probe,
            lease,
            old,
            evidence,
        }
    }

    /// Stops and starts the pod, then proves the restart.
    fn restart(
        mut self,
        root: &Path,
        platform: &Platform,
        consumer: &Consumer,
        record: &mut dyn StopRecord,
    ) -> Result<RestartedPod, RestartError> {
        let pod = consumer.pod.as_str();
        log::info!(
            "restarting static pod '{pod}' (platform {}) because {}; its processes: {} (pids {:?})",
            platform.name(),
            consumer.reason,
            self.sig.describe(),
            self.evidence.old_pids
        );
        let t0 = Instant::now();
        let mut gone_at = None;
        let mut wait_gone = |deadline: Instant| {
            let r = self.wait_gone(pod, deadline);
            gone_at = procfs::now_ticks();
            r
        };
        let api = crate::restart::stop::stop_and_start(
            root,
            platform,
            (pod, None),
            self.opts,
            record,
            &mut wait_gone,
        )
        .map_err(|(f, stats)| {
            crate::restart::log_api(&format!("static pod '{pod}'"), &stats);
            f.error
        })?;
        self.verify(root, pod, gone_at.unwrap_or(0))?;
        let unavailable_ms = t0.elapsed().as_millis();
        self.evidence.summary = summary(&self.evidence);
        log::info!(
            "static pod '{pod}' restarted and verified after {unavailable_ms} ms: {}",
            self.evidence.summary
        );
        crate::restart::log_api(&format!("static pod '{pod}'"), &api);
        Ok(RestartedPod {
            pod: pod.to_string(),
            file: consumer.file.clone(),
            unavailable_ms,
            reason: consumer.reason.clone(),
            evidence: self.evidence,
            api,
        })
    }

    /// After the stop: its port closed (a probe's), every old process exited.
    fn wait_gone(&self, pod: &str, deadline: Instant) -> Result<(), RestartError> {
        let left = || deadline.saturating_duration_since(Instant::now());
        if let Some(p) = &self.probe {
            verify::wait_closed(p.address, left(), self.opts.poll)
                .map_err(|e| fail(None, format!("static pod '{pod}': {}", e.0)))?;
        }
        for p in &self.old {
            if !p.wait_exited(left(), self.opts.poll) {
                return Err(fail(
                    None,
                    format!(
                        "static pod '{pod}': its process {} still runs {} s after the stop",
                        p.pid,
                        self.opts.timeout.as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// After the start: a new process, its mounts, the Lease, the probe, then the settle.
    fn verify(&mut self, root: &Path, pod: &str, gone_at: u64) -> Result<(), RestartError> {
        let err = |m: String| fail(None, format!("static pod '{pod}': {m}"));
        let new = self.wait_new(gone_at).map_err(err)?;
        let seen = Instant::now();
        self.evidence.new_pid = Some(new.pid);
        self.evidence.started_after_stop_ms = Some(procfs::ticks_ms(gone_at, new.start_time));
        let fresh = mounts_seen(root, self.info, &new, "new");
        if let Some((stale, _)) = fresh.iter().find(|(_, stale)| *stale) {
            return Err(err(format!(
                "the new process {} does not see the renewed file: {stale}",
                new.pid
            )));
        }
        self.evidence
            .mounts
            .extend(fresh.into_iter().map(|(line, _)| line));
        self.check_lease(new).map_err(err)?;
        if let Some(p) = &self.probe {
            let o = verify::wait_for(p, self.opts.timeout, self.opts.poll, |o| o.healthy())
                .map_err(|e| err(e.0))?;
            self.evidence.probe =
                Some(format!("https://{}{} HTTP {}", p.address, p.path, o.status));
        }
        let left = self.opts.settle.saturating_sub(seen.elapsed());
        self.settle(new, left).map_err(err)?;
        self.evidence.alive_for_ms = u64::try_from(seen.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(())
    }

    /// Waits (restart timeout) for a process of the pod that started at or after `gone_at`.
    fn wait_new(&self, gone_at: u64) -> Result<Proc, String> {
        let t0 = Instant::now();
        loop {
            let newest = self
                .sig
                .find()
                .into_iter()
                .filter(|p| p.start_time >= gone_at)
                .max_by_key(|p| p.start_time);
            if let Some(p) = newest {
                return Ok(p);
            }
            if t0.elapsed() >= self.opts.timeout {
                return Err(format!(
                    "no new process ({}) started within {} s; certrotor sees processes in \
                     /proc: it must run in the host's PID namespace",
                    self.sig.describe(),
                    self.opts.timeout.as_secs()
                ));
            }
            std::thread::sleep(self.opts.poll);
        }
    }

    /// The new process stays, and no newer one appears, for `left`.
    fn settle(&self, new: Proc, left: Duration) -> Result<(), String> {
        let end = Instant::now() + left;
        loop {
            if new.exited() {
                return Err(format!(
                    "its new process {} exited within the {} s settle time",
                    new.pid,
                    self.opts.settle.as_secs()
                ));
            }
            if let Some(p) = self
                .sig
                .find()
                .iter()
                .find(|p| p.start_time > new.start_time)
            {
                return Err(format!(
                    "another process {} started after its new process {} (a crash loop?)",
                    p.pid, new.pid
                ));
            }
            if Instant::now() >= end {
                return Ok(());
            }
            std::thread::sleep(self.opts.poll.min(end - Instant::now()));
        }
    }
}

impl Watch<'_> {
    /// kube-vip: some holder writes the Lease after the new process started, within two lease
    /// durations and a renew deadline (kube-vip's timing, from its environment). Not checked,
    /// and said so, where no apiserver of this node answers.
    fn check_lease(&mut self, new: Proc) -> Result<(), String> {
        let Some(((ns, name), reader)) = &self.lease else {
            return Ok(());
        };
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                self.evidence.lease = Some(format!("{ns}/{name} not checked: {e}"));
                return Ok(());
            }
        };
        let first = match reader.get(ns, name) {
            Ok(l) => l,
            Err(e) => {
                let why = format!(
                    "{ns}/{name} not checked: apiserver {}: {e}",
                    reader.address()
                );
                log::warn!("{why}");
                self.evidence.lease = Some(why);
                return Ok(());
            }
        };
        let seconds = |k: &str, d: u64| {
            self.info
                .env_value(k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(d)
        };
        let bound = Duration::from_secs(
            2 * seconds("vip_leaseduration", 5) + seconds("vip_renewdeadline", 3),
        );
        let after = wait_renewed(reader, (ns, name), first.as_ref(), bound, self.opts.poll)?;
        self.evidence.lease = Some(format!(
            "{ns}/{name} written after new process {} started: held by '{}' (resourceVersion {} -> {})",
            new.pid,
            after.holder,
            first.map(|l| l.resource_version).unwrap_or_default(),
            after.resource_version
        ));
        self.evidence.lease_after = Some(after);
        Ok(())
    }
}

/// Polls the Lease (every second at most) until its resourceVersion differs from `first`'s
/// with a holder, within `bound`.
fn wait_renewed(
    reader: &Reader,
    (ns, name): (&str, &str),
    first: Option<&Lease>,
    bound: Duration,
    poll: Duration,
) -> Result<Lease, String> {
    let t0 = Instant::now();
    loop {
        let last = match reader.get(ns, name) {
            Ok(Some(l))
                if !l.holder.is_empty()
                    && first.is_none_or(|f| f.resource_version != l.resource_version) =>
            {
                return Ok(l);
            }
            Ok(l) => format!("{l:?}"),
            Err(e) => e,
        };
        if t0.elapsed() >= bound {
            return Err(format!(
                "Lease {ns}/{name} was not renewed by any holder within {} s after the restart \
                 (kube-vip renews it every retry period while it leads); last seen: {last}",
                bound.as_secs()
            ));
        }
        std::thread::sleep(poll.clamp(Duration::from_millis(100), Duration::from_secs(1)));
    }
}

/// What `p`'s mount namespace shows at each single-file mount of the pod (`which`: old/new):
/// one line each, and whether it is stale (the file renamed over: `//deleted`, or content
/// other than the file on the node now). Where the process has no mount namespace of its own
/// (kubelet-sim), nothing can be seen there and nothing is stale.
fn mounts_seen(root: &Path, info: &PodInfo, p: &Proc, which: &str) -> Vec<(String, bool)> {
    let own = p.own_mount_namespace() == Some(true);
    info.mounts
        .iter()
        .filter_map(|(path, host)| {
            let on_node = std::fs::read(root.join(host.trim_start_matches('/'))).ok()?;
            let pid = p.pid;
            if !own {
                return Some((
                    format!(
                        "{which} pid {pid}: {path} not visible (no mount namespace of its own)"
                    ),
                    false,
                ));
            }
            let mount = p.mount_root(path).unwrap_or_else(|| "no mount".into());
            let seen = p.read_seen(path, MAX_MOUNTED_BYTES);
            let same = seen.as_deref() == Some(on_node.as_slice());
            let content = match (&seen, same) {
                (None, _) => "unreadable",
                (Some(_), true) => "the content on the node now",
                (Some(_), false) => "other content than on the node now",
            };
            let stale = mount.ends_with("//deleted") || !same;
            Some((
                format!("{which} pid {pid}: {path} is {mount}, reads {content}"),
                stale,
            ))
        })
        .collect()
}

/// Largest mounted file compared with the node's (kubeconfigs are a few KB).
const MAX_MOUNTED_BYTES: u64 = 1 << 20;

/// The evidence in one line.
fn summary(e: &Evidence) -> String {
    let mut parts = vec![match e.old_pids.as_slice() {
        [] => "no process ran before the stop".to_string(),
        pids => format!("old pid {pids:?} exited"),
    }];
    if let (Some(pid), Some(ms)) = (e.new_pid, e.started_after_stop_ms) {
        parts.push(format!(
            "new pid {pid} started {:.1} s after the old ones exited",
            ms as f64 / 1000.0
        ));
    }
    parts.push(format!(
        "alive after {:.1} s",
        e.alive_for_ms as f64 / 1000.0
    ));
    parts.extend(e.lease.clone());
    parts.extend(e.probe.clone().map(|p| format!("probe {p}")));
    parts.extend(
        e.mounts
            .iter()
            .filter(|m| !m.contains("not visible"))
            .cloned(),
    );
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_restart_names_the_platforms_own_calls() {
        let k = Platform::Kubeadm {
            manifests: "/etc/kubernetes/manifests".into(),
        };
        assert!(
            manual_restart(&k, "kube-vip.yaml")
                .contains("'/etc/kubernetes/manifests/kube-vip.yaml'")
        );
        let none = manual_restart(&Platform::None, "kube-vip");
        assert!(
            none.contains("'apiclient set settings.kubernetes.static-pods.kube-vip.enabled=false'")
        );
        assert!(none.contains("settings.kubernetes.static-pods.kube-vip.enabled=true'"));
        assert!(!none.contains("yourself"));
    }

    #[test]
    fn the_summary_says_what_was_seen() {
        let e = Evidence {
            old_pids: vec![10],
            new_pid: Some(20),
            started_after_stop_ms: Some(600),
            alive_for_ms: 3000,
            mounts: vec![
                "new pid 20: /etc/kubernetes/admin.conf not visible (no mount namespace of its own)"
                    .into(),
                "old pid 10: /etc/kubernetes/admin.conf is /a//deleted, reads other content".into(),
            ],
            lease: Some("kube-system/plndr-cp-lock written".into()),
            ..Evidence::default()
        };
        assert_eq!(
            summary(&e),
            "old pid [10] exited; new pid 20 started 0.6 s after the old ones exited; alive after 3.0 s; \
             kube-system/plndr-cp-lock written; old pid 10: /etc/kubernetes/admin.conf is \
             /a//deleted, reads other content"
        );
    }
}
