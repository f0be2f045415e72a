//! `apiserver-sim`: runs the Bottlerocket API server emulator (a TEST DOUBLE, see
//! `testbed::apiserver_sim` for what it imitates and where it differs) until SIGTERM or
//! SIGINT, so that tests and QEMU-less demos can drive certrotor against a real socket.
//!
//! Thin main: parse arguments, set up signal handling, call the library, map the outcome to an
//! exit code (0 after a signal, 1 on a runtime error, 2 on a usage error).
//!
//! Implementation note: SIGTERM and SIGINT are blocked in every thread (the mask is set before
//! any thread starts and is inherited) and received by one thread with `sigwait`, which then
//! stops the server; no async-signal-safety concerns arise.

use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};

use testbed::apiserver_sim::{self, Command, Sim};

fn main() -> ExitCode {
    let config = match apiserver_sim::parse_args(std::env::args().skip(1)) {
        Ok(Command::Help) => {
            println!("{}", apiserver_sim::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(config)) => config,
        Err(error) => {
            eprintln!("apiserver-sim: {error}\n\n{}", apiserver_sim::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("apiserver-sim: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: &apiserver_sim::Config) -> Result<(), Box<dyn std::error::Error>> {
    // Blocked in this thread, and so in every thread started later; the signals thread takes
    // them with sigwait.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block()?;
    let sim = Sim::start(config)?;
    let handle = sim.shutdown_handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(received) = signals.wait() {
                eprintln!("apiserver-sim: received signal {received}, shutting down");
            }
            handle.shutdown();
        })?;
    sim.serve()?;
    Ok(())
}
