//! The containerd side of the kubeadm engine: find the image (host-containerd first, then the
//! kubelet's containerd), and run the tools with the host's `ctr run --rm` in containers that are
//! removed whatever the outcome, even after a killed run.

use super::*;
use crate::node::catalog::paths::BOTTLEROCKET_HOST_ROOT;
use crate::renew::IssueError;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The containerd side: ctr, socket, namespace, image; container names.
pub(super) struct Ctr {
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
    pub(super) fn remove_leftovers(&self) -> Result<(), IssueError> {
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
    pub(super) fn tool(
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
pub(super) fn redact_keys(output: &str) -> String {
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
pub(super) fn certrotor_alive(pid: u32) -> bool {
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
pub(super) fn host_path(root: &Path, path: &Path) -> PathBuf {
    let canonical = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    if canonical == Path::new(BOTTLEROCKET_HOST_ROOT)
        && let Ok(rel) = path.strip_prefix(root)
    {
        return Path::new("/").join(rel);
    }
    path.to_path_buf()
}

pub(super) fn default_ctr() -> PathBuf {
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
pub(super) fn locate(opts: &KubeadmOptions, image: &str, ctr: &Path) -> Result<Ctr, IssueError> {
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

pub(super) fn resolve_image(opts: &KubeadmOptions) -> Result<String, IssueError> {
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
