//! What a pass does in cluster mode: connect ([`Session`], [`start_for_pass`]), then before
//! restarting wait for the gates and take the lock ([`Session::acquire`], [`before_restart`]),
//! and what it reports ([`ClusterReport`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::client::Client;
use super::discover::{NodeInfo, discover};
use super::gates::{Gate, PROBE_TIMEOUT, apiserver_gate_until, etcd_gate_for};
use super::lock::{LockGuard, try_lock};
use super::{APISERVERS_PREFIX, ClusterError, ClusterOptions, Mode, err, roles};
use crate::node::Node;
use crate::node::manifests::{Component, PodInfo};
use crate::sys::clock::SharedClock;

/// The cluster part of a pass report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterReport {
    /// This node's name in the lock.
    pub node: String,
    pub endpoints: Vec<String>,
    /// `acquired`, `not needed`, `not acquired`.
    pub lock: String,
    /// Who held the lock while this node waited (last seen).
    pub lock_holder_seen: Option<String>,
    pub gates: Vec<Gate>,
    /// Every reason this node waited, in order, with repeats collapsed.
    pub waited_for: Vec<String>,
    pub waited_ms: u128,
    /// Restarts were put off (they stay owed to the next pass).
    pub deferred: bool,
    /// The lease expired while restarting (another node may have proceeded).
    pub lock_lost: bool,
    /// The apiserver-etcd-client pair this pass published or installed (external etcd).
    pub pair: Option<String>,
    /// A published pair was refused (nothing installed; the current pair stays in use).
    pub pair_error: Option<String>,
    pub error: Option<String>,
    /// The leader Leases of what this node restarts, as last read (under the lock).
    pub roles: Vec<roles::Role>,
    /// Leaders last: what this node, holding a leader Lease, waited for.
    pub leaders_last: Option<roles::LeadersLast>,
}

/// A connected node: its identity, client, and the clock its options carried.
pub struct Session {
    pub node: NodeInfo,
    pub client: Arc<Client>,
    pub clock: SharedClock,
}

impl Session {
    /// Discovers the node and connects; `Ok(None)` when cluster mode is off or has no
    /// endpoints. Registers this node's apiserver for the others' gate.
    pub fn start(
        local: &Node,
        pods: &[(String, PodInfo)],
        opts: &ClusterOptions,
    ) -> Result<Option<Session>, ClusterError> {
        let Some(node) = discover(local, pods, opts)? else {
            return Ok(None);
        };
        let client = Arc::new(Client::new(&node.access)?);
        let clock = opts.clock.clone();
        let s = Session {
            node,
            client,
            clock,
        };
        // Best effort: learn every member's endpoint, register the apiserver.
        let _ = s.client.members();
        if let Some(addr) = s.node.apiserver {
            let now = s.clock.now();
            let value = json!({
                "endpoint": addr.to_string(),
                "updated": crate::sys::clock::rfc3339(now),
                "updated_unix": now,
            });
            if let Err(e) = s.client.put(
                &format!("{APISERVERS_PREFIX}{}", s.node.name),
                value.to_string().as_bytes(),
                0,
            ) {
                log::warn!("cluster mode: registering this apiserver: {e}");
            }
        }
        Ok(Some(s))
    }

    /// The gates, and whether any etcd member had a leader; the apiserver gate ends by
    /// `deadline` (or after one probe's time, when that is later).
    fn gates(
        &self,
        local: &Node,
        components: &[Component],
        deadline: Instant,
    ) -> (Vec<Gate>, bool) {
        let own = self.node.etcd_member.then_some(self.node.name.as_str());
        let (etcd, reached) = etcd_gate_for(&self.client, own);
        let mut gates = vec![etcd];
        if reached
            && components.contains(&Component::KubeApiserver)
            && self.node.apiserver.is_some()
        {
            let deadline = deadline.max(Instant::now() + Duration::from_secs(1));
            gates.push(apiserver_gate_until(
                &self.client,
                local,
                &self.node,
                deadline,
                self.clock.now(),
            ));
        }
        (gates, reached)
    }

    /// Runs the gates, keeps them in `report`, and answers with the failed ones (as reasons to
    /// wait) and whether any etcd member had a leader.
    fn check_gates(
        &self,
        local: &Node,
        components: &[Component],
        deadline: Instant,
        report: &mut ClusterReport,
    ) -> (Vec<String>, bool) {
        let (gates, reached) = self.gates(local, components, deadline);
        let failed = gates
            .iter()
            .filter(|g| !g.passed)
            .map(|g| format!("gate {}: {}", g.name, g.detail))
            .collect();
        report.gates = gates;
        (failed, reached)
    }

    /// Waits (bounded by `opts.wait`, with jitter) until the gates pass and the lock is taken.
    /// When no etcd member had a leader during the whole wait (every member down, quorum lost,
    /// or every etcd certificate expired: the cluster is down already and restarting is the way
    /// back), the node acts alone.
    pub fn acquire(
        &self,
        local: &Node,
        components: &[Component],
        opts: &ClusterOptions,
        report: &mut ClusterReport,
    ) -> Acquired {
        let started = Instant::now();
        let mut ever_reached = false;
        let deadline = started + opts.wait;
        let waited = |report: &mut ClusterReport, why: String| {
            if report.waited_for.last() != Some(&why) {
                log::info!("cluster mode: waiting: {why}");
                report.waited_for.push(why);
            }
        };
        loop {
            let (failed, reached) = self.check_gates(local, components, deadline, report);
            ever_reached |= reached;
            if failed.is_empty() {
                match try_lock(
                    &self.client,
                    &self.node.name,
                    opts.lease_ttl,
                    self.clock.now(),
                ) {
                    Ok(Ok(guard)) => {
                        // Check again under the lock: another holder may have just finished.
                        let again = deadline.max(Instant::now() + PROBE_TIMEOUT);
                        let (failed, _) = self.check_gates(local, components, again, report);
                        if failed.is_empty() {
                            report.lock = "acquired".into();
                            report.waited_ms = started.elapsed().as_millis();
                            log::info!(
                                "cluster lock acquired by {} (lease {})",
                                self.node.name,
                                guard.lease
                            );
                            return Acquired::Lock(guard);
                        }
                        drop(guard);
                        waited(report, failed.join("; "));
                    }
                    Ok(Err(holder)) => {
                        report.lock_holder_seen = Some(holder.clone());
                        waited(report, format!("lock held by {holder}"));
                    }
                    Err(e) => waited(report, format!("lock: {e}")),
                }
            } else {
                waited(report, failed.join("; "));
            }
            let now = Instant::now();
            if now >= deadline {
                report.waited_ms = started.elapsed().as_millis();
                if !ever_reached {
                    report.lock = "no etcd quorum: acted alone".into();
                    log::warn!(
                        "cluster mode: no etcd member had a leader for {}s; the cluster is down already, so this node restarts alone",
                        opts.wait.as_secs()
                    );
                    return Acquired::Alone;
                }
                report.lock = "not acquired".into();
                report.deferred = true;
                return Acquired::Deferred;
            }
            let pause = jitter_between(Duration::from_millis(500), Duration::from_millis(2000));
            std::thread::sleep(pause.min(deadline - now));
        }
    }
}

/// What [`Session::acquire`] got.
#[derive(Debug)]
pub enum Acquired {
    Lock(LockGuard),
    /// No etcd member had a leader during the whole wait: act alone.
    Alone,
    /// Gates or lock not passed in time: the restarts wait for the next pass.
    Deferred,
}

/// A random duration in `[lo, hi]`.
pub fn jitter_between(lo: Duration, hi: Duration) -> Duration {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 2];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    let r = f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX);
    lo + (hi.saturating_sub(lo)).mul_f64(r)
}

/// Connects for a pass, on a platform that restarts things: `None` when cluster mode is off or
/// finds no etcd endpoints here. A failure is kept in `report`, and restarts then wait.
pub fn start_for_pass(
    local: &Node,
    platform: &crate::restart::Platform,
    opts: &ClusterOptions,
    report: &mut Option<ClusterReport>,
) -> Option<Session> {
    if opts.mode == Mode::Off || matches!(platform, crate::restart::Platform::None) {
        return None;
    }
    let started = crate::restart::pods(platform)
        .map_err(|e| err(format!("cluster mode: {e}")))
        .and_then(|pods| Session::start(local, &pods, opts));
    match started {
        Ok(s) => s,
        Err(e) => {
            log::warn!("{}", e.0);
            report.get_or_insert_with(ClusterReport::default).error = Some(e.0);
            None
        }
    }
}

/// The session to coordinate restarts with after a renewal: `after` (opened on the files as they
/// are now) unless etcd refuses it while `before` (opened on the pair of the start of the pass)
/// still reaches etcd.
pub fn prefer_reachable(after: Option<Session>, before: Option<Session>) -> Option<Session> {
    match (after, before) {
        (Some(a), Some(b)) => match a.client.members() {
            Err(e) if b.client.members().is_ok() => {
                log::warn!(
                    "cluster mode: etcd refuses the client pair as it is now ({e}); \
                         coordinating with the pair this pass started with"
                );
                Some(b)
            }
            _ => Some(a),
        },
        (a, b) => a.or(b),
    }
}

/// The hook `pass::run::run_once` calls before restarting `components`: `Ok(None)` when cluster mode
/// is off (act alone); `Ok(Some(guard))` with the lock; `Err(())` when the restarts must wait
/// (the report says why).
#[allow(clippy::result_unit_err)]
pub fn before_restart(
    local: &Node,
    session: Option<&Session>,
    components: &[Component],
    opts: &ClusterOptions,
    report: &mut Option<ClusterReport>,
) -> Result<Option<LockGuard>, ()> {
    let Some(s) = session else {
        // Cluster mode is on but etcd could not be reached: restarts wait.
        if let Some(r) = report.as_mut().filter(|r| r.error.is_some()) {
            r.lock = "not acquired".into();
            r.deferred = true;
            return Err(());
        }
        return Ok(None);
    };
    let r = report.get_or_insert_with(ClusterReport::default);
    r.node = s.node.name.clone();
    r.endpoints = s.client.endpoints();
    match s.acquire(local, components, opts, r) {
        Acquired::Lock(g) => Ok(Some(g)),
        Acquired::Alone => Ok(None),
        Acquired::Deferred => {
            log::warn!(
                "cluster mode: restarts of {} put off to the next pass: {}",
                components
                    .iter()
                    .map(|c| c.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                r.waited_for.last().cloned().unwrap_or_default()
            );
            Err(())
        }
    }
}
