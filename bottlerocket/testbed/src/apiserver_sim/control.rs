//! The emulator's control socket (`--control PATH`): how a test arms faults, restarts the API
//! server at a chosen moment and reads what the emulator did, while the API socket itself comes
//! and goes. HTTP/1.1, one request per connection, JSON bodies; any HTTP client on a Unix
//! socket works (the `bottlerocket` client's `raw_request` does).
//!
//! | Request | Effect | Answer |
//! |---|---|---|
//! | `GET /faults` | | 200, the armed faults ([`super::Faults`]) |
//! | `PUT /faults` | replaces every armed fault | 204; 400 with serde's message |
//! | `POST /restart` | restarts now; body (optional) `{"down_ms":N,"remove_socket":B,"boot":B}` | 204 once the API is down |
//! | `GET /events` | | 200, every [`super::Event`] so far |
//! | `GET /status` | | 200, `{"up":B,"restarts":N,"pending_transactions":[..]}` |
//!
//! Not part of the real server: nothing like it exists on a Bottlerocket host.

use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;
use serde_json::json;

use super::faults::{Faults, RestartPlan};
use super::{State, lock, log};
use crate::http;

/// Largest control request body.
const MAX_BODY: usize = 1024 * 1024;

/// Body of `POST /restart`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartNow {
    #[serde(default = "default_down_ms")]
    down_ms: u64,
    #[serde(default)]
    remove_socket: bool,
    #[serde(default)]
    boot: bool,
}

fn default_down_ms() -> u64 {
    1000
}

/// Serves the control socket until `stop` is set (then one connection wakes it).
pub(crate) fn serve(listener: &UnixListener, state: &State, stop: &AtomicBool) {
    for incoming in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match incoming {
            Ok(stream) => handle(state, &stream),
            Err(error) => log(&format!("control: accept failed: {error}")),
        }
    }
}

fn handle(state: &State, stream: &UnixStream) {
    let mut reader = BufReader::new(stream);
    let Ok(Some((method, target, head))) = http::read_request_head(&mut reader) else {
        return;
    };
    let (status, body) = match http::read_request_body(&mut reader, &head, MAX_BODY) {
        Ok(body) => route(state, &method, &target, &body),
        Err(error) => (400, error.to_string().into_bytes()),
    };
    let content_type = (status == 200).then_some("application/json");
    let mut writer = stream;
    let _ = http::write_response(&mut writer, status, content_type, &body, true);
}

fn route(state: &State, method: &str, target: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let json = |value: serde_json::Value| (200, value.to_string().into_bytes());
    match (method, target) {
        ("GET", "/faults") => json(json!(*lock(&state.faults))),
        ("PUT", "/faults") => match Faults::parse(body) {
            Ok(faults) => {
                state.event("control", format!("faults set: {}", json!(faults)));
                *lock(&state.faults) = faults;
                (204, Vec::new())
            }
            Err(error) => (400, format!("invalid faults: {error}").into_bytes()),
        },
        ("POST", "/restart") => {
            let parsed = if body.iter().all(u8::is_ascii_whitespace) {
                serde_json::from_slice::<RestartNow>(b"{}")
            } else {
                serde_json::from_slice::<RestartNow>(body)
            };
            match parsed {
                Ok(now) => {
                    state.restart(
                        RestartPlan {
                            down_ms: now.down_ms,
                            remove_socket: now.remove_socket,
                            boot: now.boot,
                            cause: if now.boot {
                                "control: boot".to_string()
                            } else {
                                "control: restart".to_string()
                            },
                            keep: None,
                        },
                        None,
                    );
                    (204, Vec::new())
                }
                Err(error) => (400, format!("invalid restart: {error}").into_bytes()),
            }
        }
        ("GET", "/events") => json(json!(state.events())),
        ("GET", "/status") => json(state.status()),
        _ => (404, Vec::new()),
    }
}
