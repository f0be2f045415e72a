//! Client for the Bottlerocket API: HTTP/1.1 over the Unix socket `/run/api.sock`, through
//! ureq with a Unix-socket transport ([`crate::transport`]).
//!
//! certrotor changes settings the way `apiclient set --json` does, which works on every
//! Bottlerocket version (bottlerocket-api.md §1.5, §6): PATCH `/settings?tx=<private name>`,
//! then POST `/tx/commit_and_apply?tx=<same name>`. A private transaction name keeps certrotor
//! from committing another writer's pending changes in the shared `default` transaction.
//!
//! Every call goes through [`ApiClient::raw_request_unchecked`]: one connection per request
//! (no pooled connection outlives a call), `Content-Type: application/json` on every request as
//! apiclient sends it, a bounded response (16 MiB), and one deadline covering connect, write and
//! read.
//!
//! What this does not do: it does not wait for an apply to take effect. `commit_and_apply`
//! returns once the server has committed and forked its config applier; callers observe the
//! effect (a static-pod manifest appearing or disappearing, a container restarting) themselves.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64ct::{Base64, Encoding};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};
use ureq::Agent;
use ureq::http::Response;

use crate::api_error::{ApiError, ApiResult};
use crate::transport::{NoResolve, UnixConnector};

/// Where the API server listens on a Bottlerocket host (and, bind-mounted, in host containers).
/// The one definition of this path: the agent's flags and catalog use it from here.
pub const DEFAULT_SOCKET: &str = "/run/api.sock";
/// Default bound on one whole request: apiclient has none, but a commit on a healthy node takes
/// milliseconds, so 30 s only trips on a hung server.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body accepted: a full settings dump is tens of KiB; static-pod manifests are
/// the largest values and stay far below actix's 2 MiB request limit each.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Query values: RFC 3986 unreserved characters pass through, every other byte becomes `%XX`
/// (what actix's `web::Query` decodes).
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(value: &str) -> String {
    utf8_percent_encode(value, QUERY_VALUE).to_string()
}

/// A handle on one API socket. Cheap to clone; holds no connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiClient {
    socket: PathBuf,
    timeout: Duration,
}

impl Default for ApiClient {
    fn default() -> Self {
        Self::new(DEFAULT_SOCKET)
    }
}

impl ApiClient {
    /// A client for the API socket at `socket`, with [`DEFAULT_TIMEOUT`].
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The same client with a different bound on each whole request.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The bound on each whole request (connect, send, receive).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Live settings, without the `settings` wrapper (`GET /settings`).
    pub fn settings(&self) -> ApiResult<Value> {
        self.get_json("/settings")
    }

    /// Live settings for full key names such as `settings.motd` (`GET /settings?keys=a,b`).
    /// The server silently skips keys that have no value.
    pub fn settings_by_keys(&self, keys: &[&str]) -> ApiResult<Value> {
        let keys: Vec<String> = keys.iter().map(|key| encode(key)).collect();
        self.get_json(&format!("/settings?keys={}", keys.join(",")))
    }

    /// Live settings whose key names start with `prefix`; the server prepends `settings.`
    /// unless the prefix already starts with it (`GET /settings?prefix=`).
    pub fn settings_by_prefix(&self, prefix: &str) -> ApiResult<Value> {
        self.get_json(&format!("/settings?prefix={}", encode(prefix)))
    }

    /// OS release information (`GET /os`): `pretty_name`, `variant_id`, `version_id`, ...
    pub fn os(&self) -> ApiResult<Value> {
        self.get_json("/os")
    }

    /// Stages `body` (partial settings, no `settings` wrapper) in transaction `tx`
    /// (`PATCH /settings?tx=`); the server answers 204.
    pub fn patch_settings(&self, tx: &str, body: &Value) -> ApiResult<()> {
        let uri = format!("/settings?tx={}", encode(tx));
        let bytes = serde_json::to_vec(body).map_err(|source| ApiError::Json {
            method: "PATCH".into(),
            uri: uri.clone(),
            source,
        })?;
        let (status, _) = self.raw_request("PATCH", &uri, Some(&bytes))?;
        expect_status("PATCH", &uri, status, 204)
    }

    /// Pending (uncommitted) settings of transaction `tx`; `{}` if it has none (`GET /tx?tx=`).
    pub fn pending(&self, tx: &str) -> ApiResult<Value> {
        self.get_json(&format!("/tx?tx={}", encode(tx)))
    }

    /// Names of the transactions that have pending changes (`GET /tx/list`).
    pub fn transactions(&self) -> ApiResult<Vec<String>> {
        let (_, body) = self.raw_request("GET", "/tx/list", None)?;
        parse_json("GET", "/tx/list", &body)
    }

    /// Drops the pending changes of `tx`; returns the key names removed (`DELETE /tx?tx=`).
    pub fn discard(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx?tx={}", encode(tx));
        let (_, body) = self.raw_request("DELETE", &uri, None)?;
        parse_json("DELETE", &uri, &body)
    }

    /// Commits `tx` without applying; returns every committed key name, changed or not
    /// (`POST /tx/commit?tx=`). An empty transaction fails with a 422
    /// ([`ApiError::is_empty_commit`]).
    pub fn commit(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx/commit?tx={}", encode(tx));
        let (_, body) = self.raw_request("POST", &uri, None)?;
        parse_json("POST", &uri, &body)
    }

    /// Starts the config applier for `keys`, or for everything when `keys` is `None`
    /// (`POST /tx/apply`); returns before anything is applied.
    pub fn apply(&self, keys: Option<&[&str]>) -> ApiResult<()> {
        let uri = match keys {
            None => "/tx/apply".to_string(),
            Some(keys) => {
                let keys: Vec<String> = keys.iter().map(|key| encode(key)).collect();
                format!("/tx/apply?keys={}", keys.join(","))
            }
        };
        let (status, _) = self.raw_request("POST", &uri, None)?;
        expect_status("POST", &uri, status, 204)
    }

    /// Commits `tx` and starts applying the committed keys; returns every committed key name
    /// (`POST /tx/commit_and_apply?tx=`). Returns before the change takes effect: the applier
    /// runs asynchronously on the host.
    pub fn commit_and_apply(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx/commit_and_apply?tx={}", encode(tx));
        let (_, body) = self.raw_request("POST", &uri, None)?;
        parse_json("POST", &uri, &body)
    }

    /// Stages `kubernetes.static-pods.<pod_name>.enabled = enabled` in `tx`; commit with
    /// [`ApiClient::commit_and_apply`]. Several pods can be staged in one transaction.
    pub fn set_static_pod_enabled(&self, tx: &str, pod_name: &str, enabled: bool) -> ApiResult<()> {
        let body = json!({"kubernetes": {"static-pods": {pod_name: {"enabled": enabled}}}});
        self.patch_settings(tx, &body)
    }

    /// Stages a whole static pod (manifest bytes, base64-encoded here, and `enabled`) in `tx`.
    pub fn set_static_pod(
        &self,
        tx: &str,
        pod_name: &str,
        manifest: &[u8],
        enabled: bool,
    ) -> ApiResult<()> {
        let body = json!({"kubernetes": {"static-pods": {pod_name: {
            "manifest": Base64::encode_string(manifest),
            "enabled": enabled,
        }}}});
        self.patch_settings(tx, &body)
    }

    /// Sends one request and returns status and body, failing with [`ApiError::Status`] unless
    /// the status is 2xx.
    pub fn raw_request(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&[u8]>,
    ) -> ApiResult<(u16, Vec<u8>)> {
        let (status, response) = self.raw_request_unchecked(method, path_and_query, body)?;
        if (200..300).contains(&status) {
            Ok((status, response))
        } else {
            Err(ApiError::Status {
                code: status,
                method: method.to_string(),
                uri: path_and_query.to_string(),
                body: String::from_utf8_lossy(&response).into_owned(),
            })
        }
    }

    /// Sends one request and returns whatever status and body came back. Every call of this
    /// client ends up here. `path_and_query` must already be percent-encoded.
    pub fn raw_request_unchecked(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<&[u8]>,
    ) -> ApiResult<(u16, Vec<u8>)> {
        let bad = |reason: String| ApiError::BadResponse {
            method: method.to_string(),
            uri: path_and_query.to_string(),
            reason,
        };
        // The host part is never resolved or connected to (the transport always dials the
        // socket); HTTP/1.1 requires a Host header, and the API server ignores it.
        let url = format!("http://localhost{path_and_query}");
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(body.unwrap_or_default().to_vec())
            .map_err(|error| bad(format!("cannot build the request: {error}")))?;
        let mut response: Response<ureq::Body> = self
            .agent()
            .run(request)
            .map_err(|error| self.error(method, path_and_query, error))?;
        let status = response.status().as_u16();
        // Refuse a declared oversized body before reading it; ureq's limit catches the rest
        // (chunked or undeclared bodies) while reading.
        let declared = response
            .headers()
            .get("content-length")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok());
        if declared.is_some_and(|length| length > MAX_RESPONSE_BYTES as u64) {
            return Err(bad(format!(
                "body exceeds the limit of {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES as u64)
            .read_to_vec()
            .map_err(|error| self.error(method, path_and_query, error))?;
        Ok((status, bytes))
    }

    /// One agent per call: nothing pooled outlives the request, and the deadline is the
    /// client's.
    fn agent(&self) -> Agent {
        let config = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(self.timeout))
            .max_idle_connections(0)
            .max_redirects(0)
            .user_agent(concat!("certrotor/", env!("CARGO_PKG_VERSION")))
            .build();
        Agent::with_parts(config, UnixConnector::new(&self.socket), NoResolve)
    }

    fn get_json(&self, uri: &str) -> ApiResult<Value> {
        let (_, body) = self.raw_request("GET", uri, None)?;
        parse_json("GET", uri, &body)
    }

    /// Maps ureq's error to the step that failed.
    fn error(&self, method: &str, uri: &str, error: ureq::Error) -> ApiError {
        let bad = |reason: String| ApiError::BadResponse {
            method: method.to_string(),
            uri: uri.to_string(),
            reason,
        };
        match error {
            ureq::Error::Timeout(_) => ApiError::Timeout {
                socket: self.socket.clone(),
                method: method.to_string(),
                uri: uri.to_string(),
                timeout: self.timeout,
            },
            ureq::Error::Io(source) => match crate::transport::connect_error(source) {
                Ok(source) => ApiError::Connect {
                    socket: self.socket.clone(),
                    source,
                },
                Err(source) if is_timeout(&source) => ApiError::Timeout {
                    socket: self.socket.clone(),
                    method: method.to_string(),
                    uri: uri.to_string(),
                    timeout: self.timeout,
                },
                Err(source) => ApiError::Io {
                    socket: self.socket.clone(),
                    method: method.to_string(),
                    uri: uri.to_string(),
                    source,
                },
            },
            ureq::Error::BodyExceedsLimit(limit) => {
                bad(format!("body exceeds the limit of {limit} bytes"))
            }
            other => bad(other.to_string()),
        }
    }
}

fn expect_status(method: &str, uri: &str, status: u16, expected: u16) -> ApiResult<()> {
    if status == expected {
        Ok(())
    } else {
        Err(ApiError::BadResponse {
            method: method.to_string(),
            uri: uri.to_string(),
            reason: format!("expected status {expected}, got {status}"),
        })
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(
    method: &str,
    uri: &str,
    body: &[u8],
) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|source| ApiError::Json {
        method: method.to_string(),
        uri: uri.to_string(),
        source,
    })
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread::JoinHandle;
    use std::time::Instant;

    /// A scripted in-process server: answers each connection with the next canned reply and
    /// hands back the requests it received.
    struct TestServer {
        dir: PathBuf,
        socket: PathBuf,
        thread: Option<JoinHandle<Vec<Seen>>>,
    }

    /// What the server saw: request line, headers (`name: value` lines), body.
    type Seen = (String, String, Vec<u8>);

    enum Reply {
        Raw(&'static str),
        /// Read the request, then keep the connection open without answering until the client
        /// gives up.
        Silent,
    }

    impl TestServer {
        fn start(replies: Vec<Reply>) -> Self {
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "br-client-{}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&dir).expect("create temp dir");
            let socket = dir.join("api.sock");
            let listener = UnixListener::bind(&socket).expect("bind");
            let thread = std::thread::spawn(move || {
                let mut seen = Vec::new();
                for reply in replies {
                    let (stream, _) = listener.accept().expect("accept");
                    let mut reader = BufReader::new(&stream);
                    seen.push(read_request(&mut reader));
                    match reply {
                        Reply::Raw(raw) => (&stream).write_all(raw.as_bytes()).expect("reply"),
                        Reply::Silent => {
                            let mut sink = Vec::new();
                            let _ = reader.read_to_end(&mut sink);
                        }
                    }
                }
                seen
            });
            Self {
                dir,
                socket,
                thread: Some(thread),
            }
        }

        fn client(&self) -> ApiClient {
            ApiClient::new(&self.socket).with_timeout(Duration::from_secs(5))
        }

        fn requests(mut self) -> Vec<Seen> {
            self.thread
                .take()
                .expect("thread")
                .join()
                .expect("server thread")
        }
    }

    /// Reads one request the way a test needs it: request line, lower-cased header lines, and a
    /// `Content-Length` body (the client never sends another framing). Deliberately not a
    /// general parser: the API server emulator has its own, in the `testbed` crate.
    fn read_request(reader: &mut impl BufRead) -> Seen {
        let mut line = String::new();
        reader.read_line(&mut line).expect("request line");
        let request_line = line
            .trim_end()
            .strip_suffix(" HTTP/1.1")
            .expect("HTTP/1.1 request line")
            .to_string();
        let mut headers = String::new();
        let mut length = 0;
        loop {
            line.clear();
            reader.read_line(&mut line).expect("header line");
            let header = line.trim_end().to_ascii_lowercase();
            if header.is_empty() {
                break;
            }
            if let Some(value) = header.strip_prefix("content-length:") {
                length = value.trim().parse().expect("content-length");
            }
            headers.push_str(&header);
            headers.push('\n');
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        (request_line, headers, body)
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    const OK_KEYS: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                           Content-Length: 17\r\n\r\n[\"settings.motd\"]";
    const NO_CONTENT: &str = "HTTP/1.1 204 No Content\r\n\r\n";

    #[test]
    fn patch_then_commit_and_apply_sends_what_apiclient_sends() {
        let server = TestServer::start(vec![Reply::Raw(NO_CONTENT), Reply::Raw(OK_KEYS)]);
        let client = server.client();
        client
            .patch_settings("certrotor 1/2", &json!({"motd": "hi"}))
            .expect("patch");
        let keys = client.commit_and_apply("certrotor 1/2").expect("commit");
        assert_eq!(keys, ["settings.motd"]);
        let requests = server.requests();
        assert_eq!(requests[0].0, "PATCH /settings?tx=certrotor%201%2F2");
        assert_eq!(requests[0].2, br#"{"motd":"hi"}"#);
        for header in ["host: localhost\n", "content-type: application/json\n"] {
            assert!(requests[0].1.contains(header), "missing {header}");
            assert!(requests[1].1.contains(header), "missing {header}");
        }
        assert_eq!(
            requests[1].0,
            "POST /tx/commit_and_apply?tx=certrotor%201%2F2"
        );
        assert!(requests[1].1.contains("content-length: 0\n"));
    }

    #[test]
    fn query_values_are_percent_encoded() {
        let empty = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let server = TestServer::start(vec![Reply::Raw(empty), Reply::Raw(empty)]);
        let client = server.client();
        client
            .settings_by_keys(&["settings.motd", "settings.kubernetes.node-labels.\"a.b\""])
            .expect("keys");
        client
            .settings_by_prefix("kubernetes.static pods")
            .expect("prefix");
        let requests = server.requests();
        assert_eq!(
            requests[0].0,
            "GET /settings?keys=settings.motd,settings.kubernetes.node-labels.%22a.b%22"
        );
        assert_eq!(
            requests[1].0,
            "GET /settings?prefix=kubernetes.static%20pods"
        );
    }

    #[test]
    fn reads_chunked_json() {
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                       7\r\n{\"motd\"\r\n6\r\n:\"hi\"}\r\n0\r\n\r\n";
        let server = TestServer::start(vec![Reply::Raw(chunked)]);
        assert_eq!(
            server.client().settings().expect("settings"),
            json!({"motd": "hi"})
        );
    }

    #[test]
    fn status_errors_keep_the_server_message() {
        let reply = "HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 39\r\n\r\n\
                     Tried to commit with no pending changes";
        let server = TestServer::start(vec![Reply::Raw(reply)]);
        let error = server.client().commit("mine").expect_err("422");
        assert!(error.is_empty_commit(), "{error:?}");
        assert_eq!(
            error.to_string(),
            "Status 422 when POSTing '/tx/commit?tx=mine': Tried to commit with no pending changes"
        );
    }

    #[test]
    fn unexpected_success_status_is_a_bad_response() {
        let server = TestServer::start(vec![Reply::Raw(OK_KEYS)]);
        let error = server
            .client()
            .patch_settings("tx", &json!({}))
            .expect_err("200 instead of 204");
        assert!(
            matches!(&error, ApiError::BadResponse { reason, .. } if reason == "expected status 204, got 200"),
            "{error:?}"
        );
    }

    #[test]
    fn bad_json_and_bad_http_are_reported() {
        let not_json = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nnot";
        let server = TestServer::start(vec![Reply::Raw(not_json), Reply::Raw("SSH-2.0\r\n\r\n")]);
        let client = server.client();
        assert!(matches!(client.os(), Err(ApiError::Json { .. })));
        assert!(matches!(client.os(), Err(ApiError::BadResponse { .. })));
    }

    #[test]
    fn oversized_responses_are_refused() {
        let huge = "HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n";
        let server = TestServer::start(vec![Reply::Raw(huge)]);
        let error = server.client().settings().expect_err("too large");
        assert!(
            matches!(&error, ApiError::BadResponse { reason, .. } if reason.contains("limit")),
            "{error:?}"
        );
    }

    #[test]
    fn a_silent_server_times_out() {
        let server = TestServer::start(vec![Reply::Silent]);
        let client = server.client().with_timeout(Duration::from_millis(200));
        let started = Instant::now();
        let error = client.settings().expect_err("timeout");
        assert!(matches!(error, ApiError::Timeout { .. }), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(error.is_transient());
    }

    #[test]
    fn a_missing_socket_is_a_connect_error() {
        let client = ApiClient::new(std::env::temp_dir().join("br-client-no-such.sock"));
        let error = client.settings().expect_err("no socket");
        assert!(
            matches!(&error, ApiError::Connect { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .starts_with("Failed to connect to API socket '")
        );
    }
}
