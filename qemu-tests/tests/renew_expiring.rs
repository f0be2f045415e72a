//! Scenario a: a stacked control-plane node whose leaf certificates expire in 2 days. certrotor
//! runs from its OCI image as a superpowered host container (command line from its user-data):
//! it renews, restarts each static pod once through the Bottlerocket API and verifies.
//! Asserted: new expiries about a year away, CAs untouched, an etcd key written before still
//! readable, served certificates equal to the files, a backup holding the old files.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[test]
fn host_container_renews_an_expiring_stacked_node() {
    let (mut sc, t0) = scenario(
        "renew-expiring",
        include_str!("../scenarios/renew-expiring.sh"),
    );
    let (b, report, before) = renew_expiring_node(&mut sc);
    let log = b.read_out("run.log").unwrap();
    assert!(
        log.contains("arguments from the container's user-data: run --once"),
        "{}",
        b.failure(&format!("certrotor did not take its user-data:\n{log}"))
    );

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
    f.readyz(&b, "host container run --once", "readyz.txt");
    f.finish(&sc, t0);
}
