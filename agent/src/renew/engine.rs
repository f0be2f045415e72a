//! Renewal engines: who makes the new certificates of a plan.
//!
//! - [`Engine::Native`] (the default): certrotor issues them itself ([`renew::issue_all`]).
//! - [`Engine::Kubeadm`]: the node's own tools do it, as EKS Anywhere does on Bottlerocket
//!   (`reference/bottlerocket-api.md` §3.4, §4): `kubeadm certs renew <name>` once per selected
//!   certificate (never `renew all`), and on etcd nodes `etcdadm join phase certificates
//!   <dummy-url> --init-system kubelet`, each run with `ctr run --rm` in the bottlerocket-bootstrap
//!   image through the host's containerd. The tools never see the live PKI: they work on a
//!   staging copy under `var/lib/certrotor/engine/<pid>` (0700), mounted where EKS Anywhere mounts
//!   the real folders (the kubeadm folder at both `/var/lib/kubeadm` and `/etc/kubernetes`; the
//!   etcd PKI, emptied of everything but `ca.*`, at `/etc/etcd/pki`). What they wrote becomes
//!   [`renew::Issued`] values, so the same validation and transaction follow as for the native
//!   engine.
//!
//! Containers are named `certrotor-kubeadm-<pid>-<n>`; each is removed after its run, whatever
//! the outcome, and a run starts by removing those a killed run left behind (their pid is gone).
//! Staging copies of an interrupted run are removed by the next run too. The image must already
//! be in containerd: certrotor never pulls.
//!
//! Where the image is (unless `--containerd-socket` or `--containerd-namespace` say): first
//! host-containerd (`/run/host-containerd/containerd.sock`, namespace `default`), where
//! Bottlerocket's host-ctr pulled the `kubeadm-bootstrap` host container's `source` when EKS
//! Anywhere made the node; the image stays there after that container disabled itself. Then the
//! kubelet's containerd (`/run/containerd/containerd.sock`) in namespace `k8s.io`, then in
//! `default` (where EKS Anywhere's documented `ctr image pull` puts it). Each socket is also
//! looked for under `/.bottlerocket/rootfs`, the host root of a Bottlerocket container. The
//! tools run through the containerd that holds the image.
//!
//! Decision: certrotor drives the host's `ctr` rather than containerd's gRPC API. The gRPC route
//! would need protobuf/tonic/tokio and an OCI runtime-spec builder in a small static binary;
//! `ctr run` already builds the spec exactly as EKS Anywhere's documented procedure does, and
//! Bottlerocket ships `/usr/bin/ctr`, reachable from a superpowered host container as
//! `/.bottlerocket/rootfs/usr/bin/ctr`.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::node::catalog::paths::{
    BOTTLEROCKET_ETCD_PKI, BOTTLEROCKET_HOST_ROOT, BOTTLEROCKET_KUBEADM_DIR, ETCDADM_PKI,
    KUBEADM_DIR,
};
use crate::node::catalog::{Flavor, Kind};
use crate::node::kubeconfig::{Kubeconfig, Source};
use crate::pki::{Cert, MAX_PEM_FILE_BYTES, PrivateKey};
use crate::renew::{self, IdentityCheck, IssueError, Issued, Item, Plan, ValidityCheck};
use crate::sys::clock;
use crate::sys::fsutil;

/// containerd's socket on a Kubernetes node.
pub const DEFAULT_CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// The CRI namespace, where the kubelet's images are.
pub const DEFAULT_CONTAINERD_NAMESPACE: &str = "k8s.io";
/// Bottlerocket's host-containerd, which runs host and bootstrap containers.
pub const HOST_CONTAINERD_SOCKET: &str = "/run/host-containerd/containerd.sock";
/// host-containerd's namespace (host-ctr's default).
pub const HOST_CONTAINERD_NAMESPACE: &str = "default";
/// kubeadm in EKS Anywhere's bottlerocket-bootstrap image.
pub const DEFAULT_KUBEADM_PATH: &str = "/opt/bin/kubeadm";
/// etcdadm in the same image.
pub const DEFAULT_ETCDADM_PATH: &str = "/opt/bin/etcdadm";
/// Prefix of the containers certrotor runs.
pub const CONTAINER_PREFIX: &str = "certrotor-kubeadm-";
/// The endpoint EKS Anywhere gives `etcdadm join phase certificates`; it is not contacted.
const ETCDADM_DUMMY_URL: &str = "http://eks-a-etcd-dumb-url";
/// The Bottlerocket setting holding the bootstrap image.
const IMAGE_SETTING: &str = "settings.host-containers.kubeadm-bootstrap.source";
/// Bound on one tool run.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// Bound on one ctr housekeeping command.
const CTR_TIMEOUT: Duration = Duration::from_secs(60);

/// Who issues the new certificates.
#[derive(Debug, Clone, Default)]
pub enum Engine {
    /// certrotor itself.
    #[default]
    Native,
    /// kubeadm/etcdadm in the bootstrap image, through containerd.
    Kubeadm(KubeadmOptions),
}

impl Engine {
    /// `native` or `kubeadm`.
    pub fn name(&self) -> &'static str {
        match self {
            Engine::Native => "native",
            Engine::Kubeadm(_) => "kubeadm",
        }
    }
}

/// Where the kubeadm engine finds its image, tools and containerd.
#[derive(Debug, Clone)]
pub struct KubeadmOptions {
    /// The image; `None`: `settings.host-containers.kubeadm-bootstrap.source` from the API.
    pub image: Option<String>,
    pub kubeadm_path: String,
    pub etcdadm_path: String,
    /// The `ctr` binary; `None`: the host's (`/.bottlerocket/rootfs/usr/bin/ctr` in a host
    /// container), else `ctr` from `PATH`.
    pub ctr_path: Option<PathBuf>,
    /// containerd's socket; with `namespace`, `None` for both: look where Bottlerocket and EKS
    /// Anywhere keep the image (see the module documentation).
    pub socket: Option<PathBuf>,
    /// The image's containerd namespace (`k8s.io` when only `socket` is given).
    pub namespace: Option<String>,
    /// The Bottlerocket API socket, to look the image up.
    pub api_socket: PathBuf,
}

impl Default for KubeadmOptions {
    fn default() -> Self {
        KubeadmOptions {
            image: None,
            kubeadm_path: DEFAULT_KUBEADM_PATH.into(),
            etcdadm_path: DEFAULT_ETCDADM_PATH.into(),
            ctr_path: None,
            socket: None,
            namespace: None,
            api_socket: crate::node::catalog::paths::API_SOCKET.into(),
        }
    }
}

/// What an engine issued, and how to validate it.
#[derive(Debug)]
pub struct Output {
    pub issued: Vec<Issued>,
    pub validity: ValidityCheck,
}

/// Issues every planned certificate with `engine`. Nothing live is touched.
pub fn issue(root: &Path, plan: &Plan, engine: &Engine) -> Result<Output, IssueError> {
    match engine {
        Engine::Native => Ok(Output {
            issued: renew::issue_all(root, plan)?,
            validity: ValidityCheck::Planned,
        }),
        Engine::Kubeadm(opts) => {
            let started = clock::now();
            let clock_started = Instant::now();
            let issued = kubeadm_issue(root, plan, opts)?;
            log::info!(
                "kubeadm engine: {} certificate(s) in {} ms",
                issued.len(),
                clock_started.elapsed().as_millis()
            );
            Ok(Output {
                issued,
                validity: ValidityCheck::ToolChosen {
                    started,
                    finished: clock::now(),
                },
            })
        }
    }
}

fn err(message: impl fmt::Display) -> IssueError {
    IssueError(format!("kubeadm engine: {message}"))
}

/// The containerd side: ctr, socket, namespace, image; container names.
struct Ctr {
    ctr: PathBuf,
    socket: PathBuf,
    namespace: String,
    image: String,
    next: usize,
}

/// One command's result.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ctr {
    /// Whether `ctr` is the host's, seen through the host root of a Bottlerocket container: it
    /// then runs chrooted into that root, because it is linked against the host's libraries,
    /// which certrotor's own (empty) image does not have.
    fn in_host_root(&self) -> bool {
        self.ctr.starts_with(BOTTLEROCKET_HOST_ROOT)
    }

    /// A path as the process running `ctr` sees it.
    fn exec_view(&self, path: &Path) -> PathBuf {
        match path.strip_prefix(BOTTLEROCKET_HOST_ROOT) {
            Ok(rel) if self.in_host_root() => Path::new("/").join(rel),
            _ => path.to_path_buf(),
        }
    }

    fn base(&self) -> Vec<String> {
        vec![
            "-a".into(),
            self.exec_view(&self.socket).display().to_string(),
            "-n".into(),
            self.namespace.clone(),
        ]
    }

    fn describe(&self, args: &[String]) -> String {
        let mut words = vec![self.ctr.display().to_string()];
        words.extend(self.base());
        words.extend(args.iter().cloned());
        words.join(" ")
    }

    /// Runs `ctr <base> args`, bounded by `timeout`; on timeout ctr is killed.
    fn run(&self, args: &[String], timeout: Duration) -> Result<Ran, IssueError> {
        let mut command = Command::new(self.exec_view(&self.ctr));
        if self.in_host_root() {
            chroot_into_host_root(&mut command);
        }
        command
            .args(self.base())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut command);
        let mut child = command.spawn().map_err(|e| {
            err(format!(
                "cannot run '{}': {e}; give the host's ctr with --ctr-path",
                self.ctr.display()
            ))
        })?;
        let (mut out, mut errs) = (child.stdout.take(), child.stderr.take());
        let reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(o) = out.as_mut() {
                let _ = o.take(1 << 20).read_to_end(&mut s);
            }
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = Vec::new();
            if let Some(e) = errs.as_mut() {
                let _ = e.take(1 << 20).read_to_end(&mut s);
            }
            s
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(err(format!("waiting for '{}': {e}", self.describe(args)))),
            }
        };
        let stdout = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
        match status {
            None => Err(err(format!(
                "'{}' did not finish within {}s (socket '{}', image '{}')",
                self.describe(args),
                timeout.as_secs(),
                self.socket.display(),
                self.image
            ))),
            Some(s) => Ok(Ran {
                code: s.code(),
                stdout,
                stderr,
            }),
        }
    }

    /// Runs a housekeeping command that must succeed.
    fn must(&self, args: &[&str]) -> Result<String, IssueError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let ran = self.run(&args, CTR_TIMEOUT)?;
        if ran.code != Some(0) {
            return Err(err(format!(
                "'{}' failed (exit {:?}, socket '{}'): {}",
                self.describe(&args),
                ran.code,
                self.socket.display(),
                ran.stderr.trim()
            )));
        }
        Ok(ran.stdout)
    }

    fn containers(&self) -> Result<Vec<String>, IssueError> {
        Ok(self
            .must(&["containers", "ls", "-q"])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Kills the task and removes the container `name`; errors are reported, not returned.
    fn remove(&self, name: &str) -> Option<String> {
        let mut problems = Vec::new();
        for args in [
            vec!["tasks", "kill", "-a", "-s", "SIGKILL", name],
            vec!["tasks", "delete", "-f", name],
            vec!["containers", "delete", name],
        ] {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            match self.run(&args, CTR_TIMEOUT) {
                Ok(r) if r.code == Some(0) => {}
                Ok(r) => problems.push(format!("{}: {}", args.join(" "), r.stderr.trim())),
                Err(e) => problems.push(e.to_string()),
            }
        }
        // The first two fail when the task is already gone; only a container left behind counts.
        match self.containers() {
            Ok(list) if !list.iter().any(|c| c == name) => None,
            Ok(_) => Some(format!(
                "container '{name}' could not be removed (socket '{}'): {}",
                self.socket.display(),
                problems.join("; ")
            )),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Removes containers with certrotor's prefix whose certrotor process is gone.
    fn remove_leftovers(&self) -> Result<(), IssueError> {
        for name in self.containers()? {
            let Some(rest) = name.strip_prefix(CONTAINER_PREFIX) else {
                continue;
            };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| p != std::process::id() && certrotor_alive(p)) {
                continue;
            }
            log::warn!("kubeadm engine: removing container '{name}' left by an interrupted run");
            if let Some(problem) = self.remove(&name) {
                return Err(err(problem));
            }
        }
        Ok(())
    }

    /// `ctr run --rm` of `tool args` in the image with `mounts` (host path, container path);
    /// the container is removed afterwards whatever happens.
    fn tool(
        &mut self,
        mounts: &[(PathBuf, &str)],
        net_host: bool,
        tool: &[String],
    ) -> Result<String, IssueError> {
        let name = format!("{CONTAINER_PREFIX}{}-{}", std::process::id(), self.next);
        self.next += 1;
        let mut args: Vec<String> = vec!["run".into(), "--rm".into()];
        if net_host {
            args.push("--net-host".into());
        }
        for (src, dst) in mounts {
            args.push("--mount".into());
            args.push(format!(
                "type=bind,src={},dst={dst},options=rbind:rw",
                src.display()
            ));
        }
        args.push(self.image.clone());
        args.push(name.clone());
        args.extend(tool.iter().cloned());
        let result = self.run(&args, RUN_TIMEOUT);
        let leftover = match self.containers() {
            Ok(list) if list.contains(&name) => self.remove(&name),
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        };
        let ran = result?;
        if ran.code != Some(0) {
            let output = redact_keys(&format!("{}\n{}", ran.stdout.trim(), ran.stderr.trim()));
            return Err(err(format!(
                "'{}' failed with exit code {} (socket '{}', image '{}'): {}",
                self.describe(&args),
                ran.code.map_or("none (killed)".into(), |c| c.to_string()),
                self.socket.display(),
                self.image,
                output.trim()
            )));
        }
        if let Some(problem) = leftover {
            return Err(err(problem));
        }
        for line in redact_keys(&format!("{}\n{}", ran.stdout, ran.stderr)).lines() {
            if !line.trim().is_empty() {
                log::info!("{}: {}", tool.join(" "), line.trim());
            }
        }
        Ok(ran.stdout)
    }
}

/// A tool's output with every PEM private-key block replaced by one line: whatever a tool
/// prints, key material never reaches certrotor's log or errors.
fn redact_keys(output: &str) -> String {
    let mut out = Vec::new();
    let mut in_key = false;
    for line in output.lines() {
        if line.contains("-----BEGIN") && line.contains("PRIVATE KEY") {
            in_key = true;
            out.push("[private key redacted]");
        } else if in_key {
            in_key = !(line.contains("-----END") && line.contains("PRIVATE KEY"));
        } else {
            out.push(line);
        }
    }
    out.join("\n")
}

/// Whether `pid` is a live certrotor process (its container is then not a leftover).
fn certrotor_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().starts_with("certrotor"))
        .unwrap_or(false)
}

/// ctr dies with certrotor: a killed run leaves a container (removed by the next run), not a
/// client waiting forever.
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY (`pre_exec` has no safe form): the closure runs between fork and exec and only
    // calls prctl, which is async-signal-safe; it allocates nothing and touches no memory of
    // the parent.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(|| {
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            Ok(())
        });
    }
}

/// Runs the command chrooted into the host root (`/.bottlerocket/rootfs`, an rbind of the host's
/// `/` with its submounts). A superpowered host container has CAP_SYS_CHROOT.
fn chroot_into_host_root(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // Made before the fork: the child must not allocate. (The constant has no NUL; were it to,
    // the child fails with InvalidInput rather than running unchrooted.)
    let host_root = std::ffi::CString::new(crate::node::catalog::paths::BOTTLEROCKET_HOST_ROOT);
    // SAFETY (`pre_exec` has no safe form): the closure runs between fork and exec and only
    // calls chroot(2) and chdir(2), which are async-signal-safe, on C strings made before the
    // fork (nix passes a `CStr` through without allocating).
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            let root = host_root
                .as_deref()
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
            nix::unistd::chroot(root)?;
            nix::unistd::chdir(c"/")?;
            Ok(())
        });
    }
}

/// The host's view of a path under `root`: inside a Bottlerocket host container the root is
/// `/.bottlerocket/rootfs`, while containerd (on the host) sees it as `/`. Elsewhere containerd
/// shares certrotor's view.
fn host_path(root: &Path, path: &Path) -> PathBuf {
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if canonical == Path::new(BOTTLEROCKET_HOST_ROOT)
        && let Ok(rel) = path.strip_prefix(root)
    {
        return Path::new("/").join(rel);
    }
    path.to_path_buf()
}

fn default_ctr() -> PathBuf {
    let host = Path::new(BOTTLEROCKET_HOST_ROOT).join("usr/bin/ctr");
    if host.exists() {
        host
    } else {
        PathBuf::from("ctr")
    }
}

/// One place an image may be: a containerd socket and a namespace.
struct Place {
    socket: &'static str,
    namespace: &'static str,
    /// What it is, for messages.
    what: &'static str,
}

/// Where Bottlerocket and EKS Anywhere keep the bootstrap image, in the order looked at.
const PLACES: [Place; 3] = [
    Place {
        socket: HOST_CONTAINERD_SOCKET,
        namespace: HOST_CONTAINERD_NAMESPACE,
        what: "host-containerd, where host-ctr pulled the kubeadm-bootstrap host container's image",
    },
    Place {
        socket: DEFAULT_CONTAINERD_SOCKET,
        namespace: DEFAULT_CONTAINERD_NAMESPACE,
        what: "the kubelet's containerd",
    },
    Place {
        socket: DEFAULT_CONTAINERD_SOCKET,
        namespace: "default",
        what: "the kubelet's containerd, where EKS Anywhere's 'ctr image pull' puts it",
    },
];

/// `socket` as it exists: itself, or for one of the well-known sockets, under the host root of
/// a Bottlerocket container.
fn existing_socket(socket: &Path) -> Option<PathBuf> {
    if socket.exists() {
        return Some(socket.to_path_buf());
    }
    let well_known = [HOST_CONTAINERD_SOCKET, DEFAULT_CONTAINERD_SOCKET]
        .iter()
        .any(|s| socket == Path::new(s));
    let rel = socket.strip_prefix("/").ok()?;
    let host = Path::new(BOTTLEROCKET_HOST_ROOT).join(rel);
    (well_known && host.exists()).then_some(host)
}

/// Whether `ctr` lists `image` in its namespace.
fn has_image(ctr: &Ctr) -> Result<bool, IssueError> {
    let present = ctr.must(&["images", "ls", "-q"])?;
    Ok(present.lines().any(|l| l.trim() == ctr.image))
}

/// The containerd (socket, namespace) that holds `image`: the one given, or the first of
/// [`PLACES`] that has it. The error says where it looked and how to make the image available.
fn locate(opts: &KubeadmOptions, image: &str, ctr: &Path) -> Result<Ctr, IssueError> {
    let make = |socket: PathBuf, namespace: &str| Ctr {
        ctr: ctr.to_path_buf(),
        socket,
        namespace: namespace.to_string(),
        image: image.to_string(),
        next: 0,
    };
    if opts.socket.is_some() || opts.namespace.is_some() {
        let given = opts
            .socket
            .clone()
            .unwrap_or_else(|| DEFAULT_CONTAINERD_SOCKET.into());
        let namespace = opts
            .namespace
            .as_deref()
            .unwrap_or(DEFAULT_CONTAINERD_NAMESPACE);
        let socket = existing_socket(&given).ok_or_else(|| {
            err(format!(
                "containerd socket '{}' does not exist; give it with --containerd-socket",
                given.display()
            ))
        })?;
        let c = make(socket, namespace);
        if has_image(&c)? {
            return Ok(c);
        }
        return Err(err(format!(
            "image '{image}' is not in containerd (socket '{}', namespace '{namespace}'); \
             certrotor never pulls: pull or import it first (ctr -a {} -n {namespace} images \
             pull {image})",
            c.socket.display(),
            given.display()
        )));
    }
    let mut looked = Vec::new();
    for place in &PLACES {
        let Some(socket) = existing_socket(Path::new(place.socket)) else {
            looked.push(format!(
                "{} (socket '{}' does not exist)",
                place.what, place.socket
            ));
            continue;
        };
        let c = make(socket, place.namespace);
        match has_image(&c) {
            Ok(true) => {
                log::info!(
                    "kubeadm engine: image '{image}' found in {} (socket '{}', namespace '{}')",
                    place.what,
                    c.socket.display(),
                    place.namespace
                );
                return Ok(c);
            }
            Ok(false) => looked.push(format!(
                "{} (socket '{}', namespace '{}': not there)",
                place.what,
                c.socket.display(),
                place.namespace
            )),
            Err(e) => looked.push(format!("{} ({e})", place.what)),
        }
    }
    Err(err(format!(
        "image '{image}' is not in containerd; looked in: {}. certrotor never pulls. Make it \
         available where Bottlerocket keeps host-container images, from the node's admin \
         container: 'sudo sheltie', then 'ctr -a {HOST_CONTAINERD_SOCKET} -n \
         {HOST_CONTAINERD_NAMESPACE} images pull {image}' (it stays across reboots); or give \
         --containerd-socket and --containerd-namespace where it is",
        looked.join("; ")
    )))
}

fn resolve_image(opts: &KubeadmOptions) -> Result<String, IssueError> {
    if let Some(image) = &opts.image {
        return Ok(image.clone());
    }
    if !opts.api_socket.exists() {
        return Err(err(format!(
            "no --kubeadm-image given and no Bottlerocket API at '{}' to read {IMAGE_SETTING}",
            opts.api_socket.display()
        )));
    }
    // The API server may be restarting (systemd Restart=always): retried for a while.
    let client = bottlerocket::ApiClient::new(&opts.api_socket);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let value = bottlerocket::Retry::until(deadline)
        .run(|left| client.bounded(left).settings_by_prefix(IMAGE_SETTING))
        .map_err(|e| {
            err(format!(
                "reading {IMAGE_SETTING} from '{}': {e}; give --kubeadm-image",
                opts.api_socket.display()
            ))
        })?;
    let found = ["", "/settings"].iter().find_map(|base| {
        value
            .pointer(&format!("{base}/host-containers/kubeadm-bootstrap/source"))
            .and_then(|v| v.as_str())
            .map(str::to_string)
    });
    found.filter(|s| !s.is_empty()).ok_or_else(|| {
        err(format!(
            "{IMAGE_SETTING} is not set on this node (API '{}'); give --kubeadm-image",
            opts.api_socket.display()
        ))
    })
}

/// The tool folder of an item: (which tool, folder relative to the root).
fn tool_dir(item: &Item) -> Result<(Flavor, &'static str), IssueError> {
    let candidates: [(Flavor, &'static str); 4] = [
        (Flavor::Kubeadm, KUBEADM_DIR),
        (Flavor::Kubeadm, BOTTLEROCKET_KUBEADM_DIR),
        (Flavor::Etcdadm, ETCDADM_PKI),
        (Flavor::Etcdadm, BOTTLEROCKET_ETCD_PKI),
    ];
    candidates
        .into_iter()
        .find(|(flavor, dir)| *flavor == item.flavor && item.path.starts_with(&format!("{dir}/")))
        .ok_or_else(|| {
            err(format!(
                "{}: '{}' is in no known folder",
                item.name, item.path
            ))
        })
}

/// The staging folder of this run; removes those of interrupted runs.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn new(root: &Path) -> Result<Staging, IssueError> {
        let parent = crate::txn::state_dir(root).join("engine");
        if let Ok(list) = std::fs::read_dir(&parent) {
            for e in list.flatten() {
                log::warn!(
                    "kubeadm engine: removing the staging copy '{}' of an interrupted run",
                    e.path().display()
                );
                std::fs::remove_dir_all(e.path())
                    .map_err(|x| err(format!("cannot remove '{}': {x}", e.path().display())))?;
            }
        }
        let dir = parent.join(std::process::id().to_string());
        fsutil::create_dir_all_mode(&dir, 0o700)
            .map_err(|e| err(format!("cannot create '{}': {e}", dir.display())))?;
        Ok(Staging { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the regular files and folders of `from` into `to` (symlinks and others skipped),
/// keeping modes.
fn copy_tree(from: &Path, to: &Path, filter: &dyn Fn(&Path) -> bool) -> Result<(), IssueError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |p: &Path, e: std::io::Error| err(format!("staging '{}': {e}", p.display()));
    fsutil::create_dir_all_mode(to, 0o700).map_err(|e| io(to, e))?;
    for e in std::fs::read_dir(from).map_err(|e| io(from, e))?.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            copy_tree(&src, &dst, filter)?;
        } else if kind.is_file() && filter(&src) {
            let mode = e.metadata().map_err(|x| io(&src, x))?.permissions().mode() & 0o777;
            let data = fsutil::read_limited(&src, &src.display().to_string(), MAX_PEM_FILE_BYTES)
                .map_err(|x| err(x.to_string()))?;
            fsutil::write_new(&dst, &data, mode, None).map_err(|x| io(&dst, x))?;
        }
    }
    Ok(())
}

fn read_rel(root: &Path, rel: &str) -> Result<Vec<u8>, IssueError> {
    match fsutil::read_in_root(root, rel, MAX_PEM_FILE_BYTES) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(err(format!("'{rel}' does not exist"))),
        Err(e) => Err(err(e)),
    }
}

fn kubeadm_issue(
    root: &Path,
    plan: &Plan,
    opts: &KubeadmOptions,
) -> Result<Vec<Issued>, IssueError> {
    if plan.reuse_keys {
        return Err(err(
            "--reuse-keys: kubeadm and etcdadm always make new keys; use --engine native",
        ));
    }
    let image = resolve_image(opts)?;
    let ctr_path = opts.ctr_path.clone().unwrap_or_else(default_ctr);
    let mut ctr = locate(opts, &image, &ctr_path)?;
    ctr.remove_leftovers()?;
    let staging = Staging::new(root)?;

    let mut groups: BTreeMap<(u8, &'static str), Vec<&Item>> = BTreeMap::new();
    for item in &plan.items {
        let (flavor, dir) = tool_dir(item)?;
        groups
            .entry((u8::from(flavor == Flavor::Etcdadm), dir))
            .or_default()
            .push(item);
    }
    let mut issued = Vec::new();
    for (n, ((etcdadm, dir), items)) in groups.into_iter().enumerate() {
        let stage = staging.dir.join(format!("{n}"));
        let host = host_path(root, &stage);
        if etcdadm == 0 {
            copy_tree(&root.join(dir).join("pki"), &stage.join("pki"), &|_| true)?;
            copy_tree(&root.join(dir), &stage, &|p| {
                p.extension().is_some_and(|x| x == "conf")
                    && p.parent() == Some(root.join(dir).as_path())
            })?;
            for item in &items {
                let name = item.name.split('@').next().unwrap_or(&item.name);
                let before = staged_cert(&stage, dir, item).ok();
                let out = ctr.tool(
                    &[
                        (host.clone(), "/var/lib/kubeadm"),
                        (host.clone(), "/etc/kubernetes"),
                    ],
                    false,
                    &[
                        opts.kubeadm_path.clone(),
                        "certs".into(),
                        "renew".into(),
                        name.to_string(),
                    ],
                )?;
                let after = staged_cert(&stage, dir, item).ok();
                if after.is_none() || after == before {
                    return Err(err(format!(
                        "kubeadm certs renew {name} did not renew '{}' (its output: {})",
                        item.path,
                        out.trim()
                    )));
                }
                issued.push(collect(root, &stage, dir, item, IdentityCheck::SameAsOld)?);
            }
        } else {
            // etcdadm keeps whatever leaf it finds: give it the CA only, as EKS Anywhere does.
            copy_tree(&root.join(dir), &stage, &|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f == "ca.crt" || f == "ca.key")
            })?;
            ctr.tool(
                &[(host.clone(), "/etc/etcd/pki")],
                true,
                &[
                    opts.etcdadm_path.clone(),
                    "join".into(),
                    "phase".into(),
                    "certificates".into(),
                    ETCDADM_DUMMY_URL.into(),
                    "--init-system".into(),
                    "kubelet".into(),
                ],
            )?;
            for item in &items {
                issued.push(collect(
                    root,
                    &stage,
                    dir,
                    item,
                    IdentityCheck::EtcdadmAsNodeConfigured,
                )?);
            }
        }
    }
    drop(staging);
    Ok(issued)
}

/// The staged copy of a path relative to the root.
fn staged(stage: &Path, dir: &str, rel: &str) -> Result<PathBuf, IssueError> {
    rel.strip_prefix(&format!("{dir}/"))
        .map(|r| stage.join(r))
        .ok_or_else(|| err(format!("'{rel}' is not under '{dir}'")))
}

fn read_staged(path: &Path) -> Result<Vec<u8>, IssueError> {
    fsutil::read_limited(path, &path.display().to_string(), MAX_PEM_FILE_BYTES)
        .map_err(|e| err(format!("the tool's output: {e}")))
}

/// The DER of the staged certificate of an item (a kubeconfig's embedded one).
fn staged_cert(stage: &Path, dir: &str, item: &Item) -> Result<Vec<u8>, IssueError> {
    let (cert, _) = staged_pair(stage, dir, item)?;
    Ok(Cert::from_pem(&cert).map_err(err)?.der)
}

/// The staged certificate and key PEM of an item; the key is scrubbed wherever it is dropped.
fn staged_pair(
    stage: &Path,
    dir: &str,
    item: &Item,
) -> Result<(Vec<u8>, zeroize::Zeroizing<Vec<u8>>), IssueError> {
    let path = staged(stage, dir, &item.path)?;
    if item.kind == Kind::Kubeconfig {
        let mut creds = Kubeconfig::parse(&zeroize::Zeroizing::new(read_staged(&path)?))
            .and_then(|k| k.credentials())
            .map_err(|e| err(format!("{}: the tool's kubeconfig: {e}", item.name)))?;
        // Moved out, not copied: `Credentials` scrubs only what it still holds.
        match (&mut creds.client_certificate, &mut creds.client_key) {
            (Source::Embedded(c), Source::Embedded(k)) => Ok((
                std::mem::take(c),
                zeroize::Zeroizing::new(std::mem::take(k)),
            )),
            _ => Err(err(format!(
                "{}: the tool's kubeconfig has no embedded client certificate",
                item.name
            ))),
        }
    } else {
        let key_path = staged(stage, dir, item.key_path.as_deref().unwrap_or_default())?;
        Ok((
            read_staged(&path)?,
            zeroize::Zeroizing::new(read_staged(&key_path)?),
        ))
    }
}

/// Turns what the tool wrote for `item` into an [`Issued`] on the live files.
fn collect(
    root: &Path,
    stage: &Path,
    dir: &str,
    item: &Item,
    identity: IdentityCheck,
) -> Result<Issued, IssueError> {
    let ctx = |e: &dyn fmt::Display| err(format!("{}: {e}", item.name));
    // The key is scrubbed on every path out of here, unless moved into `Issued` (which scrubs
    // its files).
    let (cert_pem, mut key_pem) = staged_pair(stage, dir, item)?;
    let new = Cert::from_pem(&cert_pem).map_err(|e| ctx(&e))?;
    let key = PrivateKey::from_pem(&key_pem).map_err(|e| ctx(&e))?;
    let ca = Cert::from_pem(&read_rel(root, &item.signer_cert_path)?).map_err(|e| ctx(&e))?;
    let live = zeroize::Zeroizing::new(read_rel(root, &item.path)?);
    let (old, files) = if item.kind == Kind::Kubeconfig {
        let mut kc = Kubeconfig::parse(&live).map_err(|e| ctx(&e))?;
        let old = match &kc.credentials().map_err(|e| ctx(&e))?.client_certificate {
            Source::Embedded(c) => Cert::from_pem(c).map_err(|e| ctx(&e))?,
            Source::File(_) => return Err(ctx(&"the client certificate is not embedded")),
        };
        let ca_pem = ca.to_pem().map_err(|e| ctx(&e))?;
        kc.replace_credentials(&cert_pem, &key_pem, ca_pem.as_bytes())
            .map_err(|e| ctx(&e))?;
        let yaml = kc.to_yaml().map_err(|e| ctx(&e))?.into_bytes();
        (old, vec![(item.path.clone(), yaml, 0o600)])
    } else {
        let old = Cert::from_pem(&live).map_err(|e| ctx(&e))?;
        let key_path = item.key_path.clone().unwrap_or_default();
        (
            old,
            vec![
                (key_path, std::mem::take(&mut *key_pem), 0o600),
                (item.path.clone(), cert_pem, 0o644),
            ],
        )
    };
    if old.der == new.der {
        return Err(ctx(&"the tool left the certificate unchanged"));
    }
    Ok(Issued {
        item: item.clone(),
        old,
        new,
        key,
        ca,
        files,
        identity,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn tool_output_never_carries_key_material() {
        let out = "renewed apiserver\n-----BEGIN RSA PRIVATE KEY-----\nMIIEsecret\n-----END RSA PRIVATE KEY-----\ndone";
        let r = redact_keys(out);
        assert_eq!(r, "renewed apiserver\n[private key redacted]\ndone");
        assert!(!r.contains("MIIEsecret"));
    }

    use super::*;

    #[test]
    fn host_paths_map_only_inside_a_bottlerocket_host_container() {
        let p = Path::new("/tmp/x/var/lib/certrotor/engine/1/0");
        assert_eq!(host_path(Path::new("/tmp/x"), p), p);
        let br = Path::new("/.bottlerocket/rootfs/var/lib/certrotor/engine/1/0");
        if !Path::new(BOTTLEROCKET_HOST_ROOT).exists() {
            // canonicalize fails on a missing root and falls back to the path itself.
            assert_eq!(
                host_path(Path::new(BOTTLEROCKET_HOST_ROOT), br),
                Path::new("/var/lib/certrotor/engine/1/0")
            );
        }
    }

    #[test]
    fn leftovers_of_live_certrotor_processes_are_kept() {
        assert!(!certrotor_alive(u32::MAX));
    }
}
