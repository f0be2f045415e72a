//! Cluster mode's part of the pass's restarts ([`crate::cluster::roles`]): this node's restart
//! record in etcd with the leader Leases it holds, the split of the restarts into those of
//! Leases other nodes hold (first) and this node's own (last), and the wait, releasing the
//! cluster lock, while another node still has to restart a component whose Lease this node
//! holds.

use std::time::Instant;

use crate::cluster;
use crate::cluster::roles::{self, LeadersLast, Role};
use crate::node::manifests::Component;
use crate::pass::run::Pass;
use crate::restart;

impl Pass<'_> {
    /// Cluster mode: writes (or rewrites) this node's restart record, `components` and `pods`
    /// with the leader Leases it holds among them ([`roles`]); a failure is only a warning
    /// (leaders then see no record of this node).
    pub(super) fn publish_record(&mut self, components: &[Component], pods: &[String]) {
        let Some(session) = &self.session else {
            return;
        };
        let listed = restart::pods(&self.platform).unwrap_or_default();
        let roles = roles::read(&self.node, session, &listed, (components, pods));
        let rec = roles::record(components, pods, &roles, session.clock.now());
        let written = match &self.restart_record {
            Some(g) => g.update(&rec),
            None => {
                let c = &self.opts.cluster;
                roles::publish(session, &rec, c.lease_ttl.min(c.wait))
                    .map(|g| self.restart_record = Some(g))
            }
        };
        if let Err(e) = written {
            log::warn!("cluster mode: writing this node's restart record: {e}");
        }
        // The report keeps every Lease seen, each as last read.
        let seen = &mut self.cluster.get_or_insert_with(Default::default).roles;
        seen.retain(|r| !roles.iter().any(|n| n.lease == r.lease));
        seen.extend(roles);
        seen.sort_by(|a, b| a.lease.cmp(&b.lease));
    }

    /// The leader Leases last read.
    fn roles(&self) -> &[Role] {
        self.cluster.as_ref().map_or(&[], |c| &c.roles)
    }

    /// Those this node holds, of `components` and `pods`.
    pub(super) fn held(&self, components: &[Component], pods: &[String]) -> Vec<Role> {
        let of = |r: &Role| {
            components.iter().any(|c| c.name() == r.restarts) || pods.contains(&r.restarts)
        };
        self.roles()
            .iter()
            .filter(|r| r.this_node && of(r))
            .cloned()
            .collect()
    }

    /// Under the lock: the Leases read again (leadership may have moved), and the components to
    /// restart split into those whose Lease this node does not hold (first) and those whose
    /// Lease it holds (last). Without the lock (acting alone), or on a single control plane
    /// (no other node a Lease could move to), all first, in the usual order.
    pub(super) fn leaders_split(
        &mut self,
        locked: bool,
        pods: &[String],
    ) -> (Vec<Component>, Vec<Component>) {
        if !locked || !self.session.as_ref().is_some_and(roles::others_may_lead) {
            return (self.to_restart.clone(), vec![]);
        }
        self.publish_record(&self.to_restart.clone(), pods);
        let roles = self.roles();
        let held = |c: &Component| roles.iter().any(|r| r.this_node && r.restarts == c.name());
        self.to_restart.iter().partition(|c| !held(c))
    }

    /// Leaders last ([`roles`]): this node holds a leader Lease; while another node still has
    /// to restart a component of a Lease this node holds, without holding it, the lock is
    /// released and taken again after a jittered pause, for at most `--leader-wait`; then it
    /// proceeds. `false`: the lock could not be taken again (what remains stays owed).
    pub(super) fn leaders_last(
        &mut self,
        lock: &mut Option<cluster::LockGuard>,
        last: &[Component],
        pods: &[String],
    ) -> bool {
        let started = Instant::now();
        let c = &self.opts.cluster;
        let bound = c.leader_wait.min(c.wait);
        self.publish_record(last, pods);
        let mut ll = LeadersLast::default();
        loop {
            let roles = self.held(last, pods);
            ll.held = roles
                .iter()
                .map(|r| {
                    format!(
                        "{} ({}, holder {})",
                        r.restarts,
                        r.lease,
                        r.holder.as_deref().unwrap_or("")
                    )
                })
                .collect();
            let Some(s) = self.session.as_ref().filter(|_| !ll.held.is_empty()) else {
                break;
            };
            let who = roles::blockers(&s.client, &s.node.name, &roles)
                .unwrap_or_else(|e| vec![format!("the restart records could not be read: {e}")]);
            if who.is_empty() {
                break;
            }
            let why = format!("leaders last: {}", who.join("; "));
            if started.elapsed() >= bound {
                log::warn!(
                    "cluster mode: leaders last: waited {} s (--leader-wait); proceeding: {why}",
                    bound.as_secs()
                );
                ll.bound_reached = true;
                break;
            }
            if ll.waited_for.last() != Some(&why) {
                log::info!("cluster mode: waiting: {why}");
                ll.waited_for.push(why);
            }
            // Release the lock, let the others take it, take it again.
            *lock = None;
            std::thread::sleep(cluster::jitter_between(
                std::time::Duration::from_millis(500),
                std::time::Duration::from_millis(2000),
            ));
            let waited_before = self.cluster.as_ref().map_or(0, |c| c.waited_ms);
            let again = cluster::before_restart(
                &self.node,
                self.session.as_ref(),
                last,
                &self.opts.cluster,
                &mut self.cluster,
            );
            if let Some(c) = self.cluster.as_mut() {
                c.waited_ms += waited_before;
            }
            match again {
                Ok(g) => *lock = g,
                Err(()) => return false,
            }
            self.publish_record(last, pods);
        }
        ll.waited_ms = started.elapsed().as_millis();
        if !ll.held.is_empty() {
            self.cluster
                .get_or_insert_with(Default::default)
                .leaders_last = Some(ll);
        }
        true
    }
}
