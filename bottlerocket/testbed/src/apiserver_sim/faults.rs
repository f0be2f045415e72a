//! The emulator's switchable faults: the real API server's failures ("Faults of the real API
//! server" in bottlerocket-api.md) that a test turns on at a chosen moment, and the record of
//! what the emulator did (events), so that a test can see that a fault fired.
//!
//! Two kinds of fault, both described by one JSON document ([`Faults`]), set at start with
//! `--faults FILE` or at any time through the control socket (`PUT /faults`, see
//! [`super::control`]):
//! - `restarts`: one-shot triggers that restart the API server when a matching request arrives,
//!   `before` it is handled (the connection drops, nothing happens), handled but with
//!   `no-response`, or `after` it is answered. A restart refuses connections for `down_ms`
//!   (the socket file stays behind unless `remove_socket`, as after a SIGKILL), drops every
//!   open connection and every config-applier run not yet started (the commit stands, the
//!   applier dies), then serves again without re-rendering anything (unless `boot`).
//! - `applier`: the next `fail_next` runs of `/usr/bin/static-pods`, or all of them while
//!   `fail_always`, exit 1: no manifest changes, every API call still answers as usual. The
//!   next `start_fail_next` applier starts fail: the commit stands but `commit_and_apply` (and
//!   `/tx/apply`) answer 500 `Unable to start config applier`, as the real server does when it
//!   cannot fork `thar-be-settings`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every fault currently armed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Restart triggers, tried in order; each fires `times` times, then is dropped.
    #[serde(default)]
    pub restarts: Vec<RestartTrigger>,
    /// Failures of the config applier.
    #[serde(default)]
    pub applier: ApplierFaults,
}

/// When, relative to the matching request, the API server restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum When {
    /// The request is not handled: its connection drops and the server is down.
    Before,
    /// The request is handled (a commit stands) but never answered: the connection drops.
    NoResponse,
    /// The request is handled and answered, and the server is already down when the client
    /// reads the answer (the applier a commit forked is lost).
    After,
}

/// One restart trigger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartTrigger {
    /// HTTP method of the request, e.g. `PATCH`.
    pub method: String,
    /// Path of the request without its query, e.g. `/settings`, `/tx/commit_and_apply`.
    pub path: String,
    /// A key the request sets, `*` matching one segment, e.g.
    /// `settings.kubernetes.static-pods.*.enabled`: for `PATCH /settings` the body's keys, for
    /// a commit the pending keys of its transaction, for `/tx/apply` its `keys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sets: Option<String>,
    /// The value that key must be set to (ignored for `/tx/apply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// When the restart happens.
    pub when: When,
    /// How long connections are refused, in milliseconds.
    #[serde(default = "default_down_ms")]
    pub down_ms: u64,
    /// Remove the socket file while down (connect fails with ENOENT instead of ECONNREFUSED).
    #[serde(default)]
    pub remove_socket: bool,
    /// Come back as after a boot: pending transactions cleared, static pods rendered.
    #[serde(default)]
    pub boot: bool,
    /// How many matching requests fire it.
    #[serde(default = "one")]
    pub times: u32,
}

fn default_down_ms() -> u64 {
    1000
}

fn one() -> u32 {
    1
}

/// Failures of the config applier's `/usr/bin/static-pods` step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplierFaults {
    /// The next this many runs exit 1 without changing a manifest.
    #[serde(default)]
    pub fail_next: u32,
    /// Every run exits 1 while set.
    #[serde(default)]
    pub fail_always: bool,
    /// The next this many applier starts fail (500 after the commit).
    #[serde(default)]
    pub start_fail_next: u32,
}

/// How one restart goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestartPlan {
    pub(crate) down_ms: u64,
    pub(crate) remove_socket: bool,
    pub(crate) boot: bool,
    /// What caused it, for the log and the events.
    pub(crate) cause: String,
    /// The connection of the request that fired it, left open (to answer, or to drop itself).
    pub(crate) keep: Option<u64>,
}

/// What a trigger sees of a request.
pub(crate) struct RequestView<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    /// The keys (and values) the request sets; computed only when a trigger asks.
    pub(crate) sets: &'a dyn Fn() -> Vec<(String, Value)>,
}

impl Faults {
    /// Parses a faults document.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The first armed trigger matching `request`, counted as fired.
    pub(crate) fn fire(&mut self, request: &RequestView<'_>) -> Option<RestartTrigger> {
        let mut sets = None;
        let index = self.restarts.iter().position(|trigger| {
            if trigger.times == 0
                || !trigger.method.eq_ignore_ascii_case(request.method)
                || trigger.path != request.path
            {
                return false;
            }
            let Some(pattern) = &trigger.sets else {
                return true;
            };
            let pairs = sets.get_or_insert_with(|| (request.sets)());
            pairs.iter().any(|(key, value)| {
                key_matches(pattern, key)
                    && trigger
                        .value
                        .as_ref()
                        .is_none_or(|wanted| value.is_null() || wanted == value)
            })
        })?;
        let trigger = &mut self.restarts[index];
        trigger.times -= 1;
        let fired = trigger.clone();
        if trigger.times == 0 {
            self.restarts.remove(index);
        }
        Some(fired)
    }

    /// Whether the next start of the config applier fails (counted).
    pub(crate) fn applier_start_fails(&mut self) -> bool {
        if self.applier.start_fail_next > 0 {
            self.applier.start_fail_next -= 1;
            return true;
        }
        false
    }

    /// Whether the next run of `/usr/bin/static-pods` fails (counted).
    pub(crate) fn applier_fails(&mut self) -> bool {
        if self.applier.fail_always {
            return true;
        }
        if self.applier.fail_next > 0 {
            self.applier.fail_next -= 1;
            return true;
        }
        false
    }
}

impl RestartTrigger {
    pub(crate) fn plan(&self) -> RestartPlan {
        let what = match &self.sets {
            Some(key) => format!(
                "{} {} setting {key}{}",
                self.method,
                self.path,
                self.value
                    .as_ref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default()
            ),
            None => format!("{} {}", self.method, self.path),
        };
        let when = match self.when {
            When::Before => "before",
            When::NoResponse => "instead of answering",
            When::After => "after answering",
        };
        RestartPlan {
            down_ms: self.down_ms,
            remove_socket: self.remove_socket,
            boot: self.boot,
            cause: format!("fault: restart {when} {what}"),
            keep: None,
        }
    }
}

/// Whether datastore key `key` matches `pattern` (segments separated by `.`, `*` = any one
/// segment; a quoted segment in the key is compared without its quotes).
fn key_matches(pattern: &str, key: &str) -> bool {
    let Ok(segments) = super::model::split_key(key) else {
        return false;
    };
    let wanted: Vec<&str> = pattern.split('.').collect();
    wanted.len() == segments.len()
        && wanted
            .iter()
            .zip(&segments)
            .all(|(want, have)| *want == "*" || want == have)
}

/// Something the emulator did, for tests: a boot, a restart, a fault firing, an applier run.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Position in the emulator's history (0, 1, ...).
    pub seq: u64,
    /// Milliseconds since the emulator process started.
    pub ms: u128,
    /// `boot`, `start`, `fault`, `down`, `up`, `control`, `apply-rendered`, `apply-failed`,
    /// `apply-lost`, `apply-skipped`, `apply-not-started`.
    pub kind: &'static str,
    /// What exactly, in words.
    pub detail: String,
}

/// The most recent events (older ones are dropped past [`Events::CAPACITY`]).
#[derive(Debug, Default)]
pub(crate) struct Events {
    next: u64,
    kept: VecDeque<Event>,
}

impl Events {
    const CAPACITY: usize = 10_000;

    pub(crate) fn push(&mut self, ms: u128, kind: &'static str, detail: String) {
        if self.kept.len() == Self::CAPACITY {
            self.kept.pop_front();
        }
        self.kept.push_back(Event {
            seq: self.next,
            ms,
            kind,
            detail,
        });
        self.next += 1;
    }

    pub(crate) fn all(&self) -> Vec<Event> {
        self.kept.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view<'a>(
        method: &'a str,
        path: &'a str,
        sets: &'a dyn Fn() -> Vec<(String, Value)>,
    ) -> RequestView<'a> {
        RequestView { method, path, sets }
    }

    #[test]
    fn parses_with_defaults_and_refuses_unknown_fields() {
        let faults = Faults::parse(
            br#"{"restarts":[{"method":"POST","path":"/tx/commit_and_apply","when":"after"}]}"#,
        )
        .expect("valid");
        let trigger = &faults.restarts[0];
        assert_eq!(
            (
                trigger.down_ms,
                trigger.times,
                trigger.remove_socket,
                trigger.boot
            ),
            (1000, 1, false, false)
        );
        assert_eq!(faults.applier, ApplierFaults::default());
        let error = Faults::parse(br#"{"restart":[]}"#).expect_err("typo");
        assert!(
            error.to_string().contains("unknown field `restart`"),
            "{error}"
        );
        assert!(
            Faults::parse(br#"{"restarts":[{"method":"GET","path":"/","when":"later"}]}"#).is_err()
        );
    }

    #[test]
    fn triggers_match_method_path_key_and_value_and_fire_the_given_times() {
        let mut faults = Faults::parse(
            br#"{"restarts":[
                {"method":"PATCH","path":"/settings","sets":"settings.kubernetes.static-pods.*.enabled",
                 "value":true,"when":"before","down_ms":5000,"times":2}]}"#,
        )
        .expect("valid");
        let disable = || {
            vec![(
                "settings.kubernetes.static-pods.etcd.enabled".to_string(),
                json!(false),
            )]
        };
        let enable = || {
            vec![(
                "settings.kubernetes.static-pods.etcd.enabled".to_string(),
                json!(true),
            )]
        };
        let motd = || vec![("settings.motd".to_string(), json!("x"))];
        assert!(faults.fire(&view("PATCH", "/settings", &disable)).is_none());
        assert!(faults.fire(&view("PATCH", "/settings", &motd)).is_none());
        assert!(faults.fire(&view("POST", "/settings", &enable)).is_none());
        let fired = faults
            .fire(&view("patch", "/settings", &enable))
            .expect("fires");
        assert_eq!(fired.plan().down_ms, 5000);
        assert_eq!(
            fired.plan().cause,
            "fault: restart before PATCH /settings setting \
             settings.kubernetes.static-pods.*.enabled=true"
        );
        assert!(faults.fire(&view("PATCH", "/settings", &enable)).is_some());
        assert!(faults.fire(&view("PATCH", "/settings", &enable)).is_none());
        assert!(faults.restarts.is_empty());
    }

    #[test]
    fn key_patterns() {
        assert!(key_matches("settings.motd", "settings.motd"));
        assert!(key_matches(
            "settings.kubernetes.node-labels.*",
            "settings.kubernetes.node-labels.\"a.b\""
        ));
        assert!(!key_matches(
            "settings.*",
            "settings.kubernetes.cluster-name"
        ));
        assert!(!key_matches("settings.motd", "settings.motdx"));
    }

    #[test]
    fn applier_failures_count_down() {
        let mut faults = Faults::default();
        faults.applier.fail_next = 2;
        assert!(faults.applier_fails());
        assert!(faults.applier_fails());
        assert!(!faults.applier_fails());
        faults.applier.fail_always = true;
        assert!(faults.applier_fails() && faults.applier_fails());
        faults.applier.start_fail_next = 1;
        assert!(faults.applier_start_fails());
        assert!(!faults.applier_start_fails());
    }

    #[test]
    fn events_keep_the_most_recent() {
        let mut events = Events::default();
        for index in 0..Events::CAPACITY + 5 {
            events.push(index as u128, "up", String::new());
        }
        let all = events.all();
        assert_eq!(all.len(), Events::CAPACITY);
        assert_eq!(all[0].seq, 5);
    }
}
