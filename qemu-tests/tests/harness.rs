//! Self-tests of the harness that need a VM but not containerd (~15 s): a failing guest
//! script is reported with its rc, and a boot that hangs hits the timeout and fails with the
//! serial log's path and tail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qemu_tests::{BootOptions, Ending, Scenario};
use std::time::Duration;

fn quick() -> BootOptions {
    BootOptions {
        timeout: Duration::from_secs(120),
        append: vec!["e2e.nocontainerd=1".into()],
        ..BootOptions::default()
    }
}

#[test]
fn guest_rc_and_outputs_reach_the_host() {
    let mut sc = Scenario::new("harness-rc").unwrap();
    sc.set_script(
        ". /usr/lib/certrotor-e2e/lib.sh\n\
         e2e_save boot \"$E2E_BOOT\"\n\
         e2e_save root-ro \"$(touch /x 2>/dev/null && echo rw || echo ro)\"\n\
         e2e_save etc-rw \"$(touch /etc/x 2>/dev/null && echo rw || echo ro)\"\n\
         exit 3\n",
    )
    .unwrap();
    let b = sc.boot(&quick()).unwrap();
    assert_eq!(b.ending, Ending::Finished { rc: 3 }, "{}", b.failure("rc"));
    assert!(b.expect_success().is_err());
    assert_eq!(b.read_out("boot").unwrap(), "1");
    assert_eq!(
        b.read_out("root-ro").unwrap(),
        "ro",
        "the root must be read-only"
    );
    assert_eq!(b.read_out("etc-rw").unwrap(), "rw", "/etc must be writable");
    assert_eq!(b.read_out("rc").unwrap(), "3");
    assert!(b.marker_time("CERTROTOR-E2E: BOOTED").is_some());
    assert!(b.marker_time("CERTROTOR-E2E: CONTAINERD-UP").is_none());
}

#[test]
fn hanging_boot_times_out_with_the_log_tail() {
    let mut sc = Scenario::new("harness-timeout").unwrap();
    sc.set_script("echo about-to-hang\nwhile :; do read -r _ < /dev/zero; done\n")
        .unwrap();
    let opts = BootOptions {
        timeout: Duration::from_secs(25),
        ..quick()
    };
    let err = sc.boot(&opts).unwrap_err().to_string();
    assert!(err.contains("timed out"), "{err}");
    assert!(err.contains("serial log: "), "{err}");
    assert!(err.contains("about-to-hang"), "{err}");
}

/// A first boot in which the guest kernel's soft-lockup watchdog fired is killed at that line
/// and runs again, once, on a fresh disk (`Scenario::boot`): here the guest prints the
/// watchdog's line and hangs on its first attempt, and finishes on the second, which finds none
/// of the first's disk.
#[test]
fn first_boot_locked_up_is_booted_again_once_on_a_fresh_disk() {
    let mut sc = Scenario::new("harness-lockup").unwrap();
    sc.set_script(
        ". /usr/lib/certrotor-e2e/lib.sh\n\
         if [ -f \"$E2E_SHARE/attempted\" ]; then\n\
           e2e_save leftover \"$(cat /var/lib/first-attempt 2>/dev/null || echo none)\"\n\
           e2e_save boot-count \"$E2E_BOOT_COUNT\"\n\
           exit 0\n\
         fi\n\
         touch \"$E2E_SHARE/attempted\"; echo on-disk > /var/lib/first-attempt; sync\n\
         echo '[   49.000] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [harness]'\n\
         while :; do read -r _ < /dev/zero; done\n",
    )
    .unwrap();
    let opts = BootOptions {
        timeout: Duration::from_secs(25),
        ..quick()
    };
    let b = sc.boot(&opts).unwrap();
    assert_eq!(b.ending, Ending::Finished { rc: 0 }, "{}", b.failure("rc"));
    assert_eq!(b.index, 1);
    assert_eq!(
        b.read_out("leftover").unwrap(),
        "none",
        "the disk was not fresh"
    );
    assert_eq!(b.read_out("boot-count").unwrap(), "1");
    let kept = std::fs::read_to_string(sc.dir().join("boot-1.lockup.serial.log")).unwrap();
    assert!(kept.contains("watchdog: BUG: soft lockup"), "{kept}");
    // Killed at the line, not left to run into the (25 s) timeout.
    assert!(
        kept.contains("[harness] guest soft lockup: QEMU killed"),
        "{kept}"
    );
    assert!(!kept.contains("TIMEOUT"), "{kept}");
}
