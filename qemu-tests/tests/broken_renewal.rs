//! Scenario e: a renewal that breaks for real, on the real control plane (the real
//! kube-apiserver, controller-manager and scheduler v1.20.2 and Debian's etcd, as the VM's static
//! pods). certrotor (superpowered host container) renews with the test-only failpoint
//! `foreign-ca:apiserver-etcd-client`: after validation the apiserver's etcd client pair is
//! re-signed by a throwaway CA (its key still matching), so after the apiserver's restart the
//! real etcd refuses it and the apiserver never becomes ready. certrotor sees kube-apiserver
//! fail, restores the backup, restarts again and exits 3 with a report and a log saying so. The
//! node is left serving the old, still valid certificates, healthy, and kubectl with the
//! restored admin.conf reads back a ConfigMap written before.
//! Guest side: `qemu-tests/scenarios/broken-renewal.sh` (1 boot, ~5 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[test]
fn rejected_certificate_is_rolled_back_and_reported() {
    let (mut sc, t0) = k8s_scenario(
        "broken-renewal",
        include_str!("../scenarios/broken-renewal.sh"),
    );
    let b = boot_checked(&mut sc, &real_cp_boot());

    // exit code 3, report and log
    b.assert_out("run.rc", "3", "certrotor exit code");
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
    let log = b.assert_out_contains(
        "run.log",
        &["verification failed", "rolled back to backup"],
        "the log",
    );
    assert!(
        log.contains("CERTROTOR-FAILPOINT foreign-ca:apiserver-etcd-client"),
        "{}",
        b.failure(&format!("the failpoint did not fire:\n{log}"))
    );
    // The failure is real: Debian's etcd refused the foreign-signed client certificate.
    let rejections = b.read_out("etcd-rejections.txt").unwrap_or_default();
    assert!(
        rejections.contains("unknown authority") || rejections.contains("bad certificate"),
        "{}",
        b.failure(&format!(
            "etcd never refused the apiserver's client certificate: the test proves nothing\n{rejections}"
        ))
    );

    // every file is back as it was, the old certificates are served and still valid
    let before = sums(&b, "pki-before.sha");
    let after = sums(&b, "pki-after.sha");
    assert_eq!(
        before,
        after,
        "{}",
        b.failure("the PKI differs from before the run")
    );
    assert_kubectl_after(&b, &sc);
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
    f.finish(&sc, t0);
}
