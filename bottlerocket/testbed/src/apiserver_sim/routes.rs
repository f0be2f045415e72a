//! The emulator's HTTP routes: maps one parsed request to one reply, with the status codes and
//! plain-text error bodies of the real API server (bottlerocket-api.md §1.2, §1.3).
//!
//! Pure apart from the shared state (store, apply queue, persistence path), so the route table
//! is unit-tested here without sockets.
//!
//! Differs from the real server: `GET /` returns a small fixed `services` and
//! `configuration-files` table; `metadata/affected-services` knows only the modeled settings;
//! no `/v2/*`, `/metadata/templates`, `/metadata/setting-generators`, `/services`, `/actions/*`,
//! `/updates/*`, `/report*` or `/exec`; an empty `?tx=` is rejected with 400 (the real server's
//! behaviour there is unknown). A method that does not match a known path gets 404, as
//! actix-web 4 routes with method guards fall through to the default service (inferred).

use std::sync::PoisonError;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::model::{self, filter_leaves, split_key};
use super::store::CommitError;
use super::{ApplyRequest, State};
use crate::http::Head;

/// actix-web 4's default `JsonConfig` limit; the API server does not change it.
pub(crate) const JSON_LIMIT: usize = 2 * 1024 * 1024;

/// One HTTP reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    fn json(value: &Value) -> Self {
        Self {
            status: 200,
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }

    /// A plain-text reply, the shape of every error the API server sends.
    pub(crate) fn text(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: message.into().into_bytes(),
        }
    }

    fn empty(status: u16) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Vec::new(),
        }
    }
}

/// Splits a raw query string into decoded `(name, value)` pairs the way actix's `web::Query`
/// (serde_urlencoded, form_urlencoded) does: `+` is a space, `%XX` a byte, a malformed escape
/// stays as written, and invalid UTF-8 is replaced, never refused.
fn parse_query(query: &str) -> Vec<(String, String)> {
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

/// Routes one request.
pub(crate) fn handle(state: &State, method: &str, target: &str, head: &Head, body: &[u8]) -> Reply {
    let (path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let query = parse_query(raw_query);
    let param = |name: &str| {
        query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let result = match (method, path) {
        ("GET", "/") => get_model(state, param("prefix")),
        ("GET", "/settings") => get_settings(state, param("keys"), param("prefix")),
        ("PATCH", "/settings") => tx_name(param("tx"))
            .and_then(|tx| parse_json_body(head, body).map(|value| (tx, value)))
            .and_then(|(tx, settings)| stage(state, tx, settings)),
        ("PATCH", "/settings/keypair") => tx_name(param("tx"))
            .and_then(|tx| parse_keypair_body(head, body).map(|value| (tx, value)))
            .and_then(|(tx, settings)| stage(state, tx, settings)),
        ("GET", "/tx") => tx_name(param("tx")).map(|tx| Reply::json(&lock(state).pending(tx))),
        ("DELETE", "/tx") => {
            tx_name(param("tx")).map(|tx| Reply::json(&json!(lock(state).discard(tx))))
        }
        ("GET", "/tx/list") => Ok(Reply::json(&json!(lock(state).transactions()))),
        ("POST", "/tx/commit") => tx_name(param("tx"))
            .and_then(|tx| commit(state, tx))
            .map(|keys| Reply::json(&json!(keys))),
        ("POST", "/tx/apply") => {
            let keys = param("keys").map(split_list);
            queue_apply(state, keys).map(|()| Reply::empty(204))
        }
        ("POST", "/tx/commit_and_apply") => tx_name(param("tx"))
            .and_then(|tx| commit(state, tx))
            .and_then(|keys| queue_apply(state, Some(keys.clone())).map(|()| keys))
            .map(|keys| Reply::json(&json!(keys))),
        ("GET", "/os") => get_os(state, param("prefix")),
        ("GET", "/metadata/affected-services") => affected_services(param("keys")),
        _ => Ok(Reply::empty(404)),
    };
    result.unwrap_or_else(|reply| reply)
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

fn tx_name(value: Option<&str>) -> Routed<&str> {
    match value {
        None => Ok("default"),
        Some("") => Err(Reply::text(400, "Input 'tx' cannot be empty")),
        Some(tx) => Ok(tx),
    }
}

fn non_empty<'a>(name: &str, value: &'a str) -> Routed<&'a str> {
    if value.is_empty() {
        Err(Reply::text(400, format!("Input '{name}' cannot be empty")))
    } else {
        Ok(value)
    }
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
    Ok(Reply::json(&Value::Object(model)))
}

fn get_settings(state: &State, keys: Option<&str>, prefix: Option<&str>) -> Routed<Reply> {
    let live = lock(state).live().clone();
    let selected = if let Some(keys) = keys {
        let keys = split_list(keys);
        for key in &keys {
            split_key(key)
                .map_err(|why| Reply::text(400, format!("Unable to create key '{key}': {why}")))?;
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
    Ok(Reply::json(&selected.unwrap_or_else(model::empty_object)))
}

fn get_os(state: &State, prefix: Option<&str>) -> Routed<Reply> {
    let Some(prefix) = prefix else {
        return Ok(Reply::json(&state.os));
    };
    let prefix = non_empty("prefix", prefix)?;
    let prefix = if prefix.starts_with("os") {
        prefix.to_string()
    } else {
        format!("os.{prefix}")
    };
    let kept = filter_leaves("os", &state.os, &|name| name.starts_with(&prefix));
    Ok(Reply::json(&kept.unwrap_or_else(model::empty_object)))
}

fn affected_services(keys: Option<&str>) -> Routed<Reply> {
    let keys = keys.ok_or_else(|| Reply::text(400, "Missing required input 'keys'"))?;
    let mut out = Map::new();
    for key in split_list(keys) {
        if let Some(service) = affected_service(&key) {
            out.insert(key, json!([service]));
        }
    }
    Ok(Reply::json(&Value::Object(out)))
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
        return Err(Reply::text(400, "Content type error"));
    }
    if body.len() > JSON_LIMIT {
        return Err(Reply::text(
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
        .map_err(|error| Reply::text(400, format!("Json deserialize error: {error}")))
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
        .map_err(|error| Reply::text(400, format!("Json deserialize error: {error}")))?;
    let mut settings = model::empty_object();
    for pair in &request.request_payload {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Reply::text(
                400,
                format!("Failed to split the string: expected 'key=value', got '{pair}'"),
            )
        })?;
        let mut segments = split_key(key.trim())
            .map_err(|why| Reply::text(400, format!("Unable to create key '{key}': {why}")))?;
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
        Reply::text(
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
    lock(state).patch(tx, settings);
    Ok(Reply::empty(204))
}

fn commit(state: &State, tx: &str) -> Routed<Vec<String>> {
    let persist_path = &state.persist_path;
    lock(state)
        .commit(tx, |live| super::persist(persist_path, live))
        .map_err(|error| match error {
            CommitError::NothingPending => {
                Reply::text(422, "Tried to commit with no pending changes")
            }
            CommitError::Persist(source) => Reply::text(
                500,
                format!(
                    "Failed to write settings to '{}': {source}",
                    persist_path.display()
                ),
            ),
        })
}

fn queue_apply(state: &State, keys: Option<Vec<String>>) -> Routed<()> {
    state.applier.send(ApplyRequest::new(keys)).map_err(|_| {
        Reply::text(
            500,
            "Unable to start config applier: applier thread is gone",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let dir = std::env::temp_dir().join(format!("br-routes-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (sender, applied) = mpsc::channel();
        let live = json!({"motd": "hello", "kubernetes": {"cluster-name": "c",
            "node-labels": {"node-role.kubernetes.io/control-plane": ""}}});
        let state = State::new(live, dir.join("settings.json"), sender);
        Fixture {
            state,
            applied,
            dir,
        }
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
        assert_eq!(model["os"]["variant_id"], "metal-k8s-1.31");
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
    fn patch_errors_are_plain_text() {
        let f = fixture("errors");
        let (status, body) = call(&f, "PATCH", "/settings?tx=a", r#"{"kuberentes":{}}"#);
        assert_eq!(status, 400);
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
        // A malformed escape names a transaction literally, as with actix.
        assert_eq!(call_json(&f, "GET", "/tx?tx=%zz", ""), json!({}));
        assert_eq!(call(&f, "GET", "/tx?tx=", "").0, 400);
        assert_eq!(call_json(&f, "GET", "/tx/list", ""), json!([]));
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
        assert_eq!(call(&f, "POST", "/tx/apply", ""), (204, String::new()));
        assert!(f.applied.try_recv().expect("apply").touches_static_pods());
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
        let f = fixture("keypair");
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
