//! The real kubelet v1.20.2 in the VM (issue 9, point 3.4, first step): standalone (no
//! apiserver), containerd's CRI plugin and runc, `--pod-manifest-path` the folder the
//! Bottlerocket API (apiserver-sim) renders `settings.kubernetes.static-pods` into. It must
//! create the pod sandbox (the real pause, built from v1.20.2's pause.c and packed without
//! docker) and run the pod's container, which on this host (a Firecracker guest) runc could not
//! do. Guest side: `qemu-tests/scenarios/real-kubelet.sh` (1 boot, ~1 min under TCG).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;
use std::time::Duration;

#[test]
fn real_kubelet_runs_a_rendered_static_pod_with_containerd_cri() {
    let (mut sc, t0) = scenario("real-kubelet", include_str!("../scenarios/real-kubelet.sh"));
    sc.artifacts().bins.require_k8s().unwrap();
    add_pause_image(&sc);
    let b = sc
        .boot(&BootOptions {
            timeout: Duration::from_secs(420),
            smp: Some(2),
            mem_mib: Some(2048),
            ..BootOptions::default()
        })
        .unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);

    assert_eq!(
        b.read_out("static-pods.txt").unwrap(),
        "probe",
        "{}",
        b.failure("the Bottlerocket API's rendering")
    );
    // two runc tasks in containerd's k8s.io namespace, both the real pause: the sandbox and
    // the pod's container
    let comms = b.read_out("task-comms.txt").unwrap();
    assert_eq!(
        comms.lines().collect::<Vec<_>>(),
        ["pause", "pause"],
        "{}",
        b.failure("the tasks the kubelet started")
    );
    let containers = b.read_out("containers.txt").unwrap();
    assert_eq!(
        containers.matches("k8s.gcr.io/pause:3.2").count(),
        2,
        "{}",
        b.failure(&format!("CRI containers:\n{containers}"))
    );

    let mut f = Figures::new("real kubelet (standalone, containerd CRI)");
    f.boot(&b);
    f.line(b.read_out("times.txt").unwrap());
    f.finish(&sc, t0);
}
