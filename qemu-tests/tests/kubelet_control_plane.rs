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
//!
//! EKS Anywhere's kube-vip on the same boot (issue 25.6): the lab writes it as EKS Anywhere
//! renders it for Bottlerocket (`lab init --kube-vip eks-anywhere`: no probe, admin.conf mounted
//! as a single file at `/etc/kubernetes/admin.conf`), the real kubelet runs it as a runc
//! container from an OCI image of the static k8s-sim `kube-vip manager` stand-in, which reads
//! that kubeconfig once at start and holds `kube-system/plndr-cp-lock` through the real
//! apiserver. Asserted from what the guest saw, beside certrotor's report: before the renewal
//! its process (a runc container under a containerd shim) read the node's admin.conf and holds
//! the Lease; certrotor renewed admin.conf and restarted kube-vip through the Bottlerocket API,
//! reporting the probe-less evidence; afterwards a new process of another container runs, its
//! mount shows the renewed file (SHA-256 through `/proc/PID/root`), it read the renewed
//! certificate, and the Lease is written again.
//!
//! The cluster CA rotated on the same boot, last (issue 29.4: `ca-rotate`): the real kubelet is
//! restarted registered with the real apiserver the way Bottlerocket runs it (its kubeconfig
//! `/etc/kubernetes/kubelet/kubeconfig` as the API renders it, its client CA the file
//! `/etc/kubernetes/pki/ca.crt` the API renders from `settings.kubernetes.cluster-certificate`,
//! anonymous requests refused), and the API's restart command for the kubelet (`systemctl
//! try-restart kubelet.service`) restarts it with the same command line. While `kubectl logs
//! etcd-cp-1` reads a mirrored pod's logs through it every second, `ca rotate --ca ca` (trust-in
//! and issue) then `ca continue --ca ca` (trust-out) run from the superpowered host container.
//! Asserted: each stage's report; the CA file, `cluster-certificate` and the kubelet's client CA
//! file hold [old, new] after the issue and the new CA alone after trust-out;
//! kube-controller-manager's rendered manifest signs with `ca.signer.crt` in between and
//! `ca.crt` after; the API restarted the kubelet during each command; every failed
//! `kubectl logs` overlapped a kubelet restart (a few per restart) and calls succeeded after
//! each command; after trust-out `openssl verify` with the old CA alone fails for every
//! certificate under `var/lib/kubeadm/pki`, every kubeconfig's client certificate, the kubelet's
//! client certificate and what kube-apiserver, the kubelet, the controller-manager and the
//! scheduler serve, while what the cluster CA signs verifies with the new one; the ConfigMap and
//! the etcd key written before are read back.
//!
//! Scenario a under kubelet-sim (`renew_expiring`, its own boot before) is merged here with every
//! assertion it made (`common/scenario_a.rs`): the live-mode pass (each reload with its time,
//! every restart with a live-mode reason, one backup holding the old files, the one-off command
//! taken as arguments, `/readyz` ready when polling began and at its end); then, on the same
//! boot, the node renewed again by the real kubeadm v1.20.2 through certrotor's kubeadm engine,
//! its image found where Bottlerocket keeps EKS Anywhere's `kubeadm-bootstrap` image (a real
//! host-containerd; the node made as kubeadm v1.20.2 makes it, RSA-2048); certrotor's first boot
//! before any PKI; and the daemon as a host container in host-containerd running each
//! `apiclient exec` line of `bottlerocket/packaging/README.md`. Where it said "started once by
//! kubelet-sim", the real kubelet's pids say it here (the same process before and after).
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

/// The image EKS Anywhere's kube-vip manifest names (`certrotor::lab::manifests::
/// EKS_ANYWHERE_KUBE_VIP_IMAGE`): the stand-in is packed under that name, so that the kubelet
/// finds it (`imagePullPolicy: IfNotPresent`, and the VM has no registry).
const KUBE_VIP_IMAGE: &str =
    "public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0-eks-a-v0.19.0-dev-build.30";

/// The static pods of the node: the control plane and kube-vip.
const NODE_PODS: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-vip",
];

/// `key value...` lines (`node_vip_snapshot`).
fn keyed(b: &qemu_tests::Boot, name: &str) -> BTreeMap<String, String> {
    b.read_out(name)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `node_vip_lease`: (holder, resourceVersion, renewTime).
fn lease(b: &qemu_tests::Boot, name: &str) -> (String, String, String) {
    let mut l = triples(b, name);
    assert_eq!(l.len(), 1, "{}", b.failure(&format!("{name}: {l:?}")));
    l.remove(0)
}

#[test]
fn real_kubelet_runs_the_control_plane_certrotor_renews_natively_then_with_the_kubeadm_engine() {
    let (mut sc, t0) = real_cp_scenario("kubelet-control-plane");
    sc.write_share("real-kubelet", b"yes\n").unwrap();
    sc.write_share("kube-vip", b"eks-anywhere\n").unwrap();
    sc.write_share("ca-rotate", b"yes\n").unwrap();
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
    // EKS Anywhere's kube-vip: the static k8s-sim at the image's entrypoint `/kube-vip` (the
    // manifest has `args: [manager]` and no command).
    oci_image(
        sc.artifacts().bins.sim("k8s-sim").unwrap(),
        "/kube-vip",
        KUBE_VIP_IMAGE,
        &share.join("cp-images/kube-vip.tar"),
    )
    .unwrap();
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
    let exec_lines = add_bottlerocket_extras(&sc);

    let (b, report, before) = renew_expiring_node_boot(
        &mut sc,
        &BootOptions {
            smp: Some(2),
            // the control plane, kube-vip, the kubelet and containerd left 1.8 GiB of 2.5 GiB
            // available (the guest's samples, "guest during the pass"); host-containerd and the
            // kubeadm engine's container come on top
            mem_mib: Some(3072),
            ..BootOptions::default()
        },
    );
    let live = assert_live_pass(&b, &report, &before);

    // What the real kubelet made of the API's rendering, before the renewal: the static-pod
    // folder holds exactly the rendered pods; each pod is a sandbox (the real pause) and its
    // container, as runc tasks in containerd's k8s.io namespace; the CRI lists one pause
    // sandbox container per pod.
    let rendered = b.read_out("static-pods.txt").unwrap();
    let mut rendered: Vec<&str> = rendered.lines().collect();
    rendered.sort_unstable();
    assert_eq!(
        rendered,
        NODE_PODS,
        "{}",
        b.failure("the Bottlerocket API's rendering")
    );
    let comms = b.read_out("task-comms.txt").unwrap();
    let mut comms: Vec<&str> = comms.lines().collect();
    comms.sort_unstable();
    // (a process's comm is its name's first 15 bytes: kube-controller)
    let mut expected: Vec<&str> = NODE_PODS
        .iter()
        .map(|p| &p[..p.len().min(15)])
        .chain(["pause"; NODE_PODS.len()])
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
        NODE_PODS.len(),
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
    let vip = assert_kube_vip_restarted(&b, &report);

    // ---- the second pass, by the real kubeadm (certrotor's kubeadm engine); then what a new
    // node's first boot showed before any PKI, and the install page's `apiclient exec` lines
    let kubeadm_report = assert_kubeadm_pass(&b, &sc);
    assert_first_boot(&b);
    assert_readme_exec(&b, &exec_lines, &kubeadm_report);
    // ---- last, the cluster CA rotated under the kubelet, now registered (issue 29.4)
    let ca = assert_cluster_ca_rotated(&b, &sc);

    let mut f = real_cp_figures(
        "a under the real kubelet (containerd CRI, runc)",
        &b,
        &report,
    );
    f.line(live);
    f.unavailability(
        &b,
        "host container run --once --engine kubeadm",
        &kubeadm_report,
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
    f.line(vip);
    // What kube-vip adds to the boot besides its restart in the pass: the guest's own steps.
    let steps = b.read_out("kube-vip-steps.txt").unwrap_or_default();
    let seconds: f64 = steps
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .sum();
    f.line(format!(
        "kube-vip's own guest steps: {seconds:.1} s ({})",
        steps.lines().collect::<Vec<_>>().join("; ")
    ));
    // What the guest had to spare from the readiness poll's start to its end (node_load_start).
    let load = b.read_out("guest-load.txt").unwrap_or_default();
    let samples: Vec<(u64, f64)> = load
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().skip(1);
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect();
    f.line(format!(
        "guest during the pass: {} samples, MemAvailable min {} MiB, 1-min load max {:.2}",
        samples.len(),
        samples.iter().map(|s| s.0).min().unwrap_or(0) / 1024,
        samples.iter().map(|s| s.1).fold(0.0, f64::max)
    ));
    for l in ca {
        f.line(l);
    }
    f.finish(&sc, t0);
}

/// EKS Anywhere's kube-vip before and after the renewal, from the guest's own evidence
/// (`node_vip_snapshot`, `node_vip_lease`, the container logs) and certrotor's report; returns
/// the figures line.
fn assert_kube_vip_restarted(b: &qemu_tests::Boot, report: &serde_json::Value) -> String {
    let (before, after) = (
        keyed(b, "before-kube-vip.txt"),
        keyed(b, "after-kube-vip.txt"),
    );
    let pki_before = sums(b, "pki-before.sha");
    let pki_after = sums(b, "pki-after.sha");
    let admin = "var/lib/kubeadm/admin.conf";
    // One kube-vip process each time, a runc container of the kubelet's containerd (its parent
    // a shim, its task in k8s.io from the manifest's image), its mount showing the node's file.
    for (when, s, pki) in [
        ("before", &before, &pki_before),
        ("after", &after, &pki_after),
    ] {
        let fail = |what: &str| b.failure(&format!("kube-vip {when} the renewal: {what}: {s:?}"));
        assert!(
            s["pid"] != "none" && s["count"] == "1",
            "{}",
            fail("process")
        );
        assert!(
            s["parent"].starts_with("containerd-shim"),
            "{}",
            fail("parent")
        );
        let task: Vec<&str> = s["task"].split_whitespace().collect();
        assert!(
            task.len() == 3 && task[1] == KUBE_VIP_IMAGE && task[2].contains("runc"),
            "{}",
            fail("containerd task (id, image, runtime)")
        );
        assert_eq!(s.get("node"), pki.get(admin), "{}", fail("the node's file"));
        assert_eq!(s["mounted"], s["node"], "{}", fail("the file at its mount"));
        assert!(
            !s["mount-root"].is_empty() && !s["mount-root"].ends_with("//deleted"),
            "{}",
            fail("its single-file mount")
        );
    }
    assert_ne!(
        before["node"],
        after["node"],
        "{}",
        b.failure("admin.conf not renewed")
    );
    assert_ne!(
        before["node-cert"],
        after["node-cert"],
        "{}",
        b.failure("admin.conf's client certificate not renewed")
    );
    assert_ne!(
        before["pid"],
        after["pid"],
        "{}",
        b.failure("kube-vip was not restarted")
    );
    assert_ne!(
        before["task"],
        after["task"],
        "{}",
        b.failure("kube-vip runs in the same container")
    );
    // What each process read (the stand-in logs the client certificate of the kubeconfig it
    // read once at start) and that the first one acquired the Lease.
    let read = |c: &str| format!("read client certificate sha256 {c}");
    let log_before = b.read_out("before-kube-vip.log").unwrap();
    assert!(
        log_before.contains(&read(&before["node-cert"]))
            && !log_before.contains(&read(&after["node-cert"]))
            && log_before.contains("successfully acquired lease kube-system/plndr-cp-lock"),
        "{}",
        b.failure(&format!(
            "kube-vip's log before the renewal (old certificate {}):\n{log_before}",
            before["node-cert"]
        ))
    );
    let log_after = b.read_out("after-kube-vip.log").unwrap();
    assert!(
        log_after.contains(&read(&after["node-cert"])),
        "{}",
        b.failure(&format!(
            "kube-vip's log after the renewal (renewed certificate {}):\n{log_after}",
            after["node-cert"]
        ))
    );
    // The Lease: held and renewed before; after the restart (the old process gone: one
    // kube-vip runs, another pid) written again, twice, by the same holder.
    let held = lease(b, "vip-lease-before");
    let renewed = lease(b, "vip-lease-held");
    let (after_run, again) = (lease(b, "vip-lease-after"), lease(b, "vip-lease-again"));
    for (what, l) in [
        ("renewed before", &renewed),
        ("after", &after_run),
        ("again", &again),
    ] {
        assert_eq!(
            l.0,
            held.0,
            "{}",
            b.failure(&format!("Lease holder {what}"))
        );
    }
    assert!(
        held.1 != renewed.1 && after_run.1 != renewed.1 && again.1 != after_run.1,
        "{}",
        b.failure(&format!(
            "Lease resourceVersions: {held:?} {renewed:?} {after_run:?} {again:?}"
        ))
    );

    // certrotor's report: kube-vip restarted through the API with the probe-less evidence,
    // naming the processes the guest saw.
    let pods = report["restarted_pods"].as_array().unwrap_or_else(|| {
        panic!(
            "{}",
            b.failure(&format!("no restarted_pods in the report: {report}"))
        )
    });
    let fail = |what: &str| b.failure(&format!("report: {what}: {pods:?}"));
    assert!(
        pods.len() == 1 && pods[0]["pod"] == "kube-vip",
        "{}",
        fail("restarted pods")
    );
    let e = &pods[0]["evidence"];
    let pid = |s: &BTreeMap<String, String>| s["pid"].parse::<u64>().unwrap();
    // The process certrotor stopped is the one the guest saw before the run, unless the kubelet
    // had restarted kube-vip on its own in between (a kube-vip that misses its renew deadline
    // exits, and under a heavily loaded TCG guest the stand-in did): then it is another, never
    // the new one.
    let old: Vec<u64> = e["old_pids"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_u64()).collect())
        .unwrap_or_default();
    assert!(
        !old.is_empty() && !old.contains(&pid(&after)),
        "{}",
        fail("old pids")
    );
    if old != [pid(&before)] {
        eprintln!(
            "note: kube-vip was restarted by the kubelet between the guest's snapshot (pid {}) \
             and certrotor's stop (old pids {old:?})",
            pid(&before)
        );
    }
    assert_eq!(e["new_pid"], pid(&after), "{}", fail("new pid"));
    assert!(e["probe"].is_null(), "{}", fail("a probe"));
    assert_eq!(e["lease_after"]["holder"], held.0, "{}", fail("Lease"));
    assert!(
        e["lease"]
            .as_str()
            .is_some_and(|l| l.contains("kube-system/plndr-cp-lock written after new process")),
        "{}",
        fail("Lease evidence")
    );
    let new_mount = format!("new pid {}: /etc/kubernetes/admin.conf is ", pid(&after));
    assert!(
        e["mounts"]
            .as_array()
            .is_some_and(|m| m
                .iter()
                .any(|l| l.as_str().is_some_and(|l| l.starts_with(&new_mount)
                    && l.ends_with("reads the content on the node now")))),
        "{}",
        fail("the new process's mount")
    );
    assert_eq!(
        report["pod_errors"],
        serde_json::json!([]),
        "{}",
        fail("pod errors")
    );
    format!(
        "kube-vip (EKS Anywhere, no probe, runc): stop request .. verified {} ms (settle \
         included, alive {} ms); new process {} ms after the old exited; {}",
        pods[0]["unavailable_ms"], e["alive_for_ms"], e["started_after_stop_ms"], e["summary"]
    )
}
