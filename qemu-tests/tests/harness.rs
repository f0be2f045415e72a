//! Self-tests of the harness that need a VM but not containerd: a failing guest
//! script is reported with its rc, and a boot that hangs (its console silent for its
//! `hang_after`) is stopped and fails with the serial log's path and tail, and a boot whose guest
//! kernel locked up is tried again once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use qemu_tests::{BootOptions, Ending, Scenario};
use std::time::Duration;

fn quick() -> BootOptions {
    BootOptions {
        append: vec!["e2e.nocontainerd=1".into()],
        ..BootOptions::default()
    }
}

/// The console silence that stops a boot in the tests that hang on purpose: above the longest
/// silent stretch of a healthy boot here (from QEMU's start to init's first line, ~7 s on an
/// idle host), with room for a host several times slower.
const HANG: Duration = Duration::from_secs(60);

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
        hang_after: HANG,
        ..quick()
    };
    let err = sc.boot(&opts).unwrap_err().to_string();
    assert!(err.contains("timed out"), "{err}");
    assert!(err.contains("serial log: "), "{err}");
    assert!(err.contains("about-to-hang"), "{err}");
}

/// A boot in which the guest kernel's soft-lockup watchdog fired is killed at that line and
/// runs again, once, on the disk as it was before the attempt (`Scenario::boot`): here each
/// boot's first attempt writes to the disk, prints the watchdog's line and hangs, and the
/// second finds what earlier boots kept and nothing of the attempt. Boot 1 and boot 2 both, as
/// boot 1 starts from the blank disk and boot 2 from what boot 1 left.
#[test]
fn locked_up_boot_is_booted_again_once_on_the_disk_before_it() {
    let mut sc = Scenario::new("harness-lockup").unwrap();
    sc.set_script(
        ". /usr/lib/certrotor-e2e/lib.sh\n\
         if [ -f \"$E2E_SHARE/attempted-$E2E_BOOT\" ]; then\n\
           echo \"kept by boot $E2E_BOOT\" > /var/lib/kept-$E2E_BOOT; sync\n\
           e2e_save leftover \"$(cat /var/lib/attempt-* 2>/dev/null || echo none)\"\n\
           e2e_save kept \"$(cat /var/lib/kept-* | tr '\\n' ,)\"\n\
           e2e_save boot-count \"$E2E_BOOT_COUNT\"\n\
           exit 0\n\
         fi\n\
         touch \"$E2E_SHARE/attempted-$E2E_BOOT\"\n\
         echo \"attempt of boot $E2E_BOOT\" > /var/lib/attempt-$E2E_BOOT; sync\n\
         echo '[   49.000] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [harness]'\n\
         while :; do read -r _ < /dev/zero; done\n",
    )
    .unwrap();
    let opts = BootOptions {
        hang_after: HANG,
        ..quick()
    };
    for index in 1..=2u32 {
        let b = sc.boot(&opts).unwrap();
        assert_eq!(b.ending, Ending::Finished { rc: 0 }, "{}", b.failure("rc"));
        assert_eq!(b.index, index);
        assert_eq!(
            b.read_out("leftover").unwrap(),
            "none",
            "the locked-up attempt's writes were not thrown away"
        );
        let kept: String = (1..=index).map(|i| format!("kept by boot {i},")).collect();
        assert_eq!(
            b.read_out("kept").unwrap(),
            kept,
            "earlier boots' writes lost"
        );
        assert_eq!(b.read_out("boot-count").unwrap(), index.to_string());
        let log = sc.dir().join(format!("boot-{index}.lockup.serial.log"));
        let kept_log = std::fs::read_to_string(log).unwrap();
        assert!(
            kept_log.contains("watchdog: BUG: soft lockup"),
            "{kept_log}"
        );
        // Killed at the line, not left to run into the silence that stops a hung boot.
        assert!(
            kept_log.contains("[harness] guest soft lockup: QEMU killed"),
            "{kept_log}"
        );
        assert!(!kept_log.contains("HUNG"), "{kept_log}");
    }
}
