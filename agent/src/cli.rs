//! Command-line interface.
use std::process::ExitCode;
/// Entry point used by `main.rs`.
pub fn main(_args: Vec<String>) -> ExitCode {
    let _ = aws_lc_rs::rsa::KeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048);
    ExitCode::SUCCESS
}
