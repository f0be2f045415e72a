//! `kubelet-sim`: test double for the kubelet's static-pod handling.
//!
//! It imitates how a kubelet runs static pods from a manifest folder, but runs each pod's first
//! container as a plain host process and emulates hostPath mounts by rewriting paths; see
//! `testbed::kubelet_sim` for the full list of differences from a real kubelet.
//!
//! Exit codes: 0 after SIGTERM/SIGINT with every pod stopped, 1 runtime error, 2 usage error.

use std::process::ExitCode;

use testbed::kubelet_sim::{self, Error, Invocation};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error @ Error::Usage(_)) => {
            eprintln!("kubelet-sim: {error}");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("kubelet-sim: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Error> {
    let config = match kubelet_sim::parse_args(std::env::args().skip(1))? {
        Invocation::Run(config) => config,
        Invocation::Help => {
            println!("{}", kubelet_sim::USAGE);
            return Ok(());
        }
    };
    let shutdown = kubelet_sim::install_signal_handlers()?;
    kubelet_sim::run(&config, shutdown)
}
