//! Scenario e: a broken renewal, for real. The test-only failpoint
//! `CERTROTOR_FAILPOINT=foreign-ca:apiserver-etcd-client` re-signs the renewed etcd client
//! certificate of the apiserver with a throwaway CA after validation; certrotor (superpowered
//! host container) renews, restarts etcd, restarts the real kube-apiserver, which the real etcd
//! refuses, sees it never become ready, restores the backup, restarts again and exits 3 with a
//! report and a log saying so. The node is left serving the old, still valid certificates,
//! healthy, and kubectl reads back what was written before.
//! Guest side: `qemu-tests/scenarios/broken-renewal.sh` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;

#[test]
fn rejected_certificate_is_rolled_back_and_reported() {
    let (mut sc, t0) = scenario(
        "broken-renewal",
        include_str!("../scenarios/broken-renewal.sh"),
    );
    let b = sc
        .boot(&BootOptions {
            timeout: boot_timeout(3),
            ..BootOptions::default()
        })
        .unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    // exit code 3, report and log
    assert_eq!(
        b.read_out("run.rc").unwrap(),
        "3",
        "{}",
        b.failure("certrotor exit code")
    );
    let report = json(&b, "run.json");
    let rolled = &report["rolled_back"];
    assert!(
        rolled.is_object(),
        "{}",
        b.failure(&format!("no rollback in the report: {report}"))
    );
    assert!(
        rolled["error"].is_null(),
        "{}",
        b.failure(&format!("rollback failed: {rolled}"))
    );
    let failure = rolled["failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains("kube-apiserver"),
        "{}",
        b.failure(&format!("failure: {failure}"))
    );
    let log = b.read_out("run.log").unwrap();
    for want in ["verification failed", "rolled back to backup"] {
        assert!(
            log.contains(want),
            "{}",
            b.failure(&format!("no {want:?} in the log:\n{log}"))
        );
    }
    assert!(
        log.contains("CERTROTOR-FAILPOINT foreign-ca:apiserver-etcd-client"),
        "{}",
        b.failure("the failpoint did not fire")
    );
    assert!(
        !b.read_out("etcd-rejections.txt").unwrap().is_empty(),
        "{}",
        b.failure("etcd never refused the apiserver's client certificate: the test proves nothing")
    );
    assert_kubectl_after(&b, &sc, "after", true);

    // every file is back as it was, the old certificates are served and still valid
    let before = sums(&b, "pki-before.sha");
    let after = sums(&b, "pki-after.sha");
    assert_eq!(
        before,
        after,
        "{}",
        b.failure("the PKI differs from before the run")
    );
    let old = assert_served_equals_files(&b, "served-before.txt");
    let now = assert_served_equals_files(&b, "served-after.txt");
    assert_eq!(old, now, "{}", b.failure("served certificates changed"));
    let check = json(&b, "check-after.json");
    for n in STACKED_LEAVES {
        let c = cert(&check, n);
        let residual = c["residual_seconds"].as_i64().unwrap_or(0);
        assert!(
            residual > 86_400 && residual <= 2 * 86_400,
            "{}",
            b.failure(&format!("{n}: not the old 2-day certificate: {c}"))
        );
        assert_eq!(
            c["status"],
            "expiring",
            "{}",
            b.failure(&format!("{n}: {c}"))
        );
    }
    // the renewal's backup stays for the operator, next to the rollback's own (a rollback is
    // itself a transaction)
    let backups = b.read_out("backups.txt").unwrap();
    let id = rolled["backup_id"].as_str().unwrap_or("?");
    assert!(
        backups.lines().any(|l| l == id) && backups.lines().count() == 2,
        "{}",
        b.failure(&format!("backups: {backups:?}, renewal backup {id}"))
    );

    let mut f = Figures::new("e broken-renewal");
    f.boot(&b);
    f.unavailability(&b, "renewal (until the failure)", &report, Some("state"));
    f.unavailability(&b, "rollback restarts", rolled, None);
    f.readyz(&b, "renewal, failure and rollback", "readyz.txt");
    f.finish(&sc, t0);
}
