//! Scenario a: a stacked control-plane node whose leaf certificates expire in 2 days, its
//! static pods the REAL kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 (and
//! Debian's etcd) under kubelet-sim. certrotor runs from its OCI image as a superpowered host
//! container (its one-off command line as arguments, as `apiclient exec` gives them: a host
//! container's user-data is `daemon`): it renews, and in the default `--restart live`
//! etcd (real) and kube-apiserver v1.20.2 (real) reload their renewed certificates without a
//! restart (r25a: the apiserver re-reads its leaf pairs; the old apiserver-kubelet-client is
//! valid beyond `--held-cert-margin`), while the controller-manager and the scheduler (embedded
//! kubeconfig data) are restarted once each through the Bottlerocket API, each with its reason,
//! and verified. Asserted: new expiries about a year away, CAs untouched, an
//! etcd key written before still readable, served certificates equal to the files, a backup
//! holding the old files, and through the real apiserver: kubectl v1.20.2 with the renewed
//! admin.conf lists the namespaces and reads back a ConfigMap written before the renewal.
//! Control-plane unavailability: the real apiserver's /readyz polled every 100 ms in the VM.
//! The VM gets 2 vCPUs (multi-threaded TCG) and 2 GiB: the figures that make the real
//! apiserver fit are in ARCHITECTURE.md. Guest side: `qemu-tests/scenarios/renew-expiring.sh`
//! (1 boot).
//!
//! The same boot then renews the node again with `--engine kubeadm` (issue 6; its own scenario
//! before, on its own boot of the same node, merged here with every assertion it made): the
//! kubeadm image is the one of `images/k8s/kubeadm-image.sh`, the real kubeadm v1.20.2 at
//! `/opt/bin/kubeadm` (built by `images/k8s/build.sh`), with etcdadm's test double beside it (no
//! registry ships etcdadm; the stacked node has no etcdadm files, so it is not run here).
//! Everything around it is real: the VM's containerd and runc, the host's `ctr` reached through
//! `/.bottlerocket/rootfs` (run chrooted there), the staging copy, the transaction,
//! one-at-a-time restarts through the API emulator, and live verification, on the real control
//! plane, with kubectl v1.20.2 after. The node is RSA-2048 as kubeadm v1.20.2 makes it, and its
//! super-admin.conf (kubeadm >= 1.29) is set aside before that pass. Asserted for that pass: what
//! every renewal must show (`assert_renewal`), the real kubeadm said it renewed each certificate
//! and kubeconfig, and no container or staging copy (which holds keys) is left behind.
//!
//! Bottlerocket-shaped (issue 27.3, engine_kubeadm's before the merge): the kubeadm image is not
//! named on the command line and is not in the kubelet's containerd. It sits where Bottlerocket
//! keeps EKS Anywhere's `kubeadm-bootstrap` image, a real second containerd run as Bottlerocket's
//! host-containerd (its socket `/run/host-containerd/containerd.sock`, namespace `default`), and
//! the API names it in `settings.host-containers.kubeadm-bootstrap.source`: `--engine kubeadm`
//! alone finds it there. Before the node has any PKI, certrotor's bootstrap container (default
//! user-data) exits 0 with nothing to renew, and `run --once` as a host container's user-data is
//! refused (exit 64). At the end (issue 27.5), the daemon runs as a host container in
//! host-containerd, and each `apiclient exec` line of `bottlerocket/packaging/README.md` runs as
//! the API server runs it: `ctr -a /run/host-containerd/containerd.sock task exec --exec-id
//! apiexec-<random> certrotor …`. Share files: `kubeadm.oci.tar`, `first-boot`,
//! `readme-exec.txt`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::process::Command;

/// Longest run of consecutive failed /readyz polls (seconds, first failure to next success),
/// and the number of polls, from `<uptime> <1|0>` lines.
fn readyz_gaps(text: &str) -> (f64, f64, usize) {
    let polls: Vec<(f64, bool)> = text
        .lines()
        .filter_map(|l| {
            let (t, r) = l.split_once(' ')?;
            Some((t.parse().ok()?, r.trim() == "1"))
        })
        .collect();
    let (mut longest, mut total, mut down_since) = (0f64, 0f64, None);
    for &(t, ok) in &polls {
        match (ok, down_since) {
            (false, None) => down_since = Some(t),
            (true, Some(t0)) => {
                longest = f64::max(longest, t - t0);
                total += t - t0;
                down_since = None;
            }
            _ => {}
        }
    }
    (longest, total, polls.len())
}

#[test]
fn host_container_renews_an_expiring_stacked_node_natively_then_with_the_kubeadm_engine() {
    let (mut sc, t0) = real_cp_scenario("renew-expiring");
    let image = sc.share_dir().join("kubeadm.oci.tar");
    let built = Command::new("sh")
        .arg(qemu_tests::paths::images_src_dir().join("k8s/kubeadm-image.sh"))
        .arg(&image)
        .env("OCI_IMAGE_CACHE", qemu_tests::artifacts::oci_cache_dir())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "real-kubeadm image build failed (images/k8s/kubeadm-image.sh): {}",
        String::from_utf8_lossy(&built.stderr)
    );
    sc.write_share("first-boot", b"").unwrap();
    let exec_lines = readme_exec_lines();
    sc.write_share(
        "readme-exec.txt",
        format!("{}\n", exec_lines.join("\n")).as_bytes(),
    )
    .unwrap();
    let (b, report, before) = renew_expiring_node_boot(&mut sc, &real_cp_boot());
    let log = b.read_out("run.log").unwrap();
    // A one-off command goes as arguments: certrotor never reads the host container's
    // user-data then (which must be `daemon`; the daemon at the end of this boot runs from it).
    assert!(
        !log.contains("user-data"),
        "{}",
        b.failure(&format!(
            "certrotor read the host container's user-data:\n{log}"
        ))
    );

    // etcd (Debian's, real) is never restarted for a server/peer/healthcheck renewal, nor
    // kube-apiserver v1.20.2 for its leaf pairs (r25a): both reloaded live (kubelet-sim started
    // each once, at boot, and neither crashed). The real controller-manager and scheduler are
    // restarted by certrotor and may also exit on their own when they lose their leader lease
    // (kubelet-sim then starts them again: counted, printed below).
    let mut crashes = String::new();
    for pod in PODS {
        let state = json(&b, &format!("state-{pod}.json"));
        let (starts, crashed, _) = pod_history(&state);
        match pod {
            "etcd" | "kube-apiserver" => assert_eq!(
                (starts, crashed),
                (1, 0),
                "{}",
                b.failure(&format!("{pod}: {state}"))
            ),
            _ => assert!(starts >= 2, "{}", b.failure(&format!("{pod}: {state}"))),
        }
        crashes.push_str(&format!(" {pod} {crashed}"));
    }
    // The pass says, per component, "reloaded live in N s" or "restarted because ...".
    let reloaded = report["reloaded"].as_array().unwrap();
    let reloaded_names: Vec<&str> = reloaded
        .iter()
        .map(|r| r["component"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        reloaded_names,
        ["etcd", "kube-apiserver"],
        "{}",
        b.failure(&format!("reloaded: {report}"))
    );
    for r in reloaded {
        assert!(
            r["reloaded_after_ms"].as_u64().is_some(),
            "{}",
            b.failure(&format!("reloaded_after_ms: {r}"))
        );
    }
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
        0,
        "{}",
        b.failure("kube-apiserver restarted (it reloads its leaf pairs on v1.20.2)")
    );
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

    assert_kubectl_after(&b, &sc);

    // /readyz: ready when polling began and again at the end (the apiserver was not restarted;
    // any outage is a figure below, not an assertion: a probe is one openssl process under TCG)
    let readyz = b.read_out("readyz.txt").unwrap();
    let first = readyz.lines().next().unwrap_or_default().to_string();
    let last = readyz.lines().last().unwrap_or_default().to_string();
    let (longest, total, polls) = readyz_gaps(&readyz);
    assert!(
        first.ends_with(" 1") && last.ends_with(" 1"),
        "{}",
        b.failure(&format!(
            "/readyz polls: first {first:?}, last {last:?}, longest outage {longest:.1}s"
        ))
    );

    // ---- the second pass, by the real kubeadm (certrotor's kubeadm engine)
    let kubeconfigs: Vec<&str> = KUBECONFIGS
        .into_iter()
        .filter(|k| *k != "super-admin.conf")
        .collect();
    let (kubeadm_report, _) = assert_renewal(&b, &sc, "kubeadm-", &kubeconfigs);
    // The real apiserver serves what the real kubeadm renewed, and kubectl with the renewed
    // admin.conf reads back what was written before.
    assert_kubectl_after_as(&b, &sc, "kubeadm-");
    // The real kubeadm said it renewed each one (certrotor logs each tool line with the command).
    let kubeadm_log = b.read_out("kubeadm-run.log").unwrap();
    for name in STACKED_LEAVES.iter().chain(&kubeconfigs) {
        let said = format!("kubeadm certs renew {name}: ");
        assert!(
            kubeadm_log
                .lines()
                .any(|l| l.contains(&said) && l.trim_end().ends_with("renewed")),
            "{}",
            b.failure(&format!(
                "kubeadm did not say it renewed {name}:\n{kubeadm_log}"
            ))
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
        kubeadm_log.contains("found in host-containerd"),
        "{}",
        b.failure(&format!("not found in host-containerd:\n{kubeadm_log}"))
    );
    let host_containers = b.read_out("host-containers.txt").unwrap();
    assert!(
        !host_containers.contains("certrotor-kubeadm"),
        "{}",
        b.failure(&format!("left over in host-containerd: {host_containers}"))
    );
    assert_first_boot(&b);
    assert_readme_exec(&b, &exec_lines, &kubeadm_report);

    let mut f = real_cp_figures(
        "a renew-expiring (real control plane)",
        &b,
        &report,
        Some("state"),
    );
    for r in reloaded {
        f.line(format!(
            "{} reloaded live {} ms after the renewal",
            r["component"].as_str().unwrap_or_default(),
            r["reloaded_after_ms"]
        ));
    }
    f.line(format!(
        "real apiserver /readyz ({polls} polls, 100 ms apart plus the openssl probe itself): longest outage {longest:.1}s, \
         total {total:.1}s; exits restarted by kubelet-sim:{crashes}"
    ));
    f.unavailability(
        &b,
        "host container run --once --engine kubeadm",
        &kubeadm_report,
        Some("kubeadm-state"),
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
