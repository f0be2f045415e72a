//! The command line: argument definitions, and the glue from each command to the library.
//!
//! Exit codes (the same for every command, documented in README):
//! - 0: done, everything fine;
//! - 1: `check`: something expires within `--warn-within`;
//! - 2: `check`: something expired, invalid, missing or unreadable; other commands: failed, and
//!   the live PKI is unchanged (or was restored);
//! - 3: renewal applied but live verification failed, and the backup was restored;
//! - 4: another certrotor holds the lock past `--lock-timeout`;
//! - 64: usage error (unknown flag, bad value).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use argh::FromArgs;

use crate::clock;
use crate::inventory::{self, Status};
use crate::lab::{self, LabLayout, LabOptions, Topology};
use crate::pki::KeyAlgorithm;
use crate::report;

/// Exit code: something expires soon (check).
pub const EXIT_EXPIRING: u8 = 1;
/// Exit code: failure, or something expired/invalid (check).
pub const EXIT_FAILED: u8 = 2;
/// Exit code: verification failed; rolled back.
pub const EXIT_ROLLED_BACK: u8 = 3;
/// Exit code: the lock is held by another run.
pub const EXIT_LOCKED: u8 = 4;
/// Exit code: usage error (sysexits EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

#[derive(FromArgs, Debug)]
/// certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes
/// (Bottlerocket host or bootstrap container, or any kubeadm node).
struct Top {
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
}

/// The flags of `renew`, shared by `run` and `daemon`.
macro_rules! renew_command {
    ($(#[$attr:meta])* struct $name:ident { $($extra:tt)* }) => {
        $(#[$attr])*
        struct $name {
            $($extra)*
            #[argh(option)]
            /// the node's root filesystem (default: /.bottlerocket/rootfs inside a Bottlerocket host
            /// container, else /)
            root: Option<PathBuf>,
            #[argh(option, default = "String::from(\"90d\")")]
            /// renew what expires within this duration (default 90d)
            within: String,
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
            #[argh(option, default = "String::from(\"365d\")")]
            /// validity of the renewed certificates (default 365d)
            validity: String,
            #[argh(switch)]
            /// allow certificates to outlive their CA
            allow_beyond_ca: bool,
            #[argh(option, default = "5")]
            /// backups to keep (default 5)
            retention: usize,
            #[argh(option, default = "String::from(\"native\")")]
            /// who issues the certificates: native (default, certrotor itself) or kubeadm (kubeadm
            /// certs renew / etcdadm in the bootstrap image, through containerd)
            engine: String,
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
            #[argh(option, default = "String::from(\"60s\")")]
            /// how long to wait for another certrotor run to finish (default 60s)
            lock_timeout: String,
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
        #[argh(option, default = "String::from(\"table\")")]
        /// output format: table (default) or json
        output: String,
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
    #[argh(option, default = "String::from(\"60s\")")]
    /// how long to wait for another certrotor run to finish (default 60s)
    lock_timeout: String,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "backups")]
/// list the backups certrotor keeps, newest first
struct BackupsCmd {
    #[argh(option)]
    /// the node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"table\")")]
    /// output format: table (default) or json
    output: String,
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
    /// output format: table (default) or json
    #[argh(option, default = "String::from(\"table\")")]
    output: String,
    /// report certificates expiring within this duration as expiring (default 30d)
    #[argh(option, default = "String::from(\"30d\")")]
    warn_within: String,
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
    #[argh(option, default = "String::from(\"kubeadm\")")]
    layout: String,
    /// stacked (etcd on the control plane) or external-etcd; default stacked
    #[argh(option, default = "String::from(\"stacked\")")]
    topology: String,
    /// leaves expire after this duration, negative for already expired (default 365d)
    #[argh(option, default = "String::from(\"365d\")")]
    expires_in: String,
    /// rsa-2048 (default) or ecdsa-p256 (also rsa-3072, rsa-4096, ecdsa-p384)
    #[argh(option, default = "String::from(\"rsa-2048\")")]
    key_algorithm: String,
    /// the node name in certificates (default cp-1)
    #[argh(option, default = "String::from(\"cp-1\")")]
    node_name: String,
    /// the node IP in certificates (default 10.0.0.10)
    #[argh(option, default = "String::from(\"10.0.0.10\")")]
    advertise_address: String,
    /// add this to every standard port in manifests and kubeconfigs, to run lab nodes side by
    /// side (default 0)
    #[argh(option, default = "0")]
    port_offset: u16,
}

/// Turns `--engine` and the kubeadm engine's flags (on `renew`, `run`, `daemon`) into an engine.
macro_rules! engine_flags {
    ($c:expr, $api_socket:expr) => {{
        let c = $c;
        let kubeadm_flags = [
            ("--kubeadm-image", c.kubeadm_image.is_some()),
            ("--kubeadm-path", c.kubeadm_path.is_some()),
            ("--etcdadm-path", c.etcdadm_path.is_some()),
            ("--ctr-path", c.ctr_path.is_some()),
            ("--containerd-socket", c.containerd_socket.is_some()),
            ("--containerd-namespace", c.containerd_namespace.is_some()),
        ];
        match c.engine.as_str() {
            "native" => {
                if let Some((flag, _)) = kubeadm_flags.iter().find(|(_, given)| *given) {
                    return Err(Failure::usage(format!(
                        "{flag} applies to --engine kubeadm only"
                    )));
                }
                crate::engine::Engine::Native
            }
            "kubeadm" => {
                if c.reuse_keys {
                    return Err(Failure::usage(
                        "--reuse-keys: kubeadm and etcdadm always make new keys; use --engine native",
                    ));
                }
                let d = crate::engine::KubeadmOptions::default();
                crate::engine::Engine::Kubeadm(crate::engine::KubeadmOptions {
                    image: c.kubeadm_image.clone(),
                    kubeadm_path: c.kubeadm_path.clone().unwrap_or(d.kubeadm_path),
                    etcdadm_path: c.etcdadm_path.clone().unwrap_or(d.etcdadm_path),
                    ctr_path: c.ctr_path.clone(),
                    socket: c.containerd_socket.clone().unwrap_or(d.socket),
                    namespace: c.containerd_namespace.clone().unwrap_or(d.namespace),
                    api_socket: $api_socket,
                })
            }
            other => {
                return Err(Failure::usage(format!(
                    "--engine '{other}': use native or kubeadm"
                )));
            }
        }
    }};
}

/// `run` and `daemon`: renew's flags plus the platform flags.
macro_rules! pass_command {
    ($(#[$attr:meta])* struct $name:ident { $($extra:tt)* }) => {
        renew_command! {
            $(#[$attr])*
            struct $name {
                $($extra)*
                #[argh(option, default = "String::from(\"auto\")")]
                /// how to restart components: auto (default), bottlerocket, kubeadm or none
                platform: String,
                #[argh(option, default = "String::from(\"/run/api.sock\")")]
                /// the Bottlerocket API socket (default /run/api.sock)
                api_socket: String,
                #[argh(option)]
                /// a component's health endpoint, COMPONENT=IP:PORT, overriding its manifest;
                /// repeatable
                endpoint: Vec<String>,
                #[argh(option, default = "String::from(\"300s\")")]
                /// bound on each wait for a pod to stop or to serve healthy (default 300s)
                restart_timeout: String,
                #[argh(option, default = "String::from(\"500ms\")")]
                /// interval between two polls of a condition (default 500ms)
                poll_interval: String,
                #[argh(option, default = "String::from(\"table\")")]
                /// output format of each pass: table (default) or json
                output: String,
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
        error_code(4, "another certrotor holds the lock"),
        error_code(64, "usage error")
    )]
    /// one pass: check, renew what is due, restart components one at a time, verify, roll back
    /// on failure
    struct RunCmd {
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
        #[argh(option, default = "String::from(\"1h\")")]
        /// time between passes (default 1h, ±10% jitter); after a failure, retries sooner
        interval: String,
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
#[argh(subcommand, name = "export")]
/// on the etcd node: write the apiserver-etcd-client certificate and key as one PEM bundle
struct EtcdExportCmd {
    #[argh(option)]
    /// the etcd node's root filesystem
    root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"-\")")]
    /// where to write the bundle (mode 0600), or - for standard output (default)
    out: String,
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
    #[argh(option, default = "String::from(\"60s\")")]
    /// how long to wait for another certrotor run to finish (default 60s)
    lock_timeout: String,
    #[argh(option, default = "String::from(\"auto\")")]
    /// how to restart kube-apiserver afterwards: auto (default), bottlerocket, kubeadm or none
    platform: String,
    #[argh(option, default = "String::from(\"/run/api.sock\")")]
    /// the Bottlerocket API socket (default /run/api.sock)
    api_socket: String,
    #[argh(option)]
    /// kube-apiserver's health endpoint, kube-apiserver=IP:PORT, overriding its manifest
    endpoint: Vec<String>,
    #[argh(option, default = "String::from(\"300s\")")]
    /// bound on each wait for the pod to stop or to serve healthy (default 300s)
    restart_timeout: String,
    #[argh(option, default = "String::from(\"500ms\")")]
    /// interval between two polls of a condition (default 500ms)
    poll_interval: String,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "demo")]
/// show the whole job on a built-in lab node in a temporary folder
struct DemoCmd {
    /// keep the lab node instead of removing it
    #[argh(switch)]
    keep: bool,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "version")]
/// print the version
struct VersionCmd {}

/// A command's failure: the message and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// A usage error (exit 64).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
    /// A failed command (exit 2).
    pub fn failed(message: impl Into<String>) -> Failure {
        Failure {
            code: EXIT_FAILED,
            message: message.into(),
        }
    }
}

/// Where Bottlerocket mounts a bootstrap container's own folder.
const BOOTSTRAP_CONTAINER_DIR: &str = "/.bottlerocket/bootstrap-containers/current";
/// Where Bottlerocket mounts a host container's own folder.
const HOST_CONTAINER_DIR: &str = "/.bottlerocket/host-containers/current";

/// The command line of a Bottlerocket container, which cannot be given arguments: the words of
/// its user-data file (`#` starts a comment), or by default `run --once --platform none` for a bootstrap
/// container and `daemon` for a host container. `None` outside such a container.
pub fn container_args(bootstrap_dir: &Path, host_dir: &Path) -> Option<Vec<String>> {
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
    // SAFETY: setting a signal disposition to SIG_DFL has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if args.len() <= 1
        && let Some(words) = container_args(
            Path::new(BOOTSTRAP_CONTAINER_DIR),
            Path::new(HOST_CONTAINER_DIR),
        )
    {
        eprintln!(
            "certrotor: arguments from the container's user-data: {}",
            words.join(" ")
        );
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
                    eprint!("{}", early.output);
                    eprintln!("Run '{program} help' or '{program} <command> --help' for usage.");
                    ExitCode::from(EXIT_USAGE)
                }
            };
        }
    };
    match run(top) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            eprintln!("certrotor: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(top: Top) -> Result<u8, Failure> {
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
        Command::Demo(c) => crate::demo::run(c.keep),
        Command::Version(_) => {
            println!("certrotor {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
    }
}

/// Parses a duration flag, as a usage error when malformed.
pub fn duration_flag(flag: &str, value: &str) -> Result<i64, Failure> {
    clock::parse_duration(value).map_err(|e| Failure::usage(format!("--{flag}: {e}")))
}

/// The root: the flag, or the default.
pub fn root_flag(root: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let root = root.unwrap_or_else(inventory::default_root);
    if !root.is_dir() {
        return Err(Failure::failed(format!(
            "the node root '{}' is not a folder; give the node's root filesystem with --root",
            root.display()
        )));
    }
    Ok(root)
}

fn check(c: CheckCmd) -> Result<u8, Failure> {
    let warn = duration_flag("warn-within", &c.warn_within)?;
    if !matches!(c.output.as_str(), "table" | "json") {
        return Err(Failure::usage(format!(
            "--output '{}': use table or json",
            c.output
        )));
    }
    let root = root_flag(c.root)?;
    crate::recover_before_reading(&root)?;
    let inv = inventory::take(&root, clock::now(), warn);
    if c.output == "json" {
        println!("{}", report::json(&inv));
    } else {
        print!("{}", report::table(&inv));
    }
    Ok(check_exit_code(&inv))
}

/// 0 fine, 1 expiring, 2 expired/invalid/missing; 2 as well when nothing was found.
pub fn check_exit_code(inv: &inventory::Inventory) -> u8 {
    if inv.layouts.is_empty() {
        return EXIT_FAILED;
    }
    match inv.worst() {
        Some(Status::Expiring) => EXIT_EXPIRING,
        Some(Status::Expired | Status::Invalid | Status::Missing) => EXIT_FAILED,
        _ => 0,
    }
}

fn lab_init(c: LabInitCmd) -> Result<u8, Failure> {
    let layout = match c.layout.as_str() {
        "kubeadm" => LabLayout::Kubeadm,
        "bottlerocket" => LabLayout::Bottlerocket,
        other => {
            return Err(Failure::usage(format!(
                "--layout '{other}': use kubeadm or bottlerocket"
            )));
        }
    };
    let topology = match c.topology.as_str() {
        "stacked" => Topology::Stacked,
        "external-etcd" => Topology::ExternalEtcd,
        other => {
            return Err(Failure::usage(format!(
                "--topology '{other}': use stacked or external-etcd"
            )));
        }
    };
    let key_algorithm = KeyAlgorithm::parse(&c.key_algorithm).ok_or_else(|| {
        Failure::usage(format!(
            "--key-algorithm '{}': use rsa-2048, rsa-3072, rsa-4096, ecdsa-p256 or ecdsa-p384",
            c.key_algorithm
        ))
    })?;
    let advertise_address = c.advertise_address.parse().map_err(|_| {
        Failure::usage(format!(
            "--advertise-address '{}' is not an IP address",
            c.advertise_address
        ))
    })?;
    if c.node_name.is_empty() || c.node_name.contains('/') {
        return Err(Failure::usage(format!(
            "--node-name '{}' is not a valid node name",
            c.node_name
        )));
    }
    let opts = LabOptions {
        layout,
        topology,
        expires_in: duration_flag("expires-in", &c.expires_in)?,
        key_algorithm,
        node_name: c.node_name,
        advertise_address,
        cluster_name: "kubernetes".into(),
        port_offset: c.port_offset,
        now: clock::now(),
    };
    let summary = lab::init(&c.dir, &opts).map_err(|e| Failure::failed(e.to_string()))?;
    for root in &summary.roots {
        println!("lab node written: {}", root.display());
    }
    println!(
        "{} files; inspect with: certrotor check --root {}",
        summary.files,
        summary.roots[0].display()
    );
    Ok(0)
}

fn output_flag(value: &str) -> Result<bool, Failure> {
    match value {
        "table" => Ok(false),
        "json" => Ok(true),
        other => Err(Failure::usage(format!(
            "--output '{other}': use table or json"
        ))),
    }
}

fn write_options(
    lock_timeout: &str,
    retention: usize,
) -> Result<crate::ops::WriteOptions, Failure> {
    let secs = duration_flag("lock-timeout", lock_timeout)?;
    if secs < 0 {
        return Err(Failure::usage("--lock-timeout must not be negative"));
    }
    Ok(crate::ops::WriteOptions {
        lock_timeout: std::time::Duration::from_secs(secs as u64),
        retention,
        engine: crate::engine::Engine::Native,
    })
}

/// Turns renew's selection flags into a policy.
macro_rules! policy_flags {
    ($c:expr) => {{
        let c = $c;
        if c.all && !c.cert.is_empty() {
            return Err(Failure::usage("--all and --cert exclude each other"));
        }
        let validity = duration_flag("validity", &c.validity)?;
        if validity <= 0 {
            return Err(Failure::usage("--validity must be positive"));
        }
        crate::renew::Policy {
            within: duration_flag("within", &c.within)?,
            all: c.all,
            names: c.cert.clone(),
            reuse_keys: c.reuse_keys,
            validity,
            allow_beyond_ca: c.allow_beyond_ca,
        }
    }};
}

fn renew(c: RenewCmd) -> Result<u8, Failure> {
    let json = output_flag(&c.output)?;
    let engine = engine_flags!(&c, PathBuf::from(crate::catalog::paths::API_SOCKET));
    let policy = policy_flags!(&c);
    let mut opts = write_options(&c.lock_timeout, c.retention)?;
    opts.engine = engine;
    let root = root_flag(c.root)?;
    let report = crate::ops::renew(&root, &policy, c.dry_run, &opts)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", renew_table(&report, true));
    }
    Ok(0)
}

fn renew_table(r: &crate::ops::RenewReport, restart_hint: bool) -> String {
    let mut out = String::new();
    let plan = &r.plan;
    if plan.items.is_empty() {
        out.push_str("Nothing to renew.\n");
    } else {
        let verb = if r.dry_run { "Would renew" } else { "Renewed" };
        out.push_str(&format!(
            "{verb} {} certificate(s), valid {} .. {}{}:\n",
            plan.items.len(),
            plan.not_before,
            plan.not_after,
            if plan.reuse_keys {
                ", keeping their keys"
            } else {
                " with new keys"
            }
        ));
        for i in &plan.items {
            let residual = i
                .residual_seconds
                .map(clock::human_duration)
                .unwrap_or_else(|| "?".into());
            out.push_str(&format!(
                "  {:<32} {:<8} residual {:<10} signer {:<16} {}\n",
                i.name,
                i.reason.to_string(),
                residual,
                i.signer,
                i.path
            ));
        }
    }
    for s in &plan.skipped {
        out.push_str(&format!("  skipped {}: {}\n", s.name, s.why));
    }
    if let Some(id) = &r.backup_id {
        out.push_str(&format!(
            "Backup: {id} (undo with 'certrotor rollback --backup {id}')\n"
        ));
        if restart_hint {
            out.push_str(
                "Components read certificates at start: restart them so that they use the new files \
                 ('certrotor run --once' does it one at a time and verifies).\n",
            );
        }
    }
    out
}

fn rollback(c: RollbackCmd) -> Result<u8, Failure> {
    let opts = write_options(&c.lock_timeout, crate::txn::DEFAULT_RETENTION)?;
    let root = root_flag(c.root)?;
    let (id, outcome) = crate::ops::rollback(&root, c.backup.as_deref(), &opts)?;
    println!(
        "Restored backup {id}: {} file(s). The state before the rollback is backup {}.",
        outcome.files.len(),
        outcome.backup_id
    );
    for f in &outcome.files {
        println!("  {f}");
    }
    Ok(0)
}

fn backups(c: BackupsCmd) -> Result<u8, Failure> {
    let json = output_flag(&c.output)?;
    let root = root_flag(c.root)?;
    crate::recover_before_reading(&root)?;
    let list = crate::txn::list_backups(&root);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&list).unwrap_or_default()
        );
    } else if list.is_empty() {
        println!(
            "No backups under '{}'.",
            crate::txn::state_dir(&root).join("backups").display()
        );
    } else {
        println!("{:<22} {:<22} {:<10} FILES", "ID", "CREATED", "KIND");
        for b in &list {
            println!(
                "{:<22} {:<22} {:<10} {}",
                b.id,
                b.created_at,
                b.kind,
                b.files.len()
            );
        }
    }
    Ok(0)
}

fn etcd_export(c: EtcdExportCmd) -> Result<u8, Failure> {
    let root = root_flag(c.root)?;
    let bundle = crate::etcd_client::export(&root)?;
    if c.out == "-" {
        use std::io::Write;
        std::io::stdout()
            .write_all(&bundle)
            .map_err(|e| Failure::failed(format!("cannot write the bundle: {e}")))?;
    } else {
        let path = PathBuf::from(&c.out);
        crate::fsutil::write_atomic(&path, &bundle, 0o600).map_err(|e| {
            Failure::failed(format!("cannot write the bundle '{}': {e}", path.display()))
        })?;
    }
    Ok(0)
}

fn etcd_import(c: EtcdImportCmd) -> Result<u8, Failure> {
    let opts = crate::ops::RunOptions {
        policy: crate::renew::Policy {
            within: 0,
            all: false,
            names: vec![],
            reuse_keys: false,
            validity: clock::YEAR,
            allow_beyond_ca: false,
        },
        dry_run: false,
        write: write_options(&c.lock_timeout, crate::txn::DEFAULT_RETENTION)?,
        restart: restart_flags(
            &c.platform,
            &c.api_socket,
            &c.endpoint,
            &c.restart_timeout,
            &c.poll_interval,
        )?,
    };
    let root = root_flag(c.root)?;
    let limit = crate::pki::MAX_PEM_FILE_BYTES;
    let bundle = if c.from == "-" {
        use std::io::Read;
        let mut buf = Vec::new();
        std::io::stdin()
            .take(limit + 1)
            .read_to_end(&mut buf)
            .map_err(|e| Failure::failed(format!("cannot read the bundle: {e}")))?;
        buf
    } else {
        crate::fsutil::read_limited(std::path::Path::new(&c.from), &c.from, limit)
            .map_err(|e| Failure::failed(e.to_string()))?
    };
    let report = crate::ops::import_etcd_client(&root, &bundle, &opts)?;
    println!(
        "Installed the apiserver-etcd-client pair (backup {}):",
        report.backup_id
    );
    for f in &report.files {
        println!("  {f}");
    }
    if report.platform == "none" {
        println!(
            "Platform none: restart kube-apiserver so that it uses the new etcd client certificate."
        );
    }
    for r in &report.restarted {
        println!(
            "Restarted {} (unavailable {} ms), verified.",
            r.component.name(),
            r.unavailable_ms
        );
    }
    if let Some(rb) = &report.rolled_back {
        println!("VERIFICATION FAILED: {}", rb.failure);
        println!(
            "Restored backup {}{}",
            rb.backup_id,
            rb.error
                .as_deref()
                .map(|e| format!("; ROLLBACK INCOMPLETE: {e}"))
                .unwrap_or_default()
        );
    }
    Ok(report.exit_code())
}

/// Turns `run`/`daemon` flags into options.
/// The restart flags of `run`, `daemon` and `etcd-client import`.
fn restart_flags(
    platform: &str,
    api_socket: &str,
    endpoints: &[String],
    restart_timeout: &str,
    poll_interval: &str,
) -> Result<crate::restart::RestartOptions, Failure> {
    let platform = crate::restart::PlatformChoice::parse(platform).ok_or_else(|| {
        Failure::usage(format!(
            "--platform '{platform}': use auto, bottlerocket, kubeadm or none"
        ))
    })?;
    let mut parsed = std::collections::BTreeMap::new();
    for e in endpoints {
        let (component, addr) = crate::restart::parse_endpoint(e).map_err(Failure::usage)?;
        parsed.insert(component, addr);
    }
    Ok(crate::restart::RestartOptions {
        platform,
        api_socket: PathBuf::from(api_socket),
        timeout: positive_duration("restart-timeout", restart_timeout)?,
        poll: positive_duration("poll-interval", poll_interval)?,
        endpoints: parsed,
    })
}

macro_rules! run_options {
    ($c:expr) => {{
        let c = $c;
        let json = output_flag(&c.output)?;
        let opts = crate::ops::RunOptions {
            policy: policy_flags!(c),
            dry_run: c.dry_run,
            write: crate::ops::WriteOptions {
                engine: engine_flags!(c, PathBuf::from(&c.api_socket)),
                ..write_options(&c.lock_timeout, c.retention)?
            },
            restart: restart_flags(
                &c.platform,
                &c.api_socket,
                &c.endpoint,
                &c.restart_timeout,
                &c.poll_interval,
            )?,
        };
        (root_flag(c.root.clone())?, opts, json)
    }};
}

/// Parses a duration flag that may be given in milliseconds (`500ms`) and must be positive.
fn positive_duration(flag: &str, value: &str) -> Result<std::time::Duration, Failure> {
    if let Some(ms) = value.strip_suffix("ms") {
        return match ms.parse::<u64>() {
            Ok(n) if n > 0 => Ok(std::time::Duration::from_millis(n)),
            _ => Err(Failure::usage(format!(
                "--{flag} '{value}' must be a positive duration"
            ))),
        };
    }
    match duration_flag(flag, value)? {
        s if s > 0 => Ok(std::time::Duration::from_secs(s as u64)),
        _ => Err(Failure::usage(format!(
            "--{flag} '{value}' must be a positive duration"
        ))),
    }
}

fn run_cmd(c: RunCmd) -> Result<u8, Failure> {
    if !c.once {
        return Err(Failure::usage(
            "'run' needs --once; use 'certrotor daemon' to run repeatedly",
        ));
    }
    let (root, opts, json) = run_options!(&c);
    let report = crate::ops::run_once(&root, &opts)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", renew_table(&report.renew, false));
        print!("{}", run_table(&report));
    }
    Ok(report.exit_code())
}

fn run_table(r: &crate::ops::RunReport) -> String {
    let mut out = String::new();
    if r.components.is_empty() {
        return out;
    }
    let names = r
        .components
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ");
    if r.platform == "none" {
        out.push_str(&format!(
            "Platform none: restart {names} so that they use the new certificates.\n"
        ));
        return out;
    }
    out.push_str(&format!(
        "Restarted one at a time on platform {}:\n",
        r.platform
    ));
    for x in &r.restarted {
        out.push_str(&format!(
            "  {:<24} unavailable {:>6} ms  {}\n",
            x.component.name(),
            x.unavailable_ms,
            x.served_sha256
                .as_deref()
                .map(|s| format!("serves sha256 {s}"))
                .unwrap_or_else(|| "healthy".into())
        ));
    }
    if let Some(rb) = &r.rolled_back {
        out.push_str(&format!("VERIFICATION FAILED: {}\n", rb.failure));
        out.push_str(&format!(
            "Restored backup {} and restarted:\n",
            rb.backup_id
        ));
        for x in &rb.restarted {
            out.push_str(&format!(
                "  {:<24} unavailable {:>6} ms  previous certificate served\n",
                x.component.name(),
                x.unavailable_ms
            ));
        }
        if let Some(e) = &rb.error {
            out.push_str(&format!("ROLLBACK INCOMPLETE: {e}\n"));
        }
    } else {
        out.push_str(&format!("All verified in {} ms.\n", r.duration_ms));
    }
    out
}

fn daemon_cmd(c: DaemonCmd) -> Result<u8, Failure> {
    let interval = positive_duration("interval", &c.interval)?;
    let (root, opts, _json) = run_options!(&c);
    crate::ops::daemon(&root, &opts, interval)
}

#[cfg(test)]
mod tests {
    use super::*;

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
