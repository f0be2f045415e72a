//! The API client's error type: one variant per step of a request that can fail, each holding
//! what an operator needs to act on it (socket path, method, URI, HTTP status, server message).
//!
//! Messages follow the crate's shape: what failed, the object in quotes, then the cause, with no
//! trailing period. `Status` keeps the server's plain-text body verbatim, because that body is the
//! only place the API explains itself (`Tried to commit with no pending changes`,
//! ``Json deserialize error: unknown field `xx` ...``); its message mirrors apiclient's
//! `Status <code> when <METHOD>ing <uri>: <body>`.

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
    /// (apiserver.service has `Restart=always`), slow, or reported an internal error. Client
    /// errors (4xx), malformed responses and JSON errors are not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Timeout { .. } | Self::Io { .. } => true,
            Self::Status { code, .. } => *code >= 500,
            Self::BadResponse { .. } | Self::Json { .. } => false,
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
            Self::Timeout { .. } | Self::Status { .. } | Self::BadResponse { .. } => None,
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
}
