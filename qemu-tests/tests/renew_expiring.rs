//! Scenario a: a stacked control-plane node whose leaf certificates expire in 2 days. certrotor
//! runs from its OCI image as a superpowered host container (command line from its user-data):
//! it renews, restarts each static pod once through the Bottlerocket API and verifies.
//! Asserted: new expiries about a year away, CAs untouched, an etcd key written before still
//! readable, served certificates equal to the files, a backup holding the old files.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` (1 boot, ~1 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;
use std::time::Duration;

#[test]
fn host_container_renews_an_expiring_stacked_node() {
    let (mut sc, t0) = scenario(
        "renew-expiring",
        include_str!("../scenarios/renew-expiring.sh"),
    );
    let b = sc
        .boot(&BootOptions {
            timeout: Duration::from_secs(420),
            ..BootOptions::default()
        })
        .unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    let report = json(&b, "run.json");
    assert_eq!(
        b.read_out("run.rc").unwrap(),
        "0",
        "{}",
        b.failure("run rc")
    );
    assert!(
        report["rolled_back"].is_null(),
        "{}",
        b.failure(&format!("rolled back: {report}"))
    );
    let restarted: Vec<&str> = report["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["component"].as_str().unwrap())
        .collect();
    assert_eq!(restarted, PODS, "{}", b.failure("restart order"));
    let log = b.read_out("run.log").unwrap();
    assert!(
        log.contains("arguments from the container's user-data: run --once"),
        "{}",
        b.failure(&format!("certrotor did not take its user-data:\n{log}"))
    );

    // new expiries about a year away, sound chains and keys
    let check = json(&b, "check-after.json");
    let mut renewed: Vec<&str> = STACKED_LEAVES.to_vec();
    renewed.extend(KUBECONFIGS);
    assert_expiries(&b, &check, &renewed, 365);

    // CAs untouched, every renewed file changed
    let before = sums(&b, "pki-before.sha");
    let after = sums(&b, "pki-after.sha");
    assert_untouched(&b, &before, &after);
    for f in [
        "var/lib/kubeadm/pki/apiserver.crt",
        "var/lib/kubeadm/pki/apiserver.key",
        "var/lib/kubeadm/pki/etcd/server.crt",
        "var/lib/kubeadm/admin.conf",
        "var/lib/kubeadm/scheduler.conf",
    ] {
        assert_ne!(
            before.get(f),
            after.get(f),
            "{}",
            b.failure(&format!("{f} not renewed"))
        );
        assert!(
            after.contains_key(f),
            "{}",
            b.failure(&format!("{f} missing"))
        );
    }

    // etcd data survived the etcd restart with new certificates
    assert_eq!(
        b.read_out("etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("the etcd key written before the renewal")
    );

    // served = files, before (old) and after (new), and = what certrotor verified
    let old = assert_served_equals_files(&b, "served-before.txt");
    let new = assert_served_equals_files(&b, "served-after.txt");
    for ((c, o, _), (_, n, _)) in old.iter().zip(&new) {
        assert_ne!(
            o,
            n,
            "{}",
            b.failure(&format!("{c} still serves the old certificate"))
        );
        let verified = report["restarted"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["component"] == c.as_str())
            .map(|r| r["served_sha256"].clone());
        assert_eq!(verified, Some(serde_json::json!(n)), "{}", b.failure(c));
    }

    // each static pod restarted exactly once, no crash
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashes, _) = pod_history(&state);
        assert_eq!(
            (starts, crashes),
            (2, 0),
            "{}",
            b.failure(&format!("{pod}: {state}"))
        );
    }

    // a backup with the old files
    let id = report["renew"]["backup_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!id.is_empty(), "{}", b.failure("no backup id"));
    assert_eq!(
        b.read_out("backups.txt").unwrap(),
        id,
        "{}",
        b.failure("backups")
    );
    assert_eq!(
        Some(&b.read_out("backup-apiserver.sha").unwrap()),
        before.get("var/lib/kubeadm/pki/apiserver.crt"),
        "{}",
        b.failure("the backup does not hold the old apiserver.crt")
    );

    let mut f = Figures::new("a renew-expiring");
    f.boot(&b);
    f.unavailability(&b, "host container run --once", &report, Some("state"));
    f.finish(&sc, t0);
}
