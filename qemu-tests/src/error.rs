//! The harness error type: a message meant for a person reading a failed test.

use std::fmt;

/// An error with a human-readable message (paths to logs included where useful).
///
/// `Debug` prints the message as it is (not `Error("...")` with escaped newlines), so that a
/// test that unwraps a setup or boot error shows the person reading it the message itself.
#[derive(Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error {
    /// Builds an error from anything printable.
    pub fn msg(m: impl Into<String>) -> Self {
        Error(m.into())
    }

    /// Prefixes the message with some context.
    #[must_use]
    pub fn context(self, c: impl fmt::Display) -> Self {
        Error(format!("{c}: {}", self.0))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

/// Result with the harness [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Adds context to `io::Result`s and other results.
pub trait Context<T> {
    /// Wraps the error with `c`.
    fn ctx(self, c: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, c: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error(format!("{c}: {e}")))
    }
}
