//! `k8s-sim`: test double for kube-apiserver, kube-controller-manager and kube-scheduler (and
//! kube-vip: `kube-vip manager` is EKS Anywhere's, `testbed::kube_vip`).
//!
//! Busybox-style: it imitates the component named by `argv[0]`'s file name (tests put symlinks
//! named `kube-apiserver` etc. first on `PATH`) or by its first argument. It loads and checks the
//! certificates a real component would, serves the health endpoints over HTTPS, and ignores the
//! rest of the real flags; see `testbed::k8s_sim` for where it differs from the real thing.
//!
//! Exit codes: 1 failed to start (missing file, key mismatch, expired certificate, test switch),
//! 2 usage error; otherwise it serves until killed.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use testbed::k8s_sim::{self, Error};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv
        .iter()
        .skip(1)
        .any(|arg| arg == "--help" || arg == "-h")
    {
        println!("{}", k8s_sim::USAGE);
        return ExitCode::SUCCESS;
    }
    let (component, args) = match k8s_sim::select(&argv) {
        Ok(selected) => selected,
        Err(error) => {
            eprintln!("k8s-sim: {error}");
            return ExitCode::from(2);
        }
    };
    if component == k8s_sim::Component::KubeVip && args.first().is_some_and(|a| a == "manager") {
        return ExitCode::from(testbed::kube_vip::run_manager(&args[1..]));
    }
    let name = component.name();
    let result = k8s_sim::parse_flags(args).and_then(|flags| {
        let reject_env = std::env::var(k8s_sim::REJECT_ENV).ok();
        k8s_sim::run(component, &flags, reject_env.as_deref())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ Error::Usage(_)) => {
            eprintln!("{name} (k8s-sim): {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("{name} (k8s-sim): failed to start: {error}");
            ExitCode::FAILURE
        }
    }
}
