//! Metrics (issue 12.1, 12.2, 12.6, 27.4), proven with the real tools of Debian's `prometheus`
//! package: `promtool check metrics` on both outputs, a real Prometheus scraping a running
//! daemon, `promtool test rules` running the exporter-style expiry alert on certrotor's own
//! output before and after `run --once`, and the daemon's memory over many passes; the alert
//! rules and dashboard of `bottlerocket/packaging/monitoring/` in [`alerts`].

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::renew_util::{Background, Cmd, TempDir, bin, certrotor, wait_for};

// Alert rules, the PrometheusRule, the scrape recipe and the dashboard of
// bottlerocket/packaging/monitoring/ on the daemon's own series (issue 27.4).
mod alerts;

const PROMETHEUS: [(&str, &str); 2] = [("promtool", "prometheus"), ("prometheus", "prometheus")];

/// A lab node (ECDSA keys: quick to renew) expiring in `expires`.
fn lab(dir: &TempDir, expires: &str) -> std::path::PathBuf {
    let root = dir.join("node");
    certrotor(&[
        "lab",
        "init",
        root.to_str().unwrap(),
        "--expires-in",
        expires,
        "--key-algorithm",
        "ecdsa-p256",
    ])
    .run()
    .ok();
    root
}

/// `certrotor check --root <root> --output <format>`.
fn check_output(root: &Path, format: &str) -> crate::renew_util::Output {
    certrotor(&crate::util::check_args(root, &["--output", format])).run()
}

/// Pass flags: the node at `root`, nothing restarted, no cluster.
fn alone_on(root: &Path) -> [&str; 6] {
    let r = root.to_str().unwrap();
    ["--root", r, "--platform", "none", "--cluster", "off"]
}

/// `certrotor daemon --metrics-address 127.0.0.1:0` on `root`, and the address it serves.
fn daemon(dir: &TempDir, root: &Path, interval: &str) -> (Background, String) {
    let mut d = Cmd::new(bin())
        .args(&["daemon"])
        .args(&alone_on(root))
        .args(&["--interval", interval, "--metrics-address", "127.0.0.1:0"])
        .spawn(&dir.path, "daemon");
    let addr = metrics_address(&mut d, Duration::from_secs(30));
    (d, addr)
}

/// The address a daemon says it serves its metrics on (waiting up to `deadline`; it must not
/// end meanwhile).
fn metrics_address(d: &mut Background, deadline: Duration) -> String {
    wait_for("the daemon's metrics address", deadline, || {
        assert!(d.running(), "the daemon ended\n{}", d.describe());
        let log = d.stderr_text();
        let at = log.find("metrics served on http://")?;
        let rest = &log[at + "metrics served on http://".len()..];
        Some(rest.split('/').next()?.to_string())
    })
}

/// GET `path` from `addr`: (status line, body). Bounded by timeouts.
fn get(addr: &str, path: &str) -> Result<(String, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(64 << 20)
        .read_to_end(&mut buf)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

/// The page served on `/metrics`.
fn scrape(addr: &str) -> String {
    let (status, body) = get(addr, "/metrics").unwrap();
    assert!(status.contains("200"), "{status}\n{body}");
    body
}

/// `promtool check metrics` on `text`: it must exit 0 and print nothing (no lint finding).
#[track_caller]
fn promtool_clean(what: &str, text: &str) {
    let out = Cmd::new("promtool")
        .args(&["check", "metrics"])
        .stdin(text.as_bytes())
        .run();
    assert!(
        out.status.success() && out.stdout.trim().is_empty() && out.stderr.trim().is_empty(),
        "promtool check metrics on {what}:\n{out}\n--- input ---\n{text}"
    );
}

/// The samples of a text page: (metric name, labels, value).
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        out.push((name.to_string(), labels, value.parse().unwrap()));
    }
    out
}

fn parse_labels(mut s: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    while let Some((k, rest)) = s.split_once("=\"") {
        let mut v = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => v.push('\n'),
                    Some((_, e)) => v.push(e),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => v.push(c),
            }
        }
        m.insert(k.trim_start_matches(',').to_string(), v);
        s = &rest[end..];
    }
    m
}

/// The `x509_cert_not_after` samples of a page, by (filepath, embedded_kind).
fn not_after(text: &str) -> BTreeMap<(String, String), f64> {
    samples(text)
        .into_iter()
        .filter(|(n, _, _)| n == "x509_cert_not_after")
        .map(|(_, l, v)| {
            (
                (
                    l["filepath"].clone(),
                    l.get("embedded_kind").cloned().unwrap_or_default(),
                ),
                v,
            )
        })
        .collect()
}

#[test]
fn metrics_promtool_check_metrics_is_clean_on_check_and_daemon_output() {
    testkit::prereq::require_tools("metrics_promtool_check", &PROMETHEUS);
    let dir = TempDir::new("metrics-lint");
    let root = lab(&dir, "3d");
    // check --output prometheus: exit 1 (expiring within 30d), the exporter's gauges.
    let check = check_output(&root, "prometheus").expect_code(1);
    promtool_clean("check --output prometheus", &check.stdout);
    let json: Value =
        serde_json::from_str(&check_output(&root, "json").expect_code(1).stdout).unwrap();
    // Every certificate of check's JSON has its series, with its notAfter and subject CN.
    let gauges = samples(&check.stdout);
    let mut seen = 0;
    for r in json["certificates"].as_array().unwrap() {
        let Some(na) = r["not_after"].as_str() else {
            continue;
        };
        let path = format!("/{}", r["path"].as_str().unwrap());
        let s = gauges
            .iter()
            .find(|(n, l, _)| {
                n == "x509_cert_not_after"
                    && l["filepath"] == path
                    && l.get("embedded_kind").is_none_or(|k| k == "user")
            })
            .unwrap_or_else(|| panic!("no x509_cert_not_after for {path}\n{}", check.stdout));
        assert_eq!(s.2 as i64, testkit::date::parse_iso(na), "{path}");
        let cn = r["subject"].as_str().unwrap();
        assert!(
            cn.contains(&format!("CN={}", s.1["subject_CN"])),
            "{path}: {cn} {:?}",
            s.1
        );
        assert!(
            !s.1["serial_number"].is_empty()
                && s.1["serial_number"].chars().all(|c| c.is_ascii_digit())
        );
        seen += 1;
    }
    assert!(seen >= 15, "{seen} certificates\n{}", check.stdout);
    // A kubeconfig also gives its cluster CA, labelled as the exporter labels it.
    let admin = gauges.iter().find(|(n, l, _)| {
        n == "x509_cert_not_after"
            && l["filepath"] == "/etc/kubernetes/admin.conf"
            && l.get("embedded_kind").map(String::as_str) == Some("cluster")
    });
    assert_eq!(admin.unwrap().1["embedded_key"], "kubernetes");
    assert!(
        check.stdout.contains("\nx509_read_errors 0\n"),
        "{}",
        check.stdout
    );
    // A damaged certificate is a read error.
    std::fs::write(
        root.join("etc/kubernetes/pki/front-proxy-client.crt"),
        "garbage",
    )
    .unwrap();
    let bad = check_output(&root, "prometheus").expect_code(2);
    promtool_clean("check with a damaged certificate", &bad.stdout);
    assert!(
        bad.stdout.contains("\nx509_read_errors 1\n"),
        "{}",
        bad.stdout
    );

    // The daemon's page: the same gauges plus certrotor's own, after its first pass.
    let dir2 = TempDir::new("metrics-lint-daemon");
    let root2 = lab(&dir2, "3d");
    let (mut d, addr) = daemon(&dir2, &root2, "1h");
    let page = wait_for(
        "a first pass in the counters",
        Duration::from_secs(120),
        || {
            assert!(d.running(), "{}", d.describe());
            let p = scrape(&addr);
            p.contains("certrotor_passes_total{result=\"ok\"} 1")
                .then_some(p)
        },
    );
    promtool_clean("the daemon's /metrics", &page);
    for family in [
        "x509_cert_not_after",
        "x509_cert_not_before",
        "x509_cert_expired",
        "x509_read_errors",
        "certrotor_last_pass_timestamp_seconds",
        "certrotor_last_pass_result",
        "certrotor_renewed_certificates_total",
        "certrotor_rollbacks_total",
        "certrotor_restarts_total",
        "certrotor_live_reloads_total",
        "certrotor_last_restart_unavailable_seconds",
        "certrotor_cluster_lock_wait_seconds_total",
    ] {
        assert!(
            page.contains(&format!("# TYPE {family} ")),
            "{family}\n{page}"
        );
    }
    assert!(
        page.contains("certrotor_last_pass_result{result=\"ok\"} 1"),
        "{page}"
    );
    let renewed = samples(&page)
        .into_iter()
        .find(|(n, _, _)| n == "certrotor_renewed_certificates_total")
        .unwrap()
        .2;
    assert!(renewed >= 10.0, "{page}");
    // The gauges are read fresh: the renewed leaves now expire in a year.
    let now = crate::util::now() as f64;
    let leaf = not_after(&page)[&(
        "/etc/kubernetes/pki/apiserver.crt".to_string(),
        String::new(),
    )];
    assert!(leaf > now + 300.0 * 86400.0, "{page}");
    // Bad requests get an answer and do not stop the server.
    assert!(get(&addr, "/nope").unwrap().0.contains("404"));
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /metr").unwrap(); // a client that never finishes its request
    assert!(scrape(&addr).contains("x509_cert_not_after"));
    drop(slow);
    d.kill();
}

#[test]
fn metrics_real_prometheus_scrapes_a_running_daemon() {
    testkit::prereq::require_tools("metrics_real_prometheus", &PROMETHEUS);
    let dir = TempDir::new("metrics-prom");
    let root = lab(&dir, "200d");
    let (mut d, addr) = daemon(&dir, &root, "1h");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let web = format!("127.0.0.1:{port}");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: certrotor\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let storage = dir.join("tsdb");
    let mut prom = Cmd::new("prometheus")
        .args(&[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", storage.display()),
            format!("--web.listen-address={web}"),
            "--storage.tsdb.retention.time=1h".to_string(),
        ])
        .spawn(&dir.path, "prometheus");
    let query = |q: &str| -> Result<Vec<Value>, String> {
        let (status, body) = get(&web, &format!("/api/v1/query?query={q}"))?;
        if !status.contains("200") {
            return Err(format!("{status} {body}"));
        }
        let v: Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    };
    let series = wait_for(
        "Prometheus to hold the x509 gauges",
        Duration::from_secs(90),
        || {
            assert!(prom.running(), "{}", prom.describe());
            assert!(d.running(), "{}", d.describe());
            query("x509_cert_not_after").ok().filter(|r| r.len() >= 15)
        },
    );
    let files: Vec<&str> = series
        .iter()
        .filter_map(|s| s["metric"]["filepath"].as_str())
        .collect();
    assert!(
        files.contains(&"/etc/kubernetes/pki/apiserver.crt"),
        "{series:?}"
    );
    for s in &series {
        assert_eq!(s["metric"]["job"], "certrotor");
        assert!(s["metric"]["subject_CN"].as_str().is_some(), "{s}");
    }
    let up = query("up").unwrap();
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    // The expiry alert's expression, evaluated by Prometheus on the scraped gauges: the
    // certificates expiring in 200 days are not within 30 days.
    let soon = query("((x509_cert_not_after%20-%20time())%20/%2086400)%20%3C%2030").unwrap();
    assert!(soon.is_empty(), "{soon:?}");
    let expired = query("x509_cert_expired%20%3D%3D%201").unwrap();
    assert!(expired.is_empty(), "{expired:?}");
    assert!(query("x509_read_errors").unwrap()[0]["value"][1] == "0");
    prom.kill();
    d.kill();
}

/// The exporter chart's renewal alert (its CertificateRenewal rule, at 30 days).
const RULES: &str = r#"groups:
  - name: x509-certificate-exporter.rules
    rules:
      - alert: CertificateRenewal
        expr: ((x509_cert_not_after - time()) / 86400) < 30
        for: 15m
        labels:
          severity: warning
        annotations:
          summary: Certificate should be renewed
          description: Certificate for "{{ $labels.subject_CN }}" should be renewed at location "{{ $labels.filepath }}"
"#;

#[test]
fn metrics_promtool_alert_fires_on_a_node_expiring_in_3_days_and_clears_after_run_once() {
    testkit::prereq::require_tools("metrics_promtool_test_rules", &PROMETHEUS);
    let dir = TempDir::new("metrics-rules");
    let root = lab(&dir, "3d");
    let gauges = || -> (String, i64) {
        let now = crate::util::now();
        let out = check_output(&root, "prometheus");
        assert!(matches!(out.code(), Some(0 | 1)), "{out}");
        (out.stdout, now)
    };
    let (before, t0) = gauges();
    certrotor(&["run", "--once"])
        .args(&alone_on(&root))
        .run()
        .ok();
    let (after, t1) = gauges();
    // promtool's clock starts at 0: the node's time at each capture becomes test time 0, so
    // `time()` in the rule reads as the node's clock. Before: samples 0m..30m; after:
    // samples 31m..90m (the old series go stale 5 minutes after their last sample).
    // (before, after) values of each series, by its text.
    let mut by_series: BTreeMap<String, (Option<f64>, Option<f64>)> = BTreeMap::new();
    let mut expected = [Vec::new(), Vec::new()];
    for (i, (page, t)) in [(&before, t0), (&after, t1)].into_iter().enumerate() {
        for line in page
            .lines()
            .filter(|l| l.starts_with("x509_cert_not_after{"))
        {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let shifted = value.parse::<f64>().unwrap() - t as f64;
            let slot = by_series.entry(series.to_string()).or_default();
            if i == 0 {
                slot.0 = Some(shifted);
            } else {
                slot.1 = Some(shifted);
            }
            if shifted < 30.0 * 86400.0 {
                let labels = labels_of(line);
                let mut l: serde_json::Map<String, Value> =
                    labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                l.insert("severity".into(), json!("warning"));
                expected[i].push(json!({
                    "exp_labels": l,
                    "exp_annotations": {
                        "summary": "Certificate should be renewed",
                        "description": format!(
                            "Certificate for \"{}\" should be renewed at location \"{}\"",
                            labels["subject_CN"], labels["filepath"]
                        ),
                    },
                }));
            }
        }
    }
    let input: Vec<Value> = by_series
        .into_iter()
        .map(|(series, (b, a))| {
            let b = b.map_or("_x31".to_string(), |v| format!("{v}+0x30"));
            let a = a.map_or("_x59".to_string(), |v| format!("{v}+0x59"));
            json!({"series": series, "values": format!("{b} {a}")})
        })
        .collect();
    // Every leaf and kubeconfig user of the node expires in 3 days; the CAs do not.
    assert!(expected[0].len() >= 10, "{before}");
    assert!(
        expected[0]
            .iter()
            .all(|e| e["exp_labels"]["filepath"] != "/etc/kubernetes/pki/ca.crt")
    );
    // After the run, only what certrotor does not renew may still alert: the kubelet's
    // self-signed serving certificate, which certrotor removes only once expired (the kubelet
    // writes a new one at its next start), and kubelet.conf where the kubelet rotates its own.
    for e in &expected[1] {
        let path = e["exp_labels"]["filepath"].as_str().unwrap_or_default();
        assert!(
            path == "/var/lib/kubelet/pki/kubelet.crt" || path == "/etc/kubernetes/kubelet.conf",
            "{path} still alerts after the run\n{after}"
        );
    }
    std::fs::write(dir.join("rules.yml"), RULES).unwrap();
    let tests = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input,
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "CertificateRenewal", "exp_alerts": expected[0]},
                {"eval_time": "60m", "alertname": "CertificateRenewal", "exp_alerts": expected[1]},
            ],
        }],
    });
    let out = promtool_test_rules(&dir, "tests.yml", &tests);
    assert!(out.status.success(), "{out}");
    assert!(out.stdout.contains("SUCCESS"), "{out}");
    // And the rule is really evaluated: the same test expecting no alert before the run fails.
    let wrong = json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": tests["tests"][0]["input_series"],
            "alert_rule_test": [{"eval_time": "20m", "alertname": "CertificateRenewal", "exp_alerts": []}],
        }],
    });
    let out = promtool_test_rules(&dir, "wrong.yml", &wrong);
    assert!(!out.status.success(), "{out}");
}

/// Writes `tests` to `name` in `dir` (next to rules.yml) and runs `promtool test rules` on it
/// there.
fn promtool_test_rules(dir: &TempDir, name: &str, tests: &Value) -> crate::renew_util::Output {
    let text = serde_json::to_string_pretty(tests).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    let at = dir.path.display();
    Cmd::new("sh")
        .args(&["-c", &format!("cd '{at}' && promtool test rules {name}")])
        .run()
}

fn labels_of(line: &str) -> BTreeMap<String, String> {
    samples(line).pop().map(|s| s.1).unwrap_or_default()
}

/// The daemon's resident memory must not grow over many passes against the same node, and the
/// endpoint's response time is printed (figures: agent/metrics-bench.sh runs 1000 passes).
#[test]
fn metrics_daemon_memory_does_not_grow_over_passes() {
    let passes: u64 = std::env::var("CERTROTOR_METRICS_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = TempDir::new("metrics-rss");
    let root = lab(&dir, "200d");
    let (mut d, addr) = daemon(&dir, &root, "1ms");
    let count = |page: &str| -> u64 {
        samples(page)
            .iter()
            .filter(|(n, _, _)| n == "certrotor_passes_total")
            .map(|s| s.2 as u64)
            .sum()
    };
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let wait_passes = |n: u64, d: &mut Background| {
        wait_for(&format!("{n} passes"), Duration::from_secs(600), || {
            assert!(d.running(), "{}", d.describe());
            (count(&scrape(&addr)) >= n).then_some(())
        })
    };
    let warm = passes / 5;
    wait_passes(warm, &mut d);
    let rss_warm = rss(d.pid());
    // Response times, while passes run.
    let mut times = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let page = scrape(&addr);
        times.push(t.elapsed());
        assert!(page.contains("x509_cert_not_after"));
    }
    wait_passes(passes, &mut d);
    let rss_end = rss(d.pid());
    times.sort();
    let median = times[times.len() / 2];
    let p99 = times[times.len() * 99 / 100];
    eprintln!(
        "FIGURES metrics endpoint: median {median:?}, p99 {p99:?} over {} requests; daemon RSS \
         {rss_warm} KiB after {warm} passes, {rss_end} KiB after {} passes",
        times.len(),
        count(&scrape(&addr))
    );
    // Allocator noise and thread stacks aside, nothing may accumulate per pass or per request.
    assert!(
        rss_end <= rss_warm + 2048,
        "resident memory grew from {rss_warm} KiB to {rss_end} KiB"
    );
    d.kill();
}

#[test]
fn metrics_address_in_use_or_malformed_is_a_clear_error() {
    let dir = TempDir::new("metrics-addr");
    let root = lab(&dir, "200d");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let root = root.to_str().unwrap();
    let daemon = |a: &str| {
        certrotor(&[
            "daemon",
            "--root",
            root,
            "--platform",
            "none",
            "--cluster",
            "off",
            "--metrics-address",
            a,
        ])
        .run()
    };
    daemon(&addr)
        .expect_code(2)
        .says(&["cannot serve metrics on", &addr, "--metrics-address"]);
    daemon("localhost")
        .expect_code(64)
        .says(&["--metrics-address", "IP:PORT"]);
    certrotor(&["check", "--root", root, "--output", "xml"])
        .run()
        .expect_code(64)
        .says(&["table, json or prometheus"]);
}

/// A CA rotation's stage: `status` shows it, and the daemon's metrics (`promtool` clean).
#[test]
fn metrics_and_status_show_the_ca_rotation_stage() {
    testkit::prereq::require_tools("metrics_ca_rotation", &PROMETHEUS);
    let dir = TempDir::new("metrics-ca");
    let root = lab(&dir, "300d");
    let r = root.to_str().unwrap();
    certrotor(&[
        "ca",
        "rotate",
        "--ca",
        "front-proxy-ca",
        "--root",
        r,
        "--platform",
        "none",
    ])
    .run()
    .ok();
    let status = certrotor(&[
        "status",
        "--root",
        r,
        "--cluster",
        "off",
        "--output",
        "json",
    ])
    .run()
    .ok();
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(v["ca_rotation"]["ca"], "front-proxy-ca", "{status}");
    assert_eq!(v["ca_rotation"]["stage"], "issued", "{status}");
    let table = certrotor(&["status", "--root", r, "--cluster", "off"])
        .run()
        .ok();
    assert!(
        table.stdout.contains("front-proxy-ca at stage issued"),
        "{table}"
    );
    let (mut d, addr) = daemon(&dir, &root, "1h");
    let text = scrape(&addr);
    d.kill();
    promtool_clean("daemon /metrics during a CA rotation", &text);
    let stage = samples(&text)
        .into_iter()
        .find(|(n, _, _)| n == "certrotor_ca_rotation_stage")
        .unwrap_or_else(|| panic!("no certrotor_ca_rotation_stage\n{text}"));
    assert_eq!(stage.1["ca"], "front-proxy-ca");
    assert_eq!(stage.1["stage"], "issued");
    assert_eq!(stage.2, 1.0);
}
