//! Each command, from its parsed flags to one library call, what it prints, and its exit code
//! (chosen with [`certrotor::pass::outcome`] from the library's typed errors and reports).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use argh::FromArgs;
use certrotor::lab::{self, LabOptions};
use certrotor::node::inventory;
use certrotor::output::report;
use certrotor::pass::ops::WriteOptions;
use certrotor::pass::outcome::{self, EXIT_USAGE};
use certrotor::pass::run::RunOptions;
use certrotor::renew::Policy;
use certrotor::renew::engine::{Engine, KubeadmOptions};
use certrotor::restart::reload::{DEFAULT_RELOAD_TIMEOUT, RestartMode};
use certrotor::restart::{PlatformChoice, RestartOptions};
use certrotor::sys::clock::{SharedClock, SystemClock, YEAR};

use crate::args::{
    BackupsCmd, CaCmd, CaPlanCmd, CaStatusCmd, CaSub, CheckCmd, Command, DaemonCmd, EtcdClientCmd,
    EtcdClientSub, EtcdExportCmd, EtcdImportCmd, LabCmd, LabInitCmd, LabSub, RenewCmd, RollbackCmd,
    RunCmd, StatusCmd, Top,
};
use crate::container::{
    BOOTSTRAP_CONTAINER_DIR, HOST_CONTAINER_DIR, Kind, check_fits, container_args, first_boot_note,
    is_run_once,
};
use crate::error::CliError;
use crate::flags::{PassFlags, RenewFlags};
use crate::values::{CheckOutput, EngineChoice, Format};

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
        && let Some((kind, words)) = container_args(
            Path::new(BOOTSTRAP_CONTAINER_DIR),
            Path::new(HOST_CONTAINER_DIR),
        )
    {
        from_user_data = Some((kind, words.clone()));
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
    let mut first_boot_allowed = false;
    if let Some((kind, words)) = &from_user_data {
        log::info!(
            "arguments from the container's user-data: {} ({})",
            words.join(" "),
            kind.name()
        );
        // Checked after parsing, so that a mistyped flag is reported as such first.
        if let Err(why) = check_fits(*kind, words) {
            log::error!("{why}");
            return ExitCode::from(EXIT_USAGE);
        }
        first_boot_allowed = *kind == Kind::Bootstrap && is_run_once(words);
    }
    match run(top, first_boot_allowed) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            log::error!("{e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `first_boot_allowed`: a bootstrap container's `run --once` from its user-data, which exits 0
/// on a node's very first boot (see [`first_boot_note`]).
/// The edge: the one place the system clock is chosen; every command reads the date from it.
fn run(top: Top, first_boot_allowed: bool) -> Result<u8, CliError> {
    let clock = SystemClock::shared();
    match top.command {
        Command::Check(c) => check(c, &clock),
        Command::Lab(LabCmd {
            command: LabSub::Init(c),
        }) => lab_init(c, &clock),
        Command::Renew(c) => renew(c, &clock),
        Command::Rollback(c) => rollback(c, &clock),
        Command::Backups(c) => backups(c),
        Command::EtcdClient(EtcdClientCmd {
            command: EtcdClientSub::Export(c),
        }) => etcd_export(c, &clock),
        Command::EtcdClient(EtcdClientCmd {
            command: EtcdClientSub::Import(c),
        }) => etcd_import(c, &clock),
        Command::Run(c) => run_cmd(c, first_boot_allowed, &clock),
        Command::Daemon(c) => daemon_cmd(c, &clock),
        Command::Demo(c) => {
            certrotor::lab::demo::run(c.keep, &clock).map_err(CliError::Demo)?;
            Ok(outcome::EXIT_OK)
        }
        Command::Status(c) => status_cmd(c, &clock),
        Command::Ca(CaCmd { command }) => ca(command, &clock),
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
        // Text from state files, etcd and the node's files, shown without a raw control
        // character (issue 30.12).
        Format::Table => certrotor::output::logging::escape_controls(&table(value)).into_owned(),
    })
}

fn check(c: CheckCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    certrotor::pass::ops::recover_before_reading(&root)?;
    let now = clock.now();
    // Found after the recovery above, which may have put files back.
    let node = certrotor::node::Node::discover(&root);
    let inv = inventory::take(&node, now, c.warn_within);
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

fn lab_init(c: LabInitCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let opts = LabOptions {
        layout: c.layout,
        topology: c.topology,
        expires_in: c.expires_in,
        key_algorithm: c.key_algorithm,
        node_name: c.node_name,
        advertise_address: c.advertise_address,
        cluster_name: "kubernetes".into(),
        port_offset: c.port_offset,
        kubernetes_version: c.kubernetes_version,
        now: clock.now(),
    };
    let summary = lab::init(&c.dir, &opts).map_err(CliError::Lab)?;
    if let Some(shape) = c.kube_vip {
        for root in &summary.roots {
            lab::add_kube_vip(root, c.layout, c.port_offset, shape, c.kubernetes_version)
                .map_err(CliError::Lab)?;
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
                socket: f.containerd_socket.clone(),
                namespace: f.containerd_namespace.clone(),
                api_socket,
            }))
        }
    }
}

fn write_options(
    f: &RenewFlags,
    api_socket: PathBuf,
    clock: &SharedClock,
) -> Result<WriteOptions, CliError> {
    Ok(WriteOptions {
        lock_timeout: f.lock_timeout,
        retention: f.retention,
        engine: engine(f, api_socket)?,
        clock: clock.clone(),
    })
}

fn restart_options(p: &PassFlags) -> RestartOptions {
    RestartOptions {
        platform: p.platform,
        api_socket: p.api_socket.clone(),
        timeout: p.restart_timeout,
        poll: p.poll_interval,
        endpoints: p.endpoint.iter().cloned().collect::<BTreeMap<_, _>>(),
        mode: p.restart,
        reload_timeout: p.reload_timeout,
        reload: p.reload_options(),
        settle: p.settle,
    }
}

fn run_options(f: &RenewFlags, p: &PassFlags, clock: &SharedClock) -> Result<RunOptions, CliError> {
    Ok(RunOptions {
        policy: policy(f)?,
        dry_run: f.dry_run,
        write: write_options(f, p.api_socket.clone(), clock)?,
        cluster: p.cluster_options(clock),
        restart: restart_options(p),
    })
}

fn renew(c: RenewCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let f = c.renew;
    let policy = policy(&f)?;
    let opts = write_options(
        &f,
        PathBuf::from(certrotor::node::catalog::paths::API_SOCKET),
        clock,
    )?;
    let root = root_flag(f.root)?;
    let done = certrotor::pass::ops::renew(&root, &policy, f.dry_run, &opts)?;
    print!(
        "{}",
        render(c.own.output, &done, |r| report::renew_table(r, true))?
    );
    Ok(outcome::EXIT_OK)
}

fn rollback(c: RollbackCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let opts = WriteOptions {
        lock_timeout: c.lock_timeout,
        ..WriteOptions::new(clock.clone())
    };
    let root = root_flag(c.root)?;
    let (id, done) = certrotor::pass::ops::rollback(&root, c.backup.as_deref(), &opts)?;
    print!(
        "{}",
        certrotor::output::logging::escape_controls(&report::rollback_text(&id, &done))
    );
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

fn etcd_export(c: EtcdExportCmd, clock: &SharedClock) -> Result<u8, CliError> {
    use std::io::IsTerminal;
    if c.out == "-" && !c.to_terminal && std::io::stdout().is_terminal() {
        return Err(CliError::usage(
            "the bundle holds a private key and standard output is a terminal: give --out FILE, \
             redirect or pipe the output, or add --to-terminal",
        ));
    }
    let root = root_flag(c.root)?;
    let bundle = certrotor::pass::etcd_client::export(&root, clock.now())?;
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

fn etcd_import(c: EtcdImportCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let opts = RunOptions {
        policy: Policy {
            within: 0,
            all: false,
            names: vec![],
            reuse_keys: false,
            validity: YEAR,
            allow_beyond_ca: false,
        },
        dry_run: false,
        write: WriteOptions {
            lock_timeout: c.lock_timeout,
            ..WriteOptions::new(clock.clone())
        },
        restart: RestartOptions {
            platform: c.platform,
            api_socket: c.api_socket,
            timeout: c.restart_timeout,
            poll: c.poll_interval,
            endpoints: c.endpoint.into_iter().collect(),
            // The import changes apiserver-etcd-client, which kube-apiserver cannot reload.
            mode: RestartMode::Always,
            reload_timeout: DEFAULT_RELOAD_TIMEOUT,
            reload: Default::default(),
            settle: certrotor::restart::DEFAULT_SETTLE,
        },
        // The old pair may have expired, so etcd may be out of reach: an import acts alone.
        cluster: certrotor::cluster::ClusterOptions {
            mode: certrotor::cluster::Mode::Off,
            ..certrotor::cluster::ClusterOptions::new(clock.clone())
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
    let done = certrotor::pass::import::from_bundle(&root, &bundle, &opts)?;
    print!(
        "{}",
        certrotor::output::logging::escape_controls(&report::import_text(&done))
    );
    Ok(outcome::for_import(&done))
}

fn run_cmd(c: RunCmd, first_boot_allowed: bool, clock: &SharedClock) -> Result<u8, CliError> {
    if !c.own.once {
        return Err(CliError::usage(
            "'run' needs --once; use 'certrotor daemon' to run repeatedly",
        ));
    }
    let f = c.renew;
    let opts = run_options(&f, &c.pass, clock)?;
    let root = root_flag(f.root)?;
    if first_boot_allowed && let Some(note) = first_boot_note(&root) {
        log::info!("{note}");
        match c.own.output {
            Format::Json => println!(
                "{}",
                serde_json::json!({"root": root.display().to_string(), "first_boot": true, "note": note})
            ),
            Format::Table => println!("{note}"),
        }
        return Ok(outcome::EXIT_OK);
    }
    // The pass as `status` and the Kubernetes Event see it (status.rs).
    let done = certrotor::pass::record::run_pass(&root, &opts, None)?;
    print!(
        "{}",
        render(c.own.output, &done, |r| format!(
            "{}{}",
            report::renew_table(&r.renew, false),
            report::run_table(r)
        ))?
    );
    Ok(outcome::for_run(&done))
}

fn daemon_cmd(c: DaemonCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let f = c.renew;
    let opts = run_options(&f, &c.pass, clock)?;
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
    // Between passes: a CA rotation on this node advanced where it waits for other nodes.
    let mut advance = || certrotor::ca::rotate::advance(&root, &opts);
    let Some(addr) = c.own.metrics_address else {
        certrotor::pass::daemon::daemon_observed(
            &root,
            &opts,
            c.own.interval,
            &mut |_, _| {},
            &mut advance,
        );
        return Ok(outcome::EXIT_OK);
    };
    let shared = certrotor::output::metrics::Shared::new(&root, clock.clone());
    shared.update(|m| m.schedule(c.own.interval, opts.policy.within));
    let bound = certrotor::output::metrics::serve(addr, std::sync::Arc::clone(&shared))
        .map_err(|source| CliError::Metrics { addr, source })?;
    log::info!("metrics served on http://{bound}/metrics");
    certrotor::pass::daemon::daemon_observed(
        &root,
        &opts,
        c.own.interval,
        &mut |result, took| {
            shared.update(|m| m.record_pass(result, clock.now(), took));
        },
        &mut advance,
    );
    Ok(outcome::EXIT_OK)
    // --- end metrics ---
}

fn status_cmd(c: StatusCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    let opts = certrotor::output::status::StatusOptions {
        within: c.within,
        cluster: certrotor::cluster::ClusterOptions {
            mode: c.cluster,
            endpoints: c.etcd_endpoint.concat(),
            ..certrotor::cluster::ClusterOptions::new(clock.clone())
        },
        restart: Some(reading_pods(
            PlatformChoice::Auto,
            PathBuf::from(certrotor::node::catalog::paths::API_SOCKET),
        )),
    };
    let report = certrotor::output::status::status(&root, &opts).map_err(CliError::Status)?;
    print!("{}", render(c.output, &report, report::status_table)?);
    Ok(outcome::EXIT_OK)
}

fn ca_plan(c: CaPlanCmd, clock: &SharedClock) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    certrotor::pass::ops::recover_before_reading(&root)?;
    let restart = reading_pods(c.platform, c.api_socket);
    let platform = certrotor::restart::detect(&root, &restart).map_err(CliError::Restart)?;
    let pods = certrotor::restart::pods(&platform).map_err(CliError::Restart)?;
    let versions = certrotor::restart::reload::versions(&pods, &BTreeMap::new());
    // Found after the recovery above, which may have put files back.
    let node = certrotor::node::Node::discover(&root);
    let plan = certrotor::ca::plan(&node, c.ca, &pods, &versions, clock.now())
        .map_err(CliError::CaPlan)?;
    print!("{}", render(c.output, &plan, report::ca_plan_text)?);
    Ok(outcome::EXIT_OK)
}

fn ca(command: CaSub, clock: &SharedClock) -> Result<u8, CliError> {
    use certrotor::ca::rotate;
    let (output, done) = match command {
        CaSub::Plan(c) => return ca_plan(c, clock),
        CaSub::Status(c) => return ca_status(c),
        CaSub::Rotate(c) => (
            c.own.output,
            ca_stage(c.own.ca, c.renew, c.pass, clock, rotate::rotate)?,
        ),
        CaSub::Continue(c) => (
            c.own.output,
            ca_stage(c.own.ca, c.renew, c.pass, clock, rotate::continue_rotation)?,
        ),
        CaSub::Abort(c) => (
            c.own.output,
            ca_stage(c.own.ca, c.renew, c.pass, clock, rotate::abort)?,
        ),
    };
    print!("{}", render(output, &done, report::ca_rotate_text)?);
    Ok(outcome::EXIT_OK)
}

type Stage = fn(
    &std::path::Path,
    certrotor::ca::CaName,
    &RunOptions,
) -> Result<certrotor::ca::rotate::RotateReport, certrotor::ca::rotate::RotateError>;

fn ca_stage(
    ca: certrotor::ca::CaName,
    f: RenewFlags,
    p: PassFlags,
    clock: &SharedClock,
    stage: Stage,
) -> Result<certrotor::ca::rotate::RotateReport, CliError> {
    if f.all || !f.cert.is_empty() || f.dry_run {
        return Err(CliError::usage(
            "a CA rotation chooses what it renews: leave out --all, --cert and --dry-run \
             ('certrotor ca plan' shows what it would do)",
        ));
    }
    let opts = run_options(&f, &p, clock)?;
    let root = root_flag(f.root)?;
    stage(&root, ca, &opts).map_err(CliError::Rotate)
}

fn ca_status(c: CaStatusCmd) -> Result<u8, CliError> {
    let root = root_flag(c.root)?;
    let r = certrotor::ca::rotate::status(&root).map_err(CliError::Rotate)?;
    print!("{}", render(c.output, &r, report::ca_status_text)?);
    Ok(outcome::EXIT_OK)
}

/// Platform options of a command that only lists the static pods (`status`, `ca plan`): at
/// most 5 s for each API call.
fn reading_pods(platform: PlatformChoice, api_socket: PathBuf) -> RestartOptions {
    RestartOptions {
        platform,
        api_socket,
        timeout: Duration::from_secs(5),
        poll: Duration::from_millis(500),
        endpoints: BTreeMap::new(),
        mode: RestartMode::Live,
        reload_timeout: DEFAULT_RELOAD_TIMEOUT,
        reload: Default::default(),
        settle: certrotor::restart::DEFAULT_SETTLE,
    }
}
