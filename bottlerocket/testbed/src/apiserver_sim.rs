//! TEST DOUBLE: an emulator of the Bottlerocket API server (`apiserver`) and of the part of its
//! config applier that certrotor depends on (`thar-be-settings` running `/usr/bin/static-pods`).
//! It exists so that the agent's API client and restart logic can be tested against the real
//! contract, on a Unix socket, without a Bottlerocket host, including the ways the real server
//! fails. Nothing in production uses it.
//!
//! # What it imitates (bottlerocket-api.md §1.2–1.4, §2.1, and the v1.20.5 server as measured)
//! - HTTP/1.1 on a Unix socket (mode 0660); the routes `GET /`, `GET /settings` (`?keys=`,
//!   `?prefix=`), `PATCH /settings`, `GET|DELETE /tx`, `GET /tx/list`, `POST /tx/commit`,
//!   `POST /tx/apply`, `POST /tx/commit_and_apply`, `GET /os` (semver `version_id`),
//!   `GET /metadata/affected-services`; `PATCH /settings/keypair` only with `--keypair` (404 in
//!   v1.20.5). Status codes, bodies and content types as in `routes`: the server's own errors
//!   without a content type, actix's `text/plain`, the 204 of `/tx/apply` with a JSON content
//!   type and an unframed `null`, JSON object keys and key lists in an order that changes
//!   between calls.
//! - Validation against a subset of the settings model with serde's own error texts, actix's
//!   content type check, and its 2 MiB JSON limit the way a client sees it: a bigger body gets
//!   a 413 written without the body being read, and the connection closed, so a client still
//!   sending several MiB sees the connection drop (EPIPE or reset) and no response.
//! - Per-transaction pending changes (default transaction `default`), commit without diff that
//!   returns every pending key, 422 `Tried to commit with no pending changes`. Pending
//!   transactions persist on disk (`ROOT/var/lib/bottlerocket-sim/pending/`) across restarts of
//!   the emulator, and are cleared only by their commit, `DELETE /tx?tx=`, or a boot.
//! - Asynchronous apply: `commit_and_apply` answers at once; a background thread, after
//!   `--apply-delay-ms`, reads the live settings and, if the applied keys touch
//!   `settings.kubernetes.static-pods` (or on a keyless `/tx/apply`), renders *every* static pod
//!   to `ROOT/etc/kubernetes/static-pods/<name>` (write or remove) as `/usr/bin/static-pods`
//!   does; every enabled manifest is rewritten on every run (new inode, same bytes).
//!   `POST /tx/apply?keys=<full key>` re-runs it for the services those keys affect.
//! - Boots and restarts: static pods are rendered only at a *boot*, as on Bottlerocket, where
//!   `/etc` is a tmpfs and only the boot's settings-applier renders them. A start is a boot when
//!   `ROOT/run/bottlerocket-sim/boot-id` does not hold the kernel's boot id (a fresh root, or
//!   `ROOT/run` wiped as a tmpfs is at a reboot), or with `--boot`; a boot also clears pending
//!   transactions (storewolf). Any other start is an API server restart (systemd's
//!   `Restart=always`): nothing is re-rendered, pending transactions are kept.
//!
//! # Faults a test switches on (see `faults`)
//! One JSON document, given at start with `--faults FILE` and replaced at any time through the
//! control socket (`--control PATH`, HTTP/1.1 like the API, see `control`): `PUT /faults`,
//! `GET /faults`, `POST /restart` (restart now), `GET /events` (what the emulator did: boots,
//! restarts, faults fired, applier runs rendered, failed or lost), `GET /status`.
//! - Restart triggers: "restart for 5 s before the next PATCH that sets
//!   `settings.kubernetes.static-pods.*.enabled` to true", "restart right after answering the
//!   next `commit_and_apply`", "commit but never answer". While down, connections are refused
//!   (the socket file stays, as after a SIGKILL, unless `remove_socket`), open connections are
//!   dropped, and config-applier runs not yet started are lost (the commit stands, no manifest
//!   changes), as when `thar-be-settings` cannot query a restarting API. The emulator comes back
//!   from what is on disk, without re-rendering (unless the trigger says `boot`).
//! - Applier failures: the next N runs of `static-pods` (or all) exit 1: no manifest changes,
//!   every API call still answers 200/204, only the log says
//!   `Restart command failed - '/usr/bin/static-pods'`. Or the next N applier starts fail:
//!   the commit stands and the call answers 500 `Unable to start config applier`.
//!
//! A test can also restart the emulator for real (SIGTERM or SIGKILL, then start it again with
//! the same `--root`): the on-disk state makes that an API restart, not a boot.
//!
//! # Where it differs
//! - Only a model subset exists (`motd`, parts of `kubernetes`, `host-containers`,
//!   `bootstrap-containers`, `pki`); see `model`. Modeled string types are plain strings.
//! - Live settings persist as one JSON file, `ROOT/var/lib/bottlerocket-sim/settings.json`,
//!   written atomically after each commit; pending transactions one file each.
//!   `--settings FILE` seeds the datastore only when that file does not exist yet (first boot).
//! - Applies run one at a time, in order, each no earlier than its delay after being queued;
//!   each reads the live settings when it runs (as the real `static-pods` does), so two quick
//!   commits may both render the later state. No restart commands run for other services, no
//!   `bottlerocket-launch` transaction, no setting generators or metadata beyond affected services.
//! - A boot renders the static pods but does not empty `ROOT/etc/kubernetes/static-pods` first
//!   (a real boot starts from an empty tmpfs).
//! - Threads: one per connection, keep-alive supported; the real server has one actix worker.
//! - No `/exec` WebSocket, updates, reboot or report APIs; no socket group (`--socket-gid`).

mod control;
mod faults;
mod model;
mod render;
mod routes;
mod store;

pub use faults::{ApplierFaults, Event, Faults, RestartTrigger, When};

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{self, FrameError};
use faults::{Events, RestartPlan, When as TriggerWhen};
use store::Store;

/// How long after a commit the emulated applier starts rendering, unless `--apply-delay-ms`
/// says otherwise: long enough that a test which wrongly assumes a synchronous apply fails.
pub const DEFAULT_APPLY_DELAY: Duration = Duration::from_millis(200);
/// Where live settings persist, relative to `--root`.
pub const SETTINGS_STATE_FILE: &str = "var/lib/bottlerocket-sim/settings.json";
/// Where pending transactions persist (one file each), relative to `--root`.
pub const PENDING_STATE_DIR: &str = "var/lib/bottlerocket-sim/pending";
/// The boot stamp (the kernel's boot id at the last boot), relative to `--root`; under `run/`,
/// a tmpfs on a real node, so a reboot removes it.
pub const BOOT_STAMP: &str = "run/bottlerocket-sim/boot-id";
/// Where static-pod manifests are rendered, relative to `--root`.
pub const STATIC_PODS_DIR: &str = render::STATIC_PODS_DIR;

/// Command-line help.
pub const USAGE: &str = "\
usage: apiserver-sim --socket PATH --root DIR [--settings FILE] [--apply-delay-ms N]
                     [--control PATH] [--faults FILE] [--boot] [--keypair] [--stable-json]
                     [--kubelet-restart CMD]

Emulates the Bottlerocket API server on a Unix socket (a test double).

  --socket PATH        socket to serve on (a stale socket file is replaced)
  --root DIR           emulated host root: static pods go to DIR/etc/kubernetes/static-pods,
                       settings and pending transactions persist in DIR/var/lib/bottlerocket-sim,
                       the boot stamp is DIR/run/bottlerocket-sim/boot-id
  --settings FILE      initial settings (JSON Settings object, no wrapper); used only when
                       DIR has no persisted settings yet
  --apply-delay-ms N   delay before an apply renders static pods (default 200)
  --control PATH       serve the fault control API on this socket (PUT/GET /faults,
                       POST /restart, GET /events, GET /status)
  --faults FILE        faults armed at start (the JSON document PUT /faults takes)
  --boot               start as a boot even if DIR's boot stamp is current: clear pending
                       transactions and render the static pods
  --keypair            serve PATCH /settings/keypair (newer servers; v1.20.5 answers 404)
  --stable-json        sorted JSON object keys and key lists (the real server's order
                       changes between calls)
  --kubelet-restart CMD
                       what the kubernetes service's restart command (systemctl try-restart
                       kubelet.service) runs here, through sh -c, after an apply of a
                       settings.kubernetes key other than static-pods has rendered
                       DIR/etc/kubernetes/pki/ca.crt from kubernetes.cluster-certificate

A start is a boot (render static pods, clear pending transactions) when the boot stamp is
missing or stale; otherwise it is an API server restart and renders nothing.

Exit codes: 0 after SIGTERM/SIGINT, 1 on a runtime error, 2 on a usage error.";

/// How long an idle keep-alive connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on the wait of a triggering request for the server to be down.
const DOWN_WAIT: Duration = Duration::from_secs(10);
/// The generation of applier runs started by a request after which the server goes down:
/// never current, so they are lost whatever the timing.
pub(crate) const DOOMED_GENERATION: u64 = u64::MAX;

/// What the emulator was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Serve with this configuration.
    Run(Config),
    /// Print [`USAGE`].
    Help,
}

/// Emulator configuration (see [`USAGE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Socket path to serve on.
    pub socket: PathBuf,
    /// Emulated host root directory.
    pub root: PathBuf,
    /// Initial settings for a fresh root.
    pub settings_file: Option<PathBuf>,
    /// Delay before an apply renders.
    pub apply_delay: Duration,
    /// Control socket for faults.
    pub control: Option<PathBuf>,
    /// Faults armed at start.
    pub faults_file: Option<PathBuf>,
    /// Start as a boot whatever the boot stamp says.
    pub boot: bool,
    /// Serve `PATCH /settings/keypair`.
    pub keypair: bool,
    /// Sorted JSON output.
    pub stable_json: bool,
    /// What the `kubernetes` service's restart command (`systemctl try-restart
    /// kubelet.service`) runs here, through `sh -c`; `None`: nothing is restarted.
    pub kubelet_restart: Option<String>,
}

impl Config {
    /// A configuration with the defaults of the command line.
    pub fn new(socket: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            root: root.into(),
            settings_file: None,
            apply_delay: DEFAULT_APPLY_DELAY,
            control: None,
            faults_file: None,
            boot: false,
            keypair: false,
            stable_json: false,
            kubelet_restart: None,
        }
    }
}

/// A command line the emulator does not understand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Parses the arguments after the program name.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, UsageError> {
    let mut socket = None;
    let mut root = None;
    let mut config = Config::new("", "");
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| UsageError(format!("missing value for '{flag}'")))
        };
        match flag.as_str() {
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--root" => root = Some(PathBuf::from(value()?)),
            "--settings" => config.settings_file = Some(PathBuf::from(value()?)),
            "--control" => config.control = Some(PathBuf::from(value()?)),
            "--faults" => config.faults_file = Some(PathBuf::from(value()?)),
            "--kubelet-restart" => config.kubelet_restart = Some(value()?),
            "--apply-delay-ms" => {
                let text = value()?;
                let millis = text.parse::<u64>().map_err(|_| {
                    UsageError(format!(
                        "invalid --apply-delay-ms '{text}': expected milliseconds"
                    ))
                })?;
                config.apply_delay = Duration::from_millis(millis);
            }
            "--boot" | "--keypair" | "--stable-json" if inline.is_some() => {
                return Err(UsageError(format!("'{flag}' takes no value")));
            }
            "--boot" => config.boot = true,
            "--keypair" => config.keypair = true,
            "--stable-json" => config.stable_json = true,
            _ => return Err(UsageError(format!("unknown argument '{flag}'"))),
        }
    }
    config.socket = socket.ok_or_else(|| UsageError("missing required '--socket PATH'".into()))?;
    config.root = root.ok_or_else(|| UsageError("missing required '--root DIR'".into()))?;
    Ok(Command::Run(config))
}

/// Why the emulator could not start or keep serving.
#[derive(Debug)]
pub enum SimError {
    /// Initial or persisted settings could not be read or are not valid settings.
    LoadSettings {
        /// The settings file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The `--faults` file could not be read or is not a faults document.
    LoadFaults {
        /// The faults file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Initial settings could not be persisted.
    Persist {
        /// The state file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The datastore (pending transactions, boot stamp) could not be read or written.
    Datastore {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Another process is serving on the socket path.
    SocketInUse {
        /// The socket path.
        socket: PathBuf,
    },
    /// Something other than a socket exists at the socket path.
    NotASocket {
        /// The socket path.
        socket: PathBuf,
    },
    /// The socket could not be created.
    Bind {
        /// The socket path.
        socket: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A background thread could not be started.
    Spawn {
        /// The OS error.
        source: io::Error,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LoadSettings { path, reason } => {
                write!(
                    f,
                    "Failed to load settings from '{}': {reason}",
                    path.display()
                )
            }
            Self::LoadFaults { path, reason } => {
                write!(
                    f,
                    "Failed to load faults from '{}': {reason}",
                    path.display()
                )
            }
            Self::Persist { path, source } => {
                write!(
                    f,
                    "Failed to write settings to '{}': {source}",
                    path.display()
                )
            }
            Self::Datastore { path, source } => {
                write!(
                    f,
                    "Failed to use the datastore at '{}': {source}",
                    path.display()
                )
            }
            Self::SocketInUse { socket } => write!(
                f,
                "Failed to take over socket '{}': another server is answering on it",
                socket.display()
            ),
            Self::NotASocket { socket } => write!(
                f,
                "Failed to bind socket '{}': the path exists and is not a socket; remove it",
                socket.display()
            ),
            Self::Bind { socket, source } => {
                write!(f, "Failed to bind socket '{}': {source}", socket.display())
            }
            Self::Spawn { source } => write!(f, "Failed to start a thread: {source}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Persist { source, .. }
            | Self::Datastore { source, .. }
            | Self::Bind { source, .. }
            | Self::Spawn { source } => Some(source),
            Self::LoadSettings { .. }
            | Self::LoadFaults { .. }
            | Self::SocketInUse { .. }
            | Self::NotASocket { .. } => None,
        }
    }
}

/// A started emulator: settings loaded, static pods rendered if it booted, socket bound.
#[derive(Debug)]
pub struct Sim {
    listener: UnixListener,
    control: Option<UnixListener>,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
}

/// Stops a serving [`Sim`] from another thread (e.g. a signal handler thread).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    stop: Arc<AtomicBool>,
    socket: PathBuf,
    control: Option<PathBuf>,
}

impl ShutdownHandle {
    /// Asks the server to stop: sets the flag, then connects once to wake the blocking accepts.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket);
        if let Some(control) = &self.control {
            let _ = UnixStream::connect(control);
        }
    }
}

impl Sim {
    /// Loads settings (persisted, else `--settings`, else defaults) and pending transactions,
    /// boots if this is a boot (clears pending transactions, renders static pods), starts the
    /// applier thread and binds the socket(s). When this returns, clients can connect.
    pub fn start(config: &Config) -> Result<Self, SimError> {
        let faults = match &config.faults_file {
            None => Faults::default(),
            Some(path) => {
                let load_error = |reason: String| SimError::LoadFaults {
                    path: path.clone(),
                    reason,
                };
                let bytes = fs::read(path).map_err(|error| load_error(error.to_string()))?;
                Faults::parse(&bytes).map_err(|error| load_error(error.to_string()))?
            }
        };
        let persist_path = config.root.join(SETTINGS_STATE_FILE);
        let pending_dir = config.root.join(PENDING_STATE_DIR);
        let live = initial_settings(config, &persist_path)?;
        let store =
            Store::with_pending_dir(live, &pending_dir).map_err(|source| SimError::Datastore {
                path: pending_dir.clone(),
                source,
            })?;
        let (sender, receiver) = mpsc::channel();
        let state = Arc::new(State::new(
            store,
            Paths {
                root: config.root.clone(),
                socket: config.socket.clone(),
                persist: persist_path,
                pending: Some(pending_dir),
            },
            sender,
            Behaviour {
                keypair: config.keypair,
                shuffle: !config.stable_json,
            },
            faults,
        ));
        // Bound first: a second emulator on the same socket must fail before it touches the
        // datastore. Clients wait in the backlog until `serve` accepts.
        let listener = bind(&config.socket)?;
        let control = config.control.as_deref().map(bind).transpose()?;
        let booted = config.boot || !boot_stamp_is_current(&config.root);
        if booted {
            state.boot()?;
        } else {
            let pending = lock(&state.store).transactions();
            state.event(
                "start",
                format!(
                    "API server started (not a boot): static pods not rendered, pending \
                     transactions kept: {pending:?}"
                ),
            );
        }
        let weak = Arc::downgrade(&state);
        let applier = Applier {
            root: config.root.clone(),
            delay: config.apply_delay,
            kubelet_restart: config.kubelet_restart.clone(),
        };
        std::thread::Builder::new()
            .name("applier".into())
            .spawn(move || applier.run(&weak, &receiver))
            .map_err(|source| SimError::Spawn { source })?;

        log(&format!("listening on '{}'", config.socket.display()));
        Ok(Self {
            listener,
            control,
            state,
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A handle that stops [`Sim::serve`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            stop: Arc::clone(&self.stop),
            socket: self.state.paths.socket.clone(),
            control: self
                .control
                .as_ref()
                .and_then(|listener| listener.local_addr().ok())
                .and_then(|address| address.as_pathname().map(Path::to_path_buf)),
        }
    }

    /// Serves connections, one thread each, until [`ShutdownHandle::shutdown`]; restarts when
    /// a fault or the control socket asks; then removes the socket file(s). In-flight
    /// connections are not waited for.
    pub fn serve(self) -> Result<(), SimError> {
        let Self {
            mut listener,
            control,
            state,
            stop,
        } = self;
        let control_path = match control {
            Some(control) => {
                let path = control
                    .local_addr()
                    .ok()
                    .and_then(|address| address.as_pathname().map(Path::to_path_buf));
                let state = Arc::clone(&state);
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name("control".into())
                    .spawn(move || control::serve(&control, &state, &stop))
                    .map_err(|source| SimError::Spawn { source })?;
                path
            }
            None => None,
        };
        let socket = state.paths.socket.clone();
        let result = loop {
            if let Some(plan) = state.restart_plan() {
                drop(listener);
                state.go_down(&plan);
                sleep_unless(Duration::from_millis(plan.down_ms), &stop);
                if stop.load(Ordering::SeqCst) {
                    break Ok(());
                }
                if let Err(error) = state.come_back(&plan) {
                    break Err(error);
                }
                listener = match bind(&socket) {
                    Ok(listener) => listener,
                    Err(error) => break Err(error),
                };
                state.up(&plan);
                continue;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    if stop.load(Ordering::SeqCst) {
                        break Ok(());
                    }
                    if state.restart_requested() {
                        // Woken to restart: this connection (the waker, or a client that came
                        // in just then) is dropped like every other.
                        continue;
                    }
                    let id = state.register(&stream);
                    let conn_state = Arc::clone(&state);
                    let spawned =
                        std::thread::Builder::new()
                            .name("connection".into())
                            .spawn(move || {
                                serve_connection(&conn_state, &stream, id);
                                conn_state.unregister(id);
                            });
                    if let Err(error) = spawned {
                        state.unregister(id);
                        log(&format!(
                            "dropping a connection: cannot start a thread: {error}"
                        ));
                    }
                }
                Err(error) => {
                    log(&format!("accept failed: {error}"));
                    // Back off a little so that e.g. EMFILE does not become a busy loop.
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        stop.store(true, Ordering::SeqCst);
        let _ = fs::remove_file(&socket);
        if let Some(path) = control_path {
            let _ = UnixStream::connect(&path);
            let _ = fs::remove_file(&path);
        }
        log("stopped");
        result
    }
}

/// Where the emulator keeps things.
#[derive(Debug)]
pub(crate) struct Paths {
    pub(crate) root: PathBuf,
    pub(crate) socket: PathBuf,
    /// Live settings file.
    pub(crate) persist: PathBuf,
    /// Pending transactions; `None` = in memory (unit tests).
    pub(crate) pending: Option<PathBuf>,
}

/// Route behaviours chosen on the command line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Behaviour {
    pub(crate) keypair: bool,
    pub(crate) shuffle: bool,
}

/// State shared by connection threads, the control thread, the serve loop and the applier.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) store: Mutex<Store>,
    pub(crate) os: Value,
    pub(crate) paths: Paths,
    pub(crate) applier: mpsc::Sender<ApplyRequest>,
    pub(crate) keypair: bool,
    /// Random state for key order; `None` = sorted output.
    shuffle: Option<Mutex<u64>>,
    pub(crate) faults: Mutex<Faults>,
    events: Mutex<Events>,
    started: Instant,
    /// Incremented each time the server goes down; applier runs queued in an older generation
    /// are lost.
    generation: AtomicU64,
    down: AtomicBool,
    restarts: AtomicU64,
    /// A restart asked for and not yet begun; with `went_down`, signalled when one begins.
    requested: Mutex<Option<RestartPlan>>,
    went_down: Condvar,
    connections: Mutex<HashMap<u64, UnixStream>>,
    next_connection: AtomicU64,
}

impl State {
    pub(crate) fn new(
        store: Store,
        paths: Paths,
        applier: mpsc::Sender<ApplyRequest>,
        behaviour: Behaviour,
        faults: Faults,
    ) -> Self {
        Self {
            store: Mutex::new(store),
            os: os_release(),
            paths,
            applier,
            keypair: behaviour.keypair,
            shuffle: behaviour.shuffle.then(|| Mutex::new(random_seed())),
            faults: Mutex::new(faults),
            events: Mutex::new(Events::default()),
            started: Instant::now(),
            generation: AtomicU64::new(0),
            down: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            requested: Mutex::new(None),
            went_down: Condvar::new(),
            connections: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(0),
        }
    }

    /// Records an event and logs it.
    pub(crate) fn event(&self, kind: &'static str, detail: String) {
        log(&format!("{kind}: {detail}"));
        lock(&self.events).push(self.started.elapsed().as_millis(), kind, detail);
    }

    /// Every event recorded so far.
    pub(crate) fn events(&self) -> Vec<Event> {
        lock(&self.events).all()
    }

    /// `up`, restart count and generation, for the control socket.
    pub(crate) fn status(&self) -> Value {
        json!({
            "up": !self.down.load(Ordering::SeqCst),
            "restarts": self.restarts.load(Ordering::SeqCst),
            "pending_transactions": lock(&self.store).transactions(),
        })
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    pub(crate) fn pending_dir_display(&self) -> String {
        self.paths
            .pending
            .as_ref()
            .map_or_else(|| "memory".to_string(), |dir| dir.display().to_string())
    }

    /// JSON text of `value`, object keys in a new random order on each call unless output is
    /// stable (the real server serializes hash maps).
    pub(crate) fn json_bytes(&self, value: &Value) -> Vec<u8> {
        match &self.shuffle {
            None => value.to_string().into_bytes(),
            Some(rng) => {
                let mut rng = lock(rng);
                let mut out = String::new();
                write_shuffled(&mut out, value, &mut rng);
                out.into_bytes()
            }
        }
    }

    /// Puts `items` in a random order unless output is stable (the real server's hash sets).
    pub(crate) fn shuffle<T>(&self, items: &mut [T]) {
        if let Some(rng) = &self.shuffle {
            shuffle(items, &mut lock(rng));
        }
    }

    /// Boot: clear pending transactions, render every static pod, stamp the boot.
    fn boot(&self) -> Result<(), SimError> {
        let live = {
            let mut store = lock(&self.store);
            store
                .clear_pending()
                .map_err(|source| SimError::Datastore {
                    path: self.paths.pending.clone().unwrap_or_default(),
                    source,
                })?;
            store.live().clone()
        };
        let report = render::render_static_pods(&live, &self.paths.root);
        if let Err(error) = render::render_kubernetes_ca(&live, &self.paths.root) {
            self.event("apply-failed", format!("boot: kubernetes-ca-crt: {error}"));
        }
        let stamp = self.paths.root.join(BOOT_STAMP);
        write_boot_stamp(&stamp).map_err(|source| SimError::Datastore {
            path: stamp,
            source,
        })?;
        self.event(
            "boot",
            format!("pending transactions cleared; {}", report.summary()),
        );
        Ok(())
    }

    /// Asks the serve loop to restart the server and waits (bounded) until it is down.
    /// `keep` is the connection of the request that triggered it, which stays open.
    pub(crate) fn restart(&self, mut plan: RestartPlan, keep: Option<u64>) {
        plan.keep = keep;
        let before = self.generation();
        {
            let mut requested = lock(&self.requested);
            if requested.is_none() {
                *requested = Some(plan);
            }
        }
        // Wakes the blocking accept; refused harmlessly if the server is already down (then the
        // serve loop takes the request when it comes back).
        let _ = UnixStream::connect(&self.paths.socket);
        let requested = lock(&self.requested);
        let (_requested, waited) = self
            .went_down
            .wait_timeout_while(requested, DOWN_WAIT, |_| self.generation() == before)
            .unwrap_or_else(PoisonError::into_inner);
        if waited.timed_out() {
            log("a restart was asked for but the server did not go down in time");
        }
    }

    fn restart_requested(&self) -> bool {
        lock(&self.requested).is_some()
    }

    /// The restart asked for and not begun yet (cleared when the server goes down).
    fn restart_plan(&self) -> Option<RestartPlan> {
        lock(&self.requested).clone()
    }

    /// The server goes down: connections refused, open ones dropped (but the triggering one),
    /// queued applier runs lost.
    fn go_down(&self, plan: &RestartPlan) {
        if plan.remove_socket {
            let _ = fs::remove_file(&self.paths.socket);
        }
        self.down.store(true, Ordering::SeqCst);
        self.restarts.fetch_add(1, Ordering::SeqCst);
        for (id, stream) in lock(&self.connections).iter() {
            if Some(*id) != plan.keep {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        self.event(
            "down",
            format!(
                "{}; connections refused for {} ms{}",
                plan.cause,
                plan.down_ms,
                if plan.remove_socket {
                    ", socket file removed"
                } else {
                    ", socket file left behind"
                }
            ),
        );
        let mut requested = lock(&self.requested);
        *requested = None;
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.went_down.notify_all();
    }

    /// The server starts again from what is on disk; a boot also clears pending transactions
    /// and renders the static pods.
    fn come_back(&self, plan: &RestartPlan) -> Result<(), SimError> {
        let live = read_settings(&self.paths.persist)?;
        let store = match &self.paths.pending {
            Some(dir) => {
                Store::with_pending_dir(live, dir).map_err(|source| SimError::Datastore {
                    path: dir.clone(),
                    source,
                })?
            }
            None => Store::new(live),
        };
        *lock(&self.store) = store;
        if plan.boot {
            self.boot()?;
        }
        Ok(())
    }

    fn up(&self, plan: &RestartPlan) {
        self.down.store(false, Ordering::SeqCst);
        let pending = lock(&self.store).transactions();
        let what = if plan.boot {
            "after a boot".to_string()
        } else {
            format!(
                "static pods not re-rendered (not a boot), pending transactions kept: {pending:?}"
            )
        };
        self.event("up", format!("serving again; {what}"));
    }

    fn register(&self, stream: &UnixStream) -> u64 {
        let id = self.next_connection.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = stream.try_clone() {
            lock(&self.connections).insert(id, clone);
        }
        id
    }

    fn unregister(&self, id: u64) {
        lock(&self.connections).remove(&id);
    }

    /// The restart trigger this request fires, if any (counted as fired).
    fn fire_fault(&self, method: &str, target: &str, body: &[u8]) -> Option<RestartTrigger> {
        let (path, raw_query) = target.split_once('?').unwrap_or((target, ""));
        let sets = || routes::request_sets(self, method, path, raw_query, body);
        let view = faults::RequestView {
            method,
            path,
            sets: &sets,
        };
        let fired = lock(&self.faults).fire(&view)?;
        self.event(
            "fault",
            format!("{} fired by {method} {target}", fired.plan().cause),
        );
        Some(fired)
    }
}

/// Locks a mutex, ignoring poisoning: every critical section here is a single assignment or
/// map operation, so the data is consistent even after a panic elsewhere.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One queued run of the config applier.
#[derive(Debug)]
pub(crate) struct ApplyRequest {
    /// Keys to apply; `None` = everything.
    pub(crate) keys: Option<Vec<String>>,
    queued: Instant,
    /// The server's generation when it was queued: a restart since then loses it.
    generation: u64,
}

impl ApplyRequest {
    pub(crate) fn new(keys: Option<Vec<String>>, generation: u64) -> Self {
        Self {
            keys,
            queued: Instant::now(),
            generation,
        }
    }

    /// Whether this run would invoke `/usr/bin/static-pods`.
    pub(crate) fn touches_static_pods(&self) -> bool {
        self.touches("static-pods")
    }

    /// Whether this run renders the `kubernetes` service's files and restarts the kubelet.
    pub(crate) fn touches_kubernetes(&self) -> bool {
        self.touches("kubernetes")
    }

    fn touches(&self, service: &str) -> bool {
        self.keys.as_ref().is_none_or(|keys| {
            keys.iter()
                .any(|key| routes::affected_service(key) == Some(service))
        })
    }

    fn describe(&self) -> String {
        match &self.keys {
            None => "all settings".to_string(),
            Some(keys) => keys.join(","),
        }
    }
}

/// Writes live settings to the state file (pretty JSON, mode 0600, atomically).
pub(crate) fn persist(path: &Path, live: &Value) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(live).map_err(io::Error::other)?;
    bytes.push(b'\n');
    render::write_atomically(path, &bytes, 0o600)
}

pub(crate) fn log(message: &str) {
    // One write per line so that lines from concurrent threads do not interleave.
    let _ = io::stderr().write_all(format!("apiserver-sim: {message}\n").as_bytes());
}

/// The `/os` of the measured server: Bottlerocket v1.20.5 (semver `version_id`).
fn os_release() -> Value {
    json!({
        "pretty_name": "Bottlerocket OS 1.20.5 (metal-k8s-1.29)",
        "variant_id": "metal-k8s-1.29",
        "version_id": "1.20.5",
        "build_id": "sim",
        "arch": std::env::consts::ARCH,
    })
}

/// The kernel's boot id, or `unknown` where the kernel does not say.
fn kernel_boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

fn boot_stamp_is_current(root: &Path) -> bool {
    fs::read_to_string(root.join(BOOT_STAMP)).is_ok_and(|id| id.trim() == kernel_boot_id())
}

fn write_boot_stamp(path: &Path) -> io::Result<()> {
    render::write_atomically(path, format!("{}\n", kernel_boot_id()).as_bytes(), 0o644)
}

/// A seed for the key-order shuffle: the kernel's randomness, else the clock and PID.
fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    let seeded = fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .is_ok();
    let seed = if seeded {
        u64::from_le_bytes(bytes)
    } else {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()) << 32
    };
    seed | 1
}

/// xorshift64*: enough to vary an order, not for anything secret.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Fisher-Yates.
fn shuffle<T>(items: &mut [T], rng: &mut u64) {
    for index in (1..items.len()).rev() {
        let pick = (next_random(rng) % (index as u64 + 1)) as usize;
        items.swap(index, pick);
    }
}

/// Compact JSON with every object's keys in a random order; arrays keep theirs (they are
/// values, e.g. taints, not hash sets).
fn write_shuffled(out: &mut String, value: &Value, rng: &mut u64) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            shuffle(&mut entries, rng);
            out.push('{');
            for (index, (key, child)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_shuffled(out, child, rng);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_shuffled(out, item, rng);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Sleeps `duration` in short steps, returning early once `stop` is set.
fn sleep_unless(duration: Duration, stop: &AtomicBool) {
    let until = Instant::now() + duration;
    loop {
        let now = Instant::now();
        if now >= until || stop.load(Ordering::SeqCst) {
            return;
        }
        // Emulated downtime, not a test wait.
        std::thread::sleep((until - now).min(Duration::from_millis(20)));
    }
}

/// First-boot settings without `--settings`: the vmware/metal host-container defaults.
fn default_settings() -> Value {
    json!({
        "motd": "Welcome to Bottlerocket!",
        "host-containers": {
            "admin": {
                "enabled": false,
                "superpowered": true,
                "source": "public.ecr.aws/bottlerocket/bottlerocket-admin:v0.11.0",
            },
            "control": {
                "enabled": false,
                "superpowered": false,
                "source": "public.ecr.aws/bottlerocket/bottlerocket-control:v0.7.0",
            },
        },
    })
}

fn read_settings(path: &Path) -> Result<Value, SimError> {
    let load_error = |reason: String| SimError::LoadSettings {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = fs::read(path).map_err(|error| load_error(error.to_string()))?;
    model::parse_settings(&bytes).map_err(|error| load_error(error.to_string()))
}

fn initial_settings(config: &Config, persist_path: &Path) -> Result<Value, SimError> {
    if persist_path.exists() {
        if let Some(file) = &config.settings_file {
            log(&format!(
                "ignoring --settings '{}': persisted settings exist",
                file.display()
            ));
        }
        return read_settings(persist_path);
    }
    let live = match &config.settings_file {
        Some(file) => read_settings(file)?,
        None => default_settings(),
    };
    persist(persist_path, &live).map_err(|source| SimError::Persist {
        path: persist_path.to_path_buf(),
        source,
    })?;
    Ok(live)
}

/// Binds the socket after removing a stale socket file (one nobody answers on).
fn bind(socket: &Path) -> Result<UnixListener, SimError> {
    let bind_error = |source| SimError::Bind {
        socket: socket.to_path_buf(),
        source,
    };
    match fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(socket).is_ok() {
                return Err(SimError::SocketInUse {
                    socket: socket.to_path_buf(),
                });
            }
            fs::remove_file(socket).map_err(bind_error)?;
        }
        Ok(_) => {
            return Err(SimError::NotASocket {
                socket: socket.to_path_buf(),
            });
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(bind_error(error)),
    }
    if let Some(parent) = socket
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        fs::create_dir_all(parent).map_err(bind_error)?;
    }
    let listener = UnixListener::bind(socket).map_err(bind_error)?;
    // Same mode as the real socket; the brief window before chmod does not matter for a test
    // double.
    fs::set_permissions(socket, fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
    Ok(listener)
}

fn serve_connection(state: &State, stream: &UnixStream, id: u64) {
    if stream.set_read_timeout(Some(IDLE_TIMEOUT)).is_err() {
        return;
    }
    let mut reader = BufReader::new(stream);
    let mut writer = stream;
    loop {
        let (method, target, head) = match http::read_request_head(&mut reader) {
            Ok(Some(request)) => request,
            Ok(None) | Err(FrameError::Io(_)) => return,
            Err(error) => {
                let reply = routes::Reply::actix_error(400, error.to_string());
                let _ =
                    http::write_response(&mut writer, 400, reply.content_type, &reply.body, true);
                return;
            }
        };
        if head
            .header("expect")
            .is_some_and(|value| value.eq_ignore_ascii_case("100-continue"))
            && writer.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err()
        {
            return;
        }
        let body = match http::read_request_body(&mut reader, &head, routes::JSON_LIMIT) {
            Ok(body) => body,
            Err(FrameError::Io(_)) => return,
            Err(error) => {
                // Answered before the rest of the body is read, and the connection closed: a
                // client still sending (several MiB) gets EPIPE and never sees the answer.
                let (status, message) = match &error {
                    FrameError::TooLarge { .. } => (
                        413,
                        format!(
                            "JSON payload is larger than allowed (limit: {} bytes).",
                            routes::JSON_LIMIT
                        ),
                    ),
                    _ => (400, error.to_string()),
                };
                let reply = routes::Reply::actix_error(status, message);
                let _ = http::write_response(
                    &mut writer,
                    status,
                    reply.content_type,
                    &reply.body,
                    true,
                );
                log(&format!(
                    "{method} {target} -> {status}, connection closed: {error}"
                ));
                return;
            }
        };
        let fired = state.fire_fault(&method, &target, &body);
        if let Some(trigger) = &fired
            && trigger.when == TriggerWhen::Before
        {
            state.restart(trigger.plan(), Some(id));
            log(&format!(
                "{method} {target} -> connection dropped, not handled"
            ));
            return;
        }
        let reply = routes::handle_doomed(state, &method, &target, &head, &body, fired.is_some());
        let close = head
            .header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
            || head.start_line.ends_with("HTTP/1.0");
        if let Some(trigger) = fired {
            state.restart(trigger.plan(), Some(id));
            if trigger.when == TriggerWhen::NoResponse {
                log(&format!(
                    "{method} {target} -> {} not sent, connection dropped",
                    reply.status
                ));
                return;
            }
            log(&format!(
                "{method} {target} -> {} (sent while down)",
                reply.status
            ));
            let _ = http::write_response(
                &mut writer,
                reply.status,
                reply.content_type,
                &reply.body,
                true,
            );
            return;
        }
        log(&format!("{method} {target} -> {}", reply.status));
        let written = http::write_response(
            &mut writer,
            reply.status,
            reply.content_type,
            &reply.body,
            close,
        );
        if close || written.is_err() {
            return;
        }
    }
}

/// The emulated config applier (thar-be-settings): one run per apply request.
struct Applier {
    root: PathBuf,
    delay: Duration,
    kubelet_restart: Option<String>,
}

impl Applier {
    fn run(&self, state: &Weak<State>, receiver: &mpsc::Receiver<ApplyRequest>) {
        while let Ok(request) = receiver.recv() {
            let due = request.queued + self.delay;
            let now = Instant::now();
            if due > now {
                // Emulated applier latency, not a test wait.
                std::thread::sleep(due - now);
            }
            let Some(state) = state.upgrade() else {
                return;
            };
            self.apply(&state, &request);
        }
    }

    fn apply(&self, state: &State, request: &ApplyRequest) {
        let what = request.describe();
        if request.generation != state.generation() || state.is_down() {
            state.event(
                "apply-lost",
                format!(
                    "applier for {what} died: Error GETing JSON from \
                     '/metadata/affected-services': Connection refused (the API restarted)"
                ),
            );
            return;
        }
        let (pods, kubernetes) = (request.touches_static_pods(), request.touches_kubernetes());
        if !pods && !kubernetes {
            state.event(
                "apply-skipped",
                format!("applier for {what}: no static pods or kubelet affected"),
            );
            return;
        }
        if lock(&state.faults).applier_fails() {
            state.event(
                "apply-failed",
                format!(
                    "applier for {what}: Restart command failed - '{}': exit status: 1 \
                     (fault; nothing rendered or restarted)",
                    if pods {
                        "/usr/bin/static-pods"
                    } else {
                        "/usr/bin/systemctl try-restart kubelet.service"
                    }
                ),
            );
            return;
        }
        let live = lock(&state.store).live().clone();
        if kubernetes {
            self.kubelet(state, &live, &what);
        }
        if pods {
            let report = render::render_static_pods(&live, &self.root);
            let kind = if report.failed.is_empty() {
                "apply-rendered"
            } else {
                "apply-failed"
            };
            state.event(kind, format!("applier for {what}: {}", report.summary()));
        }
    }

    /// The `kubernetes` service: renders the kubelet's client CA file from
    /// `kubernetes.cluster-certificate` (core-kit's `kubernetes-ca-crt` template), then runs its
    /// restart command.
    fn kubelet(&self, state: &State, live: &Value, what: &str) {
        if let Err(error) = render::render_kubernetes_ca(live, &self.root) {
            state.event(
                "apply-failed",
                format!("applier for {what}: kubernetes-ca-crt: {error}"),
            );
            return;
        }
        let Some(command) = &self.kubelet_restart else {
            state.event(
                "apply-rendered",
                format!("applier for {what}: kubernetes-ca-crt rendered; no kubelet to restart"),
            );
            return;
        };
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .status();
        match status {
            Ok(s) if s.success() => state.event(
                "kubelet-restarted",
                format!("applier for {what}: kubernetes-ca-crt rendered; kubelet restarted"),
            ),
            other => state.event(
                "apply-failed",
                format!(
                    "applier for {what}: Restart command failed - '/usr/bin/systemctl \
                     try-restart kubelet.service': {other:?}"
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Command, UsageError> {
        parse_args(line.split_whitespace().map(str::to_string))
    }

    #[test]
    fn parses_arguments() {
        let mut expected = Config::new("/s", "/r");
        expected.apply_delay = Duration::from_millis(5);
        assert_eq!(
            args("--socket /s --root=/r --apply-delay-ms 5"),
            Ok(Command::Run(expected.clone()))
        );
        expected.control = Some("/c".into());
        expected.faults_file = Some("/f".into());
        expected.boot = true;
        expected.keypair = true;
        expected.stable_json = true;
        expected.kubelet_restart = Some("/usr/bin/true".into());
        assert_eq!(
            args(
                "--socket /s --root=/r --apply-delay-ms 5 --control /c --faults=/f --boot \
                 --keypair --stable-json --kubelet-restart=/usr/bin/true"
            ),
            Ok(Command::Run(expected))
        );
        assert_eq!(args("--root /r --help"), Ok(Command::Help));
        let error = |line: &str| args(line).expect_err(line).to_string();
        assert_eq!(error("--root /r"), "missing required '--socket PATH'");
        assert_eq!(error("--socket /s"), "missing required '--root DIR'");
        assert_eq!(error("--socket"), "missing value for '--socket'");
        assert_eq!(error("--bogus 1"), "unknown argument '--bogus'");
        assert_eq!(error("--boot=yes"), "'--boot' takes no value");
        assert_eq!(
            error("--socket /s --root /r --apply-delay-ms soon"),
            "invalid --apply-delay-ms 'soon': expected milliseconds"
        );
    }

    #[test]
    fn apply_requests_know_whether_static_pods_are_affected() {
        assert!(ApplyRequest::new(None, 0).touches_static_pods());
        let pods = ApplyRequest::new(
            Some(vec!["settings.kubernetes.static-pods.etcd.enabled".into()]),
            0,
        );
        assert!(pods.touches_static_pods());
        let motd = ApplyRequest::new(Some(vec!["settings.motd".into()]), 0);
        assert!(!motd.touches_static_pods());
        assert!(!motd.touches_kubernetes());
        assert!(!pods.touches_kubernetes());
        let ca = ApplyRequest::new(
            Some(vec!["settings.kubernetes.cluster-certificate".into()]),
            0,
        );
        assert!(ca.touches_kubernetes() && !ca.touches_static_pods());
    }

    #[test]
    fn shuffled_json_is_the_same_value_in_changing_orders() {
        let value = json!({"a": 1, "b": {"x": [3, 2, 1], "y": "\"q\""}, "c": null, "d": true,
            "e": "é", "f": 1.5});
        let mut rng = 12345;
        let mut orders = std::collections::BTreeSet::new();
        for _ in 0..50 {
            let mut out = String::new();
            write_shuffled(&mut out, &value, &mut rng);
            let back: Value = serde_json::from_str(&out).expect("valid JSON");
            assert_eq!(back, value);
            assert!(out.contains("[3,2,1]"), "arrays keep their order: {out}");
            orders.insert(out);
        }
        assert!(orders.len() > 10, "{orders:?}");
        let mut items: Vec<u32> = (0..20).collect();
        shuffle(&mut items, &mut rng);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_ne!(items, sorted);
    }

    #[test]
    fn serves_in_process_and_shuts_down() {
        let dir = std::env::temp_dir().join(format!("br-sim-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut config = Config::new(dir.join("api.sock"), dir.join("root"));
        config.apply_delay = Duration::ZERO;
        config.control = Some(dir.join("control.sock"));
        let sim = Sim::start(&config).expect("start");
        assert_eq!(
            fs::read_to_string(config.root.join(BOOT_STAMP))
                .expect("boot stamp")
                .trim(),
            kernel_boot_id()
        );
        let mode = fs::metadata(&config.socket)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660);
        assert!(matches!(
            Sim::start(&config),
            Err(SimError::SocketInUse { .. })
        ));
        let handle = sim.shutdown_handle();
        let server = std::thread::spawn(move || sim.serve());
        let client = bottlerocket::ApiClient::new(&config.socket);
        assert_eq!(client.os().expect("os")["version_id"], "1.20.5");
        assert_eq!(
            client.settings().expect("settings")["motd"],
            "Welcome to Bottlerocket!"
        );
        let control = bottlerocket::ApiClient::new(dir.join("control.sock"));
        let (_, events) = control.raw_request("GET", "/events", None).expect("events");
        let events: Value = serde_json::from_slice(&events).expect("json");
        assert_eq!(events[0]["kind"], "boot", "{events}");
        handle.shutdown();
        server.join().expect("join").expect("serve");
        assert!(!config.socket.exists());
        assert!(!dir.join("control.sock").exists());
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
