//! Integration tests of the faults of the real API server (bottlerocket-api.md, "Faults of the
//! real API server"), each made to happen at a chosen moment against the real `apiserver-sim`
//! binary and observed through the real `bottlerocket` client: API restarts (connections
//! refused, the socket file left behind or removed, open connections dropped), pending
//! transactions that survive them, no re-render except at a boot, applies that are lost or
//! fail without any API call saying so, and `POST /tx/apply?keys=` recovering them.
//!
//! Every fault is armed through the emulator's control socket (or `--faults FILE`) and its
//! firing is checked in the emulator's events, so a test cannot pass because the fault never
//! happened.
#![forbid(unsafe_code)]

mod apisim;

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use apisim::{APISERVER_MANIFEST, ETCD_MANIFEST, Sandbox, Sim, path_str, wait_until};
use bottlerocket::{ApiError, Retry, static_pod_enabled_key, unique_tx_name};
use serde_json::json;

fn refused(error: &ApiError) -> bool {
    matches!(error, ApiError::Connect { source, .. } if source.kind() == io::ErrorKind::ConnectionRefused)
}

/// A [`node`] whose API server restarts (down 3 s) at `when` a `method path` request sets a
/// static pod's `enabled` to `value`; with the path of kube-apiserver's manifest.
fn node_restarting_on(
    name: &str,
    (method, path): (&str, &str),
    value: bool,
    when: &str,
) -> (Sandbox, Sim, PathBuf) {
    let (sandbox, sim) = node(name, &[]);
    let manifest = sandbox.manifest("kube-apiserver");
    sim.set_faults(&json!({"restarts": [{
        "method": method, "path": path,
        "sets": "settings.kubernetes.static-pods.*.enabled", "value": value,
        "when": when, "down_ms": 3000}]}));
    (sandbox, sim, manifest)
}

/// A node with two static pods, both enabled and rendered.
fn node(name: &str, extra: &[&str]) -> (Sandbox, Sim) {
    let sandbox = Sandbox::new(name);
    let settings = sandbox.pods_settings(&[
        ("etcd", ETCD_MANIFEST),
        ("kube-apiserver", APISERVER_MANIFEST),
    ]);
    let mut args = vec!["--settings", path_str(&settings)];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let sim = Sim::start(&sandbox, &args);
    assert!(
        sandbox.manifest("kube-apiserver").exists(),
        "rendered at boot"
    );
    (sandbox, sim)
}

#[test]
fn pending_transactions_survive_api_restarts_until_commit_or_delete() {
    let (sandbox, sim) = node("pending", &[]);
    let api = sim.client();
    let stale = unique_tx_name("certrotor");
    let other = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&stale, "kube-apiserver", false)
        .expect("stage");
    api.patch_settings(&other, &json!({"motd": "other"}))
        .expect("stage");

    // SIGKILL: the socket file stays behind and refuses connections.
    sim.kill();
    assert!(sandbox.socket().exists(), "socket file left behind");
    let error = api.list_tx().expect_err("nobody listens");
    assert!(refused(&error), "{error:?}");
    assert!(error.is_transient() && !error.may_have_taken_effect());

    // Restarted (not a boot): both transactions are still pending, with their values.
    let sim = Sim::start(&sandbox, &[]);
    sim.wait_event("start", "not a boot");
    let mut expected = vec![stale.clone(), other.clone()];
    expected.sort();
    assert_eq!(api.list_tx().expect("list"), expected);
    assert_eq!(
        api.pending_setting(&stale, &static_pod_enabled_key("kube-apiserver"))
            .expect("pending"),
        Some(json!(false))
    );
    // Nothing committed them: live is unchanged.
    assert_eq!(
        api.static_pod_enabled("kube-apiserver").expect("live"),
        Some(true)
    );

    // Cleared by DELETE /tx and by a commit, and that lasts across another restart.
    assert_eq!(
        api.delete_tx(&stale).expect("delete"),
        ["settings.kubernetes.static-pods.kube-apiserver.enabled"]
    );
    assert_eq!(api.commit(&other).expect("commit"), ["settings.motd"]);
    assert!(sim.stop().success());
    let sim = Sim::start(&sandbox, &[]);
    assert!(api.list_tx().expect("list").is_empty());
    assert_eq!(api.settings().expect("live")["motd"], "other");

    // Only a boot clears what is pending.
    api.patch_settings(&stale, &json!({"motd": "lost at boot"}))
        .expect("stage");
    sim.stop();
    sandbox.reboot();
    let sim = Sim::start(&sandbox, &[]);
    sim.wait_event("boot", "pending transactions cleared");
    assert!(api.list_tx().expect("list").is_empty());
    sim.stop();
}

#[test]
fn an_api_restart_does_not_re_render_static_pods_only_a_boot_does() {
    let (sandbox, sim) = node("no-rerender", &[]);
    let manifest = sandbox.manifest("etcd");
    fs::remove_file(&manifest).expect("lose etcd's manifest");

    // A restart of the process (SIGTERM, then started again on the same root).
    assert!(sim.stop().success());
    let sim = Sim::start(&sandbox, &[]);
    assert!(
        !manifest.exists(),
        "an API restart re-rendered the static pods"
    );
    assert!(!sim.event_kinds().contains(&"boot".to_string()));

    // A restart inside the running emulator (the control socket's /restart).
    sim.control()
        .raw_request("POST", "/restart", Some(br#"{"down_ms": 200}"#))
        .expect("restart");
    sim.wait_event("up", "not re-rendered");
    sim.wait_up();
    assert!(!manifest.exists());

    // A boot in place (systemd would not, a reboot does): rendered.
    sim.control()
        .raw_request("POST", "/restart", Some(br#"{"down_ms": 0, "boot": true}"#))
        .expect("boot");
    sim.wait_event("up", "after a boot");
    assert_eq!(
        fs::read(&manifest).expect("rendered at boot"),
        ETCD_MANIFEST
    );

    // And a reboot of the node: `--boot`-free start after /run and /etc are gone.
    sim.stop();
    sandbox.reboot();
    let sim = Sim::start(&sandbox, &[]);
    assert_eq!(
        fs::read(&manifest).expect("rendered at boot"),
        ETCD_MANIFEST
    );
    sim.stop();
}

#[test]
fn a_restart_right_after_the_commit_loses_the_apply_and_apply_keys_recovers_it() {
    let (_sandbox, sim, manifest) = node_restarting_on(
        "lost-apply",
        ("POST", "/tx/commit_and_apply"),
        false,
        "after",
    );
    let api = sim.client();

    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, "kube-apiserver", false)
        .expect("stage");
    // The commit is answered ...
    assert_eq!(
        api.commit_and_apply(&tx).expect("answered"),
        ["settings.kubernetes.static-pods.kube-apiserver.enabled"]
    );
    // ... by a server that is already down.
    let error = api.static_pod_enabled("kube-apiserver").expect_err("down");
    assert!(refused(&error) && error.is_transient(), "{error:?}");
    sim.wait_event("apply-lost", "kube-apiserver.enabled");

    // Back up: the commit stands, the manifest did not follow.
    let mut retry = Retry::until(Instant::now() + apisim::DEADLINE);
    let live = retry
        .run(|left| api.bounded(left).static_pod_enabled("kube-apiserver"))
        .expect("the API came back");
    assert_eq!(live, Some(false));
    assert!(retry.attempts() >= 1);
    assert!(manifest.exists(), "a lost apply changed the manifest");
    assert!(api.list_tx().expect("list").is_empty(), "committed");

    // Re-running the applier for that key makes the manifest follow the live value.
    api.apply(&[&static_pod_enabled_key("kube-apiserver")])
        .expect("apply");
    wait_until("the manifest removed", || !manifest.exists());
    sim.wait_event("apply-rendered", "disabled [\"kube-apiserver\"]");
    sim.stop();
}

#[test]
fn a_failing_applier_changes_no_manifest_while_every_call_succeeds() {
    let sandbox = Sandbox::new("failing-applier");
    let faults = sandbox.path().join("faults.json");
    fs::write(&faults, r#"{"applier": {"fail_next": 1}}"#).expect("faults file");
    let settings = sandbox.pods_settings(&[("kube-apiserver", APISERVER_MANIFEST)]);
    let sim = Sim::start(
        &sandbox,
        &[
            "--settings",
            path_str(&settings),
            "--faults",
            path_str(&faults),
        ],
    );
    let api = sim.client();
    let manifest = sandbox.manifest("kube-apiserver");

    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, "kube-apiserver", false)
        .expect("204");
    api.commit_and_apply(&tx).expect("200");
    let failed = sim.wait_event(
        "apply-failed",
        "Restart command failed - '/usr/bin/static-pods'",
    );
    assert!(
        failed["detail"]
            .as_str()
            .is_some_and(|d| d.contains("exit status: 1"))
    );
    assert!(
        manifest.exists(),
        "a failed static-pods changed the manifest"
    );
    assert_eq!(
        api.static_pod_enabled("kube-apiserver").expect("live"),
        Some(false)
    );

    // The fault was for one run: the next apply of that key acts.
    api.apply(&[&static_pod_enabled_key("kube-apiserver")])
        .expect("204");
    wait_until("the manifest removed", || !manifest.exists());

    // While it always fails, every apply keeps answering 204 and nothing changes.
    sim.set_faults(&json!({"applier": {"fail_always": true}}));
    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, "kube-apiserver", true)
        .expect("204");
    api.commit_and_apply(&tx).expect("200");
    for _ in 0..3 {
        api.apply(&[&static_pod_enabled_key("kube-apiserver")])
            .expect("204");
    }
    wait_until("five failed runs (one, then four while always)", || {
        sim.events()
            .iter()
            .filter(|e| e["kind"] == "apply-failed")
            .count()
            == 5
    });
    assert!(!manifest.exists());
    sim.set_faults(&json!({}));
    api.apply(&[&static_pod_enabled_key("kube-apiserver")])
        .expect("204");
    wait_until("the manifest back", || manifest.exists());
    sim.stop();
}

#[test]
fn a_restart_before_the_re_enable_drops_the_patch_and_refuses_until_up() {
    let (_sandbox, sim, manifest) =
        node_restarting_on("before-enable", ("PATCH", "/settings"), true, "before");
    let api = sim.client();

    // The disable is not affected.
    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, "kube-apiserver", false)
        .expect("disable staged");
    api.commit_and_apply(&tx).expect("disable committed");
    wait_until("the manifest removed", || !manifest.exists());

    // The enable's PATCH: the connection drops, nothing is staged, the server is down.
    let tx = unique_tx_name("certrotor");
    let error = api
        .set_static_pod_enabled(&tx, "kube-apiserver", true)
        .expect_err("dropped");
    assert!(matches!(error, ApiError::Io { .. }), "{error:?}");
    assert!(error.is_transient() && error.may_have_taken_effect());
    let error = api.commit_and_apply(&tx).expect_err("down");
    assert!(refused(&error), "{error:?}");
    sim.wait_event("fault", "before PATCH /settings");

    // Retried within a deadline: the pod comes back.
    let mut retry = Retry::until(Instant::now() + apisim::DEADLINE)
        .with_backoff(Duration::from_millis(50), Duration::from_millis(500));
    retry
        .run(|left| {
            let api = api.bounded(left);
            api.set_static_pod_enabled(&tx, "kube-apiserver", true)?;
            api.commit_and_apply(&tx)
        })
        .expect("enabled after the restart");
    assert!(retry.attempts() > 1);
    wait_until("the manifest back", || manifest.exists());
    assert_eq!(
        api.static_pod_enabled("kube-apiserver").expect("live"),
        Some(true)
    );
    sim.stop();
}

/// A [`node`] (folder `when`) whose API server restarts (down 300 ms) `when` a commit comes in,
/// and a transaction disabling `pod` committed there: (sandbox, sim, transaction, the commit's
/// error).
fn disable_committed_under_restart(when: &str, pod: &str) -> (Sandbox, Sim, String, ApiError) {
    let (sandbox, sim) = node(&format!("{when}-commit"), &[]);
    let api = sim.client();
    sim.set_faults(&json!({"restarts": [{
        "method": "POST", "path": "/tx/commit_and_apply", "when": when,
        "down_ms": 300}]}));
    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, pod, false).expect("stage");
    let error = api
        .commit_and_apply(&tx)
        .expect_err("a commit met by the restart must fail");
    (sandbox, sim, tx, error)
}

#[test]
fn a_commit_that_is_never_answered_stands() {
    let (sandbox, sim, tx, error) = disable_committed_under_restart("no-response", "etcd");
    let api = sim.client();
    assert!(matches!(error, ApiError::Io { .. }), "{error:?}");
    assert!(error.may_have_taken_effect(), "{error:?}");
    sim.wait_event("apply-lost", "etcd.enabled");
    sim.wait_up();
    // Committed although the client saw an error; a second commit finds nothing pending.
    assert_eq!(api.static_pod_enabled("etcd").expect("live"), Some(false));
    assert!(
        api.commit_and_apply(&tx)
            .expect_err("gone")
            .is_empty_commit()
    );
    assert!(sandbox.manifest("etcd").exists(), "the apply was lost");
    sim.stop();
}

#[test]
fn a_commit_dropped_before_it_is_handled_leaves_the_transaction_pending() {
    // Issue 26, point 3: the disable stays pending under its transaction name across the API
    // restart, and would be committed by whoever commits that name next.
    let (sandbox, sim, tx, error) = disable_committed_under_restart("before", "kube-apiserver");
    let api = sim.client();
    assert!(error.is_transient(), "{error:?}");
    sim.wait_up();
    assert_eq!(api.list_tx().expect("list"), std::slice::from_ref(&tx));
    assert_eq!(
        api.static_pod_enabled("kube-apiserver").expect("live"),
        Some(true)
    );
    assert!(sandbox.manifest("kube-apiserver").exists());
    // Discarding it is what a careful caller does.
    api.delete_tx(&tx).expect("delete");
    assert!(api.list_tx().expect("list").is_empty());
    sim.stop();
}

#[test]
fn a_restart_can_remove_the_socket_file_and_drops_open_connections() {
    let (sandbox, sim) = node("socket-gone", &[]);
    let api = sim.client();
    // An idle kept-alive connection, open when the server goes down.
    let mut idle = std::os::unix::net::UnixStream::connect(sandbox.socket()).expect("connect");
    sim.control()
        .raw_request(
            "POST",
            "/restart",
            Some(br#"{"down_ms": 3000, "remove_socket": true}"#),
        )
        .expect("restart");
    let error = api.os().expect_err("no socket");
    assert!(
        matches!(&error, ApiError::Connect { source, .. } if source.kind() == io::ErrorKind::NotFound),
        "{error:?}"
    );
    assert!(error.is_transient());
    let mut byte = [0u8; 1];
    idle.set_read_timeout(Some(apisim::DEADLINE))
        .expect("timeout");
    assert_eq!(
        io::Read::read(&mut idle, &mut byte).expect("closed, not timed out"),
        0,
        "the open connection was dropped"
    );
    sim.wait_up();
    let (_, status) = sim
        .control()
        .raw_request("GET", "/status", None)
        .expect("status");
    let status: serde_json::Value = serde_json::from_slice(&status).expect("json");
    assert_eq!(status["up"], true);
    assert_eq!(status["restarts"], 1);
    sim.stop();
}

#[test]
fn the_control_socket_refuses_what_it_does_not_understand() {
    let (_sandbox, sim) = node("control", &[]);
    let control = sim.control();
    let (status, body) = control
        .raw_request_unchecked("PUT", "/faults", Some(br#"{"restarts": [{"path": "/"}]}"#))
        .expect("answer");
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body).contains("missing field `method`"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let armed = json!({"restarts": [{"method": "GET", "path": "/os", "when": "after",
        "down_ms": 0, "times": 2}], "applier": {"fail_next": 3, "fail_always": false}});
    sim.set_faults(&armed);
    let (_, body) = control.raw_request("GET", "/faults", None).expect("faults");
    let back: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(back["restarts"][0]["times"], 2);
    assert_eq!(back["applier"]["fail_next"], 3);
    assert_eq!(
        control
            .raw_request_unchecked("GET", "/nope", None)
            .expect("answer")
            .0,
        404
    );
    sim.stop();
}

#[test]
fn an_applier_that_cannot_start_answers_500_after_the_commit() {
    let (sandbox, sim) = node("applier-start", &[]);
    let api = sim.client();
    sim.set_faults(&json!({"applier": {"start_fail_next": 1}}));
    let tx = unique_tx_name("certrotor");
    api.set_static_pod_enabled(&tx, "etcd", false)
        .expect("stage");
    let error = api.commit_and_apply(&tx).expect_err("500");
    assert_eq!(error.status(), Some(500), "{error}");
    assert!(
        error
            .server_message()
            .is_some_and(|m| m.starts_with("Unable to start config applier")),
        "{error}"
    );
    assert!(error.is_transient() && error.may_have_taken_effect());
    sim.wait_event("apply-not-started", "could not be started");
    // The commit happened; nothing applied it.
    assert_eq!(api.static_pod_enabled("etcd").expect("live"), Some(false));
    assert!(api.list_tx().expect("list").is_empty());
    assert!(sandbox.manifest("etcd").exists());
    api.apply(&[&static_pod_enabled_key("etcd")])
        .expect("the next start works");
    wait_until("etcd's manifest removed", || {
        !sandbox.manifest("etcd").exists()
    });
    sim.stop();
}
