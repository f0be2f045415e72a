//! Scenario c: power loss mid-renewal. Boot 1 kills QEMU (SIGKILL: no flush, no shutdown) when
//! certrotor, paused by a failpoint, reaches a chosen step of its transaction. Boot 2 on the same
//! disk starts the node the Bottlerocket way (API, bootstrap container, kubelet, host container):
//! certrotor completes or undoes the transaction and the node ends healthy, with a consistent
//! PKI renewed for a year, served as on disk, CAs untouched and etcd data intact. The static
//! pods are the REAL kube-apiserver, controller-manager and scheduler v1.20.2 and Debian's
//! etcd; after the recovery kubectl with the renewed admin.conf lists the namespaces and reads
//! back a ConfigMap written in boot 1, before the interrupted renewal.
//! The two losses mid-swap (recovered with and without a bootstrap container) share their boot 1:
//! the scenario forks after it, each branch a copy-on-write overlay of the disk the loss left.
//! Scenario e shares a boot 1 with the power loss before the journal: before the interrupted
//! renewal, a renewal that breaks for real on the same real control plane. certrotor renews with
//! the test-only failpoint `foreign-ca:apiserver-etcd-client`: after validation the apiserver's
//! etcd client pair is re-signed by a throwaway CA (its key still matching), so after the
//! apiserver's restart the real etcd refuses it and the apiserver never becomes ready. certrotor
//! sees kube-apiserver fail, restores the backup, restarts again and exits 3 with a report and a
//! log saying so. The node is left serving the old, still valid certificates, healthy, and
//! kubectl with the restored admin.conf reads back the ConfigMap written before.
//! Guest side: `qemu-tests/scenarios/power-loss.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::{Boot, BootOptions, Scenario};
use std::collections::BTreeMap;
use std::time::Instant;

/// One power loss: where it hits (`failpoint`) and whether the interruption already replaced live
/// files (after the journal: the recovery rolls forward).
struct Loss {
    name: &'static str,
    failpoint: &'static str,
    rolls_forward: bool,
}

/// Boot 1: a healthy node, (`broken_first`: scenario e's rejected renewal, rolled back,) certrotor
/// stopped at the failpoint, QEMU killed there. Returns the scenario (its disk as the power loss
/// left it), boot 1 and when the test began.
fn lose_power(loss: &Loss, broken_first: bool) -> (Scenario, Boot, Instant) {
    let (mut sc, t0) = k8s_scenario(loss.name, include_str!("../scenarios/power-loss.sh"));
    sc.write_share("failpoint", loss.failpoint.as_bytes())
        .unwrap();
    sc.write_share("broken-first", if broken_first { b"yes" } else { b"no" })
        .unwrap();
    let b1 = sc
        .boot(&BootOptions {
            kill_at: Some(format!("CERTROTOR-FAILPOINT {} (", loss.failpoint)),
            ..real_cp_boot()
        })
        .unwrap();
    b1.expect_killed().unwrap();
    assert_guest_checks(&b1);
    b1.assert_out("checks-rc", "0", "checks");
    (sc, b1, t0)
}

/// Boot 2 on the disk the power loss left after `b1` (`bootstrap`: with the bootstrap container
/// before the kubelet): the node ends healthy, renewed, consistent.
fn recover(sc: &mut Scenario, loss: &Loss, bootstrap: bool, b1: &Boot, t0: Instant) {
    let before = sums(b1, "pki-before.sha");
    sc.write_share("bootstrap", if bootstrap { b"yes" } else { b"no" })
        .unwrap();
    let b2 = boot_checked(sc, &real_cp_boot());

    // the power loss hit where intended: live files untouched before the journal, some
    // replaced after it
    // (live files only: the staging folders of the interrupted run are beside them)
    let live = |m: &BTreeMap<String, String>| {
        m.iter()
            .filter(|(p, _)| !p.contains("/.certrotor"))
            .map(|(p, s)| (p.clone(), s.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    let at_boot = live(&sums(&b2, "pki-at-boot.sha"));
    let before = live(&before);
    if loss.rolls_forward {
        assert_ne!(
            before,
            at_boot,
            "{}",
            b2.failure("no live file was replaced at the failpoint")
        );
    } else {
        assert_eq!(
            before,
            at_boot,
            "{}",
            b2.failure("live files changed before the journal")
        );
    }
    let recovered_by = if bootstrap { "bootstrap" } else { "run" };
    let log = b2.read_out(&format!("{recovered_by}.log")).unwrap();
    let want = if loss.rolls_forward {
        "completed an interrupted renew"
    } else {
        "staging folder(s) holding the staged files of a run interrupted before it changed \
         anything; the PKI was not touched"
    };
    assert!(
        log.contains(want),
        "{}",
        b2.failure(&format!("no {want:?} in:\n{log}"))
    );

    // consistent PKI renewed for a year, CAs untouched, nothing left over
    let check = json(&b2, "check-after.json");
    let mut renewed: Vec<&str> = STACKED_LEAVES.to_vec();
    renewed.extend(KUBECONFIGS);
    assert_expiries(&b2, &check, &renewed, 365);
    let after = sums(&b2, "pki-after.sha");
    assert_untouched(&b2, &before, &after);
    let dirs = b2.read_out("pki-dirs.txt").unwrap();
    assert!(
        !dirs
            .lines()
            .any(|l| l.contains("certrotor") || l.contains(".tmp") || l.contains("staging")),
        "{}",
        b2.failure(&format!("leftovers next to the PKI:\n{dirs}"))
    );
    // the renewal's backup, beside any a run before the power loss left
    let earlier = b1.read_out("backups-before-loss.txt").unwrap();
    let backups = b2.read_out("backups.txt").unwrap();
    assert!(
        backups.lines().any(|l| !earlier.lines().any(|e| e == l)),
        "{}",
        b2.failure(&format!(
            "no new backup: {backups:?} (before the power loss: {earlier:?})"
        ))
    );

    // served = files, etcd data intact, the real apiserver answers the renewed admin.conf
    assert_served_equals_files(&b2, "served-after.txt");
    assert_kubectl_after(&b2, sc);
    assert_eq!(
        b2.read_out("etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b2.failure("etcd data after the power loss")
    );

    let mut f = Figures::new(&format!(
        "c {} (failpoint {}, {})",
        sc.name(),
        loss.failpoint,
        if bootstrap {
            "bootstrap container"
        } else {
            "host container only"
        }
    ));
    f.boot(b1);
    f.healthy_times(b1, "boot 1 ");
    figures(&mut f, &b2, bootstrap);
    f.healthy_times(&b2, "boot 2 ");
    f.finish(sc, t0);
}

fn figures(f: &mut Figures, b2: &Boot, bootstrap: bool) {
    f.boot(b2);
    if bootstrap
        && let (Some(a), Some(z)) = (
            b2.marker_time("MARK CERTROTOR-BEGIN bootstrap"),
            b2.marker_time("MARK CERTROTOR-END bootstrap"),
        )
    {
        f.line(format!(
            "boot 2 bootstrap container (recovery + renewal, pods not started yet) {:.1}s",
            (z - a).as_secs_f64()
        ));
    }
    let r = json(b2, "run.json");
    f.unavailability(b2, "boot 2 host container run --once", &r, Some("state"));
}

/// Scenario e on boot 1 (a renewal the real etcd rejects, rolled back by certrotor), then the
/// power loss before the journal, undone at boot 2.
#[test]
fn a_rejected_renewal_is_rolled_back_then_a_power_loss_before_the_journal_is_undone() {
    let loss = Loss {
        name: "power-loss-backed-up",
        failpoint: "backed-up",
        rolls_forward: false,
    };
    let (mut sc, b1, t0) = lose_power(&loss, true);
    assert_rejected_renewal_rolled_back(&b1, &sc);
    recover(&mut sc, &loss, true, &b1, t0);
}

/// Scenario e's assertions on its boot's `broken-*` outputs.
fn assert_rejected_renewal_rolled_back(b: &Boot, sc: &Scenario) {
    // exit code 3, report and log
    b.assert_out("broken.rc", "3", "certrotor exit code");
    let report = json(b, "broken.json");
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
        "broken.log",
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
    let before = sums(b, "broken-pki-before.sha");
    let after = sums(b, "broken-pki-after.sha");
    assert_eq!(
        before,
        after,
        "{}",
        b.failure("the PKI differs from before the run")
    );
    assert_kubectl_after_as(b, sc, "broken-");
    let old = assert_served_equals_files(b, "broken-served-before.txt");
    let now = assert_served_equals_files(b, "broken-served-after.txt");
    assert_eq!(old, now, "{}", b.failure("served certificates changed"));
    let check = json(b, "broken-check-after.json");
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
    let backups = b.read_out("broken-backups.txt").unwrap();
    let id = rolled["backup_id"].as_str().unwrap_or("?");
    assert!(
        backups.lines().any(|l| l == id) && backups.lines().count() == 2,
        "{}",
        b.failure(&format!("backups: {backups:?}, renewal backup {id}"))
    );

    let mut f = Figures::new("e broken-renewal (power-loss-backed-up, boot 1)");
    f.boot(b);
    f.unavailability(
        b,
        "renewal (until the failure)",
        &report,
        Some("broken-state"),
    );
    f.unavailability(b, "rollback restarts", rolled, None);
    f.finish_to(sc, "figures-e.txt");
}

/// One power loss mid-swap, recovered two ways from the same disk (the scenario forks after
/// boot 1): with the bootstrap container, and without one, where the kubelet starts the pods on
/// the half-swapped PKI (the apiserver crash-loops on a key that does not match) while the host
/// container's `run --once` completes the transaction and, through its restart marker, restarts
/// every component.
#[test]
fn power_loss_mid_swap_is_completed_with_and_without_a_bootstrap_container() {
    let loss = Loss {
        name: "power-loss-renamed",
        failpoint: "renamed",
        rolls_forward: true,
    };
    let (mut sc, b1, t0) = lose_power(&loss, false);
    let mut host_only = sc.fork("power-loss-renamed-no-bootstrap").unwrap();
    recover(&mut sc, &loss, true, &b1, t0);
    recover(&mut host_only, &loss, false, &b1, Instant::now());
}
