//! Scenario a under the REAL kubelet (issue 9, point 3.4): the same stacked node whose leaf
//! certificates expire in 2 days (`qemu-tests/scenarios/renew-expiring.sh` with `real-kubelet`
//! in the share), but its static pods (Debian's etcd, the real kube-apiserver,
//! kube-controller-manager and kube-scheduler v1.20.2) run under the real kubelet v1.20.2,
//! standalone, with containerd's CRI plugin and runc, from OCI images of the real binaries
//! packed without docker (the sandbox the real pause). The Bottlerocket API (apiserver-sim)
//! renders `settings.kubernetes.static-pods` into the kubelet's folder; certrotor, as a
//! superpowered host container, renews, lets etcd and kube-apiserver v1.20.2 reload live (r25a)
//! and restarts the controller-manager and the scheduler through the API (`enabled` false, then
//! true: the real kubelet removes the pod and creates it again), one at a time, and verifies what
//! each serves. Asserted on top of scenario a's file, backup and served-certificate checks: every
//! component is a runc container of the kubelet (its parent a containerd shim), etcd and
//! kube-apiserver keep their processes (reloaded live, serving the new certificates), the two
//! others get a new one, and kubectl v1.20.2 with the renewed admin.conf reads back a ConfigMap
//! written before. 1 boot.
//!
//! The real kubelet's first step (issue 9, point 3.4), on its own boot before and merged here
//! with every assertion it made, in the form this node gives it: the kubelet creates each pod's
//! sandbox from the real pause (v1.20.2's pause.c, packed without docker) and runs the pod's
//! container, which on this host (a Firecracker guest) runc could not do. Asserted before the
//! renewal: the static-pod folder holds exactly the pods the Bottlerocket API rendered, every
//! running runc task is a sandbox running the real pause or a component, one sandbox per pod,
//! and containerd's CRI lists one `k8s.gcr.io/pause:3.2` sandbox container per pod.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use qemu_tests::BootOptions;
use qemu_tests::artifacts::{k8s_bin, oci_image, oci_image_with};
use std::collections::BTreeMap;
use std::path::Path;

/// `<component> <pid> <parent comm>` lines.
fn pids(b: &qemu_tests::Boot, name: &str) -> BTreeMap<String, (String, String)> {
    b.read_out(name)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_string(),
                (w.next()?.to_string(), w.next()?.to_string()),
            ))
        })
        .collect()
}

#[test]
fn real_kubelet_runs_the_control_plane_certrotor_restarts_through_it() {
    let (mut sc, t0) = real_cp_scenario("kubelet-control-plane");
    sc.write_share("real-kubelet", b"yes\n").unwrap();
    // The images, named as the lab's manifests name them (kubeadm v1.20.2's).
    let share = sc.share_dir();
    std::fs::create_dir_all(share.join("cp-images")).unwrap();
    add_pause_image(&sc);
    for (name, tag) in [
        ("kube-apiserver", "v1.20.2"),
        ("kube-controller-manager", "v1.20.2"),
        ("kube-scheduler", "v1.20.2"),
    ] {
        oci_image(
            &k8s_bin(name).unwrap(),
            &format!("/usr/local/bin/{name}"),
            &format!("k8s.gcr.io/{name}:{tag}"),
            &share.join(format!("cp-images/{name}.tar")),
        )
        .unwrap();
    }
    // Debian's etcd is linked against the C library: the image carries it.
    oci_image_with(
        Path::new("/usr/bin/etcd"),
        "/usr/local/bin/etcd",
        &[
            (
                Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
                "/lib/x86_64-linux-gnu/libc.so.6",
            ),
            (
                Path::new("/lib64/ld-linux-x86-64.so.2"),
                "/lib64/ld-linux-x86-64.so.2",
            ),
        ],
        "k8s.gcr.io/etcd:3.4.13-0",
        &share.join("cp-images/etcd.tar"),
    )
    .unwrap();

    let (b, report, _before) = renew_expiring_node_boot(
        &mut sc,
        &BootOptions {
            smp: Some(2),
            mem_mib: Some(2560),
            ..BootOptions::default()
        },
    );

    // What the real kubelet made of the API's rendering, before the renewal: the static-pod
    // folder holds exactly the rendered pods; each pod is a sandbox (the real pause) and its
    // container, as runc tasks in containerd's k8s.io namespace; the CRI lists one pause
    // sandbox container per pod.
    let rendered = b.read_out("static-pods.txt").unwrap();
    let mut rendered: Vec<&str> = rendered.lines().collect();
    rendered.sort_unstable();
    assert_eq!(
        rendered,
        PODS,
        "{}",
        b.failure("the Bottlerocket API's rendering")
    );
    let comms = b.read_out("task-comms.txt").unwrap();
    let mut comms: Vec<&str> = comms.lines().collect();
    comms.sort_unstable();
    // (a process's comm is its name's first 15 bytes: kube-controller)
    let mut expected: Vec<&str> = PODS
        .iter()
        .map(|p| &p[..p.len().min(15)])
        .chain(["pause"; 4])
        .collect();
    expected.sort_unstable();
    assert_eq!(
        comms,
        expected,
        "{}",
        b.failure("the tasks the kubelet started (a pause sandbox and a container per pod)")
    );
    let containers = b.read_out("containers.txt").unwrap();
    assert_eq!(
        containers.matches("k8s.gcr.io/pause:3.2").count(),
        4,
        "{}",
        b.failure(&format!(
            "CRI containers (one pause sandbox per pod):\n{containers}"
        ))
    );

    // Every component a container of the real kubelet's: its parent is a containerd shim.
    let (before, after) = (pids(&b, "pids-before.txt"), pids(&b, "pids-after.txt"));
    for pod in PODS {
        for (when, p) in [("before", &before), ("after", &after)] {
            let (pid, parent) = p
                .get(pod)
                .unwrap_or_else(|| panic!("{}", b.failure(&format!("{pod} {when}: {p:?}"))));
            assert!(
                pid != "none" && parent.starts_with("containerd-shim"),
                "{}",
                b.failure(&format!("{pod} {when}: pid {pid}, parent {parent}"))
            );
        }
    }
    // etcd and kube-apiserver reloaded live: the same processes (assert_renewal saw them serve
    // the new certificates); the others restarted through the kubelet.
    for pod in ["etcd", "kube-apiserver"] {
        assert_eq!(
            before[pod].0,
            after[pod].0,
            "{}",
            b.failure(&format!("{pod} was restarted"))
        );
    }
    for pod in ["kube-controller-manager", "kube-scheduler"] {
        assert_ne!(
            before[pod].0,
            after[pod].0,
            "{}",
            b.failure(&format!("{pod} was not restarted"))
        );
    }
    let reloaded = report["reloaded"].as_array().unwrap();
    assert_eq!(
        reloaded
            .iter()
            .map(|r| r["component"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["etcd", "kube-apiserver"],
        "{}",
        b.failure("reloaded")
    );
    assert_kubectl_after(&b, &sc);

    let mut f = real_cp_figures(
        "a under the real kubelet (containerd CRI, runc)",
        &b,
        &report,
        None,
    );
    // What the real kubelet said of the pods certrotor gave back (ARCHITECTURE.md, "Doubles
    // that remain"): starts into a sandbox being torn down, and crash back-offs.
    let kubelet = b.read_out("node-kubelet.log").unwrap_or_default();
    f.line(format!(
        "kubelet: {} container starts into a dying sandbox (ttrpc: closed), {} crash back-off lines",
        kubelet.matches("ttrpc: closed").count(),
        kubelet.matches("CrashLoopBackOff").count()
    ));
    f.finish(&sc, t0);
}
