//! Flag groups that several commands share, as plain argh structs: [`RenewFlags`] (`renew`,
//! `run`, `daemon`) and [`PassFlags`] (`run`, `daemon`). argh has no flattening, so
//! [`parse_joined`] parses one command line into a command's own flags and its groups: each
//! flag goes to the group that declares it (argh's `ArgsInfo`), with its value; anything else
//! goes to the command's own flags, which report it as argh does. `--help` prints the command's
//! help with every group's options.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use argh::{ArgsInfo, EarlyExit, FromArgs};
use certrotor::cluster::ClusterOptions;
use certrotor::node::manifests::{Component, Version};
use certrotor::restart::PlatformChoice;
use certrotor::sys::clock::{self, SharedClock};

use crate::values::{
    EngineChoice, cluster_mode, component_version, endpoint, engine_choice, etcd_endpoints,
    interval, lease_ttl, platform, positive_seconds, restart_mode, seconds, version, wait,
};

#[derive(FromArgs, ArgsInfo, Debug, Clone)]
/// what to renew and how (`renew`, `run`, `daemon`)
pub struct RenewFlags {
    #[argh(option)]
    /// the node's root filesystem (default: /.bottlerocket/rootfs inside a Bottlerocket host
    /// container, else /)
    pub root: Option<PathBuf>,
    #[argh(option, default = "90 * clock::DAY", from_str_fn(seconds))]
    /// renew what expires within this duration (default 90d)
    pub within: i64,
    #[argh(switch)]
    /// renew everything renewable, due or not
    pub all: bool,
    #[argh(option)]
    /// renew this certificate (a name printed by check); repeatable
    pub cert: Vec<String>,
    #[argh(switch)]
    /// print the plan and change nothing
    pub dry_run: bool,
    #[argh(switch)]
    /// keep the existing private keys (default: a new key of the same algorithm, as kubeadm)
    pub reuse_keys: bool,
    #[argh(option, default = "clock::YEAR", from_str_fn(positive_seconds))]
    /// validity of the renewed certificates (default 365d)
    pub validity: i64,
    #[argh(switch)]
    /// allow certificates to outlive their CA
    pub allow_beyond_ca: bool,
    #[argh(option, default = "5")]
    /// backups to keep (default 5)
    pub retention: usize,
    #[argh(option, default = "EngineChoice::Native", from_str_fn(engine_choice))]
    /// who issues the certificates: native (default, certrotor itself) or kubeadm (kubeadm
    /// certs renew / etcdadm in the bootstrap image, through containerd)
    pub engine: EngineChoice,
    #[argh(option)]
    /// kubeadm engine: the image with kubeadm and etcdadm (default: the Bottlerocket setting
    /// host-containers.kubeadm-bootstrap.source); it must already be in containerd
    pub kubeadm_image: Option<String>,
    #[argh(option)]
    /// kubeadm engine: kubeadm in the image (default /opt/bin/kubeadm)
    pub kubeadm_path: Option<String>,
    #[argh(option)]
    /// kubeadm engine: etcdadm in the image (default /opt/bin/etcdadm)
    pub etcdadm_path: Option<String>,
    #[argh(option)]
    /// kubeadm engine: the host's ctr (default /.bottlerocket/rootfs/usr/bin/ctr when it
    /// exists, else ctr from PATH)
    pub ctr_path: Option<PathBuf>,
    #[argh(option)]
    /// kubeadm engine: containerd's socket (default: look in host-containerd's namespace
    /// default, then in /run/containerd/containerd.sock's k8s.io and default)
    pub containerd_socket: Option<PathBuf>,
    #[argh(option)]
    /// kubeadm engine: containerd namespace of the image (default k8s.io with
    /// --containerd-socket)
    pub containerd_namespace: Option<String>,
    #[argh(option, default = "Duration::from_secs(60)", from_str_fn(wait))]
    /// how long to wait for another certrotor run to finish (default 60s)
    pub lock_timeout: Duration,
}

#[derive(FromArgs, ArgsInfo, Debug, Clone)]
/// how to restart and verify, alone or as one node of a cluster (`run`, `daemon`)
pub struct PassFlags {
    #[argh(option, default = "PlatformChoice::Auto", from_str_fn(platform))]
    /// how to restart components: auto (default), bottlerocket, kubeadm or none
    pub platform: PlatformChoice,
    #[argh(
        option,
        default = "PathBuf::from(certrotor::node::catalog::paths::API_SOCKET)"
    )]
    /// the Bottlerocket API socket (default /run/api.sock)
    pub api_socket: PathBuf,
    #[argh(option, from_str_fn(endpoint))]
    /// a component's health endpoint, COMPONENT=IP:PORT, overriding its manifest;
    /// repeatable
    pub endpoint: Vec<(Component, SocketAddr)>,
    #[argh(option, default = "Duration::from_secs(300)", from_str_fn(interval))]
    /// bound on each wait for a pod to stop or to serve healthy (default 300s)
    pub restart_timeout: Duration,
    #[argh(option, default = "Duration::from_millis(500)", from_str_fn(interval))]
    /// interval between two polls of a condition (default 500ms)
    pub poll_interval: Duration,
    #[argh(
        option,
        default = "certrotor::cluster::Mode::Auto",
        from_str_fn(cluster_mode)
    )]
    /// cluster mode: auto (default: coordinate restarts through etcd where the
    /// manifests give etcd endpoints) or off (act alone)
    pub cluster: certrotor::cluster::Mode,
    #[argh(option, from_str_fn(etcd_endpoints))]
    /// etcd endpoint(s) https://IP:PORT for cluster mode, overriding the manifests;
    /// repeatable
    pub etcd_endpoint: Vec<Vec<String>>,
    #[argh(option, default = "Duration::from_secs(600)", from_str_fn(interval))]
    /// bound on the wait for the cluster lock and health gates before restarts are
    /// put off to the next pass (default 600s)
    pub cluster_wait: Duration,
    #[argh(option, default = "Duration::from_secs(15)", from_str_fn(lease_ttl))]
    /// lease of the cluster lock: how long a dead holder blocks the others
    /// (default 15s)
    pub cluster_lease_ttl: Duration,
    #[argh(option, default = "Duration::from_secs(300)", from_str_fn(interval))]
    /// cluster mode: how long a node whose kube-controller-manager, kube-scheduler
    /// or kube-vip holds its leader Lease waits for the other nodes to restart
    /// theirs first, then proceeds (default 300s, at most --cluster-wait)
    pub leader_wait: Duration,
    #[argh(
        option,
        default = "certrotor::restart::reload::RestartMode::Live",
        from_str_fn(restart_mode)
    )]
    /// live (default: restart only the components that cannot reload a renewed
    /// file, or did not within --reload-timeout) or always (restart every
    /// component whose files changed)
    pub restart: certrotor::restart::reload::RestartMode,
    #[argh(
        option,
        default = "certrotor::restart::reload::DEFAULT_RELOAD_TIMEOUT",
        from_str_fn(interval)
    )]
    /// bound on the wait for a component to serve a renewed file by itself before
    /// it is restarted (default 90s; kube-apiserver re-reads about once a minute)
    pub reload_timeout: Duration,
    #[argh(option, from_str_fn(version))]
    /// the Kubernetes version kube-apiserver, kube-controller-manager and
    /// kube-scheduler run, X.Y[.Z], instead of their manifests' image tags (what
    /// reloads without a restart depends on it)
    pub kubernetes_version: Option<Version>,
    #[argh(option, from_str_fn(component_version))]
    /// one component's version, NAME=X.Y[.Z] (e.g. etcd=3.5.16), instead of its
    /// manifest's image tag; repeatable; it wins over --kubernetes-version
    pub component_version: Vec<(Component, Version)>,
    #[argh(
        option,
        default = "certrotor::restart::reload::DEFAULT_HELD_CERT_MARGIN",
        from_str_fn(interval)
    )]
    /// kube-apiserver before 1.27 keeps the old apiserver-kubelet-client on open
    /// connections to kubelets: it is restarted when that certificate expires
    /// within this margin (default 24h)
    pub held_cert_margin: Duration,
    #[argh(
        option,
        default = "certrotor::restart::DEFAULT_SETTLE",
        from_str_fn(interval)
    )]
    /// how long a restarted static pod without a health endpoint certrotor probes
    /// (kube-vip) must keep its new process before its restart counts (default 10s)
    pub settle: Duration,
}

impl PassFlags {
    /// The version flags and the held-certificate margin as the reload decision's options.
    pub fn reload_options(&self) -> certrotor::restart::reload::ReloadOptions {
        let mut versions = std::collections::BTreeMap::new();
        if let Some(v) = self.kubernetes_version {
            for c in [
                Component::KubeApiserver,
                Component::KubeControllerManager,
                Component::KubeScheduler,
            ] {
                versions.insert(c, v);
            }
        }
        versions.extend(self.component_version.iter().copied());
        certrotor::restart::reload::ReloadOptions {
            versions,
            held_cert_margin: self.held_cert_margin,
        }
    }

    /// The cluster-mode flags as the library's options, dated by `clock`.
    pub fn cluster_options(&self, clock: &SharedClock) -> ClusterOptions {
        ClusterOptions {
            mode: self.cluster,
            endpoints: self.etcd_endpoint.concat(),
            wait: self.cluster_wait,
            lease_ttl: self.cluster_lease_ttl,
            leader_wait: self.leader_wait,
            clock: clock.clone(),
        }
    }
}

/// A command line parsed into a command's own flags `A` and one group `B`.
pub fn parse_joined<A, B>(command: &[&str], args: &[&str]) -> Result<(A, B), EarlyExit>
where
    A: FromArgs + ArgsInfo,
    B: FromArgs + ArgsInfo,
{
    if wants_help(args) {
        return Err(merged_help(
            help_text::<A>(command),
            &[help_text::<B>(command)],
        ));
    }
    let parts = route(args, &[A::get_args_info(), B::get_args_info()]);
    Ok((
        A::from_args(command, &parts[0])?,
        B::from_args(command, &parts[1])?,
    ))
}

/// A command line parsed into a command's own flags `A` and two groups `B` and `C`.
pub fn parse_joined3<A, B, C>(command: &[&str], args: &[&str]) -> Result<(A, B, C), EarlyExit>
where
    A: FromArgs + ArgsInfo,
    B: FromArgs + ArgsInfo,
    C: FromArgs + ArgsInfo,
{
    if wants_help(args) {
        let groups = [help_text::<B>(command), help_text::<C>(command)];
        return Err(merged_help(help_text::<A>(command), &groups));
    }
    let infos = [A::get_args_info(), B::get_args_info(), C::get_args_info()];
    let parts = route(args, &infos);
    Ok((
        A::from_args(command, &parts[0])?,
        B::from_args(command, &parts[1])?,
        C::from_args(command, &parts[2])?,
    ))
}

/// The arguments of each group: a `--flag` declared by group `i > 0` goes there with its value
/// (an option takes the next argument); everything else stays with the command (group 0).
fn route<'a>(args: &[&'a str], groups: &[argh::CommandInfoWithArgs]) -> Vec<Vec<&'a str>> {
    let mut parts = vec![Vec::new(); groups.len()];
    let mut i = 0;
    while i < args.len() {
        let arg = args[i];
        let owner = groups
            .iter()
            .enumerate()
            .skip(1)
            .find_map(|(g, info)| info.flags.iter().find(|f| f.long == arg).map(|f| (g, f)));
        match owner {
            Some((g, flag)) => {
                parts[g].push(arg);
                if matches!(flag.kind, argh::FlagInfoKind::Option { .. }) && i + 1 < args.len() {
                    i += 1;
                    parts[g].push(args[i]);
                }
            }
            None => parts[0].push(arg),
        }
        i += 1;
    }
    parts
}

/// Whether the line asks for help, as argh reads it (`--help` anywhere, or `help` first).
fn wants_help(args: &[&str]) -> bool {
    args.first() == Some(&"help") || args.contains(&"--help")
}

/// The help argh prints for `T`.
fn help_text<T: FromArgs>(command: &[&str]) -> String {
    match T::from_args(command, &["--help"]) {
        Err(early) => early.output,
        Ok(_) => String::new(),
    }
}

/// The command's help with each group's flags added to its usage line and its options (before
/// `--help`, which stays last).
fn merged_help(own: String, groups: &[String]) -> EarlyExit {
    let mut lines: Vec<String> = own.lines().map(str::to_string).collect();
    for group in groups {
        let mut group_lines = group.lines();
        let usage = group_lines.next().unwrap_or_default();
        if let (Some(first), Some((_, flags))) = (lines.first_mut(), usage.split_once(" [")) {
            first.push_str(" [");
            first.push_str(flags);
        }
        let options: Vec<String> = group_lines
            .skip_while(|l| *l != "Options:")
            .skip(1)
            .take_while(|l| !l.starts_with("  --help"))
            .map(str::to_string)
            .collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("  --help"))
            .unwrap_or(lines.len());
        lines.splice(at..at, options);
    }
    EarlyExit {
        output: lines.join("\n") + "\n",
        status: Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{DaemonCmd, RenewCmd, RunCmd};
    use crate::values::Format;

    const RUN: &[&str] = &["certrotor", "run"];

    #[test]
    fn a_command_line_is_split_between_the_command_and_its_groups() {
        let args = [
            "--once",
            "--within",
            "30d",
            "--platform",
            "none",
            "--cert",
            "apiserver",
            "--cert",
            "admin.conf",
            "--output",
            "json",
            "--cluster-wait",
            "5s",
            "--etcd-endpoint",
            "https://127.0.0.1:2379",
        ];
        let c = RunCmd::from_args(RUN, &args).unwrap();
        assert!(c.own.once);
        assert_eq!(c.own.output, Format::Json);
        assert_eq!(c.renew.within, 30 * clock::DAY);
        assert_eq!(c.renew.cert, ["apiserver", "admin.conf"]);
        assert_eq!(c.pass.platform, PlatformChoice::None);
        let clock = clock::SystemClock::shared();
        assert_eq!(c.pass.cluster_options(&clock).wait, Duration::from_secs(5));
        assert_eq!(
            c.pass.cluster_options(&clock).endpoints,
            ["https://127.0.0.1:2379"]
        );
        // Defaults come from each group.
        let d = DaemonCmd::from_args(&["certrotor", "daemon"], &[]).unwrap();
        assert_eq!(d.own.interval, Duration::from_secs(3600));
        assert_eq!(d.renew.within, 90 * clock::DAY);
        assert_eq!(d.pass.restart_timeout, Duration::from_secs(300));
    }

    #[test]
    fn unknown_flags_and_bad_values_are_errors_naming_the_flag() {
        let e = RunCmd::from_args(RUN, &["--once", "--bogus"]).unwrap_err();
        assert!(e.status.is_err());
        assert!(e.output.contains("--bogus"), "{}", e.output);
        let e = RunCmd::from_args(RUN, &["--platform", "sometimes"]).unwrap_err();
        assert!(e.output.contains("--platform"), "{}", e.output);
        // A group's flag on a command without that group is unknown there.
        let e = RenewCmd::from_args(&["certrotor", "renew"], &["--platform", "none"]);
        assert!(e.unwrap_err().output.contains("--platform"));
        // An option without its value is refused by its group.
        let e = RunCmd::from_args(RUN, &["--within"]).unwrap_err();
        assert!(e.output.contains("--within"), "{}", e.output);
    }

    #[test]
    fn help_lists_the_options_of_the_command_and_of_every_group() {
        let e = RunCmd::from_args(RUN, &["--help"]).unwrap_err();
        assert!(e.status.is_ok());
        let usage = e.output.lines().next().unwrap();
        for flag in [
            "--output",
            "--once",
            "--within",
            "--platform",
            "--reload-timeout",
        ] {
            assert!(usage.contains(flag), "usage lacks {flag}: {usage}");
            assert!(
                e.output.contains(&format!("\n  {flag}")),
                "options lack {flag}:\n{}",
                e.output
            );
        }
        // `--help` stays the last option, before the command's notes and exit codes.
        let help = e.output.find("  --help, help").unwrap();
        assert!(e.output[..help].contains("--reload-timeout"));
        assert!(e.output[help..].contains("Error codes:"));
    }
}
