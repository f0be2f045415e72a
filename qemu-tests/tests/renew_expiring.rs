//! Scenario a: a stacked control-plane node whose leaf certificates expire in 2 days. certrotor
//! runs from its OCI image as a superpowered host container (command line from its user-data):
//! it renews, and in the default `--restart live` etcd (real) reloads its renewed certificates
//! without a restart while the three others are restarted once each through the Bottlerocket
//! API, each with its reason, and verified.
//! Asserted: new expiries about a year away, CAs untouched, an etcd key written before still
//! readable, served certificates equal to the files, a backup holding the old files.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` (1 boot, ~1 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

#[test]
fn host_container_renews_an_expiring_stacked_node() {
    let (mut sc, t0) = scenario(
        "renew-expiring",
        include_str!("../scenarios/renew-expiring.sh"),
    );
    // The default `--restart live`, end to end (issue 11).
    sc.write_share("restart-mode", b"live").unwrap();
    let (b, report, before) = renew_expiring_node(&mut sc);
    let log = b.read_out("run.log").unwrap();
    assert!(
        log.contains("arguments from the container's user-data: run --once"),
        "{}",
        b.failure(&format!("certrotor did not take its user-data:\n{log}"))
    );

    // etcd (Debian's, real) is never restarted for a server/peer/healthcheck renewal: it
    // reloaded live (kubelet-sim started it once, at boot); every other static pod is restarted
    // exactly once (kube-apiserver at most once per pass), no crash.
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashes, _) = pod_history(&state);
        let want = if pod == "etcd" { 1 } else { 2 };
        assert_eq!(
            (starts, crashes),
            (want, 0),
            "{}",
            b.failure(&format!("{pod}: {state}"))
        );
    }
    // The pass says, per component, "reloaded live in N s" or "restarted because ...".
    let reloaded = report["reloaded"].as_array().unwrap();
    assert_eq!(reloaded.len(), 1, "{}", b.failure(&format!("{report}")));
    assert_eq!(
        reloaded[0]["component"],
        "etcd",
        "{}",
        b.failure("reloaded")
    );
    assert!(
        reloaded[0]["reloaded_after_ms"].as_u64().is_some(),
        "{}",
        b.failure("reloaded_after_ms")
    );
    let restarted = report["restarted"].as_array().unwrap();
    for r in restarted {
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(
            !reason.is_empty() && !reason.starts_with("--restart always"),
            "{}",
            b.failure(&format!("restart without a live-mode reason: {r}"))
        );
    }
    assert_eq!(
        restarted
            .iter()
            .filter(|r| r["component"] == "kube-apiserver")
            .count(),
        1,
        "{}",
        b.failure("kube-apiserver restarts")
    );
    let log = b.read_out("run.log").unwrap();
    assert!(
        log.contains("reloaded live in"),
        "{}",
        b.failure(&format!("no 'reloaded live in' in the log:\n{log}"))
    );

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
    f.unavailability(
        &b,
        "host container run --once --restart live",
        &report,
        Some("state"),
    );
    f.line(format!(
        "etcd reloaded live {} ms after the renewal",
        reloaded[0]["reloaded_after_ms"]
    ));
    f.finish(&sc, t0);
}
