//! The printed report of one `run` pass after its renewal table: the other static pods, the
//! live reloads and the restarts, the rollback, what the Bottlerocket API met, and the cluster
//! part (the lock, the gates, the Leases, leaders last).

use crate::pass::run::RunReport;

/// The restart part of one `run` pass (after [`super::renew_table`]), then what the Bottlerocket API
/// did to it.
pub fn run_table(r: &RunReport) -> String {
    let mut out = restarts_table(r);
    out.push_str(&api_lines(r));
    out
}

/// What the pass met in the Bottlerocket API: transactions an interrupted run left pending,
/// pods found stopped at the end, the retries and re-applies of the whole pass.
fn api_lines(r: &RunReport) -> String {
    let mut out = String::new();
    for t in &r.discarded_transactions {
        out.push_str(&format!(
            "Discarded the Bottlerocket API transaction '{}' left pending by an interrupted run \
             (it would have set {}).\n",
            t.name,
            t.sets.join(", ")
        ));
    }
    if !r.re_enabled.is_empty() {
        out.push_str(&format!(
            "Found stopped at the end of the pass and started again (not verified; owed to the \
             next pass): {}\n",
            r.re_enabled.join(", ")
        ));
    }
    for e in &r.left_disabled {
        out.push_str(&format!("STILL STOPPED: {e}\n"));
    }
    if let Some(text) = r.api.describe() {
        out.push_str(&format!("Bottlerocket API during this pass: {text}.\n"));
    }
    out
}

fn restarts_table(r: &RunReport) -> String {
    let mut out = pods_text(r);
    if r.components.is_empty() {
        if let Some(c) = r
            .cluster
            .as_ref()
            .filter(|c| c.pair.is_some() || c.pair_error.is_some() || c.error.is_some())
        {
            out.push_str(&cluster_table(c));
        }
        return out;
    }
    let names = r
        .components
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ");
    if r.platform == "none" {
        out.push_str(&format!(
            "Platform none: restart {names} so that they use the new certificates.\n"
        ));
        return out;
    }
    if let Some(c) = &r.cluster {
        out.push_str(&cluster_table(c));
        if c.deferred {
            out.push_str(&format!(
                "Restarts of {names} put off: they stay owed to the next pass.\n"
            ));
            return out;
        }
    }
    out.push_str(&reloads_text(r));
    out.push_str(&component_restarts_text(r));
    out
}

/// The static pods restarted or owed besides the components, and the imported etcd client pair.
fn pods_text(r: &RunReport) -> String {
    let mut out = String::new();
    for c in &r.other_consumers {
        let done = r.restarted_pods.iter().find(|p| p.pod == c.pod);
        out.push_str(&match done {
            Some(p) => format!(
                "  {:<24} unavailable {:>6} ms  healthy; restarted because {}\n",
                c.pod, p.unavailable_ms, c.reason
            ),
            None if r.platform == "none" && !r.renew.dry_run => {
                let stem = c.pod.strip_suffix(".yaml").unwrap_or(&c.pod);
                let how = crate::restart::manual_restart(&crate::restart::Platform::None, stem);
                format!("NOTE: {}: restart it: {how}\n", c.reason)
            }
            None => format!("NOTE: {}: restart it\n", c.reason),
        });
    }
    for e in &r.pod_errors {
        out.push_str(&format!("NOT RESTARTED: {e}\n"));
    }
    if !r.owed_pods.is_empty() {
        out.push_str(&format!(
            "Owed to the next pass, which restarts them again: {}\n",
            r.owed_pods.join(", ")
        ));
    }
    if let Some(i) = &r.import {
        out.push_str(&format!(
            "Installed the apiserver-etcd-client pair published through etcd ({} files, backup {}); kube-apiserver: {}\n",
            i.files.len(),
            i.backup_id,
            if i.rolled_back.is_some() {
                "ROLLED BACK"
            } else if i.restarted.is_empty() {
                "restart put off"
            } else {
                "restarted and verified"
            }
        ));
    }
    out
}

/// The versions decided by, and the components reloaded live.
fn reloads_text(r: &RunReport) -> String {
    let mut out = String::new();
    if !r.versions.is_empty() {
        let list: Vec<String> = r
            .versions
            .iter()
            .map(|v| match &v.origin {
                crate::restart::reload::Origin::ImageTag(image) => {
                    format!("{} {} ({image})", v.component.name(), v.version)
                }
                crate::restart::reload::Origin::Flag => {
                    format!("{} {} (flag)", v.component.name(), v.version)
                }
            })
            .collect();
        out.push_str(&format!("Versions: {}\n", list.join(", ")));
    }
    for x in &r.reloaded {
        out.push_str(&format!(
            "  {:<24} reloaded live in {:.1} s, not restarted{}\n",
            x.component.name(),
            x.reloaded_after_ms as f64 / 1000.0,
            x.served_sha256
                .as_deref()
                .map(|s| format!("; serves sha256 {s}"))
                .unwrap_or_default()
        ));
    }
    for n in &r.reload_notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

/// The components restarted, and the rollback if verification failed.
fn component_restarts_text(r: &RunReport) -> String {
    let mut out = String::new();
    if !r.restarted.is_empty() || r.rolled_back.is_some() {
        out.push_str(&format!(
            "Restarted one at a time on platform {}:\n",
            r.platform
        ));
    }
    for x in &r.restarted {
        out.push_str(&format!(
            "  {:<24} unavailable {:>6} ms  {}; restarted because {}\n",
            x.component.name(),
            x.unavailable_ms,
            x.served_sha256
                .as_deref()
                .map(|s| format!("serves sha256 {s}"))
                .unwrap_or_else(|| "healthy".into()),
            x.reason
        ));
        if let Some(text) = x.api.describe() {
            out.push_str(&format!("  {:<24} {text}\n", ""));
        }
    }
    if let Some(rb) = &r.rolled_back {
        out.push_str(&format!("VERIFICATION FAILED: {}\n", rb.failure));
        out.push_str(&format!(
            "Restored backup {} and restarted:\n",
            rb.backup_id
        ));
        for x in &rb.restarted {
            out.push_str(&format!(
                "  {:<24} unavailable {:>6} ms  previous certificate served{}\n",
                x.component.name(),
                x.unavailable_ms,
                if x.reason.contains("not restarted") {
                    " (its stop had not taken effect: verified, not restarted)"
                } else {
                    ""
                }
            ));
        }
        if let Some(e) = &rb.error {
            out.push_str(&format!("ROLLBACK INCOMPLETE: {e}\n"));
        }
    } else {
        out.push_str(&format!("All verified in {} ms.\n", r.duration_ms));
    }
    out
}

/// The cluster part of a pass: the lock, the gates, what was waited for.
pub fn cluster_table(c: &crate::cluster::ClusterReport) -> String {
    let mut out = format!(
        "Cluster: node {}, lock {} after {} ms (etcd {})\n",
        c.node,
        c.lock,
        c.waited_ms,
        c.endpoints.join(",")
    );
    if let Some(e) = &c.error {
        out.push_str(&format!("  error: {e}\n"));
    }
    for g in &c.gates {
        out.push_str(&format!(
            "  gate {:<24} {:<6} {}\n",
            g.name,
            if g.passed { "passed" } else { "FAILED" },
            g.detail
        ));
    }
    for w in &c.waited_for {
        out.push_str(&format!("  waited for: {w}\n"));
    }
    for r in &c.roles {
        let holder = r.holder.as_deref().unwrap_or("none");
        let mine = if r.this_node { " (this node)" } else { "" };
        out.push_str(&format!("  lease {} held by {holder}{mine}\n", r.lease));
        if let Some(e) = &r.error {
            out.push_str(&format!("    {e}\n"));
        }
    }
    if let Some(l) = &c.leaders_last {
        out.push_str(&format!(
            "  leaders last: restarted {} after the others ({} ms{})\n",
            l.held.join(", "),
            l.waited_ms,
            if l.bound_reached {
                ", --leader-wait reached: proceeded"
            } else {
                ""
            }
        ));
        for w in &l.waited_for {
            out.push_str(&format!("    waited for: {w}\n"));
        }
    }
    if let Some(p) = &c.pair {
        out.push_str(&format!("  apiserver-etcd-client: {p}\n"));
    }
    if let Some(p) = &c.pair_error {
        out.push_str(&format!("  REFUSED: {p}\n"));
    }
    if c.lock_lost {
        out.push_str("  LOCK LOST while restarting (the lease expired)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::manifests::{Component, Version};
    use crate::restart::reload::{ComponentVersion, Origin};

    /// A live pass's table names the versions it decided by and prints the reload notes.
    #[test]
    fn the_run_table_shows_versions_and_reload_notes() {
        let report = RunReport {
            renew: crate::pass::ops::RenewReport::empty(std::path::Path::new("/"), false),
            platform: "kubeadm".into(),
            components: vec![Component::KubeApiserver],
            reloaded: vec![crate::restart::Reloaded {
                component: Component::KubeApiserver,
                pod: "kube-apiserver.yaml".into(),
                reloaded_after_ms: 41_000,
                served_sha256: None,
            }],
            restarted: Vec::new(),
            versions: vec![
                ComponentVersion {
                    component: Component::KubeApiserver,
                    version: Version::new(1, 20, 2),
                    origin: Origin::ImageTag("k8s.gcr.io/kube-apiserver:v1.20.2".into()),
                },
                ComponentVersion {
                    component: Component::Etcd,
                    version: Version::new(3, 5, 16),
                    origin: Origin::Flag,
                },
            ],
            reload_notes: vec!["front-proxy-client: taken within 60 s".into()],
            other_consumers: Vec::new(),
            restarted_pods: Vec::new(),
            pod_errors: Vec::new(),
            owed_pods: Vec::new(),
            rolled_back: None,
            discarded_transactions: Vec::new(),
            re_enabled: Vec::new(),
            left_disabled: Vec::new(),
            api: Default::default(),
            cluster: None,
            import: None,
            duration_ms: 5,
        };
        let text = run_table(&report);
        assert!(
            text.contains(
                "Versions: kube-apiserver 1.20.2 (k8s.gcr.io/kube-apiserver:v1.20.2), \
                 etcd 3.5.16 (flag)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("reloaded live in 41.0 s, not restarted"),
            "{text}"
        );
        assert!(
            text.contains("  note: front-proxy-client: taken within 60 s\n"),
            "{text}"
        );
        assert!(!text.contains("Restarted one at a time"), "{text}");
    }
}
