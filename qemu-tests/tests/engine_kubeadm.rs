//! Issue 6 scenario: the stacked control-plane node of scenario a, renewed with
//! `--engine kubeadm` from certrotor's host container. The kubeadm image is the openssl
//! stand-in of `images/kubeadm-standin` (a test double implementing `kubeadm certs renew`);
//! everything around it is real: the VM's containerd and runc, the host's `ctr` reached through
//! `/.bottlerocket/rootfs` (run chrooted there), the staging copy, the transaction,
//! one-at-a-time restarts through the API emulator, and live verification.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` with `extra-args` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;

#[test]
fn host_container_renews_with_the_kubeadm_engine() {
    let (mut sc, t0) = scenario(
        "engine-kubeadm",
        include_str!("../scenarios/renew-expiring.sh"),
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
    sc.write_share(
        "extra-args",
        b"--engine kubeadm --kubeadm-image localhost/certrotor-kubeadm-standin:test",
    )
    .unwrap();

    let (b, report, _before) = renew_expiring_node(&mut sc);

    let log = b.read_out("run.log").unwrap();
    assert!(
        log.matches("kubeadm certs renew").count() >= 11,
        "{}",
        b.failure(&format!(
            "kubeadm did not renew each of the 11 certificates:\n{log}"
        ))
    );
    // No container and no staging copy (which holds keys) left behind.
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
        b.failure(&format!("staging copy left: {staging}"))
    );

    let mut f = Figures::new("engine-kubeadm");
    f.boot(&b);
    f.unavailability(
        &b,
        "host container run --once --engine kubeadm",
        &report,
        Some("state"),
    );
    f.readyz(
        &b,
        "host container run --once --engine kubeadm",
        "readyz.txt",
    );
    f.finish(&sc, t0);
}
