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
