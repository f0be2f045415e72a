//! Why a command failed, and its exit code: a usage error (64), or the library's typed error,
//! whose cause chooses the code ([`certrotor::pass::outcome::for_error`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use certrotor::lab;
use certrotor::pass::etcd_client::EtcdClientError;
use certrotor::pass::ops::OpsError;
use certrotor::pass::outcome::{self, EXIT_USAGE};
use certrotor::sys::fsutil::ReadError;

/// Why a command failed: a usage error, or the library's typed error (its cause in `source()`).
#[derive(Debug)]
pub enum CliError {
    /// A bad flag or flag value (exit 64).
    Usage(String),
    /// The node root is not a folder.
    NoRoot(PathBuf),
    Ops(OpsError),
    EtcdClient(EtcdClientError),
    Lab(lab::LabError),
    Demo(certrotor::lab::demo::DemoError),
    /// A report could not be serialised as JSON.
    Json(serde_json::Error),
    /// Reading or writing the etcd client bundle.
    Bundle {
        what: String,
        source: std::io::Error,
    },
    /// Reading the etcd client bundle file.
    ReadBundle(ReadError),
    /// `status` could not read a state file.
    Status(certrotor::output::status::StatusError),
    /// The static pods cannot be listed.
    Restart(certrotor::restart::RestartError),
    /// `ca plan`: the CA is not on the node.
    CaPlan(certrotor::ca::PlanError),
    /// `ca rotate|continue|abort|status`.
    Rotate(certrotor::ca::rotate::RotateError),
    /// `--metrics-address` cannot be bound.
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }

    /// The exit code: 64 for usage, else what [`outcome::for_error`] makes of the cause.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            // A stage's pass failed: its own exit code (3: rolled back).
            CliError::Rotate(certrotor::ca::rotate::RotateError::Pass { exit, .. }) => *exit,
            other => outcome::for_error(other),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::NoRoot(root) => write!(
                f,
                "the node root '{}' is not a folder; give the node's root filesystem with --root",
                root.display()
            ),
            CliError::Ops(e) => write!(f, "{e}"),
            CliError::EtcdClient(e) => write!(f, "{e}"),
            CliError::Lab(e) => write!(f, "{e}"),
            CliError::Demo(e) => write!(f, "{e}"),
            CliError::Json(e) => write!(f, "cannot serialise the report as JSON: {e}"),
            CliError::Bundle { what, source } => write!(f, "{what}: {source}"),
            CliError::ReadBundle(e) => write!(f, "{e}"),
            CliError::Status(e) => write!(f, "{e}"),
            CliError::Restart(e) => write!(f, "{e}"),
            CliError::CaPlan(e) => write!(f, "{e}"),
            CliError::Rotate(e) => write!(f, "{e}"),
            CliError::Metrics { addr, source } => write!(
                f,
                "cannot serve metrics on {addr}: {source}; give a free local address with \
                 --metrics-address, or leave it out"
            ),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Usage(_) | CliError::NoRoot(_) => None,
            CliError::Ops(e) => Some(e),
            CliError::EtcdClient(e) => Some(e),
            CliError::Lab(e) => Some(e),
            CliError::Demo(e) => Some(e),
            CliError::Json(e) => Some(e),
            CliError::Bundle { source, .. } => Some(source),
            CliError::ReadBundle(e) => Some(e),
            CliError::Status(e) => Some(e),
            CliError::Restart(e) => Some(e),
            CliError::CaPlan(e) => Some(e),
            CliError::Rotate(e) => Some(e),
            CliError::Metrics { source, .. } => Some(source),
        }
    }
}

impl From<OpsError> for CliError {
    fn from(e: OpsError) -> Self {
        CliError::Ops(e)
    }
}

impl From<EtcdClientError> for CliError {
    fn from(e: EtcdClientError) -> Self {
        CliError::EtcdClient(e)
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError::Json(e)
    }
}
