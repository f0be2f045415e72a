//! Issue 6 scenario: the stacked control-plane node of scenario a, renewed with
//! `--engine kubeadm` from certrotor's host container. The kubeadm image is the one of
//! `images/k8s/kubeadm-image.sh`: the real kubeadm v1.20.2 at `/opt/bin/kubeadm` (built by
//! `images/k8s/build.sh`), with etcdadm's test double beside it (no registry ships etcdadm; the
//! stacked node has no etcdadm files, so it is not run here). Everything around it is real: the
//! VM's containerd and runc, the host's `ctr` reached through `/.bottlerocket/rootfs` (run
//! chrooted there), the staging copy, the transaction, one-at-a-time restarts through the API
//! emulator, and live verification, on the real control plane (the real kube-apiserver,
//! controller-manager and scheduler v1.20.2 and Debian's etcd as the static pods, `--restart
//! live`), with kubectl v1.20.2 before and after.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` with `extra-args` (1 boot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

#[test]
fn host_container_renews_with_the_kubeadm_engine() {
    let (mut sc, t0) = real_cp_scenario("engine-kubeadm");
    let image = sc.share_dir().join("kubeadm.oci.tar");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = Command::new("sh")
        .arg(root.join("images/k8s/kubeadm-image.sh"))
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "real-kubeadm image build failed (images/k8s/kubeadm-image.sh): {}",
        String::from_utf8_lossy(&built.stderr)
    );
    sc.write_share(
        "extra-args",
        b"--engine kubeadm --kubeadm-image localhost/certrotor-kubeadm:v1.20.2",
    )
    .unwrap();

    // The node as kubeadm v1.20.2 makes it: no super-admin.conf (kubeadm >= 1.29).
    let kubeconfigs: Vec<&str> = KUBECONFIGS
        .into_iter()
        .filter(|k| *k != "super-admin.conf")
        .collect();
    let (b, report, _before) = renew_expiring_node_boot(
        &mut sc,
        &kubeconfigs,
        &real_cp_boot(Duration::from_secs(900)),
    );
    // The real apiserver serves what the real kubeadm renewed, and kubectl with the renewed
    // admin.conf reads back what was written before.
    assert_kubectl_after(&b, &sc);

    // The real kubeadm said it renewed each one (certrotor logs each tool line with the command).
    let log = b.read_out("run.log").unwrap();
    for name in STACKED_LEAVES.iter().chain(&kubeconfigs) {
        let said = format!("kubeadm certs renew {name}: ");
        assert!(
            log.lines()
                .any(|l| l.contains(&said) && l.trim_end().ends_with("renewed")),
            "{}",
            b.failure(&format!("kubeadm did not say it renewed {name}:\n{log}"))
        );
    }
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
    f.finish(&sc, t0);
}
