//! Dev-only helpers shared by the workspace's test trees: certrotor's integration tests
//! (`agent/tests`) and the Bottlerocket test doubles' tests (`bottlerocket/testbed/tests`).
//! Only ever a dependency of test code (`[dev-dependencies]`, and `qemu-tests`, the end-to-end
//! harness, for the paths): nothing here reaches a shipped binary.
//!
//! - [`prereq`]: a test whose prerequisite (a tool, root) is missing FAILS, saying what to
//!   install. It never passes silently, in CI or not.
//! - [`wait_for`]: poll a condition with a deadline, failing with the last observation.
//! - [`fresh_dir`]: a new empty folder per test, named after it.
//! - [`spawn_logged`], [`assert_succeeded`]: a child with its output in a log file; a command
//!   that must have succeeded, failing with what it printed.
//! - [`date`]: civil dates to Unix seconds, for comparing what tools print.
//! - [`ports`]: the one port allocator of a test process: port offsets for lab nodes.
//! - [`k8s`]: the real Kubernetes v1.20.2 control-plane binaries and kubectl, and what
//!   `kubeadm init` does once the apiserver is up (the `kubeadm:cluster-admins` binding).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

pub mod prereq {
    //! Prerequisites of a test. Missing means the test fails with what to do.

    use std::path::Path;

    /// Whether `tool` is an executable file in a folder of `PATH` (or `/usr/sbin`, `/sbin`).
    pub fn on_path(tool: &str) -> bool {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([Path::new("/usr/sbin").into(), Path::new("/sbin").into()])
            .any(|d| d.join(tool).is_file())
    }

    /// Fails `test` because a prerequisite is missing: a missing prerequisite is never a pass.
    #[track_caller]
    pub fn missing(test: &str, why: &str) -> ! {
        panic!(
            "{test}: prerequisite missing: {why}. Install it (images/setup-host.sh installs \
             everything the suite needs), or run the test command as root: this test does not \
             pass without it"
        )
    }

    /// Fails `test` unless every `(tool, Debian package)` is on PATH.
    #[track_caller]
    pub fn require_tools(test: &str, tools: &[(&str, &str)]) {
        for (tool, package) in tools {
            if !on_path(tool) {
                missing(
                    test,
                    &format!("'{tool}' is not installed (apt-get install -y {package})"),
                );
            }
        }
    }

    /// Whether the tests run as root.
    pub fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Fails `test` unless it runs as root; `why` says what needs root.
    #[track_caller]
    pub fn require_root(test: &str, why: &str) {
        if !is_root() {
            missing(test, &format!("root ({why})"));
        }
    }
}

/// A new empty folder `<temp dir>/<prefix>-<name>-<pid>-<n>`, `n` counting the folders of this
/// test process (a leftover of an earlier process with the same pid is removed first).
#[track_caller]
pub fn fresh_dir(prefix: &str, name: &str) -> std::path::PathBuf {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let leaf = format!("{prefix}-{name}-{}-{n}", std::process::id());
    let path = std::env::temp_dir().join(leaf);
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

/// Starts `command` (named `name` in the panic if it cannot start) with an empty stdin and its
/// stdout and stderr written to a new file `log`.
#[track_caller]
pub fn spawn_logged(
    name: &str,
    mut command: std::process::Command,
    log: &std::path::Path,
) -> std::process::Child {
    let file = std::fs::File::create(log).unwrap();
    command
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

/// Asserts that `what` (a command that ran to its end) succeeded; the failure shows its stdout
/// and stderr.
#[track_caller]
pub fn assert_succeeded(what: &str, out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls `probe` every `every` until it returns `Ok`; after `deadline`, fails naming `what` and
/// the last observation.
#[track_caller]
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Result<T, String>,
) -> T {
    let end = Instant::now() + deadline;
    loop {
        match probe() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= end => {
                panic!("timed out after {deadline:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(every),
        }
    }
}

pub mod k8s {
    //! The real Kubernetes v1.20.2 control plane for the host tests (built by
    //! `images/k8s/build.sh`): kubelet-sim runs these binaries as a lab node's static pods.

    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    /// Where `images/k8s/build.sh` caches the binaries (`--print-bin-dir`).
    pub const DEFAULT_BIN: &str = "/var/cache/certrotor/kubernetes-v1.20.2/bin";

    /// kubectl v1.20.2, unpacked from Debian's kubernetes-client by `images/setup-host.sh`.
    pub const DEFAULT_KUBECTL: &str = "/var/cache/certrotor/kubernetes-client/usr/bin/kubectl";

    /// The control-plane binaries the static pods run, besides etcd.
    pub const BINARIES: [&str; 3] = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ];

    /// The folder holding the real binaries: `CERTROTOR_K8S_BIN`, else [`DEFAULT_BIN`]. Panics
    /// (the test fails, never skips) when one of [`BINARIES`] is missing, saying how to build
    /// them.
    #[track_caller]
    pub fn bin_dir() -> PathBuf {
        let dir = configured_dir();
        for name in BINARIES {
            assert!(
                dir.join(name).is_file(),
                "the real {name} v1.20.2 is missing in {}: build the Kubernetes binaries with \
                 images/k8s/build.sh (or point CERTROTOR_K8S_BIN at a folder holding \
                 {BINARIES:?})",
                dir.display()
            );
        }
        dir
    }

    /// `CERTROTOR_K8S_BIN`, else [`DEFAULT_BIN`], whatever it holds.
    fn configured_dir() -> PathBuf {
        std::env::var_os("CERTROTOR_K8S_BIN")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BIN))
    }

    /// Links the real kube-apiserver, kube-controller-manager and kube-scheduler into `into`, a
    /// folder put first on kubelet-sim's `PATH` (the manifests name the bare commands).
    #[track_caller]
    pub fn link_control_plane(into: &Path) {
        let dir = bin_dir();
        std::fs::create_dir_all(into).unwrap();
        for name in BINARIES {
            std::os::unix::fs::symlink(dir.join(name), into.join(name)).unwrap();
        }
    }

    /// The start-up cuts of the tests' real kube-apiserver, the ones the QEMU scenarios use
    /// (`qemu-tests/scenarios/node-lib.sh`, `NODE_FAST_APISERVER`): no API priority and
    /// fairness, no watch cache, no profiling, only the API groups the control plane and the
    /// tests use. None of them touches what the tests prove (how the apiserver loads, reloads
    /// and serves its certificates and authenticates its clients); they cut the CPU time each
    /// start costs, on a suite that starts hundreds (ARCHITECTURE.md, "Tests").
    pub const APISERVER_CUTS: [&str; 4] = [
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--watch-cache=false",
        "--runtime-config=api/all=false,api/v1=true,rbac.authorization.k8s.io/v1=true,\
         authentication.k8s.io/v1=true,authorization.k8s.io/v1=true,coordination.k8s.io/v1=true,\
         scheduling.k8s.io/v1=true,storage.k8s.io/v1=true,policy/v1beta1=true,\
         events.k8s.io/v1=true,apps/v1=true,certificates.k8s.io/v1=true,\
         apiregistration.k8s.io/v1=true,node.k8s.io/v1=true,admissionregistration.k8s.io/v1=true,\
         networking.k8s.io/v1=true,discovery.k8s.io/v1beta1=true,apiextensions.k8s.io/v1=true",
    ];

    /// Adds [`APISERVER_CUTS`] to the kube-apiserver manifest `manifest` (as kubeadm and `lab
    /// init` write it: `    - kube-apiserver` then one flag a line), before anything reads it
    /// (apiserver-sim seeds its settings from it; certrotor recognises the process by the
    /// manifest's command line).
    #[track_caller]
    pub fn cut_apiserver_start_up(manifest: &Path) {
        let text = std::fs::read_to_string(manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let line = "    - kube-apiserver\n";
        assert!(
            text.matches(line).count() == 1,
            "{}: no single `{}` line",
            manifest.display(),
            line.trim()
        );
        let cuts: String = APISERVER_CUTS
            .iter()
            .map(|f| format!("    - {f}\n"))
            .collect();
        std::fs::write(manifest, text.replacen(line, &format!("{line}{cuts}"), 1))
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    }

    /// [`cut_apiserver_start_up`] on every kube-apiserver manifest under `dir` (a node's root,
    /// or a folder of nodes' roots: `lab init --topology external-etcd`), in a `manifests`
    /// folder of the kubeadm layout or Bottlerocket's. Panics when there is none.
    #[track_caller]
    pub fn cut_apiserver_start_up_under(dir: &Path) {
        fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                let path = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&path, found);
                } else if path.ends_with("manifests/kube-apiserver.yaml") {
                    found.push(path);
                }
            }
        }
        let mut found = Vec::new();
        walk(dir, &mut found);
        assert!(
            !found.is_empty(),
            "{}: no kube-apiserver manifest",
            dir.display()
        );
        for m in found {
            cut_apiserver_start_up(&m);
        }
    }

    /// Links the control plane into `into` (see [`link_control_plane`]) and returns this
    /// process's `PATH` with `into` first, for kubelet-sim.
    #[track_caller]
    pub fn path_with_control_plane(into: &Path) -> String {
        link_control_plane(into);
        let path = std::env::var("PATH").unwrap_or_default();
        format!("{}:{path}", into.display())
    }

    /// kubectl v1.20.2: `CERTROTOR_KUBECTL`, else `kubectl` in [`bin_dir`], else the one
    /// `images/setup-host.sh` unpacks from Debian's kubernetes-client package. Panics when none
    /// is there.
    #[track_caller]
    pub fn kubectl_path() -> PathBuf {
        if let Some(p) = std::env::var_os("CERTROTOR_KUBECTL") {
            return PathBuf::from(p);
        }
        let candidates = [
            configured_dir().join("kubectl"),
            PathBuf::from(DEFAULT_KUBECTL),
        ];
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "kubectl v1.20.2 is missing (looked at {candidates:?}): run \
                     images/setup-host.sh as root, or set CERTROTOR_KUBECTL"
                )
            })
    }

    /// What `kubeadm init` (v1.29 and later, whose layout the lab writes) does once the
    /// apiserver is up: binds the group `kubeadm:cluster-admins` of admin.conf to
    /// `cluster-admin`, with `super_admin` (super-admin.conf, `system:masters`). Once per
    /// cluster: the binding lives in etcd. A node without super-admin.conf has an admin.conf in
    /// `system:masters` (kubeadm before v1.29) and needs nothing.
    #[track_caller]
    pub fn grant_cluster_admins(super_admin: &Path) {
        if !super_admin.exists() {
            return;
        }
        let out = Command::new(kubectl_path())
            .arg(format!("--kubeconfig={}", super_admin.display()))
            .args([
                "--request-timeout=30s",
                "create",
                "clusterrolebinding",
                "kubeadm:cluster-admins",
                "--clusterrole=cluster-admin",
                "--group=kubeadm:cluster-admins",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("kubectl runs");
        crate::assert_succeeded(
            "kubectl create clusterrolebinding kubeadm:cluster-admins",
            &out,
        );
    }

    #[cfg(test)]
    mod tests {
        /// The host tests and the QEMU scenarios start the same apiserver: node-lib.sh's
        /// `NODE_FAST_APISERVER` holds exactly [`super::APISERVER_CUTS`], in order.
        #[test]
        fn apiserver_cuts_are_the_qemu_scenarios_cuts() {
            let lib = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../qemu-tests/scenarios/node-lib.sh");
            let text = std::fs::read_to_string(&lib).unwrap();
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("NODE_FAST_APISERVER=\""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| {
                    panic!("{}: no NODE_FAST_APISERVER=\"...\" line", lib.display())
                });
            let shell: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(shell, super::APISERVER_CUTS, "{}", lib.display());
        }
    }
}

pub mod ports {
    //! Port offsets for lab nodes, from one allocator per test process: every test tree that
    //! starts nodes takes its offsets here, so two tests running in parallel never get the same
    //! port (two allocators, each with its own list, could).

    use std::sync::Mutex;

    /// A lab node's standard ports before its offset: etcd client, peer and metrics, the
    /// apiserver, the controller-manager and the scheduler, kube-vip's metrics and the
    /// kubelet's API port (kubelet-sim's stand-in).
    pub const NODE_PORTS: [u16; 8] = [2379, 2380, 2381, 6443, 10257, 10259, 2112, 10250];

    /// Lowest offset: every port is above 1024 with it.
    const LOW: u32 = 1000;
    /// Offsets in LOW..LOW + SPAN keep every node port (at most 10259 + offset) below 32768,
    /// where Linux's default range of local ports for outgoing connections starts
    /// (`net.ipv4.ip_local_port_range`): a probe's or a client's own port never lands on a node
    /// port that is about to be bound.
    const SPAN: u32 = 21_000;
    /// Prime, coprime to SPAN (2^3 * 3 * 5^3 * 7): the walk visits every offset once.
    const STRIDE: u32 = 7_919;

    /// Offsets for `n` nodes: each offset's ports are free on every address now and were not
    /// handed out before in this process. The walk starts where the last call stopped and tries
    /// each offset at most once, then fails saying so.
    pub fn offsets(n: usize) -> Vec<u16> {
        static TAKEN: Mutex<(Vec<u16>, Option<u32>)> = Mutex::new((Vec::new(), None));
        let mut guard = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        let (taken, cursor) = &mut *guard;
        let mut at = cursor.unwrap_or(std::process::id() % SPAN);
        let mut out: Vec<u16> = Vec::new();
        for _ in 0..SPAN {
            if out.len() == n {
                break;
            }
            at = (at + STRIDE) % SPAN;
            let offset = (LOW + at) as u16;
            let ports: Vec<u16> = NODE_PORTS.iter().map(|p| p + offset).collect();
            if ports.iter().any(|p| taken.contains(p)) {
                continue;
            }
            if ports
                .iter()
                .all(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
            {
                taken.extend(ports);
                out.push(offset);
            }
        }
        *cursor = Some(at);
        assert_eq!(out.len(), n, "no free port offsets left for {n} lab nodes");
        out
    }
}

pub mod date {
    //! Civil dates to Unix seconds (UTC), independently of the code under test.

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// `YYYY-MM-DD?HH:MM:SS…` (any separators at 4, 7, 10, 13, 16) to Unix seconds.
    pub fn parse_iso(t: &str) -> i64 {
        let n = |r: std::ops::Range<usize>| {
            t.get(r.clone())
                .and_then(|s| s.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("not a date 'YYYY-MM-DD HH:MM:SS': '{t}'"))
        };
        days_from_civil(n(0..4), n(5..7), n(8..10)) * 86_400
            + n(11..13) * 3600
            + n(14..16) * 60
            + n(17..19)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn known_dates() {
            assert_eq!(days_from_civil(1970, 1, 1), 0);
            assert_eq!(parse_iso("2000-03-01T00:00:00Z"), 951_868_800);
            assert_eq!(parse_iso("2021-01-21 12:34:56Z"), 1_611_232_496);
        }
    }
}
