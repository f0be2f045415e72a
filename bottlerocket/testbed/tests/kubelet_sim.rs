//! Integration tests of the kubelet-sim binary: real processes, real manifest files, state files.
//!
//! The last test runs a kubeadm-style kube-apiserver manifest through kubelet-sim, with k8s-sim
//! reached through a `PATH` folder of symlinks, against a real etcd.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;
use testbed::kubelet_sim::{PodState, state_path};

/// A running kubelet-sim with its folders.
struct Kubelet {
    process: Proc,
    manifests: PathBuf,
    state_dir: PathBuf,
}

impl Kubelet {
    fn start(dir: &Path, root: &Path, path_env: Option<&str>) -> Kubelet {
        let manifests = dir.join("manifests");
        let state_dir = dir.join("state");
        fs::create_dir_all(&manifests).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_kubelet-sim"));
        command
            .arg("--manifests")
            .arg(&manifests)
            .arg(format!("--state-dir={}", state_dir.display()))
            .arg(format!("--root={}", root.display()))
            .args(["--poll-ms", "50", "--start-delay-ms", "100"])
            .args(["--grace-seconds", "2"])
            .arg(format!("--log-dir={}", dir.join("pod-logs").display()));
        if let Some(path) = path_env {
            command.env("PATH", path);
        }
        let process = Proc::spawn("kubelet-sim", command, &dir.join("kubelet-sim.log"));
        Kubelet {
            process,
            manifests,
            state_dir,
        }
    }

    fn state(&self, pod: &str) -> Result<PodState, String> {
        let path = state_path(&self.state_dir, pod);
        let bytes = fs::read(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|error| error.to_string())
    }

    /// Waits until the state of `pod` satisfies `done`.
    fn wait_state(&self, pod: &str, what: &str, done: impl Fn(&PodState) -> bool) -> PodState {
        wait_for(&format!("pod '{pod}': {what}"), DEADLINE, || {
            let state = self.state(pod)?;
            if done(&state) {
                Ok(state)
            } else {
                Err(format!("{state:?}"))
            }
        })
    }

    /// Writes a manifest the way careful writers do: temp dotfile, then rename.
    fn write_manifest(&self, file_name: &str, text: &str) {
        let temp = self.manifests.join(format!(".{file_name}.tmp"));
        fs::write(&temp, text).unwrap();
        fs::rename(&temp, self.manifests.join(file_name)).unwrap();
    }
}

fn sleeper_manifest(name: &str, seconds: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: kube-system\nspec:\n  \
         containers:\n  - name: {name}\n    image: registry.k8s.io/pause:3.9\n    command: [sleep]\n    \
         args: [\"{seconds}\"]\n  hostNetwork: true\n"
    )
}

fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn pod_follows_its_manifest_appear_change_disappear() {
    let dir = TempDir::new("lifecycle");
    let kubelet = Kubelet::start(dir.path(), Path::new("/"), None);
    // Bottlerocket style: no extension. Dotfiles and swap files are not pods.
    kubelet.write_manifest("sleeper", &sleeper_manifest("sleeper", "1001"));
    fs::write(
        kubelet.manifests.join(".hidden"),
        sleeper_manifest("hidden", "1"),
    )
    .unwrap();
    fs::write(
        kubelet.manifests.join("sleeper.swp"),
        sleeper_manifest("swap", "1"),
    )
    .unwrap();

    let first = kubelet.wait_state("sleeper", "running", |state| state.running);
    let first_pid = first.pid.unwrap();
    assert_eq!(first.history.len(), 1);
    assert_eq!(first.history[0].pid, first_pid);
    assert!(
        cmdline(first_pid).contains("sleep 1001"),
        "{}",
        cmdline(first_pid)
    );
    assert_eq!(
        first.manifest.as_deref(),
        Some(kubelet.manifests.join("sleeper").to_str().unwrap())
    );

    // A content change stops the old process before starting the new one.
    kubelet.write_manifest("sleeper", &sleeper_manifest("sleeper", "1002"));
    let second = kubelet.wait_state("sleeper", "restarted with new content", |state| {
        state.running && state.history.len() == 2
    });
    let (old, new) = (&second.history[0], &second.history[1]);
    assert_eq!(old.pid, first_pid);
    assert!(process_gone(first_pid));
    assert_eq!(old.exit.as_deref(), Some("signal: 15 (SIGTERM)"));
    assert_eq!(old.reason.as_deref(), Some("manifest changed"));
    assert!(
        old.stopped_at_ms.unwrap() <= new.started_at_ms,
        "{second:?}"
    );
    assert_ne!(old.manifest_sha256, new.manifest_sha256);
    assert_eq!(
        second.restarts, 0,
        "a manifest change is not a crash restart"
    );
    assert!(cmdline(new.pid).contains("sleep 1002"));

    // Removal stops the process and keeps the history.
    fs::remove_file(kubelet.manifests.join("sleeper")).unwrap();
    let gone = kubelet.wait_state("sleeper", "stopped", |state| !state.running);
    assert!(process_gone(new.pid));
    assert_eq!(gone.pid, None);
    assert!(!gone.manifest_present);
    assert_eq!(gone.history.len(), 2);
    assert_eq!(
        gone.history[1].reason.as_deref(),
        Some("manifest removed"),
        "{gone:?}"
    );

    // Reappearing (kubeadm style, with extension) starts it again, history preserved.
    kubelet.write_manifest("sleeper.yaml", &sleeper_manifest("sleeper", "1003"));
    let back = kubelet.wait_state("sleeper", "running again", |state| state.running);
    assert_eq!(back.history.len(), 3);
    for ignored in ["hidden", "swap"] {
        assert!(kubelet.state(ignored).is_err(), "{ignored} must be ignored");
    }
}

#[test]
fn crashing_pod_is_restarted_with_backoff() {
    let dir = TempDir::new("crash");
    let kubelet = Kubelet::start(dir.path(), Path::new("/"), None);
    kubelet.write_manifest(
        "crasher.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crasher}\nspec:\n  containers:\n  - name: c\n    \
         command: [sh, -c, 'echo crashing; exit 3']\n",
    );
    let state = kubelet.wait_state("crasher", "two crash restarts", |state| {
        state.restarts >= 2 && state.history.len() >= 3 && state.history[2].exit.is_some()
    });
    for entry in &state.history[..3] {
        assert_eq!(entry.exit.as_deref(), Some("exit status: 3"), "{state:?}");
        assert_eq!(entry.reason.as_deref(), Some("exited by itself"));
    }
    // Each restart came after the previous exit, with the back-off the sim chose for that crash
    // in a row (its own log says so; the doubling itself is `backoff_doubles_and_caps`): no
    // assertion on how long the wait took by the clock.
    for index in 1..3 {
        assert!(
            state.history[index - 1].stopped_at_ms.unwrap() <= state.history[index].started_at_ms,
            "restarted before it exited: {state:?}"
        );
    }
    let sim = fs::read_to_string(dir.path().join("kubelet-sim.log")).unwrap();
    let delays: Vec<&str> = sim
        .lines()
        .filter(|l| l.contains("pod 'crasher'") && l.contains("exited by itself"))
        .filter_map(|l| l.rsplit_once("restarting in ").map(|(_, d)| d))
        .collect();
    assert_eq!(delays[..2], ["1000 ms", "2000 ms"], "back-offs:\n{sim}");
    let log = fs::read_to_string(dir.path().join("pod-logs/crasher.log")).unwrap();
    assert!(log.matches("crashing").count() >= 3, "{log}");
}

#[test]
fn host_path_mounts_are_rewritten_under_root() {
    let dir = TempDir::new("hostpath");
    let root = dir.path().join("root");
    fs::create_dir_all(root.join("out-host")).unwrap();
    let kubelet = Kubelet::start(dir.path(), &root, None);
    let manifest = r#"apiVersion: v1
kind: Pod
metadata: {name: printer, namespace: kube-system}
spec:
  containers:
  - name: printer
    command: [sh, -c]
    args:
    - 'printf "%s\n" "$@" "$CERTS" "$PLAIN" > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 1000'
    - sh
    - /etc/kubernetes/pki/ca.crt
    - --tls-cert-file=/etc/kubernetes/pki/apiserver.crt
    - --etcd-cafile=/etc/kubernetes/pki/etcd/ca.crt
    - /etc/kubernetes/pkix/not-a-mount
    env:
    - {name: OUT, value: /out/args.txt}
    - {name: CERTS, value: /etc/kubernetes/pki/etcd}
    - {name: PLAIN, value: plain}
    volumeMounts:
    - {mountPath: /etc/kubernetes/pki, name: k8s-certs, readOnly: true}
    - {mountPath: /etc/kubernetes/pki/etcd, name: etcd-certs, readOnly: true}
    - {mountPath: /out, name: out}
  volumes:
  - {name: k8s-certs, hostPath: {path: /var/lib/kubeadm/pki, type: DirectoryOrCreate}}
  - {name: etcd-certs, hostPath: {path: /var/lib/etcd-pki}}
  - {name: out, hostPath: {path: /out-host}}
"#;
    kubelet.write_manifest("printer", manifest);
    let output = root.join("out-host/args.txt");
    let text = wait_for("the pod to write its arguments", DEADLINE, || {
        fs::read_to_string(&output).map_err(|error| error.to_string())
    });
    let root = root.display();
    let expected = format!(
        "{root}/var/lib/kubeadm/pki/ca.crt\n\
         --tls-cert-file={root}/var/lib/kubeadm/pki/apiserver.crt\n\
         --etcd-cafile={root}/var/lib/etcd-pki/ca.crt\n\
         /etc/kubernetes/pkix/not-a-mount\n\
         {root}/var/lib/etcd-pki\n\
         plain\n"
    );
    assert_eq!(text, expected);
}

#[test]
fn sigterm_stops_every_pod_and_exits() {
    let dir = TempDir::new("sigterm");
    let mut kubelet = Kubelet::start(dir.path(), Path::new("/"), None);
    kubelet.write_manifest("one.yaml", &sleeper_manifest("one", "1001"));
    kubelet.write_manifest("two.yaml", &sleeper_manifest("two", "1002"));
    let pids: Vec<u32> = ["one", "two"]
        .iter()
        .map(|pod| {
            kubelet
                .wait_state(pod, "running", |state| state.running)
                .pid
                .unwrap()
        })
        .collect();
    kubelet.process.signal(nix::sys::signal::Signal::SIGTERM);
    let status = kubelet.process.wait_exit(DEADLINE);
    assert!(status.success(), "{status}");
    for (pod, pid) in ["one", "two"].iter().zip(pids) {
        assert!(process_gone(pid), "pid {pid} of {pod} survived");
        let state = kubelet.state(pod).unwrap();
        assert!(!state.running);
        assert_eq!(
            state.history[0].reason.as_deref(),
            Some("kubelet-sim shutdown")
        );
    }
}

#[test]
fn children_do_not_outlive_a_killed_kubelet_sim() {
    let dir = TempDir::new("sigkill");
    let mut kubelet = Kubelet::start(dir.path(), Path::new("/"), None);
    kubelet.write_manifest("orphan", &sleeper_manifest("orphan", "1001"));
    let pid = kubelet
        .wait_state("orphan", "running", |state| state.running)
        .pid
        .unwrap();
    kubelet.process.signal(nix::sys::signal::Signal::SIGKILL);
    kubelet.process.wait_exit(DEADLINE);
    wait_for("the orphan to die", DEADLINE, || {
        if process_gone(pid) {
            Ok(())
        } else {
            Err(cmdline(pid))
        }
    });
}

#[test]
fn kubeadm_apiserver_manifest_runs_under_kubelet_sim() {
    if !etcd_available("kubeadm_apiserver_manifest_runs_under_kubelet_sim") {
        return;
    }
    let dir = TempDir::new("kubeadm");
    let root = dir.path().join("root");
    // Bottlerocket keeps the kubeadm PKI in /var/lib/kubeadm/pki; the manifest mounts it at
    // /etc/kubernetes/pki.
    let host_pki = root.join("var/lib/kubeadm/pki");
    generate_pki(&host_pki);
    let etcd = Etcd::start(dir.path(), &host_pki);
    let bin = component_bin_dir(dir.path());
    let kubelet = Kubelet::start(dir.path(), &root, Some(&path_with(&bin)));
    let port = free_port();
    let manifest = |extra: &str, key: &str| {
        let flags: Vec<String> = apiserver_flags(Path::new("/etc/kubernetes/pki"), port, &etcd.url)
            .into_iter()
            .map(|flag| {
                if flag.starts_with("--tls-private-key-file=") {
                    format!("--tls-private-key-file=/etc/kubernetes/pki/{key}")
                } else {
                    flag
                }
            })
            .chain((!extra.is_empty()).then(|| extra.to_string()))
            .map(|flag| format!("    - {flag}\n"))
            .collect();
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {{component: kube-apiserver, tier: \
             control-plane}}\n  name: kube-apiserver\n  namespace: kube-system\nspec:\n  \
             containers:\n  - command:\n    - kube-apiserver\n{}    image: \
             registry.k8s.io/kube-apiserver:v1.31.0\n    name: kube-apiserver\n    \
             volumeMounts:\n    - mountPath: /etc/kubernetes/pki\n      name: k8s-certs\n      \
             readOnly: true\n  hostNetwork: true\n  priorityClassName: system-node-critical\n  \
             volumes:\n  - hostPath:\n      path: /var/lib/kubeadm/pki\n      type: \
             DirectoryOrCreate\n    name: k8s-certs\n",
            flags.concat()
        )
    };
    let client = client(
        &host_pki.join("ca.crt"),
        Some((&host_pki.join("client.crt"), &host_pki.join("client.key"))),
    );
    let readyz = format!("https://127.0.0.1:{port}/readyz");

    kubelet.write_manifest("kube-apiserver.yaml", &manifest("", "apiserver.key"));
    wait_for_status(&readyz, &client, 200, "ok");
    let first = kubelet.state("kube-apiserver").unwrap();

    // A changed manifest restarts the apiserver: stop before start, ready again.
    kubelet.write_manifest("kube-apiserver.yaml", &manifest("--v=2", "apiserver.key"));
    let second = kubelet.wait_state("kube-apiserver", "restarted", |state| {
        state.running && state.history.len() == 2
    });
    assert_eq!(second.history[0].pid, first.pid.unwrap());
    assert!(second.history[0].stopped_at_ms.unwrap() <= second.history[1].started_at_ms);
    wait_for_status(&readyz, &client, 200, "ok");

    // A wrong key makes the apiserver fail at startup, and kubelet-sim restarts it with back-off.
    kubelet.write_manifest("kube-apiserver.yaml", &manifest("", "other-apiserver.key"));
    let failing = kubelet.wait_state("kube-apiserver", "crash restart", |state| {
        state.restarts >= 1 && state.history.len() >= 4
    });
    assert_eq!(failing.history[2].exit.as_deref(), Some("exit status: 1"));
    let pod_log = fs::read_to_string(dir.path().join("pod-logs/kube-apiserver.log")).unwrap();
    assert!(pod_log.contains("does not match certificate"), "{pod_log}");

    // Removing the manifest takes the endpoint away.
    fs::remove_file(kubelet.manifests.join("kube-apiserver.yaml")).unwrap();
    kubelet.wait_state("kube-apiserver", "stopped", |state| !state.running);
    let error = get(&readyz, &client).unwrap_err();
    assert!(error.contains("Connection refused"), "{error}");
}
