//! End-to-end scenarios that boot QEMU images of a Bottlerocket-like host.
//!
//! The harness builds (once per test process, cached on disk) the static `certrotor` binary,
//! the Bottlerocket test doubles and the VM images (`images/build-vm.sh`), then runs
//! [`Scenario`]s: a work dir under `<target>/qemu-tests/<name>/` with a 9p share holding the
//! guest script (`run.sh`) and a persistent `/local` disk, booted any number of times under
//! QEMU/TCG. See `images/README.md` for the guest side (markers, `lib.sh` helpers).
//!
//! ```no_run
//! use qemu_tests::{BootOptions, Scenario};
//! # fn main() -> qemu_tests::Result<()> {
//! let mut sc = Scenario::new("example")?;
//! sc.set_script(". /usr/lib/certrotor-e2e/lib.sh\ne2e_save hello world\n")?;
//! let boot = sc.boot(&BootOptions::default())?;
//! boot.expect_success()?;
//! assert_eq!(boot.read_out("hello")?, "world");
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod artifacts;
pub mod error;
pub mod paths;
pub mod registry;
pub mod vm;

pub use artifacts::{Artifacts, Binaries, Images, artifacts};
pub use error::{Error, Result};
pub use vm::{Boot, BootOptions, DEFAULT_HANG_AFTER, Ending, MARKER_PREFIX, Scenario};
