//! Issue 11.5: a control-plane node switched off for 400 days. The lab node is made with
//! one-year leaves, the guest clock jumps 400 days before anything starts, and the bootstrap
//! container (`run --once --platform none`) renews every expired leaf, the kubeconfigs and the
//! kubelet's client certificate (its expired serving pair removed) before the kubelet starts;
//! the control plane comes up on the new files with no human step. The kubelet's credentials
//! are proven here against k8s-sim's kube-apiserver stand-in (mTLS to the cluster CA at the
//! guest's clock), not the real kube-apiserver, which cold-starts in ~7 min under TCG;
//! `agent/tests/kubelet.rs` proves them against the real v1.20.2 on the host.
//! Guest side: `qemu-tests/scenarios/days-off-400.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;
use std::time::Duration;

#[test]
fn node_off_for_400_days_heals_itself_at_boot() {
    let (mut sc, t0) = scenario("days-off-400", include_str!("../scenarios/days-off-400.sh"));
    let b = sc
        .boot(&BootOptions {
            timeout: Duration::from_secs(360),
            ..BootOptions::default()
        })
        .unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    // The clock really moved 400 days between making the node and booting it.
    let made: i64 = b.read_out("made-at").unwrap().parse().unwrap();
    let booted: i64 = b.read_out("booted-at").unwrap().parse().unwrap();
    assert!(
        booted - made >= 400 * 86_400,
        "{}",
        b.failure("clock not moved")
    );

    // Before: every leaf, kubeconfig and both kubelet certificates expired.
    let before = json(&b, "check-before.json");
    let mut leaves: Vec<&str> = STACKED_LEAVES.to_vec();
    leaves.extend(KUBECONFIGS);
    for n in leaves.iter().chain(&["kubelet-client", "kubelet-serving"]) {
        assert_eq!(cert(&before, n)["status"], "expired", "{}", b.failure(n));
    }

    // The bootstrap container renewed all of it, the kubelet's client certificate included.
    assert_eq!(
        b.read_out("bootstrap.rc").unwrap(),
        "0",
        "{}",
        b.failure("bootstrap rc")
    );
    let report = b.read_out("bootstrap.json").unwrap();
    for want in [
        "Renewed 11 certificate(s)",
        "Reissued kubelet-client (expired) for system:node:cp-1",
        "Removed the expired kubelet-serving pair",
    ] {
        assert!(
            report.contains(want),
            "{}",
            b.failure(&format!("no {want:?} in:\n{report}"))
        );
    }
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

    // After: a year ahead at the guest's clock; served; the kubelet's new pair accepted by the
    // apiserver stand-in, the old one refused.
    let check = json(&b, "check-after.json");
    let mut renewed = leaves.clone();
    renewed.push("kubelet-client");
    assert_expiries(&b, &check, &renewed, 365);
    assert_served_equals_files(&b, "served.txt");
    assert_eq!(
        b.read_out("kubelet-new").unwrap().trim(),
        "accepted",
        "{}",
        b.failure("new kubelet credentials")
    );
    assert_eq!(
        b.read_out("kubelet-old").unwrap().trim(),
        "refused",
        "{}",
        b.failure("old kubelet credentials")
    );
    let done: i64 = b.read_out("bootstrap-done-ms").unwrap().parse().unwrap();
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashes, _) = pod_history(&state);
        assert_eq!(
            (starts, crashes),
            (1, 0),
            "{}",
            b.failure(&format!("{pod}: {state}"))
        );
        let started = state["history"][0]["started_at_ms"].as_i64().unwrap();
        assert!(
            started >= done,
            "{}",
            b.failure(&format!("{pod} started before the renewal"))
        );
    }

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
    f.finish(&sc, t0);
}
