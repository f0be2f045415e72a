//! TEST DOUBLE: an emulator of the Bottlerocket API server (`apiserver`) and of the part of its
//! config applier that certrotor depends on (`thar-be-settings` running `/usr/bin/static-pods`).
//! It exists so that the agent's API client and restart logic can be tested against the real
//! contract, on a Unix socket, without a Bottlerocket host. Nothing in production uses it.
//!
//! # What it imitates (bottlerocket-api.md §1.2–1.4, §2.1)
//! - HTTP/1.1 on a Unix socket (mode 0660); plain-text error bodies; the routes `GET /`,
//!   `GET /settings` (`?keys=`, `?prefix=`), `PATCH /settings`, `PATCH /settings/keypair`,
//!   `GET|DELETE /tx`, `GET /tx/list`, `POST /tx/commit`, `POST /tx/apply`,
//!   `POST /tx/commit_and_apply`, `GET /os`, `GET /metadata/affected-services`.
//! - Validation against a subset of the settings model with serde's own error texts
//!   (400 ``Json deserialize error: unknown field `xx`, expected one of ...``), actix's content
//!   type check and 2 MiB JSON limit (413), 404 for unknown routes.
//! - Per-transaction pending changes (default transaction `default`), commit without diff that
//!   returns every pending key, 422 `Tried to commit with no pending changes`.
//! - Asynchronous apply: `commit_and_apply` answers at once; a background thread, after
//!   `--apply-delay-ms`, reads the live settings and, if the applied keys touch
//!   `settings.kubernetes.static-pods` (or on a keyless `/tx/apply`), renders *every* static pod
//!   to `ROOT/etc/kubernetes/static-pods/<name>` (write or remove) as `/usr/bin/static-pods` does.
//! - Static pods are rendered once at startup too, as `/etc` is a tmpfs rebuilt on every boot.
//!
//! # Where it differs
//! - Only a model subset exists (`motd`, parts of `kubernetes`, `host-containers`,
//!   `bootstrap-containers`, `pki`); see `model`. Modeled string types are plain strings.
//! - Live settings persist as one JSON file, `ROOT/var/lib/bottlerocket-sim/settings.json`,
//!   written atomically after each commit; pending transactions live in memory only.
//!   `--settings FILE` seeds the datastore only when that file does not exist yet (first boot).
//! - Applies run one at a time, in order, each no earlier than its delay after being queued;
//!   each reads the live settings when it runs (as the real `static-pods` does), so two quick
//!   commits may both render the later state. No restart commands run for other services, no
//!   `bottlerocket-launch` transaction, no setting generators or metadata beyond affected services.
//! - Identical manifests are rewritten and renamed (new inode, same bytes), never skipped.
//! - Threads: one per connection, keep-alive supported; the real server has one actix worker.
//! - No `/exec` WebSocket, updates, reboot or report APIs; no socket group (`--socket-gid`).

mod model;
mod render;
mod routes;
mod store;

use std::fmt;
use std::fs;
use std::io::{self, BufReader, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{self, FrameError};
use store::Store;

/// How long after a commit the emulated applier starts rendering, unless `--apply-delay-ms`
/// says otherwise: long enough that a test which wrongly assumes a synchronous apply fails.
pub const DEFAULT_APPLY_DELAY: Duration = Duration::from_millis(200);
/// Where live settings persist, relative to `--root`.
pub const SETTINGS_STATE_FILE: &str = "var/lib/bottlerocket-sim/settings.json";
/// Where static-pod manifests are rendered, relative to `--root`.
pub const STATIC_PODS_DIR: &str = render::STATIC_PODS_DIR;

/// Command-line help.
pub const USAGE: &str = "\
usage: apiserver-sim --socket PATH --root DIR [--settings FILE] [--apply-delay-ms N]

Emulates the Bottlerocket API server on a Unix socket (a test double).

  --socket PATH        socket to serve on (a stale socket file is replaced)
  --root DIR           emulated host root: static pods go to DIR/etc/kubernetes/static-pods,
                       settings persist in DIR/var/lib/bottlerocket-sim/settings.json
  --settings FILE      initial settings (JSON Settings object, no wrapper); used only when
                       DIR has no persisted settings yet
  --apply-delay-ms N   delay before an apply renders static pods (default 200)

Exit codes: 0 after SIGTERM/SIGINT, 1 on a runtime error, 2 on a usage error.";

/// Largest request body read at all; bigger bodies get 413 and the connection is closed.
const MAX_REQUEST_BYTES: usize = 2 * routes::JSON_LIMIT;
/// How long an idle keep-alive connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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
    let mut settings_file = None;
    let mut apply_delay = DEFAULT_APPLY_DELAY;
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
            "--settings" => settings_file = Some(PathBuf::from(value()?)),
            "--apply-delay-ms" => {
                let text = value()?;
                let millis = text.parse::<u64>().map_err(|_| {
                    UsageError(format!(
                        "invalid --apply-delay-ms '{text}': expected milliseconds"
                    ))
                })?;
                apply_delay = Duration::from_millis(millis);
            }
            _ => return Err(UsageError(format!("unknown argument '{flag}'"))),
        }
    }
    Ok(Command::Run(Config {
        socket: socket.ok_or_else(|| UsageError("missing required '--socket PATH'".into()))?,
        root: root.ok_or_else(|| UsageError("missing required '--root DIR'".into()))?,
        settings_file,
        apply_delay,
    }))
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
    /// Initial settings could not be persisted.
    Persist {
        /// The state file.
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
            Self::Persist { path, source } => {
                write!(
                    f,
                    "Failed to write settings to '{}': {source}",
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
            Self::Persist { source, .. } | Self::Bind { source, .. } | Self::Spawn { source } => {
                Some(source)
            }
            Self::LoadSettings { .. } | Self::SocketInUse { .. } | Self::NotASocket { .. } => None,
        }
    }
}

/// A started emulator: settings loaded, static pods rendered, socket bound.
#[derive(Debug)]
pub struct Sim {
    listener: UnixListener,
    state: Arc<State>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
}

/// Stops a serving [`Sim`] from another thread (e.g. a signal handler thread).
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    stop: Arc<AtomicBool>,
    socket: PathBuf,
}

impl ShutdownHandle {
    /// Asks the server to stop: sets the flag, then connects once to wake the blocking accept.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket);
    }
}

impl Sim {
    /// Loads settings (persisted, else `--settings`, else defaults), renders static pods once,
    /// starts the applier thread and binds the socket. When this returns, clients can connect.
    pub fn start(config: &Config) -> Result<Self, SimError> {
        let persist_path = config.root.join(SETTINGS_STATE_FILE);
        let live = initial_settings(config, &persist_path)?;
        let report = render::render_static_pods(&live, &config.root);
        log(&format!("boot: {}", report.summary()));

        let (sender, receiver) = mpsc::channel();
        let state = Arc::new(State::new(live, persist_path, sender));
        let weak = Arc::downgrade(&state);
        let root = config.root.clone();
        let delay = config.apply_delay;
        std::thread::Builder::new()
            .name("applier".into())
            .spawn(move || run_applier(&weak, &receiver, &root, delay))
            .map_err(|source| SimError::Spawn { source })?;

        let listener = bind(&config.socket)?;
        log(&format!("listening on '{}'", config.socket.display()));
        Ok(Self {
            listener,
            state,
            socket: config.socket.clone(),
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A handle that stops [`Sim::serve`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            stop: Arc::clone(&self.stop),
            socket: self.socket.clone(),
        }
    }

    /// Serves connections, one thread each, until [`ShutdownHandle::shutdown`]; then removes
    /// the socket file. In-flight connections are not waited for.
    pub fn serve(self) -> Result<(), SimError> {
        for incoming in self.listener.incoming() {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            match incoming {
                Ok(stream) => {
                    let state = Arc::clone(&self.state);
                    let spawned = std::thread::Builder::new()
                        .name("connection".into())
                        .spawn(move || serve_connection(&state, &stream));
                    if let Err(error) = spawned {
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
        }
        let _ = fs::remove_file(&self.socket);
        log("stopped");
        Ok(())
    }
}

/// State shared by connection threads and the applier.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) store: Mutex<Store>,
    pub(crate) os: Value,
    pub(crate) persist_path: PathBuf,
    pub(crate) applier: mpsc::Sender<ApplyRequest>,
}

impl State {
    pub(crate) fn new(
        live: Value,
        persist_path: PathBuf,
        applier: mpsc::Sender<ApplyRequest>,
    ) -> Self {
        Self {
            store: Mutex::new(Store::new(live)),
            os: os_release(),
            persist_path,
            applier,
        }
    }
}

/// One queued run of the config applier.
#[derive(Debug)]
pub(crate) struct ApplyRequest {
    /// Keys to apply; `None` = everything.
    pub(crate) keys: Option<Vec<String>>,
    queued: Instant,
}

impl ApplyRequest {
    pub(crate) fn new(keys: Option<Vec<String>>) -> Self {
        Self {
            keys,
            queued: Instant::now(),
        }
    }

    /// Whether this run would invoke `/usr/bin/static-pods`.
    pub(crate) fn touches_static_pods(&self) -> bool {
        self.keys.as_ref().is_none_or(|keys| {
            keys.iter()
                .any(|key| routes::affected_service(key) == Some("static-pods"))
        })
    }
}

/// Writes live settings to the state file (pretty JSON, mode 0600, atomically).
pub(crate) fn persist(path: &Path, live: &Value) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(live).map_err(io::Error::other)?;
    bytes.push(b'\n');
    render::write_atomically(path, &bytes, 0o600)
}

fn log(message: &str) {
    // One write per line so that lines from concurrent threads do not interleave.
    let _ = io::stderr().write_all(format!("apiserver-sim: {message}\n").as_bytes());
}

fn os_release() -> Value {
    json!({
        "pretty_name": "Bottlerocket OS 1.26.0 (sim)",
        "variant_id": "metal-k8s-1.31",
        "version_id": "1.26.0",
        "build_id": "sim",
        "arch": std::env::consts::ARCH,
    })
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

fn serve_connection(state: &State, stream: &UnixStream) {
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
                let reply = routes::Reply::text(400, error.to_string());
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
        let body = match http::read_request_body(&mut reader, &head, MAX_REQUEST_BYTES) {
            Ok(body) => body,
            Err(FrameError::Io(_)) => return,
            Err(error) => {
                let status = if matches!(error, FrameError::TooLarge { .. }) {
                    413
                } else {
                    400
                };
                let reply = routes::Reply::text(status, error.to_string());
                let _ = http::write_response(
                    &mut writer,
                    status,
                    reply.content_type,
                    &reply.body,
                    true,
                );
                return;
            }
        };
        let reply = routes::handle(state, &method, &target, &head, &body);
        log(&format!("{method} {target} -> {}", reply.status));
        let close = head
            .header("connection")
            .is_some_and(|value| value.eq_ignore_ascii_case("close"))
            || head.start_line.ends_with("HTTP/1.0");
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

fn run_applier(
    state: &Weak<State>,
    receiver: &mpsc::Receiver<ApplyRequest>,
    root: &Path,
    delay: Duration,
) {
    while let Ok(request) = receiver.recv() {
        let due = request.queued + delay;
        let now = Instant::now();
        if due > now {
            // Emulated applier latency, not a test wait.
            std::thread::sleep(due - now);
        }
        if !request.touches_static_pods() {
            log("apply: no static pods affected");
            continue;
        }
        let Some(state) = state.upgrade() else {
            return;
        };
        let live = state
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live()
            .clone();
        drop(state);
        log(&format!(
            "apply: {}",
            render::render_static_pods(&live, root).summary()
        ));
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
        assert_eq!(
            args("--socket /s --root=/r --apply-delay-ms 5"),
            Ok(Command::Run(Config {
                socket: "/s".into(),
                root: "/r".into(),
                settings_file: None,
                apply_delay: Duration::from_millis(5),
            }))
        );
        assert_eq!(args("--root /r --help"), Ok(Command::Help));
        let error = |line: &str| args(line).expect_err(line).to_string();
        assert_eq!(error("--root /r"), "missing required '--socket PATH'");
        assert_eq!(error("--socket /s"), "missing required '--root DIR'");
        assert_eq!(error("--socket"), "missing value for '--socket'");
        assert_eq!(error("--bogus 1"), "unknown argument '--bogus'");
        assert_eq!(
            error("--socket /s --root /r --apply-delay-ms soon"),
            "invalid --apply-delay-ms 'soon': expected milliseconds"
        );
    }

    #[test]
    fn apply_requests_know_whether_static_pods_are_affected() {
        assert!(ApplyRequest::new(None).touches_static_pods());
        let pods = ApplyRequest::new(Some(vec![
            "settings.kubernetes.static-pods.etcd.enabled".into(),
        ]));
        assert!(pods.touches_static_pods());
        let motd = ApplyRequest::new(Some(vec!["settings.motd".into()]));
        assert!(!motd.touches_static_pods());
    }

    #[test]
    fn serves_in_process_and_shuts_down() {
        let dir = std::env::temp_dir().join(format!("br-sim-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let config = Config {
            socket: dir.join("api.sock"),
            root: dir.join("root"),
            settings_file: None,
            apply_delay: Duration::ZERO,
        };
        let sim = Sim::start(&config).expect("start");
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
        assert_eq!(client.os().expect("os")["build_id"], "sim");
        assert_eq!(
            client.settings().expect("settings")["motd"],
            "Welcome to Bottlerocket!"
        );
        handle.shutdown();
        server.join().expect("join").expect("serve");
        assert!(!config.socket.exists());
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
