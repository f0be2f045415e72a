//! Scenario a's node (`scenarios/renew-expiring.sh`) as a Bottlerocket node made by EKS Anywhere:
//! the extras of its one boot (the real kubeadm's image where Bottlerocket keeps EKS Anywhere's
//! `kubeadm-bootstrap` image, certrotor's first boot before any PKI, the install page's
//! `apiclient exec` lines) and what the boot must show of them: the live-mode pass, the second
//! pass by the real kubeadm (certrotor's kubeadm engine), the first boot and the exec lines.

use super::*;
use std::process::Command;

/// Puts the extras in the share: `kubeadm.oci.tar` (the real kubeadm v1.20.2's image of
/// `images/k8s/kubeadm-image.sh`), `first-boot` and `readme-exec.txt`. Returns the exec lines.
pub fn add_bottlerocket_extras(sc: &Scenario) -> Vec<String> {
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
    exec_lines
}

/// Longest run of consecutive failed /readyz polls (seconds, first failure to next success),
/// and the number of polls, from `<uptime> <1|0>` lines.
pub fn readyz_gaps(text: &str) -> (f64, f64, usize) {
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

/// The live-mode pass (`--restart live`, the default) of scenario a's node: etcd and
/// kube-apiserver v1.20.2 reloaded live, each with the time it took, every restart with a
/// live-mode reason, the apiserver never restarted; one backup holding the old files; the
/// one-off command came as arguments (the host container's user-data never read); the real
/// apiserver's /readyz ready when polling began and at its end. Returns the /readyz figure.
pub fn assert_live_pass(b: &Boot, report: &Value, before: &BTreeMap<String, String>) -> String {
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

    // /readyz: ready when polling began and again at the end (the apiserver was not restarted;
    // any outage is a figure, not an assertion: a probe is one openssl process under TCG)
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
    let mut figure = String::new();
    for r in reloaded {
        let _ = writeln!(
            figure,
            "{} reloaded live {} ms after the renewal",
            r["component"].as_str().unwrap_or_default(),
            r["reloaded_after_ms"]
        );
    }
    let _ = write!(
        figure,
        "real apiserver /readyz ({polls} polls, 100 ms apart plus the openssl probe itself): \
         longest outage {longest:.1}s, total {total:.1}s"
    );
    figure
}

/// The second pass on the same boot, by the real kubeadm (certrotor's kubeadm engine, the image
/// found in host-containerd): what every renewal must show (`assert_renewal`, super-admin.conf
/// set aside as kubeadm v1.20.2 has none), kubectl with the renewed admin.conf, the real kubeadm
/// said it renewed each certificate and kubeconfig, and no container or staging copy (which
/// holds keys) is left behind. Returns the pass's report.
pub fn assert_kubeadm_pass(b: &Boot, sc: &Scenario) -> Value {
    let kubeconfigs: Vec<&str> = KUBECONFIGS
        .into_iter()
        .filter(|k| *k != "super-admin.conf")
        .collect();
    let (kubeadm_report, _) = assert_renewal(b, sc, "kubeadm-", &kubeconfigs);
    // The real apiserver serves what the real kubeadm renewed, and kubectl with the renewed
    // admin.conf reads back what was written before.
    assert_kubectl_after_as(b, sc, "kubeadm-");
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
    kubeadm_report
}

/// The `apiclient exec` lines of the install page's block tested as `exec`.
pub fn readme_exec_lines() -> Vec<String> {
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
pub fn assert_first_boot(b: &Boot) {
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
pub fn assert_readme_exec(b: &Boot, lines: &[String], report: &Value) {
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
                let v: Value =
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
