//! `run --once` on a node whose control plane really runs: apiserver-sim (Bottlerocket API),
//! kubelet-sim, the real etcd and the k8s-sim stand-ins. Restart one at a time, verification of
//! the served certificates, automatic rollback, repair after a crash, `--platform none` and
//! `--dry-run`. The harness is in `platform_util`.

use std::time::Duration;

#[path = "platform_util.rs"]
mod platform_util;

use platform_util::{
    Node, PODS, Platform, Served, changed_pods, one_at_a_time, restarted_once, wait_for,
};

/// A key written to etcd before a run, read back after it.
const KEY: &str = "/certrotor-test/before-the-run";
const VALUE: &str = "written-with-the-old-healthcheck-client-certificate";

fn served_now(node: &Node) -> Vec<String> {
    Served::ALL.iter().map(|s| node.served_sha(*s)).collect()
}

fn files_now(node: &Node) -> Vec<String> {
    Served::ALL.iter().map(|s| node.file_sha(*s)).collect()
}

/// The happy flow on `platform`: every served certificate is the new one, etcd's data
/// survives, and, with `--restart always`, each component is restarted exactly once and never
/// two at a time; with the default live mode, etcd (real, which reloads its server and peer
/// certificates on the next handshake) is not restarted and the three others are (the
/// apiserver because apiserver-etcd-client cannot be reloaded, the controller-manager and
/// scheduler because of their kubeconfigs).
fn happy_flow(test: &str, platform: Platform, always: bool) {
    let Some(node) = Node::start(test, platform, None) else {
        return;
    };
    let old = files_now(&node);
    assert_eq!(
        served_now(&node),
        old,
        "before the run, the files on disk are served"
    );
    let old_client = node.cert_sha("pki/etcd/healthcheck-client.crt");
    let put = node.etcdctl(&["put", KEY, VALUE]);
    assert!(put.status.success(), "etcdctl put: {put:?}");
    let before = node.states();

    let mode = if always { "always" } else { "live" };
    let out = node.run_once(
        platform.name(),
        "30s",
        &["--output", "json", "--restart", mode],
    );
    out.expect(0);
    let report = out.json();

    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("not an array: {v}\n{out}"))
            .iter()
            .map(|c| {
                c.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| c["component"].as_str().unwrap().into())
            })
            .collect()
    };
    let restarted_pods: &[&str] = if always { &PODS } else { &PODS[1..] };
    assert_eq!(report["platform"], platform.name(), "{out}");
    assert_eq!(names(&report["components"]), PODS, "{out}");
    assert_eq!(names(&report["restarted"]), restarted_pods, "{out}");
    let reloaded: &[&str] = if always { &[] } else { &PODS[..1] };
    assert_eq!(names(&report["reloaded"]), reloaded, "{out}");
    assert!(report["rolled_back"].is_null(), "{out}");

    // Every served certificate is the new file, which differs from the old one.
    let new = files_now(&node);
    for (i, s) in Served::ALL.iter().enumerate() {
        assert_ne!(new[i], old[i], "{s:?}: the file was not renewed\n{out}");
    }
    assert_eq!(
        served_now(&node),
        new,
        "the new certificates are served\n{out}"
    );
    let restarted = report["restarted"].as_array().unwrap();
    let api = restarted
        .iter()
        .find(|r| r["component"] == "kube-apiserver")
        .unwrap();
    assert_eq!(api["served_sha256"], new[2].as_str(), "{out}");
    let etcd = if always {
        &restarted[0]
    } else {
        &report["reloaded"][0]
    };
    assert_eq!(etcd["served_sha256"], new[0].as_str(), "{out}");
    // Every restart says why.
    for r in restarted {
        let reason = r["reason"].as_str().unwrap();
        match (always, r["component"].as_str().unwrap()) {
            (true, _) => assert!(reason.starts_with("--restart always"), "{out}"),
            (false, "kube-apiserver") => {
                assert!(
                    reason.contains("apiserver-kubelet-client is not proven to reload"),
                    "{reason}\n{out}"
                )
            }
            (false, c) => assert!(reason.contains(".conf cannot be reloaded"), "{c}: {out}"),
        }
    }

    // etcd's data survived; the new client certificate reads it.
    assert_ne!(node.cert_sha("pki/etcd/healthcheck-client.crt"), old_client);
    let get = node.etcdctl(&["get", KEY, "--print-value-only"]);
    assert!(get.status.success(), "etcdctl get: {get:?}");
    assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), VALUE);

    // Each restarted component restarted exactly once, one at a time, in order; etcd, when
    // reloaded live, kept its process (kubelet-sim's history is unchanged); all healthy now.
    let after = node.states();
    let windows = restarted_once(&before, &after, restarted_pods);
    one_at_a_time(&windows);
    if !always {
        assert_eq!(
            before["etcd"].history, after["etcd"].history,
            "etcd was restarted\n{out}"
        );
    }
    for pod in PODS {
        node.healthy(pod).unwrap();
    }

    let longest = windows.iter().max_by_key(|w| w.ms()).unwrap();
    let reported: Vec<String> = restarted
        .iter()
        .map(|r| {
            format!(
                "{} {} ms",
                r["component"].as_str().unwrap(),
                r["unavailable_ms"]
            )
        })
        .collect();
    let kubelet: Vec<String> = windows
        .iter()
        .map(|w| format!("{} {} ms", w.pod, w.ms()))
        .collect();
    let worst = restarted
        .iter()
        .max_by_key(|r| r["unavailable_ms"].as_u64().unwrap())
        .unwrap();
    eprintln!(
        "FIGURES platform {} --restart {mode}: all components verified {} ms after start (wall clock; report \
         duration_ms {}). Longest unavailability, certrotor's stop request .. verified healthy: \
         {} ms ({}); per component: {}. Longest down window seen by kubelet-sim, old process \
         reaped .. new process started: {} ms ({}); per component: {}.",
        platform.name(),
        out.elapsed.as_millis(),
        report["duration_ms"],
        worst["unavailable_ms"],
        worst["component"].as_str().unwrap(),
        reported.join(", "),
        longest.ms(),
        longest.pod,
        kubelet.join(", ")
    );
}

#[test]
fn bottlerocket_renews_reloads_etcd_live_restarts_the_rest_and_verifies() {
    happy_flow("bottlerocket-happy", Platform::Bottlerocket, false);
}

#[test]
fn kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies() {
    happy_flow("kubeadm-happy", Platform::Kubeadm, false);
}

#[test]
fn kubeadm_restart_always_restarts_all_four_one_at_a_time() {
    happy_flow("kubeadm-always", Platform::Kubeadm, true);
}

#[test]
fn bottlerocket_rolls_back_when_the_apiserver_rejects_the_new_certificate() {
    let one_hour_ago = certrotor::clock::rfc3339(certrotor::clock::now() - 3600);
    let Some(node) = Node::start(
        "bottlerocket-rollback",
        Platform::Bottlerocket,
        Some(&one_hour_ago),
    ) else {
        return;
    };
    let old = files_now(&node);
    assert_eq!(served_now(&node), old);
    let files_before = node.snapshot();

    // etcd restarts and verifies with the new certificates; kube-apiserver refuses to start.
    let out = node.run_once("bottlerocket", "12s", &[]);
    out.expect(3);
    assert!(
        out.stdout.contains("VERIFICATION FAILED: kube-apiserver"),
        "{out}"
    );
    assert!(out.stderr.contains("verification failed"), "{out}");
    assert!(
        out.stderr
            .contains("the previous certificates are served again"),
        "{out}"
    );

    // The old certificates are on disk, byte for byte, and served again.
    let files_after = node.snapshot();
    for (path, bytes) in &files_before {
        assert!(
            files_after.get(path) == Some(bytes),
            "{} differs after the rollback\n{out}",
            path.display()
        );
    }
    assert_eq!(
        files_after.keys().collect::<Vec<_>>(),
        files_before.keys().collect::<Vec<_>>(),
        "{out}"
    );
    assert_eq!(
        served_now(&node),
        old,
        "the old certificates are served again\n{out}"
    );
    let kinds = node.backup_kinds();
    assert!(kinds.iter().any(|k| k == "rollback"), "backups: {kinds:?}");
    assert!(kinds.iter().any(|k| k == "renew"), "backups: {kinds:?}");
    node.wait_all_healthy();
}

/// SIGKILL certrotor while etcd is stopped; any later command starts it again.
fn crash_is_repaired(test: &str, platform: Platform) {
    let Some(node) = Node::start(test, platform, None) else {
        return;
    };
    let manifest = node.kubelet_manifest("etcd");
    let manifest_bytes = std::fs::read(&manifest).unwrap();
    let old = node.file_sha(Served::EtcdClient);
    let mut run = node.spawn_run_once(platform.name());
    wait_for(
        "the restart marker and etcd's manifest gone",
        Duration::from_secs(60),
        Duration::from_millis(2),
        || {
            if let Some(status) = run.exited() {
                panic!(
                    "certrotor exited ({status}) before it stopped etcd:\n{}",
                    run.log_text()
                );
            }
            if node.marker().exists() && !manifest.exists() {
                Ok(())
            } else {
                Err(format!(
                    "marker {}, manifest {}",
                    node.marker().exists(),
                    manifest.exists()
                ))
            }
        },
    );
    run.kill();
    assert!(
        node.marker().exists(),
        "the marker of the interrupted restart is left"
    );
    // kubelet-sim stops etcd, which stays down.
    wait_for(
        "etcd to be stopped",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let s = &node.states()["etcd"];
            if !s.running && !s.manifest_present {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        },
    );
    assert!(!manifest.exists());

    let check = node.certrotor(&["check", "--root", node.root.to_str().unwrap()]);
    assert!(matches!(check.code, Some(0 | 1)), "{check}");
    assert!(check.stderr.contains("started static pod 'etcd"), "{check}");
    assert!(!node.marker().exists(), "{check}");

    // The manifest is back (the Bottlerocket API renders it asynchronously), and etcd with it.
    wait_for(
        "etcd's manifest back",
        Duration::from_secs(30),
        Duration::from_millis(20),
        || match std::fs::read(&manifest) {
            Ok(b) if b == manifest_bytes => Ok(()),
            Ok(_) => Err("different bytes".to_string()),
            Err(e) => Err(e.to_string()),
        },
    );
    if platform == Platform::Kubeadm {
        let parked = node.root.join("etc/kubernetes/.certrotor-parked/etcd.yaml");
        assert!(!parked.exists(), "{} is left", parked.display());
    }
    wait_for(
        "etcd running and healthy",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let s = &node.states()["etcd"];
            if !s.running {
                return Err(format!("{s:?}"));
            }
            node.healthy("etcd")
        },
    );
    // It reads the renewed files (the renewal had completed before the restarts began).
    let new = node.file_sha(Served::EtcdClient);
    assert_ne!(new, old);
    assert_eq!(node.served_sha(Served::EtcdClient), new);

    // The crashed pass still owed restarts to the other components, whose files it renewed;
    // the next pass renews nothing but finishes them, and the apiserver then serves its file.
    let old_apiserver = node.served_sha(Served::Apiserver);
    assert_ne!(
        old_apiserver,
        node.file_sha(Served::Apiserver),
        "the apiserver still serves the old file"
    );
    let next = node.run_once(platform.name(), "60s", &["--output", "json"]);
    assert_eq!(next.code, Some(0), "{next}");
    let report: serde_json::Value = serde_json::from_str(&next.stdout).unwrap();
    let restarted: Vec<&str> = report["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["component"].as_str().unwrap())
        .collect();
    for owed in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        assert!(restarted.contains(&owed), "{owed} not restarted: {next}");
    }
    assert_eq!(
        report["renew"]["backup_id"],
        serde_json::Value::Null,
        "nothing was due: {next}"
    );
    assert_eq!(
        node.served_sha(Served::Apiserver),
        node.file_sha(Served::Apiserver)
    );
    assert!(
        !node
            .root
            .join("var/lib/certrotor/pending-restarts.json")
            .exists()
    );
}

#[test]
fn kubeadm_restart_interrupted_by_a_crash_is_repaired() {
    crash_is_repaired("kubeadm-crash", Platform::Kubeadm);
}

#[test]
fn bottlerocket_restart_interrupted_by_a_crash_is_repaired() {
    crash_is_repaired("bottlerocket-crash", Platform::Bottlerocket);
}

#[test]
fn platform_none_renews_and_restarts_nothing() {
    let Some(node) = Node::start("none", Platform::Kubeadm, None) else {
        return;
    };
    let old = files_now(&node);
    let before = node.states();
    let out = node.run_once("none", "30s", &[]);
    out.expect(0);
    assert!(
        out.stdout.contains(
            "Platform none: restart etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
        ),
        "{out}"
    );
    let new = files_now(&node);
    for (i, s) in Served::ALL.iter().enumerate() {
        assert_ne!(new[i], old[i], "{s:?} was not renewed\n{out}");
    }
    assert!(
        changed_pods(&before, &node.states()).is_empty(),
        "a pod was restarted\n{out}"
    );
    // The apiserver (stand-in) reads its serving certificate at start only; etcd reloads its
    // certificate files on every handshake, so it serves the new one without a restart.
    assert_eq!(
        node.served_sha(Served::Apiserver),
        old[2],
        "nothing restarted, so the apiserver serves the old certificate"
    );
    assert_eq!(node.served_sha(Served::EtcdClient), new[0]);
}

#[test]
fn dry_run_changes_and_restarts_nothing() {
    let Some(node) = Node::start("dry-run", Platform::Kubeadm, None) else {
        return;
    };
    let old = files_now(&node);
    let files = node.snapshot();
    let before = node.states();
    let out = node.run_once("kubeadm", "30s", &["--dry-run"]);
    out.expect(0);
    assert!(out.stdout.contains("Would renew"), "{out}");
    assert!(node.snapshot() == files, "files changed\n{out}");
    assert!(
        changed_pods(&before, &node.states()).is_empty(),
        "a pod was restarted\n{out}"
    );
    assert_eq!(served_now(&node), old);
    assert!(node.backup_kinds().is_empty(), "{out}");
}

/// Consumers from the manifests (issue 11 point 2): a kube-vip-like static pod (what `lab init
/// --kube-vip` adds: the k8s-sim kube-vip stand-in, which reads its kubeconfig at start) mounts
/// admin.conf as a single file. After a renewal the pass finds it from its manifest, restarts it
/// (after the components, one at a time) with its reason, and verifies it by its liveness
/// probe; on a second pass that renews only admin.conf, no component reads it: only kube-vip is
/// restarted.
#[test]
fn kubeadm_restarts_kube_vip_mounting_admin_conf() {
    let Some(node) = Node::start("kubeadm-kube-vip", Platform::Kubeadm, None) else {
        return;
    };
    certrotor::lab::add_kube_vip(&node.root, certrotor::lab::LabLayout::Kubeadm, node.offset)
        .unwrap();
    let state = node.state_dir().join("kube-vip.json");
    let read_state = || -> Result<testbed::kubelet_sim::PodState, String> {
        serde_json::from_slice(&std::fs::read(&state).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    };
    wait_for(
        "the kube-vip stand-in running",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let s = read_state()?;
            s.running.then_some(()).ok_or(format!("{s:?}"))
        },
    );
    let before = read_state().unwrap();
    let out = node.run_once("kubeadm", "30s", &["--output", "json"]);
    out.expect(0);
    let r = out.json();
    let c = r["other_consumers"].as_array().unwrap();
    assert_eq!(c.len(), 1, "{out}");
    assert_eq!(c[0]["pod"], "kube-vip.yaml", "{out}");
    assert_eq!(c[0]["file"], "etc/kubernetes/admin.conf", "{out}");
    assert_eq!(c[0]["single_file"], true, "{out}");
    let pods = r["restarted_pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{out}");
    assert_eq!(pods[0]["pod"], "kube-vip.yaml", "{out}");
    assert!(
        pods[0]["reason"]
            .as_str()
            .unwrap()
            .contains("mounts etc/kubernetes/admin.conf as a single file"),
        "{out}"
    );
    assert_eq!(r["pod_errors"], serde_json::json!([]), "{out}");
    // kubelet-sim saw it restarted once, after the components.
    let after = read_state().unwrap();
    assert_eq!(after.history.len(), before.history.len() + 1, "{after:?}");
    assert!(after.running, "{after:?}");
    let sched = &node.states()["kube-scheduler"];
    assert!(
        after.history.last().unwrap().started_at_ms >= sched.history.last().unwrap().started_at_ms,
        "kube-vip restarted before the scheduler"
    );

    // admin.conf alone: no component reads it, kube-vip alone is restarted.
    let text = node.run_once("kubeadm", "30s", &["--cert", "admin.conf"]);
    text.expect(0);
    assert!(
        text.stdout.contains("kube-vip.yaml")
            && text
                .stdout
                .contains("restarted because static pod 'kube-vip.yaml' mounts"),
        "{text}"
    );
    assert_eq!(
        read_state().unwrap().history.len(),
        before.history.len() + 2
    );
}
