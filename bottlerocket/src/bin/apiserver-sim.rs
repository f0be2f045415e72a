//! `apiserver-sim`: runs the Bottlerocket API server emulator (a TEST DOUBLE, see
//! `bottlerocket::apiserver_sim` for what it imitates and where it differs) until SIGTERM or
//! SIGINT, so that tests and QEMU-less demos can drive certrotor against a real socket.
//!
//! Thin main: parse arguments, set up signal handling, call the library, map the outcome to an
//! exit code (0 after a signal, 1 on a runtime error, 2 on a usage error).
//!
//! Implementation note: SIGTERM and SIGINT are blocked in every thread (the mask is set before
//! any thread starts and is inherited) and received by one thread with `sigwait`, which then
//! stops the server; no async-signal-safety concerns arise.

use std::process::ExitCode;

use bottlerocket::apiserver_sim::{self, Command, Sim};

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
    let signals = block_termination_signals()?;
    let sim = Sim::start(config)?;
    let handle = sim.shutdown_handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut received = 0;
            // SAFETY: `signals` is an initialized set; `received` is a valid out-pointer.
            let result = unsafe { libc::sigwait(&signals, &mut received) };
            if result == 0 {
                eprintln!("apiserver-sim: received signal {received}, shutting down");
            }
            handle.shutdown();
        })?;
    sim.serve()?;
    Ok(())
}

/// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread started later);
/// returns the set for `sigwait`.
fn block_termination_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialized by sigemptyset before use; pthread_sigmask
    // gets valid pointers (a null old-set pointer is allowed).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let result = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if result != 0 {
            return Err(std::io::Error::from_raw_os_error(result));
        }
        Ok(set)
    }
}
