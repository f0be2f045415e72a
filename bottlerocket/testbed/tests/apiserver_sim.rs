//! Integration tests for the Bottlerocket API client against the real `apiserver-sim` binary,
//! the contract of the v1.20.5 API server: transaction isolation, commit-without-diff, the
//! API's error statuses, messages and content types, the asynchronous static-pod applier that
//! rewrites every enabled manifest, `/tx/apply?keys=`, JSON order, oversized bodies,
//! persistence, boots, socket handling. The faults (restarts, lost and failed applies) are in
//! `apiserver_sim_faults.rs`.
//!
//! Each test gets its own directory (socket, emulated root, log) and its own emulator process,
//! started through `CARGO_BIN_EXE_apiserver-sim` and stopped with SIGTERM. Waits poll against a
//! deadline; on failure the emulator's log is printed and the directory is kept.
#![forbid(unsafe_code)]

mod apisim;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::process::Command;

use apisim::{
    APISERVER_MANIFEST, DEADLINE, ETCD_MANIFEST, Sandbox, Sim, inode, path_str, raw_exchange,
    raw_request, split_response, wait_until,
};
use bottlerocket::{ApiClient, ApiError};
use serde_json::{Value, json};
use testbed::base64;

/// A new sandbox `name` with an API server started in it (default flags).
fn started(name: &str) -> (Sandbox, Sim) {
    let sandbox = Sandbox::new(name);
    let sim = Sim::start(&sandbox, &[]);
    (sandbox, sim)
}

#[test]
fn pending_changes_are_isolated_per_transaction() {
    let (_sandbox, sim) = started("isolation");
    let api = sim.client();

    api.patch_settings("certrotor-a", &json!({"motd": "from a"}))
        .expect("patch a");
    api.patch_settings("certrotor-b", &json!({"kubernetes": {"cluster-name": "b"}}))
        .expect("patch b");

    assert_eq!(
        api.pending("certrotor-a").expect("pending a"),
        json!({"motd": "from a"})
    );
    assert_eq!(
        api.pending("certrotor-b").expect("pending b"),
        json!({"kubernetes": {"cluster-name": "b"}})
    );
    assert_eq!(api.pending("default").expect("pending default"), json!({}));
    assert_eq!(api.list_tx().expect("list"), ["certrotor-a", "certrotor-b"]);
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );

    assert_eq!(
        api.commit("certrotor-b").expect("commit b"),
        ["settings.kubernetes.cluster-name"]
    );
    assert_eq!(
        api.pending("certrotor-a").expect("a untouched"),
        json!({"motd": "from a"})
    );
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );
    assert_eq!(
        api.delete_tx("certrotor-a").expect("delete"),
        ["settings.motd"]
    );
    assert!(api.list_tx().expect("list").is_empty());
    assert_eq!(
        api.settings().expect("live")["motd"],
        "Welcome to Bottlerocket!"
    );
    sim.stop();
}

#[test]
fn commit_returns_every_pending_key_even_unchanged_ones() {
    let (_sandbox, sim) = started("no-diff");
    let api = sim.client();
    let live_motd = api.settings().expect("settings")["motd"].clone();

    let staged = json!({"motd": live_motd, "kubernetes": {"cluster-name": "new"}});
    api.patch_settings("certrotor", &staged).expect("patch");
    let keys = api.commit_and_apply("certrotor").expect("commit");

    assert_eq!(keys, ["settings.kubernetes.cluster-name", "settings.motd"]);
    assert_eq!(
        api.settings_by_keys(&["settings.kubernetes.cluster-name", "settings.motd"])
            .expect("keys"),
        staged
    );
    sim.stop();
}

#[test]
fn empty_commit_is_a_422_that_keeps_the_server_message() {
    let (_sandbox, sim) = started("empty-commit");
    let api = sim.client();

    let never_used = api
        .commit("certrotor-never-used")
        .expect_err("nothing pending");
    assert!(never_used.is_empty_commit(), "{never_used:?}");
    assert_eq!(
        never_used.server_message(),
        Some("Tried to commit with no pending changes")
    );
    assert_eq!(
        never_used.to_string(),
        "Status 422 when POSTing '/tx/commit?tx=certrotor-never-used': \
         Tried to commit with no pending changes"
    );

    api.patch_settings("certrotor", &json!({"motd": "x"}))
        .expect("patch");
    api.commit_and_apply("certrotor").expect("first commit");
    let second = api
        .commit_and_apply("certrotor")
        .expect_err("already committed");
    assert!(second.is_empty_commit(), "{second:?}");
    sim.stop();
}

#[test]
fn unknown_key_is_a_400_that_keeps_the_server_message_and_stages_nothing() {
    let (_sandbox, sim) = started("unknown-key");
    let api = sim.client();

    let error = api
        .patch_settings("certrotor", &json!({"motd": "x", "kuberentes": {}}))
        .expect_err("typo");
    assert!(error.is_unknown_key(), "{error:?}");
    let message = error.server_message().expect("status error");
    assert!(
        message.starts_with(
            "Json deserialize error: unknown field `kuberentes`, expected one of `motd`, `kubernetes`"
        ),
        "{message}"
    );

    let wrong_type = api
        .set_static_pod("certrotor", "etcd", ETCD_MANIFEST, true)
        .and_then(|()| {
            api.patch_settings(
                "certrotor",
                &json!({"kubernetes": {"static-pods": {"etcd": {"enabled": "yes"}}}}),
            )
        })
        .expect_err("string for a bool");
    assert_eq!(wrong_type.status(), Some(400));
    assert!(
        wrong_type
            .to_string()
            .contains("invalid type: string \"yes\", expected a boolean"),
        "{wrong_type}"
    );
    // The valid first patch is staged; neither failed patch left anything behind.
    assert_eq!(
        api.pending("certrotor").expect("pending")["kubernetes"]["static-pods"]["etcd"]["enabled"],
        true
    );
    assert!(
        api.pending("certrotor")
            .expect("pending")
            .get("motd")
            .is_none()
    );

    let raw = api
        .raw_request_unchecked("PATCH", "/settings?tx=certrotor", Some(b"{not json"))
        .expect("raw");
    assert_eq!(raw.0, 400);
    assert_eq!(
        api.raw_request_unchecked("GET", "/no/such/route", None)
            .expect("raw")
            .0,
        404
    );
    sim.stop();
}

#[test]
fn static_pod_toggle_renders_manifests_asynchronously_for_every_pod() {
    let sandbox = Sandbox::new("static-pods");
    // A long apply delay makes "commit_and_apply returned but nothing is rendered yet"
    // observable without racing the applier.
    let sim = Sim::start(&sandbox, &["--apply-delay-ms", "1000"]);
    let api = sim.client();
    let pods = sandbox.root().join("etc/kubernetes/static-pods");
    let apiserver = pods.join("kube-apiserver");
    let etcd = pods.join("etcd");

    api.set_static_pod("certrotor-1", "kube-apiserver", APISERVER_MANIFEST, true)
        .expect("stage apiserver");
    api.set_static_pod("certrotor-1", "etcd", ETCD_MANIFEST, true)
        .expect("stage etcd");
    let keys = api.commit_and_apply("certrotor-1").expect("commit");
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(!apiserver.exists(), "apply must not be synchronous");
    wait_until("manifests written", || {
        fs::read(&apiserver).ok().as_deref() == Some(APISERVER_MANIFEST)
            && fs::read(&etcd).ok().as_deref() == Some(ETCD_MANIFEST)
    });

    api.set_static_pod_enabled("certrotor-2", "kube-apiserver", false)
        .expect("stage disable");
    api.commit_and_apply("certrotor-2").expect("commit disable");
    wait_until("kube-apiserver manifest removed", || !apiserver.exists());
    assert_eq!(fs::read(&etcd).expect("etcd untouched"), ETCD_MANIFEST);

    // Every pod is rendered on each run, not only changed ones: a lost etcd manifest comes
    // back when only kube-apiserver is toggled.
    fs::remove_file(&etcd).expect("remove etcd manifest");
    api.set_static_pod_enabled("certrotor-3", "kube-apiserver", true)
        .expect("stage enable");
    api.commit_and_apply("certrotor-3").expect("commit enable");
    wait_until("both manifests back", || {
        apiserver.exists() && etcd.exists()
    });
    assert_eq!(fs::read(&apiserver).expect("apiserver"), APISERVER_MANIFEST);
    sim.stop();
}

#[test]
fn settings_survive_a_reboot_and_static_pods_are_rendered_at_boot() {
    let sandbox = Sandbox::new("restart");
    let first = Sim::start(&sandbox, &["--apply-delay-ms", "0"]);
    let api = first.client();
    api.patch_settings("certrotor", &json!({"motd": "persisted"}))
        .expect("patch");
    api.set_static_pod("certrotor", "etcd", ETCD_MANIFEST, true)
        .expect("stage pod");
    api.commit_and_apply("certrotor").expect("commit");
    let manifest = sandbox.root().join("etc/kubernetes/static-pods/etcd");
    wait_until("etcd manifest written", || manifest.exists());
    let status = first.stop();
    assert!(status.success(), "{status}");
    assert!(!sandbox.socket().exists(), "socket removed on SIGTERM");

    // /etc and /run are tmpfs on Bottlerocket: lose them (a reboot), start, and expect the
    // manifests rebuilt at boot.
    sandbox.reboot();
    let other_settings = sandbox.path().join("other.json");
    fs::write(&other_settings, r#"{"motd": "not used"}"#).expect("write settings");
    let second = Sim::start(&sandbox, &["--settings", path_str(&other_settings)]);
    assert_eq!(
        second.client().settings().expect("settings")["motd"],
        "persisted"
    );
    assert_eq!(
        fs::read(&manifest).expect("rendered at boot"),
        ETCD_MANIFEST
    );
    second.stop();
}

#[test]
fn initial_settings_come_from_the_settings_file_and_are_validated() {
    let sandbox = Sandbox::new("settings-file");
    let settings = sandbox.path().join("settings.json");
    let pod = base64::encode(ETCD_MANIFEST);
    fs::write(
        &settings,
        json!({"motd": "seeded", "kubernetes": {"static-pods": {"etcd": {"enabled": true, "manifest": pod}}}})
            .to_string(),
    )
    .expect("write settings");
    let sim = Sim::start(&sandbox, &["--settings", path_str(&settings)]);
    let api = sim.client();
    assert_eq!(
        api.settings_by_prefix("mo").expect("prefix"),
        json!({"motd": "seeded"})
    );
    assert_eq!(
        fs::read(sandbox.root().join("etc/kubernetes/static-pods/etcd")).expect("boot render"),
        ETCD_MANIFEST
    );
    assert_eq!(api.os().expect("os")["variant_id"], "metal-k8s-1.29");
    sim.stop();

    let bad = Sandbox::new("bad-settings");
    let bad_file = bad.path().join("settings.json");
    fs::write(&bad_file, r#"{"motd": "x", "bogus": 1}"#).expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_apiserver-sim"))
        .args([
            "--socket",
            path_str(&bad.socket()),
            "--root",
            path_str(&bad.root()),
        ])
        .args(["--settings", path_str(&bad_file)])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown field `bogus`"), "{stderr}");
}

#[test]
fn a_stale_socket_is_replaced_and_the_new_one_is_group_only() {
    let sandbox = Sandbox::new("stale");
    drop(UnixListener::bind(sandbox.socket()).expect("stale socket"));
    assert!(sandbox.socket().exists());
    let sim = Sim::start(&sandbox, &[]);
    let mode = fs::metadata(sandbox.socket())
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660);
    sim.client().os().expect("serving");
    sim.stop();
}

#[test]
fn concurrent_clients_each_commit_their_own_transaction() {
    let (sandbox, sim) = started("concurrent");
    let socket = sandbox.socket();
    let workers: Vec<_> = (0..8)
        .map(|index| {
            let api = ApiClient::new(&socket).with_timeout(DEADLINE);
            std::thread::spawn(move || -> Result<Vec<String>, ApiError> {
                let tx = format!("certrotor-{index}");
                let label =
                    json!({"kubernetes": {"node-labels": {format!("worker-{index}"): "yes"}}});
                api.patch_settings(&tx, &label)?;
                api.commit_and_apply(&tx)
            })
        })
        .collect();
    for (index, worker) in workers.into_iter().enumerate() {
        let keys = worker.join().expect("thread").expect("commit");
        assert_eq!(
            keys,
            [format!("settings.kubernetes.node-labels.worker-{index}")]
        );
    }
    let labels = sim
        .client()
        .settings_by_prefix("kubernetes.node-labels")
        .expect("labels");
    assert_eq!(
        labels["kubernetes"]["node-labels"]
            .as_object()
            .map(|m| m.len()),
        Some(8)
    );
    sim.stop();
}

#[test]
fn status_codes_bodies_and_content_types_are_those_of_v1_20_5() {
    let (sandbox, sim) = started("codes");
    let api = sim.client();
    let socket = sandbox.socket();
    let exchange = |method: &str, target: &str, body: &str| {
        let raw = raw_exchange(&socket, &raw_request(method, target, body));
        let (head, body) = split_response(&raw);
        (head, String::from_utf8_lossy(&body).into_owned())
    };

    // 422 and the server's own 400s: plain text without a content type.
    let (head, body) = exchange("POST", "/tx/commit?tx=never-existed", "");
    assert!(head.starts_with("http/1.1 422"), "{head}");
    assert!(!head.contains("content-type"), "{head}");
    assert_eq!(body, "Tried to commit with no pending changes");
    let (head, body) = exchange("POST", "/tx/apply?keys=", "");
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(!head.contains("content-type"), "{head}");
    assert_eq!(body, "Input 'keys' cannot be empty");
    let error = api.apply(&[]).expect_err("empty keys");
    assert_eq!(error.status(), Some(400), "{error}");
    assert_eq!(error.server_message(), Some("Input 'keys' cannot be empty"));
    assert!(!error.is_transient());

    // serde's 400: text/plain.
    let (head, body) = exchange("PATCH", "/settings?tx=a", r#"{"motd": 1}"#);
    assert!(head.starts_with("http/1.1 400"), "{head}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert!(
        body.starts_with("Json deserialize error: invalid type"),
        "{body}"
    );

    // /tx/apply: 204, a JSON content type, and `null` without a length.
    let (head, body) = exchange("POST", "/tx/apply", "");
    assert!(head.starts_with("http/1.1 204"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert_eq!(body, "null");
    // On a kept-alive connection the stray `null` comes before the next answer's status line.
    let two = [
        "POST /tx/apply HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n",
        "GET /os HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    ]
    .concat();
    let raw = String::from_utf8_lossy(&raw_exchange(&socket, two.as_bytes())).into_owned();
    assert!(raw.contains("\r\n\r\nnullHTTP/1.1 200 OK\r\n"), "{raw}");
    // The client opens one connection per request and is not affected.
    api.apply_all().expect("apply_all");
    api.os().expect("the next request");

    // PATCH /settings/keypair: 404 in v1.20.5.
    let (head, _) = exchange(
        "PATCH",
        "/settings/keypair?tx=k",
        r#"{"request_payload":["motd=x"]}"#,
    );
    assert!(head.starts_with("http/1.1 404"), "{head}");

    // An empty transaction name is accepted and lists as `settings`.
    api.patch_settings("", &json!({"motd": "unnamed"}))
        .expect("PATCH ?tx= is 204");
    assert_eq!(api.list_tx().expect("list"), ["settings"]);
    assert_eq!(
        api.pending("settings").expect("pending"),
        json!({"motd": "unnamed"})
    );
    sim.stop();
}

#[test]
fn keypair_is_served_only_when_asked_for() {
    let sandbox = Sandbox::new("keypair");
    let sim = Sim::start(&sandbox, &["--keypair"]);
    let body = br#"{"request_payload":["kubernetes.static-pods.etcd.enabled=false"]}"#;
    let (status, _) = sim
        .client()
        .raw_request("PATCH", "/settings/keypair?tx=k", Some(body))
        .expect("keypair");
    assert_eq!(status, 204);
    assert_eq!(
        sim.client()
            .pending_setting("k", "settings.kubernetes.static-pods.etcd.enabled")
            .expect("pending"),
        Some(json!(false))
    );
    sim.stop();
}

#[test]
fn json_key_order_changes_between_calls() {
    let (sandbox, sim) = started("order");
    let api = sim.client();
    for tx in ["a", "b", "c", "d"] {
        api.patch_settings(tx, &json!({"motd": tx})).expect("patch");
    }
    let mut settings_bodies = std::collections::BTreeSet::new();
    let mut list_bodies = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (_, body) = api.raw_request("GET", "/", None).expect("model");
        let model: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(model["settings"]["motd"], "Welcome to Bottlerocket!");
        settings_bodies.insert(body);
        let (_, body) = api.raw_request("GET", "/tx/list", None).expect("list");
        list_bodies.insert(body);
        assert_eq!(
            api.list_tx().expect("sorted by the client"),
            ["a", "b", "c", "d"]
        );
    }
    assert!(settings_bodies.len() > 1, "the same order 20 times");
    assert!(list_bodies.len() > 1, "the same order 20 times");
    sim.stop();

    let stable = Sim::start(&sandbox, &["--stable-json"]);
    let api = stable.client();
    let first = api.raw_request("GET", "/", None).expect("model").1;
    for _ in 0..5 {
        assert_eq!(api.raw_request("GET", "/", None).expect("model").1, first);
    }
    stable.stop();
}

#[test]
fn a_body_of_several_mib_drops_the_connection_without_an_answer() {
    let (_sandbox, sim) = started("big-body");
    let api = sim.client();
    let huge = json!({"motd": "x".repeat(5 << 20)});
    let error = api.patch_settings("big", &huge).expect_err("dropped");
    assert!(matches!(error, ApiError::Io { .. }), "{error:?}");
    assert!(error.is_transient(), "{error}");
    assert!(api.list_tx().expect("still serving").is_empty());
    // Below actix's 2 MiB limit it is an ordinary PATCH.
    let big = json!({"motd": "y".repeat((2 << 20) - 100)});
    api.patch_settings("big", &big).expect("under the limit");
    assert_eq!(api.list_tx().expect("list"), ["big"]);
    sim.stop();
}

#[test]
fn os_has_a_semver_version_id() {
    let (_sandbox, sim) = started("os");
    let os = sim.client().os().expect("os");
    let version = os["version_id"].as_str().expect("version_id");
    let parts: Vec<&str> = version.split('.').collect();
    assert_eq!(parts.len(), 3, "{version}");
    assert!(parts.iter().all(|p| p.parse::<u64>().is_ok()), "{version}");
    for field in ["pretty_name", "variant_id", "build_id", "arch"] {
        assert!(os[field].is_string(), "{field}: {os}");
    }
    sim.stop();
}

#[test]
fn every_apply_rewrites_every_enabled_manifest_and_apply_keys_reruns_it() {
    let sandbox = Sandbox::new("rewrite");
    let settings = sandbox.pods_settings(&[
        ("etcd", ETCD_MANIFEST),
        ("kube-apiserver", APISERVER_MANIFEST),
    ]);
    let sim = Sim::start(&sandbox, &["--settings", path_str(&settings)]);
    let api = sim.client();
    let etcd = sandbox.manifest("etcd");
    let apiserver = sandbox.manifest("kube-apiserver");
    let before = inode(&etcd);

    // Toggling kube-apiserver rewrites etcd's manifest: same bytes, new inode.
    let tx = bottlerocket::unique_tx_name("test");
    api.set_static_pod_enabled(&tx, "kube-apiserver", false)
        .expect("stage");
    api.commit_and_apply(&tx).expect("commit");
    wait_until("kube-apiserver removed", || !apiserver.exists());
    sim.wait_event("apply-rendered", "disabled [\"kube-apiserver\"]");
    let after = inode(&etcd);
    assert_ne!(after, before);
    assert_eq!(fs::read(&etcd).expect("etcd"), ETCD_MANIFEST);

    // A settings change that affects no static pod rewrites nothing.
    api.patch_settings(&tx, &json!({"motd": "x"}))
        .expect("stage");
    api.commit_and_apply(&tx).expect("commit");
    sim.wait_event("apply-skipped", "settings.motd");
    assert_eq!(inode(&etcd), after);

    // /tx/apply?keys= re-runs static-pods from the live settings: rewritten again.
    api.apply(&[&bottlerocket::static_pod_enabled_key("etcd")])
        .expect("apply");
    wait_until("etcd rewritten", || inode(&etcd) != after);
    assert_eq!(fs::read(&etcd).expect("etcd"), ETCD_MANIFEST);
    assert!(!apiserver.exists(), "live settings say disabled");
    sim.stop();
}

#[test]
fn commit_of_an_unknown_transaction_is_422_for_both_commit_routes() {
    let (_sandbox, sim) = started("unknown-tx");
    let api = sim.client();
    for error in [
        api.commit("never").expect_err("commit"),
        api.commit_and_apply("never").expect_err("commit_and_apply"),
    ] {
        assert!(error.is_empty_commit(), "{error}");
        assert!(!error.is_transient() && !error.may_have_taken_effect());
    }
    sim.stop();
}
