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
//! It does not retry either: the API server restarts (systemd `Restart=always`) and its applier
//! can be lost or fail silently (bottlerocket-api.md, "Faults of the real API server"), and how
//! long to keep trying belongs to the caller's time bound. What the caller needs for that is
//! here: [`ApiError::is_transient`] and [`ApiError::may_have_taken_effect`], [`Retry`] (backoff
//! within a deadline the caller gives), the live value of one setting to read back
//! ([`ApiClient::setting`], [`ApiClient::static_pod_enabled`]), the pending transactions to find
//! and discard ([`ApiClient::list_tx`], [`ApiClient::pending`], [`ApiClient::delete_tx`]),
//! `POST /tx/apply?keys=` to re-run a lost or failed applier ([`ApiClient::apply`]), and
//! transaction names that are never reused ([`unique_tx_name`]).
//!
//! The server returns key and transaction lists in hash order, different on each call; this
//! client sorts them.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// The datastore key of a static pod's `enabled` setting.
pub fn static_pod_enabled_key(pod: &str) -> String {
    format!("{STATIC_PODS_KEY}.{}", quote_segment(pod)) + ".enabled"
}

/// The datastore key under which static pods live.
pub const STATIC_PODS_KEY: &str = "settings.kubernetes.static-pods";
/// The datastore key that turns kubelet's static pod path off on newer Bottlerocket releases
/// (absent on older ones, where static pods are always on).
pub const STATIC_PODS_ENABLED_KEY: &str = "settings.kubernetes.static-pods-enabled";

/// A transaction name that no other run uses: `<prefix>-<pid>-<16 hex digits>`, the digits
/// random (from the kernel, else from the clock and a counter). The PID alone is not enough:
/// a pending transaction survives API restarts, and a later run with the same PID would commit
/// its stale changes along with its own.
pub fn unique_tx_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut file| file.read_exact(&mut bytes))
        .map(|()| u64::from_le_bytes(bytes));
    let value = random.unwrap_or_else(|_| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        nanos.rotate_left(17)
            ^ COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    format!("{prefix}-{}-{value:016x}", std::process::id())
}

/// Splits a datastore key such as `settings.kubernetes.node-labels."a.b"` into its segments.
fn key_segments(key: &str) -> Result<Vec<String>, String> {
    let mut segments = Vec::new();
    let mut rest = key;
    loop {
        let (segment, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted
                .find('"')
                .ok_or_else(|| "unbalanced quotes".to_string())?;
            (&quoted[..end], &quoted[end + 1..])
        } else {
            let end = rest.find('.').unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        if segment.is_empty() {
            return Err("empty segment".to_string());
        }
        segments.push(segment.to_string());
        match after.strip_prefix('.') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(segments),
            None => return Err("a quoted segment must be followed by '.'".to_string()),
        }
    }
}

/// A key segment, double-quoted unless it is only `[A-Za-z0-9_/-]`.
fn quote_segment(segment: &str) -> String {
    if !segment.is_empty()
        && segment
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'/' | b'-'))
    {
        segment.to_string()
    } else {
        format!("\"{segment}\"")
    }
}

/// The value at `segments` (after the leading `settings`) inside a `Settings` object.
fn value_at<'a>(settings: &'a Value, segments: &[String]) -> Option<&'a Value> {
    segments
        .iter()
        .try_fold(settings, |value, segment| value.get(segment))
}

/// Retrying API calls that failed transiently, within a deadline the caller owns: exponential
/// backoff (100 ms doubling to 2 s by default), each delay clipped to the time left.
///
/// ```no_run
/// # use std::time::{Duration, Instant};
/// # use bottlerocket::{ApiClient, Retry};
/// let client = ApiClient::default();
/// let mut retry = Retry::until(Instant::now() + Duration::from_secs(60));
/// let enabled = retry.run(|left| client.bounded(left).static_pod_enabled("etcd"));
/// ```
#[derive(Debug, Clone)]
pub struct Retry {
    deadline: Instant,
    next: Duration,
    max: Duration,
    attempts: u32,
}

impl Retry {
    /// Retries until `deadline`, backing off from 100 ms to 2 s.
    pub fn until(deadline: Instant) -> Self {
        Self {
            deadline,
            next: Duration::from_millis(100),
            max: Duration::from_secs(2),
            attempts: 0,
        }
    }

    /// The same, backing off from `first` to `max`.
    #[must_use]
    pub fn with_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.next = first;
        self.max = max.max(first);
        self
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Calls made through [`Retry::run`] or counted by [`Retry::next_delay`] so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// After a failed call: how long to wait before the next try, or `None` when the error is
    /// permanent or no time is left. Counts the failed call.
    pub fn next_delay(&mut self, error: &ApiError) -> Option<Duration> {
        self.attempts += 1;
        let left = self.remaining();
        if !error.is_transient() || left.is_zero() {
            return None;
        }
        let delay = self.next.min(left);
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Calls `call` (given the time left, to bound its own request) until it succeeds, fails
    /// permanently, or the deadline passes, sleeping between tries; returns the last error.
    pub fn run<T>(&mut self, mut call: impl FnMut(Duration) -> ApiResult<T>) -> ApiResult<T> {
        loop {
            // A call always gets at least a millisecond, even at the deadline.
            let left = self.remaining().max(Duration::from_millis(1));
            match call(left) {
                Ok(value) => {
                    self.attempts += 1;
                    return Ok(value);
                }
                Err(error) => match self.next_delay(&error) {
                    Some(delay) => std::thread::sleep(delay),
                    None => return Err(error),
                },
            }
        }
    }
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

    /// A copy whose bound on each request is at most `left` (e.g. the time a [`Retry`] has
    /// left), so that one hung request cannot outlast the caller's deadline.
    #[must_use]
    pub fn bounded(&self, left: Duration) -> Self {
        let mut client = self.clone();
        client.timeout = self.timeout.min(left);
        client
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

    /// The live value of one setting, by its full key (`settings.kubernetes.static-pods.etcd.enabled`);
    /// `None` when it has none. A key that names a group returns the group.
    pub fn setting(&self, key: &str) -> ApiResult<Option<Value>> {
        let segments = settings_segments(key)?;
        let settings = self.settings_by_keys(&[key])?;
        Ok(value_at(&settings, &segments[1..]).cloned())
    }

    /// The live `settings.kubernetes.static-pods.<pod>.enabled`; `None` if the pod or its
    /// `enabled` is not set.
    pub fn static_pod_enabled(&self, pod: &str) -> ApiResult<Option<bool>> {
        let key = static_pod_enabled_key(pod);
        self.setting(&key)?
            .map(|value| expect_bool(&key, value))
            .transpose()
    }

    /// The live `settings.kubernetes.static-pods-enabled`; `None` where it is not set (and on
    /// releases that do not have it), which means static pods are on.
    pub fn static_pods_enabled(&self) -> ApiResult<Option<bool>> {
        self.setting(STATIC_PODS_ENABLED_KEY)?
            .map(|value| expect_bool(STATIC_PODS_ENABLED_KEY, value))
            .transpose()
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
    /// Pending changes persist across API restarts until committed or deleted.
    pub fn pending(&self, tx: &str) -> ApiResult<Value> {
        self.get_json(&format!("/tx?tx={}", encode(tx)))
    }

    /// The value transaction `tx` would set for one full key; `None` if it sets none.
    pub fn pending_setting(&self, tx: &str, key: &str) -> ApiResult<Option<Value>> {
        let segments = settings_segments(key)?;
        let pending = self.pending(tx)?;
        Ok(value_at(&pending, &segments[1..]).cloned())
    }

    /// Names of the transactions that have pending changes, sorted (`GET /tx/list`).
    pub fn list_tx(&self) -> ApiResult<Vec<String>> {
        let (_, body) = self.raw_request("GET", "/tx/list", None)?;
        parse_names("GET", "/tx/list", &body)
    }

    /// Drops the pending changes of `tx`; returns the key names removed, sorted, none if `tx`
    /// had nothing pending (`DELETE /tx?tx=`).
    pub fn delete_tx(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx?tx={}", encode(tx));
        let (_, body) = self.raw_request("DELETE", &uri, None)?;
        parse_names("DELETE", &uri, &body)
    }

    /// Commits `tx` without applying; returns every committed key name, changed or not, sorted
    /// (`POST /tx/commit?tx=`). An empty or unknown transaction fails with a 422
    /// ([`ApiError::is_empty_commit`]).
    pub fn commit(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx/commit?tx={}", encode(tx));
        let (_, body) = self.raw_request("POST", &uri, None)?;
        parse_names("POST", &uri, &body)
    }

    /// Runs the config applier again for the services that the full keys `keys` affect, from
    /// the live settings (`POST /tx/apply?keys=`): what recovers an apply that was lost (the
    /// API restarted before the applier queried it) or failed. Returns before anything is
    /// applied. The server refuses an empty list (400 `Input 'keys' cannot be empty`).
    pub fn apply(&self, keys: &[&str]) -> ApiResult<()> {
        let keys: Vec<String> = keys.iter().map(|key| encode(key)).collect();
        self.post_apply(&format!("/tx/apply?keys={}", keys.join(",")))
    }

    /// Runs the config applier for every setting (`POST /tx/apply` without keys).
    pub fn apply_all(&self) -> ApiResult<()> {
        self.post_apply("/tx/apply")
    }

    fn post_apply(&self, uri: &str) -> ApiResult<()> {
        // 204 with a JSON content type and an unframed `null` after the head: harmless here,
        // as no connection is reused.
        let (status, _) = self.raw_request("POST", uri, None)?;
        expect_status("POST", uri, status, 204)
    }

    /// Commits `tx` and starts applying the committed keys; returns every committed key name,
    /// sorted (`POST /tx/commit_and_apply?tx=`). Returns before the change takes effect: the
    /// applier runs asynchronously on the host, and may be lost or fail without the API ever
    /// saying so.
    pub fn commit_and_apply(&self, tx: &str) -> ApiResult<Vec<String>> {
        let uri = format!("/tx/commit_and_apply?tx={}", encode(tx));
        let (_, body) = self.raw_request("POST", &uri, None)?;
        parse_names("POST", &uri, &body)
    }

    /// Stages `kubernetes.static-pods.<pod_name>.enabled = enabled` in `tx`; commit with
    /// [`ApiClient::commit_and_apply`]. Several pods can be staged in one transaction.
    pub fn set_static_pod_enabled(&self, tx: &str, pod_name: &str, enabled: bool) -> ApiResult<()> {
        let body = json!({"kubernetes": {"static-pods": {pod_name: {"enabled": enabled}}}});
        self.patch_settings(tx, &body)
    }

    /// Stages one setting, by its full key (`settings.kubernetes.cluster-certificate`), in
    /// `tx`; commit with [`ApiClient::commit_and_apply`].
    pub fn set_setting(&self, tx: &str, key: &str, value: &Value) -> ApiResult<()> {
        let segments = settings_segments(key)?;
        let body = segments[1..]
            .iter()
            .rev()
            .fold(value.clone(), |inner, segment| json!({ segment: inner }));
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

/// A JSON array of names (a hash set on the server), sorted.
fn parse_names(method: &str, uri: &str, body: &[u8]) -> ApiResult<Vec<String>> {
    let mut names: Vec<String> = parse_json(method, uri, body)?;
    names.sort();
    Ok(names)
}

/// The segments of a full settings key, which must start with `settings`.
fn settings_segments(key: &str) -> ApiResult<Vec<String>> {
    let invalid = |reason: String| ApiError::InvalidKey {
        key: key.to_string(),
        reason,
    };
    let segments = key_segments(key).map_err(invalid)?;
    if segments.first().map(String::as_str) != Some("settings") || segments.len() < 2 {
        return Err(invalid(
            "a settings key starts with 'settings.'".to_string(),
        ));
    }
    Ok(segments)
}

fn expect_bool(key: &str, value: Value) -> ApiResult<bool> {
    value.as_bool().ok_or_else(|| ApiError::BadResponse {
        method: "GET".to_string(),
        uri: format!("/settings?keys={}", encode(key)),
        reason: format!("'{key}' is {value}, not a boolean"),
    })
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
        /// Read the request, then close the connection without answering.
        Close,
        /// A chunked body of this many bytes, sent until the client hangs up.
        Chunked(usize),
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
                        Reply::Close => drop(reader),
                        Reply::Silent => {
                            let mut sink = Vec::new();
                            let _ = reader.read_to_end(&mut sink);
                        }
                        Reply::Chunked(size) => {
                            let chunk = vec![b'a'; 1 << 20];
                            let mut out = &stream;
                            let _ = out.write_all(
                                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                            );
                            for _ in 0..size.div_ceil(chunk.len()) {
                                let head = format!("{:x}\r\n", chunk.len());
                                if out.write_all(head.as_bytes()).is_err()
                                    || out.write_all(&chunk).is_err()
                                    || out.write_all(b"\r\n").is_err()
                                {
                                    break;
                                }
                            }
                            let _ = out.write_all(b"0\r\n\r\n");
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
    fn one_setting_is_patched_as_its_nested_object() {
        let server = TestServer::start(vec![Reply::Raw(NO_CONTENT), Reply::Raw(NO_CONTENT)]);
        let client = server.client();
        client
            .set_setting(
                "t",
                "settings.kubernetes.cluster-certificate",
                &json!("Q0E="),
            )
            .expect("patch");
        client
            .set_setting(
                "t",
                "settings.kubernetes.static-pods.\"a.b\".manifest",
                &json!("bQ=="),
            )
            .expect("patch");
        let requests = server.requests();
        assert_eq!(
            requests[0].2,
            br#"{"kubernetes":{"cluster-certificate":"Q0E="}}"#
        );
        assert_eq!(
            requests[1].2,
            br#"{"kubernetes":{"static-pods":{"a.b":{"manifest":"bQ=="}}}}"#
        );
        assert!(client.set_setting("t", "motd", &json!("x")).is_err());
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
        // Undeclared length: refused while reading, once past the limit.
        let server = TestServer::start(vec![Reply::Chunked(MAX_RESPONSE_BYTES + (1 << 20))]);
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
        // The call runs aside so that a client that ignored its timeout fails this test instead
        // of hanging it; the deadline only stops that hang (the server never answers, so the
        // client's own 200 ms timeout is the only way out).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(client.settings());
        });
        let error = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("timed out waiting for the client to give up on a silent server")
            .expect_err("timeout");
        assert!(matches!(error, ApiError::Timeout { .. }), "{error:?}");
        assert!(error.is_transient());
        // It gave up by closing the connection: the server's read ended, with one request.
        assert_eq!(server.requests().len(), 1);
    }

    #[test]
    fn apply_sends_the_keys_and_takes_the_real_204_with_a_stray_null() {
        // What v1.20.5 sends: 204, a JSON content type, and `null` without a length.
        let stray = "HTTP/1.1 204 No Content\r\ncontent-type: application/json\r\n\r\nnull";
        let server = TestServer::start(vec![Reply::Raw(stray), Reply::Raw(stray)]);
        let client = server.client();
        client
            .apply(&[
                "settings.kubernetes.static-pods.etcd.enabled",
                "settings.kubernetes.static-pods.kube-apiserver.enabled",
            ])
            .expect("apply");
        client.apply_all().expect("apply all");
        let requests = server.requests();
        assert_eq!(
            requests[0].0,
            "POST /tx/apply?keys=settings.kubernetes.static-pods.etcd.enabled,\
             settings.kubernetes.static-pods.kube-apiserver.enabled"
        );
        assert_eq!(requests[1].0, "POST /tx/apply");
    }

    #[test]
    fn name_lists_come_back_sorted() {
        let list =
            "HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n[\"zeta\",\"alpha\",\"certrotor-1\"]";
        let server = TestServer::start(vec![Reply::Raw(list), Reply::Raw(list), Reply::Raw(list)]);
        let client = server.client();
        let sorted = ["alpha", "certrotor-1", "zeta"];
        assert_eq!(client.list_tx().expect("list"), sorted);
        assert_eq!(client.delete_tx("x y").expect("delete"), sorted);
        assert_eq!(client.commit("x").expect("commit"), sorted);
        let requests = server.requests();
        assert_eq!(requests[1].0, "DELETE /tx?tx=x%20y");
    }

    #[test]
    fn one_setting_is_read_from_its_group() {
        let pods = r#"{"kubernetes":{"static-pods":{"etcd":{"enabled":false}}}}"#;
        let reply = |body: &str| -> &'static str {
            Box::leak(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .into_boxed_str(),
            )
        };
        let server = TestServer::start(vec![
            Reply::Raw(reply(pods)),
            Reply::Raw(reply("{}")),
            Reply::Raw(reply(r#"{"kubernetes":{"static-pods-enabled":true}}"#)),
            Reply::Raw(reply(pods)),
            Reply::Raw(reply(
                r#"{"kubernetes":{"static-pods":{"etcd":{"enabled":"no"}}}}"#,
            )),
        ]);
        let client = server.client();
        assert_eq!(
            client.static_pod_enabled("etcd").expect("etcd"),
            Some(false)
        );
        assert_eq!(
            client.static_pod_enabled("kube-apiserver").expect("none"),
            None
        );
        assert_eq!(client.static_pods_enabled().expect("flag"), Some(true));
        assert_eq!(
            client
                .pending_setting("certrotor-1-ab", "settings.kubernetes.static-pods.etcd")
                .expect("pending"),
            Some(json!({"enabled": false}))
        );
        let not_bool = client.static_pod_enabled("etcd").expect_err("a string");
        assert!(
            matches!(&not_bool, ApiError::BadResponse { reason, .. } if reason.contains("not a boolean")),
            "{not_bool:?}"
        );
        let requests = server.requests();
        assert_eq!(
            requests[0].0,
            "GET /settings?keys=settings.kubernetes.static-pods.etcd.enabled"
        );
        assert_eq!(
            requests[2].0,
            "GET /settings?keys=settings.kubernetes.static-pods-enabled"
        );
        assert_eq!(requests[3].0, "GET /tx?tx=certrotor-1-ab");
    }

    #[test]
    fn invalid_keys_are_refused_before_anything_is_sent() {
        let client = ApiClient::new(std::env::temp_dir().join("br-client-never-dialed.sock"));
        for key in [
            "motd",
            "settings",
            "settings..motd",
            "settings.\"a",
            "os.arch",
        ] {
            let error = client.setting(key).expect_err(key);
            assert!(
                matches!(error, ApiError::InvalidKey { .. }),
                "{key}: {error:?}"
            );
            assert!(!error.is_transient() && !error.may_have_taken_effect());
        }
        assert_eq!(
            static_pod_enabled_key("kube-apiserver"),
            "settings.kubernetes.static-pods.kube-apiserver.enabled"
        );
        assert_eq!(
            key_segments("settings.kubernetes.node-labels.\"a.b/c\"").expect("quoted"),
            ["settings", "kubernetes", "node-labels", "a.b/c"]
        );
        assert_eq!(quote_segment("a.b"), "\"a.b\"");
    }

    #[test]
    fn transaction_names_are_never_reused() {
        let names: std::collections::BTreeSet<String> =
            (0..1000).map(|_| unique_tx_name("certrotor")).collect();
        assert_eq!(names.len(), 1000);
        let prefix = format!("certrotor-{}-", std::process::id());
        for name in &names {
            let random = name.strip_prefix(&prefix).expect("prefix and PID");
            assert_eq!(random.len(), 16, "{name}");
            assert!(random.bytes().all(|b| b.is_ascii_hexdigit()), "{name}");
            // Nothing in it needs percent-encoding.
            assert_eq!(encode(name), *name);
        }
    }

    #[test]
    fn a_connection_dropped_without_an_answer_is_transient_and_maybe_done() {
        let server = TestServer::start(vec![Reply::Close]);
        let error = server.client().commit_and_apply("tx").expect_err("dropped");
        assert!(matches!(error, ApiError::Io { .. }), "{error:?}");
        assert!(
            error.is_transient() && error.may_have_taken_effect(),
            "{error:?}"
        );
        assert!(
            error.to_string().starts_with(
                "Failed to exchange POST '/tx/commit_and_apply?tx=tx' with API socket"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_socket_nobody_listens_on_is_refused_transiently_and_not_done() {
        // What a SIGKILLed server leaves behind: the file, no listener.
        let dir = std::env::temp_dir().join(format!("br-client-refused-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let socket = dir.join("api.sock");
        drop(UnixListener::bind(&socket).expect("bind"));
        let error = ApiClient::new(&socket).settings().expect_err("refused");
        assert!(
            matches!(&error, ApiError::Connect { source, .. } if source.kind() == io::ErrorKind::ConnectionRefused),
            "{error:?}"
        );
        assert!(error.is_transient() && !error.may_have_taken_effect());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn retry_backs_off_within_the_callers_deadline_and_stops_on_permanent_errors() {
        let refused = || ApiError::Connect {
            socket: "/run/api.sock".into(),
            source: io::Error::from(io::ErrorKind::ConnectionRefused),
        };
        let mut retry = Retry::until(Instant::now() + Duration::from_secs(3600))
            .with_backoff(Duration::from_millis(1), Duration::from_millis(4));
        let delays: Vec<Option<Duration>> = (0..4).map(|_| retry.next_delay(&refused())).collect();
        let ms = Duration::from_millis;
        assert_eq!(delays, [Some(ms(1)), Some(ms(2)), Some(ms(4)), Some(ms(4))]);
        let denied = ApiError::Status {
            code: 422,
            method: "POST".into(),
            uri: "/tx/commit".into(),
            body: "Tried to commit with no pending changes".into(),
        };
        assert_eq!(retry.next_delay(&denied), None);
        assert_eq!(retry.attempts(), 5);
        let mut expired = Retry::until(Instant::now());
        assert_eq!(expired.next_delay(&refused()), None);

        let mut calls = 0;
        let mut retry = Retry::until(Instant::now() + Duration::from_secs(3600))
            .with_backoff(Duration::from_millis(1), Duration::from_millis(2));
        let value = retry.run(|left| {
            assert!(left > Duration::ZERO);
            calls += 1;
            if calls < 3 { Err(refused()) } else { Ok(calls) }
        });
        assert_eq!(value.expect("third call"), 3);
        assert_eq!(retry.attempts(), 3);
        let mut calls = 0;
        let error = Retry::until(Instant::now() + Duration::from_secs(3600))
            .run(|_| -> ApiResult<()> {
                calls += 1;
                Err(ApiError::InvalidKey {
                    key: "x".into(),
                    reason: "bad".into(),
                })
            })
            .expect_err("permanent");
        assert_eq!(calls, 1, "{error}");
    }

    #[test]
    fn bounded_never_raises_the_timeout() {
        let client = ApiClient::new("/run/api.sock").with_timeout(Duration::from_secs(30));
        assert_eq!(
            client.bounded(Duration::from_secs(5)).timeout(),
            Duration::from_secs(5)
        );
        assert_eq!(
            client.bounded(Duration::from_secs(99)).timeout(),
            Duration::from_secs(30)
        );
        assert_eq!(client.bounded(Duration::ZERO).socket(), client.socket());
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
        // The API server restarting: its socket is briefly absent.
        assert!(error.is_transient() && !error.may_have_taken_effect());
    }
}
