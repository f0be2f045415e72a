//! The pass's decision, for each component whose files were renewed, between a live reload
//! and a restart ([`crate::restart::reload`]'s table): waiting for a component to serve its
//! renewed files by itself, verifying one that recovery already started again, and the reason
//! of each restart.

use std::time::Instant;

use crate::node::manifests::Component;
use crate::pass::run::Pass;
use crate::restart::api::ApiStats;
use crate::restart::reload::{self, Action};
use crate::restart::{self, Reloaded, Restarted};

impl Pass<'_> {
    /// Live reload ([`reload`]): a component whose renewed files all reload by themselves is
    /// waited for until it serves them; one started again by recovery on the renewed files is
    /// verified; the others, and one that did not reload within the bound, are restarted, each
    /// with its reason.
    pub(super) fn decide_reloads(&mut self, names: &[String]) {
        // Pods that cannot be listed: versions only from flags, the others unknown (restart).
        let pods = restart::pods(&self.platform).unwrap_or_default();
        self.versions = reload::versions(&pods, &self.opts.restart.reload.versions);
        let held = self.held_certificates();
        for c in self.work.components.clone() {
            if self.verified_after_recovery(c) {
                continue;
            }
            let action = if self.owed_before.components.contains(&c) {
                Action::Restart {
                    because: "an earlier pass renewed its files and did not finish restarting it"
                        .into(),
                }
            } else {
                let ctx = reload::Context {
                    mode: self.opts.restart.mode,
                    version: self.versions.iter().find(|v| v.component == c),
                    held: &held,
                    now: self.opts.write.clock.now(),
                    margin: self.opts.restart.reload.held_cert_margin,
                };
                let d = reload::decide(c, names, &ctx);
                self.reload_notes.extend(d.notes);
                d.action
            };
            let reason = match action {
                Action::Restart { because } => because,
                Action::WaitLive => match self.wait_live(c, names) {
                    Ok(r) => {
                        self.reloaded.push(r);
                        continue;
                    }
                    Err(reason) => reason,
                },
            };
            self.reasons.insert(c, reason);
            self.to_restart.push(c);
        }
    }

    /// The renewed certificates' NotAfter before this pass renewed them, by catalog name (for
    /// the reload decision: what open connections may still present).
    fn held_certificates(&self) -> Vec<(String, i64)> {
        let plan = &self.renewed.plan;
        let planned_at = plan.not_before_unix + crate::renew::BACKDATE;
        plan.items
            .iter()
            .filter_map(|i| Some((i.name.clone(), planned_at + i.residual_seconds?)))
            .collect()
    }

    /// Waits for `c` to serve its renewed files by itself (and, for a client pair it reloads,
    /// checks that the server it is for accepts it: [`restart::pairs`]); the reason to restart
    /// it otherwise.
    fn wait_live(&self, c: Component, names: &[String]) -> Result<Reloaded, String> {
        let targets = restart::targets(&self.node, &self.platform, &[c], &self.opts.restart)
            .map_err(|e| format!("it could not be probed for a live reload: {e}"))?;
        let pods = restart::pods(&self.platform).unwrap_or_default();
        restart::pairs::check_renewed(&self.node, c, names, &pods, self.opts.restart.poll)?;
        targets
            .first()
            .and_then(|t| restart::wait_reloaded(self.root, t, &self.opts.restart))
            .ok_or_else(|| {
                format!(
                    "it did not serve its renewed certificate within {} s",
                    self.opts.restart.reload_timeout.as_secs()
                )
            })
    }

    /// Whether `c` was started again by recovery after its files were renewed and now serves
    /// them: then it counts as restarted, and is not restarted again.
    fn verified_after_recovery(&mut self, c: Component) -> bool {
        if self.state.started_by_recovery.is_empty() {
            return false;
        }
        let Ok(targets) = restart::targets(&self.node, &self.platform, &[c], &self.opts.restart)
        else {
            return false;
        };
        let Some(t) = targets.first() else {
            return false;
        };
        if !self.state.started_by_recovery.contains(&t.pod) {
            return false;
        }
        let t0 = Instant::now();
        match restart::wait_verified(self.root, t, &self.opts.restart) {
            Ok(served_sha256) => {
                log::info!(
                    "{} was started again by recovery on its renewed files",
                    c.name()
                );
                self.recovered_restarts.push(Restarted {
                    component: c,
                    pod: t.pod.clone(),
                    unavailable_ms: t0.elapsed().as_millis(),
                    served_sha256,
                    reason: "it was started again by recovery, on its renewed files".into(),
                    api: ApiStats::default(),
                });
                true
            }
            Err(e) => {
                log::warn!("{e}; restarting it");
                false
            }
        }
    }
}
