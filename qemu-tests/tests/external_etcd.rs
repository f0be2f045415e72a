//! External etcd: an etcd node and a control plane, rotated first with no person (cluster mode,
//! issue 10) and then by hand (scenario d), in one boot.
//!
//! Phase 1, cluster mode: the etcd node and the control plane start `run --once` at the same
//! moment; the etcd node renews, restarts its member under the etcd lock and publishes the
//! renewed apiserver-etcd-client pair through etcd; the control plane renews its own leaves and
//! installs the published pair (on its first pass if the pair was already there, else on the
//! next one, as the daemon does), restarting kube-apiserver under the lock. Nothing is
//! exported, copied or imported by hand. The host tests (`agent/tests/cluster.rs`) cover three
//! etcd nodes and two control planes with real kube-apiservers and 100 ms sampling; this phase
//! proves the same path through the OCI image, the host containers and the Bottlerocket API in
//! the VM. Each node's `--cluster-wait` follows from the other's bound (the restarts it may
//! make under the lock, each within the restart timeout), the restart timeout from this boot's
//! first start of the control plane: no wait is an idle host's figure.
//!
//! Phase 2, by hand, on the same nodes: the etcd node renews again (`run --once --all` restarts
//! etcd) and exports the apiserver-etcd-client pair; the control plane imports it (`etcd-client
//! import` restarts kube-apiserver and verifies it).
//!
//! After each phase the control plane's static pods, the REAL kube-apiserver, controller-manager
//! and scheduler v1.20.2, are healthy: the apiserver's `/readyz` includes its mTLS check of etcd
//! with the file its manifest names, which is the installed (imported) certificate, and kubectl
//! with admin.conf lists the namespaces and reads back a ConfigMap written before. The two
//! phases were two scenarios with a boot each; every assertion of both is kept, on the files
//! of its phase (phase 1's are prefixed `cluster-`), counts of starts taken from phase 2's own.
//!
//! One VM with two node roots, not two VMs: the control plane at `/` and the etcd node at
//! `/var/lib/nodes/etcd`, each with its own Bottlerocket API socket, kubelet-sim, static pods
//! and PKI, the etcd node on ports offset by 100 (`lab init --topology external-etcd
//! --port-offset 100`), and each certrotor run only ever sees its own root. The two nodes share
//! the kernel and loopback (which coordination through etcd needs anyway), which the scenario
//! does not otherwise depend on: by hand, the only thing that crosses between them is the
//! exported bundle, copied as an operator would. A second VM would add a ~25 s boot under TCG
//! and a virtual network to prove nothing more about certrotor.
//! Guest side: `qemu-tests/scenarios/external-etcd.sh` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[test]
fn etcd_node_and_control_plane_rotate_in_cluster_mode_then_by_export_and_import() {
    let (mut sc, t0) = k8s_scenario(
        "external-etcd",
        include_str!("../scenarios/external-etcd.sh"),
    );
    let b = boot_checked(&mut sc, &real_cp_boot());

    // ---- phase 1: cluster mode, no person
    // The etcd node renewed, restarted etcd under the cluster lock and published the pair.
    let cluster_etcd_run = json(&b, "cluster-etcd-run.json");
    assert!(
        cluster_etcd_run["renew"]["backup_id"].is_string(),
        "{}",
        b.failure(&format!("etcd node renewed nothing: {cluster_etcd_run}"))
    );
    assert!(
        cluster_etcd_run["cluster"]["pair"].is_string(),
        "{}",
        b.failure(&format!("etcd node published no pair: {cluster_etcd_run}"))
    );
    assert_eq!(
        cluster_etcd_run["cluster"]["lock"],
        "acquired",
        "{}",
        b.failure(&format!(
            "etcd node restarted without the lock: {cluster_etcd_run}"
        ))
    );

    // The control plane installed exactly that pair, in one of its two passes.
    let runs = [
        json(&b, "cluster-cp-run-1.json"),
        json(&b, "cluster-cp-run-2.json"),
    ];
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
    let cluster_before = sha_out(&b, "cluster-cp-client-sha-before");
    let cluster_after = sha_out(&b, "cluster-cp-client-sha");
    assert_ne!(
        cluster_before,
        cluster_after,
        "{}",
        b.failure("the control plane kept its old pair")
    );
    assert_eq!(
        cluster_after,
        sha_out(&b, "cluster-etcd-node-client-sha"),
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
    let cluster_api = json(&b, "cluster-cp-state-kube-apiserver.json");
    let installing = if std::ptr::eq(installed[0], &runs[0]) {
        "cluster-cp-run-1"
    } else {
        "cluster-cp-run-2"
    };
    let install_begin: i64 = b
        .read_out(&format!("{installing}-begin-ms"))
        .unwrap()
        .parse()
        .unwrap();
    let last_start = cluster_api["history"]
        .as_array()
        .and_then(|h| h.last())
        .and_then(|h| h["started_at_ms"].as_i64())
        .unwrap_or(0);
    assert!(
        last_start >= install_begin,
        "{}",
        b.failure(&format!(
            "kube-apiserver not started again after {installing} (which installed the pair) began: {cluster_api}"
        ))
    );
    assert_kubectl_after_as(&b, &sc, "cluster-");
    // Every restart of both nodes went under the lock; etcd data survived.
    for r in runs.iter().chain([&cluster_etcd_run]) {
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
        b.read_out("cluster-etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("etcd data")
    );
    let cluster_etcd_state = json(&b, "cluster-etcd-state-etcd.json");
    assert_eq!(
        pod_history(&cluster_etcd_state).0,
        2,
        "{}",
        b.failure(&format!(
            "etcd restarted other than once: {cluster_etcd_state}"
        ))
    );

    // ---- phase 2: by hand
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
        pod_history(&cluster_etcd_state).0 + 1,
        "{}",
        b.failure(&format!("etcd not restarted exactly once by hand: {state}"))
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
    b.assert_out("import.rc", "0", "import rc");
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
    let (starts_1, crashes_1, _) = pod_history(&cluster_api);
    assert_eq!(
        (starts - starts_1, crashes - crashes_1),
        (1, 0),
        "{}",
        b.failure(&format!("kube-apiserver (phase 1: {cluster_api}): {api}"))
    );
    let import_begin: i64 = b.read_out("import-begin-ms").unwrap().parse().unwrap();
    let restarted_at = api["history"][starts - 1]["started_at_ms"]
        .as_i64()
        .unwrap();
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
        let s1 = json(&b, &format!("cluster-cp-state-{pod}.json"));
        let (starts_1, exits_1, _) = pod_history(&s1);
        assert_eq!(
            (starts - starts_1) as u64,
            exits - exits_1,
            "{}",
            b.failure(&format!(
                "{pod} restarted by the import (phase 1: {s1}): {s}"
            ))
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

    let cluster_end: i64 = b.read_out("cluster-end-ms").unwrap().parse().unwrap();
    let cluster_begin: i64 = b.read_out("cluster-begin-ms").unwrap().parse().unwrap();
    let mut f = Figures::new("external-etcd (cluster mode, then d by hand)");
    f.boot(&b);
    f.healthy_times(&b, "");
    f.line(format!(
        "cluster mode: both nodes rotated, pair installed, in {} s (etcd node pass and \
         control-plane passes; restart timeout {}, cluster wait {})",
        (cluster_end - cluster_begin) / 1000,
        b.read_out("restart-timeout").unwrap_or_default(),
        b.read_out("cluster-wait").unwrap_or_default()
    ));
    f.unavailability(
        &b,
        "cluster mode: etcd node run --once",
        &cluster_etcd_run,
        Some("cluster-etcd-state"),
    );
    f.unavailability(
        &b,
        "by hand: etcd node run --once --all",
        &run,
        Some("etcd-state"),
    );
    f.line(format!(
        "import: kube-apiserver process down {} ms (kubelet-sim history)",
        gap.map_or("?".to_string(), |g| g.to_string())
    ));
    f.finish(&sc, t0);
}
