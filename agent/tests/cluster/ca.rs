//! CA rotation across three stacked control planes (issue 29): real etcd members, kube-apiservers,
//! controller-managers and schedulers v1.20.2 run by kubelet-sim, `certrotor ca` run on the
//! three nodes at once, round after round, as an operator would.

use std::collections::BTreeSet;
use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::util::openssl_verify;

mod external;

impl Stacked3 {
    /// etcd `/health` and kube-apiserver `/readyz` of every node, each probed with that node's
    /// own CA file and client pair as they are on disk now (a CA rotation changes them).
    fn sample_own(&self) -> Sample {
        let own = |i: usize, (ca, cert, key): (&str, &str, &str)| {
            let pki = self.nodes[i].root.join("etc/kubernetes/pki");
            let read = |f: &str| fs::read(pki.join(f)).unwrap_or_default();
            (read(ca), (read(cert), read(key)))
        };
        self.sample_with(
            |i| {
                let files = (
                    "etcd/ca.crt",
                    "etcd/healthcheck-client.crt",
                    "etcd/healthcheck-client.key",
                );
                own(i, files)
            },
            |i| {
                let files = (
                    "ca.crt",
                    "apiserver-kubelet-client.crt",
                    "apiserver-kubelet-client.key",
                );
                own(i, files)
            },
        )
    }

    fn pki(&self, i: usize, file: &str) -> Vec<u8> {
        fs::read(self.nodes[i].root.join("etc/kubernetes/pki").join(file)).unwrap()
    }
}

/// A cluster whose nodes `certrotor ca` runs on: the roots, where the logs go, and a sample
/// of its members and apiservers taken with each node's own files as they are now.
trait Rotating: Send + Sync + 'static {
    fn root(&self, i: usize) -> &Path;
    fn dir(&self) -> &Path;
    fn sample_own(&self) -> Sample;
}

impl Rotating for Stacked3 {
    fn root(&self, i: usize) -> &Path {
        &self.nodes[i].root
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
    fn sample_own(&self) -> Sample {
        Stacked3::sample_own(self)
    }
}

/// [`Rotating::sample_own`] every 100 ms until the sampler is finished.
fn sample_own_every_100ms<C: Rotating>(c: &Arc<C>) -> Sampler {
    let c = c.clone();
    Sampler::start(move || c.sample_own())
}

/// Each node's exit code, report and output.
type Runs = Vec<(Option<i32>, Value, String)>;

/// `certrotor ca SUB --ca CA` on the nodes `which` at once (cluster mode), sampled every 100 ms:
/// each node's run (in the order of `which`), the samples, and how long the round took.
fn ca_round<C: Rotating>(
    c: &Arc<C>,
    (sub, ca): (&str, &str),
    (which, killed): (&[usize], Option<usize>),
    tag: &str,
) -> (Runs, Vec<Sample>, Duration) {
    let sampler = sample_own_every_100ms(c);
    let started = Instant::now();
    let mut runs: Vec<Background> = which
        .iter()
        .map(|&i| {
            let run = certrotor(&["ca", sub, "--ca", ca, "--root", s(c.root(i))])
                .args(&PASS_FLAGS)
                .args(&["--output", "json"]);
            // Killed (SIGKILL) right after its first transaction, before its restarts.
            let run = if killed == Some(i) {
                run.env("CERTROTOR_FAILPOINT", "journal-removed")
            } else {
                run
            };
            run.spawn(c.dir(), &format!("ca-{tag}-node-{i}"))
        })
        .collect();
    let deadline = Instant::now() + PASSES_DEADLINE.saturating_mul(2);
    while runs.iter_mut().any(|p| p.running()) {
        assert!(Instant::now() < deadline, "ca {sub} hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = started.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let out = runs
        .iter_mut()
        .map(|p| {
            let (code, f) = finished(p);
            let v = serde_json::from_str(&f.stdout).unwrap_or(Value::Null);
            (code, v, f.text)
        })
        .collect();
    (out, sampler.finish(), took)
}

/// One round on the nodes `which`: every run exits 0 at one of the stages `want`; returns each
/// node's stage.
fn round_to<C: Rotating>(
    c: &Arc<C>,
    sub_ca: (&str, &str),
    which: &[usize],
    want: &[&str],
    log: &mut Rounds,
) -> Vec<String> {
    round_killing(c, sub_ca, (which, None), want, log)
}

/// [`round_to`], the node `killed` killed after its first transaction (its stage: `killed`).
fn round_killing<C: Rotating>(
    c: &Arc<C>,
    (sub, ca): (&str, &str),
    (which, killed): (&[usize], Option<usize>),
    want: &[&str],
    log: &mut Rounds,
) -> Vec<String> {
    let tag = format!("{ca}-{}", log.took.len());
    let (out, samples, took) = ca_round(c, (sub, ca), (which, killed), &tag);
    let mut stages = Vec::new();
    for ((code, r, text), i) in out.iter().zip(which) {
        if killed == Some(*i) {
            assert_eq!(*code, None, "node {i} not killed\n{text}");
            assert!(
                text.contains("CERTROTOR-FAILPOINT journal-removed"),
                "{text}"
            );
            stages.push("killed".to_string());
            continue;
        }
        assert_eq!(*code, Some(0), "ca {sub} --ca {ca}, node {i}\n{text}");
        let stage = r["stage"].as_str().unwrap_or_default().to_string();
        assert!(
            want.contains(&stage.as_str()),
            "ca {sub} --ca {ca}, node {i}: {stage}\n{text}"
        );
        if matches!(stage.as_str(), "trusted" | "abort") {
            let next = r["next"].as_str().unwrap_or_default();
            assert!(
                next.contains("waiting for") || next.contains("once"),
                "{text}"
            );
        }
        stages.push(stage);
    }
    log.took.push((format!("{ca} {sub}"), took));
    log.samples.extend(samples);
    stages
}

#[derive(Default)]
struct Rounds {
    took: Vec<(String, Duration)>,
    samples: Vec<Sample>,
}

impl Rounds {
    /// What each round took, for the figures.
    fn took_ms(&self) -> Vec<String> {
        let took = self.took.iter();
        took.map(|(what, d)| format!("{what} {}", d.as_millis()))
            .collect()
    }
}

/// What the samples and the writer saw, for the figures.
fn disruption(log: &Rounds, writes: &WriterLog) -> String {
    let samples = &log.samples;
    let no_api = longest(samples, |x| x.api.iter().all(|u| !*u));
    let member_down = longest(samples, |x| x.etcd_up.iter().any(|u| !*u));
    format!(
        "longest window with a member down {} ms, with no apiserver ready {} ms; {} samples \
         every 100 ms; writer: {} writes and reads, {} served by no apiserver, {} served only \
         at the retry 500 ms later (an etcd leader change: HTTP 500 from every apiserver), {} \
         requests failed over to another apiserver",
        member_down.as_millis(),
        no_api.as_millis(),
        samples.len(),
        writes.ticks,
        writes.failed.len(),
        writes.retried.len(),
        writes.failovers
    )
}

/// The data written before the rotation is read back (`get`); the writer found an apiserver to
/// serve every tick, at most one tick an etcd restart at its retry; in every sample no two members were down and an apiserver was ready; no two
/// nodes' etcd (`states`, since `since`) were down at once.
fn served_throughout(
    get: &Output,
    writes: &WriterLog,
    log: &Rounds,
    states: &[BTreeMap<String, PodState>],
    since: u128,
) {
    assert!(
        get.status.success() && get.stdout.trim() == "before-ca-rotation",
        "{get}"
    );
    assert!(writes.ticks > 100, "{writes:?}");
    assert!(
        writes.failed.is_empty(),
        "{} of {} writes served by no apiserver: {:?}",
        writes.failed.len(),
        writes.ticks,
        writes.failed
    );
    // A write in flight when the etcd leader hands over (etcd does it as it stops) fails with
    // "etcdserver: leader changed" through every apiserver at once; a client tries again. Only
    // there: at most one such tick per etcd restart, each begun within 10 s before a member's
    // stop (SIGTERM, the handover, then the exit kubelet-sim records) or 2 s after it, and
    // served at the retry.
    let stops: Vec<u64> = states
        .iter()
        .flat_map(|s| down_windows(s, "etcd", since))
        .map(|(stopped, _)| stopped)
        .collect();
    assert!(
        writes.retried.len() <= stops.len(),
        "{} ticks served only at the retry, for {} etcd restarts: {:?}",
        writes.retried.len(),
        stops.len(),
        writes.retried
    );
    for (at, answers) in &writes.retried {
        assert!(
            stops
                .iter()
                .any(|&s| *at + 10_000 >= u128::from(s) && *at <= u128::from(s) + 2_000),
            "a tick at {at} ms failed on every apiserver away from any etcd stop {stops:?}: \
             {answers}"
        );
    }
    let samples = &log.samples;
    assert!(samples.len() > 50, "only {} samples", samples.len());
    for x in samples {
        assert!(
            x.etcd_up.iter().filter(|u| !**u).count() <= 1,
            "two members down: {x:?}"
        );
        assert!(x.api.iter().any(|u| *u), "no apiserver ready: {x:?}");
    }
    for (i, s) in states.iter().enumerate() {
        for (j, other) in states.iter().enumerate().skip(i + 1) {
            for a in down_windows(s, "etcd", since) {
                for b in down_windows(other, "etcd", since) {
                    assert!(!overlap(a, b), "etcd of nodes {i} and {j} down together");
                }
            }
        }
    }
}

/// The nodes of `which` whose stage is `stage`.
fn at(which: &[usize], stages: &[String], stage: &str) -> Vec<usize> {
    which
        .iter()
        .zip(stages)
        .filter(|(_, s)| *s == stage)
        .map(|(i, _)| *i)
        .collect()
}

/// A client that writes a counter into a ConfigMap and reads it back every 100 ms through the
/// first of the three apiservers that serves both, beginning with the one that served last
/// (a client behind a load balancer that takes an apiserver out when it fails).
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<WriterLog>>,
}

#[derive(Debug, Default)]
struct WriterLog {
    ticks: u64,
    /// Ticks no apiserver served, even at the retry: what each apiserver answered.
    failed: Vec<String>,
    /// Ticks every apiserver failed, then one served at the retry 500 ms later: when the tick
    /// began (ms since the epoch) and the answers.
    retried: Vec<(u128, String)>,
    /// Requests an apiserver failed, served by the next.
    failovers: u64,
}

const WRITER_PATH: &str = "/api/v1/namespaces/default/configmaps/certrotor-writer";

impl Writer {
    fn start(c: &Stacked3) -> Writer {
        let roots: Vec<&Path> = c.nodes.iter().map(|n| n.root.as_path()).collect();
        Writer::start_on(&roots)
    }

    /// On the control planes at `roots`.
    fn start_on(roots: &[&Path]) -> Writer {
        let admin = roots[0].join("etc/kubernetes/admin.conf");
        let made = Cmd::new(testkit::k8s::kubectl_path())
            .args(&[
                "--kubeconfig",
                s(&admin),
                "create",
                "configmap",
                "certrotor-writer",
                "--namespace=default",
                "--from-literal=n=0",
            ])
            .run();
        assert!(made.status.success(), "{made}");
        let nodes: Vec<certrotor::node::Node> = roots
            .iter()
            .map(|r| certrotor::node::Node::discover(r))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || write_every_100ms(&nodes, &stop))
        };
        Writer {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> WriterLog {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

fn write_every_100ms(nodes: &[certrotor::node::Node], stop: &AtomicBool) -> WriterLog {
    let mut log = WriterLog::default();
    let mut first = 0;
    while !stop.load(Ordering::SeqCst) {
        let next = Instant::now() + Duration::from_millis(100);
        log.ticks += 1;
        let n = log.ticks.to_string();
        let began = now_ms();
        let answers = write_through_any(nodes, &mut first, &n, &mut log.failovers);
        if !answers.is_empty() {
            // Every apiserver failed: once more, as a client does, after a pause.
            std::thread::sleep(Duration::from_millis(500));
            let again = write_through_any(nodes, &mut first, &n, &mut log.failovers);
            if again.is_empty() {
                log.retried.push((began, answers.join("; ")));
            } else {
                log.failed.push(format!(
                    "{}; at the retry: {}",
                    answers.join("; "),
                    again.join("; ")
                ));
            }
        }
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    log
}

/// Writes `n` and reads it back through the first apiserver that serves both, beginning with
/// `first` (then the one that served); what each failed one answered, empty when one served.
fn write_through_any(
    nodes: &[certrotor::node::Node],
    first: &mut usize,
    n: &str,
    failovers: &mut u64,
) -> Vec<String> {
    use certrotor::pass::events;
    let mut answers = Vec::new();
    for k in 0..nodes.len() {
        let i = (*first + k) % nodes.len();
        let node = &nodes[i];
        let admin = "etc/kubernetes/admin.conf";
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "certrotor-writer", "namespace": "default"},
            "data": {"n": n},
        });
        let served = events::put(node, admin, WRITER_PATH, &body).and_then(|written| {
            let back = events::get(node, admin, WRITER_PATH)?;
            if written && back["data"]["n"] == n {
                Ok(())
            } else {
                Err(format!("read back {}", back["data"]["n"]))
            }
        });
        match served {
            Ok(()) => {
                *first = i;
                return vec![];
            }
            Err(e) => {
                *failovers += 1;
                answers.push(format!("node {i}: {e}"));
            }
        }
    }
    answers
}

/// The certificates kube-apiserver publishes for aggregated API servers (the front-proxy
/// trust), as SHA-256 of their DER.
fn published_front_proxy(c: &Stacked3) -> BTreeSet<String> {
    let node = certrotor::node::Node::discover(&c.nodes[0].root);
    let cm = certrotor::pass::events::get(
        &node,
        "etc/kubernetes/admin.conf",
        "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
    )
    .unwrap();
    let pem = cm["data"]["requestheader-client-ca-file"]
        .as_str()
        .unwrap_or_default();
    certs_of(pem.as_bytes())
}

fn certs_of(pem: &[u8]) -> BTreeSet<String> {
    certrotor::pki::Cert::all_from_pem(pem, certrotor::pki::MAX_BUNDLE_CERTS)
        .unwrap()
        .iter()
        .map(|c| c.sha256_hex())
        .collect()
}

/// The etcd CA rotated, aborted first: `ca rotate` everywhere, then `ca abort` everywhere
/// (the node that issued issues again from the old CA; none drops the new CA before every node
/// has); then the rotation to its end. Every member serves a certificate of the new CA alone.
fn etcd_ca_aborted_then_rotated(c: &Arc<Stacked3>, log: &mut Rounds) {
    let all = [0, 1, 2];
    let ca = "etcd-ca";
    let (old, old_key) = (c.pki(0, "etcd/ca.crt"), c.pki(0, "etcd/ca.key"));
    // Abort across the nodes: after the first round one node issued, the others wait for it.
    let stages = round_to(c, ("rotate", ca), &all, &["trusted", "issued"], log);
    assert_eq!(at(&all, &stages, "issued").len(), 1, "{stages:?}");
    let aborted_ca: BTreeSet<String> = certs_of(&c.pki(0, "etcd/ca.crt"))
        .difference(&certs_of(&old))
        .cloned()
        .collect();
    assert_eq!(aborted_ca.len(), 1);
    let stages = round_to(c, ("abort", ca), &all, &["abort", "aborted"], log);
    let waiting = at(&all, &stages, "abort");
    if !waiting.is_empty() {
        round_to(c, ("abort", ca), &waiting, &["aborted"], log);
    }
    for i in all {
        assert_eq!(
            c.pki(i, "etcd/ca.key"),
            old_key,
            "node {i}: CA key after abort"
        );
    }
    serves_with(c, &old, None);
    // The rotation again, to its end: one new CA for all, never the aborted one. Node 2 is
    // killed in the middle of its trust-in (its files written, its restarts not made): the
    // others stop after theirs and wait for it. The daemons take it on: node 2's makes the
    // restarts it owes and resumes its trust-in, and every node goes on to the issue once all
    // are trusted.
    let stages = round_killing(c, ("rotate", ca), (&all, Some(2)), &["trusted"], log);
    assert_eq!(stages, ["trusted", "trusted", "killed"]);
    // `status` shows every member's stage as etcd holds it: node 2 recorded none.
    let status = certrotor(&["status", "--root", s(&c.nodes[0].root), "--output", "json"]).run();
    assert_eq!(status.code(), Some(0), "{status}");
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    let members: Vec<(String, Value)> = v["ca_rotation_members"]
        .as_array()
        .unwrap_or_else(|| panic!("no member stages: {v:#}"))
        .iter()
        .map(|m| {
            (
                m["member"].as_str().unwrap().to_string(),
                m["stage"].clone(),
            )
        })
        .collect();
    assert_eq!(
        members.iter().cloned().collect::<BTreeMap<_, _>>(),
        BTreeMap::from([
            ("cp-0".to_string(), json!("trusted")),
            ("cp-1".to_string(), json!("trusted")),
            ("cp-2".to_string(), Value::Null),
        ]),
        "{v:#}"
    );
    daemons_advance(c, &all, "issued", log);
    round_to(c, ("continue", ca), &all, &["done"], log);
    let new = c.pki(0, "etcd/ca.crt");
    assert_ne!(new, old, "the CA was not rotated");
    assert_eq!(certs_of(&new).len(), 1);
    assert!(
        certs_of(&new).is_disjoint(&aborted_ca),
        "the aborted CA came back"
    );
    serves_with(c, &new, Some(&old));
}

/// Every node's etcd CA file is `ca`, and its member serves a certificate that `ca` verifies
/// (and `not` does not).
fn serves_with(c: &Stacked3, ca: &[u8], not: Option<&[u8]>) {
    for i in 0..c.nodes.len() {
        assert_eq!(c.pki(i, "etcd/ca.crt"), ca, "node {i}: etcd CA file");
        let pair = (
            c.pki(i, "etcd/healthcheck-client.crt"),
            c.pki(i, "etcd/healthcheck-client.key"),
        );
        let port = 2379 + c.nodes[i].offset;
        assert_eq!(
            probe_state(port, "/health", ca, &pair),
            (true, true),
            "node {i}"
        );
        if let Some(not) = not {
            assert!(
                !probe_state(port, "/health", not, &pair).0,
                "node {i}: old CA"
            );
        }
    }
}

/// `certrotor daemon` on the nodes `which` until each one's rotation reaches `stage` (read from
/// its `ca-rotation.json`); the daemons are stopped then.
fn daemons_advance(c: &Arc<Stacked3>, which: &[usize], stage: &str, log: &mut Rounds) {
    let sampler = sample_own_every_100ms(c);
    let started = Instant::now();
    let mut daemons: Vec<Background> = which
        .iter()
        .map(|&i| {
            certrotor(&["daemon", "--interval", "1h", "--root", s(&c.nodes[i].root)])
                .args(&PASS_FLAGS)
                .spawn(&c.dir, &format!("daemon-{}-node-{i}", log.took.len()))
        })
        .collect();
    let stage_of = |i: usize| -> String {
        let f = c.nodes[i].root.join("var/lib/certrotor/ca-rotation.json");
        let v: Value = serde_json::from_slice(&fs::read(f).unwrap()).unwrap();
        v["stage"].as_str().unwrap_or_default().to_string()
    };
    // The stage in the node's file, and in its daemon's log (written after the file).
    let logged = format!("CA rotation of etcd-ca: stage {stage}");
    wait_for(
        &format!("the daemons of nodes {which:?} take their rotation to {stage}"),
        PASSES_DEADLINE.saturating_mul(2),
        || {
            which
                .iter()
                .zip(&daemons)
                .all(|(&i, d)| stage_of(i) == stage && d.stderr_text().contains(&logged))
                .then_some(())
        },
    );
    for (d, i) in daemons.iter_mut().zip(which) {
        assert!(d.running(), "daemon of node {i} ended\n{}", d.describe());
        d.kill();
    }
    log.took.push(("daemons".into(), started.elapsed()));
    log.samples.extend(sampler.finish());
}

/// The front-proxy CA rotated: no restart (kube-apiserver reloads both files); the bundle the
/// apiservers publish holds [old, new] after trust-in and the new CA alone after the last
/// node's trust-out (they publish a union: only the last node may remove the old CA).
fn front_proxy_ca_rotated(c: &Arc<Stacked3>, log: &mut Rounds) {
    let all = [0, 1, 2];
    let ca = "front-proxy-ca";
    let old = c.pki(0, "front-proxy-ca.crt");
    let stages = round_to(c, ("rotate", ca), &all, &["trusted", "issued"], log);
    let both = certs_of(&c.pki(0, "front-proxy-ca.crt"));
    assert_eq!(both.len(), 2);
    assert_eq!(published_front_proxy(c), both, "published after trust-in");
    let trusted = at(&all, &stages, "trusted");
    if !trusted.is_empty() {
        round_to(c, ("rotate", ca), &trusted, &["issued"], log);
    }
    round_to(c, ("continue", ca), &all, &["done"], log);
    let new = c.pki(0, "front-proxy-ca.crt");
    for i in all {
        assert_eq!(c.pki(i, "front-proxy-ca.crt"), new, "node {i}");
        let dir = c.nodes[i].root.join("etc/kubernetes/pki");
        openssl_verify(
            &dir.join("front-proxy-ca.crt"),
            &dir.join("front-proxy-client.crt"),
            true,
        )
        .unwrap();
    }
    assert_ne!(new, old);
    assert_eq!(
        published_front_proxy(c),
        certs_of(&new),
        "published after trust-out"
    );
    // And it stays so: no apiserver publishes the old CA again.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        published_front_proxy(c),
        certs_of(&new),
        "published again later"
    );
}

/// The cluster CA rotated: kube-controller-manager signs from a file of its own meanwhile; no
/// kube-apiserver or etcd restarts; after trust-out every node holds the one new CA alone,
/// every kubeconfig embeds it, and every apiserver serves a certificate of it, not of the old.
fn cluster_ca_rotated(c: &Arc<Stacked3>, log: &mut Rounds) {
    let all = [0, 1, 2];
    let ca = "ca";
    let old = c.pki(0, "ca.crt");
    let stages = round_to(c, ("rotate", ca), &all, &["trusted", "issued"], log);
    let trusted = at(&all, &stages, "trusted");
    if !trusted.is_empty() {
        round_to(c, ("rotate", ca), &trusted, &["issued"], log);
    }
    for i in all {
        let signer = c.pki(i, "ca.signer.crt");
        assert_eq!(certs_of(&signer).len(), 1, "node {i}");
        assert!(certs_of(&c.pki(i, "ca.crt")).is_superset(&certs_of(&signer)));
    }
    round_to(c, ("continue", ca), &all, &["done"], log);
    let new = c.pki(0, "ca.crt");
    assert_ne!(new, old);
    assert_eq!(certs_of(&new).len(), 1);
    for i in all {
        assert_eq!(c.pki(i, "ca.crt"), new, "node {i}");
        let root = &c.nodes[i].root;
        assert!(!root.join("etc/kubernetes/pki/ca.signer.crt").exists());
        for conf in ["admin.conf", "controller-manager.conf", "scheduler.conf"] {
            let text = fs::read_to_string(root.join("etc/kubernetes").join(conf)).unwrap();
            let data = crate::util::kubeconfig_value(&text, "certificate-authority-data").unwrap();
            assert_eq!(
                certs_of(&crate::util::base64_decode(&data)),
                certs_of(&new),
                "node {i} {conf}"
            );
        }
        let pair = (
            c.pki(i, "apiserver-kubelet-client.crt"),
            c.pki(i, "apiserver-kubelet-client.key"),
        );
        let port = 6443 + c.nodes[i].offset;
        assert_eq!(
            probe_state(port, "/readyz", &new, &pair),
            (true, true),
            "node {i}"
        );
        assert!(
            !probe_state(port, "/readyz", &old, &pair).0,
            "node {i}: old CA"
        );
    }
}

#[test]
fn three_stacked_nodes_rotate_the_etcd_front_proxy_and_cluster_cas_in_turns_without_a_failed_request()
 {
    etcd_installed("three_stacked_nodes_rotate_the_etcd_front_proxy_and_cluster_cas");
    let t = TempDir::new("cluster-ca-rotate");
    let c = Arc::new(Stacked3::start_expiring(&t, "300d", true));
    let put = c.etcdctl(&["put", "certrotor-test/kept", "before-ca-rotation"]);
    assert!(put.status.success(), "{put}");
    let writer = Writer::start(&c);
    let since = now_ms();
    let mut log = Rounds::default();
    etcd_ca_aborted_then_rotated(&c, &mut log);
    let etcd_restarts: Vec<(usize, usize)> = c
        .nodes
        .iter()
        .map(|n| {
            let s = n.states();
            (
                down_windows(&s, "etcd", since).len(),
                down_windows(&s, "kube-apiserver", since).len(),
            )
        })
        .collect();
    let fp_since = now_ms();
    front_proxy_ca_rotated(&c, &mut log);
    cluster_ca_rotated(&c, &mut log);
    let writes = writer.finish();
    // The front-proxy and cluster CAs restart no kube-apiserver and no etcd.
    let mut kcm_restarts = vec![];
    for (i, n) in c.nodes.iter().enumerate() {
        let s = n.states();
        for pod in ["kube-apiserver", "etcd"] {
            assert!(
                down_windows(&s, pod, fp_since).is_empty(),
                "node {i}: {pod} restarted for the front-proxy or cluster CA"
            );
        }
        kcm_restarts.push(down_windows(&s, "kube-controller-manager", fp_since).len());
    }
    // The data written before is read back; the writer never found no apiserver to serve it.
    let get = {
        let pki = c.nodes[0].root.join("etc/kubernetes/pki");
        let pair = |f: &str| pki.join(f);
        c.etcdctl_with(
            (
                pair("etcd/ca.crt"),
                pair("etcd/healthcheck-client.crt"),
                pair("etcd/healthcheck-client.key"),
            ),
            &["get", "certrotor-test/kept", "--print-value-only"],
        )
    };
    let states: Vec<_> = c.nodes.iter().map(|n| n.states()).collect();
    served_throughout(&get, &writes, &log, &states, since);
    eprintln!(
        "FIGURES ca rotation, three stacked nodes (real etcd, kube-apiserver v1.20.2): rounds {:?} \
         ms; restarts per node for the etcd CA, its abort included (etcd, kube-apiserver) \
         {etcd_restarts:?}, for the front-proxy CA none, for the cluster CA \
         kube-controller-manager {kcm_restarts:?} and no kube-apiserver or etcd; {}",
        log.took_ms(),
        disruption(&log, &writes)
    );
}
