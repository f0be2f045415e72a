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

/// Boot 1: a healthy node, certrotor stopped at the failpoint, QEMU killed there. Returns the
/// scenario (its disk as the power loss left it), boot 1 and when the test began.
fn lose_power(loss: &Loss) -> (Scenario, Boot, Instant) {
    let (mut sc, t0) = k8s_scenario(loss.name, include_str!("../scenarios/power-loss.sh"));
    sc.write_share("failpoint", loss.failpoint.as_bytes())
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
    assert!(
        !b2.read_out("backups.txt").unwrap().is_empty(),
        "{}",
        b2.failure("no backup")
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

#[test]
fn power_loss_before_the_journal_is_undone() {
    let loss = Loss {
        name: "power-loss-backed-up",
        failpoint: "backed-up",
        rolls_forward: false,
    };
    let (mut sc, b1, t0) = lose_power(&loss);
    recover(&mut sc, &loss, true, &b1, t0);
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
    let (mut sc, b1, t0) = lose_power(&loss);
    let mut host_only = sc.fork("power-loss-renamed-no-bootstrap").unwrap();
    recover(&mut sc, &loss, true, &b1, t0);
    recover(&mut host_only, &loss, false, &b1, Instant::now());
}
