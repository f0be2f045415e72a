//! Issue 11.5: a control-plane node switched off for 400 days. The lab node is made with
//! one-year leaves, the guest clock jumps 400 days before anything starts, and the bootstrap
//! container (`run --once --platform none`) renews every expired leaf, the kubeconfigs and the
//! kubelet's client certificate (its expired serving pair removed) before any kubelet starts.
//! Then, with no human step, the REAL control plane comes up on the renewed files
//! (kube-apiserver, controller-manager and scheduler v1.20.2 and Debian's etcd, static pods
//! under kubelet-sim, as in scenario a) and the REAL kubelet v1.20.2 (containerd CRI + runc, an
//! empty static-pod folder of its own) starts with the renewed `kubelet.conf` and registers its
//! Node with the real apiserver (`--authorization-mode=Node,RBAC`, NodeRestriction): asserted,
//! read with the renewed admin.conf, the Node's Ready condition is True with a heartbeat at or
//! after the jumped boot time and its Lease in kube-node-lease renewed after it;
//! `kubectl --kubeconfig kubelet.conf get node cp-1` works (the kubelet's own credentials,
//! system:node:cp-1, through the Node authorizer: no RBAC binding grants system:nodes), the
//! old expired pair gets `Unauthorized`; the kubelet made itself a new serving pair. The lab's
//! etcd is empty at boot, so the kubelet creates its Node object rather than updating an old
//! one. Ready needs containerd to report the runtime network ready: a CNI network list with
//! only `loopback` is written (no pod here uses pod networking; `node_containerd_cri`).
//! The VM gets 2 vCPUs and 2.5 GiB (1 boot; figures in ARCHITECTURE.md).
//!
//! Scenario b (a node that boots with every leaf expired, renewed by the bootstrap container
//! before the kubelet starts the static pods) proved a subset of this on its own boot and is
//! merged here with every assertion it made: `check` exits 2 before, the bootstrap container
//! takes its command line from empty user-data (`run --once --platform none`) and says the
//! restarts are not its business, one backup, every pod started after it (etcd and the apiserver
//! once, the controller-manager and scheduler again only after exits of their own), and kubectl
//! with the renewed admin.conf lists the namespaces and reads back a ConfigMap the cluster held
//! before the node was switched off (written into its etcd while its certificates were valid).
//! Guest side: `qemu-tests/scenarios/days-off-400.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;

#[test]
fn node_off_for_400_days_heals_itself_at_boot() {
    let (mut sc, t0) = k8s_scenario("days-off-400", include_str!("../scenarios/days-off-400.sh"));
    // the kubelet's sandbox image, imported with containerd's CRI (no pod of the real kubelet
    // needs it here: its static-pod folder is empty)
    add_pause_image(&sc);
    let b = boot_checked(
        &mut sc,
        &BootOptions {
            smp: Some(2),
            mem_mib: Some(2560),
            ..BootOptions::default()
        },
    );

    // The clock really moved 400 days between making the node and booting it.
    let made: i64 = b.read_out("made-at").unwrap().parse().unwrap();
    let booted: i64 = b.read_out("booted-at").unwrap().parse().unwrap();
    assert!(
        booted - made >= 400 * 86_400,
        "{}",
        b.failure("clock not moved")
    );

    // Before: every leaf, kubeconfig and both kubelet certificates expired (check exit 2).
    b.assert_out("check-before.rc", "2", "check before");
    let before = json(&b, "check-before.json");
    let mut leaves: Vec<&str> = STACKED_LEAVES.to_vec();
    leaves.extend(KUBECONFIGS);
    for n in leaves.iter().chain(&["kubelet-client", "kubelet-serving"]) {
        assert_eq!(cert(&before, n)["status"], "expired", "{}", b.failure(n));
    }

    // The bootstrap container renewed all of it, the kubelet's client certificate included.
    b.assert_out("bootstrap.rc", "0", "bootstrap rc");
    // Its default command line (empty user-data), renewed, nothing restarted (not its business:
    // no pod runs yet); its report is the table, not JSON.
    b.assert_out_contains(
        "bootstrap.log",
        &[
            "arguments from the container's user-data: run --once --platform none",
            "platform none: restart etcd, kube-apiserver",
        ],
        "the bootstrap log",
    );
    assert_eq!(
        b.read_out("backups.txt").unwrap().lines().count(),
        1,
        "{}",
        b.failure("backups")
    );
    b.assert_out_contains(
        "bootstrap.json",
        &[
            "Renewed 11 certificate(s)",
            "apiserver ",
            "etcd-server ",
            "Reissued kubelet-client (expired) for system:node:cp-1",
            "Removed the expired kubelet-serving pair",
        ],
        "the bootstrap report",
    );
    // Installed as the kubelet installs it: a new dated file, the link swapped to it.
    let link_before = b.read_out("link-before.txt").unwrap();
    let link_after = b.read_out("link-after.txt").unwrap();
    assert_ne!(link_before, link_after, "{}", b.failure("link not swapped"));
    assert!(
        link_after
            .trim()
            .starts_with("/var/lib/kubelet/pki/kubelet-client-2"),
        "{}",
        b.failure(&link_after)
    );
    let pki = b.read_out("kubelet-pki.txt").unwrap();
    assert!(
        !pki.lines().any(|l| l == "kubelet.crt"),
        "{}",
        b.failure(&format!("expired serving pair still there:\n{pki}"))
    );
    assert_eq!(
        b.read_out("kubelet-subject.txt").unwrap().trim(),
        "subject=/O=system:nodes/CN=system:node:cp-1",
        "{}",
        b.failure("kubelet subject")
    );

    // After: a year ahead at the guest's clock; served by the real components.
    let check = json(&b, "check-after.json");
    let mut renewed = leaves.clone();
    renewed.push("kubelet-client");
    assert_expiries(&b, &check, &renewed, 365);
    assert_served_equals_files(&b, "served.txt");
    // The cluster's data from before the node was switched off, through the real apiserver.
    assert_kubectl_after(&b, &sc);
    // Every static pod first started after the renewal; etcd and the apiserver once, no crash
    // (the controller-manager and scheduler may exit while the apiserver is not up yet:
    // kubelet-sim starts them again, and only then; counted below).
    let done: i64 = b.read_out("bootstrap-done-ms").unwrap().parse().unwrap();
    let mut crashes = String::new();
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashed, _) = pod_history(&state);
        if matches!(pod, "etcd" | "kube-apiserver") {
            assert_eq!(
                (starts, crashed),
                (1, 0),
                "{}",
                b.failure(&format!("{pod}: {state}"))
            );
        }
        assert!(starts >= 1, "{}", b.failure(&format!("{pod}: {state}")));
        // started once, and again only after each exit of its own
        assert_eq!(
            starts as u64,
            1 + crashed,
            "{}",
            b.failure(&format!(
                "{pod} started other than after its own exits: {state}"
            ))
        );
        crashes.push_str(&format!(" {pod} {crashed}"));
        let started = state["history"][0]["started_at_ms"].as_i64().unwrap();
        assert!(
            started >= done,
            "{}",
            b.failure(&format!("{pod} started before the renewal"))
        );
    }

    // The real kubelet, on the renewed kubelet.conf, registered its Node with the real
    // apiserver: the Ready condition's heartbeat is at or after the boot (after the clock
    // jump). RFC 3339 UTC seconds ("...Z", as metav1.Time and `date -u` write them) compare
    // as strings.
    let node = json(&b, "node.json");
    assert_eq!(node["metadata"]["name"], "cp-1", "{}", b.failure("node"));
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    let heartbeat = ready["lastHeartbeatTime"].as_str().unwrap_or_default();
    let booted_at = b.read_out("booted-at-rfc3339").unwrap();
    let booted_at = booted_at.trim();
    assert!(
        heartbeat.len() == 20 && heartbeat.ends_with('Z') && booted_at.len() == 20,
        "{}",
        b.failure(&format!("heartbeat {heartbeat:?}, boot {booted_at:?}"))
    );
    assert!(
        heartbeat >= booted_at,
        "{}",
        b.failure(&format!(
            "stale heartbeat {heartbeat} (boot at {booted_at})"
        ))
    );
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("True"), Some("KubeletReady")),
        "{}",
        b.failure(&format!("Ready condition: {ready}"))
    );
    let kubelet_log = b.read_out("real-kubelet.log").unwrap();
    assert!(
        kubelet_log.contains("Successfully registered node cp-1"),
        "{}",
        b.failure("the real kubelet did not register cp-1")
    );
    // The kubelet's other heartbeat, its Lease in kube-node-lease (RFC 3339 with microseconds:
    // the first 19 characters compare as above).
    let lease = b.read_out("node-lease.txt").unwrap();
    let renew = lease.trim().strip_prefix("cp-1 ").unwrap_or_default();
    assert!(
        renew.len() > 19 && renew[..19] >= booted_at[..19],
        "{}",
        b.failure(&format!("node lease {lease:?}, boot at {booted_at}"))
    );
    // The kubelet made itself a new self-signed serving pair (certrotor removed the expired
    // one), valid at the guest's clock.
    let serving = cert(&check, "kubelet-serving");
    assert_eq!(
        serving["status"],
        "ok",
        "{}",
        b.failure(&format!("kubelet-serving: {serving}"))
    );
    // The kubelet's own credentials, accepted by the real apiserver (Node authorizer); the old
    // expired pair refused.
    assert_eq!(
        (
            b.read_out("kubelet-get-node.rc").unwrap().trim(),
            b.read_out("kubelet-get-node.txt").unwrap().trim()
        ),
        ("0", "node/cp-1"),
        "{}",
        b.failure("kubectl --kubeconfig kubelet.conf get node cp-1")
    );
    let old = b.read_out("kubelet-old-get-node.txt").unwrap();
    assert!(
        b.read_out("kubelet-old-get-node.rc").unwrap().trim() != "0"
            && old.contains("Unauthorized"),
        "{}",
        b.failure(&format!("the old kubelet pair was not refused: {old}"))
    );

    let mut f = Figures::new("400 days off");
    f.boot(&b);
    if let (Some(a), Some(z)) = (
        b.marker_time("MARK CERTROTOR-BEGIN"),
        b.marker_time("MARK CERTROTOR-END"),
    ) {
        f.line(format!(
            "bootstrap container {:.1}s (every leaf, kubeconfig and the kubelet client certificate)",
            (z - a).as_secs_f64()
        ));
    }
    if let Ok(t) = b.read_out("healthy-times.txt") {
        f.line(format!(
            "real control plane healthy {t}s after kubelet-sim started it; exits restarted by kubelet-sim:{crashes}"
        ));
    }
    f.line(format!(
        "containerd with CRI {}s; real kubelet start to its Node Ready (True) {}s (Ready {} {})",
        b.read_out("containerd-cri-s").unwrap_or_default(),
        b.read_out("kubelet-heartbeat-s").unwrap_or_default(),
        ready["status"].as_str().unwrap_or("?"),
        ready["reason"].as_str().unwrap_or("")
    ));
    f.finish(&sc, t0);
}
