//! Cluster mode: leaders and the VIP holder last (issue 25.4). Restarting the kube-controller-
//! manager or kube-scheduler that holds its leader Lease forces an election (a SIGTERMed 1.20
//! leader does not release its Lease: its followers wait out the lease, ~15 s), and restarting
//! the kube-vip that holds `plndr-cp-lock` moves the VIP; restarting a follower costs nothing.
//! So a node that holds one of these Leases restarts that component after the other nodes have
//! restarted theirs:
//!
//! - As soon as its plan is known, each node writes [`RESTARTS_PREFIX`]`<node>` = [`Record`]
//!   (what it will restart, which Leases it holds) under an etcd lease kept alive while it runs
//!   (a dead node's record expires) and deleted when its restarts are done.
//! - Under the cluster lock, a node restarts first what it holds no Lease for; then, for the
//!   components whose Lease it holds, it waits ([`blockers`]) while another node's record still
//!   lists that component without holding its Lease, releasing the lock between checks, for at
//!   most `--leader-wait`; then it proceeds and says so. A node never waits to restart a
//!   component whose Lease it does not hold, so the waits form no cycle.
//!
//! A node's names ([`names`]): its etcd member name (kubeadm names the member after the node),
//! its host name (`os.Hostname()`, what kube-controller-manager and kube-scheduler put before
//! `_<uuid>` in `holderIdentity`; hostNetwork pods share the node's; a Bottlerocket host container
//! has a UTS namespace of its own but host-ctr sets no host name in it, so it reads the node's
//! as it was when the container started), and kube-vip's `vip_nodename`. A Lease that cannot be read is reported, and taken as held by no one.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{APISERVERS_PREFIX, Client, ClusterError, LockGuard, NodeInfo, Session, err};
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};
use crate::restart::lease::{self, Reader};

/// `<prefix><node>` → [`Record`]: what a node still has to restart.
pub const RESTARTS_PREFIX: &str = "certrotor/v1/restarts/";
/// The namespace of the leader Leases.
const NAMESPACE: &str = "kube-system";
/// The components that elect a leader through a Lease of their own name (1.20+: `leases` is the
/// default `--leader-elect-resource-lock` of both).
const LEADERS: [Component; 2] = [Component::KubeControllerManager, Component::KubeScheduler];

/// A leader Lease that matters to this pass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Role {
    /// `namespace/name`.
    pub lease: String,
    /// `spec.holderIdentity`; `None` when it could not be read (`error`) or does not exist.
    pub holder: Option<String>,
    /// The holder is this node.
    pub this_node: bool,
    /// The component or static pod of this node it concerns.
    pub restarts: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a node still has to restart, as the other nodes read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub components: Vec<String>,
    pub pods: Vec<String>,
    /// The Leases it holds (`namespace/name`).
    pub roles: Vec<String>,
    pub since: String,
    pub pid: u32,
}

/// Leaders last, as a node holding a Lease did it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeadersLast {
    /// What it restarted last, and why.
    pub held: Vec<String>,
    /// Every reason it waited, repeats collapsed.
    pub waited_for: Vec<String>,
    pub waited_ms: u128,
    /// It proceeded after `--leader-wait` with others still to go.
    pub bound_reached: bool,
}

/// This node's names, as a Lease holder may give them.
pub fn names(node: &NodeInfo, pods: &[(String, PodInfo)]) -> Vec<String> {
    let mut names = vec![node.name.clone(), super::discover::hostname()];
    names.extend(
        pods.iter()
            .filter(|(_, p)| p.kube_vip_lease().is_some())
            .filter_map(|(_, p)| p.env_value("vip_nodename").map(str::to_string)),
    );
    names.retain(|n| !n.is_empty() && n != "unknown");
    names.sort();
    names.dedup();
    names
}

/// The Leases of what this pass restarts: `components`' leader Leases and those of the kube-vip
/// pods among `restart_pods`, each read through this node's apiserver, else a registered one.
pub fn read(
    local: &Node,
    session: &Session,
    pods: &[(String, PodInfo)],
    (components, restart_pods): (&[Component], &[String]),
) -> Vec<Role> {
    let mut wanted: Vec<(String, String, String)> = LEADERS
        .iter()
        .filter(|c| components.contains(c))
        .map(|c| {
            (
                NAMESPACE.to_string(),
                c.name().to_string(),
                c.name().to_string(),
            )
        })
        .collect();
    for (name, p) in pods.iter().filter(|(n, _)| restart_pods.contains(n)) {
        if let Some((ns, lease)) = p.kube_vip_lease() {
            wanted.push((ns, lease, name.clone()));
        }
    }
    if wanted.is_empty() {
        return vec![];
    }
    let names = names(&session.node, pods);
    let readers = readers(local, session, pods);
    wanted
        .into_iter()
        .map(|(ns, lease, restarts)| {
            let mut role = Role {
                lease: format!("{ns}/{lease}"),
                holder: None,
                this_node: false,
                restarts,
                error: None,
            };
            let mut errors = vec![];
            for r in readers.iter() {
                match r
                    .as_ref()
                    .map_err(String::clone)
                    .and_then(|r| r.get(&ns, &lease))
                {
                    Ok(found) => {
                        role.holder = found.map(|l| l.holder).filter(|h| !h.is_empty());
                        errors.clear();
                        break;
                    }
                    Err(e) => errors.push(e),
                }
            }
            role.this_node = role
                .holder
                .as_deref()
                .is_some_and(|h| lease::held_by(h, &names));
            if !errors.is_empty() {
                role.error = Some(format!(
                    "not read ({}); taken as held by no one",
                    errors.join("; ")
                ));
                log::warn!("cluster mode: Lease {}: {}", role.lease, errors.join("; "));
            }
            role
        })
        .collect()
}

/// Whether a leader Lease held here could move to another control plane: this node's etcd
/// member has peers (a stacked control plane of several nodes), or another control plane's
/// apiserver is registered. On a single control plane the restarts keep their usual order
/// (issue 25.4: "on a single control plane, restart them as today").
pub fn others_may_lead(session: &Session) -> bool {
    let stacked_peers =
        session.node.etcd_member && session.client.members().is_ok_and(|m| m.len() > 1);
    stacked_peers
        || session
            .client
            .get_prefix(APISERVERS_PREFIX)
            .is_ok_and(|others| {
                !super::gates::candidates(others, &session.node, session.clock.now()).is_empty()
            })
}

/// Lease readers: this node's apiserver first, then the other registered ones.
fn readers(
    local: &Node,
    session: &Session,
    pods: &[(String, PodInfo)],
) -> Vec<Result<Reader, String>> {
    let mut out = vec![Reader::own(local, pods)];
    let registered = session
        .client
        .get_prefix(APISERVERS_PREFIX)
        .unwrap_or_default();
    for (key, value) in registered {
        let endpoint = serde_json::from_slice::<serde_json::Value>(&value)
            .ok()
            .and_then(|v| v.get("endpoint")?.as_str()?.parse().ok());
        match endpoint {
            Some(a) if Some(a) != session.node.apiserver => out.push(Reader::at(local, a)),
            Some(_) => {}
            None => out.push(Err(format!("{key}: no endpoint"))),
        }
    }
    out
}

/// This node's record in etcd, kept alive while the guard lives; dropping it deletes the record.
pub struct RecordGuard {
    client: Arc<Client>,
    key: String,
    lease: LockGuard,
}

impl std::fmt::Debug for RecordGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordGuard({})", self.key)
    }
}

impl RecordGuard {
    /// Writes `record` in place of the last one.
    pub fn update(&self, record: &Record) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(record).map_err(|e| err(e.to_string()))?;
        self.client.put(&self.key, &value, self.lease.lease)
    }
}

/// Writes this node's record under a lease of `ttl` kept alive until the guard is dropped.
pub fn publish(
    session: &Session,
    record: &Record,
    ttl: Duration,
) -> Result<RecordGuard, ClusterError> {
    let client = session.client.clone();
    let lease = client.grant(ttl)?;
    let guard = RecordGuard {
        key: format!("{RESTARTS_PREFIX}{}", session.node.name),
        lease: super::keep_alive(&client, lease, ttl, "restart record"),
        client,
    };
    guard.update(record)?;
    Ok(guard)
}

/// A record of what remains: `components` and `pods`, with the Leases of `roles` this node holds,
/// stamped `now` (Unix seconds).
pub fn record(components: &[Component], pods: &[String], roles: &[Role], now: i64) -> Record {
    Record {
        components: components.iter().map(|c| c.name().to_string()).collect(),
        pods: pods.to_vec(),
        roles: roles
            .iter()
            .filter(|r| r.this_node)
            .map(|r| r.lease.clone())
            .collect(),
        since: crate::sys::clock::rfc3339(now),
        pid: std::process::id(),
    }
}

/// Why this node, holding `roles`, must wait: the other nodes whose record still lists a
/// component or pod of a Lease this node holds, without holding that Lease.
pub fn blockers(client: &Client, node: &str, roles: &[Role]) -> Result<Vec<String>, ClusterError> {
    if !roles.iter().any(|r| r.this_node) {
        return Ok(vec![]);
    }
    let records: Vec<(String, Record)> = client
        .get_prefix(RESTARTS_PREFIX)?
        .into_iter()
        .filter_map(|(key, value)| {
            let other = key
                .strip_prefix(RESTARTS_PREFIX)
                .unwrap_or(&key)
                .to_string();
            Some((other, serde_json::from_slice::<Record>(&value).ok()?))
        })
        .collect();
    Ok(blocked_by(node, roles, &records))
}

/// [`blockers`] over the records read, `(node, record)`.
fn blocked_by(node: &str, roles: &[Role], records: &[(String, Record)]) -> Vec<String> {
    let mut out = vec![];
    for (other, rec) in records.iter().filter(|(other, _)| other != node) {
        let other = crate::sys::text::escape_controls(other);
        for r in roles.iter().filter(|r| r.this_node) {
            let listed = rec.components.contains(&r.restarts) || rec.pods.contains(&r.restarts);
            if listed && !rec.roles.contains(&r.lease) {
                out.push(format!(
                    "{other} still restarts {} (this node holds {}, holder {})",
                    r.restarts,
                    r.lease,
                    r.holder.as_deref().unwrap_or("")
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instant the records below are stamped at (2026-11-22T14:13:34Z).
    const NOW: i64 = 1_795_356_814;

    fn role(lease: &str, restarts: &str, this_node: bool) -> Role {
        Role {
            lease: lease.into(),
            holder: Some("cp-1_x".into()),
            this_node,
            restarts: restarts.into(),
            error: None,
        }
    }

    #[test]
    fn a_record_names_only_the_leases_held() {
        let roles = [
            role("kube-system/kube-scheduler", "kube-scheduler", true),
            role(
                "kube-system/kube-controller-manager",
                "kube-controller-manager",
                false,
            ),
        ];
        let r = record(
            &[Component::KubeControllerManager, Component::KubeScheduler],
            &["kube-vip".into()],
            &roles,
            NOW,
        );
        assert_eq!(r.since, "2026-11-22T14:13:34Z");
        assert_eq!(r.roles, ["kube-system/kube-scheduler"]);
        assert_eq!(r.components, ["kube-controller-manager", "kube-scheduler"]);
        assert_eq!(r.pods, ["kube-vip"]);
    }

    /// A holder waits for a follower's record of its component, not for the record of another
    /// holder (which has restarted its followers already), nor for its own: no cycle.
    #[test]
    fn a_holder_waits_only_for_followers_of_its_lease() {
        let kcm = "kube-system/kube-controller-manager";
        let sched = "kube-system/kube-scheduler";
        // cp-0 holds the controller-manager's Lease, cp-1 the scheduler's.
        let mine = [
            role(kcm, "kube-controller-manager", true),
            role(sched, "kube-scheduler", false),
        ];
        let both = [Component::KubeControllerManager, Component::KubeScheduler];
        let follower = record(&both, &[], &[], NOW);
        let other_leader_before = record(&both, &[], &[role(sched, "kube-scheduler", true)], NOW);
        let other_leader_after = record(
            &[Component::KubeScheduler],
            &[],
            &[role(sched, "kube-scheduler", true)],
            NOW,
        );
        let me = record(&both, &[], &mine, NOW);
        let w = blocked_by(
            "cp-0",
            &mine,
            &[
                ("cp-0".into(), me.clone()),
                ("cp-2".into(), follower.clone()),
            ],
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("cp-2 still restarts kube-controller-manager"),
            "{w:?}"
        );
        // cp-1 still has its controller-manager (a follower there) to restart.
        assert_eq!(
            blocked_by("cp-0", &mine, &[("cp-1".into(), other_leader_before)]).len(),
            1
        );
        // Done with its followers, cp-1 holds cp-0 back no more, and cp-1 never waits for
        // cp-0's scheduler (cp-0 holds no scheduler Lease; it restarts it first).
        assert!(blocked_by("cp-0", &mine, &[("cp-1".into(), other_leader_after)]).is_empty());
        let theirs = [role(sched, "kube-scheduler", true)];
        let me_after = record(&[Component::KubeControllerManager], &[], &mine, NOW);
        assert!(blocked_by("cp-1", &theirs, &[("cp-0".into(), me_after)]).is_empty());
        // A node with no Lease never waits.
        assert!(
            blocked_by(
                "cp-2",
                &[role(kcm, "kube-controller-manager", false)],
                &[("cp-0".into(), follower)]
            )
            .is_empty()
        );
    }
}
