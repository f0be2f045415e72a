//! kubelet-sim: a test double for the kubelet's static-pod handling.
//!
//! certrotor restarts control-plane static pods by changing or moving their manifests, then waits
//! for the endpoints to come back. Tests cannot run a real kubelet, so this module imitates the part
//! of it that certrotor depends on:
//!
//! * it watches one manifest folder (polling), treating every regular file whose name does not
//!   start with a dot as a Pod manifest, with or without an extension (Bottlerocket writes
//!   `/etc/kubernetes/static-pods/<name>`, kubeadm `/etc/kubernetes/manifests/<name>.yaml`);
//! * a new manifest starts its pod after a start delay, a removed (or unparsable) one stops it, a
//!   changed one stops the old process and only then starts the new one;
//! * a process that exits by itself is restarted with a capped exponential back-off, like
//!   `CrashLoopBackOff` but shorter;
//! * a stop is SIGTERM, then SIGKILL after the grace period, then reap.
//!
//! It reports what it did in one JSON state file per pod (see [`PodState`]), whose history is never
//! shortened, so tests can assert "restarted exactly once" or "never two processes at once".
//!
//! # Where it differs from a real kubelet
//!
//! * **No containers.** Only the first container runs, as a plain host process: its `command`
//!   plus `args` (looked up through `PATH`) with its literal `env` values added to kubelet-sim's own
//!   environment. A container without `command` runs its image's entrypoint by a convention: the
//!   program named like the last part of the image repository
//!   (`public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0` runs `kube-vip`, whose real image's
//!   entrypoint is `/kube-vip`), then `args`. Images, probes, resources, init containers and
//!   `valueFrom` are ignored.
//! * **hostPath mounts are emulated by rewriting paths**, the one big difference: there are no
//!   mount namespaces, so every command element and env value that starts with a volumeMount's
//!   `mountPath` (on a path boundary; for `--flag=value` the value part) is rewritten to
//!   `<root>/<hostPath>` plus the rest, the longest `mountPath` winning. Paths *inside* files (a
//!   kubeconfig naming a certificate file) are not rewritten. A program that opens a default
//!   container path no argument names (kube-vip reads `/etc/kubernetes/admin.conf`) finds its
//!   host path in the environment variable `KUBELET_SIM_MOUNTS`, one `mountPath=<host path>`
//!   per line, which every pod gets; the k8s-sim stand-ins read it.
//! * **Host names**: with `--hostname NAME` every pod runs in a UTS namespace of its own with
//!   that host name (what pods with `hostNetwork` see on a real node: the node's name), so that
//!   lab nodes sharing one host have distinct lease holders. It needs root.
//! * **The kubelet's API port** is a stand-in ([`crate::recording_api`], `--serve-api`):
//!   per-request x509 authentication on keep-alive connections, pods' logs, `/healthz`; SIGUSR1
//!   closes its open connections, as a kubelet restart does.
//! * It ignores dotfiles (as the kubelet does) and also names ending in `~`, `.tmp`, `.swp` and
//!   `.swx` (editor and temp files, which a real kubelet would try to parse).
//! * `restarts` counts crash restarts over the whole life of the state file; a real kubelet makes a
//!   new pod with `restartCount` 0 when the manifest changes.
//! * The back-off is 1 s, 2 s, 4 s, 8 s, then 10 s (the kubelet's is 10 s doubling up to 5 min),
//!   and resets once a process has run for [`BACKOFF_RESET_AFTER`].
//! * No API server, no mirror pods, no node status.

// Implementation note: one thread does everything (scan, start, stop, reap), so the parent-death
// signal set in `pre_exec` always refers to the living main thread. Stops do not block the loop:
// a stopping pod is a phase that is checked every tick.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::prctl;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, sigaction};
use nix::unistd::{Pid, getppid};
use serde::{Deserialize, Serialize};

/// Command-line help, printed for `--help` and after usage errors.
pub const USAGE: &str = "\
Usage: kubelet-sim --manifests DIR --state-dir DIR [--root DIR] [--poll-ms 200]
                   [--start-delay-ms 1000] [--grace-seconds 5] [--log-dir DIR]
                   [--hostname NAME] [--serve-api IP:PORT --client-ca-file FILE --api-record FILE]

Test double for the kubelet's static-pod handling: runs the first container of each manifest
in DIR as a host process, rewriting hostPath mount paths to <root>/<hostPath>.

Options:
  --manifests DIR        static-pod manifest folder to watch
  --state-dir DIR        where <pod>.json state files are written
  --root DIR             prefix for hostPath volumes (default /)
  --poll-ms N            manifest folder poll interval in milliseconds (default 200)
  --start-delay-ms N     delay before a new or changed pod starts (default 1000)
  --grace-seconds N      SIGTERM-to-SIGKILL grace period (default 5)
  --log-dir DIR          append each pod's stdout/stderr to DIR/<pod>.log (default: inherit)
  --hostname NAME        run every pod in a UTS namespace of its own named NAME (needs root)
  --serve-api IP:PORT    serve a stand-in of the kubelet's API port (10250): /healthz and
                         /containerLogs, x509 authentication per request against
                         --client-ca-file, each request recorded in --api-record (JSON
                         lines); SIGUSR1 closes its open connections

Exit codes: 0 after SIGTERM/SIGINT (all pods stopped), 1 runtime error, 2 usage error.";

/// First crash-restart delay; doubled for each further crash in a row.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(1);

/// Longest crash-restart delay (the kubelet's is 5 minutes, far too long for tests).
pub const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A process that ran at least this long before exiting starts a fresh back-off sequence.
pub const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// Longest sleep of the main loop, so stops and exits are noticed promptly even with a slow poll.
const MAX_TICK: Duration = Duration::from_millis(50);

/// What kubelet-sim was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Static-pod manifest folder.
    pub manifests: PathBuf,
    /// Folder for `<pod>.json` state files.
    pub state_dir: PathBuf,
    /// Prefix for hostPath volumes.
    pub root: PathBuf,
    /// Manifest folder poll interval.
    pub poll: Duration,
    /// Delay before a new or changed pod starts.
    pub start_delay: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Folder for `<pod>.log` files; `None` inherits kubelet-sim's stdout and stderr.
    pub log_dir: Option<PathBuf>,
    /// The host name of every pod (each in a UTS namespace of its own); `None`: the host's.
    pub hostname: Option<String>,
    /// The kubelet API stand-in, when asked for.
    pub api: Option<crate::recording_api::ApiConfig>,
}

/// Result of parsing the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Run with this configuration.
    Run(Box<Config>),
    /// Print [`USAGE`] and exit successfully.
    Help,
}

/// State file contents, `<state-dir>/<pod>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    /// Pod name (`metadata.name`, or the manifest's file stem).
    pub name: String,
    /// Manifest path last seen for this pod.
    pub manifest: Option<String>,
    /// Whether that manifest is currently present and valid.
    #[serde(default)]
    pub manifest_present: bool,
    /// SHA-256 (hex) of the manifest bytes last seen.
    pub manifest_sha256: Option<String>,
    /// Whether a process of this pod is alive (including while it is being stopped).
    pub running: bool,
    /// Its process id.
    pub pid: Option<u32>,
    /// When it started, milliseconds since the Unix epoch.
    pub started_at_ms: Option<u64>,
    /// Crash restarts: starts after a process exited without being asked to.
    pub restarts: u64,
    /// The last start failure (for example "command not found"), cleared by a successful start.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Every process ever started for this pod, oldest first; never shortened.
    pub history: Vec<HistoryEntry>,
}

/// One process of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Process id.
    pub pid: u32,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Time it was reaped, milliseconds since the Unix epoch; `None` while alive.
    pub stopped_at_ms: Option<u64>,
    /// Exit status as printed by Rust (`exit status: 1`, `signal: 15 (SIGTERM)`).
    pub exit: Option<String>,
    /// Why it stopped: `exited by itself`, `manifest removed`, `manifest changed`,
    /// `kubelet-sim shutdown` or `lost (kubelet-sim restarted)`.
    #[serde(default)]
    pub reason: Option<String>,
    /// SHA-256 of the manifest it was started from.
    #[serde(default)]
    pub manifest_sha256: Option<String>,
}

/// What a manifest asks to run, after hostPath rewriting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Program and arguments (the container's `command` followed by its `args`).
    pub command: Vec<String>,
    /// Environment variables added to the process.
    pub env: Vec<(String, String)>,
    /// The hostPath mounts: (mountPath, path on the host).
    pub mounts: Vec<(String, String)>,
}

/// Errors that stop kubelet-sim.
#[derive(Debug)]
pub enum Error {
    /// The command line was wrong.
    Usage(String),
    /// A folder could not be created.
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    InstallSignalHandler(io::Error),
    /// `--hostname` without the privileges to give pods a UTS namespace.
    NotRoot,
    /// The kubelet API stand-in could not start.
    Api(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(message) => write!(f, "{message}; run 'kubelet-sim --help' for usage"),
            Error::CreateDir { path, source } => {
                write!(f, "failed to create folder '{}': {source}", path.display())
            }
            Error::InstallSignalHandler(source) => {
                write!(
                    f,
                    "failed to install SIGTERM/SIGINT/SIGUSR1 handlers: {source}"
                )
            }
            Error::NotRoot => write!(
                f,
                "'--hostname' gives every pod a UTS namespace of its own, which needs root; run \
                 kubelet-sim as root or without '--hostname'"
            ),
            Error::Api(reason) => write!(f, "failed to start the kubelet API stand-in: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// Parses the arguments after the program name. Accepts `--flag value` and `--flag=value`.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Invocation, Error> {
    let mut manifests = None;
    let mut state_dir = None;
    let mut config = Config {
        manifests: PathBuf::new(),
        state_dir: PathBuf::new(),
        root: PathBuf::from("/"),
        poll: Duration::from_millis(200),
        start_delay: Duration::from_millis(1000),
        grace: Duration::from_secs(5),
        log_dir: None,
        hostname: None,
        api: None,
    };
    let (mut serve_api, mut client_ca, mut record) = (None, None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(Invocation::Help);
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (arg.clone(), None),
        };
        let known = [
            "--manifests",
            "--state-dir",
            "--root",
            "--poll-ms",
            "--start-delay-ms",
            "--grace-seconds",
            "--log-dir",
            "--hostname",
            "--serve-api",
            "--client-ca-file",
            "--api-record",
        ];
        if !known.contains(&name.as_str()) {
            return Err(Error::Usage(format!("unknown argument '{arg}'")));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(value) => value,
            None => return Err(Error::Usage(format!("'{name}' needs a value"))),
        };
        let number = |value: &str| {
            value
                .parse::<u64>()
                .map_err(|_| Error::Usage(format!("'{name}' needs a whole number, got '{value}'")))
        };
        match name.as_str() {
            "--manifests" => manifests = Some(PathBuf::from(value)),
            "--state-dir" => state_dir = Some(PathBuf::from(value)),
            "--root" => config.root = PathBuf::from(value),
            "--poll-ms" => config.poll = Duration::from_millis(number(&value)?.max(1)),
            "--start-delay-ms" => config.start_delay = Duration::from_millis(number(&value)?),
            "--grace-seconds" => config.grace = Duration::from_secs(number(&value)?),
            "--hostname" => {
                let valid = !value.is_empty()
                    && value.len() <= 64
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
                if !valid {
                    return Err(Error::Usage(format!(
                        "'--hostname' needs a host name, got '{value}'"
                    )));
                }
                config.hostname = Some(value);
            }
            "--serve-api" => {
                serve_api =
                    Some(crate::recording_api::parse_address(&value).map_err(Error::Usage)?);
            }
            "--client-ca-file" => client_ca = Some(PathBuf::from(value)),
            "--api-record" => record = Some(PathBuf::from(value)),
            _ => config.log_dir = Some(PathBuf::from(value)),
        }
    }
    config.api = match (serve_api, client_ca, record) {
        (Some(address), Some(client_ca_file), Some(record_file)) => {
            Some(crate::recording_api::ApiConfig {
                address,
                client_ca_file,
                record_file,
            })
        }
        (None, None, None) => None,
        _ => {
            return Err(Error::Usage(
                "'--serve-api', '--client-ca-file' and '--api-record' go together".into(),
            ));
        }
    };
    config.manifests = manifests.ok_or_else(|| Error::Usage("'--manifests' is required".into()))?;
    config.state_dir = state_dir.ok_or_else(|| Error::Usage("'--state-dir' is required".into()))?;
    Ok(Invocation::Run(Box::new(config)))
}

/// Installs SIGTERM and SIGINT handlers that set the returned flag, which [`run`] watches.
pub fn install_signal_handlers() -> Result<&'static AtomicBool, Error> {
    // A handler, not a blocked set and sigwait: a blocked mask would be inherited by every pod
    // this process starts. nix has no safe way to install a handler.
    let action = SigAction::new(
        SigHandler::Handler(on_shutdown_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        #[allow(unsafe_code)]
        unsafe { sigaction(signal, &action) }
            .map_err(|errno| Error::InstallSignalHandler(errno.into()))?;
    }
    let drop_action = SigAction::new(
        SigHandler::Handler(on_drop_connections_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    #[allow(unsafe_code)]
    unsafe { sigaction(Signal::SIGUSR1, &drop_action) }
        .map_err(|errno| Error::InstallSignalHandler(errno.into()))?;
    Ok(&SHUTDOWN)
}

/// Runs until `shutdown` becomes true, then stops every pod and returns.
pub fn run(config: &Config, shutdown: &AtomicBool) -> Result<(), Error> {
    for dir in [Some(&config.state_dir), config.log_dir.as_ref()]
        .into_iter()
        .flatten()
    {
        fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    if config.hostname.is_some() && !nix::unistd::geteuid().is_root() {
        return Err(Error::NotRoot);
    }
    log(format_args!(
        "watching '{}' every {} ms, state in '{}', hostPath root '{}'{}",
        config.manifests.display(),
        config.poll.as_millis(),
        config.state_dir.display(),
        config.root.display(),
        config
            .hostname
            .as_deref()
            .map(|h| format!(", pods' host name '{h}'"))
            .unwrap_or_default()
    ));
    let api = match &config.api {
        Some(api) => {
            let server = crate::recording_api::Server::start(
                api,
                crate::recording_api::Personality::Kubelet {
                    log_dir: config.log_dir.clone(),
                },
            )
            .map_err(Error::Api)?;
            log(format_args!(
                "kubelet API stand-in on https://{}, requests recorded in '{}'",
                server.address(),
                api.record_file.display()
            ));
            Some(server)
        }
        None => None,
    };
    let tick = config.poll.min(MAX_TICK);
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let mut reported = HashSet::new();
    let mut next_scan = Instant::now();
    while !shutdown.load(Ordering::SeqCst) {
        if DROP_CONNECTIONS.swap(false, Ordering::SeqCst)
            && let Some(server) = &api
        {
            let n = server.drop_connections();
            log(format_args!(
                "SIGUSR1: closed {n} kubelet API connection(s)"
            ));
        }
        let now = Instant::now();
        if now >= next_scan {
            next_scan = now + config.poll;
            if let Some(mut desired) = scan(&config.manifests, &config.root, &mut reported) {
                for name in desired.keys() {
                    if !pods.contains_key(name) {
                        let pod = Pod::new(name, &config.state_dir);
                        pods.insert(name.clone(), pod);
                    }
                }
                for (name, pod) in &mut pods {
                    pod.reconcile(desired.remove(name), config, now);
                }
            }
        }
        for pod in pods.values_mut() {
            pod.step(config, Instant::now());
            pod.save(&config.state_dir);
        }
        thread::sleep(tick);
    }
    log(format_args!("shutting down: stopping all pods"));
    let now = Instant::now();
    for pod in pods.values_mut() {
        pod.desired = None;
        pod.state.manifest_present = false;
        pod.begin_stop("kubelet-sim shutdown", config, now);
    }
    while pods.values().any(|pod| !matches!(pod.phase, Phase::Idle)) {
        for pod in pods.values_mut() {
            pod.step(config, Instant::now());
            pod.save(&config.state_dir);
        }
        thread::sleep(Duration::from_millis(10));
    }
    for pod in pods.values_mut() {
        pod.save(&config.state_dir);
    }
    log(format_args!("all pods stopped"));
    Ok(())
}

/// Parses a Pod manifest and rewrites hostPath mount paths to `root/<hostPath>`.
///
/// `file_stem` names the pod when the manifest has no `metadata.name`.
pub fn parse_manifest(text: &str, file_stem: &str, root: &Path) -> Result<PodSpec, String> {
    let pod: PodYaml = serde_norway::from_str(text).map_err(|error| error.to_string())?;
    if let Some(kind) = &pod.kind
        && kind != "Pod"
    {
        return Err(format!("kind is '{kind}', not 'Pod'"));
    }
    let name = pod
        .metadata
        .and_then(|metadata| metadata.name)
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| file_stem.to_string());
    if name.contains('/') || name.starts_with('.') {
        return Err(format!("pod name '{name}' is not a valid file name"));
    }
    let Some(container) = pod.spec.containers.into_iter().next() else {
        return Err("spec.containers is empty".to_string());
    };
    let entrypoint = if container.command.is_empty() {
        let program = container
            .image
            .as_deref()
            .and_then(entrypoint_of)
            .ok_or_else(|| {
                format!(
                    "container '{}' has no command and no image repository to name its \
                     entrypoint by",
                    container.name.clone().unwrap_or_default()
                )
            })?;
        vec![program]
    } else {
        container.command.clone()
    };
    let mut mounts = Vec::new();
    for mount in &container.volume_mounts {
        let host_path = pod
            .spec
            .volumes
            .iter()
            .find(|volume| volume.name == mount.name)
            .and_then(|volume| volume.host_path.as_ref());
        if let Some(host_path) = host_path {
            let target = root.join(host_path.path.trim_start_matches('/'));
            mounts.push((
                mount.mount_path.clone(),
                target.to_string_lossy().into_owned(),
            ));
        }
    }
    let command = entrypoint
        .iter()
        .chain(&container.args)
        .map(|arg| rewrite_arg(arg, &mounts))
        .collect();
    let env = container
        .env
        .into_iter()
        .filter_map(|var| {
            let value = var.value?;
            Some((var.name, rewrite_path(&value, &mounts)))
        })
        .collect();
    Ok(PodSpec {
        name,
        command,
        env,
        mounts,
    })
}

/// The program kubelet-sim runs for an image's entrypoint: the last part of the image
/// repository, without tag or digest (`ghcr.io/kube-vip/kube-vip:v0.8.9` → `kube-vip`).
pub fn entrypoint_of(image: &str) -> Option<String> {
    let image = image.split('@').next()?;
    let last = image.rsplit('/').next()?;
    let name = last.split(':').next()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// Rewrites one command element: the value of `--flag=value`, otherwise the whole element.
pub fn rewrite_arg(arg: &str, mounts: &[(String, String)]) -> String {
    if arg.starts_with('-')
        && let Some((flag, value)) = arg.split_once('=')
    {
        return format!("{flag}={}", rewrite_path(value, mounts));
    }
    rewrite_path(arg, mounts)
}

/// Rewrites `value` if it starts with a mount path on a path boundary; the longest mount path wins.
///
/// `mounts` holds `(mountPath, host target)` pairs.
pub fn rewrite_path(value: &str, mounts: &[(String, String)]) -> String {
    let mut best: Option<(usize, String)> = None;
    for (mount_path, target) in mounts {
        let mount = match mount_path.trim_end_matches('/') {
            "" => "/",
            trimmed => trimmed,
        };
        let Some(rest) = value.strip_prefix(mount) else {
            continue;
        };
        let on_boundary = rest.is_empty() || rest.starts_with('/') || mount == "/";
        if !on_boundary
            || best
                .as_ref()
                .is_some_and(|(length, _)| *length >= mount.len())
        {
            continue;
        }
        let rest = rest.trim_start_matches('/');
        let rewritten = if rest.is_empty() {
            target.clone()
        } else {
            format!("{}/{rest}", target.trim_end_matches('/'))
        };
        best = Some((mount.len(), rewritten));
    }
    best.map_or_else(|| value.to_string(), |(_, rewritten)| rewritten)
}

/// Crash-restart delay after `crashes_in_a_row` earlier crashes: 1 s, 2 s, 4 s, 8 s, 10 s, 10 s…
pub fn backoff(crashes_in_a_row: u32) -> Duration {
    let factor = 1u32 << crashes_in_a_row.min(16);
    BACKOFF_INITIAL.saturating_mul(factor).min(BACKOFF_MAX)
}

/// Whether a file in the manifest folder is skipped: dotfiles, editor and temp files.
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || [".tmp", ".swp", ".swx"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
}

// === Manifest YAML ===

#[derive(Deserialize)]
struct PodYaml {
    kind: Option<String>,
    metadata: Option<MetadataYaml>,
    spec: PodSpecYaml,
}

#[derive(Deserialize)]
struct MetadataYaml {
    name: Option<String>,
}

#[derive(Deserialize)]
struct PodSpecYaml {
    #[serde(default)]
    containers: Vec<ContainerYaml>,
    #[serde(default)]
    volumes: Vec<VolumeYaml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerYaml {
    name: Option<String>,
    image: Option<String>,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvYaml>,
    #[serde(default)]
    volume_mounts: Vec<VolumeMountYaml>,
}

#[derive(Deserialize)]
struct EnvYaml {
    name: String,
    value: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeMountYaml {
    name: String,
    mount_path: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeYaml {
    name: String,
    host_path: Option<HostPathYaml>,
}

#[derive(Deserialize)]
struct HostPathYaml {
    path: String,
}

// === Scanning ===

/// A valid manifest found in the folder.
#[derive(Debug, Clone)]
struct Desired {
    path: PathBuf,
    sha256: String,
    spec: PodSpec,
}

/// Reads the manifest folder. A missing folder means no pods; other read errors return `None` so
/// that a transient failure does not stop every pod. Problems are logged once per file version.
fn scan(
    dir: &Path,
    root: &Path,
    reported: &mut HashSet<(PathBuf, String)>,
) -> Option<BTreeMap<String, Desired>> {
    let mut found = BTreeMap::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Some(found),
        Err(error) => {
            log(format_args!(
                "failed to read manifest folder '{}': {error}",
                dir.display()
            ));
            return None;
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| !is_ignored_name(name))
        })
        .collect();
    paths.sort();
    for path in paths {
        if !fs::metadata(&path).is_ok_and(|metadata| metadata.is_file()) {
            continue;
        }
        let Ok(bytes) = fs::read(&path) else {
            continue;
        };
        let sha256 = sha256_hex(&bytes);
        let stem = path
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let mut report = |message: String| {
            if reported.insert((path.clone(), format!("{sha256}{message}"))) {
                log(format_args!(
                    "ignoring manifest '{}': {message}",
                    path.display()
                ));
            }
        };
        match parse_manifest(&text, &stem, root) {
            Ok(spec) => {
                if let Some(first) = found.get(&spec.name) {
                    let first: &Desired = first;
                    report(format!(
                        "pod '{}' is already defined by '{}'",
                        spec.name,
                        first.path.display()
                    ));
                    continue;
                }
                found.insert(
                    spec.name.clone(),
                    Desired {
                        path: path.clone(),
                        sha256,
                        spec,
                    },
                );
            }
            Err(message) => report(message),
        }
    }
    Some(found)
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    base16ct::lower::encode_string(digest.as_ref())
}

// === Pods ===

enum Phase {
    /// No process, nothing to start.
    Idle,
    /// Waiting to start: after a new or changed manifest, or in crash back-off.
    Waiting {
        start_at: Instant,
        after_crash: bool,
    },
    Running {
        child: Child,
        started: Instant,
    },
    Stopping {
        child: Child,
        kill_at: Instant,
        killed: bool,
        reason: &'static str,
    },
}

struct Pod {
    desired: Option<Desired>,
    phase: Phase,
    state: PodState,
    crashes_in_a_row: u32,
    dirty: bool,
}

impl Pod {
    /// A pod seen for the first time; history is taken over from an earlier state file.
    fn new(name: &str, state_dir: &Path) -> Pod {
        let mut state = fs::read(state_path(state_dir, name))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<PodState>(&bytes).ok())
            .unwrap_or_else(|| PodState {
                name: name.to_string(),
                manifest: None,
                manifest_present: false,
                manifest_sha256: None,
                running: false,
                pid: None,
                started_at_ms: None,
                restarts: 0,
                last_error: None,
                history: Vec::new(),
            });
        state.name = name.to_string();
        state.running = false;
        state.pid = None;
        state.started_at_ms = None;
        for entry in &mut state.history {
            if entry.stopped_at_ms.is_none() {
                entry.stopped_at_ms = Some(now_ms());
                entry.reason = Some("lost (kubelet-sim restarted)".to_string());
            }
        }
        Pod {
            desired: None,
            phase: Phase::Idle,
            state,
            crashes_in_a_row: 0,
            dirty: true,
        }
    }

    /// Takes in what the manifest folder now says about this pod.
    fn reconcile(&mut self, desired: Option<Desired>, config: &Config, now: Instant) {
        let changed = match (&self.desired, &desired) {
            (Some(old), Some(new)) => old.sha256 != new.sha256 || old.path != new.path,
            (None, None) => false,
            _ => true,
        };
        if !changed {
            return;
        }
        let reason = if desired.is_some() {
            "manifest changed"
        } else {
            "manifest removed"
        };
        match &desired {
            Some(new) => {
                log(format_args!(
                    "pod '{}': manifest '{}' ({})",
                    self.state.name,
                    new.path.display(),
                    if self.desired.is_some() {
                        "changed"
                    } else {
                        "added"
                    }
                ));
                self.state.manifest = Some(new.path.to_string_lossy().into_owned());
                self.state.manifest_sha256 = Some(new.sha256.clone());
                self.state.manifest_present = true;
            }
            None => {
                log(format_args!("pod '{}': manifest removed", self.state.name));
                self.state.manifest_present = false;
            }
        }
        self.desired = desired;
        self.dirty = true;
        match &self.phase {
            Phase::Running { .. } => self.begin_stop(reason, config, now),
            Phase::Stopping { .. } => {}
            Phase::Idle | Phase::Waiting { .. } => {
                self.crashes_in_a_row = 0;
                self.phase = self.after_stop(config, now);
            }
        }
    }

    /// Sends SIGTERM to a running process; SIGKILL follows after the grace period.
    /// The phase after a stop (or with nothing running): a start after the start delay while a
    /// manifest is wanted, else idle.
    fn after_stop(&self, config: &Config, now: Instant) -> Phase {
        if self.desired.is_some() {
            Phase::Waiting {
                start_at: now + config.start_delay,
                after_crash: false,
            }
        } else {
            Phase::Idle
        }
    }

    fn begin_stop(&mut self, reason: &'static str, config: &Config, now: Instant) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Running { child, .. } => {
                log(format_args!(
                    "pod '{}': stopping pid {} ({reason})",
                    self.state.name,
                    child.id()
                ));
                send_signal(&child, Signal::SIGTERM);
                self.phase = Phase::Stopping {
                    child,
                    kill_at: now + config.grace,
                    killed: false,
                    reason,
                };
            }
            Phase::Stopping {
                child,
                kill_at,
                killed,
                ..
            } => {
                self.phase = Phase::Stopping {
                    child,
                    kill_at,
                    killed,
                    reason,
                };
            }
            Phase::Idle | Phase::Waiting { .. } => {}
        }
        self.dirty = true;
    }

    /// Advances the pod: reaps exits, escalates stops, starts due processes.
    fn step(&mut self, config: &Config, now: Instant) {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Idle => {}
            Phase::Running { mut child, started } => match child.try_wait() {
                Ok(Some(status)) => {
                    self.record_exit(&child, status, "exited by itself");
                    if started.elapsed() >= BACKOFF_RESET_AFTER {
                        self.crashes_in_a_row = 0;
                    }
                    let delay = backoff(self.crashes_in_a_row);
                    self.crashes_in_a_row = self.crashes_in_a_row.saturating_add(1);
                    log(format_args!(
                        "pod '{}': pid {} exited by itself ({status}); restarting in {} ms",
                        self.state.name,
                        child.id(),
                        delay.as_millis()
                    ));
                    self.phase = Phase::Waiting {
                        start_at: now + delay,
                        after_crash: true,
                    };
                }
                Ok(None) => self.phase = Phase::Running { child, started },
                Err(error) => {
                    log(format_args!(
                        "pod '{}': failed to check pid {}: {error}",
                        self.state.name,
                        child.id()
                    ));
                    self.phase = Phase::Running { child, started };
                }
            },
            Phase::Stopping {
                mut child,
                kill_at,
                mut killed,
                reason,
            } => match child.try_wait() {
                Ok(Some(status)) => {
                    self.record_exit(&child, status, reason);
                    log(format_args!(
                        "pod '{}': pid {} stopped ({status})",
                        self.state.name,
                        child.id()
                    ));
                    self.phase = self.after_stop(config, now);
                }
                _ => {
                    if !killed && now >= kill_at {
                        log(format_args!(
                            "pod '{}': pid {} still running after the grace period; sending SIGKILL",
                            self.state.name,
                            child.id()
                        ));
                        send_signal(&child, Signal::SIGKILL);
                        killed = true;
                    }
                    self.phase = Phase::Stopping {
                        child,
                        kill_at,
                        killed,
                        reason,
                    };
                }
            },
            Phase::Waiting {
                start_at,
                after_crash,
            } => {
                self.phase = Phase::Waiting {
                    start_at,
                    after_crash,
                };
                if now >= start_at {
                    self.start(config, now, after_crash);
                }
            }
        }
    }

    fn start(&mut self, config: &Config, now: Instant, after_crash: bool) {
        let Some(desired) = &self.desired else {
            self.phase = Phase::Idle;
            return;
        };
        match spawn(
            &desired.spec,
            config.log_dir.as_deref(),
            config.hostname.as_deref(),
        ) {
            Ok(child) => {
                let started_at_ms = now_ms();
                log(format_args!(
                    "pod '{}': started pid {}: {}",
                    self.state.name,
                    child.id(),
                    desired.spec.command.join(" ")
                ));
                if after_crash {
                    self.state.restarts += 1;
                }
                self.state.running = true;
                self.state.pid = Some(child.id());
                self.state.started_at_ms = Some(started_at_ms);
                self.state.last_error = None;
                self.state.history.push(HistoryEntry {
                    pid: child.id(),
                    started_at_ms,
                    stopped_at_ms: None,
                    exit: None,
                    reason: None,
                    manifest_sha256: Some(desired.sha256.clone()),
                });
                self.phase = Phase::Running {
                    child,
                    started: now,
                };
            }
            Err(error) => {
                let delay = backoff(self.crashes_in_a_row);
                self.crashes_in_a_row = self.crashes_in_a_row.saturating_add(1);
                let message = format!(
                    "failed to start '{}': {error}",
                    desired.spec.command.first().map_or("", String::as_str)
                );
                log(format_args!(
                    "pod '{}': {message}; retrying in {} ms",
                    self.state.name,
                    delay.as_millis()
                ));
                self.state.last_error = Some(message);
                self.phase = Phase::Waiting {
                    start_at: now + delay,
                    after_crash,
                };
            }
        }
        self.dirty = true;
    }

    fn record_exit(&mut self, child: &Child, status: ExitStatus, reason: &str) {
        let pid = child.id();
        if let Some(entry) = self
            .state
            .history
            .iter_mut()
            .rev()
            .find(|entry| entry.pid == pid && entry.stopped_at_ms.is_none())
        {
            entry.stopped_at_ms = Some(now_ms());
            entry.exit = Some(status.to_string());
            entry.reason = Some(reason.to_string());
        }
        self.state.running = false;
        self.state.pid = None;
        self.state.started_at_ms = None;
        self.dirty = true;
    }

    /// Writes the state file if anything changed; a failure is logged and retried next tick.
    fn save(&mut self, state_dir: &Path) {
        if !self.dirty {
            return;
        }
        let path = state_path(state_dir, &self.state.name);
        match write_atomically(&path, &self.state) {
            Ok(()) => self.dirty = false,
            Err(error) => log(format_args!(
                "failed to write state file '{}': {error}",
                path.display()
            )),
        }
    }
}

/// The state file of pod `name`.
pub fn state_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(format!("{name}.json"))
}

fn write_atomically(path: &Path, state: &PodState) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    let file_name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.tmp"));
    let mut file = File::create(&temp)?;
    file.write_all(&bytes)?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    fs::rename(&temp, path)
}

fn spawn(spec: &PodSpec, log_dir: Option<&Path>, hostname: Option<&str>) -> io::Result<Child> {
    let Some((program, args)) = spec.command.split_first() else {
        return Err(io::Error::other("empty command"));
    };
    // A container path like /usr/local/bin/kube-apiserver rarely exists on the host; fall back to
    // a PATH lookup of its file name.
    let program = if program.contains('/') && !Path::new(program).exists() {
        Path::new(program).file_name().map_or_else(
            || program.clone(),
            |name| name.to_string_lossy().into_owned(),
        )
    } else {
        program.clone()
    };
    let mut command = Command::new(&program);
    let mounts: String = spec
        .mounts
        .iter()
        .map(|(mount, host)| format!("{mount}={host}\n"))
        .collect();
    command
        .args(args)
        .env(MOUNTS_ENV, mounts)
        .envs(spec.env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null());
    if let Some(dir) = log_dir {
        let path = dir.join(format!("{}.log", spec.name));
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        writeln!(
            file,
            "==== kubelet-sim {}: starting {}",
            now_ms(),
            spec.command.join(" ")
        )?;
        command.stdout(file.try_clone()?).stderr(file);
    }
    let parent = std::process::id();
    // Made before the fork: the closure must not allocate.
    let hostname = hostname.map(std::ffi::OsString::from);
    // SAFETY (`pre_exec` has no safe form): the closure runs between fork and exec and only
    // calls async-signal-safe functions (prctl, getppid, unshare, sethostname: system calls)
    // without allocating. PR_SET_PDEATHSIG kills the child when the forking thread
    // (kubelet-sim's only thread that spawns) dies; the getppid check closes the race where
    // kubelet-sim died before prctl ran.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            if u32::try_from(getppid().as_raw()).ok() != Some(parent) {
                return Err(io::Error::other("kubelet-sim exited during start"));
            }
            if let Some(name) = &hostname {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUTS)?;
                nix::unistd::sethostname(name)?;
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Signals a child that is not yet reaped, so its pid still names it.
fn send_signal(child: &Child, signal: Signal) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let _ = kill(Pid::from_raw(pid), signal);
}

fn now_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX)
}

fn log(message: fmt::Arguments<'_>) {
    eprintln!("kubelet-sim: {message}");
}

static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Set by SIGUSR1: close the kubelet API stand-in's connections.
static DROP_CONNECTIONS: AtomicBool = AtomicBool::new(false);

/// The environment variable with every pod's mounts (see the module documentation).
pub const MOUNTS_ENV: &str = "KUBELET_SIM_MOUNTS";

extern "C" fn on_shutdown_signal(_signal: nix::libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

extern "C" fn on_drop_connections_signal(_signal: nix::libc::c_int) {
    DROP_CONNECTIONS.store(true, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts() -> Vec<(String, String)> {
        vec![
            (
                "/etc/kubernetes/pki".into(),
                "/r/var/lib/kubeadm/pki".into(),
            ),
            ("/etc/kubernetes/pki/etcd".into(), "/r/etcd-pki".into()),
            ("/etc/kubernetes/".into(), "/r/etc/k".into()),
        ]
    }

    fn check_rewrite(input: &str, expected: &str) {
        assert_eq!(rewrite_arg(input, &mounts()), expected, "input {input:?}");
    }

    #[test]
    fn rewrites_paths_on_boundaries_longest_first() {
        check_rewrite("/etc/kubernetes/pki", "/r/var/lib/kubeadm/pki");
        check_rewrite(
            "/etc/kubernetes/pki/ca.crt",
            "/r/var/lib/kubeadm/pki/ca.crt",
        );
        check_rewrite("/etc/kubernetes/pki/etcd/ca.crt", "/r/etcd-pki/ca.crt");
        check_rewrite(
            "--etcd-cafile=/etc/kubernetes/pki/etcd/ca.crt",
            "--etcd-cafile=/r/etcd-pki/ca.crt",
        );
        check_rewrite("/etc/kubernetes/pkix/a", "/r/etc/k/pkix/a");
        check_rewrite("/etc/kubernetes/admin.conf", "/r/etc/k/admin.conf");
        check_rewrite("/etc/kubernetesx", "/etc/kubernetesx");
        check_rewrite("--secure-port=6443", "--secure-port=6443");
        check_rewrite("kube-apiserver", "kube-apiserver");
        check_rewrite("x=/etc/kubernetes/pki", "x=/etc/kubernetes/pki");
    }

    #[test]
    fn parses_manifest_with_host_path_rewrite() {
        let text = r#"
apiVersion: v1
kind: Pod
metadata:
  name: kube-apiserver
  namespace: kube-system
spec:
  containers:
  - name: kube-apiserver
    image: registry.k8s.io/kube-apiserver:v1.31.0
    command:
    - kube-apiserver
    - --tls-cert-file=/etc/kubernetes/pki/apiserver.crt
    args: ["/etc/kubernetes/pki"]
    env:
    - name: DIR
      value: /etc/kubernetes/pki/x
    - name: FROM
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    volumeMounts:
    - {name: k8s-certs, mountPath: /etc/kubernetes/pki, readOnly: true}
    - {name: empty, mountPath: /cache}
  volumes:
  - {name: k8s-certs, hostPath: {path: /var/lib/kubeadm/pki, type: DirectoryOrCreate}}
  - {name: empty, emptyDir: {}}
"#;
        let spec = parse_manifest(text, "ignored", Path::new("/tmp/root")).unwrap();
        assert_eq!(spec.name, "kube-apiserver");
        assert_eq!(
            spec.command,
            [
                "kube-apiserver",
                "--tls-cert-file=/tmp/root/var/lib/kubeadm/pki/apiserver.crt",
                "/tmp/root/var/lib/kubeadm/pki",
            ]
        );
        assert_eq!(
            spec.env,
            [(
                "DIR".to_string(),
                "/tmp/root/var/lib/kubeadm/pki/x".to_string()
            )]
        );
    }

    #[test]
    fn manifest_errors_and_name_fallback() {
        let spec = parse_manifest(
            "spec: {containers: [{command: [sleep, '9']}]}",
            "stem",
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(spec.name, "stem");
        let error = parse_manifest("kind: Service\nspec: {}", "s", Path::new("/")).unwrap_err();
        assert_eq!(error, "kind is 'Service', not 'Pod'");
        let error =
            parse_manifest("spec: {containers: [{name: c}]}", "s", Path::new("/")).unwrap_err();
        assert!(error.contains("has no command and no image"), "{error}");
        // No command: the image's entrypoint by its repository's last part, then args.
        let spec = parse_manifest(
            "spec:\n  containers:\n  - args: [manager]\n    \
             image: public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0-eks-a-v0.19.0-dev-build.30\n    \
             volumeMounts: [{name: k, mountPath: /etc/kubernetes/admin.conf}]\n  \
             volumes: [{name: k, hostPath: {path: /var/lib/kubeadm/admin.conf, type: File}}]\n",
            "kube-vip",
            Path::new("/r"),
        )
        .unwrap();
        assert_eq!(spec.command, ["kube-vip", "manager"]);
        assert_eq!(
            spec.mounts,
            [(
                "/etc/kubernetes/admin.conf".to_string(),
                "/r/var/lib/kubeadm/admin.conf".to_string()
            )]
        );
        assert_eq!(entrypoint_of("host:5000/a/b@sha256:00"), Some("b".into()));
        assert_eq!(entrypoint_of("etcd"), Some("etcd".into()));
        assert!(parse_manifest("spec: [", "s", Path::new("/")).is_err());
        let error = parse_manifest(
            "metadata: {name: ../x}\nspec: {containers: [{command: [a]}]}",
            "s",
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(error, "pod name '../x' is not a valid file name");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let seconds: Vec<u64> = (0..7).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(seconds, [1, 2, 4, 8, 10, 10, 10]);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn ignored_names() {
        for name in [
            ".kube-apiserver.yaml",
            ".tmp123",
            "a.yaml~",
            "a.swp",
            "a.yaml.tmp",
        ] {
            assert!(is_ignored_name(name), "{name}");
        }
        for name in ["kube-apiserver", "kube-apiserver.yaml", "etcd.json"] {
            assert!(!is_ignored_name(name), "{name}");
        }
    }

    #[test]
    fn parses_arguments() {
        let args = |list: &[&str]| parse_args(list.iter().map(|arg| arg.to_string()));
        let Ok(Invocation::Run(config)) = args(&[
            "--manifests",
            "/m",
            "--state-dir=/s",
            "--poll-ms",
            "50",
            "--start-delay-ms=0",
            "--grace-seconds",
            "1",
            "--log-dir",
            "/l",
            "--root",
            "/r",
        ]) else {
            panic!("expected a configuration");
        };
        assert_eq!(config.manifests, Path::new("/m"));
        assert_eq!(config.state_dir, Path::new("/s"));
        assert_eq!(config.root, Path::new("/r"));
        assert_eq!(config.poll, Duration::from_millis(50));
        assert_eq!(config.start_delay, Duration::ZERO);
        assert_eq!(config.grace, Duration::from_secs(1));
        assert_eq!(config.log_dir.as_deref(), Some(Path::new("/l")));
        assert_eq!(args(&["--help"]).unwrap(), Invocation::Help);
        let Ok(Invocation::Run(config)) = args(&[
            "--manifests=/m",
            "--state-dir=/s",
            "--hostname=cp-2",
            "--serve-api=127.0.0.1:10250",
            "--client-ca-file=/ca.crt",
            "--api-record=/r.jsonl",
        ]) else {
            panic!("expected a configuration");
        };
        assert_eq!(config.hostname.as_deref(), Some("cp-2"));
        assert_eq!(
            config.api.unwrap().address,
            "127.0.0.1:10250".parse().unwrap()
        );
        assert!(
            args(&[
                "--manifests=/m",
                "--state-dir=/s",
                "--serve-api=127.0.0.1:1"
            ])
            .is_err()
        );
        assert!(args(&["--manifests=/m", "--state-dir=/s", "--hostname=a/b"]).is_err());
        let message = args(&["--manifests", "/m"]).unwrap_err().to_string();
        assert_eq!(
            message,
            "'--state-dir' is required; run 'kubelet-sim --help' for usage"
        );
        assert!(args(&["--bogus"]).is_err());
        assert!(args(&["--poll-ms", "x", "--manifests", "/m", "--state-dir", "/s"]).is_err());
    }
}
