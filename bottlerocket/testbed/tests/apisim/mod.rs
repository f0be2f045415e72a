//! Harness shared by the `apiserver-sim` integration tests (the contract tests in
//! `apiserver_sim.rs`, the fault tests in `apiserver_sim_faults.rs`): a directory per test, the
//! real `apiserver-sim` binary as a child process with its control socket, the real
//! `bottlerocket` client on both sockets, raw HTTP where a test must see headers or bytes the
//! client hides, and polling waits against a deadline.
//!
//! On failure the directory is kept and the emulator's log printed.

#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bottlerocket::ApiClient;
use serde_json::Value;

/// Generous bound for things that take milliseconds on an idle machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub const APISERVER_MANIFEST: &[u8] =
    b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-apiserver\n";
pub const ETCD_MANIFEST: &[u8] = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n";

/// A fresh directory per test: `api.sock`, `control.sock`, `root/`, logs. Kept if the test
/// fails.
pub struct Sandbox(PathBuf);

impl Sandbox {
    pub fn new(name: &str) -> Self {
        Self(testkit::fresh_dir("br-apisim", name))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn socket(&self) -> PathBuf {
        self.0.join("api.sock")
    }

    pub fn control_socket(&self) -> PathBuf {
        self.0.join("control.sock")
    }

    pub fn root(&self) -> PathBuf {
        self.0.join("root")
    }

    /// Where the emulator renders static pod `name`.
    pub fn manifest(&self, name: &str) -> PathBuf {
        self.root().join("etc/kubernetes/static-pods").join(name)
    }

    /// What a reboot loses: `/run` (the boot stamp) and `/etc` (the rendered manifests) are
    /// tmpfs on Bottlerocket.
    pub fn reboot(&self) {
        for tmpfs in ["run", "etc"] {
            let _ = fs::remove_dir_all(self.root().join(tmpfs));
        }
    }

    /// Writes a settings file with these static pods, all enabled, and returns its path.
    pub fn pods_settings(&self, pods: &[(&str, &[u8])]) -> PathBuf {
        let mut map = serde_json::Map::new();
        for (name, manifest) in pods {
            map.insert(
                (*name).to_string(),
                serde_json::json!({"manifest": testbed::base64::encode(manifest), "enabled": true}),
            );
        }
        let path = self.0.join("settings.json");
        fs::write(
            &path,
            serde_json::json!({"kubernetes": {"static-pods": map}}).to_string(),
        )
        .expect("write settings");
        path
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

/// A running `apiserver-sim` with a control socket; killed on drop, its log printed if the
/// test is failing.
pub struct Sim {
    child: Child,
    socket: PathBuf,
    control: PathBuf,
    log: PathBuf,
}

impl Sim {
    /// Starts the emulator (with `--control`) and waits until it answers `GET /os`.
    pub fn start(sandbox: &Sandbox, extra: &[&str]) -> Self {
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let log = sandbox
            .path()
            .join(format!("sim-{}.log", STARTS.fetch_add(1, Ordering::SeqCst)));
        let child = Command::new(env!("CARGO_BIN_EXE_apiserver-sim"))
            .args(["--socket", path_str(&sandbox.socket())])
            .args(["--root", path_str(&sandbox.root())])
            .args(["--control", path_str(&sandbox.control_socket())])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn apiserver-sim");
        let mut sim = Self {
            child,
            socket: sandbox.socket(),
            control: sandbox.control_socket(),
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

    /// The client on the API socket.
    pub fn client(&self) -> ApiClient {
        ApiClient::new(&self.socket).with_timeout(DEADLINE)
    }

    /// The same client on the control socket.
    pub fn control(&self) -> ApiClient {
        ApiClient::new(&self.control).with_timeout(DEADLINE)
    }

    /// Replaces the armed faults.
    pub fn set_faults(&self, faults: &Value) {
        self.control()
            .raw_request("PUT", "/faults", Some(faults.to_string().as_bytes()))
            .expect("PUT /faults");
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Value> {
        let (_, body) = self
            .control()
            .raw_request("GET", "/events", None)
            .expect("GET /events");
        serde_json::from_slice(&body).expect("events JSON")
    }

    /// Waits until an event of `kind` whose detail contains `detail` exists; returns it.
    pub fn wait_event(&self, kind: &str, detail: &str) -> Value {
        let mut found = None;
        wait_until(&format!("event {kind} '{detail}'"), || {
            found = self.events().into_iter().find(|event| {
                event["kind"] == kind
                    && event["detail"]
                        .as_str()
                        .is_some_and(|text| text.contains(detail))
            });
            found.is_some()
        });
        found.expect("found")
    }

    /// The kinds of all events, in order.
    pub fn event_kinds(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|event| event["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Waits until the API answers again after a restart.
    pub fn wait_up(&self) {
        let api = self.client();
        wait_until("the API to answer again", || api.os().is_ok());
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait_exit()
    }

    /// SIGKILL, as systemd does after a stop timeout: the socket file stays behind.
    pub fn kill(mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        self.wait_exit()
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .expect("signal our own child");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "apiserver-sim did not exit; log:\n{}",
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

/// Sends raw bytes on a new connection and returns everything the server sends until it
/// closes (send `Connection: close`) or `DEADLINE` passes.
pub fn raw_exchange(socket: &Path, request: &[u8]) -> Vec<u8> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(DEADLINE))
        .expect("read timeout");
    stream.write_all(request).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read until close");
    answer
}

/// A request with `Content-Type: application/json` and `Connection: close`.
pub fn raw_request(method: &str, target: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The lower-cased header lines and the body of a raw response.
pub fn split_response(raw: &[u8]) -> (String, Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let end = text.find("\r\n\r\n").expect("end of head");
    (text[..end].to_ascii_lowercase(), raw[end + 4..].to_vec())
}

/// Polls `condition` every 20 ms until it holds, failing after [`DEADLINE`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// The inode of a file.
pub fn inode(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).expect("metadata"))
}
