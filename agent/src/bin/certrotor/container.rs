//! The command line of a Bottlerocket host or bootstrap container, which cannot be given
//! arguments: the words of its user-data file, checked against how Bottlerocket runs that kind
//! of container.
//!
//! - A **host container** is restarted 45 s after its process exits, whatever the exit code
//!   (`host-containers@.service`: `Restart=always`, `RestartSec=45`). Only `daemon` fits: any
//!   other command in its user-data would run again every 45 s, so it is refused with that
//!   reason (exit 64) instead of being turned into something the operator did not write. One-off
//!   commands go through `apiclient exec certrotor certrotor <command>`, which passes arguments
//!   and so never reads the user-data.
//! - A **bootstrap container** runs once per boot before the kubelet, and the boot waits for it
//!   (`bootstrap-containers@.service` is `Type=oneshot`, ordered before `configured.target`):
//!   `daemon` there would hold the boot forever, so it is refused. `run --once` (the default) on
//!   a node's very first boot, before kubeadm or etcdadm made the PKI, has nothing to renew and
//!   exits 0 saying so (see [`first_boot_note`] for the exact rule).

use std::path::Path;

/// Where Bottlerocket mounts a bootstrap container's own folder.
pub const BOOTSTRAP_CONTAINER_DIR: &str = "/.bottlerocket/bootstrap-containers/current";
/// Where Bottlerocket mounts a host container's own folder.
pub const HOST_CONTAINER_DIR: &str = "/.bottlerocket/host-containers/current";

/// Which kind of Bottlerocket container certrotor runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Runs once per boot, before the kubelet; the boot waits for it.
    Bootstrap,
    /// Runs all the time; restarted 45 s after it exits.
    Host,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bootstrap => "bootstrap container",
            Kind::Host => "host container",
        }
    }
}

/// The command line of a Bottlerocket container, which cannot be given arguments: the words of
/// its user-data file (`#` starts a comment), or by default `run --once --platform none` for a
/// bootstrap container and `daemon` for a host container. `None` outside such a container.
pub fn container_args(bootstrap_dir: &Path, host_dir: &Path) -> Option<(Kind, Vec<String>)> {
    for (dir, kind, default) in [
        (bootstrap_dir, Kind::Bootstrap, "run --once --platform none"),
        (host_dir, Kind::Host, "daemon"),
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
        return Some((
            kind,
            if words.is_empty() {
                default.split(' ').map(str::to_string).collect()
            } else {
                words
            },
        ));
    }
    None
}

/// The command of a command line: its first word that is neither a global flag nor a global
/// flag's value (`--log-level debug run --once` -> `run`).
pub fn command_word(words: &[String]) -> Option<&str> {
    let mut it = words.iter();
    while let Some(w) = it.next() {
        match w.as_str() {
            "--log-level" | "--log-format" => {
                it.next();
            }
            w if w.starts_with("--log-level=") || w.starts_with("--log-format=") => {}
            w => return Some(w),
        }
    }
    None
}

/// Why a container's user-data cannot work as Bottlerocket runs that kind of container, or
/// `Ok` when it can.
pub fn check_fits(kind: Kind, words: &[String]) -> Result<(), String> {
    let command = command_word(words).unwrap_or("");
    let line = words.join(" ");
    match kind {
        Kind::Host if command == "daemon" => Ok(()),
        Kind::Bootstrap if command != "daemon" => Ok(()),
        Kind::Host => Err(format!(
            "'{line}' cannot be a host container's user-data: Bottlerocket restarts a host \
             container 45 s after its process exits (host-containers@.service: Restart=always, \
             RestartSec=45), so it would run again every 45 s. A host container runs 'daemon' \
             (empty user-data means 'daemon'; give it the same flags, e.g. 'daemon --within \
             60d'); run one-off commands with 'apiclient exec certrotor certrotor <command>', \
             and 'run --once' at boot from the bootstrap container's user-data \
             (bottlerocket/packaging/README.md)"
        )),
        Kind::Bootstrap => Err(format!(
            "'{line}' cannot be a bootstrap container's user-data: the boot waits until a \
             bootstrap container exits (bootstrap-containers@.service is Type=oneshot, before \
             configured.target), so 'daemon' would hold the node's boot forever. A bootstrap \
             container runs 'run --once' (empty user-data means 'run --once --platform none'); \
             'daemon' belongs in the host container's user-data \
             (bottlerocket/packaging/README.md)"
        )),
    }
}

/// Whether `words` are `run --once` (the bootstrap container's command).
pub fn is_run_once(words: &[String]) -> bool {
    command_word(words) == Some("run") && words.iter().any(|w| w == "--once")
}

/// The note a bootstrap container's `run --once` prints instead of failing on a node's very
/// first boot, or `None` when the pass must run (and fail or succeed as anywhere else).
///
/// The rule, all three must hold: (1) certrotor runs as a Bottlerocket bootstrap container with
/// its command line from the user-data (default included) and that command is `run --once`
/// (the caller checks this); (2) no kubeadm or etcdadm PKI is under `root` (no layout
/// detected: none of `etc/kubernetes/pki`, `var/lib/kubeadm/pki`, `etc/etcd/pki`,
/// `var/lib/etcd/pki` holds its CA or server certificate); (3) certrotor never renewed on this
/// node: its state folder holds no backup. A node whose PKI vanished after certrotor renewed it
/// fails as before; so does `run --once` given as arguments, `renew`, the daemon, and any
/// command outside a bootstrap container.
pub fn first_boot_note(root: &Path) -> Option<String> {
    if !certrotor::node::catalog::detect(root).is_empty() {
        return None;
    }
    let backups = certrotor::txn::state_dir(root).join("backups");
    let renewed_before = std::fs::read_dir(&backups)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if renewed_before {
        return None;
    }
    Some(format!(
        "nothing to renew yet: no kubeadm or etcdadm PKI under '{}' (etc/kubernetes/pki, \
         var/lib/kubeadm/pki, etc/etcd/pki, var/lib/etcd/pki) and no backup in '{}': this is a \
         new node's first boot, before kubeadm or etcdadm made its certificates (on EKS \
         Anywhere the kubeadm-bootstrap host container does that after the bootstrap \
         containers). The next boot's bootstrap container and the host container's daemon \
         renew them when they are due.",
        root.display(),
        backups.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
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
            Some((Kind::Host, vec!["daemon".to_string()]))
        );
        std::fs::write(
            host.join("user-data"),
            "# comment\ndaemon --interval 6h # twice a day\n  --within 60d\n",
        )
        .unwrap();
        let (kind, got) = container_args(&boot, &host).unwrap();
        assert_eq!(kind, Kind::Host);
        assert_eq!(got, ["daemon", "--interval", "6h", "--within", "60d"]);
        std::fs::create_dir_all(&boot).unwrap();
        assert_eq!(
            container_args(&boot, &host).unwrap(),
            (Kind::Bootstrap, words("run --once --platform none"))
        );
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_host_container_runs_only_the_daemon_and_a_bootstrap_container_never_does() {
        for (kind, line) in [
            (Kind::Host, "daemon --interval 6h"),
            (Kind::Host, "--log-format json daemon"),
            (Kind::Bootstrap, "run --once --platform none"),
            (Kind::Bootstrap, "renew --within 30d"),
        ] {
            assert_eq!(check_fits(kind, &words(line)), Ok(()), "{kind:?} {line}");
        }
        let once = check_fits(Kind::Host, &words("run --once --platform none")).unwrap_err();
        assert!(
            once.contains("every 45 s") && once.contains("'daemon"),
            "{once}"
        );
        assert!(once.contains("'run --once --platform none'"), "{once}");
        // Any other one-shot command would loop the same way.
        assert!(check_fits(Kind::Host, &words("check")).is_err());
        assert!(check_fits(Kind::Host, &words("--log-level debug renew")).is_err());

        let daemon = check_fits(
            Kind::Bootstrap,
            &words("--log-level=debug daemon --interval 1h"),
        )
        .unwrap_err();
        assert!(
            daemon.contains("boot forever") && daemon.contains("run --once"),
            "{daemon}"
        );
    }

    #[test]
    fn command_words_skip_global_flags() {
        assert_eq!(
            command_word(&words("--log-level debug run --once")),
            Some("run")
        );
        assert_eq!(
            command_word(&words("--log-format=json daemon")),
            Some("daemon")
        );
        assert_eq!(command_word(&words("--log-level")), None);
        assert!(is_run_once(&words(
            "--log-level info run --once --within 30d"
        )));
        assert!(!is_run_once(&words("run")));
        assert!(!is_run_once(&words("renew --once")));
    }

    #[test]
    fn first_boot_is_an_empty_node_that_certrotor_never_renewed() {
        let base = std::env::temp_dir().join(format!("certrotor-cli-fb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        // Before kubeadm-bootstrap: an empty /var/lib, maybe folders without a CA yet.
        std::fs::create_dir_all(base.join("var/lib/kubeadm/pki")).unwrap();
        let note = first_boot_note(&base).expect("a first boot");
        assert!(note.starts_with("nothing to renew yet"), "{note}");
        // A backup: certrotor renewed a PKI here, whose absence is now an error.
        std::fs::create_dir_all(base.join("var/lib/certrotor/backups/20261101T000000Z-1")).unwrap();
        assert_eq!(first_boot_note(&base), None);
        std::fs::remove_dir_all(base.join("var/lib/certrotor")).unwrap();
        // A PKI: the pass runs.
        std::fs::write(base.join("var/lib/kubeadm/pki/ca.crt"), "x").unwrap();
        std::fs::write(base.join("var/lib/kubeadm/pki/ca.key"), "x").unwrap();
        assert_eq!(first_boot_note(&base), None);
        std::fs::remove_dir_all(base.join("var/lib/kubeadm")).unwrap();
        std::fs::create_dir_all(base.join("var/lib/etcd/pki")).unwrap();
        std::fs::write(base.join("var/lib/etcd/pki/ca.crt"), "x").unwrap();
        assert_eq!(first_boot_note(&base), None);
        let _ = std::fs::remove_dir_all(&base);
    }
}
