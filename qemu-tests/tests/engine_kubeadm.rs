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
//!
//! Bottlerocket-shaped (issue 27.3): the image is not named on the command line and is not in
//! the kubelet's containerd. It sits where Bottlerocket keeps EKS Anywhere's `kubeadm-bootstrap`
//! image, a real second containerd run as Bottlerocket's host-containerd (its socket
//! `/run/host-containerd/containerd.sock`, namespace `default`), and the API names it in
//! `settings.host-containers.kubeadm-bootstrap.source`: `--engine kubeadm` alone finds it there.
//! Before the node has any PKI, certrotor's bootstrap container (default user-data) exits 0 with
//! nothing to renew, and `run --once` as a host container's user-data is refused (exit 64).
//! At the end (issue 27.5), the daemon runs as a host container in host-containerd, and each
//! `apiclient exec` line of `bottlerocket/packaging/README.md` runs as the API server runs it:
//! `ctr -a /run/host-containerd/containerd.sock task exec --exec-id apiexec-<random> certrotor …`.
//! Guest side: `qemu-tests/scenarios/renew-expiring.sh` with `extra-args`, `kubeadm.oci.tar`,
//! `first-boot` and `readme-exec.txt` (1 boot).
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
    // No --kubeadm-image, no --containerd-socket: found as on a Bottlerocket node.
    sc.write_share("extra-args", b"--engine kubeadm").unwrap();
    sc.write_share("first-boot", b"").unwrap();
    let exec_lines = readme_exec_lines();
    sc.write_share(
        "readme-exec.txt",
        format!("{}\n", exec_lines.join("\n")).as_bytes(),
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
        // Under TCG each of the ten kubeadm runs costs 20-50 s (ctr and kubeadm are large Go
        // binaries, started several times per certificate), then the restarts, the daemon's
        // first pass and the exec lines: 900 s was measured too short on a loaded host.
        &real_cp_boot(Duration::from_secs(1500)),
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

    // The image was found where host-ctr keeps it, and its containers went with it.
    assert!(
        log.contains("found in host-containerd"),
        "{}",
        b.failure(&format!("not found in host-containerd:\n{log}"))
    );
    let host_containers = b.read_out("host-containers.txt").unwrap();
    assert!(
        !host_containers.contains("certrotor-kubeadm"),
        "{}",
        b.failure(&format!("left over in host-containerd: {host_containers}"))
    );
    assert_first_boot(&b);
    assert_readme_exec(&b, &exec_lines, &report);

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

/// The `apiclient exec` lines of the install page's block tested as `exec`.
fn readme_exec_lines() -> Vec<String> {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bottlerocket/packaging/README.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != "<!-- tested: exec -->");
    assert_eq!(
        lines.next().map(str::trim),
        Some("<!-- tested: exec -->"),
        "{}: no block tested as 'exec'",
        page.display()
    );
    assert_eq!(lines.next().map(str::trim), Some("```sh"));
    let found: Vec<String> = lines
        .take_while(|l| l.trim() != "```")
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    assert!(
        !found.is_empty()
            && found
                .iter()
                .all(|l| l.starts_with("apiclient exec certrotor ")),
        "{found:?}"
    );
    found
}

/// A new node's first boot, before any PKI: the bootstrap container's default `run --once`
/// exits 0 saying there is nothing to renew; `run --once` as a host container's user-data is
/// refused with the reason.
fn assert_first_boot(b: &qemu_tests::Boot) {
    let rc = b.read_out("first-boot.rc").unwrap();
    let out = b.read_out("first-boot.json").unwrap_or_default();
    let log = b.read_out("first-boot.log").unwrap_or_default();
    assert!(
        rc.trim() == "0" && out.contains("nothing to renew yet"),
        "{}",
        b.failure(&format!("first boot: rc {rc}\n{out}\n{log}"))
    );
    let rc = b.read_out("host-run-once.rc").unwrap();
    let log = b.read_out("host-run-once.log").unwrap_or_default();
    assert!(
        rc.trim() == "64" && log.contains("every 45 s"),
        "{}",
        b.failure(&format!("host container run --once: rc {rc}\n{log}"))
    );
}

/// Each README `apiclient exec` line, run in the daemon's host container.
fn assert_readme_exec(b: &qemu_tests::Boot, lines: &[String], report: &serde_json::Value) {
    let count = b.read_out("exec-count").unwrap();
    assert_eq!(
        count.trim(),
        lines.len().to_string(),
        "{}",
        b.failure("exec count")
    );
    let backup = report["renew"]["backup_id"].as_str().unwrap_or_default();
    assert!(
        !backup.is_empty(),
        "{}",
        b.failure(&format!("no backup id: {report}"))
    );
    for (i, line) in lines.iter().enumerate() {
        let rc = b.read_out(&format!("exec-{i}.rc")).unwrap();
        let out = b.read_out(&format!("exec-{i}.out")).unwrap_or_default();
        let err = b.read_out(&format!("exec-{i}.err")).unwrap_or_default();
        let ctx = || b.failure(&format!("{line}: rc {rc}\n{out}\n{err}"));
        let words: Vec<&str> = line.split_whitespace().skip(3).collect();
        match words.as_slice() {
            ["certrotor", "status"] => {
                assert!(rc.trim() == "0" && out.contains("(daemon)"), "{}", ctx())
            }
            ["certrotor", "status", "--output", "json"] => {
                let v: serde_json::Value =
                    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                assert!(rc.trim() == "0", "{}", ctx());
                assert_eq!(v["last_pass"]["command"], "daemon", "{}", ctx());
            }
            // 0: fine, 1: something expires within 30 days (the lab kubelet's serving pair,
            // which certrotor leaves to the kubelet); every renewed file is listed.
            ["certrotor", "check"] => assert!(
                (rc.trim() == "0" || rc.trim() == "1") && out.contains("apiserver-etcd-client"),
                "{}",
                ctx()
            ),
            ["certrotor", "backups"] => {
                assert!(rc.trim() == "0" && out.contains(backup), "{}", ctx())
            }
            other => panic!("README exec line {other:?}: teach this test what it shows"),
        }
    }
}
