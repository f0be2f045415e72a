//! Integration tests for the Bottlerocket API client against the real `apiserver-sim` binary:
//! transaction isolation, commit-without-diff, the API's error statuses and messages, the
//! asynchronous static-pod applier, persistence across restarts, socket handling.
//!
//! Each test gets its own directory (socket, emulated root, log) and its own emulator process,
//! started through `CARGO_BIN_EXE_apiserver-sim` and stopped with SIGTERM. Waits poll against a
//! deadline; on failure the emulator's log is printed and the directory is kept.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bottlerocket::{ApiClient, ApiError};
use serde_json::json;
use testbed::base64;

/// Generous bound for things that take milliseconds on an idle machine.
const DEADLINE: Duration = Duration::from_secs(20);

const APISERVER_MANIFEST: &[u8] = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n";
const ETCD_MANIFEST: &[u8] = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n";

#[test]
fn pending_changes_are_isolated_per_transaction() {
    let sandbox = Sandbox::new("isolation");
    let sim = Sim::start(&sandbox, &[]);
    let api = sim.client();

    api.patch_settings("certrotor-a", &json!({"motd": "from a"}))
        .expect("patch a");
    api.patch_settings("certrotor-b", &json!({"kubernetes": {"cluster-name": "b"}}))
        .expect("patch b");

    assert_eq!(
        api.pending("certrotor-a").expect("pending a"),
        json!({"motd": "from a"})
    );
    assert_eq!(
        api.pending("certrotor-b").expect("pending b"),
        json!({"kubernetes": {"cluster-name": "b"}})
    );
    assert_eq!(api.pending("default").expect("pending default"), json!({}));
    assert_eq!(
        api.transactions().expect("list"),
        ["certrotor-a", "certrotor-b"]
    );
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );

    assert_eq!(
        api.commit("certrotor-b").expect("commit b"),
        ["settings.kubernetes.cluster-name"]
    );
    assert_eq!(
        api.pending("certrotor-a").expect("a untouched"),
        json!({"motd": "from a"})
    );
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );
    assert_eq!(
        api.discard("certrotor-a").expect("discard"),
        ["settings.motd"]
    );
    assert!(api.transactions().expect("list").is_empty());
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );
    sim.stop();
}

#[test]
fn commit_returns_every_pending_key_even_unchanged_ones() {
    let sandbox = Sandbox::new("no-diff");
    let sim = Sim::start(&sandbox, &[]);
    let api = sim.client();
    let live_motd = api.settings().expect("settings")["motd"].clone();

    let staged = json!({"motd": live_motd, "kubernetes": {"cluster-name": "new"}});
    api.patch_settings("certrotor", &staged).expect("patch");
    let keys = api.commit_and_apply("certrotor").expect("commit");

    assert_eq!(keys, ["settings.kubernetes.cluster-name", "settings.motd"]);
    assert_eq!(
        api.settings_by_keys(&["settings.kubernetes.cluster-name", "settings.motd"])
            .expect("keys"),
        staged
    );
    sim.stop();
}

#[test]
fn empty_commit_is_a_422_that_keeps_the_server_message() {
    let sandbox = Sandbox::new("empty-commit");
    let sim = Sim::start(&sandbox, &[]);
    let api = sim.client();

    let never_used = api
        .commit("certrotor-never-used")
        .expect_err("nothing pending");
    assert!(never_used.is_empty_commit(), "{never_used:?}");
    assert_eq!(
        never_used.server_message(),
        Some("Tried to commit with no pending changes")
    );
    assert_eq!(
        never_used.to_string(),
        "Status 422 when POSTing '/tx/commit?tx=certrotor-never-used': \
         Tried to commit with no pending changes"
    );

    api.patch_settings("certrotor", &json!({"motd": "x"}))
        .expect("patch");
    api.commit_and_apply("certrotor").expect("first commit");
    let second = api
        .commit_and_apply("certrotor")
        .expect_err("already committed");
    assert!(second.is_empty_commit(), "{second:?}");
    sim.stop();
}

#[test]
fn unknown_key_is_a_400_that_keeps_the_server_message_and_stages_nothing() {
    let sandbox = Sandbox::new("unknown-key");
    let sim = Sim::start(&sandbox, &[]);
    let api = sim.client();

    let error = api
        .patch_settings("certrotor", &json!({"motd": "x", "kuberentes": {}}))
        .expect_err("typo");
    assert!(error.is_unknown_key(), "{error:?}");
    let message = error.server_message().expect("status error");
    assert!(
        message.starts_with(
            "Json deserialize error: unknown field `kuberentes`, expected one of `motd`, `kubernetes`"
        ),
        "{message}"
    );

    let wrong_type = api
        .set_static_pod("certrotor", "etcd", ETCD_MANIFEST, true)
        .and_then(|()| {
            api.patch_settings(
                "certrotor",
                &json!({"kubernetes": {"static-pods": {"etcd": {"enabled": "yes"}}}}),
            )
        })
        .expect_err("string for a bool");
    assert_eq!(wrong_type.status(), Some(400));
    assert!(
        wrong_type
            .to_string()
            .contains("invalid type: string \"yes\", expected a boolean"),
        "{wrong_type}"
    );
    // The valid first patch is staged; neither failed patch left anything behind.
    assert_eq!(
        api.pending("certrotor").expect("pending")["kubernetes"]["static-pods"]["etcd"]["enabled"],
        true
    );
    assert!(
        api.pending("certrotor")
            .expect("pending")
            .get("motd")
            .is_none()
    );

    let raw = api
        .raw_request_unchecked("PATCH", "/settings?tx=certrotor", Some(b"{not json"))
        .expect("raw");
    assert_eq!(raw.0, 400);
    assert_eq!(
        api.raw_request_unchecked("GET", "/no/such/route", None)
            .expect("raw")
            .0,
        404
    );
    sim.stop();
}

#[test]
fn static_pod_toggle_renders_manifests_asynchronously_for_every_pod() {
    let sandbox = Sandbox::new("static-pods");
    // A long apply delay makes "commit_and_apply returned but nothing is rendered yet"
    // observable without racing the applier.
    let sim = Sim::start(&sandbox, &["--apply-delay-ms", "1000"]);
    let api = sim.client();
    let pods = sandbox.root().join("etc/kubernetes/static-pods");
    let apiserver = pods.join("kube-apiserver");
    let etcd = pods.join("etcd");

    api.set_static_pod("certrotor-1", "kube-apiserver", APISERVER_MANIFEST, true)
        .expect("stage apiserver");
    api.set_static_pod("certrotor-1", "etcd", ETCD_MANIFEST, true)
        .expect("stage etcd");
    let keys = api.commit_and_apply("certrotor-1").expect("commit");
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(!apiserver.exists(), "apply must not be synchronous");
    wait_until("manifests written", || {
        fs::read(&apiserver).ok().as_deref() == Some(APISERVER_MANIFEST)
            && fs::read(&etcd).ok().as_deref() == Some(ETCD_MANIFEST)
    });

    api.set_static_pod_enabled("certrotor-2", "kube-apiserver", false)
        .expect("stage disable");
    api.commit_and_apply("certrotor-2").expect("commit disable");
    wait_until("kube-apiserver manifest removed", || !apiserver.exists());
    assert_eq!(fs::read(&etcd).expect("etcd untouched"), ETCD_MANIFEST);

    // Every pod is rendered on each run, not only changed ones: a lost etcd manifest comes
    // back when only kube-apiserver is toggled.
    fs::remove_file(&etcd).expect("remove etcd manifest");
    api.set_static_pod_enabled("certrotor-3", "kube-apiserver", true)
        .expect("stage enable");
    api.commit_and_apply("certrotor-3").expect("commit enable");
    wait_until("both manifests back", || {
        apiserver.exists() && etcd.exists()
    });
    assert_eq!(fs::read(&apiserver).expect("apiserver"), APISERVER_MANIFEST);
    sim.stop();
}

#[test]
fn settings_survive_a_restart_and_static_pods_are_rendered_at_boot() {
    let sandbox = Sandbox::new("restart");
    let first = Sim::start(&sandbox, &["--apply-delay-ms", "0"]);
    let api = first.client();
    api.patch_settings("certrotor", &json!({"motd": "persisted"}))
        .expect("patch");
    api.set_static_pod("certrotor", "etcd", ETCD_MANIFEST, true)
        .expect("stage pod");
    api.commit_and_apply("certrotor").expect("commit");
    let manifest = sandbox.root().join("etc/kubernetes/static-pods/etcd");
    wait_until("etcd manifest written", || manifest.exists());
    let status = first.stop();
    assert!(status.success(), "{status}");
    assert!(!sandbox.socket().exists(), "socket removed on SIGTERM");

    // /etc is a tmpfs on Bottlerocket: lose it, restart, and expect it rebuilt at boot.
    fs::remove_dir_all(sandbox.root().join("etc")).expect("wipe /etc");
    let other_settings = sandbox.path().join("other.json");
    fs::write(&other_settings, r#"{"motd": "not used"}"#).expect("write settings");
    let second = Sim::start(&sandbox, &["--settings", path_str(&other_settings)]);
    assert_eq!(
        second.client().settings().expect("settings")["motd"],
        "persisted"
    );
    assert_eq!(
        fs::read(&manifest).expect("rendered at boot"),
        ETCD_MANIFEST
    );
    second.stop();
}

#[test]
fn initial_settings_come_from_the_settings_file_and_are_validated() {
    let sandbox = Sandbox::new("settings-file");
    let settings = sandbox.path().join("settings.json");
    let pod = base64::encode(ETCD_MANIFEST);
    fs::write(
        &settings,
        json!({"motd": "seeded", "kubernetes": {"static-pods": {"etcd": {"enabled": true, "manifest": pod}}}})
            .to_string(),
    )
    .expect("write settings");
    let sim = Sim::start(&sandbox, &["--settings", path_str(&settings)]);
    let api = sim.client();
    assert_eq!(
        api.settings_by_prefix("mo").expect("prefix"),
        json!({"motd": "seeded"})
    );
    assert_eq!(
        fs::read(sandbox.root().join("etc/kubernetes/static-pods/etcd")).expect("boot render"),
        ETCD_MANIFEST
    );
    assert_eq!(api.os().expect("os")["variant_id"], "metal-k8s-1.31");
    sim.stop();

    let bad = Sandbox::new("bad-settings");
    let bad_file = bad.path().join("settings.json");
    fs::write(&bad_file, r#"{"motd": "x", "bogus": 1}"#).expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_apiserver-sim"))
        .args([
            "--socket",
            path_str(&bad.socket()),
            "--root",
            path_str(&bad.root()),
        ])
        .args(["--settings", path_str(&bad_file)])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown field `bogus`"), "{stderr}");
}

#[test]
fn a_stale_socket_is_replaced_and_the_new_one_is_group_only() {
    let sandbox = Sandbox::new("stale");
    drop(UnixListener::bind(sandbox.socket()).expect("stale socket"));
    assert!(sandbox.socket().exists());
    let sim = Sim::start(&sandbox, &[]);
    let mode = fs::metadata(sandbox.socket())
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    sim.client().os().expect("serving");
    sim.stop();
}

#[test]
fn concurrent_clients_each_commit_their_own_transaction() {
    let sandbox = Sandbox::new("concurrent");
    let sim = Sim::start(&sandbox, &[]);
    let socket = sandbox.socket();
    let workers: Vec<_> = (0..8)
        .map(|index| {
            let api = ApiClient::new(&socket).with_timeout(DEADLINE);
            std::thread::spawn(move || -> Result<Vec<String>, ApiError> {
                let tx = format!("certrotor-{index}");
                let label =
                    json!({"kubernetes": {"node-labels": {format!("worker-{index}"): "yes"}}});
                api.patch_settings(&tx, &label)?;
                api.commit_and_apply(&tx)
            })
        })
        .collect();
    for (index, worker) in workers.into_iter().enumerate() {
        let keys = worker.join().expect("thread").expect("commit");
        assert_eq!(
            keys,
            [format!("settings.kubernetes.node-labels.worker-{index}")]
        );
    }
    let labels = sim
        .client()
        .settings_by_prefix("kubernetes.node-labels")
        .expect("labels");
    assert_eq!(
        labels["kubernetes"]["node-labels"]
            .as_object()
            .map(|m| m.len()),
        Some(8)
    );
    sim.stop();
}

// === harness ===

/// A fresh directory per test: `api.sock`, `root/`, logs. Kept if the test fails.
struct Sandbox(PathBuf);

impl Sandbox {
    fn new(name: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "br-apisim-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create sandbox");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn socket(&self) -> PathBuf {
        self.0.join("api.sock")
    }

    fn root(&self) -> PathBuf {
        self.0.join("root")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("keeping test directory {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// A running `apiserver-sim`; killed on drop, its log printed if the test is failing.
struct Sim {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl Sim {
    /// Starts the emulator and waits until it answers `GET /os`.
    fn start(sandbox: &Sandbox, extra: &[&str]) -> Self {
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let log = sandbox
            .path()
            .join(format!("sim-{}.log", STARTS.fetch_add(1, Ordering::SeqCst)));
        let child = Command::new(env!("CARGO_BIN_EXE_apiserver-sim"))
            .args(["--socket", path_str(&sandbox.socket())])
            .args(["--root", path_str(&sandbox.root())])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn apiserver-sim");
        let mut sim = Self {
            child,
            socket: sandbox.socket(),
            log,
        };
        let api = sim.client();
        let started = Instant::now();
        loop {
            match api.os() {
                Ok(_) => return sim,
                Err(error) => {
                    let exited = sim.child.try_wait().expect("try_wait");
                    assert!(
                        exited.is_none() && started.elapsed() < DEADLINE,
                        "apiserver-sim not ready ({error}); exit: {exited:?}; log:\n{}",
                        sim.log_text()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    fn client(&self) -> ApiClient {
        ApiClient::new(&self.socket).with_timeout(DEADLINE)
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit status.
    fn stop(mut self) -> ExitStatus {
        let pid = i32::try_from(self.child.id()).expect("pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM our own child");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "apiserver-sim ignored SIGTERM; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- apiserver-sim log {} ---\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Polls `condition` every 20 ms until it holds, failing after [`DEADLINE`].
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}
