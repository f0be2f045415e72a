//! Tests of the Bottlerocket API calls against apiserver-sim in this process: changes that
//! survive the API restarting or losing an answer, the applier run again and its bound, stale
//! transactions discarded, and what the stats say.

use super::*;
use serde_json::json;
use testbed::apiserver_sim::{Config, ShutdownHandle, Sim};

/// apiserver-sim in this process, serving a node with one static pod, `etcd`, enabled and
/// rendered; faults through its control socket. Stopped when dropped.
struct Emulator {
    dir: std::path::PathBuf,
    root: std::path::PathBuf,
    client: ApiClient,
    control: ApiClient,
    handle: ShutdownHandle,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Emulator {
    fn start(name: &str) -> Emulator {
        let dir = std::env::temp_dir().join(format!("certrotor-api-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n";
        let settings = json!({"kubernetes": {"static-pods": {"etcd": {
            "manifest": testbed::base64::encode(manifest.as_bytes()),
            "enabled": true,
        }}}});
        let file = dir.join("settings.json");
        std::fs::write(&file, settings.to_string()).unwrap();
        let mut config = Config::new(dir.join("api.sock"), &root);
        config.settings_file = Some(file);
        config.control = Some(dir.join("control.sock"));
        config.apply_delay = Duration::from_millis(20);
        let sim = Sim::start(&config).unwrap();
        let handle = sim.shutdown_handle();
        let thread = std::thread::spawn(move || sim.serve().unwrap());
        let e = Emulator {
            client: client(&dir.join("api.sock"), Duration::from_secs(5)),
            control: ApiClient::new(dir.join("control.sock")),
            root,
            dir,
            handle,
            thread: Some(thread),
        };
        assert!(e.manifest().exists(), "rendered at boot");
        e
    }

    fn manifest(&self) -> std::path::PathBuf {
        manifest_path(&self.root, "etcd").unwrap()
    }

    fn faults(&self, faults: serde_json::Value) {
        let body = faults.to_string();
        self.control
            .raw_request("PUT", "/faults", Some(body.as_bytes()))
            .unwrap();
    }

    fn events(&self, kind: &str) -> usize {
        let (_, body) = self.control.raw_request("GET", "/events", None).unwrap();
        let events: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
        events.iter().filter(|e| e["kind"] == kind).count()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

fn restart(method: &str, path: &str, when: &str) -> serde_json::Value {
    json!({"restarts": [{"method": method, "path": path,
        "sets": "settings.kubernetes.static-pods.*.enabled", "when": when, "down_ms": 300}]})
}

/// Starts an emulator with `faults` and disables `etcd` through its API: the emulator and what
/// the change met.
fn disabled_under(name: &str, faults: serde_json::Value) -> (Emulator, ApiStats) {
    let e = Emulator::start(name);
    e.faults(faults);
    let mut stats = ApiStats::default();
    set_enabled(&e.client, "etcd", false, None, soon(), &mut stats).unwrap();
    (e, stats)
}

#[test]
fn a_change_survives_the_api_restarting_before_it_and_leaves_nothing_pending() {
    let (e, stats) = disabled_under("before", restart("PATCH", "/settings", "before"));
    assert_eq!(e.events("fault"), 1);
    assert!(
        stats.api_retries > 0 && stats.api_unreachable_ms > 0,
        "{stats:?}"
    );
    assert_eq!(e.client.static_pod_enabled("etcd").unwrap(), Some(false));
    assert_eq!(e.client.list_tx().unwrap(), Vec::<String>::new());
}

#[test]
fn a_commit_whose_answer_was_lost_is_read_back_and_not_sent_again() {
    let fault = restart("POST", "/tx/commit_and_apply", "no-response");
    let (e, mut stats) = disabled_under("no-response", fault);
    assert_eq!(stats.committed_unanswered, 1, "{stats:?}");
    assert_eq!(e.client.static_pod_enabled("etcd").unwrap(), Some(false));
    assert_eq!(e.client.list_tx().unwrap(), Vec::<String>::new());
    // Its applier died with the API: the manifest follows once the applier runs again.
    let poll = (Duration::from_millis(10), Duration::from_millis(300));
    let want = ("etcd", false, None);
    follow(&e.root, &e.client, want, soon(), poll, &mut stats).unwrap();
    assert!(!e.manifest().exists());
    assert_eq!(stats.reapplies, 1, "{stats:?}");
}

#[test]
fn an_applier_that_never_acts_fails_after_the_bounded_re_applies_naming_its_log() {
    let fault = json!({"applier": {"fail_always": true}});
    let (e, mut stats) = disabled_under("applier-fails", fault);
    let poll = (Duration::from_millis(10), Duration::from_millis(300));
    let want = ("etcd", false, None);
    let err = follow(&e.root, &e.client, want, soon(), poll, &mut stats).unwrap_err();
    assert_eq!(stats.reapplies, MAX_REAPPLIES, "{stats:?}");
    assert_eq!(e.events("apply-failed"), 1 + MAX_REAPPLIES as usize);
    for words in [
        "config applier",
        "journalctl -u apiserver",
        "after 3 re-applies",
    ] {
        assert!(err.message.contains(words), "{words}: {err}");
    }
    assert!(e.manifest().exists());
}

#[test]
fn a_change_that_cannot_be_made_discards_its_transaction_and_says_what_is_live() {
    let e = Emulator::start("down");
    e.faults(
        json!({"restarts": [{"method": "POST", "path": "/tx/commit_and_apply",
        "when": "before", "down_ms": 3000}]}),
    );
    let mut stats = ApiStats::default();
    let deadline = Instant::now() + Duration::from_millis(800);
    let err = set_enabled(&e.client, "etcd", false, None, deadline, &mut stats).unwrap_err();
    assert!(
        err.message.contains("its live value is enabled=true"),
        "{err}"
    );
    // The clean-up waited for the API to come back: the staged change is gone.
    assert_eq!(e.client.list_tx().unwrap(), Vec::<String>::new());
    assert_eq!(e.client.static_pod_enabled("etcd").unwrap(), Some(true));
}

#[test]
fn only_certrotor_transactions_are_discarded_with_what_they_would_set() {
    let e = Emulator::start("stale");
    let stale = bottlerocket::unique_tx_name(TX_PREFIX);
    e.client
        .set_static_pod_enabled(&stale, "etcd", true)
        .unwrap();
    e.client
        .set_static_pod_enabled("certrotor-42", "etcd", false)
        .unwrap();
    e.client
        .patch_settings("apiclient-set-x", &json!({"motd": "theirs"}))
        .unwrap();
    let mut stats = ApiStats::default();
    let found = discard_stale(&e.client, soon(), &mut stats).unwrap();
    let mut names: Vec<&str> = found.iter().map(|d| d.name.as_str()).collect();
    names.sort();
    let mut want = vec![stale.as_str(), "certrotor-42"];
    want.sort();
    assert_eq!(names, want);
    let mine = found.iter().find(|d| d.name == stale).unwrap();
    assert_eq!(
        mine.sets,
        ["settings.kubernetes.static-pods.etcd.enabled=true"]
    );
    assert_eq!(e.client.list_tx().unwrap(), ["apiclient-set-x"]);
}

#[test]
fn stats_say_what_happened_and_nothing_when_clean() {
    let mut s = ApiStats::default();
    assert!(s.is_clean());
    assert_eq!(s.describe(), None);
    s.add(&ApiStats {
        api_retries: 9,
        reapplies: 1,
        api_unreachable_ms: 5100,
        committed_unanswered: 0,
    });
    assert_eq!(
        s.describe().unwrap(),
        "the API was unreachable for 5.1 s (retried 9 times); its config applier did not \
         act once and was run again"
    );
    s.add(&ApiStats {
        reapplies: 2,
        committed_unanswered: 1,
        ..ApiStats::default()
    });
    let text = s.describe().unwrap();
    assert!(text.contains("did not act 3 times"), "{text}");
    assert!(text.contains("1 change was committed although"), "{text}");
}

#[test]
fn a_refused_call_is_retried_until_the_deadline_and_counted() {
    let dir = std::env::temp_dir().join(format!("certrotor-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("api.sock");
    // The socket file of a killed server: connect is refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let mut stats = ApiStats::default();
    let c = client(&socket, Duration::from_secs(5));
    let e = call(
        &c,
        Instant::now() + Duration::from_millis(700),
        &mut stats,
        |c| c.list_tx(),
    )
    .unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(stats.api_retries >= 2, "{stats:?}");
    assert!(stats.api_unreachable_ms > 0, "{stats:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn pending_values_are_found_by_key() {
    let pending = serde_json::json!({"kubernetes":{"static-pods":{"etcd":{"enabled":true}}}});
    assert_eq!(
        value_of(&pending, "settings.kubernetes.static-pods.etcd.enabled"),
        Some(&serde_json::json!(true))
    );
    assert_eq!(value_of(&pending, "settings.motd"), None);
}
