//! The daemon: one pass every interval (with jitter), sooner after a failure (capped
//! back-off), until SIGTERM or SIGINT between passes. It only loops around
//! [`crate::pass::record::run_pass`]; every decision is the pass's.

use std::path::Path;
use std::time::Duration;

use crate::pass::ops::OpsError;
use crate::pass::run::{RunOptions, RunReport};

/// The daemon: `run_once` every `interval` (± 10% jitter); after a failure, again sooner with
/// capped back-off. Stops on SIGTERM or SIGINT between passes.
pub fn daemon(root: &Path, opts: &RunOptions, interval: Duration) {
    daemon_observed(root, opts, interval, &mut |_, _| {}, &mut || None);
}

/// [`daemon`], handing each pass's result and duration to `observe` (the metrics counters),
/// then doing `after` (a CA rotation to advance); `after` returning `Some(d)` brings the next
/// pass within `d`.
pub fn daemon_observed(
    root: &Path,
    opts: &RunOptions,
    interval: Duration,
    observe: &mut dyn FnMut(&Result<RunReport, OpsError>, Duration),
    after: &mut dyn FnMut() -> Option<Duration>,
) {
    install_stop_handler();
    let mut failures: u32 = 0;
    log::info!(
        "daemon started: root '{}', interval {}s",
        root.display(),
        interval.as_secs()
    );
    while !stop_requested() {
        let started = std::time::Instant::now();
        let result = crate::pass::record::run_pass(root, opts, Some(interval));
        observe(&result, started.elapsed());
        let wait = match result {
            Ok(report) => {
                let renewed = if report.renew.backup_id.is_some() {
                    report.renew.plan.items.len()
                } else {
                    0
                };
                log::info!(
                    "pass done: {renewed} renewed, {} restarted, {} reloaded live, platform {}{}{}",
                    report.restarted.len(),
                    report.reloaded.len(),
                    report.platform,
                    report
                        .cluster
                        .as_ref()
                        .map(|c| format!(
                            ", cluster lock {} after {} ms{}",
                            c.lock,
                            c.waited_ms,
                            if c.deferred { ", restarts put off" } else { "" }
                        ))
                        .unwrap_or_default(),
                    report
                        .rolled_back
                        .as_ref()
                        .map(|r| format!(", ROLLED BACK: {}", r.failure))
                        .unwrap_or_default()
                );
                if report.rolled_back.is_some()
                    || report.cluster.as_ref().is_some_and(|c| c.deferred)
                {
                    failures += 1;
                    backoff(failures, interval)
                } else {
                    failures = 0;
                    jitter(interval)
                }
            }
            Err(f) => {
                failures += 1;
                log::error!("pass failed: {f}");
                backoff(failures, interval)
            }
        };
        let wait = match after() {
            Some(soon) => wait.min(soon),
            None => wait,
        };
        log::info!("next pass in {}s", wait.as_secs());
        let until = std::time::Instant::now() + wait;
        while std::time::Instant::now() < until && !stop_requested() {
            std::thread::sleep(
                Duration::from_millis(250)
                    .min(until.saturating_duration_since(std::time::Instant::now())),
            );
        }
    }
    log::info!("daemon stopping");
}

/// After `failures` failed passes: 1 min, 2 min, 4 min … capped at the interval.
pub(crate) fn backoff(failures: u32, interval: Duration) -> Duration {
    let secs = 60u64.saturating_mul(1u64 << failures.saturating_sub(1).min(10));
    jitter(Duration::from_secs(secs).min(interval))
}

/// `d` ± 10%, so that nodes renewed together do not restart together.
pub(crate) fn jitter(d: Duration) -> Duration {
    use aws_lc_rs::rand::SecureRandom;
    let mut b = [0u8; 2];
    let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
    let r = f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX); // 0..=1
    d.mul_f64(0.9 + 0.2 * r)
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

fn install_stop_handler() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    // A handler rather than a blocked set and sigwait: a blocked mask would be inherited by
    // every command certrotor runs (ctr). nix has no safe way to install a handler.
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        #[allow(unsafe_code)]
        let _ = unsafe { sigaction(signal, &action) };
    }
}

fn stop_requested() -> bool {
    STOP.load(std::sync::atomic::Ordering::SeqCst)
}
