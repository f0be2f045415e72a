//! Shared by the control-plane scenarios: scenario setup (guest script, `node-lib.sh`, the
//! certrotor OCI image), reading what the guest saved (certrotor reports, `check` JSON,
//! kubelet-sim pod states, checksums), and the figures every scenario prints (wall time,
//! control-plane unavailability measured in the VM), also kept in `<work dir>/figures.txt`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use qemu_tests::{Boot, BootOptions, Scenario};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

mod ca_rotation;
mod scenario_a;
#[allow(unused_imports)] // only kubelet_control_plane rotates the cluster CA
pub use ca_rotation::*;
#[allow(unused_imports)] // not every scenario boots scenario a's node
pub use scenario_a::*;

/// The image reference `node-lib.sh` runs (`NODE_IMG`).
pub const IMAGE_REF: &str = "localhost/certrotor:e2e";

/// Leaf certificates of a stacked Bottlerocket lab node that certrotor renews.
pub const STACKED_LEAVES: [&str; 7] = [
    "apiserver",
    "apiserver-kubelet-client",
    "front-proxy-client",
    "apiserver-etcd-client",
    "etcd-server",
    "etcd-peer",
    "etcd-healthcheck-client",
];

/// Kubeconfigs certrotor renews (kubelet.conf is the kubelet's own business).
pub const KUBECONFIGS: [&str; 4] = [
    "admin.conf",
    "super-admin.conf",
    "controller-manager.conf",
    "scheduler.conf",
];

/// Files that must never change: CAs, their keys, the service-account pair.
pub const UNTOUCHABLE: [&str; 10] = [
    "var/lib/kubeadm/pki/ca.crt",
    "var/lib/kubeadm/pki/ca.key",
    "var/lib/kubeadm/pki/front-proxy-ca.crt",
    "var/lib/kubeadm/pki/front-proxy-ca.key",
    "var/lib/kubeadm/pki/etcd/ca.crt",
    "var/lib/kubeadm/pki/etcd/ca.key",
    "var/lib/kubeadm/pki/sa.key",
    "var/lib/kubeadm/pki/sa.pub",
    "var/lib/kubeadm/kubelet.conf",
    "var/lib/kubelet/pki/kubelet-client-current.pem",
];

/// The static pods of a stacked control plane, in certrotor's restart order.
pub const PODS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

const DAY: i64 = 86_400;

/// A fresh scenario running `script`, with `node-lib.sh`, a token and the certrotor image in
/// its share.
pub fn scenario(name: &str, script: &str) -> (Scenario, Instant) {
    let t0 = Instant::now();
    let sc = Scenario::new(name).unwrap();
    sc.set_script(script).unwrap();
    sc.write_share(
        "node-lib.sh",
        include_str!("../../scenarios/node-lib.sh").as_bytes(),
    )
    .unwrap();
    sc.write_share(
        "token",
        format!("token-{}-{name}", std::process::id()).as_bytes(),
    )
    .unwrap();
    sc.add_certrotor_image(IMAGE_REF, "certrotor.oci.tar")
        .unwrap();
    (sc, t0)
}

/// Every guest check (`e2e_check`) passed.
pub fn assert_guest_checks(b: &Boot) {
    let results = b.read_out("results.txt").unwrap();
    assert!(
        results.lines().any(|l| l.starts_with("OK ")) && !results.contains("FAIL"),
        "{}",
        b.failure(&format!("guest checks failed:\n{results}"))
    );
}

/// [`scenario`] for a guest script that runs the Kubernetes v1.20.2 binaries built on the host
/// (`images/k8s/build.sh`): a missing build fails here, before any boot.
pub fn k8s_scenario(name: &str, script: &str) -> (Scenario, Instant) {
    let (sc, t0) = scenario(name, script);
    sc.artifacts().bins.require_k8s().unwrap();
    (sc, t0)
}

/// Boots `sc` with `opts`: the guest script must finish with success and every guest check pass.
pub fn boot_checked(sc: &mut Scenario, opts: &BootOptions) -> Boot {
    let b = sc.boot(opts).unwrap();
    b.expect_success().unwrap();
    assert_guest_checks(&b);
    b
}

/// A JSON file the guest saved.
pub fn json(b: &Boot, name: &str) -> Value {
    let text = b.read_out(name).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "{}",
            b.failure(&format!("{name} is not JSON ({e}):\n{text}"))
        )
    })
}

/// `sha256sum` output saved by `node_pki_sums`: path -> digest.
pub fn sums(b: &Boot, name: &str) -> BTreeMap<String, String> {
    b.read_out(name)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (sum, path) = l.split_once(char::is_whitespace)?;
            Some((path.trim().to_string(), sum.to_string()))
        })
        .collect()
}

/// `node_served` output: (component, served sha, file sha).
pub fn served(b: &Boot, name: &str) -> Vec<(String, String, String)> {
    triples(b, name)
}

/// Lines of three words the guest saved as `name` (a line of another length fails the test).
pub fn triples(b: &Boot, name: &str) -> Vec<(String, String, String)> {
    b.read_out(name)
        .unwrap()
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                w.len(),
                3,
                "{}",
                b.failure(&format!("{name}: bad line {l:?}"))
            );
            (w[0].to_string(), w[1].to_string(), w[2].to_string())
        })
        .collect()
}

/// Every served certificate equals its file (and a certificate was really served).
pub fn assert_served_equals_files(b: &Boot, name: &str) -> Vec<(String, String, String)> {
    let s = served(b, name);
    assert!(
        !s.is_empty(),
        "{}",
        b.failure(&format!("{name}: nothing probed"))
    );
    for (c, got, file) in &s {
        assert!(
            got.len() == 64 && got != EMPTY_SHA,
            "{}",
            b.failure(&format!("{c}: no certificate served ({got})"))
        );
        assert_eq!(
            got,
            file,
            "{}",
            b.failure(&format!("{c} serves another certificate than its file"))
        );
    }
    s
}

/// SHA-256 of no input: what `node_served_sha` prints when nothing was served.
pub const EMPTY_SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A certificate's SHA-256 that the guest saved as `name` (`node_file_sha`): 64 hex digits and
/// not the hash of no input, which the pipe prints when openssl could not read the file (so
/// that comparing two hashes never compares two failures).
pub fn sha_out(b: &Boot, name: &str) -> String {
    let sha = b.read_out(name).unwrap();
    assert!(
        sha.len() == 64 && sha.bytes().all(|c| c.is_ascii_hexdigit()) && sha != EMPTY_SHA,
        "{}",
        b.failure(&format!("{name}: no certificate hash ({sha:?})"))
    );
    sha
}

/// The `check --output json` record named `name`.
pub fn cert<'a>(check: &'a Value, name: &str) -> &'a Value {
    check["certificates"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no certificate {name} in check output"))
}

/// Every renewable certificate is sound and expires in about `days` days (± 1 day).
pub fn assert_expiries(b: &Boot, check: &Value, names: &[&str], days: i64) {
    for n in names {
        let c = cert(check, n);
        let residual = c["residual_seconds"].as_i64().unwrap_or(i64::MIN);
        assert!(
            (residual - days * DAY).abs() <= DAY,
            "{}",
            b.failure(&format!(
                "{n}: residual {residual}s, expected about {days} days: {c}"
            ))
        );
        assert_eq!(c["status"], "ok", "{}", b.failure(&format!("{n}: {c}")));
        assert_eq!(
            c["key_matches"],
            true,
            "{}",
            b.failure(&format!("{n}: {c}"))
        );
        assert_eq!(c["chain_ok"], true, "{}", b.failure(&format!("{n}: {c}")));
    }
}

/// Files of `UNTOUCHABLE` present in `before` are unchanged in `after`.
pub fn assert_untouched(
    b: &Boot,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    let mut seen = 0;
    for f in UNTOUCHABLE {
        if let Some(old) = before.get(f) {
            seen += 1;
            assert_eq!(
                after.get(f),
                Some(old),
                "{}",
                b.failure(&format!("{f} changed"))
            );
        }
    }
    assert!(
        seen >= 6,
        "{}",
        b.failure(&format!("only {seen} CA/SA files found"))
    );
}

/// One pod's kubelet-sim history: (starts, crash restarts, downtime of the last stop→start in ms).
pub fn pod_history(state: &Value) -> (usize, u64, Option<i64>) {
    let h = state["history"].as_array().cloned().unwrap_or_default();
    let gap = h
        .len()
        .checked_sub(2)
        .and_then(|i| Some(h[i + 1]["started_at_ms"].as_i64()? - h[i]["stopped_at_ms"].as_i64()?));
    (h.len(), state["restarts"].as_u64().unwrap_or(u64::MAX), gap)
}

/// Figures of one scenario: printed and written to `<work dir>/figures.txt`.
pub struct Figures {
    text: String,
}

impl Figures {
    pub fn new(name: &str) -> Figures {
        Figures {
            text: format!("== {name}\n"),
        }
    }

    pub fn line(&mut self, l: impl AsRef<str>) {
        self.text.push_str(l.as_ref());
        self.text.push('\n');
    }

    /// Unavailability per component from a `run --output json` report and the kubelet-sim
    /// states saved with `prefix` (`<prefix>-<pod>.json`).
    pub fn unavailability(&mut self, b: &Boot, label: &str, report: &Value, prefix: Option<&str>) {
        let mut line = format!("{label}: unavailable");
        for r in report["restarted"].as_array().cloned().unwrap_or_default() {
            let comp = r["component"].as_str().unwrap_or("?").to_string();
            write!(line, " {comp} {} ms", r["unavailable_ms"]).unwrap();
            if let Some(p) = prefix
                && let Ok(text) =
                    b.read_out(&format!("{p}-{}.json", r["pod"].as_str().unwrap_or("")))
                && let Ok(state) = serde_json::from_str::<Value>(&text)
                && let (_, _, Some(gap)) = pod_history(&state)
            {
                write!(line, " (process down {gap} ms)").unwrap();
            }
            line.push(';');
        }
        if let Some(ms) = report["duration_ms"].as_u64() {
            write!(line, " run {ms} ms").unwrap();
        }
        self.line(line);
    }

    /// How long the real control plane took to be healthy (`healthy-times.txt`), when saved.
    pub fn healthy_times(&mut self, b: &Boot, label: &str) {
        if let Ok(t) = b.read_out("healthy-times.txt") {
            self.line(format!("{label}real control plane healthy after (s): {t}"));
        }
    }

    pub fn boot(&mut self, b: &Boot) {
        let mut l = format!("boot {}: {:.1}s", b.index, b.elapsed.as_secs_f64());
        for m in [
            "RUN-BEGIN",
            "MARK CERTROTOR-BEGIN",
            "MARK CERTROTOR-END",
            "RESULT",
        ] {
            if let Some(t) = b.marker_time(&format!("CERTROTOR-E2E: {m}")) {
                write!(l, ", {m} at {:.1}s", t.as_secs_f64()).unwrap();
            }
        }
        self.line(l);
    }

    pub fn finish(mut self, sc: &Scenario, t0: Instant) {
        self.line(format!("wall time {:.1}s", t0.elapsed().as_secs_f64()));
        self.finish_to(sc, "figures.txt");
    }

    /// Prints the figures and writes them to `file` in the scenario's folder (a scenario that
    /// shares its boot with another keeps its own file).
    pub fn finish_to(self, sc: &Scenario, file: &str) {
        eprint!("{}", self.text);
        std::fs::write(sc.dir().join(file), &self.text).unwrap();
    }
}

/// Boots scenario a's guest script (`scenarios/renew-expiring.sh`: a stacked node expiring in 2
/// days, renewed by certrotor's host container) with `opts` and asserts what every renewal of it
/// must show ([`assert_renewal`] of its first pass, whose kubeconfigs are [`KUBECONFIGS`]).
/// Returns the boot, certrotor's report and the PKI checksums before the run.
pub fn renew_expiring_node_boot(
    sc: &mut Scenario,
    opts: &BootOptions,
) -> (Boot, Value, BTreeMap<String, String>) {
    let b = boot_checked(sc, opts);
    let (report, before) = assert_renewal(&b, sc, "", &KUBECONFIGS);
    (b, report, before)
}

/// What every renewal of scenario a's node must show, from the files the guest saved with
/// `prefix` (`run.json`, `check-after.json`, `pki-before.sha`, ... with the prefix in front):
/// exit 0 without rollback, the static pods restarted in order (or reloaded live), leaves and
/// `kubeconfigs` valid a year, CAs untouched, renewed files changed, etcd data kept, the new
/// certificates served and equal to what certrotor verified. Returns certrotor's report and the
/// PKI checksums before the pass.
pub fn assert_renewal(
    b: &Boot,
    sc: &Scenario,
    prefix: &str,
    kubeconfigs: &[&str],
) -> (Value, BTreeMap<String, String>) {
    let file = |name: &str| format!("{prefix}{name}");
    let report = json(b, &file("run.json"));
    assert_eq!(
        b.read_out(&file("run.rc")).unwrap(),
        "0",
        "{}",
        b.failure(&format!("{prefix}run rc"))
    );
    assert!(
        report["rolled_back"].is_null(),
        "{}",
        b.failure(&format!("rolled back: {report}"))
    );
    let names = |key: &str| -> Vec<String> {
        report[key]
            .as_array()
            .unwrap_or_else(|| panic!("{}", b.failure(&format!("no {key}: {report}"))))
            .iter()
            .map(|r| r["component"].as_str().unwrap().to_string())
            .collect()
    };
    // Every component either reloaded live (`--restart live`: etcd) or was restarted, in order.
    let (restarted, reloaded) = (names("restarted"), names("reloaded"));
    let expected: Vec<&str> = PODS
        .into_iter()
        .filter(|p| !reloaded.iter().any(|r| r == p))
        .collect();
    assert_eq!(restarted, expected, "{}", b.failure("restart order"));
    // new expiries about a year away, sound chains and keys
    let check = json(b, &file("check-after.json"));
    let mut renewed: Vec<&str> = STACKED_LEAVES.to_vec();
    renewed.extend(kubeconfigs);
    assert_expiries(b, &check, &renewed, 365);

    // CAs untouched, every renewed file changed
    let before = sums(b, &file("pki-before.sha"));
    let after = sums(b, &file("pki-after.sha"));
    assert_untouched(b, &before, &after);
    for f in [
        "var/lib/kubeadm/pki/apiserver.crt",
        "var/lib/kubeadm/pki/apiserver.key",
        "var/lib/kubeadm/pki/etcd/server.crt",
        "var/lib/kubeadm/admin.conf",
        "var/lib/kubeadm/scheduler.conf",
    ] {
        assert_ne!(
            before.get(f),
            after.get(f),
            "{}",
            b.failure(&format!("{f} not renewed"))
        );
        assert!(
            after.contains_key(f),
            "{}",
            b.failure(&format!("{f} missing"))
        );
    }

    // etcd data survived the renewal (and the etcd restart, if any) with new certificates
    assert_eq!(
        b.read_out(&file("etcd-after")).unwrap(),
        std::fs::read_to_string(sc.share_dir().join("token")).unwrap(),
        "{}",
        b.failure("the etcd key written before the renewal")
    );

    // served = files, before (old) and after (new), and = what certrotor verified
    let old = assert_served_equals_files(b, &file("served-before.txt"));
    let new = assert_served_equals_files(b, &file("served-after.txt"));
    for ((c, o, _), (_, n, _)) in old.iter().zip(&new) {
        assert_ne!(
            o,
            n,
            "{}",
            b.failure(&format!("{c} still serves the old certificate"))
        );
        let verified = report["restarted"]
            .as_array()
            .unwrap()
            .iter()
            .chain(report["reloaded"].as_array().unwrap())
            .find(|r| r["component"] == c.as_str())
            .map(|r| r["served_sha256"].clone());
        assert_eq!(verified, Some(serde_json::json!(n)), "{}", b.failure(c));
    }

    (report, before)
}

/// Through the real apiserver with the renewed (or, after a rollback, restored) admin.conf
/// (`node_kubectl_after`): kubectl v1.20.2 lists the namespaces and reads back the ConfigMap
/// written before the renewal.
pub fn assert_kubectl_after(b: &Boot, sc: &Scenario) {
    assert_kubectl_after_as(b, sc, "");
}

/// [`assert_kubectl_after`] on the files the guest saved with `prefix` (`node_kubectl_after`'s
/// PREFIX).
pub fn assert_kubectl_after_as(b: &Boot, sc: &Scenario, prefix: &str) {
    let namespaces = b.read_out(&format!("{prefix}namespaces.txt")).unwrap();
    for ns in ["namespace/default", "namespace/kube-system"] {
        assert!(
            namespaces.lines().any(|l| l == ns),
            "{}",
            b.failure(&format!(
                "kubectl get namespaces: no {ns} in:\n{namespaces}"
            ))
        );
    }
    let token = std::fs::read_to_string(sc.share_dir().join("token")).unwrap();
    assert_eq!(
        b.read_out(&format!("{prefix}configmap.txt")).unwrap(),
        token,
        "{}",
        b.failure("the ConfigMap written before the renewal, read back after it")
    );
}

/// A boot on the real control plane: 2 vCPUs (multi-threaded TCG) and 2 GiB (the figures are in
/// ARCHITECTURE.md, "Doubles that remain"). No time limit: the guest bounds its own waits and
/// the harness stops a boot whose console falls silent (`BootOptions::hang_after`).
pub fn real_cp_boot() -> BootOptions {
    BootOptions {
        smp: Some(2),
        mem_mib: Some(2048),
        ..BootOptions::default()
    }
}

/// Scenario a's script (`renew-expiring.sh`: the real kube-apiserver, controller-manager and
/// scheduler v1.20.2) in the default `--restart live`.
pub fn real_cp_scenario(name: &str) -> (Scenario, Instant) {
    k8s_scenario(name, include_str!("../../scenarios/renew-expiring.sh"))
}

/// The real pause (v1.20.2's pause.c, packed without docker) in the share as `pause.tar`, named
/// `k8s.gcr.io/pause:3.2`: the sandbox image of containerd's CRI (`node_cri_containerd`).
pub fn add_pause_image(sc: &Scenario) {
    qemu_tests::artifacts::oci_image(
        &qemu_tests::artifacts::k8s_pause().unwrap(),
        "/pause",
        "k8s.gcr.io/pause:3.2",
        &sc.share_dir().join("pause.tar"),
    )
    .unwrap();
}

/// Figures of a scenario-a run: the boot, how long the control plane took to be healthy, and
/// each component's unavailability in certrotor's pass (as the report gives it: the real kubelet
/// keeps no kubelet-sim state files).
pub fn real_cp_figures(name: &str, b: &Boot, report: &Value) -> Figures {
    let mut f = Figures::new(name);
    f.boot(b);
    if let Ok(t) = b.read_out("healthy-times.txt") {
        f.line(format!("control plane healthy after (s): {t}"));
    }
    f.unavailability(b, "host container run --once --restart live", report, None);
    f
}
