//! Issue 6 scenario: the stacked control-plane node of scenario a, renewed with
//! `--engine kubeadm` from certrotor's host container. The kubeadm image is the openssl
//! stand-in of `images/kubeadm-standin` (a test double implementing `kubeadm certs renew`);
//! everything around it is real: the VM's containerd and runc, the host's `ctr` reached through
//! `/.bottlerocket/rootfs`, the staging copy, the transaction, one-at-a-time restarts through the
//! API emulator, and live verification.
//! Guest side: `qemu-tests/scenarios/engine-kubeadm.sh` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;
use std::process::Command;
use std::time::Duration;

#[test]
fn host_container_renews_with_the_kubeadm_engine() {
    let (mut sc, t0) = scenario(
        "engine-kubeadm",
        include_str!("../scenarios/engine-kubeadm.sh"),
    );
    let standin = sc.share_dir().join("kubeadm-standin.oci.tar");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = Command::new("sh")
        .arg(root.join("images/kubeadm-standin/build.sh"))
        .arg(&standin)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "stand-in image build failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let b = sc
        .boot(&BootOptions {
            timeout: Duration::from_secs(480),
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
        log.contains("kubeadm certs renew"),
        "{}",
        b.failure(&format!("no kubeadm run in the log:\n{log}"))
    );

    // renewed by the tool: a year from now, sound chains and keys; CAs untouched
    let check = json(&b, "check-after.json");
    let mut renewed: Vec<&str> = STACKED_LEAVES.to_vec();
    renewed.extend(KUBECONFIGS);
    assert_expiries(&b, &check, &renewed, 365);
    let before = sums(&b, "pki-before.sha");
    let after = sums(&b, "pki-after.sha");
    assert_untouched(&b, &before, &after);
    for f in [
        "var/lib/kubeadm/pki/apiserver.crt",
        "var/lib/kubeadm/pki/etcd/server.crt",
        "var/lib/kubeadm/admin.conf",
    ] {
        assert_ne!(
            before.get(f),
            after.get(f),
            "{}",
            b.failure(&format!("{f} not renewed"))
        );
    }

    // etcd data kept, the new certificates served
    assert_eq!(
        b.read_out("etcd-after").unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("the etcd key written before the renewal")
    );
    let old = assert_served_equals_files(&b, "served-before.txt");
    let new = assert_served_equals_files(&b, "served-after.txt");
    for ((c, o, _), (_, n, _)) in old.iter().zip(&new) {
        assert_ne!(
            o,
            n,
            "{}",
            b.failure(&format!("{c} still serves the old certificate"))
        );
    }

    // no container and no staging copy (which holds keys) left behind
    let containers = b.read_out("k8s-containers.txt").unwrap();
    assert!(
        !containers.contains("certrotor-kubeadm"),
        "{}",
        b.failure(&format!("left over: {containers}"))
    );
    let staging = b.read_out("engine-staging.txt").unwrap_or_default();
    assert!(
        staging.trim().is_empty() || staging.contains("No such file"),
        "{}",
        b.failure(&format!("staging left: {staging}"))
    );

    let down: Vec<String> = report["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} {} ms",
                r["component"].as_str().unwrap_or("?"),
                r["unavailable_ms"]
            )
        })
        .collect();
    eprintln!(
        "engine-kubeadm: wall {:.1} s; unavailable: {}",
        t0.elapsed().as_secs_f64(),
        down.join(", ")
    );
}
