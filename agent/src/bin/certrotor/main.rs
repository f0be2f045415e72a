//! `certrotor` binary: parse arguments, call the library, turn the outcome into an exit code.
//! The command line lives here, outside the library, so that the library never depends on it:
//! - [`args`]: the commands and their own flags; [`flags`]: the flag groups several commands
//!   share (renewal, platform), joined to a command's own flags without macros;
//! - [`values`]: the parsers of flag values;
//! - [`commands`]: each command, from its flags to one library call and an exit code;
//! - [`error`]: why a command failed; [`container`]: a Bottlerocket container's command line;
//! - [`alloc`]: the allocator.
#![deny(unsafe_code)]

mod alloc;
mod args;
mod commands;
mod container;
mod error;
mod flags;
mod values;

/// dlmalloc rather than musl's mallocng, which unmaps every freed group: a `check` made ~85
/// mmap/munmap pairs and as many page faults.
#[global_allocator]
static ALLOC: alloc::heap::Heap = alloc::heap::Heap::new();

fn main() -> std::process::ExitCode {
    alloc::crypto::install();
    commands::main(std::env::args().collect())
}
