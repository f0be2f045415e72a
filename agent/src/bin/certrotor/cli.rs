//! The command line (a module of the binary, not of the library): argument definitions with
//! typed flags (each value is parsed by argh through a `from_str_fn`, so a bad value is a usage
//! error before any command runs), and the glue from each command to the library. The exit codes
//! are chosen here, with [`certrotor::pass::outcome`], from the library's typed errors and reports.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use argh::FromArgs;

use certrotor::lab::{self, LabLayout, LabOptions, Topology};
use certrotor::node::inventory;
use certrotor::node::manifests::Component;
use certrotor::output::report;
use certrotor::pass::etcd_client::EtcdClientError;
use certrotor::pass::ops::{OpsError, RunOptions, WriteOptions};
use certrotor::pass::outcome::{self, EXIT_USAGE};
use certrotor::pki::KeyAlgorithm;
use certrotor::renew::Policy;
use certrotor::renew::engine::{Engine, KubeadmOptions};
use certrotor::restart::{PlatformChoice, RestartOptions};
use certrotor::sys::clock;
use certrotor::sys::fsutil::ReadError;

// === flag value types and their parsers (argh `from_str_fn`) ===

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Table,
    Json,
}

fn format(value: &str) -> Result<Format, String> {
    match value {
        "table" => Ok(Format::Table),
        "json" => Ok(Format::Json),
        _ => Err("use table or json".into()),
    }
}

// --- metrics (issue 12.1): check's output formats, the metrics address ---

/// `check --output`: the common formats, or the Prometheus text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckOutput {
    Plain(Format),
    Prometheus,
}

fn check_output(value: &str) -> Result<CheckOutput, String> {
    match value {
        "prometheus" => Ok(CheckOutput::Prometheus),
        _ => format(value)
            .map(CheckOutput::Plain)
            .map_err(|_| "use table, json or prometheus".into()),
    }
}

/// `--metrics-address`: IP:PORT.
fn metrics_address(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| "give IP:PORT (127.0.0.1:9793, or 0.0.0.0:9793 for every address)".into())
}

// --- end metrics ---

/// `--engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EngineChoice {
    Native,
    Kubeadm,
}

fn engine_choice(value: &str) -> Result<EngineChoice, String> {
    match value {
        "native" => Ok(EngineChoice::Native),
        "kubeadm" => Ok(EngineChoice::Kubeadm),
        _ => Err("use native or kubeadm".into()),
    }
}

/// A duration in seconds, possibly negative (`30d`, `-2d`).
fn seconds(value: &str) -> Result<i64, String> {
    clock::parse_duration(value)
}

/// A duration in seconds that must be positive.
fn positive_seconds(value: &str) -> Result<i64, String> {
    match clock::parse_duration(value)? {
        s if s > 0 => Ok(s),
        _ => Err("must be a positive duration".into()),
    }
}

/// A duration that must not be negative (`0s` allowed).
fn wait(value: &str) -> Result<Duration, String> {
    match clock::parse_duration(value)? {
        s if s >= 0 => Ok(Duration::from_secs(s.unsigned_abs())),
        _ => Err("must not be negative".into()),
    }
}

/// A positive duration, also in milliseconds (`500ms`).
fn interval(value: &str) -> Result<Duration, String> {
    if let Some(ms) = value.strip_suffix("ms") {
        return match ms.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Duration::from_millis(n)),
            _ => Err("must be a positive duration".into()),
        };
    }
    positive_seconds(value).map(|s| Duration::from_secs(s.unsigned_abs()))
}

fn cluster_mode(value: &str) -> Result<certrotor::cluster::Mode, String> {
    match value {
        "auto" | "on" => Ok(certrotor::cluster::Mode::Auto),
        "off" => Ok(certrotor::cluster::Mode::Off),
        _ => Err("use auto (default) or off".into()),
    }
}

/// `https://IP:PORT[,https://IP:PORT...]`.
fn etcd_endpoints(value: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for e in value.split(',') {
        let e = e.trim().trim_end_matches('/');
        if certrotor::node::manifests::parse_https_url(e).is_none() {
            return Err(format!("'{e}': give https://IP:PORT"));
        }
        out.push(e.to_string());
    }
    Ok(out)
}

fn lease_ttl(value: &str) -> Result<Duration, String> {
    let d = interval(value)?;
    if d < Duration::from_secs(2) {
        return Err("must be at least 2s".into());
    }
    Ok(d)
}

fn platform(value: &str) -> Result<PlatformChoice, String> {
    PlatformChoice::parse(value).ok_or_else(|| "use auto, bottlerocket, kubeadm or none".into())
}

fn restart_mode(value: &str) -> Result<certrotor::restart::reload::RestartMode, String> {
    certrotor::restart::reload::RestartMode::parse(value).ok_or_else(|| "use live or always".into())
}

fn endpoint(value: &str) -> Result<(Component, SocketAddr), String> {
    certrotor::restart::parse_endpoint(value)
}

fn layout(value: &str) -> Result<LabLayout, String> {
    match value {
        "kubeadm" => Ok(LabLayout::Kubeadm),
        "bottlerocket" => Ok(LabLayout::Bottlerocket),
        _ => Err("use kubeadm or bottlerocket".into()),
    }
}

fn topology(value: &str) -> Result<Topology, String> {
    match value {
        "stacked" => Ok(Topology::Stacked),
        "external-etcd" => Ok(Topology::ExternalEtcd),
        _ => Err("use stacked or external-etcd".into()),
    }
}

fn key_algorithm(value: &str) -> Result<KeyAlgorithm, String> {
    KeyAlgorithm::parse(value)
        .ok_or_else(|| "use rsa-2048, rsa-3072, rsa-4096, ecdsa-p256 or ecdsa-p384".into())
}

fn ip(value: &str) -> Result<IpAddr, String> {
    value.parse().map_err(|_| "not an IP address".into())
}

fn node_name(value: &str) -> Result<String, String> {
    if value.is_empty() || value.contains('/') {
        return Err("not a valid node name".into());
    }
    Ok(value.to_string())
}

// === commands ===

#[derive(FromArgs, Debug)]
/// certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes
/// (Bottlerocket host or bootstrap container, or any kubeadm node).
struct Top {
    #[argh(
        option,
        default = "log::LevelFilter::Info",
        from_str_fn(certrotor::output::logging::parse_level)
    )]
    /// diagnostics on stderr: off, error, warn, info (default), debug or trace; give it before
    /// the command (certrotor --log-level debug daemon)
    log_level: log::LevelFilter,
    #[argh(option, default = "certrotor::output::logging::Format::Text")]
    /// diagnostics format: text (default, UTC timestamps) or json (one object per line)
    log_format: certrotor::output::logging::Format,
    #[argh(subcommand)]
    command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum Command {
    Check(CheckCmd),
    Lab(LabCmd),
    Renew(RenewCmd),
    Rollback(RollbackCmd),
    Backups(BackupsCmd),
    EtcdClient(EtcdClientCmd),
    Run(RunCmd),
    Daemon(DaemonCmd),
    Demo(DemoCmd),
    Version(VersionCmd),
    Status(StatusCmd),
}

/// The flags `renew`, `run` and `daemon` share, once parsed.
#[derive(Debug, Clone)]
struct RenewFlags {
    root: Option<PathBuf>,
    within: i64,
    all: bool,
    cert: Vec<String>,
    dry_run: bool,
    reuse_keys: bool,
    validity: i64,
    allow_beyond_ca: bool,
    retention: usize,
    engine: EngineChoice,
    kubeadm_image: Option<String>,
    kubeadm_path: Option<String>,
    etcdadm_path: Option<String>,
    ctr_path: Option<PathBuf>,
    containerd_socket: Option<PathBuf>,
    containerd_namespace: Option<String>,
    lock_timeout: Duration,
}

/// Declares a command struct with the flags of `renew` (argh has no flattening), and
/// `renew_flags()` to read them as one [`RenewFlags`]. It only declares; it never returns from
/// its caller.
macro_rules! renew_command {
    ($(#[$attr:meta])* struct $name:ident { $($extra:tt)* }) => {
        $(#[$attr])*
        struct $name {
            $($extra)*
            #[argh(option)]
            /// the node's root filesystem (default: /.bottlerocket/rootfs inside a Bottlerocket host
            /// container, else /)
            root: Option<PathBuf>,
            #[argh(option, default = "90 * clock::DAY", from_str_fn(seconds))]
            /// renew what expires within this duration (default 90d)
            within: i64,
            #[argh(switch)]
            /// renew everything renewable, due or not
            all: bool,
            #[argh(option)]
            /// renew this certificate (a name printed by check); repeatable
            cert: Vec<String>,
            #[argh(switch)]
            /// print the plan and change nothing
            dry_run: bool,
            #[argh(switch)]
            /// keep the existing private keys (default: a new key of the same algorithm, as kubeadm)
            reuse_keys: bool,
            #[argh(option, default = "clock::YEAR", from_str_fn(positive_seconds))]
            /// validity of the renewed certificates (default 365d)
            validity: i64,
            #[argh(switch)]
            /// allow certificates to outlive their CA
            allow_beyond_ca: bool,
            #[argh(option, default = "5")]
            /// backups to keep (default 5)
            retention: usize,
            #[argh(option, default = "EngineChoice::Native", from_str_fn(engine_choice))]
            /// who issues the certificates: native (default, certrotor itself) or kubeadm (kubeadm
            /// certs renew / etcdadm in the bootstrap image, through containerd)
            engine: EngineChoice,
            #[argh(option)]
            /// kubeadm engine: the image with kubeadm and etcdadm (default: the Bottlerocket setting
            /// host-containers.kubeadm-bootstrap.source); it must already be in containerd
            kubeadm_image: Option<String>,
            #[argh(option)]
            /// kubeadm engine: kubeadm in the image (default /opt/bin/kubeadm)
            kubeadm_path: Option<String>,
            #[argh(option)]
            /// kubeadm engine: etcdadm in the image (default /opt/bin/etcdadm)
            etcdadm_path: Option<String>,
            #[argh(option)]
            /// kubeadm engine: the host's ctr (default /.bottlerocket/rootfs/usr/bin/ctr when it
            /// exists, else ctr from PATH)
            ctr_path: Option<PathBuf>,
            #[argh(option)]
            /// kubeadm engine: containerd's socket (default /run/containerd/containerd.sock)
            containerd_socket: Option<PathBuf>,
            #[argh(option)]
            /// kubeadm engine: containerd namespace of the image (default k8s.io)
            containerd_namespace: Option<String>,
            #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
            /// how long to wait for another certrotor run to finish (default 60s)
            lock_timeout: Duration,
        }

        impl $name {
            fn renew_flags(&self) -> RenewFlags {
                RenewFlags {
                    root: self.root.clone(),
                    within: self.within,
                    all: self.all,
                    cert: self.cert.clone(),
                    dry_run: self.dry_run,
                    reuse_keys: self.reuse_keys,
                    validity: self.validity,
                    allow_beyond_ca: self.allow_beyond_ca,
                    retention: self.retention,
                    engine: self.engine,
                    kubeadm_image: self.kubeadm_image.clone(),
                    kubeadm_path: self.kubeadm_path.clone(),
                    etcdadm_path: self.etcdadm_path.clone(),
                    ctr_path: self.ctr_path.clone(),
                    containerd_socket: self.containerd_socket.clone(),
                    containerd_namespace: self.containerd_namespace.clone(),
                    lock_timeout: self.lock_timeout,
                }
            }
        }
    };
}

renew_command! {
    #[derive(FromArgs, Debug)]
    #[argh(
        subcommand,
        name = "renew",
        note = "Never renews a CA, sa.key/sa.pub or the kubelet's own client certificate. Every change is one crash-safe transaction with a backup under var/lib/certrotor/backups; undo with 'certrotor rollback'.",
        error_code(0, "renewed (or nothing due, or --dry-run)"),
        error_code(2, "failed; nothing was changed"),
        error_code(4, "another certrotor holds the lock"),
        error_code(64, "usage error")
    )]
    /// renew the certificates and kubeconfigs that are due, as kubeadm/etcdadm would
    struct RenewCmd {
        #[argh(option, default = "Format::Table", from_str_fn(format))]
        /// output format: table (default) or json
        output: Format,
    }
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "rollback")]
/// restore a backup (the newest renewal's by default), as a transaction of its own
struct RollbackCmd {
    #[argh(option)]
    /// the node's root filesystem
    root: Option<PathBuf>,
    #[argh(option)]
    /// the backup id to restore (see 'certrotor backups')
    backup: Option<String>,
    #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
    /// how long to wait for another certrotor run to finish (default 60s)
    lock_timeout: Duration,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "backups")]
/// list the backups certrotor keeps, newest first
struct BackupsCmd {
    #[argh(option)]
    /// the node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    output: Format,
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "check",
    note = "Looks under etc/kubernetes, var/lib/kubeadm, etc/etcd/pki and var/lib/etcd/pki of the root.",
    error_code(0, "every certificate is fine"),
    error_code(1, "something expires within --warn-within"),
    error_code(2, "something is expired, invalid, missing or unreadable"),
    error_code(64, "usage error")
)]
/// inventory every certificate, key and kubeconfig of the node, with expiry and soundness
struct CheckCmd {
    /// the node's root filesystem (default: /.bottlerocket/rootfs inside a Bottlerocket host
    /// container, else /)
    #[argh(option)]
    root: Option<PathBuf>,
    /// output format: table (default), json, or prometheus (x509-certificate-exporter's
    /// gauges, for node-exporter's textfile collector)
    #[argh(
        option,
        default = "CheckOutput::Plain(Format::Table)",
        from_str_fn(check_output)
    )]
    output: CheckOutput,
    /// report certificates expiring within this duration as expiring (default 30d)
    #[argh(option, default = "30 * clock::DAY", from_str_fn(seconds))]
    warn_within: i64,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "lab")]
/// lab nodes for demos, tests and benchmarks (not a CA)
struct LabCmd {
    #[argh(subcommand)]
    command: LabSub,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum LabSub {
    Init(LabInitCmd),
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "init",
    note = "For demos, tests and benchmarks only: this is not a CA. Keys are made on the spot and left unprotected. With --topology external-etcd, two node roots are written: DIR/control-plane and DIR/etcd."
)]
/// write a realistic kubeadm/etcdadm node root under DIR
struct LabInitCmd {
    /// the folder to create (must be absent or empty)
    #[argh(positional)]
    dir: PathBuf,
    /// kubeadm (etc/kubernetes) or bottlerocket (var/lib/kubeadm); default kubeadm
    #[argh(option, default = "LabLayout::Kubeadm", from_str_fn(layout))]
    layout: LabLayout,
    /// stacked (etcd on the control plane) or external-etcd; default stacked
    #[argh(option, default = "Topology::Stacked", from_str_fn(topology))]
    topology: Topology,
    /// leaves expire after this duration, negative for already expired (default 365d)
    #[argh(option, default = "clock::YEAR", from_str_fn(seconds))]
    expires_in: i64,
    /// rsa-2048 (default) or ecdsa-p256 (also rsa-3072, rsa-4096, ecdsa-p384)
    #[argh(
        option,
        default = "KeyAlgorithm::Rsa(2048)",
        from_str_fn(key_algorithm)
    )]
    key_algorithm: KeyAlgorithm,
    /// the node name in certificates (default cp-1)
    #[argh(option, default = "String::from(\"cp-1\")", from_str_fn(node_name))]
    node_name: String,
    /// the node IP in certificates (default 10.0.0.10)
    #[argh(option, default = "IpAddr::from([10, 0, 0, 10])", from_str_fn(ip))]
    advertise_address: IpAddr,
    /// add this to every standard port in manifests and kubeconfigs, to run lab nodes side by
    /// side (default 0)
    #[argh(option, default = "0")]
    port_offset: u16,
    /// also write a kube-vip-like static pod that mounts admin.conf as a single file (as EKS
    /// Anywhere control planes run)
    #[argh(switch)]
    kube_vip: bool,
}

/// The platform flags `run`, `daemon` and `etcd-client import` share, once parsed.
#[derive(Debug, Clone)]
struct PassFlags {
    platform: PlatformChoice,
    api_socket: PathBuf,
    endpoint: Vec<(Component, SocketAddr)>,
    restart_timeout: Duration,
    poll_interval: Duration,
    cluster: certrotor::cluster::ClusterOptions,
    restart: certrotor::restart::reload::RestartMode,
    reload_timeout: Duration,
}

/// Declares `run` and `daemon`: renew's flags plus the platform flags, and `pass_flags()` to
/// read the latter as one [`PassFlags`]. It only declares; it never returns from its caller.
macro_rules! pass_command {
    ($(#[$attr:meta])* struct $name:ident { $($extra:tt)* }) => {
        renew_command! {
            $(#[$attr])*
            struct $name {
                $($extra)*
                #[argh(option, default = "PlatformChoice::Auto", from_str_fn(platform))]
                /// how to restart components: auto (default), bottlerocket, kubeadm or none
                platform: PlatformChoice,
                #[argh(option, default = "PathBuf::from(certrotor::node::catalog::paths::API_SOCKET)")]
                /// the Bottlerocket API socket (default /run/api.sock)
                api_socket: PathBuf,
                #[argh(option, from_str_fn(endpoint))]
                /// a component's health endpoint, COMPONENT=IP:PORT, overriding its manifest;
                /// repeatable
                endpoint: Vec<(Component, SocketAddr)>,
                #[argh(option, default = "Duration::from_secs(300)", from_str_fn(interval))]
                /// bound on each wait for a pod to stop or to serve healthy (default 300s)
                restart_timeout: Duration,
                #[argh(option, default = "Duration::from_millis(500)", from_str_fn(interval))]
                /// interval between two polls of a condition (default 500ms)
                poll_interval: Duration,
                #[argh(option, default = "certrotor::cluster::Mode::Auto", from_str_fn(cluster_mode))]
                /// cluster mode: auto (default: coordinate restarts through etcd where the
                /// manifests give etcd endpoints) or off (act alone)
                cluster: certrotor::cluster::Mode,
                #[argh(option, from_str_fn(etcd_endpoints))]
                /// etcd endpoint(s) https://IP:PORT for cluster mode, overriding the manifests;
                /// repeatable
                etcd_endpoint: Vec<Vec<String>>,
                #[argh(option, default = "Duration::from_secs(600)", from_str_fn(interval))]
                /// bound on the wait for the cluster lock and health gates before restarts are
                /// put off to the next pass (default 600s)
                cluster_wait: Duration,
                #[argh(option, default = "Duration::from_secs(15)", from_str_fn(lease_ttl))]
                /// lease of the cluster lock: how long a dead holder blocks the others
                /// (default 15s)
                cluster_lease_ttl: Duration,
                #[argh(option, default = "certrotor::restart::reload::RestartMode::Live", from_str_fn(restart_mode))]
                /// live (default: restart only the components that cannot reload a renewed
                /// file, or did not within --reload-timeout) or always (restart every
                /// component whose files changed)
                restart: certrotor::restart::reload::RestartMode,
                #[argh(option, default = "certrotor::restart::reload::DEFAULT_RELOAD_TIMEOUT", from_str_fn(interval))]
                /// bound on the wait for a component to serve a renewed file by itself before
                /// it is restarted (default 90s; kube-apiserver re-reads about once a minute)
                reload_timeout: Duration,
            }
        }

        impl $name {
            fn pass_flags(&self) -> PassFlags {
                PassFlags {
                    platform: self.platform,
                    api_socket: self.api_socket.clone(),
                    endpoint: self.endpoint.clone(),
                    restart_timeout: self.restart_timeout,
                    poll_interval: self.poll_interval,
                    cluster: certrotor::cluster::ClusterOptions {
                        mode: self.cluster,
                        endpoints: self.etcd_endpoint.concat(),
                        wait: self.cluster_wait,
                        lease_ttl: self.cluster_lease_ttl,
                    },
                    restart: self.restart,
                    reload_timeout: self.reload_timeout,
                }
            }
        }
    };
}

pass_command! {
    #[derive(FromArgs, Debug)]
    #[argh(
        subcommand,
        name = "run",
        note = "For a Bottlerocket bootstrap container or a timer. The restart set follows which files each component reads: etcd (etcd server/peer), kube-apiserver (apiserver, apiserver-kubelet-client, front-proxy-client, apiserver-etcd-client), kube-controller-manager and kube-scheduler (their kubeconfigs).",
        error_code(0, "done (or nothing due)"),
        error_code(2, "failed; nothing was changed, or the automatic rollback failed too"),
        error_code(3, "verification failed; the previous certificates were restored and are served"),
        error_code(4, "another certrotor holds the lock; in cluster mode: restarts put off to the next pass (cluster lock or health gate)"),
        error_code(64, "usage error")
    )]
    /// one pass: check, renew what is due, restart components one at a time, verify, roll back
    /// on failure
    struct RunCmd {
        #[argh(option, default = "Format::Table", from_str_fn(format))]
        /// output format: table (default) or json
        output: Format,
        #[argh(switch)]
        /// run one pass and exit (required: use 'certrotor daemon' to repeat)
        once: bool,
    }
}

pass_command! {
    #[derive(FromArgs, Debug)]
    #[argh(subcommand, name = "daemon", note = "For a Bottlerocket host container. Stops on SIGTERM between passes.")]
    /// repeat 'run --once' every --interval (with jitter), logging each decision
    struct DaemonCmd {
        #[argh(option, default = "Duration::from_secs(3600)", from_str_fn(interval))]
        /// time between passes (default 1h, ±10% jitter); after a failure, retries sooner
        interval: Duration,
        #[argh(option, from_str_fn(metrics_address))]
        /// serve Prometheus metrics on http://IP:PORT/metrics (default: off)
        metrics_address: Option<SocketAddr>,
    }
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "etcd-client")]
/// external etcd: carry the apiserver-etcd-client pair from an etcd node to control planes
struct EtcdClientCmd {
    #[argh(subcommand)]
    command: EtcdClientSub,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
enum EtcdClientSub {
    Export(EtcdExportCmd),
    Import(EtcdImportCmd),
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "export",
    note = "The bundle holds a private key: it is not written to a terminal unless --to-terminal is given."
)]
/// on the etcd node: write the apiserver-etcd-client certificate and key as one PEM bundle
struct EtcdExportCmd {
    #[argh(option)]
    /// the etcd node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"-\")")]
    /// where to write the bundle (mode 0600), or - for standard output (default; a pipe or a
    /// file, not a terminal)
    out: String,
    #[argh(switch)]
    /// write the bundle (and its private key) to standard output even when it is a terminal
    to_terminal: bool,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "import")]
/// on a control-plane node: check and install an exported bundle, as one transaction
struct EtcdImportCmd {
    #[argh(option)]
    /// the control-plane node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"-\")")]
    /// the bundle file, or - for standard input (default)
    from: String,
    #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
    /// how long to wait for another certrotor run to finish (default 60s)
    lock_timeout: Duration,
    #[argh(option, default = "PlatformChoice::Auto", from_str_fn(platform))]
    /// how to restart kube-apiserver afterwards: auto (default), bottlerocket, kubeadm or none
    platform: PlatformChoice,
    #[argh(
        option,
        default = "PathBuf::from(certrotor::node::catalog::paths::API_SOCKET)"
    )]
    /// the Bottlerocket API socket (default /run/api.sock)
    api_socket: PathBuf,
    #[argh(option, from_str_fn(endpoint))]
    /// kube-apiserver's health endpoint, kube-apiserver=IP:PORT, overriding its manifest
    endpoint: Vec<(Component, SocketAddr)>,
    #[argh(option, default = "Duration::from_secs(300)", from_str_fn(interval))]
    /// bound on each wait for the pod to stop or to serve healthy (default 300s)
    restart_timeout: Duration,
    #[argh(option, default = "Duration::from_millis(500)", from_str_fn(interval))]
    /// interval between two polls of a condition (default 500ms)
    poll_interval: Duration,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "demo")]
/// show the whole job on a built-in lab node in a temporary folder
struct DemoCmd {
    /// keep the lab node instead of removing it
    #[argh(switch)]
    keep: bool,
}

// === status (issue 12.3) ===

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "status",
    note = "Reads var/lib/certrotor/last-pass.json, written at the end of every 'run' and 'daemon' pass. A record that cannot be read, or from a newer certrotor, is an error (exit 2).",
    error_code(0, "status shown"),
    error_code(2, "a state file cannot be read; nothing was changed"),
    error_code(64, "usage error")
)]
/// the last pass, the next certificate due and its renewal, owed restarts, locks and backups
struct StatusCmd {
    #[argh(option)]
    /// the node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    output: Format,
    #[argh(option, from_str_fn(seconds))]
    /// the renewal window to compute the next renewal with (default: the last pass's, else 90d)
    within: Option<i64>,
    #[argh(
        option,
        default = "certrotor::cluster::Mode::Auto",
        from_str_fn(cluster_mode)
    )]
    /// auto (default: ask etcd who holds the cluster lock, where the manifests give etcd
    /// endpoints; at most 5 s per endpoint) or off
    cluster: certrotor::cluster::Mode,
    #[argh(option, from_str_fn(etcd_endpoints))]
    /// etcd endpoint(s) https://IP:PORT, overriding the manifests; repeatable
    etcd_endpoint: Vec<Vec<String>>,
}

fn status_cmd(c: StatusCmd) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    let opts = certrotor::output::status::StatusOptions {
        within: c.within,
        cluster: certrotor::cluster::ClusterOptions {
            mode: c.cluster,
            endpoints: c.etcd_endpoint.concat(),
            ..Default::default()
        },
        restart: Some(restart_options(PassFlags {
            platform: PlatformChoice::Auto,
            api_socket: PathBuf::from(certrotor::node::catalog::paths::API_SOCKET),
            endpoint: vec![],
            restart_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(500),
            cluster: certrotor::cluster::ClusterOptions::default(),
            restart: certrotor::restart::reload::RestartMode::Live,
            reload_timeout: certrotor::restart::reload::DEFAULT_RELOAD_TIMEOUT,
        })),
    };
    let report = certrotor::output::status::status(&root, &opts).map_err(CliError::Status)?;
    print!("{}", render(c.output, &report, report::status_table)?);
    Ok(outcome::EXIT_OK)
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "version")]
/// print the version
struct VersionCmd {}

/// Why a command failed: a usage error, or the library's typed error (its cause in `source()`).
#[derive(Debug)]
enum CliError {
    /// A bad flag or flag value (exit 64).
    Usage(String),
    /// The node root is not a folder.
    NoRoot(PathBuf),
    Ops(OpsError),
    EtcdClient(EtcdClientError),
    Lab(lab::LabError),
    Demo(certrotor::lab::demo::DemoError),
    /// A report could not be serialised as JSON.
    Json(serde_json::Error),
    /// Reading or writing the etcd client bundle.
    Bundle {
        what: String,
        source: std::io::Error,
    },
    /// Reading the etcd client bundle file.
    ReadBundle(ReadError),
    /// `status` could not read a state file.
    Status(certrotor::output::status::StatusError),
    /// `--metrics-address` cannot be bound.
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl CliError {
    fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }

    /// The exit code: 64 for usage, else what [`outcome::for_error`] makes of the cause.
    fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            other => outcome::for_error(other),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::NoRoot(root) => write!(
                f,
                "the node root '{}' is not a folder; give the node's root filesystem with --root",
                root.display()
            ),
            CliError::Ops(e) => write!(f, "{e}"),
            CliError::EtcdClient(e) => write!(f, "{e}"),
            CliError::Lab(e) => write!(f, "{e}"),
            CliError::Demo(e) => write!(f, "{e}"),
            CliError::Json(e) => write!(f, "cannot serialise the report as JSON: {e}"),
            CliError::Bundle { what, source } => write!(f, "{what}: {source}"),
            CliError::ReadBundle(e) => write!(f, "{e}"),
            CliError::Status(e) => write!(f, "{e}"),
            CliError::Metrics { addr, source } => write!(
                f,
                "cannot serve metrics on {addr}: {source}; give a free local address with \
                 --metrics-address, or leave it out"
            ),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Usage(_) | CliError::NoRoot(_) => None,
            CliError::Ops(e) => Some(e),
            CliError::EtcdClient(e) => Some(e),
            CliError::Lab(e) => Some(e),
            CliError::Demo(e) => Some(e),
            CliError::Json(e) => Some(e),
            CliError::Bundle { source, .. } => Some(source),
            CliError::ReadBundle(e) => Some(e),
            CliError::Status(e) => Some(e),
            CliError::Metrics { source, .. } => Some(source),
        }
    }
}

impl From<OpsError> for CliError {
    fn from(e: OpsError) -> Self {
        CliError::Ops(e)
    }
}

impl From<EtcdClientError> for CliError {
    fn from(e: EtcdClientError) -> Self {
        CliError::EtcdClient(e)
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError::Json(e)
    }
}

/// Where Bottlerocket mounts a bootstrap container's own folder.
const BOOTSTRAP_CONTAINER_DIR: &str = "/.bottlerocket/bootstrap-containers/current";
/// Where Bottlerocket mounts a host container's own folder.
const HOST_CONTAINER_DIR: &str = "/.bottlerocket/host-containers/current";

/// The command line of a Bottlerocket container, which cannot be given arguments: the words of
/// its user-data file (`#` starts a comment), or by default `run --once --platform none` for a bootstrap
/// container and `daemon` for a host container. `None` outside such a container.
fn container_args(bootstrap_dir: &Path, host_dir: &Path) -> Option<Vec<String>> {
    for (dir, default) in [
        (bootstrap_dir, "run --once --platform none"),
        (host_dir, "daemon"),
    ] {
        if !dir.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(dir.join("user-data")).unwrap_or_default();
        let words: Vec<String> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(str::split_whitespace)
            .map(str::to_string)
            .collect();
        return Some(if words.is_empty() {
            default.split(' ').map(str::to_string).collect()
        } else {
            words
        });
    }
    None
}

/// Entry point used by `main.rs`: parses `args` (including the program name) and runs.
pub fn main(mut args: Vec<String>) -> ExitCode {
    // Die quietly on a closed pipe (`certrotor check | head`), as command-line tools do, instead
    // of panicking in println!.
    // SAFETY: setting a signal disposition to SIG_DFL has no memory-safety preconditions; nix
    // has no safe form of signal(2).
    #[allow(unsafe_code)]
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    let mut from_user_data = None;
    if args.len() <= 1
        && let Some(words) = container_args(
            Path::new(BOOTSTRAP_CONTAINER_DIR),
            Path::new(HOST_CONTAINER_DIR),
        )
    {
        from_user_data = Some(words.join(" "));
        args.truncate(1);
        args.extend(words);
    }
    let program = args.first().map(String::as_str).unwrap_or("certrotor");
    let program = Path::new(program)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or("certrotor");
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let top = match Top::from_args(&[program], &rest) {
        Ok(t) => t,
        Err(early) => {
            return match early.status {
                Ok(()) => {
                    print!("{}", early.output);
                    ExitCode::SUCCESS
                }
                Err(()) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "{}Run '{program} help' or '{program} <command> --help' for usage.",
                        early.output
                    );
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
    };
    certrotor::output::logging::init(top.log_level, top.log_format);
    if let Some(words) = from_user_data {
        log::info!("arguments from the container's user-data: {words}");
    }
    match run(top) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(top: Top) -> Result<u8, CliError> {
    match top.command {
        Command::Check(c) => check(c),
        Command::Lab(LabCmd {
            command: LabSub::Init(c),
        }) => lab_init(c),
        Command::Renew(c) => renew(c),
        Command::Rollback(c) => rollback(c),
        Command::Backups(c) => backups(c),
        Command::EtcdClient(EtcdClientCmd {
            command: EtcdClientSub::Export(c),
        }) => etcd_export(c),
        Command::EtcdClient(EtcdClientCmd {
            command: EtcdClientSub::Import(c),
        }) => etcd_import(c),
        Command::Run(c) => run_cmd(c),
        Command::Daemon(c) => daemon_cmd(c),
        Command::Demo(c) => {
            certrotor::lab::demo::run(c.keep).map_err(CliError::Demo)?;
            Ok(outcome::EXIT_OK)
        }
        Command::Status(c) => status_cmd(c),
        Command::Version(_) => {
            println!("certrotor {}", env!("CARGO_PKG_VERSION"));
            Ok(outcome::EXIT_OK)
        }
    }
}

/// The root: the flag, or the default; it must be a folder.
fn root_flag(root: Option<PathBuf>) -> Result<PathBuf, CliError> {
    let root = root.unwrap_or_else(inventory::default_root);
    if !root.is_dir() {
        return Err(CliError::NoRoot(root));
    }
    Ok(root)
}

/// Renders a report as JSON or as its table.
fn render<T: serde::Serialize>(
    output: Format,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> Result<String, CliError> {
    Ok(match output {
        Format::Json => format!("{}\n", report::json(value)?),
        Format::Table => table(value),
    })
}

fn check(c: CheckCmd) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    certrotor::pass::ops::recover_before_reading(&root)?;
    let now = clock::now();
    let inv = inventory::take(&root, now, c.warn_within);
    match c.output {
        CheckOutput::Plain(f) => print!("{}", render(f, &inv, report::table)?),
        CheckOutput::Prometheus => print!(
            "{}",
            certrotor::output::metrics::certificate_gauges(&root, &inv, now)
        ),
    }
    let code = outcome::for_inventory(&inv);
    // The process ends here: the inventory's many small allocations (names, paths, report
    // text) go back with it instead of being freed one by one (~3% of a `check`). It holds no
    // key material (keys are read, matched and scrubbed inside `inventory::take`), so nothing
    // is left unscrubbed.
    std::mem::forget(inv);
    Ok(code)
}

fn lab_init(c: LabInitCmd) -> Result<u8, CliError> {
    let opts = LabOptions {
        layout: c.layout,
        topology: c.topology,
        expires_in: c.expires_in,
        key_algorithm: c.key_algorithm,
        node_name: c.node_name,
        advertise_address: c.advertise_address,
        cluster_name: "kubernetes".into(),
        port_offset: c.port_offset,
        now: clock::now(),
    };
    let summary = lab::init(&c.dir, &opts).map_err(CliError::Lab)?;
    if c.kube_vip {
        for root in &summary.roots {
            lab::add_kube_vip(root, c.layout, c.port_offset).map_err(CliError::Lab)?;
        }
    }
    for root in &summary.roots {
        println!("lab node written: {}", root.display());
    }
    if let Some(first) = summary.roots.first() {
        println!(
            "{} files; inspect with: certrotor check --root {}",
            summary.files,
            first.display()
        );
    }
    Ok(outcome::EXIT_OK)
}

/// Renew's selection flags as a policy.
fn policy(f: &RenewFlags) -> Result<Policy, CliError> {
    if f.all && !f.cert.is_empty() {
        return Err(CliError::usage("--all and --cert exclude each other"));
    }
    Ok(Policy {
        within: f.within,
        all: f.all,
        names: f.cert.clone(),
        reuse_keys: f.reuse_keys,
        validity: f.validity,
        allow_beyond_ca: f.allow_beyond_ca,
    })
}

/// `--engine` and the kubeadm engine's flags as an engine.
fn engine(f: &RenewFlags, api_socket: PathBuf) -> Result<Engine, CliError> {
    let kubeadm_flags = [
        ("--kubeadm-image", f.kubeadm_image.is_some()),
        ("--kubeadm-path", f.kubeadm_path.is_some()),
        ("--etcdadm-path", f.etcdadm_path.is_some()),
        ("--ctr-path", f.ctr_path.is_some()),
        ("--containerd-socket", f.containerd_socket.is_some()),
        ("--containerd-namespace", f.containerd_namespace.is_some()),
    ];
    match f.engine {
        EngineChoice::Native => {
            // Ignored with a warning rather than refused: in the QEMU guest a `run` whose
            // arguments had none of these flags intermittently saw one of them set (never on
            // the host, in containerd on the host or under qemu-user; under investigation), and
            // the native engine reads none of them.
            let given: Vec<&str> = kubeadm_flags
                .iter()
                .filter(|(_, given)| *given)
                .map(|(flag, _)| *flag)
                .collect();
            if !given.is_empty() {
                log::warn!(
                    "{} appl{} to --engine kubeadm only: ignored with the native engine",
                    given.join(", "),
                    if given.len() == 1 { "ies" } else { "y" }
                );
            }
            Ok(Engine::Native)
        }
        EngineChoice::Kubeadm if f.reuse_keys => Err(CliError::usage(
            "--reuse-keys: kubeadm and etcdadm always make new keys; use --engine native",
        )),
        EngineChoice::Kubeadm => {
            let d = KubeadmOptions::default();
            Ok(Engine::Kubeadm(KubeadmOptions {
                image: f.kubeadm_image.clone(),
                kubeadm_path: f.kubeadm_path.clone().unwrap_or(d.kubeadm_path),
                etcdadm_path: f.etcdadm_path.clone().unwrap_or(d.etcdadm_path),
                ctr_path: f.ctr_path.clone(),
                socket: f.containerd_socket.clone().unwrap_or(d.socket),
                namespace: f.containerd_namespace.clone().unwrap_or(d.namespace),
                api_socket,
            }))
        }
    }
}

fn write_options(f: &RenewFlags, api_socket: PathBuf) -> Result<WriteOptions, CliError> {
    Ok(WriteOptions {
        lock_timeout: f.lock_timeout,
        retention: f.retention,
        engine: engine(f, api_socket)?,
    })
}

fn restart_options(p: PassFlags) -> RestartOptions {
    RestartOptions {
        platform: p.platform,
        api_socket: p.api_socket,
        timeout: p.restart_timeout,
        poll: p.poll_interval,
        endpoints: p.endpoint.into_iter().collect::<BTreeMap<_, _>>(),
        mode: p.restart,
        reload_timeout: p.reload_timeout,
    }
}

fn run_options(f: &RenewFlags, p: PassFlags) -> Result<RunOptions, CliError> {
    Ok(RunOptions {
        policy: policy(f)?,
        dry_run: f.dry_run,
        write: write_options(f, p.api_socket.clone())?,
        cluster: p.cluster.clone(),
        restart: restart_options(p),
    })
}

fn renew(c: RenewCmd) -> Result<u8, CliError> {
    let f = c.renew_flags();
    let policy = policy(&f)?;
    let opts = write_options(
        &f,
        PathBuf::from(certrotor::node::catalog::paths::API_SOCKET),
    )?;
    let root = root_flag(f.root)?;
    let done = certrotor::pass::ops::renew(&root, &policy, f.dry_run, &opts)?;
    print!(
        "{}",
        render(c.output, &done, |r| report::renew_table(r, true))?
    );
    Ok(outcome::EXIT_OK)
}

fn rollback(c: RollbackCmd) -> Result<u8, CliError> {
    let opts = WriteOptions {
        lock_timeout: c.lock_timeout,
        ..WriteOptions::default()
    };
    let root = root_flag(c.root)?;
    let (id, done) = certrotor::pass::ops::rollback(&root, c.backup.as_deref(), &opts)?;
    print!("{}", report::rollback_text(&id, &done));
    Ok(outcome::EXIT_OK)
}

fn backups(c: BackupsCmd) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    certrotor::pass::ops::recover_before_reading(&root)?;
    let list = certrotor::txn::list_backups(&root).map_err(certrotor::pass::ops::OpsError::from)?;
    let dir = certrotor::txn::state_dir(&root).join("backups");
    print!(
        "{}",
        render(c.output, &list, |l| report::backups_table(
            l,
            &dir.display().to_string()
        ))?
    );
    Ok(outcome::EXIT_OK)
}

fn etcd_export(c: EtcdExportCmd) -> Result<u8, CliError> {
    use std::io::IsTerminal;
    if c.out == "-" && !c.to_terminal && std::io::stdout().is_terminal() {
        return Err(CliError::usage(
            "the bundle holds a private key and standard output is a terminal: give --out FILE, \
             redirect or pipe the output, or add --to-terminal",
        ));
    }
    let root = root_flag(c.root)?;
    let bundle = certrotor::pass::etcd_client::export(&root)?;
    if c.out == "-" {
        use std::io::Write;
        std::io::stdout()
            .write_all(&bundle)
            .map_err(|source| CliError::Bundle {
                what: "cannot write the bundle".into(),
                source,
            })?;
    } else {
        let path = PathBuf::from(&c.out);
        certrotor::sys::fsutil::write_atomic(&path, &bundle, 0o600).map_err(|source| {
            CliError::Bundle {
                what: format!("cannot write the bundle '{}'", path.display()),
                source,
            }
        })?;
    }
    Ok(outcome::EXIT_OK)
}

fn etcd_import(c: EtcdImportCmd) -> Result<u8, CliError> {
    let opts = RunOptions {
        policy: Policy {
            within: 0,
            all: false,
            names: vec![],
            reuse_keys: false,
            validity: clock::YEAR,
            allow_beyond_ca: false,
        },
        dry_run: false,
        write: WriteOptions {
            lock_timeout: c.lock_timeout,
            ..WriteOptions::default()
        },
        restart: restart_options(PassFlags {
            platform: c.platform,
            api_socket: c.api_socket,
            endpoint: c.endpoint,
            restart_timeout: c.restart_timeout,
            poll_interval: c.poll_interval,
            // The old pair may have expired, so etcd may be out of reach: an import acts alone.
            cluster: certrotor::cluster::ClusterOptions {
                mode: certrotor::cluster::Mode::Off,
                ..Default::default()
            },
            // The import changes apiserver-etcd-client, which kube-apiserver cannot reload.
            restart: certrotor::restart::reload::RestartMode::Always,
            reload_timeout: certrotor::restart::reload::DEFAULT_RELOAD_TIMEOUT,
        }),
        cluster: certrotor::cluster::ClusterOptions {
            mode: certrotor::cluster::Mode::Off,
            ..Default::default()
        },
    };
    let root = root_flag(c.root)?;
    let limit = certrotor::pki::MAX_PEM_FILE_BYTES;
    let bundle = if c.from == "-" {
        use std::io::Read;
        let mut buf = Vec::new();
        std::io::stdin()
            .take(limit + 1)
            .read_to_end(&mut buf)
            .map_err(|source| CliError::Bundle {
                what: "cannot read the bundle".into(),
                source,
            })?;
        buf
    } else {
        certrotor::sys::fsutil::read_limited(Path::new(&c.from), &c.from, limit)
            .map_err(CliError::ReadBundle)?
    };
    let done = certrotor::pass::ops::import_etcd_client(&root, &bundle, &opts)?;
    print!("{}", report::import_text(&done));
    Ok(outcome::for_rollback(done.rolled_back.as_ref()))
}

fn run_cmd(c: RunCmd) -> Result<u8, CliError> {
    if !c.once {
        return Err(CliError::usage(
            "'run' needs --once; use 'certrotor daemon' to run repeatedly",
        ));
    }
    let f = c.renew_flags();
    let opts = run_options(&f, c.pass_flags())?;
    let root = root_flag(f.root)?;
    // The pass as `status` and the Kubernetes Event see it (status.rs).
    let done = certrotor::pass::record::run_pass(&root, &opts, None)?;
    print!(
        "{}",
        render(c.output, &done, |r| format!(
            "{}{}",
            report::renew_table(&r.renew, false),
            report::run_table(r)
        ))?
    );
    Ok(outcome::for_run(&done))
}

fn daemon_cmd(c: DaemonCmd) -> Result<u8, CliError> {
    let f = c.renew_flags();
    let opts = run_options(&f, c.pass_flags())?;
    let root = root_flag(f.root)?;
    // A closed stderr (the reader of a pipe gone) must not end the daemon: without SIGPIPE a
    // failed write returns EPIPE, which the logger drops. The daemon prints nothing on stdout.
    // SAFETY: setting a signal disposition to SIG_IGN has no memory-safety preconditions; nix
    // has no safe form of signal(2).
    #[allow(unsafe_code)]
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    // --- metrics (issue 12.1) ---
    let Some(addr) = c.metrics_address else {
        certrotor::pass::ops::daemon(&root, &opts, c.interval);
        return Ok(outcome::EXIT_OK);
    };
    let shared = certrotor::output::metrics::Shared::new(&root);
    let bound = certrotor::output::metrics::serve(addr, std::sync::Arc::clone(&shared))
        .map_err(|source| CliError::Metrics { addr, source })?;
    log::info!("metrics served on http://{bound}/metrics");
    certrotor::pass::ops::daemon_observed(&root, &opts, c.interval, &mut |result, took| {
        shared.update(|m| m.record_pass(result, clock::now(), took));
    });
    Ok(outcome::EXIT_OK)
    // --- end metrics ---
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_flag_values_parse_and_bad_ones_are_refused() {
        assert_eq!(cluster_mode("off"), Ok(certrotor::cluster::Mode::Off));
        assert!(cluster_mode("sometimes").is_err());
        assert_eq!(
            etcd_endpoints("https://127.0.0.1:2379,https://127.0.0.2:2379/").unwrap(),
            ["https://127.0.0.1:2379", "https://127.0.0.2:2379"]
        );
        assert!(etcd_endpoints("http://127.0.0.1:2379").is_err());
        assert!(etcd_endpoints("https://etcd.example:2379").is_err());
        assert!(lease_ttl("1s").is_err());
        assert_eq!(lease_ttl("5s"), Ok(Duration::from_secs(5)));
    }

    #[test]
    fn container_user_data_gives_the_command_line() {
        let base = std::env::temp_dir().join(format!("certrotor-cli-ud-{}", std::process::id()));
        let (boot, host) = (base.join("boot"), base.join("host"));
        let _ = std::fs::remove_dir_all(&base);
        assert_eq!(container_args(&boot, &host), None);
        std::fs::create_dir_all(&host).unwrap();
        assert_eq!(
            container_args(&boot, &host),
            Some(vec!["daemon".to_string()])
        );
        std::fs::write(
            host.join("user-data"),
            "# comment\ndaemon --interval 6h # twice a day\n  --within 60d\n",
        )
        .unwrap();
        let got = container_args(&boot, &host).unwrap();
        assert_eq!(got, ["daemon", "--interval", "6h", "--within", "60d"]);
        std::fs::create_dir_all(&boot).unwrap();
        assert_eq!(
            container_args(&boot, &host).unwrap(),
            ["run", "--once", "--platform", "none"]
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
