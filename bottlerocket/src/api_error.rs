//! The API client's error type: one variant per step of a request that can fail, each holding
//! what an operator needs to act on it (socket path, method, URI, HTTP status, server message).
//!
//! Messages follow the crate's shape: what failed, the object in quotes, then the cause, with no
//! trailing period. `Status` keeps the server's plain-text body verbatim, because that body is the
//! only place the API explains itself (`Tried to commit with no pending changes`,
//! ``Json deserialize error: unknown field `xx` ...``); its message mirrors apiclient's
//! `Status <code> when <METHOD>ing <uri>: <body>`.
//!
//! Classification for callers that must survive the real server (bottlerocket-api.md, "Faults
//! of the real API server"): [`ApiError::is_transient`] says whether the same call may succeed
//! later (the API server restarting: socket absent, connection refused or reset, a dropped
//! connection, a timeout, a 5xx), [`ApiError::may_have_taken_effect`] whether the server may
//! have acted on a call that failed (so that a caller reads the live value back instead of
//! assuming either outcome).

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result of an API client call.
pub type ApiResult<T> = Result<T, ApiError>;

/// Why a call to the Bottlerocket API failed.
#[derive(Debug)]
pub enum ApiError {
    /// The socket could not be connected to (missing, permission denied, not a socket).
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The exchange did not finish within the client's timeout.
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// HTTP method of the request.
        method: String,
        /// Path and query of the request.
        uri: String,
        /// The timeout that ran out.
        timeout: Duration,
    },
    /// Sending the request or receiving the response failed after connecting.
    Io {
        /// The socket path.
        socket: PathBuf,
        /// HTTP method of the request.
        method: String,
        /// Path and query of the request.
        uri: String,
        /// The OS error.
        source: io::Error,
    },
    /// The server answered with a status the call does not accept (any non-2xx, or a 2xx other
    /// than the one the route documents).
    Status {
        /// HTTP status code.
        code: u16,
        /// HTTP method of the request.
        method: String,
        /// Path and query of the request.
        uri: String,
        /// The response body, lossily decoded as UTF-8 (the API sends plain text errors).
        body: String,
    },
    /// The response was not valid HTTP/1.1, was too large, or did not have the expected shape.
    BadResponse {
        /// HTTP method of the request.
        method: String,
        /// Path and query of the request.
        uri: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A settings key given to the client is not a valid full key (`settings.a.b`); nothing
    /// was sent.
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A JSON request body could not be serialized or a response body could not be parsed.
    Json {
        /// HTTP method of the request.
        method: String,
        /// Path and query of the request.
        uri: String,
        /// The serde_json error.
        source: serde_json::Error,
    },
}

impl ApiError {
    /// The HTTP status code, if the server answered with an unexpected one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The server's message (response body) for a `Status` error.
    pub fn server_message(&self) -> Option<&str> {
        match self {
            Self::Status { body, .. } => Some(body),
            _ => None,
        }
    }

    /// True for the 422 the API returns when a transaction to commit has no pending changes
    /// (it was never written to, already committed, or discarded).
    pub fn is_empty_commit(&self) -> bool {
        matches!(self, Self::Status { code: 422, body, .. } if body.contains("no pending changes"))
    }

    /// True for a 400 caused by a settings key the API's data model does not know.
    pub fn is_unknown_key(&self) -> bool {
        matches!(self, Self::Status { code: 400, body, .. } if body.contains("unknown field"))
    }

    /// True if retrying the same call later may succeed: the API server is down or restarting
    /// (apiserver.service has `Restart=always`, `RestartSec=5`): the socket file is absent or
    /// left behind by a killed server (connection refused), the connection was reset or
    /// dropped without a response, the exchange timed out, or the server reported an internal
    /// error (5xx). Not transient: a socket the caller may not open (permission denied) or
    /// cannot name (path too long), client errors (4xx), malformed responses, JSON errors, an
    /// invalid key.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::NotFound
                    | io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::Interrupted
            ),
            Self::Timeout { .. } | Self::Io { .. } => true,
            Self::Status { code, .. } => *code >= 500,
            Self::BadResponse { .. } | Self::InvalidKey { .. } | Self::Json { .. } => false,
        }
    }

    /// True if the server may have acted on the request although the call failed: the request
    /// was (or may have been) sent and no definite refusal came back. A connection dropped
    /// after a commit was sent, or a timeout, leaves the commit possibly done; a 5xx too (the
    /// real server answers 500 "Unable to start config applier" after committing). False when
    /// the request never reached the server (connect failed, invalid key) or the server refused
    /// it (4xx).
    pub fn may_have_taken_effect(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::InvalidKey { .. } => false,
            Self::Timeout { .. } | Self::Io { .. } => true,
            Self::Status { code, .. } => *code >= 500,
            // An answer the call could not use (an unexpected 2xx, a body it could not read or
            // parse): the server may well have acted. (A `Value` request body cannot fail to
            // serialize, so a JSON error is about an answer; when in doubt, say yes: the
            // caller then reads the live value back, which is always safe.)
            Self::BadResponse { .. } | Self::Json { .. } => true,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect { socket, source } => write!(
                f,
                "Failed to connect to API socket '{}': {source}",
                socket.display()
            ),
            Self::Timeout {
                socket,
                method,
                uri,
                timeout,
            } => write!(
                f,
                "Request {method} '{uri}' to API socket '{}' timed out after {timeout:?}",
                socket.display()
            ),
            Self::Io {
                socket,
                method,
                uri,
                source,
            } => write!(
                f,
                "Failed to exchange {method} '{uri}' with API socket '{}': {source}",
                socket.display()
            ),
            Self::Status {
                code,
                method,
                uri,
                body,
            } => write!(
                f,
                "Status {code} when {method}ing '{uri}': {}",
                body.trim_end()
            ),
            Self::BadResponse {
                method,
                uri,
                reason,
            } => write!(f, "Invalid response to {method} '{uri}': {reason}"),
            Self::InvalidKey { key, reason } => {
                write!(f, "Invalid settings key '{key}': {reason}")
            }
            Self::Json {
                method,
                uri,
                source,
            } => write!(f, "Failed to handle JSON of {method} '{uri}': {source}"),
        }
    }
}

impl std::error::Error for ApiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Connect { source, .. } | Self::Io { source, .. } => Some(source),
            Self::Json { source, .. } => Some(source),
            Self::Timeout { .. }
            | Self::Status { .. }
            | Self::BadResponse { .. }
            | Self::InvalidKey { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, body: &str) -> ApiError {
        ApiError::Status {
            code,
            method: "POST".into(),
            uri: "/tx/commit?tx=a".into(),
            body: body.into(),
        }
    }

    #[test]
    fn messages_name_the_step_object_and_cause() {
        let empty = status(422, "Tried to commit with no pending changes");
        assert_eq!(
            empty.to_string(),
            "Status 422 when POSTing '/tx/commit?tx=a': Tried to commit with no pending changes"
        );
        let connect = ApiError::Connect {
            socket: "/run/api.sock".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(
            connect.to_string(),
            "Failed to connect to API socket '/run/api.sock': entity not found"
        );
        let timeout = ApiError::Timeout {
            socket: "/run/api.sock".into(),
            method: "GET".into(),
            uri: "/settings".into(),
            timeout: Duration::from_secs(30),
        };
        assert_eq!(
            timeout.to_string(),
            "Request GET '/settings' to API socket '/run/api.sock' timed out after 30s"
        );
    }

    #[test]
    fn classifies() {
        let empty = status(422, "Tried to commit with no pending changes");
        assert!(empty.is_empty_commit() && !empty.is_transient() && !empty.is_unknown_key());
        assert_eq!(empty.status(), Some(422));
        let unknown = status(
            400,
            "Json deserialize error: unknown field `x`, expected `motd`",
        );
        assert!(unknown.is_unknown_key() && !unknown.is_empty_commit());
        assert!(status(500, "datastore").is_transient());
        assert!(!status(422, "Report type not supported").is_empty_commit());
    }

    #[test]
    fn tells_transient_from_permanent_and_what_may_have_happened() {
        let connect = |kind: io::ErrorKind| ApiError::Connect {
            socket: "/run/api.sock".into(),
            source: io::Error::from(kind),
        };
        let exchange = |kind: io::ErrorKind| ApiError::Io {
            socket: "/run/api.sock".into(),
            method: "POST".into(),
            uri: "/tx/commit_and_apply?tx=a".into(),
            source: io::Error::from(kind),
        };
        // Restarting: refused (socket left behind), absent, reset.
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::NotFound,
            io::ErrorKind::ConnectionReset,
        ] {
            let error = connect(kind);
            assert!(error.is_transient(), "{error}");
            assert!(!error.may_have_taken_effect(), "{error}");
        }
        // Not fixed by waiting.
        for kind in [io::ErrorKind::PermissionDenied, io::ErrorKind::InvalidInput] {
            assert!(!connect(kind).is_transient(), "{kind:?}");
        }
        // Sent, then dropped: may have been committed.
        for kind in [
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::ConnectionReset,
        ] {
            let error = exchange(kind);
            assert!(
                error.is_transient() && error.may_have_taken_effect(),
                "{error}"
            );
        }
        let applier = status(500, "Unable to start config applier");
        assert!(applier.is_transient() && applier.may_have_taken_effect());
        let empty = status(422, "Tried to commit with no pending changes");
        assert!(!empty.is_transient() && !empty.may_have_taken_effect());
        let invalid = ApiError::InvalidKey {
            key: "motd".into(),
            reason: "a settings key starts with 'settings.'".into(),
        };
        assert_eq!(
            invalid.to_string(),
            "Invalid settings key 'motd': a settings key starts with 'settings.'"
        );
        assert!(!invalid.is_transient() && !invalid.may_have_taken_effect());
    }
}
