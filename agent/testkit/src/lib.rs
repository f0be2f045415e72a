//! Dev-only helpers shared by the workspace's test trees: certrotor's integration tests
//! (`agent/tests`) and the Bottlerocket test doubles' tests (`bottlerocket/testbed/tests`).
//! Only ever a `[dev-dependencies]` entry: nothing here reaches a shipped binary.
//!
//! - [`prereq`]: a test whose prerequisite (a tool, root) is missing FAILS, saying what to
//!   install. It never passes silently, in CI or not.
//! - [`wait_for`]: poll a condition with a deadline, failing with the last observation.
//! - [`date`]: civil dates to Unix seconds, for comparing what tools print.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

pub mod prereq {
    //! Prerequisites of a test. Missing means the test fails with what to do.

    use std::path::Path;

    /// Whether `tool` is an executable file in a folder of `PATH` (or `/usr/sbin`, `/sbin`).
    pub fn on_path(tool: &str) -> bool {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([Path::new("/usr/sbin").into(), Path::new("/sbin").into()])
            .any(|d| d.join(tool).is_file())
    }

    /// Fails `test` because a prerequisite is missing: a missing prerequisite is never a pass.
    #[track_caller]
    pub fn missing(test: &str, why: &str) -> ! {
        panic!(
            "{test}: prerequisite missing: {why}. Install it (images/setup-host.sh installs \
             everything the suite needs), or run the test command as root: this test does not \
             pass without it"
        )
    }

    /// Fails `test` unless every `(tool, Debian package)` is on PATH.
    #[track_caller]
    pub fn require_tools(test: &str, tools: &[(&str, &str)]) {
        for (tool, package) in tools {
            if !on_path(tool) {
                missing(
                    test,
                    &format!("'{tool}' is not installed (apt-get install -y {package})"),
                );
            }
        }
    }

    /// Whether the tests run as root.
    pub fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Fails `test` unless it runs as root; `why` says what needs root.
    #[track_caller]
    pub fn require_root(test: &str, why: &str) {
        if !is_root() {
            missing(test, &format!("root ({why})"));
        }
    }
}

/// Polls `probe` every `every` until it returns `Ok`; after `deadline`, fails naming `what` and
/// the last observation.
#[track_caller]
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= end => {
                panic!("timed out after {deadline:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

pub mod date {
    //! Civil dates to Unix seconds (UTC), independently of the code under test.

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// `YYYY-MM-DD?HH:MM:SS…` (any separators at 4, 7, 10, 13, 16) to Unix seconds.
    pub fn parse_iso(t: &str) -> i64 {
        let n = |r: std::ops::Range<usize>| {
            t.get(r.clone())
                .and_then(|s| s.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("not a date 'YYYY-MM-DD HH:MM:SS': '{t}'"))
        };
        days_from_civil(n(0..4), n(5..7), n(8..10)) * 86_400
            + n(11..13) * 3600
            + n(14..16) * 60
            + n(17..19)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn known_dates() {
            assert_eq!(days_from_civil(1970, 1, 1), 0);
            assert_eq!(parse_iso("2000-03-01T00:00:00Z"), 951_868_800);
            assert_eq!(parse_iso("2021-01-21 12:34:56Z"), 1_611_232_496);
        }
    }
}
