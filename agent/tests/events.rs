//! Kubernetes Events (issue 12.4) against the real kube-apiserver v1.20.2 with a real etcd, run
//! by kubelet-sim from a lab node's manifests on 127.0.0.1 (cluster.rs's harness): after a `run`
//! that renews, `kubectl get events` (the real kubectl v1.20.2) shows `CertificatesRenewed` on the
//! Node with the certificates and the new expiry; with the apiserver down, the post fails with a
//! warning and the pass's result is the same.

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{etcd_installed, kubelet_for, offsets, probe_state, stop_kubelet};
use crate::renew_util::*;

const TEST: &str = "events::a_renewal_posts_a_node_event_that_kubectl_shows";

fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    Cmd::new(kubectl)
        .args(&["--kubeconfig", s(kubeconfig), "--request-timeout=15s"])
        .args(args)
        .run()
}

/// `run --once --platform none [extra] --output json` with Events on; it must exit 0.
fn run_once_with_events(root: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["run", "--once", "--root", s(root), "--platform", "none"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--output", "json"]);
    certrotor(&args).env("CERTROTOR_EVENTS", "on").run().ok()
}

/// kubelet-sim stopped (SIGTERM: it stops its pods) when the test ends, passed or not.
struct Kubelet(Option<Background>);

impl Drop for Kubelet {
    fn drop(&mut self) {
        stop_kubelet(&mut self.0);
    }
}

#[test]
fn a_renewal_posts_a_node_event_that_kubectl_shows_and_a_down_apiserver_changes_nothing() {
    etcd_installed(TEST);
    // images/setup-host.sh unpacks it (Debian's kubernetes-client); missing, the test fails.
    let kubectl_bin = crate::platform::platform_util::kubectl_path();
    let t = TempDir::new("events");
    let off = offsets(1)[0];
    let root = lab(
        &t.join("node"),
        &[
            "--advertise-address",
            "127.0.0.1",
            "--expires-in",
            "3d",
            "--key-algorithm",
            "ecdsa-p256",
            "--node-name",
            "cp-events",
            "--port-offset",
            &off.to_string(),
        ],
    );
    testkit::k8s::cut_apiserver_start_up_under(&root);
    let bin_dir = t.join("bin");
    // The real kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2.
    let path = testkit::k8s::path_with_control_plane(&bin_dir);
    let mut kubelet = Kubelet(Some(kubelet_for(&root, &t.path, "events", &path)));
    let pki = root.join("etc/kubernetes/pki");
    let ca = fs::read(pki.join("ca.crt")).unwrap();
    let pair = (
        fs::read(pki.join("apiserver-kubelet-client.crt")).unwrap(),
        fs::read(pki.join("apiserver-kubelet-client.key")).unwrap(),
    );
    let port = 6443 + off;
    wait_for(
        "the real kube-apiserver ready",
        Duration::from_secs(180),
        || probe_state(port, "/readyz", &ca, &pair).1.then_some(()),
    );
    // kubeadm >= 1.29 binds kubeadm:cluster-admins (admin.conf's group) to cluster-admin with
    // super-admin.conf during init; lab init writes 1.29 subjects, so do what kubeadm does.
    testkit::k8s::grant_cluster_admins(&root.join("etc/kubernetes/super-admin.conf"));

    // A pass that renews everything due (platform none: the running apiserver keeps serving).
    let run = run_once_with_events(&root, &[]);
    assert!(
        run.stderr
            .contains("posted Kubernetes Event CertificatesRenewed on node cp-events"),
        "{run}"
    );
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    let not_after = report["renew"]["plan"]["not_after"]
        .as_str()
        .unwrap()
        .to_string();

    // kubectl, with the renewed admin.conf, sees the Event on the Node.
    let admin = root.join("etc/kubernetes/admin.conf");
    let got = kubectl(
        &kubectl_bin,
        &admin,
        &["get", "events", "--namespace", "default", "-o", "json"],
    );
    assert_eq!(got.code(), Some(0), "{got}");
    let list: Value = serde_json::from_str(&got.stdout).unwrap();
    let events: Vec<&Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["source"]["component"] == "certrotor")
        .collect();
    assert_eq!(events.len(), 1, "{:#}", list);
    let e = events[0];
    assert_eq!(e["reason"], "CertificatesRenewed", "{e:#}");
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["involvedObject"]["kind"], "Node");
    assert_eq!(e["involvedObject"]["name"], "cp-events");
    assert_eq!(e["count"], 1);
    assert_eq!(e["firstTimestamp"], e["lastTimestamp"]);
    assert!(e["firstTimestamp"].is_string(), "{e:#}");
    let message = e["message"].as_str().unwrap();
    for name in ["apiserver", "etcd-server", "admin.conf", not_after.as_str()] {
        assert!(message.contains(name), "message lacks '{name}': {message}");
    }
    // And the table a person reads.
    let table = kubectl(
        &kubectl_bin,
        &admin,
        &[
            "get",
            "events",
            "--namespace",
            "default",
            "--field-selector",
            "involvedObject.kind=Node,involvedObject.name=cp-events",
        ],
    );
    assert_eq!(table.code(), Some(0), "{table}");
    assert!(
        table.stdout.contains("CertificatesRenewed") && table.stdout.contains("node/cp-events"),
        "{table}"
    );

    // The apiserver down: the post fails, with a warning, and the pass's result is the same.
    stop_kubelet(&mut kubelet.0);
    wait_for("the apiserver down", Duration::from_secs(30), || {
        (!probe_state(port, "/readyz", &ca, &pair).0).then_some(())
    });
    let down = run_once_with_events(&root, &["--all"]);
    assert!(
        down.stderr
            .contains("could not post the Kubernetes Event CertificatesRenewed")
            && down.stderr.contains("what certrotor did stands"),
        "{down}"
    );
    let report: Value = serde_json::from_str(&down.stdout).unwrap();
    assert!(report["renew"]["backup_id"].is_string(), "{down}");
    let status = certrotor(&[
        "status",
        "--root",
        s(&root),
        "--output",
        "json",
        "--cluster",
        "off",
    ])
    .run()
    .ok();
    let last: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(last["last_pass"]["result"], "renewed", "{status}");
    assert_eq!(last["last_pass"]["exit_code"], 0);
    assert_eq!(last["last_pass"]["backup_id"], report["renew"]["backup_id"]);
}
