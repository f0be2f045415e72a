//! Scenario d: external etcd. The etcd node renews (`run --once` restarts etcd) and exports the
//! apiserver-etcd-client pair; the control plane imports it (`etcd-client import` restarts
//! kube-apiserver and verifies it). The control plane's static pods are the REAL kube-apiserver,
//! controller-manager and scheduler v1.20.2: the apiserver, started again after the import, is
//! ready (its `/readyz` includes its mTLS check of etcd with the file its manifest names, which
//! is the imported certificate), and kubectl with admin.conf lists the namespaces and reads back
//! a ConfigMap written before.
//!
//! One VM with two node roots, not two VMs: the control plane at `/` and the etcd node at
//! `/var/lib/nodes/etcd`, each with its own Bottlerocket API socket, kubelet-sim, static pods
//! and PKI, the etcd node on ports offset by 100 (`lab init --topology external-etcd
//! --port-offset 100`), and each certrotor run only ever sees its own root. The two nodes share
//! the kernel and loopback, which the scenario does not depend on: the only thing that crosses
//! between them is the exported bundle, copied as an operator would. A second VM would add a
//! ~25 s boot under TCG and a virtual network to prove nothing more about certrotor.
//! Guest side: `qemu-tests/scenarios/external-etcd.sh` (1 boot, ~4 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;

#[test]
fn etcd_node_renews_exports_control_plane_imports() {
    let (mut sc, t0) = scenario(
        "external-etcd",
        include_str!("../scenarios/external-etcd.sh"),
    );
    sc.artifacts().bins.require_k8s().unwrap();
    let b = sc.boot(&real_cp_boot(Duration::from_secs(900))).unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    // etcd node: renewed, etcd restarted once and serving the new certificate
    let run = json(&b, "etcd-run.json");
    let restarted: Vec<&str> = run["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["component"].as_str().unwrap())
        .collect();
    assert_eq!(
        restarted,
        ["etcd"],
        "{}",
        b.failure(&format!("etcd node run: {run}"))
    );
    let check = json(&b, "etcd-check.json");
    let leaves: Vec<String> = check["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "leaf")
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        leaves.len() >= 4,
        "{}",
        b.failure(&format!("etcd node leaves: {leaves:?}"))
    );
    let leaves: Vec<&str> = leaves.iter().map(String::as_str).collect();
    assert_expiries(&b, &check, &leaves, 365);
    let served = b.read_out("etcd-served").unwrap();
    let (got, file) = served.split_once(' ').unwrap();
    assert!(
        got.len() == 64 && got != EMPTY_SHA,
        "{}",
        b.failure("etcd served nothing")
    );
    assert_eq!(
        got,
        file,
        "{}",
        b.failure("etcd serves another certificate than its file")
    );
    let etcd_before = sums(&b, "etcd-before.sha");
    let etcd_after = sums(&b, "etcd-after.sha");
    for f in ["var/lib/etcd/pki/ca.crt", "var/lib/etcd/pki/ca.key"] {
        assert!(etcd_before.contains_key(f), "{}", b.failure(f));
        assert_eq!(
            etcd_before.get(f),
            etcd_after.get(f),
            "{}",
            b.failure(&format!("{f} changed"))
        );
    }
    let state = json(&b, "etcd-state-etcd.json");
    assert_eq!(
        pod_history(&state).0,
        2,
        "{}",
        b.failure(&format!("etcd: {state}"))
    );

    // the bundle is the etcd node's new client certificate
    assert_eq!(
        sha_out(&b, "bundle-sha"),
        sha_out(&b, "etcd-node-client-sha")
    );
    let bundle = b.read_out("bundle.pem").unwrap();
    assert!(
        bundle.contains("BEGIN CERTIFICATE") && bundle.contains("PRIVATE KEY"),
        "{}",
        b.failure("bundle")
    );

    // control plane: imported, kube-apiserver restarted once and using the new certificate
    assert_eq!(
        b.read_out("import.rc").unwrap(),
        "0",
        "{}",
        b.failure("import rc")
    );
    assert_eq!(
        sha_out(&b, "cp-client-sha"),
        sha_out(&b, "bundle-sha"),
        "{}",
        b.failure(&format!(
            "{} is not the imported certificate",
            b.read_out("cp-client-file").unwrap()
        ))
    );
    assert_ne!(
        sha_out(&b, "cp-client-sha-before"),
        sha_out(&b, "bundle-sha"),
        "{}",
        b.failure("the bundle holds the old certificate")
    );
    assert_kubectl_after(&b, &sc);
    let api = json(&b, "cp-state-kube-apiserver.json");
    let (starts, crashes, gap) = pod_history(&api);
    assert_eq!(
        (starts, crashes),
        (2, 0),
        "{}",
        b.failure(&format!("kube-apiserver: {api}"))
    );
    let import_begin: i64 = b.read_out("import-begin-ms").unwrap().parse().unwrap();
    let restarted_at = api["history"][1]["started_at_ms"].as_i64().unwrap();
    assert!(
        restarted_at >= import_begin,
        "{}",
        b.failure("apiserver restarted before the import")
    );
    // not restarted by the import; the real ones may exit on their own when they lose their
    // leader lease while the apiserver restarts (every extra start follows such an exit)
    for pod in ["kube-controller-manager", "kube-scheduler"] {
        let s = json(&b, &format!("cp-state-{pod}.json"));
        let (starts, exits, _) = pod_history(&s);
        assert_eq!(
            starts as u64,
            1 + exits,
            "{}",
            b.failure(&format!("{pod} restarted: {s}"))
        );
    }
    // control-plane CAs untouched; its own leaves were not part of this
    assert_untouched(&b, &sums(&b, "cp-before.sha"), &sums(&b, "cp-after.sha"));
    assert_eq!(
        b.read_out("etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("etcd data")
    );

    let mut f = Figures::new("d external-etcd");
    f.boot(&b);
    f.healthy_times(&b, "");
    f.unavailability(&b, "etcd node run --once", &run, Some("etcd-state"));
    f.line(format!(
        "import: kube-apiserver process down {} ms (kubelet-sim history)",
        gap.map_or("?".to_string(), |g| g.to_string())
    ));
    f.finish(&sc, t0);
}
