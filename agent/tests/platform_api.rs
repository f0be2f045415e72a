//! Issue 26: the Bottlerocket API as it really behaves, against the emulator's faults
//! (apiserver-sim's control socket, `bottlerocket-api.md` "Faults of the real API server"): the
//! API server restarting before a disable, right after a commit (the applier lost), before a
//! re-enable, a commit that is never answered, an applier that exits 1 once or always, a crash of
//! certrotor between disable and enable (with the API restarting during the repair) and with a
//! staged transaction, a stop that never took effect. Each case ends with every static pod
//! enabled and running, the PKI wholly old or wholly new, no certrotor transaction left, and a
//! report that says what happened; each prints its figures (`FIGURE issue26 ...`: time from
//! certrotor's start to a healthy node, time without an apiserver by a 100 ms `/readyz` poll).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::platform_util::{
    self, NoApiserver, Node, PODS, Platform, Prober, RESTART_TIMEOUT, Served, figure, wait_for,
};
use super::{components, files_now, served_now};

const ENABLED: &str = "settings.kubernetes.static-pods.*.enabled";
/// How long the real API server is away when systemd restarts it (`RestartSec=5`).
const DOWN_MS: u64 = 5000;
/// certrotor's bound on re-runs of the applier for one change (restart::api::MAX_REAPPLIES).
const MAX_REAPPLIES: usize = 3;

/// A restart trigger of apiserver-sim for a request that sets a static pod's `enabled`.
fn restart_on(method: &str, path: &str, value: bool, when: &str, down_ms: u64) -> Value {
    json!({"restarts": [{
        "method": method, "path": path, "sets": ENABLED, "value": value,
        "when": when, "down_ms": down_ms,
    }]})
}

/// The key of `pod`'s `enabled`.
fn key(pod: &str) -> String {
    format!("settings.kubernetes.static-pods.{pod}.enabled")
}

/// Which PKI a case must end with.
enum Pki {
    /// The files of before, byte for byte, and served.
    Old,
    /// Every served file renewed and served.
    New,
}

/// A pass that ended well ([`Case::run_all_restarted`]): its output and report, when the node
/// was healthy after its start, and the poll's figures.
struct Passed {
    out: platform_util::Out,
    r: Value,
    healthy: Duration,
    no_api: NoApiserver,
}

/// A Bottlerocket node, what it was before, and the poll of its apiserver.
struct Case {
    node: Node,
    name: &'static str,
    files_before: Vec<String>,
    snapshot_before: BTreeMap<std::path::PathBuf, Vec<u8>>,
    manifests: BTreeMap<&'static str, Vec<u8>>,
}

impl Case {
    fn start(name: &'static str) -> Case {
        let node = Node::start(&format!("api26-{name}"), Platform::Bottlerocket);
        let manifests = PODS
            .iter()
            .map(|p| (*p, std::fs::read(node.kubelet_manifest(p)).unwrap()))
            .collect();
        let files_before = files_now(&node);
        assert_eq!(served_now(&node), files_before, "served before the run");
        Case {
            files_before,
            snapshot_before: node.snapshot(),
            manifests,
            node,
            name,
        }
    }

    /// `run --once --restart always --output json` with the apiserver polled from its start;
    /// returns it, when the node was healthy after its start, and the poll's figures.
    fn run(&self, extra: &[&str]) -> (platform_util::Out, Duration, NoApiserver) {
        let prober = Prober::start(&self.node);
        let t0 = Instant::now();
        let mut args = vec!["--restart", "always", "--output", "json"];
        args.extend_from_slice(extra);
        let out = self.node.run_once("bottlerocket", RESTART_TIMEOUT, &args);
        self.node.wait_all_healthy();
        let healthy = t0.elapsed();
        (out, healthy, prober.finish())
    }

    /// [`Case::run`] under the API faults `faults`: exit 0, every component renewed and
    /// restarted ([`all_restarted`]).
    fn run_all_restarted(&self, faults: &Value) -> Passed {
        self.node.api_faults(faults);
        let (out, healthy, no_api) = self.run(&[]);
        out.expect(0);
        let r = out.json();
        all_restarted(&r, &out);
        Passed {
            out,
            r,
            healthy,
            no_api,
        }
    }

    /// The end of a case whose pass renewed everything: [`Case::healthy_end`] with the new PKI,
    /// then the figures.
    fn renewed_end(&self, p: Passed) {
        self.healthy_end(Pki::New, &p.out);
        figures(self, &p.r, p.healthy, p.no_api);
    }

    /// Every static pod enabled in the API, its manifest the seeded bytes, running and healthy;
    /// no certrotor transaction pending; no stop recorded; the PKI wholly `pki`.
    fn healthy_end(&self, pki: Pki, ctx: &dyn std::fmt::Display) {
        let node = &self.node;
        node.wait_all_healthy();
        let api = node.api();
        for pod in PODS {
            assert_eq!(
                api.static_pod_enabled(pod).unwrap(),
                Some(true),
                "{pod} enabled\n{ctx}"
            );
            let manifest = std::fs::read(node.kubelet_manifest(pod)).unwrap();
            assert!(manifest == self.manifests[pod], "{pod}'s manifest\n{ctx}");
            assert!(node.states()[pod].running, "{pod} running\n{ctx}");
        }
        assert_eq!(api.list_tx().unwrap(), Vec::<String>::new(), "{ctx}");
        assert!(!node.stop_recorded(), "a stop is still recorded\n{ctx}");
        let files = files_now(node);
        match pki {
            Pki::Old => {
                assert!(
                    node.snapshot() == self.snapshot_before,
                    "the files differ from before\n{ctx}"
                );
                assert_eq!(files, self.files_before, "{ctx}");
            }
            Pki::New => {
                for (i, s) in Served::ALL.iter().enumerate() {
                    assert_ne!(files[i], self.files_before[i], "{s:?} not renewed\n{ctx}");
                }
            }
        }
        // kube-apiserver reloads its serving pair on its own schedule (a file watch, and a
        // resync every minute): after a rollback whose restart could not happen, the files on
        // disk are served once it has re-read them, within a bound, not at the next instant.
        wait_for(
            "the files on disk served",
            Duration::from_secs(150),
            Duration::from_millis(500),
            || {
                let served = served_now(node);
                (served == files)
                    .then_some(())
                    .ok_or_else(|| format!("served {served:?}, files {files:?}\n{ctx}"))
            },
        );
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The pass renewed and restarted all four, verified, with nothing left over.
fn all_restarted(r: &Value, out: &platform_util::Out) {
    assert_eq!(components(r, "restarted"), PODS, "{out}");
    assert!(r["rolled_back"].is_null(), "{out}");
    assert_eq!(r["left_disabled"], json!([]), "{out}");
    assert_eq!(r["re_enabled"], json!([]), "{out}");
}

/// Prints the case's figures with what the API met.
fn figures(case: &Case, r: &Value, healthy: Duration, no_api: NoApiserver) {
    figure(
        case.name,
        healthy,
        no_api,
        &format!(
            "api_retries={} reapplies={} api_unreachable_ms={}",
            r["api_retries"], r["reapplies"], r["api_unreachable_ms"]
        ),
    );
}

/// The `seq` of the first event of `kind` whose detail contains `detail`.
fn seq_of(node: &Node, kind: &str, detail: &str) -> u64 {
    n(&node.api_wait_event(kind, detail)["seq"])
}

/// Whether an applier run for `pod`'s key rendered after event `after`.
fn rendered_after(node: &Node, pod: &str, after: u64) -> bool {
    node.api_events_of("apply-rendered", &format!("applier for {}", key(pod)))
        .iter()
        .any(|e| n(&e["seq"]) > after)
}

/// The API restarts before the PATCH that sets the first pod's `enabled` to `value`: the pass
/// retries it, and its first restart records the retries and the time without the API.
fn retried_patch(name: &'static str, value: bool) -> (Case, Passed) {
    let case = Case::start(name);
    let p = case.run_all_restarted(&restart_on("PATCH", "/settings", value, "before", DOWN_MS));
    let (out, first) = (&p.out, &p.r["restarted"][0]);
    case.node
        .api_wait_event("fault", "restart before PATCH /settings");
    assert!(n(&first["api_retries"]) > 0, "{out}");
    assert!(n(&first["api_unreachable_ms"]) > 0, "{out}");
    (case, p)
}

#[test]
fn bottlerocket_api_restart_before_the_disable_is_retried() {
    let (case, p) = retried_patch("api-restart-before-the-disable", false);
    let (out, r) = (&p.out, &p.r);
    assert!(
        n(&r["api_retries"]) >= n(&r["restarted"][0]["api_retries"]),
        "{out}"
    );
    case.renewed_end(p);
}

/// The API restarts right after answering the commit of a change: the commit stands, the
/// applier it forked is lost, the manifest does not follow. `value` is the change.
fn lost_apply(name: &'static str, value: bool) {
    let case = Case::start(name);
    let node = &case.node;
    let fault = restart_on("POST", "/tx/commit_and_apply", value, "after", DOWN_MS);
    let p = case.run_all_restarted(&fault);
    let (out, r) = (&p.out, &p.r);
    node.api_wait_event("apply-lost", &format!("applier for {}", key("etcd")));
    let up = seq_of(node, "up", "serving again");
    assert!(
        rendered_after(node, "etcd", up),
        "no applier run for etcd after the API came back: {:#?}\n{out}",
        node.api_events()
    );
    assert_eq!(n(&r["restarted"][0]["reapplies"]), 1, "{out}");
    assert!(
        out.stderr.contains("re-running the API's config applier"),
        "{out}"
    );
    case.renewed_end(p);
}

#[test]
fn bottlerocket_api_restart_right_after_the_disable_commit_loses_the_apply() {
    lost_apply("api-restart-after-the-disable-commit", false);
}

#[test]
fn bottlerocket_api_restart_right_after_the_enable_commit_loses_the_apply() {
    lost_apply("api-restart-after-the-enable-commit", true);
}

#[test]
fn bottlerocket_api_restart_before_the_re_enable_is_retried() {
    let (case, p) = retried_patch("api-restart-before-the-re-enable", true);
    case.renewed_end(p);
}

#[test]
fn bottlerocket_commit_never_answered_stands() {
    let case = Case::start("commit-never-answered");
    let node = &case.node;
    let fault = restart_on(
        "POST",
        "/tx/commit_and_apply",
        false,
        "no-response",
        DOWN_MS,
    );
    let p = case.run_all_restarted(&fault);
    let (out, r) = (&p.out, &p.r);
    node.api_wait_event(
        "fault",
        "restart instead of answering POST /tx/commit_and_apply",
    );
    assert!(
        out.stderr.contains(
            "static pod 'etcd': enabled=false was committed although the answer was lost"
        ),
        "{out}"
    );
    let first = &r["restarted"][0];
    assert_eq!(n(&first["committed_unanswered"]), 1, "{out}");
    // The applier the commit forked died with the API: run again once.
    assert_eq!(n(&first["reapplies"]), 1, "{out}");
    case.renewed_end(p);
}

#[test]
fn bottlerocket_applier_exits_1_once_is_re_run() {
    let case = Case::start("applier-exits-1-once");
    let node = &case.node;
    let p = case.run_all_restarted(&json!({"applier": {"fail_next": 1}}));
    let (out, r) = (&p.out, &p.r);
    let failed = seq_of(
        node,
        "apply-failed",
        &format!("applier for {}", key("etcd")),
    );
    assert!(rendered_after(node, "etcd", failed), "{out}");
    assert_eq!(n(&r["restarted"][0]["reapplies"]), 1, "{out}");
    assert_eq!(n(&r["reapplies"]), 1, "{out}");
    case.renewed_end(p);
}

/// The stop of the first component never takes effect (the applier fails `fail` times, or
/// always): the pass fails fast, names the applier and its log, and rolls back without
/// restarting what never stopped. The rollback restored apiserver-kubelet-client, which
/// kube-apiserver 1.20 keeps on busy kubelet connections (reload::TABLE), so the rollback
/// restarts kube-apiserver: done once the applier works again (exit 3), or named as the
/// rollback's error while it still fails (exit 2), with the old files in place either way.
fn stop_never_took_effect(
    case: &Case,
    applier: Value,
    applier_mended: bool,
) -> (platform_util::Out, Value) {
    let node = &case.node;
    node.api_faults(&json!({ "applier": applier }));
    let (out, healthy, no_api) = case.run(&[]);
    out.expect(if applier_mended { 3 } else { 2 });
    let r = out.json();
    let rb = &r["rolled_back"];
    let failure = rb["failure"].as_str().unwrap();
    assert_mentions(
        failure,
        &[
            "etcd",
            "config applier (thar-be-settings running /usr/bin/static-pods)",
            "journalctl -u apiserver",
        ],
        &out,
    );
    assert!(
        rb["restarted"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("verified, not restarted"),
        "{out}"
    );
    if applier_mended {
        assert!(rb["error"].is_null(), "{out}");
        assert_eq!(
            components(rb, "restarted"),
            ["etcd", "kube-apiserver"],
            "{out}"
        );
        let why = rb["restarted"][1]["reason"].as_str().unwrap();
        assert!(why.contains("apiserver-kubelet-client"), "{why}\n{out}");
    } else {
        let error = rb["error"].as_str().unwrap();
        assert_mentions(
            error,
            &[
                "kube-apiserver",
                "config applier",
                "journalctl -u apiserver",
            ],
            &out,
        );
        assert_eq!(components(rb, "restarted"), ["etcd"], "{out}");
    }
    assert_eq!(r["restarted"], json!([]), "{out}");
    // The stop's re-applies, and the rollback's restart's while the applier still fails.
    let stops = if applier_mended { 1 } else { 2 };
    assert_eq!(n(&r["reapplies"]), stops * MAX_REAPPLIES as u64, "{out}");
    figures(case, &r, healthy, no_api);
    (out, r)
}

/// Asserts that `text` (a field of `out`'s report) contains each of `words`.
#[track_caller]
fn assert_mentions(text: &str, words: &[&str], out: &platform_util::Out) {
    for words in words {
        assert!(text.contains(words), "{words}: {text}\n{out}");
    }
}

#[test]
fn bottlerocket_applier_always_failing_fails_fast_and_leaves_the_pki_old() {
    let case = Case::start("applier-always-failing");
    let node = &case.node;
    let before = node.states();
    let (out, _) = stop_never_took_effect(&case, json!({"fail_always": true}), false);
    // Bounded: the two stops' commits and their re-applies, the enables' commits; nothing else.
    let failed = node.api_events_of("apply-failed", "").len();
    assert!(
        (1..=4 * (1 + MAX_REAPPLIES)).contains(&failed),
        "{failed} failed applier runs\n{out}"
    );
    // No pod was ever stopped.
    assert!(
        platform_util::changed_pods(&before, &node.states()).is_empty(),
        "{out}"
    );
    node.api_faults(&json!({}));
    case.healthy_end(Pki::Old, &out);

    // Mended: the next pass renews and restarts as usual.
    let (next, _, _) = case.run(&[]);
    next.expect(0);
    all_restarted(&next.json(), &next);
    case.healthy_end(Pki::New, &next);
}

#[test]
fn bottlerocket_stale_marker_after_a_failed_stop_claims_nothing() {
    let case = Case::start("failed-stop-claims-nothing");
    let node = &case.node;
    // The disable's commit and its three re-applies fail; the enable's works.
    let (out, _) = stop_never_took_effect(&case, json!({"fail_next": 1 + MAX_REAPPLIES}), true);
    assert!(!node.stop_recorded(), "{out}");
    case.healthy_end(Pki::Old, &out);
    let check = node.certrotor(&["check", "--root", node.root.to_str().unwrap()]);
    assert!(matches!(check.code, Some(0 | 1)), "{check}");
    for claim in ["started static pod", "interrupted run"] {
        assert!(!check.stderr.contains(claim), "{claim}\n{check}");
    }
}

/// Starts `run --once --restart always` and kills it once `ready` holds.
fn killed_run(node: &Node, what: &str, ready: impl Fn() -> bool) {
    let mut run = node.spawn_run_once_args("bottlerocket", &["--restart", "always"]);
    run.wait_while_running(what, what, Duration::from_secs(240), || {
        ready().then_some(()).ok_or_else(|| "not yet".to_string())
    });
    run.kill();
}

/// After the repair by `check`: the node's figures from the killed run's start; then the
/// crashed pass owed the other three: the next pass renews nothing, verifies etcd (started by
/// recovery on the renewed files) without restarting it, restarts the rest.
fn next_pass_finishes(case: &Case, t0: Instant, prober: Prober) {
    let node = &case.node;
    // The manifest comes back asynchronously (the applier), then etcd with it.
    node.wait_all_healthy();
    let (healthy, no_api) = (t0.elapsed(), prober.finish());
    figure(
        case.name,
        healthy,
        no_api,
        "(killed run, then the repair by check)",
    );
    let etcd_runs = node.states()["etcd"].history.len();
    let next = node.run_once("bottlerocket", RESTART_TIMEOUT, &["--output", "json"]);
    next.expect(0);
    let r = next.json();
    assert!(r["renew"]["backup_id"].is_null(), "nothing was due: {next}");
    assert_eq!(components(&r, "restarted"), PODS, "{next}");
    let etcd = &r["restarted"][0];
    assert!(
        etcd["reason"]
            .as_str()
            .unwrap()
            .contains("started again by recovery, on its renewed files"),
        "{next}"
    );
    assert_eq!(
        node.states()["etcd"].history.len(),
        etcd_runs,
        "etcd restarted again\n{next}"
    );
    case.healthy_end(Pki::New, &next);
    assert!(!node.pass_state().exists(), "{next}");
}

#[test]
fn bottlerocket_crash_between_disable_and_enable_is_repaired() {
    let case = Case::start("crash-between-disable-and-enable");
    let node = &case.node;
    let manifest = node.kubelet_manifest("etcd");
    let prober = Prober::start(node);
    let t0 = Instant::now();
    killed_run(node, "etcd stopped by certrotor", || {
        node.stop_recorded() && !manifest.exists()
    });
    wait_for(
        "etcd stopped",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let s = &node.states()["etcd"];
            (!s.running).then_some(()).ok_or(format!("{s:?}"))
        },
    );
    // The repair meets the API restarting.
    node.api_faults(&restart_on("PATCH", "/settings", true, "before", DOWN_MS));
    let check = node.certrotor(&["check", "--root", node.root.to_str().unwrap()]);
    assert!(matches!(check.code, Some(0 | 1)), "{check}");
    node.api_wait_event("fault", "restart before PATCH /settings");
    assert!(
        check
            .stderr
            .contains("started static pod 'etcd' again, which an interrupted run had disabled"),
        "{check}"
    );
    assert!(!check.stderr.contains("discarded"), "{check}");
    assert!(!node.stop_recorded(), "{check}");
    assert_eq!(node.api().static_pod_enabled("etcd").unwrap(), Some(true));
    next_pass_finishes(&case, t0, prober);
}

#[test]
fn bottlerocket_crash_with_a_staged_transaction_is_repaired() {
    let case = Case::start("crash-with-a-staged-transaction");
    let node = &case.node;
    let prober = Prober::start(node);
    let t0 = Instant::now();
    // The enable of etcd is staged, then its commit meets an API away for 30 s: certrotor is
    // killed while it retries.
    node.api_faults(&restart_on(
        "POST",
        "/tx/commit_and_apply",
        true,
        "before",
        30_000,
    ));
    killed_run(node, "the enable's commit dropped", || {
        !node
            .api_events_of("fault", "restart before POST /tx/commit_and_apply")
            .is_empty()
    });
    node.api_wait_event("up", "serving again");
    let staged = node.api().list_tx().unwrap();
    assert_eq!(staged.len(), 1, "{staged:?}");
    let tx = &staged[0];
    assert!(tx.starts_with("certrotor-"), "{tx}");
    assert_eq!(
        node.api().pending_setting(tx, &key("etcd")).unwrap(),
        Some(json!(true))
    );
    let check = node.certrotor(&["check", "--root", node.root.to_str().unwrap()]);
    assert!(matches!(check.code, Some(0 | 1)), "{check}");
    assert!(
        check.stderr.contains(&format!(
            "discarded the Bottlerocket API transaction '{tx}' left pending by an interrupted \
             run (it would have set {}=true)",
            key("etcd")
        )),
        "{check}"
    );
    assert!(
        check
            .stderr
            .contains("started static pod 'etcd' again, which an interrupted run had disabled"),
        "{check}"
    );
    assert_eq!(node.api().list_tx().unwrap(), Vec::<String>::new());
    next_pass_finishes(&case, t0, prober);
}

/// Issue 25.5: with `settings.kubernetes.static-pods-enabled=false` (Bottlerocket 1.46+: the
/// kubelet runs no static pod) a pass refuses before anything changes: exit 2 naming the
/// setting and the `apiclient set` that turns pods back on, no file renewed, no pod disabled.
#[test]
fn bottlerocket_static_pods_turned_off_is_refused_with_the_files_untouched() {
    let case = Case::start("static-pods-off");
    let node = &case.node;
    let api = node.api();
    let tx = "test-static-pods-off";
    api.patch_settings(tx, &json!({"kubernetes": {"static-pods-enabled": false}}))
        .unwrap();
    api.commit(tx).unwrap();
    assert_eq!(api.static_pods_enabled().unwrap(), Some(false));
    let before = node.states();
    let (out, _, _) = case.run(&[]);
    out.expect(2);
    for words in [
        "settings.kubernetes.static-pods-enabled is false",
        "apiclient set settings.kubernetes.static-pods-enabled=true",
        "nothing was renewed or restarted",
    ] {
        assert!(out.stderr.contains(words), "{words}\n{out}");
    }
    assert!(
        platform_util::changed_pods(&before, &node.states()).is_empty(),
        "{out}"
    );
    assert!(
        node.api_events_of("apply-rendered", "").is_empty(),
        "the pass touched a static pod\n{out}"
    );
    case.healthy_end(Pki::Old, &out);
}
