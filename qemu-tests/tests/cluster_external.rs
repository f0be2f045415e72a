//! Cluster scenario (issue 10): external etcd with no person. The etcd node and the control
//! plane start `run --once` at the same moment in cluster mode; the etcd node renews, restarts
//! its member under the etcd lock and publishes the renewed apiserver-etcd-client pair through
//! etcd; the control plane renews its own leaves and installs the published pair (on its first
//! pass if the pair was already there, else on the next one, as the daemon does), restarting
//! kube-apiserver under the lock. Nothing is exported, copied or imported by hand. The control
//! plane's static pods are the REAL kube-apiserver, controller-manager and scheduler v1.20.2:
//! after the passes the apiserver is ready (its `/readyz` checks etcd with the installed pair)
//! and kubectl with the renewed admin.conf reads back a ConfigMap written before.
//!
//! One VM with two node roots, as the external-etcd scenario (same reasons: both share only
//! loopback, which coordination through etcd needs anyway; a second VM adds a ~25 s boot under
//! TCG and a virtual network and proves nothing more about certrotor). The host tests
//! (`agent/tests/cluster.rs`) cover three etcd nodes and two control planes with real
//! kube-apiservers and 100 ms sampling; this scenario proves the same path through the OCI
//! image, the host containers and the Bottlerocket API in the VM.
//! Guest side: `qemu-tests/scenarios/cluster-external.sh` (1 boot, ~5 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

#[test]
fn etcd_node_publishes_and_the_control_plane_installs_without_a_person() {
    let (mut sc, t0) = scenario(
        "cluster-external",
        include_str!("../scenarios/cluster-external.sh"),
    );
    sc.artifacts().bins.require_k8s().unwrap();
    let b = sc.boot(&real_cp_boot(Duration::from_secs(1200))).unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    // The etcd node renewed, restarted etcd under the cluster lock and published the pair.
    let etcd_run = json(&b, "etcd-run.json");
    assert!(
        etcd_run["renew"]["backup_id"].is_string(),
        "{}",
        b.failure(&format!("etcd node renewed nothing: {etcd_run}"))
    );
    assert!(
        etcd_run["cluster"]["pair"].is_string(),
        "{}",
        b.failure(&format!("etcd node published no pair: {etcd_run}"))
    );
    assert_eq!(
        etcd_run["cluster"]["lock"],
        "acquired",
        "{}",
        b.failure(&format!("etcd node restarted without the lock: {etcd_run}"))
    );

    // The control plane installed exactly that pair, in one of its two passes.
    let runs = [json(&b, "cp-run-1.json"), json(&b, "cp-run-2.json")];
    let installed: Vec<&serde_json::Value> = runs
        .iter()
        .filter(|r| r["import"].is_object() && !r["import"].is_null())
        .collect();
    assert_eq!(
        installed.len(),
        1,
        "{}",
        b.failure(&format!(
            "not exactly one control-plane pass installed the pair: {runs:?}"
        ))
    );
    assert!(
        runs[0]["renew"]["backup_id"].is_string(),
        "{}",
        b.failure(&format!("control plane renewed nothing: {}", runs[0]))
    );
    let before = sha_out(&b, "cp-client-sha-before");
    let after = sha_out(&b, "cp-client-sha");
    assert_ne!(
        before,
        after,
        "{}",
        b.failure("the control plane kept its old pair")
    );
    assert_eq!(
        after,
        sha_out(&b, "etcd-node-client-sha"),
        "{}",
        b.failure("the control plane's pair is not the etcd node's")
    );
    // The pass that installed it restarted kube-apiserver, which started again after that
    // pass began (the apiserver's etcd client reads the pair it names at each connection; a
    // pass installs before it restarts).
    assert!(
        installed[0]["import"]["restarted"]
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r["component"] == "kube-apiserver")),
        "{}",
        b.failure(&format!(
            "the installing pass did not restart kube-apiserver: {}",
            installed[0]
        ))
    );
    let api = json(&b, "cp-state-kube-apiserver.json");
    let installing = if std::ptr::eq(installed[0], &runs[0]) {
        "cp-run-1"
    } else {
        "cp-run-2"
    };
    let begin: i64 = b
        .read_out(&format!("{installing}-begin-ms"))
        .unwrap()
        .parse()
        .unwrap();
    let last_start = api["history"]
        .as_array()
        .and_then(|h| h.last())
        .and_then(|h| h["started_at_ms"].as_i64())
        .unwrap_or(0);
    assert!(
        last_start >= begin,
        "{}",
        b.failure(&format!(
            "kube-apiserver not started again after {installing} (which installed the pair) began: {api}"
        ))
    );
    assert_kubectl_after(&b, &sc);
    // Every restart of both nodes went under the lock; etcd data survived.
    for r in runs.iter().chain([&etcd_run]) {
        if r["restarted"].as_array().is_some_and(|a| !a.is_empty()) {
            assert_eq!(
                r["cluster"]["lock"],
                "acquired",
                "{}",
                b.failure(&r.to_string())
            );
        }
    }
    assert_eq!(
        b.read_out("etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("etcd data")
    );
    let etcd_state = json(&b, "etcd-state-etcd.json");
    assert_eq!(
        pod_history(&etcd_state).0,
        2,
        "{}",
        b.failure(&format!("etcd restarted other than once: {etcd_state}"))
    );

    let end: i64 = b.read_out("end-ms").unwrap().parse().unwrap();
    let mut f = Figures::new("cluster-external");
    f.boot(&b);
    f.healthy_times(&b, "");
    f.line(format!(
        "both nodes rotated, pair installed, in {} s (etcd node pass and control-plane passes)",
        (end - begin) / 1000
    ));
    f.unavailability(&b, "etcd node run --once", &etcd_run, Some("etcd-state"));
    f.finish(&sc, t0);
}
