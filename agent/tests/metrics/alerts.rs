//! Alerts and a dashboard operators already know (issue 27.4), proven on the real daemon:
//!
//! - the monitoring files of `bottlerocket/packaging/monitoring/` hold together: the rules file
//!   passes `promtool check rules`, the `PrometheusRule` carries the same groups line for line,
//!   every description names a command, the scrape recipe passes `promtool check config`, the
//!   Service, EndpointSlice and ServiceMonitor name each other;
//! - `promtool test rules` runs certrotor's rules, and enix x509-certificate-exporter's v3.21
//!   and v4 rules (vendored next to this file), on series the real daemon served: lab nodes
//!   healthy and then stopped, with a damaged certificate and kubeconfig (failed passes, read
//!   errors), whose restarts fail and whose rollback fails (restarts owed, certificates not
//!   renewed), and a control plane that really runs whose renewal is refused and rolled back.
//!   Each scrape becomes one sample at its own second; after the last scrape the node is held
//!   as it was (its last page repeated), which is how the `for:` clauses of 5 minutes to an
//!   hour are reached. Every rule of each file is asserted at every evaluation time: the
//!   alerts expected, and none where none is. A healthy daemon is also checked live, at many
//!   seconds of its real run, with every `for:` removed (the expression alone must stay false);
//! - a real Prometheus, configured from the scrape recipe and loading the rules, scrapes the
//!   daemon of that control plane after a pass with real restarts: every query of
//!   `certrotor-dashboard.json` (found by walking the JSON, so a new panel is covered without
//!   editing this test) and every host-file query of enix's v3.21 dashboard returns data.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{PROMETHEUS, get, samples};
use crate::renew_util::{Background, Cmd, SHORT_WAITS, TempDir, bin, wait_for};

type Labels = BTreeMap<String, String>;

/// Steps (seconds of promtool time) the last page is held after the last scrape.
const HOLD: u64 = 100 * 60;
/// The late evaluation: every `for:` (at most 1 h) has run its course on the held state.
const LATE: u64 = 90 * 60;
/// The early evaluation, after an event: within the 15-minute windows of the rate rules.
const EARLY: u64 = 10 * 60;
/// Metrics whose value is a Unix time: shifted so that promtool's time 0 is the capture's base.
const TIMESTAMPS: [&str; 6] = [
    "x509_cert_not_before",
    "x509_cert_not_after",
    "certrotor_last_pass_timestamp_seconds",
    "certrotor_last_success_timestamp_seconds",
    "certrotor_daemon_start_timestamp_seconds",
    "certrotor_certificate_renewal_due_timestamp_seconds",
];

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../bottlerocket/packaging/monitoring")
        .join(file)
}

fn fixture(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/metrics")
        .join(file)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_norway::from_str(&read(path))
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

fn unix_now() -> f64 {
    crate::util::since_epoch().as_secs_f64()
}

/// `promtool ARGS` in `dir`: it must succeed.
#[track_caller]
fn promtool(dir: &Path, args: &[&str]) -> crate::renew_util::Output {
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let out = Cmd::new("sh")
        .args(&[
            "-c",
            &format!("cd '{}' && promtool {}", dir.display(), quoted.join(" ")),
        ])
        .run();
    assert!(out.status.success(), "{out}");
    out
}

// === the rules ===

#[derive(Debug, Clone)]
struct Rule {
    alert: String,
    labels: Labels,
    annotations: Labels,
}

fn strings(v: &Value) -> Labels {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// The alerting rules of a rules file, in order.
fn rules(path: &Path) -> Vec<Rule> {
    let doc = yaml(path);
    let mut out = Vec::new();
    for g in doc["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            out.push(Rule {
                alert: r["alert"].as_str().unwrap().to_string(),
                labels: strings(&r["labels"]),
                annotations: strings(&r["annotations"]),
            });
        }
    }
    out
}

/// The same rules file without any `for:`, written to `dir`: the expressions alone.
fn without_for(path: &Path, dir: &Path) -> PathBuf {
    let mut doc = yaml(path);
    for g in doc["groups"].as_array_mut().unwrap() {
        for r in g["rules"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("for");
        }
    }
    let name = format!(
        "live-{}",
        path.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace(".yml", ".json")
    );
    let out = dir.join(name);
    std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    out
}

/// An annotation template with each `{{ $labels.NAME }}` replaced, as Prometheus expands it;
/// the templates of certrotor's rules use nothing else.
fn expand(template: &str, labels: &Labels) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find("{{ $labels.") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "{{ $labels.".len()..];
        let end = after
            .find(" }}")
            .unwrap_or_else(|| panic!("unclosed template: {template}"));
        let name = &after[..end];
        out.push_str(labels.get(name).map(String::as_str).unwrap_or_default());
        rest = &after[end + " }}".len()..];
    }
    out.push_str(rest);
    assert!(
        !out.contains("{{"),
        "a template other than {{{{ $labels.X }}}} in: {template}"
    );
    out
}

// === the daemon and its scrapes ===

/// A daemon on a node, with its metrics address.
struct Daemon {
    proc: Background,
    addr: String,
}

/// `certrotor daemon --root ROOT ARGS --metrics-address ADDR` with `env`, once it serves.
fn daemon(dir: &Path, name: &str, root: &Path, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    daemon_on(dir, name, root, args, env, "127.0.0.1:0")
}

fn daemon_on(
    dir: &Path,
    name: &str,
    root: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    address: &str,
) -> Daemon {
    let mut all = vec![
        "daemon",
        "--root",
        root.to_str().unwrap(),
        "--metrics-address",
        address,
    ];
    all.extend_from_slice(args);
    let mut cmd = Cmd::new(bin()).args(&all).env("CERTROTOR_EVENTS", "off");
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let mut proc = cmd.spawn(dir, name);
    let addr = super::metrics_address(&mut proc, Duration::from_secs(60));
    Daemon { proc, addr }
}

/// The scrapes of one daemon: (Unix time, page or `None` when the scrape failed).
struct Capture {
    instance: String,
    /// promtool's time 0, in Unix seconds: a minute before the daemon started, so that every
    /// time the daemon reports is positive and `0` ("never") stays below all of them.
    base: f64,
    scrapes: Vec<(f64, Option<String>)>,
}

impl Capture {
    fn new(instance: &str) -> Capture {
        Capture {
            instance: instance.into(),
            base: (unix_now() - 60.0).floor(),
            scrapes: Vec::new(),
        }
    }

    fn step(&self, unix: f64) -> u64 {
        (unix - self.base).round().max(0.0) as u64
    }

    /// Scrapes `addr` once, like Prometheus would: the page, or a failed scrape.
    fn scrape(&mut self, addr: &str) -> Option<String> {
        let t = unix_now();
        let page = match get(addr, "/metrics") {
            Ok((status, body)) if status.contains("200") => Some(body),
            _ => None,
        };
        self.scrapes.push((t, page.clone()));
        page
    }

    /// Scrapes about once a second until `done` holds for a page (then `more` scrapes), failing
    /// after `deadline` or when the daemon ends.
    fn watch(
        &mut self,
        d: &mut Daemon,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut(&str) -> bool,
        more: usize,
    ) {
        let start = Instant::now();
        loop {
            let t = Instant::now();
            assert!(d.proc.running(), "the daemon ended\n{}", d.proc.describe());
            if self.scrape(&d.addr).as_deref().is_some_and(&mut done) {
                break;
            }
            assert!(
                start.elapsed() < deadline,
                "{}: timed out after {deadline:?} waiting for {what}\n{}\n--- last page ---\n{}",
                self.instance,
                d.proc.describe(),
                self.last_page()
            );
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
        self.scrape_for(&d.addr, more);
    }

    /// `n` more scrapes, about one a second (they may fail: a stopped daemon).
    fn scrape_for(&mut self, addr: &str, n: usize) {
        for _ in 0..n {
            std::thread::sleep(Duration::from_secs(1));
            self.scrape(addr);
        }
    }

    fn last_page(&self) -> &str {
        self.scrapes
            .iter()
            .rev()
            .find_map(|(_, p)| p.as_deref())
            .unwrap_or_default()
    }

    fn first_page_step(&self) -> u64 {
        let t = self
            .scrapes
            .iter()
            .find(|(_, p)| p.is_some())
            .map(|(t, _)| *t)
            .unwrap();
        self.step(t)
    }

    fn real_end(&self) -> u64 {
        self.step(self.scrapes.last().unwrap().0)
    }

    /// The labels of a series, with the `job` and `instance` Prometheus adds.
    fn labels(&self, pairs: &[(&str, &str)]) -> Labels {
        let mut l: Labels = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.insert("job".into(), "certrotor".into());
        l.insert("instance".into(), self.instance.clone());
        l
    }

    /// The series of `name` in the last page: (labels with job and instance, value).
    /// The labels of the series `name` of the last page.
    fn last_labels(&self, name: &str) -> Vec<Labels> {
        self.last(name).into_iter().map(|(l, _)| l).collect()
    }

    /// The labels of the series `name` of the last page whose value is `value`.
    fn last_at(&self, name: &str, value: f64) -> Vec<Labels> {
        let at = self.last(name).into_iter().filter(|(_, v)| *v == value);
        at.map(|(l, _)| l).collect()
    }

    fn last(&self, name: &str) -> Vec<(Labels, f64)> {
        samples(self.last_page())
            .into_iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, mut l, v)| {
                l.insert("job".into(), "certrotor".into());
                l.insert("instance".into(), self.instance.clone());
                (l, v)
            })
            .collect()
    }

    fn last_value(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
        let want = self.labels(pairs);
        self.last(name)
            .into_iter()
            .find(|(l, _)| *l == want)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {name}{pairs:?} in\n{}", self.last_page()))
    }

    /// promtool's `input_series`: one sample a second from the base to the last scrape (a
    /// second without a scrape repeats the one before, as Prometheus would read it; a series
    /// that a page lacks, or a failed scrape, goes stale), `up` as Prometheus records it, then
    /// the last state held for [`HOLD`] seconds.
    fn input_series(&self) -> Vec<Value> {
        #[derive(Clone, Copy, PartialEq)]
        enum Tok {
            Missing,
            Stale,
            Val(f64),
        }
        let end = self.real_end();
        // The scrape in force at each step.
        let mut at: BTreeMap<u64, Option<BTreeMap<String, f64>>> = BTreeMap::new();
        let mut keys = BTreeSet::new();
        for (t, page) in &self.scrapes {
            let parsed = page.as_ref().map(|p| {
                samples(p)
                    .into_iter()
                    .map(|(name, mut l, v)| {
                        l.insert("job".into(), "certrotor".into());
                        l.insert("instance".into(), self.instance.clone());
                        let v = if TIMESTAMPS.contains(&name.as_str()) {
                            v - self.base
                        } else {
                            v
                        };
                        (series_text(&name, &l), v)
                    })
                    .collect::<BTreeMap<_, _>>()
            });
            if let Some(p) = &parsed {
                keys.extend(p.keys().cloned());
            }
            at.insert(self.step(*t), parsed);
        }
        let up_key = series_text("up", &self.labels(&[]));
        let state_at = |k: u64| at.range(..=k).next_back().map(|(_, s)| s);
        let mut out = Vec::new();
        for key in keys.iter().chain(std::iter::once(&up_key)) {
            let mut toks = Vec::with_capacity(end as usize + 1);
            let mut prev = Tok::Missing;
            for k in 0..=end {
                let tok = match state_at(k) {
                    None => Tok::Missing,
                    Some(state) if *key == up_key => {
                        Tok::Val(if state.is_some() { 1.0 } else { 0.0 })
                    }
                    Some(Some(page)) if page.contains_key(key) => Tok::Val(page[key]),
                    Some(_) if matches!(prev, Tok::Val(_)) => Tok::Stale,
                    Some(_) => Tok::Missing,
                };
                toks.push(tok);
                prev = tok;
            }
            let last = match prev {
                Tok::Stale => Tok::Missing,
                t => t,
            };
            toks.extend(std::iter::repeat_n(last, HOLD as usize));
            // Runs as promtool's expanding notation.
            let mut text = Vec::new();
            let mut i = 0;
            while i < toks.len() {
                let mut j = i + 1;
                while j < toks.len() && toks[j] == toks[i] && toks[i] != Tok::Stale {
                    j += 1;
                }
                let n = j - i;
                text.push(match toks[i] {
                    Tok::Stale => "stale".to_string(),
                    Tok::Missing if n == 1 => "_".to_string(),
                    Tok::Missing => format!("_x{n}"),
                    Tok::Val(v) if n == 1 => format!("{v}"),
                    Tok::Val(v) => format!("{v}+0x{}", n - 1),
                });
                i = j;
            }
            out.push(json!({"series": key, "values": text.join(" ")}));
        }
        out
    }
}

fn series_text(name: &str, labels: &Labels) -> String {
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{name}{{{}}}", inner.join(","))
}

// === the cases ===

/// The rules files under test, by key.
fn rule_files() -> [(&'static str, PathBuf); 3] {
    [
        ("certrotor", monitoring("certrotor.rules.yml")),
        ("enix-v3", fixture("enix-v3.21-rules.yml")),
        ("enix-v4", fixture("enix-v4-rules.yml")),
    ]
}

/// One capture and what must fire on it: (evaluation step, rules file key, alert) -> the
/// label sets of the alerts firing (job and instance included, the rule's labels not). Every
/// other alert of each file must not fire at those steps. `live`: steps at which no rule of any
/// file, without its `for:`, may fire.
struct Case {
    cap: Capture,
    evals: BTreeSet<u64>,
    firing: BTreeMap<(u64, &'static str, &'static str), Vec<Labels>>,
    live: Vec<u64>,
}

impl Case {
    fn new(cap: Capture) -> Case {
        let late = cap.real_end() + LATE;
        Case {
            cap,
            evals: BTreeSet::from([late]),
            firing: BTreeMap::new(),
            live: Vec::new(),
        }
    }

    fn late(&self) -> u64 {
        self.cap.real_end() + LATE
    }

    fn fires(&mut self, at: u64, file: &'static str, alert: &'static str, labels: Vec<Labels>) {
        assert!(
            !labels.is_empty(),
            "{alert}: an empty expectation says nothing"
        );
        self.evals.insert(at);
        self.firing.insert((at, file, alert), labels);
    }

    fn eval_at(&mut self, at: u64) {
        self.evals.insert(at);
    }

    /// The healthy seconds from `from` to `to`, one in `every`.
    fn live_between(&mut self, from: u64, to: u64, every: u64) {
        self.live.extend((from..to).step_by(every as usize));
    }
}

/// promtool's test files for `cases`: per rules file one with the rules as shipped and one
/// without `for:` (the live checks). Returns (test file, rules file key, number of alert tests).
fn write_tests(dir: &Path, cases: &[Case]) -> Vec<(PathBuf, &'static str, usize)> {
    let mut out = Vec::new();
    for (key, path) in rule_files() {
        let file_rules = rules(&path);
        let live_rules = without_for(&path, dir);
        let mut tests = Vec::new();
        let mut live_tests = Vec::new();
        let mut count = 0;
        for case in cases {
            let input = case.cap.input_series();
            let mut alert_tests = Vec::new();
            for at in &case.evals {
                for rule in &file_rules {
                    let exp: Vec<Value> = case
                        .firing
                        .get(&(*at, key, rule.alert.as_str()))
                        .map(|sets| {
                            sets.iter()
                                .map(|l| {
                                    let mut labels = l.clone();
                                    labels.extend(rule.labels.clone());
                                    let annotations: Labels = rule
                                        .annotations
                                        .iter()
                                        .map(|(k, t)| (k.clone(), expand(t, l)))
                                        .collect();
                                    json!({"exp_labels": labels, "exp_annotations": annotations})
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    alert_tests.push(json!({
                        "eval_time": format!("{at}s"),
                        "alertname": rule.alert,
                        "exp_alerts": exp,
                    }));
                }
            }
            count += alert_tests.len();
            tests.push(
                json!({"interval": "1s", "input_series": input, "alert_rule_test": alert_tests}),
            );
            if !case.live.is_empty() {
                let live: Vec<Value> = case
                    .live
                    .iter()
                    .flat_map(|at| {
                        file_rules.iter().map(move |r| {
                            json!({"eval_time": format!("{at}s"), "alertname": r.alert, "exp_alerts": []})
                        })
                    })
                    .collect();
                count += live.len();
                live_tests.push(
                    json!({"interval": "1s", "input_series": input, "alert_rule_test": live}),
                );
            }
        }
        // The rules as shipped are evaluated every 15 s over the held state (their windows
        // and `for:` are minutes); the live checks at each second they name.
        let write = |name: String, rule_file: &Path, tests: Vec<Value>, every: &str| {
            let file = dir.join(name);
            let doc = json!({
                "rule_files": [rule_file.display().to_string()],
                "evaluation_interval": every,
                "tests": tests,
            });
            std::fs::write(&file, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
            file
        };
        out.push((
            write(format!("test-{key}.json"), &path, tests, "15s"),
            key,
            count,
        ));
        if !live_tests.is_empty() {
            out.push((
                write(
                    format!("test-{key}-live.json"),
                    &live_rules,
                    live_tests,
                    "1s",
                ),
                key,
                0,
            ));
        }
    }
    out
}

/// Runs every test file with `promtool test rules`; each must pass.
fn run_promtool(dir: &Path, files: &[(PathBuf, &'static str, usize)]) {
    for (file, _, _) in files {
        let out = promtool(dir, &["test", "rules", file.to_str().unwrap()]);
        assert!(out.stdout.contains("SUCCESS"), "{out}");
    }
}

/// The rules prove something: the same test with one expected alert left out must fail.
fn promtool_sees_a_missing_alert(dir: &Path, cases: &[Case]) {
    let Some(((at, file, alert), _)) = cases
        .iter()
        .flat_map(|c| c.firing.iter())
        .find(|((_, f, _), _)| *f == "certrotor")
    else {
        panic!("no certrotor alert expected to fire");
    };
    let file_path = dir.join("test-certrotor.json");
    let mut doc: Value = serde_json::from_str(&read(&file_path)).unwrap();
    let mut removed = false;
    for t in doc["tests"].as_array_mut().unwrap() {
        for a in t["alert_rule_test"].as_array_mut().unwrap() {
            if !removed
                && a["eval_time"] == format!("{at}s")
                && a["alertname"] == *alert
                && a["exp_alerts"].as_array().is_some_and(|x| !x.is_empty())
            {
                a["exp_alerts"].as_array_mut().unwrap().pop();
                removed = true;
            }
        }
    }
    assert!(removed, "{file} {alert} at {at}s");
    let wrong = dir.join("wrong.json");
    std::fs::write(&wrong, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let out = Cmd::new("sh")
        .args(&[
            "-c",
            &format!("cd '{}' && promtool test rules wrong.json", dir.display()),
        ])
        .run();
    assert!(
        !out.status.success(),
        "promtool passed a wrong expectation\n{out}"
    );
}

/// A lab node with `args` (ECDSA keys) in `dir`.
fn lab(dir: &TempDir, args: &[&str]) -> PathBuf {
    let ecdsa = ["--key-algorithm", "ecdsa-p256"];
    crate::renew_util::lab(&dir.join("node"), &[&ecdsa[..], args].concat())
}

/// The daemon flags of the lab cases: no platform, a pass every 5 s, a 30-day window.
const LAB_DAEMON: [&str; 8] = [
    "--platform",
    "none",
    "--cluster",
    "off",
    "--interval",
    "5s",
    "--within",
    "30d",
];

/// A lab node due in 200 days (folder `alerts-<name>`, kept by the caller) with a daemon on it
/// (`LAB_DAEMON`), captured as `name` until `passes` passes succeeded (`what`), and `more`
/// scrapes after.
fn healthy_daemon(
    name: &str,
    what: &str,
    passes: u32,
    more: usize,
) -> (TempDir, PathBuf, Capture, Daemon) {
    let dir = TempDir::new(&format!("alerts-{name}"));
    let root = lab(&dir, &["--expires-in", "200d"]);
    let mut cap = Capture::new(name);
    let mut d = daemon(&dir.path, "daemon", &root, &LAB_DAEMON, &[]);
    let page = format!("certrotor_passes_total{{result=\"ok\"}} {passes}\n");
    let deadline = Duration::from_secs(300);
    cap.watch(&mut d, what, deadline, |p| p.contains(&page), more);
    (dir, root, cap, d)
}

/// Healthy, then stopped: nothing fires while it runs (live); 15 minutes after the stop only
/// CertrotorMetricsDown does, and the series are gone.
fn case_healthy_then_stopped() -> Case {
    let (_dir, _root, mut cap, mut d) = healthy_daemon("healthy", "three passes", 3, 20);
    let stopped = cap.real_end();
    d.proc.kill();
    cap.scrape_for(&d.addr, 5);
    assert_eq!(
        cap.last_value("certrotor_last_pass_result", &[("result", "ok")]),
        1.0
    );
    assert_eq!(cap.last_value("x509_read_errors", &[]), 0.0);
    let first = cap.first_page_step();
    let mut case = Case::new(cap);
    case.live_between(first, stopped, 3);
    let late = case.late();
    let down = case.cap.labels(&[]);
    case.eval_at(stopped + EARLY);
    case.fires(late, "certrotor", "CertrotorMetricsDown", vec![down]);
    case
}

/// A certificate and a kubeconfig damaged while the daemon runs: the passes fail (a file it
/// cannot read is never skipped silently), the read errors show in v3's, v4's and certrotor's
/// families, and two intervals later no pass has succeeded.
fn case_read_errors() -> Case {
    let (_dir, root, mut cap, mut d) = healthy_daemon("read-errors", "two passes", 2, 10);
    let healthy_until = cap.real_end();
    std::fs::write(
        root.join("etc/kubernetes/pki/front-proxy-client.crt"),
        "garbage",
    )
    .unwrap();
    std::fs::write(root.join("etc/kubernetes/scheduler.conf"), "garbage").unwrap();
    let damaged = cap.step(unix_now());
    cap.watch(
        &mut d,
        "a failed pass after the damage",
        Duration::from_secs(300),
        |p| {
            p.contains("certrotor_last_pass_result{result=\"failed\"} 1\n")
                && !p.contains("certrotor_passes_total{result=\"failed\"} 0\n")
        },
        30,
    );
    d.proc.kill();
    // What the scenario is: the two files fail, as read errors and failed passes.
    let bad: Vec<Labels> = cap.last_at("x509_cert_error", 1.0);
    let files: BTreeSet<&str> = bad.iter().map(|l| l["filepath"].as_str()).collect();
    assert_eq!(
        files,
        BTreeSet::from([
            "/etc/kubernetes/pki/front-proxy-client.crt",
            "/etc/kubernetes/scheduler.conf"
        ]),
        "{}",
        cap.last_page()
    );
    let source_errors: Vec<Labels> = cap.last_labels("x509_source_errors_total");
    let reasons: BTreeSet<(&str, &str)> = source_errors
        .iter()
        .map(|l| (l["source_name"].as_str(), l["reason"].as_str()))
        .collect();
    assert_eq!(
        reasons,
        BTreeSet::from([
            ("/etc/kubernetes/pki", "bad_pem"),
            ("/etc/kubernetes/scheduler.conf", "decode_failed")
        ]),
        "{}",
        cap.last_page()
    );
    let down: Vec<Labels> = cap.last_at("x509_source_up", 0.0);
    assert_eq!(down.len(), 1, "{}", cap.last_page());
    assert_eq!(down[0]["source_name"], "/etc/kubernetes/scheduler.conf");
    let first = cap.first_page_step();
    let mut case = Case::new(cap);
    case.live_between(first, healthy_until, 2);
    let early = damaged + EARLY;
    let late = case.late();
    let node = case.cap.labels(&[]);
    let failed = case.cap.labels(&[("result", "failed")]);
    for at in [early, late] {
        case.fires(
            at,
            "certrotor",
            "CertrotorNoSuccessfulPass",
            vec![node.clone()],
        );
        case.fires(at, "certrotor", "CertrotorPassFailed", vec![failed.clone()]);
        case.fires(at, "enix-v4", "SourceDown", down.clone());
    }
    // The 15-minute rules: pending at the early evaluation, firing at the late one.
    case.fires(late, "certrotor", "CertrotorReadError", bad.clone());
    case.fires(late, "enix-v3", "CertificateError", bad.clone());
    case.fires(late, "enix-v4", "CertificateError", bad);
    // The rate rules: firing within 15 minutes of the damage, quiet once it is old.
    case.fires(early, "enix-v3", "X509ExporterReadErrors", vec![node]);
    case.fires(early, "enix-v4", "X509ExporterReadErrors", source_errors);
    case
}

/// Platform kubeadm with nothing running: each pass renews, etcd never comes back, the backup
/// is restored, and the restarts after the rollback fail too: the rollback failed, the restarts
/// stay owed, and the certificates (3 days left, 30-day window) are not renewed.
fn case_rollback_failed() -> Case {
    let dir = TempDir::new("alerts-owed");
    let root = lab(
        &dir,
        &[
            "--expires-in",
            "3d",
            "--advertise-address",
            "127.0.0.1",
            "--port-offset",
            "21300",
        ],
    );
    let mut cap = Capture::new("rollback-failed");
    let mut d = daemon(
        &dir.path,
        "daemon",
        &root,
        // LAB_DAEMON with kubeadm restarts instead of none.
        &["--platform", "kubeadm"]
            .into_iter()
            .chain(LAB_DAEMON[2..].iter().copied())
            .chain(SHORT_WAITS)
            .collect::<Vec<_>>(),
        &[],
    );
    cap.watch(
        &mut d,
        "two rolled-back passes and restarts owed",
        Duration::from_secs(600),
        |p| {
            let rolled = samples(p)
                .into_iter()
                .find(|(n, l, _)| {
                    n == "certrotor_passes_total"
                        && l.get("result").map(String::as_str) == Some("rolled_back")
                })
                .map_or(0.0, |s| s.2);
            rolled >= 2.0
                && p.contains("certrotor_last_pass_result{result=\"rolled_back\"} 1\n")
                && p.contains("certrotor_restarts_owed{component=\"etcd\"} 1\n")
        },
        10,
    );
    d.proc.kill();
    assert_eq!(
        cap.last_value("x509_read_errors", &[]),
        0.0,
        "{}",
        cap.last_page()
    );
    let owed: Vec<Labels> = cap.last_at("certrotor_restarts_owed", 1.0);
    assert!(
        owed.iter().any(|l| l["component"] == "kube-apiserver"),
        "{}",
        cap.last_page()
    );
    // Every certificate certrotor renews is overdue: 3 days left in a 30-day window.
    let due = cap.last("certrotor_certificate_renewal_due_timestamp_seconds");
    assert!(due.len() >= 10, "{}", cap.last_page());
    let overdue: Vec<Labels> = due.into_iter().map(|(l, _)| l).collect();
    let last_failed = cap.last_value("certrotor_last_pass_result", &[("result", "failed")]);
    let late_expiring = |case: &Case, days: f64| expiring(&case.cap, case.late(), days);
    let last_rolled_back =
        cap.last_value("certrotor_last_pass_result", &[("result", "rolled_back")]);
    assert_eq!(last_failed + last_rolled_back, 1.0, "{}", cap.last_page());
    let mut case = Case::new(cap);
    let late = case.late();
    let node = case.cap.labels(&[]);
    case.fires(late, "certrotor", "CertrotorNoSuccessfulPass", vec![node]);
    if last_rolled_back == 1.0 {
        case.fires(
            late,
            "certrotor",
            "CertrotorPassRolledBack",
            vec![case.cap.labels(&[("result", "rolled_back")])],
        );
    }
    if last_failed == 1.0 {
        case.fires(
            late,
            "certrotor",
            "CertrotorPassFailed",
            vec![case.cap.labels(&[("result", "failed")])],
        );
    }
    case.fires(late, "certrotor", "CertrotorRestartsOwed", owed);
    case.fires(late, "certrotor", "CertrotorRenewalOverdue", overdue);
    for file in ["enix-v3", "enix-v4"] {
        case.fires(late, file, "CertificateRenewal", late_expiring(&case, 28.0));
        case.fires(
            late,
            file,
            "CertificateExpiration",
            late_expiring(&case, 14.0),
        );
    }
    case
}

/// The `x509_cert_not_after` series of the last page with less than `days` left at promtool
/// time `at`; at least the leaves, never a CA.
fn expiring(cap: &Capture, at: u64, days: f64) -> Vec<Labels> {
    let out: Vec<Labels> = cap
        .last("x509_cert_not_after")
        .into_iter()
        .filter(|(_, v)| v - cap.base - (at as f64) < days * 86400.0)
        .map(|(l, _)| l)
        .collect();
    assert!(out.len() >= 10, "{}", cap.last_page());
    assert!(
        out.iter().all(|l| !l["filepath"].ends_with("/ca.crt")
            && l.get("embedded_kind").map(String::as_str) != Some("cluster")),
        "{out:?}"
    );
    out
}

#[test]
fn metrics_monitoring_files_hold_together() {
    testkit::prereq::require_tools("metrics_monitoring_files", &PROMETHEUS);
    let dir = TempDir::new("monitoring-files");
    // The rules file is valid, and the PrometheusRule holds its groups line for line.
    promtool(
        &dir.path,
        &[
            "check",
            "rules",
            monitoring("certrotor.rules.yml").to_str().unwrap(),
        ],
    );
    let rules_text = read(&monitoring("certrotor.rules.yml"));
    let manifest_text = read(&monitoring("certrotor-prometheusrule.yaml"));
    let groups = &rules_text[rules_text.find("\ngroups:").expect("no groups") + 1..];
    let indented: String = groups
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_string()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    assert!(
        manifest_text.ends_with(&format!("spec:\n{indented}")),
        "certrotor-prometheusrule.yaml's spec.groups is not certrotor.rules.yml's groups \
         indented by two spaces: copy them over"
    );
    let manifest = yaml(&monitoring("certrotor-prometheusrule.yaml"));
    assert_eq!(manifest["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(manifest["kind"], "PrometheusRule");
    assert_eq!(
        manifest["spec"]["groups"],
        yaml(&monitoring("certrotor.rules.yml"))["groups"]
    );
    // Every rule says what it is and what to run.
    let all = rules(&monitoring("certrotor.rules.yml"));
    assert_eq!(
        all.iter().map(|r| r.alert.as_str()).collect::<Vec<_>>(),
        [
            "CertrotorNoSuccessfulPass",
            "CertrotorPassFailed",
            "CertrotorPassRolledBack",
            "CertrotorRestartsOwed",
            "CertrotorRenewalOverdue",
            "CertrotorReadError",
            "CertrotorMetricsDown"
        ]
    );
    for r in &all {
        let description = &r.annotations["description"];
        assert!(!r.annotations["summary"].is_empty(), "{}", r.alert);
        assert!(
            description.contains("`apiclient exec certrotor /usr/bin/certrotor ")
                || description.contains("`apiclient get settings.host-containers.certrotor`"),
            "{}: no command to run in: {description}",
            r.alert
        );
        assert!(["warning", "critical"].contains(&r.labels["severity"].as_str()));
        expand(description, &Labels::new());
    }
    // The scrape recipe is a valid Prometheus configuration, with the job the rules expect.
    let recipe = yaml(&monitoring("prometheus-scrape.yml"));
    assert_eq!(recipe["scrape_configs"][0]["job_name"], "certrotor");
    let config = dir.join("prometheus.json");
    let mut full = recipe.clone();
    full["rule_files"] = json!([monitoring("certrotor.rules.yml").display().to_string()]);
    std::fs::write(&config, serde_json::to_string_pretty(&full).unwrap()).unwrap();
    promtool(&dir.path, &["check", "config", config.to_str().unwrap()]);
    // The Service, its EndpointSlice and the ServiceMonitor name each other.
    let docs: Vec<Value> =
        serde_norway::Deserializer::from_str(&read(&monitoring("service-endpointslice.yaml")))
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
            .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Service", "EndpointSlice", "ServiceMonitor"]);
    let (svc, slice, monitor) = (&docs[0], &docs[1], &docs[2]);
    assert!(
        svc["spec"].get("selector").is_none(),
        "the Service must have no selector"
    );
    assert_eq!(
        slice["metadata"]["labels"]["kubernetes.io/service-name"],
        svc["metadata"]["name"]
    );
    assert_ne!(
        slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(slice["ports"][0]["name"], svc["spec"]["ports"][0]["name"]);
    assert_eq!(
        slice["ports"][0]["port"],
        svc["spec"]["ports"][0]["targetPort"]
    );
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k}"
        );
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        svc["spec"]["ports"][0]["name"]
    );
    // The job label of a ServiceMonitor is the Service's name: what CertrotorMetricsDown reads.
    assert_eq!(svc["metadata"]["name"], "certrotor");
    // Every panel of the dashboard has a query.
    let dash: Value = serde_json::from_str(&read(&monitoring("certrotor-dashboard.json"))).unwrap();
    let queries = dashboard_queries(&dash);
    assert!(queries.len() >= 15, "{queries:?}");
}

/// Every panel's queries, walking rows and nested panels: (panel title, expr). A panel other
/// than a row without a query fails.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            if let Some(nested) = p.get("panels") {
                walk(nested, out);
            }
            if p["type"] == "row" {
                continue;
            }
            let title = p["title"].as_str().unwrap_or_default().to_string();
            let targets = p["targets"].as_array().cloned().unwrap_or_default();
            assert!(!targets.is_empty(), "panel '{title}' has no query");
            for t in targets {
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(
                    !expr.is_empty(),
                    "panel '{title}' has a target without expr"
                );
                out.push((title.clone(), expr.to_string()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

#[test]
fn metrics_alert_rules_fire_on_the_daemons_own_series() {
    testkit::prereq::require_tools("metrics_alert_rules", &PROMETHEUS);
    let dir = TempDir::new("alerts-promtool");
    let cases: Vec<Case> = std::thread::scope(|s| {
        let a = s.spawn(case_healthy_then_stopped);
        let b = s.spawn(case_read_errors);
        let c = s.spawn(case_rollback_failed);
        [a, b, c].into_iter().map(|h| h.join().unwrap()).collect()
    });
    let files = write_tests(&dir.path, &cases);
    run_promtool(&dir.path, &files);
    promtool_sees_a_missing_alert(&dir.path, &cases);
    // Every certrotor rule fired in some case (and stayed quiet in the others).
    for r in rules(&monitoring("certrotor.rules.yml")) {
        let fired = cases.iter().any(|c| {
            c.firing
                .keys()
                .any(|(_, f, a)| *f == "certrotor" && *a == r.alert)
        });
        assert!(fired, "{} never fired", r.alert);
    }
    let asserted: usize = files.iter().map(|(_, _, n)| n).sum();
    eprintln!(
        "FIGURES promtool: {asserted} alert tests in {} files over {} captures",
        files.len(),
        cases.len()
    );
}

/// A control plane that really runs (Debian's etcd, kube-apiserver v1.20.2 and the others under
/// kubelet-sim, restarts through the Bottlerocket API emulator):
/// 1. a daemon whose renewal etcd refuses (the `foreign-ca` failpoint re-signs the apiserver's
///    etcd client with another CA) rolls back: CertrotorPassRolledBack fires, the restored
///    certificates are overdue, and enix's expiry rules fire on them;
/// 2. a daemon without the failpoint renews with real restarts; its series keep every
///    certrotor rule quiet (live), and a real Prometheus, configured from the scrape recipe and
///    loading the rules, gets data for every query of certrotor's dashboard and of enix's.
#[test]
fn metrics_alerts_and_dashboard_on_a_real_control_plane() {
    use crate::platform::platform_util::{Node, Platform, RESTART_TIMEOUT};
    testkit::prereq::require_tools("metrics_dashboard", &PROMETHEUS);
    crate::renew_util::require_failpoints(Path::new(bin()));
    let node = Node::start("metrics-dashboard", Platform::Bottlerocket);
    let dir = TempDir::new("alerts-dashboard");
    let args = [
        "--platform",
        "bottlerocket",
        "--api-socket",
        node.socket.to_str().unwrap(),
        "--cluster",
        "off",
        "--interval",
        "1h",
        "--within",
        "30d",
        "--restart-timeout",
        RESTART_TIMEOUT,
        "--poll-interval",
        "100ms",
    ];

    // 1. Rolled back.
    let mut cap = Capture::new("rolled-back");
    let mut a = daemon(
        &dir.path,
        "daemon-rollback",
        &node.root,
        &args,
        &[("CERTROTOR_FAILPOINT", "foreign-ca:apiserver-etcd-client")],
    );
    cap.watch(
        &mut a,
        "a rolled-back pass",
        Duration::from_secs(900),
        |p| p.contains("certrotor_last_pass_result{result=\"rolled_back\"} 1\n"),
        5,
    );
    a.proc.kill();
    assert!(
        a.proc
            .stderr_text()
            .contains("CERTROTOR-FAILPOINT foreign-ca:apiserver-etcd-client"),
        "the failpoint did not fire\n{}",
        a.proc.describe()
    );
    assert_eq!(cap.last_value("x509_read_errors", &[]), 0.0);
    let owed = cap.last("certrotor_restarts_owed");
    assert!(owed.iter().all(|(_, v)| *v == 0.0), "{}", cap.last_page());
    let restarts = cap.last("certrotor_restarts_total");
    assert!(
        !restarts.is_empty(),
        "no restart counted\n{}",
        cap.last_page()
    );
    let overdue: Vec<Labels> =
        cap.last_labels("certrotor_certificate_renewal_due_timestamp_seconds");
    assert!(overdue.len() >= 10, "{}", cap.last_page());
    let mut rolled = Case::new(cap);
    let late = rolled.late();
    let result = rolled.cap.labels(&[("result", "rolled_back")]);
    rolled.fires(late, "certrotor", "CertrotorPassRolledBack", vec![result]);
    rolled.fires(late, "certrotor", "CertrotorRenewalOverdue", overdue);
    for file in ["enix-v3", "enix-v4"] {
        let renewal = expiring(&rolled.cap, late, 28.0);
        let expiration = expiring(&rolled.cap, late, 14.0);
        rolled.fires(late, file, "CertificateRenewal", renewal);
        rolled.fires(late, file, "CertificateExpiration", expiration);
    }

    // 2. Renewed with real restarts, scraped by a real Prometheus.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let address = format!("127.0.0.1:{port}");
    let mut b = daemon_on(&dir.path, "daemon", &node.root, &args, &[], &address);
    let (mut prom, web) = prometheus(&dir, &b.addr);
    let mut cap = Capture::new("renewed");
    cap.watch(
        &mut b,
        "a pass that renewed",
        Duration::from_secs(900),
        |p| p.contains("certrotor_last_pass_result{result=\"ok\"} 1\n"),
        10,
    );
    assert!(
        cap.last_value("certrotor_renewed_certificates_total", &[]) >= 10.0,
        "{}",
        cap.last_page()
    );
    let ok_from = cap
        .scrapes
        .iter()
        .find(|(_, p)| {
            p.as_deref()
                .is_some_and(|p| p.contains("certrotor_last_pass_result{result=\"ok\"} 1\n"))
        })
        .map(|(t, _)| cap.step(*t))
        .unwrap();
    let end = cap.real_end();
    let mut renewed = Case::new(cap);
    renewed.live_between(ok_from, end, 1);
    // The live checks cover certrotor's rules; enix's expiry rules rightly fire on the
    // kubelet's own certificates, which certrotor leaves to the kubelet.
    let dir2 = TempDir::new("alerts-dashboard-promtool");
    let files = write_tests(&dir2.path, &[rolled]);
    run_promtool(&dir2.path, &files);
    let live = write_tests(&dir2.path, &[renewed]);
    run_promtool(
        &dir2.path,
        &live
            .into_iter()
            .filter(|(_, k, _)| *k == "certrotor")
            .collect::<Vec<_>>(),
    );

    // The dashboards, on the real Prometheus.
    let instance = b.addr.clone();
    let query = |q: &str| -> Result<Vec<Value>, String> {
        let (status, body) = get(&web, &format!("/api/v1/query?query={}", urlencode(q)))?;
        if !status.contains("200") {
            return Err(format!("{status} {body}"));
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    };
    wait_for(
        "Prometheus to hold the renewing pass and its restarts",
        Duration::from_secs(120),
        || {
            assert!(prom.running(), "{}", prom.describe());
            let ok = query("certrotor_passes_total{result=\"ok\"} >= 1").ok()?;
            let restarts = query("certrotor_restarts_total").ok()?;
            let rate = query("rate(x509_read_errors[1m])").ok()?;
            (!ok.is_empty() && !restarts.is_empty() && !rate.is_empty()).then_some(())
        },
    );
    let dash: Value = serde_json::from_str(&read(&monitoring("certrotor-dashboard.json"))).unwrap();
    let vars: BTreeMap<String, String> = [
        ("$instance", instance.as_str()),
        ("$__rate_interval", "1m"),
        ("$__range", "1h"),
        ("$__interval", "15s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut empty = Vec::new();
    let ours = dashboard_queries(&dash);
    for (title, expr) in &ours {
        let q = substitute(expr, &vars);
        match query(&q) {
            Ok(r) if !r.is_empty() => {}
            other => empty.push(format!("certrotor '{title}': {q} -> {other:?}")),
        }
    }
    // The instance variable lists the daemon.
    let (_, body) = get(
        &web,
        "/api/v1/label/instance/values?match[]=certrotor_last_pass_timestamp_seconds",
    )
    .unwrap();
    assert!(body.contains(&format!("\"{instance}\"")), "{body}");
    // enix's v3.21 dashboard, and the per-source families v4's guide says to chart.
    let enix = yaml(&fixture("enix-v3.21-dashboard-queries.yml"));
    let enix_vars: BTreeMap<String, String> = enix["variables"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (format!("${k}"), v.as_str().unwrap().to_string()))
        .collect();
    let enix_queries = enix["queries"].as_array().unwrap();
    for q in enix_queries {
        let (title, expr) = (q["panel"].as_str().unwrap(), q["expr"].as_str().unwrap());
        let q = substitute(expr, &enix_vars);
        match query(&q) {
            Ok(r) if !r.is_empty() => {}
            other => empty.push(format!("enix '{title}': {q} -> {other:?}")),
        }
    }
    for q in ["x509_source_up", "x509_source_bundles", "x509_cert_error"] {
        if query(q).map(|r| r.is_empty()).unwrap_or(true) {
            empty.push(format!("enix v4 family {q}"));
        }
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );
    // Prometheus loaded and evaluated certrotor's rules.
    let rules_loaded = wait_for("the rules evaluated", Duration::from_secs(60), || {
        let (_, body) = get(&web, "/api/v1/rules").ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        let rules = v["data"]["groups"][0]["rules"].as_array()?.clone();
        (rules.len() == 7 && rules.iter().all(|r| r["health"] == "ok")).then_some(rules)
    });
    assert_eq!(rules_loaded[0]["name"], "CertrotorNoSuccessfulPass");
    eprintln!(
        "FIGURES dashboard: {} certrotor queries and {} enix queries returned data",
        ours.len(),
        enix_queries.len()
    );
    prom.kill();
    b.proc.kill();
}

/// Prometheus on loopback, configured from the scrape recipe (its target replaced by `target`,
/// scraped every second) and loading certrotor's rules: (process, web address).
fn prometheus(dir: &TempDir, target: &str) -> (Background, String) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let web = format!("127.0.0.1:{port}");
    let mut config = yaml(&monitoring("prometheus-scrape.yml"));
    let job = &mut config["scrape_configs"][0];
    job["scrape_interval"] = json!("1s");
    job["scrape_timeout"] = json!("1s");
    job["static_configs"][0]["targets"] = json!([target]);
    config["global"] = json!({"scrape_interval": "1s", "evaluation_interval": "1s"});
    config["rule_files"] = json!([monitoring("certrotor.rules.yml").display().to_string()]);
    let file = dir.join("prometheus.json");
    std::fs::write(&file, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    promtool(&dir.path, &["check", "config", file.to_str().unwrap()]);
    let prom = Cmd::new("prometheus")
        .args(&[
            format!("--config.file={}", file.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address={web}"),
            "--storage.tsdb.retention.time=1h".to_string(),
        ])
        .spawn(&dir.path, "prometheus");
    (prom, web)
}

/// A Grafana query with its variables replaced; nothing of the form `$name` may remain.
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let mut q = expr.to_string();
    // Longest names first: `$__range` must not eat `$__rate_interval`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        q = q.replace(n.as_str(), &vars[n]);
    }
    assert!(!q.contains('$'), "a variable left in {q}");
    q
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
