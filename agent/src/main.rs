//! `certrotor` binary: parse arguments, call the library, turn the outcome into an exit code.

#![forbid(unsafe_code)]
fn main() -> std::process::ExitCode {
    certrotor::cli::main(std::env::args().collect())
}
