//! Harness of the platform tests: a lab node whose control plane really runs.
//!
//! [`Node::start`] writes a lab node (`certrotor lab init`, leaves expiring in 2 days, the static
//! pod manifests kubeadm v1.20.2 writes), starts `apiserver-sim` (Bottlerocket platform, static
//! pods seeded from the node's manifests) and `kubelet-sim`, which runs them as host processes:
//! Debian's etcd and the real Kubernetes v1.20.2 kube-apiserver, kube-controller-manager and
//! kube-scheduler (from [`testkit::k8s::bin_dir`]), and waits until all four are healthy.
//!
//! A real kubelet cannot run here (no CRI pod sandbox on this host), so kubelet-sim stays: it is
//! the one double left in these tests, besides apiserver-sim for the Bottlerocket API.
//!
//! - Every child is stopped when the node is dropped, even when the test fails (kubelet-sim
//!   stops its pods on SIGTERM); on failure the logs of kubelet-sim, apiserver-sim and every pod
//!   are printed and the folder is kept.
//! - Ports: a random `--port-offset` whose ports are free and not used by another node of
//!   this process.
//! - Oracles independent of certrotor: `openssl s_client` for the served certificates,
//!   `openssl x509 -fingerprint` for the files, `etcdctl` for etcd's data, `kubectl` v1.20.2
//!   for the apiserver, kubelet-sim's state files for what was restarted when.
//! - Waiting is always polling a condition until a deadline.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use certrotor::restart::verify::{self, Probe};
use testbed::kubelet_sim::PodState;

/// The binary under test.
pub const CERTROTOR: &str = env!("CARGO_BIN_EXE_certrotor");

/// The static pods of a stacked control plane, in certrotor's restart order.
pub const PODS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// Longest wait for a node to come up, or a pod to come back (the real apiserver takes a few
/// seconds alone, much longer on a loaded 2-core machine).
pub const UP_DEADLINE: Duration = Duration::from_secs(240);

/// Longest a certrotor command may run before the test fails (hung): [`pass_bound`] of the
/// [`RESTART_TIMEOUT`] the runs get.
const RUN_DEADLINE: Duration = pass_bound(RESTART_TIMEOUT_S);

/// The `--restart-timeout` of a run that must succeed: long, because a real apiserver on a
/// loaded 2-core machine can take a minute to be ready; a healthy restart ends as soon as it is.
pub const RESTART_TIMEOUT: &str = "180s";
pub const RESTART_TIMEOUT_S: u64 = 180;

/// The longest one certrotor pass can wait by its own bounds, with `--restart-timeout` of
/// `restart_timeout_s` seconds and the other bounds at their defaults: the lock (`--lock-timeout`
/// 60 s), the cluster lock and gates (`--cluster-wait` 600 s), a live reload per component
/// (`--reload-timeout` 90 s), and per component a stop and a verification (each within the
/// restart timeout), twice when a failure rolls back and restarts them again. Four components.
/// A pass past it hung: tests use it as the deadline that stops a hang, never as a measure of
/// speed (a healthy pass ends as soon as what it waits for is there).
pub const fn pass_bound(restart_timeout_s: u64) -> Duration {
    const COMPONENTS: u64 = 4;
    Duration::from_secs(60 + 600 + COMPONENTS * 90 + 2 * COMPONENTS * 2 * restart_timeout_s)
}

/// kubelet-sim's pace in these tests (shared with the cluster tests): a pod starts 300 ms after
/// its manifest, manifests are polled every 100 ms, a stopped pod gets 5 s to exit.
pub const KUBELET_SIM_PACE: [&str; 6] = [
    "--start-delay-ms",
    "300",
    "--poll-ms",
    "100",
    "--grace-seconds",
    "5",
];

/// kubectl v1.20.2 (shared with the cluster and events tests).
pub use testkit::k8s::kubectl_path;

/// How kubelet manifests are managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Bottlerocket layout (`var/lib/kubeadm`); static pods through the API (apiserver-sim).
    Bottlerocket,
    /// kubeadm layout (`etc/kubernetes`); the kubelet watches `etc/kubernetes/manifests`.
    Kubeadm,
}

impl Platform {
    pub fn name(self) -> &'static str {
        match self {
            Platform::Bottlerocket => "bottlerocket",
            Platform::Kubeadm => "kubeadm",
        }
    }

    /// The kubeadm folder of the layout, relative to the root.
    pub fn kubeadm_dir(self) -> &'static str {
        match self {
            Platform::Bottlerocket => "var/lib/kubeadm",
            Platform::Kubeadm => "etc/kubernetes",
        }
    }

    /// The folder the kubelet watches, relative to the root.
    fn kubelet_dir(self) -> &'static str {
        match self {
            Platform::Bottlerocket => "etc/kubernetes/static-pods",
            Platform::Kubeadm => "etc/kubernetes/manifests",
        }
    }

    /// The manifest file of `pod` in the kubelet's folder.
    fn manifest_name(self, pod: &str) -> String {
        match self {
            Platform::Bottlerocket => pod.to_string(),
            Platform::Kubeadm => format!("{pod}.yaml"),
        }
    }
}

/// A TLS endpoint whose served certificate the tests compare with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    EtcdClient,
    EtcdPeer,
    Apiserver,
}

impl Served {
    pub const ALL: [Served; 3] = [Served::EtcdClient, Served::EtcdPeer, Served::Apiserver];

    fn port(self) -> u16 {
        match self {
            Served::EtcdClient => 2379,
            Served::EtcdPeer => 2380,
            Served::Apiserver => 6443,
        }
    }

    /// The certificate file it must serve, under the kubeadm folder.
    fn file(self) -> &'static str {
        match self {
            Served::EtcdClient => "pki/etcd/server.crt",
            Served::EtcdPeer => "pki/etcd/peer.crt",
            Served::Apiserver => "pki/apiserver.crt",
        }
    }

    /// CA, client certificate and key (under the kubeadm folder) to connect with.
    fn credentials(self) -> [&'static str; 3] {
        match self {
            Served::EtcdClient | Served::EtcdPeer => [
                "pki/etcd/ca.crt",
                "pki/etcd/healthcheck-client.crt",
                "pki/etcd/healthcheck-client.key",
            ],
            Served::Apiserver => [
                "pki/ca.crt",
                "pki/apiserver-kubelet-client.crt",
                "pki/apiserver-kubelet-client.key",
            ],
        }
    }
}

/// A test double binary built next to certrotor.
pub(crate) fn sibling(name: &str) -> PathBuf {
    let path = Path::new(CERTROTOR)
        .parent()
        .expect("certrotor binary has a folder")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p testbed` first",
        path.display()
    );
    path
}

pub use testkit::wait_for;

/// A child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, command: Command, log: &Path) -> Proc {
        let child = testkit::spawn_logged(name, command, log);
        Proc {
            name: name.into(),
            child,
            log: log.into(),
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it has exited (reaping it).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Polls `ready` every 2 ms until it holds (at most `deadline`, see [`wait_for`]), panicking
    /// with this certrotor run's log if the run exits first, `before` naming what it has not done.
    pub fn wait_while_running<T>(
        &mut self,
        what: &str,
        before: &str,
        deadline: Duration,
        mut ready: impl FnMut() -> Result<T, String>,
    ) -> T {
        wait_for(what, deadline, Duration::from_millis(2), || {
            if let Some(status) = self.exited() {
                panic!(
                    "certrotor exited ({status}) before {before}:\n{}",
                    self.log_text()
                );
            }
            ready()
        })
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL.
    fn terminate(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        // Our own child, not reaped yet: the pid still names it.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} did not stop on SIGTERM; killing it", self.name);
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(10));
        if std::thread::panicking() {
            eprintln!(
                "----- log of {} ({}) -----\n{}----- end -----",
                self.name,
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// One finished certrotor command.
pub struct Out {
    pub command: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "command: {}\nexit code: {:?} after {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

impl Out {
    /// Asserts the exit code; returns self.
    pub fn expect(&self, code: i32) -> &Out {
        crate::util::assert_exit(self, &self.stderr, self.code, code);
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON: {e}\n{self}"))
    }
}

/// What a node is started with besides the defaults.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Extra `lab init` flags (`--kubernetes-version 1.31.4`, `--kube-vip eks-anywhere`).
    pub lab: Vec<String>,
    /// The node has a kube-vip static pod (`lab init --kube-vip`): seeded into apiserver-sim
    /// on Bottlerocket.
    pub kube_vip: bool,
    /// kubelet-sim's `--hostname`: every pod in a UTS namespace with this host name (root).
    pub hostname: Option<String>,
    /// kubelet-sim serves its kubelet API stand-in on 10250 + offset, authenticating against
    /// the cluster CA, recording into [`Node::kubelet_api_record`].
    pub serve_api: bool,
}

impl NodeOptions {
    /// A node whose lab init gets `lab`.
    pub fn lab(lab: &[&str]) -> NodeOptions {
        NodeOptions {
            lab: lab.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }
}

/// A lab node with its control plane running.
pub struct Node {
    pub platform: Platform,
    pub dir: PathBuf,
    pub root: PathBuf,
    pub offset: u16,
    pub socket: PathBuf,
    kubelet: Option<Proc>,
    api: Option<Proc>,
    runs: AtomicU32,
    /// How long the control plane took to be healthy at the start (kubelet-sim started to every
    /// pod healthy): what a restart costs on this machine, now.
    up: Duration,
}

impl Node {
    /// Starts a node (etcd must be installed: without it the test fails saying what to install).
    pub fn start(test: &str, platform: Platform) -> Node {
        Node::start_with(test, platform, &NodeOptions::default())
    }

    /// Starts a node with `options`.
    pub fn start_with(test: &str, platform: Platform, options: &NodeOptions) -> Node {
        crate::cluster::etcd_installed(&format!("platform::{}", test));
        let (kubelet_sim, apiserver_sim) = (sibling("kubelet-sim"), sibling("apiserver-sim"));
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "certrotor-pl-{test}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let offset = testkit::ports::offsets(1)[0];
        let mut node = Node {
            platform,
            root: dir.join("root"),
            socket: dir.join("api.sock"),
            dir,
            offset,
            kubelet: None,
            api: None,
            runs: AtomicU32::new(0),
            up: Duration::ZERO,
        };
        let bin = node.dir.join("bin");
        testkit::k8s::link_control_plane(&bin);
        // kube-vip: the k8s-sim stand-in of `lab init --kube-vip`'s pod, for the tests that
        // add it.
        std::os::unix::fs::symlink(sibling("k8s-sim"), bin.join("kube-vip")).unwrap();
        let root = node.root.to_str().unwrap().to_string();
        let offset_text = offset.to_string();
        let mut lab = vec![
            "lab",
            "init",
            &root,
            "--layout",
            platform.name(),
            "--advertise-address",
            "127.0.0.1",
            "--expires-in",
            "2d",
            "--port-offset",
            &offset_text,
            "--key-algorithm",
            "ecdsa-p256",
        ];
        lab.extend(options.lab.iter().map(String::as_str));
        node.certrotor(&lab).expect(0);
        testkit::k8s::cut_apiserver_start_up_under(&node.root);
        if platform == Platform::Bottlerocket {
            let mut pods = PODS.to_vec();
            if options.kube_vip {
                pods.push("kube-vip");
            }
            node.start_apiserver_sim(&apiserver_sim, &pods);
        }
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut kubelet = Command::new(&kubelet_sim);
        kubelet
            .arg("--manifests")
            .arg(node.root.join(platform.kubelet_dir()))
            .arg("--state-dir")
            .arg(node.state_dir())
            .arg("--root")
            .arg(&node.root)
            .arg("--log-dir")
            .arg(node.log_dir())
            .args(KUBELET_SIM_PACE)
            .env("PATH", path);
        if let Some(h) = &options.hostname {
            kubelet.arg("--hostname").arg(h);
        }
        if options.serve_api {
            kubelet
                .arg("--serve-api")
                .arg(format!("127.0.0.1:{}", node.kubelet_api_port()))
                .arg("--client-ca-file")
                .arg(node.kfile("pki/ca.crt"))
                .arg("--api-record")
                .arg(node.kubelet_api_record());
        }
        node.kubelet = Some(Proc::spawn(
            "kubelet-sim",
            kubelet,
            &node.dir.join("kubelet-sim.log"),
        ));
        let started = std::time::Instant::now();
        node.wait_all_healthy();
        node.up = started.elapsed();
        node.grant_cluster_admins();
        node
    }

    /// The `--restart-timeout` of a run whose restart must fail (a component that cannot come up
    /// waits out the whole bound) and whose rollback's restarts must then succeed within the
    /// same bound: twice this node's first start, at least 60 s, as the QEMU scenarios'
    /// `node_restart_timeout 2 120`. A loaded machine's slow start lengthens the bound instead
    /// of failing the rollback.
    pub fn failing_restart_timeout(&self) -> String {
        format!("{}s", (2 * self.up.as_secs() + 1).max(60))
    }

    /// What `kubeadm init` (v1.29 and later, whose layout the lab writes) does once the apiserver
    /// is up: binds the group `kubeadm:cluster-admins` of admin.conf to `cluster-admin`, with
    /// super-admin.conf (`system:masters`). A node without super-admin.conf has an admin.conf in
    /// `system:masters` (kubeadm before v1.29) and needs nothing.
    fn grant_cluster_admins(&self) {
        testkit::k8s::grant_cluster_admins(&self.kfile("super-admin.conf"));
    }

    fn start_apiserver_sim(&mut self, binary: &Path, seeded: &[&str]) {
        let manifests = self.root.join("var/lib/kubeadm/manifests");
        let mut pods = serde_json::Map::new();
        for &pod in seeded {
            let bytes = fs::read(manifests.join(format!("{pod}.yaml"))).unwrap();
            pods.insert(
                pod.into(),
                serde_json::json!({
                    "manifest": testbed::base64::encode(&bytes),
                    "enabled": true,
                }),
            );
        }
        // As EKS Anywhere sets it: the cluster CA, which the API renders to the kubelet's
        // client CA file (/etc/kubernetes/pki/ca.crt).
        let ca = fs::read(self.root.join("var/lib/kubeadm/pki/ca.crt")).unwrap();
        let settings = serde_json::json!({"kubernetes": {
            "static-pods": pods,
            "cluster-certificate": testbed::base64::encode(&ca),
        }});
        let file = self.dir.join("settings.json");
        fs::write(&file, serde_json::to_vec(&settings).unwrap()).unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg("--socket")
            .arg(&self.socket)
            .arg("--root")
            .arg(&self.root)
            .arg("--settings")
            .arg(&file)
            .arg("--control")
            .arg(self.control_socket())
            // What `systemctl try-restart kubelet.service` does here: recorded, one line each.
            .arg("--kubelet-restart")
            .arg(format!(
                "date +%s%N >> '{}'",
                self.kubelet_restarts().display()
            ));
        self.api = Some(Proc::spawn(
            "apiserver-sim",
            cmd,
            &self.dir.join("apiserver-sim.log"),
        ));
        let static_pods = self.root.join(self.platform.kubelet_dir());
        wait_for(
            "apiserver-sim to render the static pods",
            UP_DEADLINE,
            Duration::from_millis(20),
            || {
                let missing: Vec<&str> = seeded
                    .iter()
                    .copied()
                    .filter(|p| !static_pods.join(p).is_file())
                    .collect();
                if self.socket.exists() && self.control_socket().exists() && missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "socket present: {}, missing {missing:?}",
                        self.socket.exists()
                    ))
                }
            },
        );
    }

    /// Where the API double records each restart of the kubelet it was asked for.
    pub fn kubelet_restarts(&self) -> PathBuf {
        self.dir.join("kubelet-restarts")
    }

    /// How many times the API double restarted the kubelet.
    pub fn kubelet_restart_count(&self) -> usize {
        fs::read_to_string(self.kubelet_restarts())
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.root.join("var/lib/kubelet-sim")
    }

    /// apiserver-sim's control socket (faults, events; not part of the real server).
    fn control_socket(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    /// A client of the node's Bottlerocket API (apiserver-sim).
    pub fn api(&self) -> bottlerocket::ApiClient {
        bottlerocket::ApiClient::new(&self.socket).with_timeout(Duration::from_secs(10))
    }

    fn control(&self) -> bottlerocket::ApiClient {
        bottlerocket::ApiClient::new(self.control_socket()).with_timeout(Duration::from_secs(30))
    }

    /// Arms apiserver-sim's faults (`PUT /faults`; replaces every armed fault).
    pub fn api_faults(&self, faults: &serde_json::Value) {
        let body = serde_json::to_vec(faults).unwrap();
        self.control()
            .raw_request("PUT", "/faults", Some(&body))
            .unwrap_or_else(|e| panic!("PUT /faults {faults}: {e}"));
    }

    /// What apiserver-sim did so far (`GET /events`): `{seq, ms, kind, detail}` each.
    pub fn api_events(&self) -> Vec<serde_json::Value> {
        let (_, body) = self
            .control()
            .raw_request("GET", "/events", None)
            .unwrap_or_else(|e| panic!("GET /events: {e}"));
        serde_json::from_slice(&body).unwrap()
    }

    /// The events of `kind` whose detail contains `detail`.
    pub fn api_events_of(&self, kind: &str, detail: &str) -> Vec<serde_json::Value> {
        self.api_events()
            .into_iter()
            .filter(|e| e["kind"] == kind && e["detail"].as_str().unwrap().contains(detail))
            .collect()
    }

    /// Waits for an event of `kind` whose detail contains `detail`; returns it.
    pub fn api_wait_event(&self, kind: &str, detail: &str) -> serde_json::Value {
        wait_for(
            &format!("apiserver-sim event {kind} '{detail}'"),
            UP_DEADLINE,
            Duration::from_millis(20),
            || {
                self.api_events_of(kind, detail)
                    .into_iter()
                    .next()
                    .ok_or_else(|| format!("{:#?}", self.api_events()))
            },
        )
    }

    /// The port of kubelet-sim's kubelet API stand-in ([`NodeOptions::serve_api`]).
    pub fn kubelet_api_port(&self) -> u16 {
        10250 + self.offset
    }

    /// Where the kubelet API stand-in records each request (JSON lines).
    pub fn kubelet_api_record(&self) -> PathBuf {
        self.dir.join("kubelet-api.jsonl")
    }

    /// kubelet-sim's process id.
    pub fn kubelet_pid(&self) -> u32 {
        self.kubelet.as_ref().expect("kubelet-sim runs").child.id()
    }

    /// kubelet-sim's state of one pod.
    pub fn pod_state(&self, pod: &str) -> Result<PodState, String> {
        let path = self.state_dir().join(format!("{pod}.json"));
        let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn log_dir(&self) -> PathBuf {
        self.root.join("var/log/pods")
    }

    /// `<root>/<kubeadm dir>/<rel>`.
    pub fn kfile(&self, rel: &str) -> PathBuf {
        self.root.join(self.platform.kubeadm_dir()).join(rel)
    }

    /// Where the kubelet reads `pod`'s manifest.
    pub fn kubelet_manifest(&self, pod: &str) -> PathBuf {
        self.root
            .join(self.platform.kubelet_dir())
            .join(self.platform.manifest_name(pod))
    }

    /// certrotor's pass state.
    pub fn pass_state(&self) -> PathBuf {
        self.root.join("var/lib/certrotor/pass.json")
    }

    /// Whether the pass state records a stopped static pod (to start again after a crash).
    pub fn stop_recorded(&self) -> bool {
        std::fs::read(self.pass_state())
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| !v["stopped"].is_null())
    }

    /// The health probe of `pod`, with the credentials on disk now.
    pub fn probe(&self, pod: &str) -> Probe {
        let read = |rel: &str| Some(fs::read(self.kfile(rel)).unwrap());
        let (port, path, creds) = match pod {
            "etcd" => (2379, "/health", Some(Served::EtcdClient.credentials())),
            "kube-apiserver" => (6443, "/readyz", Some(Served::Apiserver.credentials())),
            "kube-controller-manager" => (10257, "/healthz", None),
            "kube-scheduler" => (10259, "/healthz", None),
            other => panic!("unknown pod {other}"),
        };
        Probe {
            address: SocketAddr::from(([127, 0, 0, 1], port + self.offset)),
            path: path.into(),
            ca_pem: creds.and_then(|c| read(c[0])),
            client_cert_pem: creds.and_then(|c| read(c[1])),
            client_key_pem: creds.and_then(|c| read(c[2])),
            timeout: Duration::from_secs(3),
        }
    }

    /// [`Node::probe`] of kube-apiserver as a value another thread can call: it reads the
    /// credentials on disk at each call.
    pub fn apiserver_prober(&self) -> impl Fn() -> Probe + Send + 'static {
        let dir = self.root.join(self.platform.kubeadm_dir());
        let address = SocketAddr::from(([127, 0, 0, 1], 6443 + self.offset));
        move || {
            let read = |rel: &str| fs::read(dir.join(rel)).ok();
            let creds = Served::Apiserver.credentials();
            Probe {
                address,
                path: "/readyz".into(),
                ca_pem: read(creds[0]),
                client_cert_pem: read(creds[1]),
                client_key_pem: read(creds[2]),
                timeout: Duration::from_secs(3),
            }
        }
    }

    /// Ok when `pod` answers healthy over TLS.
    pub fn healthy(&self, pod: &str) -> Result<(), String> {
        match verify::probe(&self.probe(pod)) {
            Ok(o) if o.healthy() => Ok(()),
            Ok(o) => Err(format!("{pod}: HTTP {} '{}'", o.status, o.body)),
            Err(e) => Err(format!("{pod}: {e}")),
        }
    }

    /// Runs kubectl v1.20.2 with the node's `admin.conf` as it is on disk now.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as("admin.conf", args)
    }

    /// Runs kubectl v1.20.2 with the node's kubeconfig `conf` (`super-admin.conf`).
    pub fn kubectl_as(&self, conf: &str, args: &[&str]) -> Output {
        Command::new(kubectl_path())
            .arg(format!("--kubeconfig={}", self.kfile(conf).display()))
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl runs")
    }

    /// kubectl's stdout, asserting it succeeded.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The text of `pod`'s log (kubelet-sim appends every process's output).
    pub fn pod_log(&self, pod: &str) -> String {
        fs::read_to_string(self.log_dir().join(format!("{pod}.log"))).unwrap_or_default()
    }

    /// Waits until every pod runs (kubelet-sim) and answers healthy.
    pub fn wait_all_healthy(&self) {
        wait_for(
            "every control-plane pod to be running and healthy",
            UP_DEADLINE,
            Duration::from_millis(100),
            || {
                let states = self.try_states()?;
                for pod in PODS {
                    if !states[pod].running {
                        return Err(format!("{pod} is not running"));
                    }
                    self.healthy(pod)?;
                }
                Ok(())
            },
        );
    }

    fn try_states(&self) -> Result<BTreeMap<String, PodState>, String> {
        let mut out = BTreeMap::new();
        for pod in PODS {
            let path = self.state_dir().join(format!("{pod}.json"));
            let bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let state: PodState =
                serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            out.insert(pod.to_string(), state);
        }
        Ok(out)
    }

    /// kubelet-sim's state of every pod.
    pub fn states(&self) -> BTreeMap<String, PodState> {
        self.try_states().unwrap_or_else(|e| panic!("{e}"))
    }

    /// SHA-256 (lower-case hex) of the certificate served on `s`, taken by `openssl s_client`
    /// with the client credentials on disk now.
    pub fn served_sha(&self, s: Served) -> String {
        let [ca, cert, key] = s.credentials().map(|r| self.kfile(r));
        let out = Command::new("openssl")
            .arg("s_client")
            .arg("-connect")
            .arg(format!("127.0.0.1:{}", s.port() + self.offset))
            .arg("-CAfile")
            .arg(ca)
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .stdin(Stdio::null())
            .output()
            .expect("openssl must be installed");
        let text = String::from_utf8_lossy(&out.stdout);
        let pem = text
            .find("-----BEGIN CERTIFICATE-----")
            .and_then(|b| {
                let end = "-----END CERTIFICATE-----";
                text[b..].find(end).map(|e| &text[b..b + e + end.len()])
            })
            .unwrap_or_else(|| {
                panic!(
                    "openssl s_client to {s:?} got no certificate\n{text}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        fingerprint(pem.as_bytes())
    }

    /// SHA-256 of the certificate file `s` must serve, by openssl.
    pub fn file_sha(&self, s: Served) -> String {
        self.cert_sha(s.file())
    }

    /// SHA-256 of the certificate file `rel` (under the kubeadm folder), by openssl.
    pub fn cert_sha(&self, rel: &str) -> String {
        fingerprint(&fs::read(self.kfile(rel)).unwrap())
    }

    /// Runs etcdctl (API v3) against the node's etcd with the healthcheck client pair on disk
    /// now.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let [ca, cert, key] = Served::EtcdClient.credentials().map(|r| self.kfile(r));
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!(
                "--endpoints=https://127.0.0.1:{}",
                2379 + self.offset
            ))
            .arg(format!("--cacert={}", ca.display()))
            .arg(format!("--cert={}", cert.display()))
            .arg(format!("--key={}", key.display()))
            .arg("--command-timeout=10s")
            .args(args)
            .output()
            .expect("etcdctl must be installed")
    }

    /// Every regular file under the kubeadm folder (and the kubelet's folder), with its bytes.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut todo = vec![
            self.root.join(self.platform.kubeadm_dir()),
            self.root.join(self.platform.kubelet_dir()),
        ];
        let kubelet_dir = self.root.join(self.platform.kubelet_dir());
        while let Some(d) = todo.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                // The API's applier renders through hidden temporary files beside the manifests
                // (renamed over them a moment later), which the kubelet ignores: so does this.
                if d == kubelet_dir && e.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                let t = e.file_type().unwrap();
                if t.is_dir() {
                    todo.push(e.path());
                } else if t.is_file() {
                    out.insert(e.path(), fs::read(e.path()).unwrap());
                }
            }
        }
        out
    }

    /// The kinds of certrotor's backups, newest first.
    pub fn backup_kinds(&self) -> Vec<String> {
        let out = self.on_root("backups", &["--output", "json"]);
        out.expect(0);
        crate::util::each_field(&out.json(), "kind")
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// `run --once` on this node: platform, restart timeout and extra flags.
    fn run_args(&self, platform: &str, restart_timeout: &str, extra: &[&str]) -> Vec<String> {
        self.pass_args(&["run", "--once"], platform, restart_timeout, extra)
    }

    /// A command that makes passes (`run --once`, `ca rotate`) on this node: platform, restart
    /// timeout and extra flags.
    pub fn pass_args(
        &self,
        command: &[&str],
        platform: &str,
        restart_timeout: &str,
        extra: &[&str],
    ) -> Vec<String> {
        let mut args: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        args.extend(
            [
                "--root",
                self.root.to_str().unwrap(),
                "--platform",
                platform,
                "--restart-timeout",
                restart_timeout,
                "--poll-interval",
                "100ms",
            ]
            .map(String::from),
        );
        if platform == "bottlerocket" {
            args.push("--api-socket".into());
            args.push(self.socket.display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Runs `run --once` and waits for it.
    pub fn run_once(&self, platform: &str, restart_timeout: &str, extra: &[&str]) -> Out {
        self.run_once_env(platform, restart_timeout, extra, &[])
    }

    /// Runs `run --once` with extra environment variables (failpoints) and waits for it.
    pub fn run_once_env(
        &self,
        platform: &str,
        restart_timeout: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Out {
        let args = self.run_args(platform, restart_timeout, extra);
        self.certrotor_env(&args.iter().map(String::as_str).collect::<Vec<_>>(), env)
    }

    /// Starts `run --once` in the background with `extra` flags (its log: [`Proc::log_text`]).
    pub fn spawn_run_once_args(&self, platform: &str, extra: &[&str]) -> Proc {
        let mut cmd = Command::new(CERTROTOR);
        cmd.args(self.run_args(platform, RESTART_TIMEOUT, extra))
            .env("CERTROTOR_EVENTS", "off")
            .env_remove("CERTROTOR_FAILPOINT");
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        Proc::spawn(
            "certrotor run --once",
            cmd,
            &self.dir.join(format!("background-run-{n}.log")),
        )
    }

    /// Starts `run --once` in the background.
    pub fn spawn_run_once(&self, platform: &str) -> Proc {
        let mut cmd = Command::new(CERTROTOR);
        // Restarts every component (etcd too), so that a crash can hit etcd's restart.
        cmd.args(self.run_args(platform, RESTART_TIMEOUT, &["--restart", "always"]))
            .env("CERTROTOR_EVENTS", "off");
        Proc::spawn(
            "certrotor run --once",
            cmd,
            &self.dir.join("background-run.log"),
        )
    }

    /// Runs `certrotor COMMAND --root ROOT EXTRA` on this node.
    pub fn on_root(&self, command: &str, extra: &[&str]) -> Out {
        let root = self.root.to_str().unwrap();
        self.certrotor(&[&[command, "--root", root][..], extra].concat())
    }

    /// Runs certrotor with a deadline.
    pub fn certrotor(&self, args: &[&str]) -> Out {
        self.certrotor_env(args, &[])
    }

    /// Runs certrotor with a deadline and extra environment variables.
    pub fn certrotor_env(&self, args: &[&str], env: &[(&str, &str)]) -> Out {
        let n = self.runs.fetch_add(1, Ordering::SeqCst);
        let (out_path, err_path) = (
            self.dir.join(format!("certrotor-{n}.out")),
            self.dir.join(format!("certrotor-{n}.err")),
        );
        let command = format!("{CERTROTOR} {}", args.join(" "));
        let started = Instant::now();
        let mut child = Command::new(CERTROTOR)
            .args(args)
            .env("CERTROTOR_EVENTS", "off")
            .env_remove("CERTROTOR_FAILPOINT")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path).unwrap())
            .stderr(fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command}: {e}"));
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > RUN_DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{command} did not finish within {RUN_DEADLINE:?}\n--- stderr ---\n{}",
                    fs::read_to_string(&err_path).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Out {
            command,
            code: status.code(),
            stdout: fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: fs::read_to_string(&err_path).unwrap_or_default(),
            elapsed: started.elapsed(),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // kubelet-sim first: on SIGTERM it stops its pods.
        drop(self.kubelet.take());
        drop(self.api.take());
        if std::thread::panicking() {
            if let Ok(list) = fs::read_dir(self.log_dir()) {
                let mut files: Vec<PathBuf> = list.flatten().map(|e| e.path()).collect();
                files.sort();
                for f in files {
                    let text = fs::read_to_string(&f).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(60)..].join("\n");
                    eprintln!(
                        "----- {} (last 60 lines) -----\n{tail}\n----- end -----",
                        f.display()
                    );
                }
            }
            eprintln!("test folder kept: {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// SHA-256 fingerprint of a PEM certificate by `openssl x509`, as lower-case hex.
pub fn fingerprint(pem: &[u8]) -> String {
    let args = ["x509", "-noout", "-fingerprint", "-sha256"];
    let out = crate::util::openssl(&args, Some(pem));
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text
        .trim()
        .split_once('=')
        .map(|(_, h)| h.replace(':', "").to_lowercase())
        .unwrap_or_default();
    assert!(
        out.status.success() && hex.len() == 64,
        "openssl x509 -fingerprint failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hex
}

/// One pod's restart as kubelet-sim saw it.
#[derive(Debug, Clone)]
pub struct Downtime {
    pub pod: String,
    /// When the old process was reaped (ms since the epoch).
    pub stopped_ms: u64,
    /// When the next process started.
    pub started_ms: u64,
    /// Crash restarts (leader election lost, see [`restarted_once`]) in the same span.
    pub crashes: usize,
}

impl Downtime {
    pub fn ms(&self) -> u64 {
        self.started_ms.saturating_sub(self.stopped_ms)
    }
}

/// Asserts that certrotor restarted each pod exactly once between `before` and `after`: of the
/// processes since, exactly one was stopped with "manifest removed", the next one started after
/// it stopped, and the last one runs. Returns the down windows in PODS order.
///
/// Other stops may only be crashes ("exited by itself"): the real kube-controller-manager and
/// kube-scheduler exit when they lose their leader lease (`leaderelection lost`), which happens
/// when the apiserver or etcd is down longer than the renew deadline (10 s), and the kubelet
/// starts them again. [`Downtime::crashes`] counts them.
pub fn restarted_once(
    before: &BTreeMap<String, PodState>,
    after: &BTreeMap<String, PodState>,
    pods: &[&str],
) -> Vec<Downtime> {
    let mut out = Vec::new();
    for &pod in pods {
        let (b, a) = (&before[pod], &after[pod]);
        let ctx = || format!("{pod}: before {b:#?}\nafter {a:#?}");
        let first = b
            .history
            .len()
            .checked_sub(1)
            .expect("a process ran before");
        assert_eq!(
            a.history[first].pid,
            b.history[first].pid,
            "history rewritten\n{}",
            ctx()
        );
        let since = &a.history[first..];
        let removed: Vec<usize> = since
            .iter()
            .enumerate()
            .filter(|(_, h)| h.reason.as_deref() == Some("manifest removed"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            removed.len(),
            1,
            "{pod}: not exactly one stop 'manifest removed'\n{}",
            ctx()
        );
        let crashes = since
            .iter()
            .filter(|h| h.reason.as_deref() == Some("exited by itself"))
            .count();
        let other = since.iter().filter(|h| {
            h.stopped_at_ms.is_some()
                && !matches!(
                    h.reason.as_deref(),
                    Some("manifest removed" | "exited by itself")
                )
        });
        assert_eq!(other.count(), 0, "{pod}: unexpected stops\n{}", ctx());
        let i = removed[0];
        assert!(i + 1 < since.len(), "{pod}: not started again\n{}", ctx());
        let (old, new) = (&since[i], &since[i + 1]);
        let last = since.last().expect("not empty");
        assert!(
            last.stopped_at_ms.is_none() && a.running,
            "{pod}: not running\n{}",
            ctx()
        );
        let stopped_ms = old.stopped_at_ms.expect("stopped");
        assert!(
            new.started_at_ms >= stopped_ms,
            "{pod}: new process started before the old one stopped\n{}",
            ctx()
        );
        out.push(Downtime {
            pod: pod.into(),
            stopped_ms,
            started_ms: new.started_at_ms,
            crashes,
        });
    }
    out
}

/// Asserts that no two pods were down at the same time, and that they went down in order.
pub fn one_at_a_time(windows: &[Downtime]) {
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            assert!(
                a.started_ms <= b.stopped_ms || b.started_ms <= a.stopped_ms,
                "{} and {} were down at the same time: {windows:#?}",
                a.pod,
                b.pod
            );
            assert!(
                a.started_ms <= b.stopped_ms,
                "{} went down before {}: {windows:#?}",
                b.pod,
                a.pod
            );
        }
    }
}

/// Set of pods whose histories differ.
pub fn changed_pods(
    before: &BTreeMap<String, PodState>,
    after: &BTreeMap<String, PodState>,
) -> HashSet<String> {
    PODS.iter()
        .filter(|p| before[**p].history != after[**p].history)
        .map(|p| p.to_string())
        .collect()
}

#[test]
fn the_restart_timeout_flag_and_its_seconds_agree() {
    assert_eq!(RESTART_TIMEOUT, format!("{RESTART_TIMEOUT_S}s"));
}

/// Polls kube-apiserver's `/readyz` every 100 ms from a thread, with the node's credentials of
/// when it started (the figures of issue 26: how long the node had no apiserver).
pub struct Prober {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(Instant, bool)>>>,
}

/// What a [`Prober`] saw.
#[derive(Debug, Clone, Copy)]
pub struct NoApiserver {
    /// Sum of the intervals in which `/readyz` failed.
    pub total_ms: u128,
    /// The longest of them.
    pub longest_ms: u128,
}

impl Prober {
    pub fn start(node: &Node) -> Prober {
        let mut probe = node.probe("kube-apiserver");
        probe.timeout = Duration::from_secs(1);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                let tick = Instant::now();
                let ok = verify::probe(&probe).is_ok_and(|o| o.healthy());
                samples.push((Instant::now(), ok));
                let next = tick + Duration::from_millis(100);
                if let Some(left) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(left);
                }
            }
            samples.push((Instant::now(), true));
            samples
        });
        Prober {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops polling; the time without an apiserver.
    pub fn finish(mut self) -> NoApiserver {
        self.stop.store(true, Ordering::SeqCst);
        let samples = self.thread.take().unwrap().join().unwrap();
        let (mut total, mut longest, mut run) = (0u128, 0u128, 0u128);
        for w in samples.windows(2) {
            if w[0].1 {
                run = 0;
            } else {
                let ms = (w[1].0 - w[0].0).as_millis();
                total += ms;
                run += ms;
                longest = longest.max(run);
            }
        }
        NoApiserver {
            total_ms: total,
            longest_ms: longest,
        }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Prints a figure of issue 26 and appends it to `target/issue26-figures.txt`.
pub fn figure(case: &str, healthy_after: Duration, no_api: NoApiserver, extra: &str) {
    let line = format!(
        "FIGURE issue26 {case}: healthy_after_ms={} no_apiserver_ms={} \
         longest_no_apiserver_ms={}{}{extra}",
        healthy_after.as_millis(),
        no_api.total_ms,
        no_api.longest_ms,
        if extra.is_empty() { "" } else { " " }
    );
    eprintln!("{line}");
    let target = Path::new(CERTROTOR)
        .parent()
        .and_then(Path::parent)
        .expect("target folder");
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(target.join("issue26-figures.txt"))
        .unwrap();
    writeln!(file, "{line}").unwrap();
}
