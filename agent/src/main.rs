//! `certrotor` binary: parse arguments, call the library, turn the outcome into an exit code.
//! The command line lives here, outside the library, so that the library never depends on it.
#![deny(unsafe_code)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main(std::env::args().collect())
}

/// dlmalloc rather than musl's mallocng, which unmaps every freed group: a `check` made ~85
/// mmap/munmap pairs and as many page faults (ARCHITECTURE.md "Speed").
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
