//! Scenario b: the node boots with every leaf certificate expired. certrotor runs as a
//! Bottlerocket bootstrap container (empty user-data: `run --once --platform none`) before the
//! kubelet starts the static pods; the REAL control plane (kube-apiserver, controller-manager,
//! scheduler v1.20.2, Debian's etcd) then comes up healthy on the renewed certificates, every
//! pod started after the renewal, and kubectl with the renewed admin.conf lists the namespaces
//! and reads back a ConfigMap the cluster held before the node was switched off.
//! Guest side: `qemu-tests/scenarios/expired-bootstrap.sh` (1 boot, ~3 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

#[test]
fn bootstrap_container_renews_expired_node_before_pods_start() {
    let (mut sc, t0) = scenario(
        "expired-bootstrap",
        include_str!("../scenarios/expired-bootstrap.sh"),
    );
    sc.artifacts().bins.require_k8s().unwrap();
    let b = sc.boot(&real_cp_boot(Duration::from_secs(720))).unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    // before: everything expired (check exit 2)
    assert_eq!(
        b.read_out("check-before.rc").unwrap(),
        "2",
        "{}",
        b.failure("check before")
    );
    let before = json(&b, "check-before.json");
    for n in STACKED_LEAVES {
        assert_eq!(cert(&before, n)["status"], "expired", "{}", b.failure(n));
    }

    // the bootstrap container: default command line, renewed, nothing restarted
    assert_eq!(
        b.read_out("bootstrap.rc").unwrap(),
        "0",
        "{}",
        b.failure("bootstrap rc")
    );
    let log = b.read_out("bootstrap.log").unwrap();
    assert!(
        log.contains("arguments from the container's user-data: run --once --platform none"),
        "{}",
        b.failure(&format!("bootstrap container command line:\n{log}"))
    );
    // empty user-data: the table report, not JSON
    let report = b.read_out("bootstrap.json").unwrap();
    for want in ["Renewed 11 certificate(s)", "apiserver ", "etcd-server "] {
        assert!(
            report.contains(want),
            "{}",
            b.failure(&format!("no {want:?} in:\n{report}"))
        );
    }
    assert!(
        log.contains("platform none: restart etcd, kube-apiserver"),
        "{}",
        b.failure(&format!("bootstrap log:\n{log}"))
    );
    assert_eq!(
        b.read_out("backups.txt").unwrap().lines().count(),
        1,
        "{}",
        b.failure("backups")
    );

    // after: renewed for a year, served, every pod started after the bootstrap container:
    // etcd and the apiserver once; the real controller-manager and scheduler may exit while the
    // apiserver is still starting under TCG (kubelet-sim starts them again: printed)
    let check = json(&b, "check-after.json");
    let mut renewed: Vec<&str> = STACKED_LEAVES.to_vec();
    renewed.extend(KUBECONFIGS);
    assert_expiries(&b, &check, &renewed, 365);
    assert_served_equals_files(&b, "served.txt");
    assert_kubectl_after(&b, &sc);
    let done: i64 = b.read_out("bootstrap-done-ms").unwrap().parse().unwrap();
    let mut exits = String::new();
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashes, _) = pod_history(&state);
        if pod == "etcd" || pod == "kube-apiserver" {
            assert_eq!(
                (starts, crashes),
                (1, 0),
                "{}",
                b.failure(&format!("{pod}: {state}"))
            );
        } else {
            // started once, and again only after each exit of its own
            assert_eq!(
                starts as u64,
                1 + crashes,
                "{}",
                b.failure(&format!(
                    "{pod} started other than after its own exits: {state}"
                ))
            );
        }
        exits.push_str(&format!(" {pod} {crashes}"));
        let started = state["history"][0]["started_at_ms"].as_i64().unwrap();
        assert!(
            started >= done,
            "{}",
            b.failure(&format!("{pod} started before the renewal"))
        );
    }

    let mut f = Figures::new("b expired-bootstrap");
    f.boot(&b);
    f.healthy_times(&b, "");
    f.line(format!(
        "exits at start (kubelet-sim restarted them):{exits}"
    ));
    if let (Some(a), Some(z)) = (
        b.marker_time("MARK CERTROTOR-BEGIN"),
        b.marker_time("MARK CERTROTOR-END"),
    ) {
        f.line(format!(
            "bootstrap container {:.1}s (renewal only, before the pods start: no unavailability)",
            (z - a).as_secs_f64()
        ));
    }
    f.finish(&sc, t0);
}
