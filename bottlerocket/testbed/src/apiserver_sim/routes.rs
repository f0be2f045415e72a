//! The emulator's HTTP routes: maps one parsed request to one reply, with the status codes,
//! bodies and content types of the real API server (bottlerocket-api.md §1.2, §1.3, and the
//! v1.20.5 server as measured: "Observed on the real API server", "Faults of the real API
//! server").
//!
//! Imitated from v1.20.5: the server's own errors (422 `Tried to commit with no pending
//! changes`, 400 `Input 'keys' cannot be empty`, ...) carry no content type, actix's JSON
//! extractor errors are `text/plain; charset=utf-8`; `POST /tx/apply` answers 204 with
//! `content-type: application/json` and an unframed `null` body; `?keys=` with an empty value
//! is 400; `PATCH /settings?tx=` with an empty name stages under the transaction `settings`
//! (the datastore's `pending/` plus the key path `settings/...`); `PATCH /settings/keypair` is
//! 404 unless `--keypair` (newer servers); JSON object keys, transaction lists and key lists
//! come in an order that changes between calls (hash maps and sets on the real server) unless
//! `--stable-json`.
//!
//! Pure apart from the shared state (store, apply queue, persistence path), so the route table
//! is unit-tested here without sockets.
//!
//! Differs from the real server: `GET /` returns a small fixed `services` and
//! `configuration-files` table; `metadata/affected-services` knows only the modeled settings;
//! no `/v2/*`, `/metadata/templates`, `/metadata/setting-generators`, `/services`, `/actions/*`,
//! `/updates/*`, `/report*` or `/exec`. An empty `?tx=` on the other transaction routes also
//! names `settings` (inferred from the datastore layout, not measured). A method that does not
//! match a known path gets 404, as actix-web 4 routes with method guards fall through to the
//! default service (inferred).

use std::sync::PoisonError;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::model::{self, filter_leaves, split_key};
use super::store::CommitError;
use super::{ApplyRequest, State};
use crate::http::Head;

/// actix-web 4's default `JsonConfig` limit; the API server does not change it.
pub(crate) const JSON_LIMIT: usize = 2 * 1024 * 1024;

/// Content type of JSON answers.
const JSON: &str = "application/json";
/// Content type of actix-web's own error answers (JSON extractor, payload limits).
const ACTIX_TEXT: &str = "text/plain; charset=utf-8";

/// One HTTP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    /// `None`: no `content-type` header at all.
    pub(crate) content_type: Option<&'static str>,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    fn json(state: &State, value: &Value) -> Self {
        Self {
            status: 200,
            content_type: Some(JSON),
            body: state.json_bytes(value),
        }
    }

    /// A JSON array of names whose order is the server's hash order (shuffled per call).
    fn names(state: &State, mut names: Vec<String>) -> Self {
        state.shuffle(&mut names);
        Self::json(state, &json!(names))
    }

    /// An error of the API server itself (its `ResponseError`): plain text, no content type.
    pub(crate) fn api_error(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            content_type: None,
            body: message.into().into_bytes(),
        }
    }

    /// An error of actix-web's extractors (bad JSON, content type, size): `text/plain`.
    pub(crate) fn actix_error(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            content_type: Some(ACTIX_TEXT),
            body: message.into().into_bytes(),
        }
    }

    fn empty(status: u16) -> Self {
        Self {
            status,
            content_type: None,
            body: Vec::new(),
        }
    }

    /// `HttpResponse::NoContent().json(())`: 204, a JSON content type and an unframed `null`.
    fn no_content_json() -> Self {
        Self {
            status: 204,
            content_type: Some(JSON),
            body: b"null".to_vec(),
        }
    }
}

/// Splits a raw query string into decoded `(name, value)` pairs the way actix's `web::Query`
/// (serde_urlencoded, form_urlencoded) does: `+` is a space, `%XX` a byte, a malformed escape
/// stays as written, and invalid UTF-8 is replaced, never refused.
pub(crate) fn parse_query(query: &str) -> Vec<(String, String)> {
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(&part.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(name), decode(value))
        })
        .collect()
}

/// The value of query parameter `name`, if present.
fn param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
}

/// Routes one request after which the server stays up (what the unit tests call).
#[cfg(test)]
pub(crate) fn handle(state: &State, method: &str, target: &str, head: &Head, body: &[u8]) -> Reply {
    handle_doomed(state, method, target, head, body, false)
}

/// Routes one request; with `doomed`, the API server goes down right after it, so an applier
/// it starts is lost (it cannot query the API).
pub(crate) fn handle_doomed(
    state: &State,
    method: &str,
    target: &str,
    head: &Head,
    body: &[u8],
    doomed: bool,
) -> Reply {
    let generation = if doomed {
        super::DOOMED_GENERATION
    } else {
        state.generation()
    };
    let (path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let query = parse_query(raw_query);
    let param = |name: &str| param(&query, name);
    let result = match (method, path) {
        ("GET", "/") => get_model(state, param("prefix")),
        ("GET", "/settings") => get_settings(state, param("keys"), param("prefix")),
        ("PATCH", "/settings") => parse_json_body(head, body)
            .and_then(|settings| stage(state, tx_name(param("tx")), settings)),
        ("PATCH", "/settings/keypair") if state.keypair => parse_keypair_body(head, body)
            .and_then(|settings| stage(state, tx_name(param("tx")), settings)),
        ("GET", "/tx") => Ok(Reply::json(
            state,
            &lock(state).pending(tx_name(param("tx"))),
        )),
        ("DELETE", "/tx") => discard(state, tx_name(param("tx"))),
        ("GET", "/tx/list") => {
            let names = lock(state).transactions();
            Ok(Reply::names(state, names))
        }
        ("POST", "/tx/commit") => {
            commit(state, tx_name(param("tx"))).map(|keys| Reply::names(state, keys))
        }
        ("POST", "/tx/apply") => param("keys")
            .map(|keys| comma_separated("keys", keys))
            .transpose()
            .and_then(|keys| queue_apply(state, keys, generation))
            .map(|()| Reply::no_content_json()),
        ("POST", "/tx/commit_and_apply") => commit(state, tx_name(param("tx")))
            .and_then(|keys| queue_apply(state, Some(keys.clone()), generation).map(|()| keys))
            .map(|keys| Reply::names(state, keys)),
        ("GET", "/os") => get_os(state, param("prefix")),
        ("GET", "/metadata/affected-services") => affected_services(state, param("keys")),
        _ => Ok(Reply::empty(404)),
    };
    result.unwrap_or_else(|reply| reply)
}

/// The keys a request sets, with their values, for the emulator's fault triggers: the body of
/// `PATCH /settings`, the pending keys of a committed transaction, the `keys` of `/tx/apply`
/// (value `null`). Empty for anything else, or a body that is not valid settings.
pub(crate) fn request_sets(
    state: &State,
    method: &str,
    path: &str,
    raw_query: &str,
    body: &[u8],
) -> Vec<(String, Value)> {
    let query = parse_query(raw_query);
    match (method, path) {
        ("PATCH", "/settings") => model::parse_settings(body)
            .map(|settings| model::leaf_pairs("settings", &settings))
            .unwrap_or_default(),
        ("POST", "/tx/commit" | "/tx/commit_and_apply") => {
            let pending = lock(state).pending(tx_name(param(&query, "tx")));
            model::leaf_pairs("settings", &pending)
        }
        ("POST", "/tx/apply") => param(&query, "keys")
            .map(split_list)
            .unwrap_or_default()
            .into_iter()
            .map(|key| (key, Value::Null))
            .collect(),
        _ => Vec::new(),
    }
}

/// Services and their restart commands, as in Bottlerocket's shared defaults (subset).
pub(crate) fn services() -> Value {
    json!({
        "static-pods": {"configuration-files": [], "restart-commands": ["/usr/bin/static-pods"]},
        "kubernetes": {
            "configuration-files": ["kubelet-config", "kubelet-kubeconfig", "kubernetes-ca-crt"],
            "restart-commands": ["/usr/bin/systemctl try-restart kubelet.service"],
        },
        "host-containers": {
            "configuration-files": ["host-ctr-toml"],
            "restart-commands": ["/usr/bin/host-containers"],
        },
        "bootstrap-containers": {
            "configuration-files": [],
            "restart-commands": ["/usr/bin/bootstrap-containers create-containers"],
        },
        "pki": {"configuration-files": ["certdog-toml"], "restart-commands": ["/usr/bin/certdog"]},
        "motd": {"configuration-files": ["motd"], "restart-commands": []},
    })
}

/// Which service each settings subtree affects; the most specific entry wins.
const AFFECTED_SERVICES: &[(&str, &str)] = &[
    ("settings.kubernetes.static-pods", "static-pods"),
    ("settings.kubernetes", "kubernetes"),
    ("settings.host-containers", "host-containers"),
    ("settings.bootstrap-containers", "bootstrap-containers"),
    ("settings.pki", "pki"),
    ("settings.motd", "motd"),
];

/// The service whose restart command a change to `key` triggers, if any.
pub(crate) fn affected_service(key: &str) -> Option<&'static str> {
    AFFECTED_SERVICES
        .iter()
        .filter(|(prefix, _)| {
            key.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, service)| *service)
}

type Routed<T> = Result<T, Reply>;

fn lock(state: &State) -> std::sync::MutexGuard<'_, super::store::Store> {
    // A panic while holding the lock cannot leave the store half-updated: every mutation is a
    // single assignment or map operation, so the data is still consistent.
    state.store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The transaction a request names: `default` without `?tx=`; an empty name is the datastore's
/// `pending/` directory itself, where keys land under `settings/`, so the transaction lists as
/// `settings`.
fn tx_name(value: Option<&str>) -> &str {
    match value {
        None => "default",
        Some("") => "settings",
        Some(tx) => tx,
    }
}

fn non_empty<'a>(name: &str, value: &'a str) -> Routed<&'a str> {
    if value.is_empty() {
        Err(Reply::api_error(
            400,
            format!("Input '{name}' cannot be empty"),
        ))
    } else {
        Ok(value)
    }
}

/// The server's `comma_separated`: an empty value is 400, else the comma-separated names.
fn comma_separated(name: &str, value: &str) -> Routed<Vec<String>> {
    non_empty(name, value).map(split_list)
}

fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

fn get_model(state: &State, prefix: Option<&str>) -> Routed<Reply> {
    let prefix = prefix
        .map(|prefix| non_empty("prefix", prefix))
        .transpose()?;
    let live = lock(state).live().clone();
    let parts = [
        ("settings", live),
        ("services", services()),
        ("configuration-files", configuration_files()),
        ("os", state.os.clone()),
    ];
    let mut model = Map::new();
    for (name, part) in parts {
        let kept = match prefix {
            None => Some(part),
            Some(prefix) => filter_leaves(name, &part, &|key| key.starts_with(prefix)),
        };
        if let Some(kept) = kept {
            model.insert(name.to_string(), kept);
        }
    }
    Ok(Reply::json(state, &Value::Object(model)))
}

fn get_settings(state: &State, keys: Option<&str>, prefix: Option<&str>) -> Routed<Reply> {
    let live = lock(state).live().clone();
    let selected = if let Some(keys) = keys {
        let keys = split_list(keys);
        for key in &keys {
            split_key(key).map_err(|why| {
                Reply::api_error(400, format!("Unable to create key '{key}': {why}"))
            })?;
        }
        filter_leaves("settings", &live, &|name| {
            keys.iter().any(|key| key == name)
        })
    } else if let Some(prefix) = prefix {
        let prefix = non_empty("prefix", prefix)?;
        let prefix = if prefix.starts_with("settings") {
            prefix.to_string()
        } else {
            format!("settings.{prefix}")
        };
        filter_leaves("settings", &live, &|name| name.starts_with(&prefix))
    } else {
        Some(live)
    };
    Ok(Reply::json(
        state,
        &selected.unwrap_or_else(model::empty_object),
    ))
}

fn get_os(state: &State, prefix: Option<&str>) -> Routed<Reply> {
    let Some(prefix) = prefix else {
        return Ok(Reply::json(state, &state.os));
    };
    let prefix = non_empty("prefix", prefix)?;
    let prefix = if prefix.starts_with("os") {
        prefix.to_string()
    } else {
        format!("os.{prefix}")
    };
    let kept = filter_leaves("os", &state.os, &|name| name.starts_with(&prefix));
    Ok(Reply::json(
        state,
        &kept.unwrap_or_else(model::empty_object),
    ))
}

fn affected_services(state: &State, keys: Option<&str>) -> Routed<Reply> {
    let keys = keys.ok_or_else(|| Reply::api_error(400, "Missing required input 'keys'"))?;
    let mut out = Map::new();
    for key in comma_separated("keys", keys)? {
        if let Some(service) = affected_service(&key) {
            out.insert(key, json!([service]));
        }
    }
    Ok(Reply::json(state, &Value::Object(out)))
}

fn configuration_files() -> Value {
    json!({
        "kubelet-config": {"path": "/etc/kubernetes/kubelet/config"},
        "kubelet-kubeconfig": {"path": "/etc/kubernetes/kubelet/kubeconfig"},
        "kubernetes-ca-crt": {"path": "/etc/kubernetes/pki/ca.crt"},
        "host-ctr-toml": {"path": "/etc/host-containers/host-ctr.toml"},
        "certdog-toml": {"path": "/etc/certdog.toml"},
        "motd": {"path": "/etc/motd"},
    })
}

/// Checks what actix's `web::Json` extractor checks before parsing: a JSON content type and the
/// payload limit.
fn check_json_request(head: &Head, body: &[u8]) -> Routed<()> {
    let json_type = head.header("content-type").is_some_and(|value| {
        let mime = value.split(';').next().unwrap_or_default().trim();
        mime.eq_ignore_ascii_case("application/json")
            || mime.to_ascii_lowercase().ends_with("+json")
    });
    if !json_type {
        return Err(Reply::actix_error(400, "Content type error"));
    }
    if body.len() > JSON_LIMIT {
        return Err(Reply::actix_error(
            413,
            format!(
                "JSON payload ({} bytes) is larger than allowed (limit: {JSON_LIMIT} bytes).",
                body.len()
            ),
        ));
    }
    Ok(())
}

fn parse_json_body(head: &Head, body: &[u8]) -> Routed<Value> {
    check_json_request(head, body)?;
    model::parse_settings(body)
        .map_err(|error| Reply::actix_error(400, format!("Json deserialize error: {error}")))
}

/// `PATCH /settings/keypair` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyPairRequest {
    request_payload: Vec<String>,
}

/// Turns `["kubernetes.static-pods.etcd.enabled=false", ...]` into partial settings, guessing
/// each value's type as the real server does: JSON boolean, else u64, else f64, else string.
fn parse_keypair_body(head: &Head, body: &[u8]) -> Routed<Value> {
    check_json_request(head, body)?;
    let request: KeyPairRequest = serde_json::from_slice(body)
        .map_err(|error| Reply::actix_error(400, format!("Json deserialize error: {error}")))?;
    let mut settings = model::empty_object();
    for pair in &request.request_payload {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Reply::api_error(
                400,
                format!("Failed to split the string: expected 'key=value', got '{pair}'"),
            )
        })?;
        let mut segments = split_key(key.trim())
            .map_err(|why| Reply::api_error(400, format!("Unable to create key '{key}': {why}")))?;
        if segments.first().map(String::as_str) == Some("settings") {
            segments.remove(0);
        }
        let mut nested = guess_type(value);
        for segment in segments.iter().rev() {
            nested = json!({ segment: nested });
        }
        model::deep_merge(&mut settings, nested);
    }
    model::validate_settings(&settings).map_err(|error| {
        Reply::api_error(
            400,
            format!(
                "Unable to match your input to the data model.  We may not have enough type \
                 information.  Please try the --json input form.  Cause: {error}"
            ),
        )
    })
}

fn guess_type(value: &str) -> Value {
    if let Ok(boolean) = value.parse::<bool>() {
        Value::Bool(boolean)
    } else if let Ok(integer) = value.parse::<u64>() {
        Value::from(integer)
    } else if let Some(number) = value
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
    {
        Value::Number(number)
    } else {
        Value::String(value.to_string())
    }
}

fn stage(state: &State, tx: &str, settings: Value) -> Routed<Reply> {
    lock(state)
        .patch(tx, settings)
        .map_err(|error| datastore_error(state, tx, &error))?;
    Ok(Reply::empty(204))
}

fn discard(state: &State, tx: &str) -> Routed<Reply> {
    let keys = lock(state)
        .discard(tx)
        .map_err(|error| datastore_error(state, tx, &error))?;
    Ok(Reply::names(state, keys))
}

fn datastore_error(state: &State, tx: &str, error: &std::io::Error) -> Reply {
    Reply::api_error(
        500,
        format!(
            "Error writing pending transaction '{tx}' under '{}': {error}",
            state.pending_dir_display()
        ),
    )
}

fn commit(state: &State, tx: &str) -> Routed<Vec<String>> {
    let persist_path = &state.paths.persist;
    lock(state)
        .commit(tx, |live| super::persist(persist_path, live))
        .map_err(|error| match error {
            CommitError::NothingPending => {
                Reply::api_error(422, "Tried to commit with no pending changes")
            }
            CommitError::Persist(source) => Reply::api_error(
                500,
                format!(
                    "Failed to write settings to '{}': {source}",
                    persist_path.display()
                ),
            ),
        })
}

fn queue_apply(state: &State, keys: Option<Vec<String>>, generation: u64) -> Routed<()> {
    if super::lock(&state.faults).applier_start_fails() {
        state.event(
            "apply-not-started",
            "fault: the config applier could not be started (after the commit, if any)".to_string(),
        );
        return Err(Reply::api_error(
            500,
            "Unable to start config applier: Resource temporarily unavailable (os error 11)",
        ));
    }
    state
        .applier
        .send(ApplyRequest::new(keys, generation))
        .map_err(|_| {
            Reply::api_error(
                500,
                "Unable to start config applier: applier thread is gone",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver_sim::faults::Faults;
    use crate::apiserver_sim::store::Store;
    use crate::apiserver_sim::{Behaviour, Paths};
    use std::path::PathBuf;
    use std::sync::mpsc;

    struct Fixture {
        state: State,
        applied: mpsc::Receiver<ApplyRequest>,
        dir: PathBuf,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn fixture(name: &str) -> Fixture {
        fixture_with(
            name,
            Behaviour {
                keypair: false,
                shuffle: false,
            },
        )
    }

    fn fixture_with(name: &str, behaviour: Behaviour) -> Fixture {
        let dir = std::env::temp_dir().join(format!("br-routes-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (sender, applied) = mpsc::channel();
        let live = json!({"motd": "hello", "kubernetes": {"cluster-name": "c",
            "node-labels": {"node-role.kubernetes.io/control-plane": ""}}});
        let paths = Paths {
            root: dir.clone(),
            socket: dir.join("api.sock"),
            persist: dir.join("settings.json"),
            pending: None,
        };
        let state = State::new(
            Store::new(live),
            paths,
            sender,
            behaviour,
            Faults::default(),
        );
        Fixture {
            state,
            applied,
            dir,
        }
    }

    fn content_type(
        fixture: &Fixture,
        method: &str,
        target: &str,
        body: &str,
    ) -> Option<&'static str> {
        handle(
            &fixture.state,
            method,
            target,
            &json_head(),
            body.as_bytes(),
        )
        .content_type
    }

    fn json_head() -> Head {
        Head {
            start_line: String::new(),
            headers: vec![("content-type".into(), "application/json".into())],
        }
    }

    fn call(fixture: &Fixture, method: &str, target: &str, body: &str) -> (u16, String) {
        let reply = handle(
            &fixture.state,
            method,
            target,
            &json_head(),
            body.as_bytes(),
        );
        (reply.status, String::from_utf8(reply.body).expect("utf8"))
    }

    fn call_json(fixture: &Fixture, method: &str, target: &str, body: &str) -> Value {
        let (status, body) = call(fixture, method, target, body);
        assert_eq!(status, 200, "{method} {target}: {body}");
        serde_json::from_str(&body).expect("json")
    }

    #[test]
    fn settings_queries() {
        let f = fixture("queries");
        assert_eq!(call_json(&f, "GET", "/settings", "")["motd"], "hello");
        assert_eq!(
            call_json(&f, "GET", "/settings?keys=settings.motd,settings.nope", ""),
            json!({"motd": "hello"})
        );
        assert_eq!(
            call_json(
                &f,
                "GET",
                "/settings?keys=settings.kubernetes.node-labels.%22node-role.kubernetes.io%2Fcontrol-plane%22",
                ""
            ),
            json!({"kubernetes": {"node-labels": {"node-role.kubernetes.io/control-plane": ""}}})
        );
        assert_eq!(
            call_json(&f, "GET", "/settings?prefix=kubernetes.cluster", ""),
            json!({"kubernetes": {"cluster-name": "c"}})
        );
        assert_eq!(
            call_json(&f, "GET", "/settings?prefix=settings.mo", ""),
            json!({"motd": "hello"})
        );
        assert_eq!(call_json(&f, "GET", "/settings?prefix=zzz", ""), json!({}));
        assert_eq!(
            call(&f, "GET", "/settings?prefix=", ""),
            (400, "Input 'prefix' cannot be empty".into())
        );
        assert_eq!(call(&f, "GET", "/settings?keys=a..b", "").0, 400);
    }

    #[test]
    fn model_and_os() {
        let f = fixture("model");
        let model = call_json(&f, "GET", "/", "");
        assert_eq!(model["os"]["variant_id"], "metal-k8s-1.29");
        assert_eq!(model["os"]["version_id"], "1.20.5");
        assert_eq!(model["settings"]["motd"], "hello");
        assert!(model["services"]["static-pods"].is_object());
        let os_only = call_json(&f, "GET", "/?prefix=os.", "");
        assert_eq!(os_only.as_object().map(|m| m.len()), Some(1));
        assert_eq!(
            call_json(&f, "GET", "/?prefix=settings.motd", ""),
            json!({"settings": {"motd": "hello"}})
        );
        assert_eq!(
            call_json(&f, "GET", "/os?prefix=arch", ""),
            json!({"arch": std::env::consts::ARCH})
        );
    }

    #[test]
    fn errors_are_plain_text_with_the_real_servers_content_types() {
        let f = fixture("errors");
        let (status, body) = call(&f, "PATCH", "/settings?tx=a", r#"{"kuberentes":{}}"#);
        assert_eq!(status, 400);
        // serde's (actix's JSON extractor's) errors are text/plain ...
        assert_eq!(
            content_type(&f, "PATCH", "/settings?tx=a", r#"{"kuberentes":{}}"#),
            Some("text/plain; charset=utf-8")
        );
        assert!(
            body.starts_with("Json deserialize error: unknown field `kuberentes`, expected one of `motd`, `kubernetes`"),
            "{body}"
        );
        assert_eq!(call(&f, "PATCH", "/settings?tx=a", "{").0, 400);
        assert_eq!(call(&f, "PATCH", "/settings?tx=a", r#"{"motd":1}"#).0, 400);
        let plain = Head {
            start_line: String::new(),
            headers: vec![("content-type".into(), "text/plain".into())],
        };
        let reply = handle(&f.state, "PATCH", "/settings", &plain, b"{}");
        assert_eq!(
            (reply.status, reply.body.as_slice()),
            (400, &b"Content type error"[..])
        );
        let big = format!(r#"{{"motd":"{}"}}"#, "x".repeat(JSON_LIMIT));
        assert_eq!(call(&f, "PATCH", "/settings", &big).0, 413);
        assert_eq!(call(&f, "GET", "/nope", ""), (404, String::new()));
        assert_eq!(call(&f, "PUT", "/settings", "{}").0, 404);
        // ... the server's own errors have no content type.
        assert_eq!(
            call(&f, "POST", "/tx/commit?tx=never", ""),
            (422, "Tried to commit with no pending changes".into())
        );
        assert_eq!(content_type(&f, "POST", "/tx/commit?tx=never", ""), None);
        assert_eq!(
            call(&f, "POST", "/tx/apply?keys=", ""),
            (400, "Input 'keys' cannot be empty".into())
        );
        assert_eq!(content_type(&f, "POST", "/tx/apply?keys=", ""), None);
        assert_eq!(
            call(&f, "GET", "/settings?prefix=", ""),
            (400, "Input 'prefix' cannot be empty".into())
        );
        assert_eq!(content_type(&f, "GET", "/settings?prefix=", ""), None);
        assert_eq!(content_type(&f, "GET", "/nope", ""), None);
        assert!(
            f.applied.try_recv().is_err(),
            "a refused apply starts nothing"
        );
        // v1.20.5 has no keypair route.
        let keypair = r#"{"request_payload":["motd=x"]}"#;
        assert_eq!(
            call(&f, "PATCH", "/settings/keypair?tx=k", keypair),
            (404, String::new())
        );
        // A malformed escape names a transaction literally, as with actix.
        assert_eq!(call_json(&f, "GET", "/tx?tx=%zz", ""), json!({}));
        assert_eq!(call_json(&f, "GET", "/tx/list", ""), json!([]));
    }

    #[test]
    fn an_empty_transaction_name_stages_under_settings() {
        let f = fixture("empty-tx");
        assert_eq!(
            call(&f, "PATCH", "/settings?tx=", r#"{"motd":"x"}"#),
            (204, String::new())
        );
        assert_eq!(call_json(&f, "GET", "/tx/list", ""), json!(["settings"]));
        assert_eq!(
            call_json(&f, "GET", "/tx?tx=settings", ""),
            json!({"motd": "x"})
        );
        assert_eq!(
            call_json(&f, "POST", "/tx/commit?tx=settings", ""),
            json!(["settings.motd"])
        );
    }

    #[test]
    fn json_order_changes_between_calls_unless_stable() {
        let f = fixture_with(
            "shuffled",
            Behaviour {
                keypair: false,
                shuffle: true,
            },
        );
        for tx in ["a", "b", "c", "d", "e"] {
            call(
                &f,
                "PATCH",
                &format!("/settings?tx={tx}"),
                r#"{"motd":"x"}"#,
            );
        }
        let mut models = std::collections::BTreeSet::new();
        let mut lists = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let (_, model) = call(&f, "GET", "/", "");
            let value: Value = serde_json::from_str(&model).expect("json");
            assert_eq!(value["settings"]["motd"], "hello");
            models.insert(model);
            let (_, list) = call(&f, "GET", "/tx/list", "");
            let mut names: Vec<String> = serde_json::from_str(&list).expect("json");
            names.sort();
            assert_eq!(names, ["a", "b", "c", "d", "e"]);
            lists.insert(list);
        }
        assert!(models.len() > 1 && lists.len() > 1, "{models:?} {lists:?}");
        let stable = fixture("stable");
        let first = call(&stable, "GET", "/", "");
        assert_eq!(call(&stable, "GET", "/", ""), first);
    }

    #[test]
    fn transactions_commit_and_apply() {
        let f = fixture("tx");
        assert_eq!(call(&f, "PATCH", "/settings", r#"{"motd":"hello"}"#).0, 204);
        assert_eq!(
            call(
                &f,
                "PATCH",
                "/settings?tx=mine",
                r#"{"kubernetes":{"cluster-name":"d"}}"#
            )
            .0,
            204
        );
        assert_eq!(
            call_json(&f, "GET", "/tx/list", ""),
            json!(["default", "mine"])
        );
        assert_eq!(call_json(&f, "GET", "/tx", ""), json!({"motd": "hello"}));
        assert_eq!(
            call_json(&f, "POST", "/tx/commit", ""),
            json!(["settings.motd"])
        );
        assert_eq!(
            call(&f, "POST", "/tx/commit", ""),
            (422, "Tried to commit with no pending changes".into())
        );
        assert!(f.applied.try_recv().is_err(), "commit alone must not apply");
        assert_eq!(
            call_json(&f, "POST", "/tx/commit_and_apply?tx=mine", ""),
            json!(["settings.kubernetes.cluster-name"])
        );
        let request = f.applied.try_recv().expect("apply queued");
        assert_eq!(
            request.keys,
            Some(vec!["settings.kubernetes.cluster-name".to_string()])
        );
        assert!(!request.touches_static_pods());
        let persisted: Value =
            serde_json::from_slice(&std::fs::read(f.dir.join("settings.json")).expect("persisted"))
                .expect("json");
        assert_eq!(persisted["kubernetes"]["cluster-name"], "d");
        assert_eq!(call(&f, "POST", "/tx/apply", ""), (204, "null".into()));
        assert_eq!(
            content_type(&f, "POST", "/tx/apply", ""),
            Some("application/json")
        );
        assert!(f.applied.try_recv().expect("apply").touches_static_pods());
        assert!(f.applied.try_recv().expect("apply").touches_static_pods());
        assert_eq!(
            call(
                &f,
                "POST",
                "/tx/apply?keys=settings.kubernetes.static-pods.etcd.enabled",
                ""
            ),
            (204, "null".into())
        );
        let request = f.applied.try_recv().expect("apply");
        assert_eq!(
            request.keys,
            Some(vec![
                "settings.kubernetes.static-pods.etcd.enabled".to_string()
            ])
        );
        assert!(request.touches_static_pods());
        assert_eq!(
            call(&f, "PATCH", "/settings?tx=x", r#"{"motd":"z"}"#).0,
            204
        );
        assert_eq!(
            call_json(&f, "DELETE", "/tx?tx=x", ""),
            json!(["settings.motd"])
        );
        assert_eq!(call_json(&f, "DELETE", "/tx?tx=x", ""), json!([]));
    }

    #[test]
    fn keypair_input_guesses_types() {
        let f = fixture_with(
            "keypair",
            Behaviour {
                keypair: true,
                shuffle: false,
            },
        );
        let body = r#"{"request_payload":["kubernetes.static-pods.etcd.enabled=false",
            "settings.kubernetes.static-pods.etcd.manifest=Zm9v",
            "kubernetes.node-labels.\"a.b\"=c"]}"#;
        assert_eq!(call(&f, "PATCH", "/settings/keypair?tx=k", body).0, 204);
        assert_eq!(
            call_json(&f, "GET", "/tx?tx=k", ""),
            json!({"kubernetes": {"static-pods": {"etcd": {"enabled": false, "manifest": "Zm9v"}},
                "node-labels": {"a.b": "c"}}})
        );
        let (status, body) = call(
            &f,
            "PATCH",
            "/settings/keypair",
            r#"{"request_payload":["motd=12"]}"#,
        );
        assert_eq!(status, 400);
        assert!(
            body.starts_with("Unable to match your input to the data model."),
            "{body}"
        );
        assert!(
            body.ends_with("invalid type: integer `12`, expected a string"),
            "{body}"
        );
        assert_eq!(
            call(
                &f,
                "PATCH",
                "/settings/keypair",
                r#"{"request_payload":["motd"]}"#
            )
            .0,
            400
        );
    }

    #[test]
    fn affected_services_most_specific_wins() {
        assert_eq!(
            affected_service("settings.kubernetes.static-pods.etcd.enabled"),
            Some("static-pods")
        );
        assert_eq!(
            affected_service("settings.kubernetes.api-server"),
            Some("kubernetes")
        );
        assert_eq!(affected_service("settings.motd"), Some("motd"));
        assert_eq!(affected_service("settings.motdx"), None);
        let f = fixture("affected");
        assert_eq!(
            call_json(
                &f,
                "GET",
                "/metadata/affected-services?keys=settings.kubernetes.static-pods.a.enabled",
                ""
            ),
            json!({"settings.kubernetes.static-pods.a.enabled": ["static-pods"]})
        );
        assert_eq!(call(&f, "GET", "/metadata/affected-services", "").0, 400);
    }
}
