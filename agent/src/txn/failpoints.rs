//! Failpoints: with the `failpoints` feature, `CERTROTOR_FAILPOINT` stops the process at a named
//! step of a transaction, so tests can prove that a crash at any step is recovered.

#[cfg(feature = "failpoints")]
use std::time::Duration;

/// Stops the process at a named step when `CERTROTOR_FAILPOINT` says so. Tests only; not
/// documented for operators.
///
/// `CERTROTOR_FAILPOINT=N` stops at the N-th failpoint reached, `=NAME` at the first with that
/// name. The process is killed with SIGKILL (no destructors, no flush: like a power loss, as far
/// as a process can tell). With `CERTROTOR_FAILPOINT_ACTION=pause` it prints
/// `CERTROTOR-FAILPOINT <name>` to stderr and waits forever, so that a VM test can cut the power
/// at that instant.
///
/// Only with the cargo feature `failpoints` (the tests enable it); the shipped binary has an
/// empty function here and does not read the variable.
#[cfg(feature = "failpoints")]
pub fn failpoint(name: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let Ok(wanted) = std::env::var("CERTROTOR_FAILPOINT") else {
        return;
    };
    let n = COUNTER.fetch_add(1, Ordering::SeqCst) + 1;
    let hit = match wanted.parse::<usize>() {
        Ok(k) => k == n,
        Err(_) => wanted == name,
    };
    if !hit {
        return;
    }
    eprintln!("CERTROTOR-FAILPOINT {name} (#{n})");
    if std::env::var("CERTROTOR_FAILPOINT_ACTION").as_deref() == Ok("pause") {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
    std::process::abort();
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn failpoint(_name: &str) {}
