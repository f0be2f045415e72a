//! The commands and their own flags, as argh reads them. `renew`, `run` and `daemon` share flag
//! groups ([`crate::flags`]): each is its own flags plus its groups, parsed by
//! [`crate::flags::parse_joined`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use argh::{ArgsInfo, CommandInfo, EarlyExit, FromArgs, SubCommand};
use certrotor::lab::{KubeVipShape, LabLayout, Topology};
use certrotor::node::manifests::{Component, Version};
use certrotor::pki::KeyAlgorithm;
use certrotor::restart::PlatformChoice;
use certrotor::sys::clock;

use crate::flags::{PassFlags, RenewFlags, parse_joined, parse_joined3};
use crate::values::{
    CheckOutput, Format, ca_name, check_output, cluster_mode, endpoint, etcd_endpoints, format,
    interval, ip, key_algorithm, kube_vip, layout, metrics_address, node_name, platform, seconds,
    topology, version, wait,
};

#[derive(FromArgs, Debug)]
/// certrotor keeps kubeadm and etcdadm certificates from expiring on immutable nodes
/// (Bottlerocket host or bootstrap container, or any kubeadm node).
pub struct Top {
    #[argh(
        option,
        default = "log::LevelFilter::Info",
        from_str_fn(certrotor::output::logging::parse_level)
    )]
    /// diagnostics on stderr: off, error, warn, info (default), debug or trace; give it before
    /// the command (certrotor --log-level debug daemon)
    pub log_level: log::LevelFilter,
    #[argh(option, default = "certrotor::output::logging::Format::Text")]
    /// diagnostics format: text (default, UTC timestamps) or json (one object per line)
    pub log_format: certrotor::output::logging::Format,
    #[argh(subcommand)]
    pub command: Command,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum Command {
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
    Ca(CaCmd),
}

#[derive(FromArgs, ArgsInfo, Debug)]
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
pub struct RenewOwn {
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
}

/// `renew`: its own flags and the renewal flags.
#[derive(Debug)]
pub struct RenewCmd {
    pub own: RenewOwn,
    pub renew: RenewFlags,
}

impl FromArgs for RenewCmd {
    fn from_args(command: &[&str], args: &[&str]) -> Result<Self, EarlyExit> {
        let (own, renew) = parse_joined(command, args)?;
        Ok(RenewCmd { own, renew })
    }
}

impl SubCommand for RenewCmd {
    const COMMAND: &'static CommandInfo = <RenewOwn as SubCommand>::COMMAND;
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(
    subcommand,
    name = "run",
    note = "For a Bottlerocket bootstrap container or a timer. The restart set follows which files each component reads: etcd (etcd server/peer), kube-apiserver (apiserver, apiserver-kubelet-client, front-proxy-client, apiserver-etcd-client), kube-controller-manager and kube-scheduler (their kubeconfigs).",
    error_code(0, "done (or nothing due)"),
    error_code(2, "failed; nothing was changed, or the automatic rollback failed too"),
    error_code(
        3,
        "verification failed; the previous certificates were restored and are served"
    ),
    error_code(
        4,
        "another certrotor holds the lock; in cluster mode: restarts put off to the next pass (cluster lock or health gate)"
    ),
    error_code(64, "usage error")
)]
/// one pass: check, renew what is due, restart components one at a time, verify, roll back
/// on failure
pub struct RunOwn {
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
    #[argh(switch)]
    /// run one pass and exit (required: use 'certrotor daemon' to repeat)
    pub once: bool,
}

/// `run`: its own flags, the renewal flags and the platform flags.
pub type RunCmd = PassCmd<RunOwn>;

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(
    subcommand,
    name = "daemon",
    note = "For a Bottlerocket host container. Stops on SIGTERM between passes."
)]
/// repeat 'run --once' every --interval (with jitter), logging each decision
pub struct DaemonOwn {
    #[argh(option, default = "Duration::from_secs(3600)", from_str_fn(interval))]
    /// time between passes (default 1h, ±10% jitter); after a failure, retries sooner
    pub interval: Duration,
    #[argh(option, from_str_fn(metrics_address))]
    /// serve Prometheus metrics on http://IP:PORT/metrics (default: off)
    pub metrics_address: Option<SocketAddr>,
}

/// `daemon`: its own flags, the renewal flags and the platform flags.
pub type DaemonCmd = PassCmd<DaemonOwn>;

/// A command that makes passes (`run`, `daemon`): its own flags `O` (which name it), the
/// renewal flags and the platform flags.
#[derive(Debug)]
pub struct PassCmd<O> {
    pub own: O,
    pub renew: RenewFlags,
    pub pass: PassFlags,
}

impl<O: FromArgs + ArgsInfo> FromArgs for PassCmd<O> {
    fn from_args(command: &[&str], args: &[&str]) -> Result<Self, EarlyExit> {
        let (own, renew, pass) = parse_joined3(command, args)?;
        Ok(PassCmd { own, renew, pass })
    }
}

impl<O: FromArgs + ArgsInfo + SubCommand> SubCommand for PassCmd<O> {
    const COMMAND: &'static CommandInfo = O::COMMAND;
}
#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "rollback")]
/// restore a backup (the newest renewal's by default), as a transaction of its own
pub struct RollbackCmd {
    #[argh(option)]
    /// the node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option)]
    /// the backup id to restore (see 'certrotor backups')
    pub backup: Option<String>,
    #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
    /// how long to wait for another certrotor run to finish (default 60s)
    pub lock_timeout: Duration,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "backups")]
/// list the backups certrotor keeps, newest first
pub struct BackupsCmd {
    #[argh(option)]
    /// the node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
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
pub struct CheckCmd {
    /// the node's root filesystem (default: /.bottlerocket/rootfs inside a Bottlerocket host
    /// container, else /)
    #[argh(option)]
    pub root: Option<PathBuf>,
    /// output format: table (default), json, or prometheus (x509-certificate-exporter's
    /// gauges, for node-exporter's textfile collector)
    #[argh(
        option,
        default = "CheckOutput::Plain(Format::Table)",
        from_str_fn(check_output)
    )]
    pub output: CheckOutput,
    /// report certificates expiring within this duration as expiring (default 30d)
    #[argh(option, default = "30 * clock::DAY", from_str_fn(seconds))]
    pub warn_within: i64,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "lab")]
/// lab nodes for demos, tests and benchmarks (not a CA)
pub struct LabCmd {
    #[argh(subcommand)]
    pub command: LabSub,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum LabSub {
    Init(LabInitCmd),
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "init",
    note = "For demos, tests and benchmarks only: this is not a CA. Keys are made on the spot and left unprotected. With --topology external-etcd, two node roots are written: DIR/control-plane and DIR/etcd."
)]
/// write a realistic kubeadm/etcdadm node root under DIR
pub struct LabInitCmd {
    /// the folder to create (must be absent or empty)
    #[argh(positional)]
    pub dir: PathBuf,
    /// kubeadm (etc/kubernetes) or bottlerocket (var/lib/kubeadm); default kubeadm
    #[argh(option, default = "LabLayout::Kubeadm", from_str_fn(layout))]
    pub layout: LabLayout,
    /// stacked (etcd on the control plane) or external-etcd; default stacked
    #[argh(option, default = "Topology::Stacked", from_str_fn(topology))]
    pub topology: Topology,
    /// leaves expire after this duration, negative for already expired (default 365d)
    #[argh(option, default = "clock::YEAR", from_str_fn(seconds))]
    pub expires_in: i64,
    /// rsa-2048 (default) or ecdsa-p256 (also rsa-3072, rsa-4096, ecdsa-p384)
    #[argh(
        option,
        default = "KeyAlgorithm::Rsa(2048)",
        from_str_fn(key_algorithm)
    )]
    pub key_algorithm: KeyAlgorithm,
    /// the node name in certificates (default cp-1)
    #[argh(option, default = "String::from(\"cp-1\")", from_str_fn(node_name))]
    pub node_name: String,
    /// the node IP in certificates (default 10.0.0.10)
    #[argh(option, default = "IpAddr::from([10, 0, 0, 10])", from_str_fn(ip))]
    pub advertise_address: IpAddr,
    /// add this to every standard port in manifests and kubeconfigs, to run lab nodes side by
    /// side (default 0)
    #[argh(option, default = "0")]
    pub port_offset: u16,
    /// also write kube-vip, mounting admin.conf as a single file: eks-anywhere (as EKS
    /// Anywhere renders it: no probe; super-admin.conf from 1.29 on) or probe (the lab's
    /// stand-in with an HTTPS liveness probe)
    #[argh(option, from_str_fn(kube_vip))]
    pub kube_vip: Option<KubeVipShape>,
    /// the Kubernetes version whose images the manifests name, X.Y.Z (default 1.20.2,
    /// the binaries the tests run; the command lines stay v1.20.2's)
    #[argh(
        option,
        default = "certrotor::lab::manifests::DEFAULT_KUBERNETES_VERSION",
        from_str_fn(version)
    )]
    pub kubernetes_version: Version,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "etcd-client")]
/// external etcd: carry the apiserver-etcd-client pair from an etcd node to control planes
pub struct EtcdClientCmd {
    #[argh(subcommand)]
    pub command: EtcdClientSub,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum EtcdClientSub {
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
pub struct EtcdExportCmd {
    #[argh(option)]
    /// the etcd node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"-\")")]
    /// where to write the bundle (mode 0600), or - for standard output (default; a pipe or a
    /// file, not a terminal)
    pub out: String,
    #[argh(switch)]
    /// write the bundle (and its private key) to standard output even when it is a terminal
    pub to_terminal: bool,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "import")]
/// on a control-plane node: check and install an exported bundle, as one transaction
pub struct EtcdImportCmd {
    #[argh(option)]
    /// the control-plane node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "String::from(\"-\")")]
    /// the bundle file, or - for standard input (default)
    pub from: String,
    #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
    /// how long to wait for another certrotor run to finish (default 60s)
    pub lock_timeout: Duration,
    #[argh(option, default = "PlatformChoice::Auto", from_str_fn(platform))]
    /// how to restart kube-apiserver afterwards: auto (default), bottlerocket, kubeadm or none
    pub platform: PlatformChoice,
    #[argh(
        option,
        default = "PathBuf::from(certrotor::node::catalog::paths::API_SOCKET)"
    )]
    /// the Bottlerocket API socket (default /run/api.sock)
    pub api_socket: PathBuf,
    #[argh(option, from_str_fn(endpoint))]
    /// kube-apiserver's health endpoint, kube-apiserver=IP:PORT, overriding its manifest
    pub endpoint: Vec<(Component, SocketAddr)>,
    #[argh(option, default = "Duration::from_secs(300)", from_str_fn(interval))]
    /// bound on each wait for the pod to stop or to serve healthy (default 300s)
    pub restart_timeout: Duration,
    #[argh(option, default = "Duration::from_millis(500)", from_str_fn(interval))]
    /// interval between two polls of a condition (default 500ms)
    pub poll_interval: Duration,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "demo")]
/// show the whole job on a built-in lab node in a temporary folder
pub struct DemoCmd {
    /// keep the lab node instead of removing it
    #[argh(switch)]
    pub keep: bool,
}

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
pub struct StatusCmd {
    #[argh(option)]
    /// the node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
    #[argh(option, from_str_fn(seconds))]
    /// the renewal window to compute the next renewal with (default: the last pass's, else 90d)
    pub within: Option<i64>,
    #[argh(
        option,
        default = "certrotor::cluster::Mode::Auto",
        from_str_fn(cluster_mode)
    )]
    /// auto (default: ask etcd who holds the cluster lock, where the manifests give etcd
    /// endpoints; at most 5 s per endpoint) or off
    pub cluster: certrotor::cluster::Mode,
    #[argh(option, from_str_fn(etcd_endpoints))]
    /// etcd endpoint(s) https://IP:PORT, overriding the manifests; repeatable
    pub etcd_endpoint: Vec<Vec<String>>,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "version")]
/// print the version
pub struct VersionCmd {}

#[derive(FromArgs, Debug)]
#[argh(subcommand, name = "ca")]
/// CA rotation with overlapping trust: trust-in, issue, trust-out
pub struct CaCmd {
    #[argh(subcommand)]
    pub command: CaSub,
}

#[derive(FromArgs, Debug)]
#[argh(subcommand)]
pub enum CaSub {
    Plan(CaPlanCmd),
    Rotate(CaRotateCmd),
    Continue(CaContinueCmd),
    Abort(CaAbortCmd),
    Status(CaStatusCmd),
}

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(
    subcommand,
    name = "rotate",
    note = "Each stage is one transaction with a backup, its restarts made one at a time and verified by a pass, and is resumed by running the same command again after a crash. Stops before trust-out: 'certrotor ca continue' does it, 'certrotor ca abort' undoes the rotation. On stacked control planes, run it on each: they share one new CA and take turns through etcd. Not built yet (refused, nothing changed): the cluster CA, and an external etcd.",
    error_code(0, "trust-in and issue done: waiting for 'ca continue'"),
    error_code(
        2,
        "refused or failed; the stage in progress is resumed by the same command"
    ),
    error_code(3, "a stage's verification failed and its files were restored"),
    error_code(4, "another certrotor holds the lock"),
    error_code(64, "usage error")
)]
/// rotate a CA on this node: a new CA trusted beside the old (trust-in), then signing every
/// leaf again (issue)
pub struct CaRotateOwn {
    #[argh(option, from_str_fn(ca_name))]
    /// the CA: ca (the cluster CA), front-proxy-ca or etcd-ca
    pub ca: certrotor::ca::CaName,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
}

/// `ca rotate`: its own flags, the renewal flags and the platform flags.
pub type CaRotateCmd = PassCmd<CaRotateOwn>;

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(
    subcommand,
    name = "continue",
    note = "After 'ca rotate': every trust file holds the new CA alone, what cannot reload is restarted one at a time and verified; the old CA's key is removed (it stays in the backups).",
    error_code(0, "done"),
    error_code(2, "refused or failed; run the same command again"),
    error_code(3, "verification failed and the files were restored"),
    error_code(4, "another certrotor holds the lock"),
    error_code(64, "usage error")
)]
/// trust-out: the old CA leaves every trust file on this node
pub struct CaContinueOwn {
    #[argh(option, from_str_fn(ca_name))]
    /// the CA being rotated
    pub ca: certrotor::ca::CaName,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
}

/// `ca continue`: its own flags, the renewal flags and the platform flags.
pub type CaContinueCmd = PassCmd<CaContinueOwn>;

#[derive(FromArgs, ArgsInfo, Debug)]
#[argh(
    subcommand,
    name = "abort",
    note = "Before trust-out only. After the issue, the old CA signs again and every leaf is issued again from it first.",
    error_code(0, "aborted: the old CA alone"),
    error_code(2, "refused or failed; run the same command again"),
    error_code(3, "verification failed and the files were restored"),
    error_code(4, "another certrotor holds the lock"),
    error_code(64, "usage error")
)]
/// undo a CA rotation on this node: back to the old CA alone
pub struct CaAbortOwn {
    #[argh(option, from_str_fn(ca_name))]
    /// the CA being rotated
    pub ca: certrotor::ca::CaName,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
}

/// `ca abort`: its own flags, the renewal flags and the platform flags.
pub type CaAbortCmd = PassCmd<CaAbortOwn>;

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "status",
    note = "Reads var/lib/certrotor/ca-rotation.json; changes nothing.",
    error_code(0, "shown (or no rotation recorded)"),
    error_code(2, "the state file cannot be used"),
    error_code(64, "usage error")
)]
/// the CA rotation recorded on this node and its stages
pub struct CaStatusCmd {
    #[argh(option)]
    /// the node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
}

#[derive(FromArgs, Debug)]
#[argh(
    subcommand,
    name = "plan",
    note = "Reads the node's PKI, kubeconfigs and static pod manifests; changes nothing.",
    error_code(0, "plan shown"),
    error_code(2, "the CA is not on this node, or the node cannot be read"),
    error_code(64, "usage error")
)]
/// what rotating a CA touches on this node, stage by stage, and what reloads or restarts
pub struct CaPlanCmd {
    #[argh(option, from_str_fn(ca_name))]
    /// the CA: ca (the cluster CA), front-proxy-ca or etcd-ca
    pub ca: certrotor::ca::CaName,
    #[argh(option)]
    /// the node's root filesystem
    pub root: Option<PathBuf>,
    #[argh(option, default = "Format::Table", from_str_fn(format))]
    /// output format: table (default) or json
    pub output: Format,
    #[argh(option, default = "PlatformChoice::Auto", from_str_fn(platform))]
    /// where the static pods are read: auto (default), bottlerocket, kubeadm or none
    pub platform: PlatformChoice,
    #[argh(
        option,
        default = "PathBuf::from(certrotor::node::catalog::paths::API_SOCKET)"
    )]
    /// the Bottlerocket API socket (default /run/api.sock)
    pub api_socket: PathBuf,
}
