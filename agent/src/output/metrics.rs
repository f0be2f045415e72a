//! Prometheus metrics: the text exposition format (version 0.0.4) of
//!
//! - the certificate gauges of enix's x509-certificate-exporter, with its names, HELP texts,
//!   types and labels, so that its dashboards and alert rules work unchanged on certrotor's
//!   output: `x509_cert_not_before`, `x509_cert_not_after`, `x509_cert_expired` per certificate
//!   (labels `filename`, `filepath`, `serial_number` in decimal, `issuer_*`/`subject_*` for the
//!   C, ST, L, O, OU and CN present, and for a kubeconfig `embedded_kind` = `user` or `cluster`
//!   and `embedded_key` = the user or cluster name), `x509_read_errors` (v3's count of failed
//!   reads) and `x509_cert_error` per file (v3's and v4's `CertificateError` rule: 1 for a file
//!   that failed, 0 for one read);
//! - the per-source families enix v4 replaced `x509_read_errors` with, a source being what
//!   certrotor reads: a folder of certificate files (`source_kind="file"`, `source_name` = the
//!   folder, `/etc/kubernetes/pki`) or one kubeconfig (`source_kind="kubeconfig"`, the file):
//!   `x509_source_up` (the folder can be listed, the kubeconfig gave its certificate),
//!   `x509_source_bundles` (its files present) and, in the daemon, the counter
//!   `x509_source_errors_total{reason}`, one per failed file at each scrape (v4's file source
//!   counts one per failed file at each of its walks);
//! - certrotor's own, under `certrotor_`: the last pass (time, result, duration), the last
//!   successful pass, renewals, rollbacks, restarts and live reloads per component, the
//!   unavailability of the last restart of each component, the time spent waiting for the
//!   cluster lock, the daemon's start, `--interval` and `--within`, the restarts owed
//!   (the pass state `pass.json`, read at each scrape) and when each certificate certrotor renews
//!   falls due (its notAfter minus `--within`): what the alert rules of
//!   `bottlerocket/packaging/monitoring/` need.
//!
//! `check --output prometheus` prints the certificate gauges (node-exporter's textfile
//! collector); `daemon --metrics-address` serves both on `/metrics` with [`serve`], a small
//! server on `std::net` (no HTTP crate): one thread accepts, each connection gets its own
//! short-lived thread (at most [`MAX_CONNECTIONS`] at once: when all are taken, the oldest is
//! closed for the new one), reads at most [`MAX_REQUEST_BYTES`], the whole exchange within
//! [`IO_TIMEOUT`], so a slow or hostile client neither stalls the daemon's passes nor other
//! scrapes. The certificate gauges are read fresh from the node's
//! files at each scrape (an inventory of a node takes milliseconds), so they never lag a
//! renewal or a hand-made change; the pass counters live in memory for the daemon's life.

use std::fmt::Write as _;
use std::time::Duration;

/// The content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Connections served at once; more are closed without an answer.
pub const MAX_CONNECTIONS: usize = 8;
/// The most of a request read (a scrape's request is a few hundred bytes).
pub const MAX_REQUEST_BYTES: usize = 8192;
/// Bound on a whole exchange: reading the request and writing the answer, together.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

use counters::node_state;
use exporter::SOURCE_ERRORS_HELP;
mod exporter;
pub use exporter::{ReadFailure, SourceName, certificate_gauges, certificate_read};
mod counters;
pub use counters::{Counters, RESULTS};
mod server;
pub use server::{Shared, serve};
fn l(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

fn float(v: f64) -> String {
    format!("{v:.3}")
}

/// A family of one sample without labels.
fn unlabelled(o: &mut String, name: &str, help: &str, kind: &str, value: &str) {
    header(o, name, help, kind);
    sample(o, name, &[], value);
}

fn header(o: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(
        o,
        "# HELP {name} {}",
        help.replace('\\', "\\\\").replace('\n', "\\n")
    );
    let _ = writeln!(o, "# TYPE {name} {kind}");
}

fn sample(o: &mut String, name: &str, labels: &[(String, String)], value: &str) {
    o.push_str(name);
    if !labels.is_empty() {
        o.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let _ = write!(o, "{k}=\"{v}\"");
        }
        o.push('}');
    }
    let _ = writeln!(o, " {value}");
}

#[cfg(test)]
mod tests {
    use super::exporter::{dn_labels, hex_to_decimal};
    use super::*;
    use crate::node::Node;
    use crate::node::inventory::{self};
    use crate::pass::run::RunReport;
    use crate::sys::clock::{Clock, SystemClock};
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn serials_print_in_decimal_as_the_exporter_does() {
        assert_eq!(hex_to_decimal("2a"), "42");
        assert_eq!(hex_to_decimal("0"), "0");
        assert_eq!(hex_to_decimal("ffffffffffffffff"), "18446744073709551615");
        assert_eq!(
            hex_to_decimal("0100000000000000000000"),
            "1208925819614629174706176"
        );
    }

    #[test]
    fn names_give_the_exporter_labels_unescaped() {
        let mut v = Vec::new();
        dn_labels(
            &mut v,
            "subject",
            "CN=kube-apiserver-kubelet-client,O=system\\,masters",
        );
        assert_eq!(
            v,
            [
                l("subject_O", "system,masters"),
                l("subject_CN", "kube-apiserver-kubelet-client")
            ]
        );
    }

    /// A pass in which etcd reloaded live, the apiserver was restarted and a kube-vip pod was
    /// restarted: each is counted under its own name (issue 12.1).
    #[test]
    fn a_pass_counts_live_reloads_restarts_and_restarted_pods_per_component() {
        let report = sample_report();
        let mut c = Counters::default();
        c.record_pass(&Ok(report.clone()), 1, Duration::from_secs(1));
        let page = c.render();
        for line in [
            "certrotor_live_reloads_total{component=\"etcd\"} 1\n",
            "certrotor_restarts_total{component=\"kube-apiserver\"} 1\n",
            "certrotor_restarts_total{component=\"kube-vip\"} 1\n",
            "certrotor_last_restart_unavailable_seconds{component=\"kube-vip\"} 1.500\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        assert!(
            !page.contains("certrotor_restarts_total{component=\"etcd\"}"),
            "{page}"
        );
        c.record_pass(&Ok(report), 2, Duration::from_secs(1));
        assert!(
            c.render()
                .contains("certrotor_live_reloads_total{component=\"etcd\"} 2\n")
        );
    }

    /// A pass in which etcd reloaded live, the apiserver was restarted and a kube-vip pod was
    /// restarted.
    fn sample_report() -> RunReport {
        use crate::node::manifests::Component;
        RunReport {
            renew: crate::pass::ops::RenewReport {
                root: "/".into(),
                dry_run: false,
                plan: crate::renew::Plan {
                    items: Vec::new(),
                    skipped: Vec::new(),
                    not_before: String::new(),
                    not_after: String::new(),
                    not_before_unix: 0,
                    not_after_unix: 0,
                    reuse_keys: false,
                },
                backup_id: Some("b".into()),
                files_written: Vec::new(),
                kubelet: Default::default(),
                duration_ms: 0,
            },
            platform: "kubeadm".into(),
            components: vec![Component::Etcd, Component::KubeApiserver],
            reloaded: vec![crate::restart::Reloaded {
                component: Component::Etcd,
                pod: "etcd".into(),
                reloaded_after_ms: 120,
                served_sha256: None,
            }],
            restarted: vec![crate::restart::Restarted {
                component: Component::KubeApiserver,
                pod: "kube-apiserver".into(),
                unavailable_ms: 2500,
                served_sha256: None,
                reason: "test".into(),
                api: Default::default(),
            }],
            versions: Vec::new(),
            reload_notes: Vec::new(),
            other_consumers: Vec::new(),
            restarted_pods: vec![crate::restart::RestartedPod {
                pod: "kube-vip".into(),
                file: "etc/kubernetes/admin.conf".into(),
                unavailable_ms: 1500,
                reason: "test".into(),
                evidence: Default::default(),
                api: Default::default(),
            }],
            pod_errors: Vec::new(),
            owed_pods: Vec::new(),
            rolled_back: None,
            cluster: None,
            import: None,
            discarded_transactions: Vec::new(),
            re_enabled: Vec::new(),
            left_disabled: Vec::new(),
            api: Default::default(),
            duration_ms: 0,
        }
    }

    /// The schedule and the last successful pass are rendered for the rules; a pass that is not
    /// `ok` leaves the last success where it was.
    #[test]
    fn counters_render_the_schedule_and_the_last_successful_pass() {
        let mut c = Counters::default();
        let page = c.render();
        assert!(
            page.contains("\ncertrotor_last_success_timestamp_seconds 0\n"),
            "{page}"
        );
        assert!(!page.contains("certrotor_interval_seconds"), "{page}");
        c.schedule(Duration::from_secs(6 * 3600), 60 * 86_400);
        c.record_pass(&Ok(sample_report()), 1_000, Duration::from_secs(1));
        let mut rolled_back = sample_report();
        rolled_back.rolled_back = Some(crate::pass::run::RolledBack {
            failure: "test".into(),
            backup_id: "b".into(),
            restarted: Vec::new(),
            error: None,
        });
        c.record_pass(&Ok(rolled_back), 2_000, Duration::from_secs(1));
        let page = c.render();
        for line in [
            "\ncertrotor_last_success_timestamp_seconds 1000\n",
            "\ncertrotor_last_pass_timestamp_seconds 2000\n",
            "\ncertrotor_interval_seconds 21600.000\n",
            "\ncertrotor_renewal_window_seconds 5184000\n",
            "certrotor_last_pass_result{result=\"rolled_back\"} 1\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
    }

    fn lab_node(tag: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("certrotor-metrics-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let opts = crate::lab::LabOptions::for_tests(SystemClock.now());
        crate::lab::init(&root, &opts).unwrap();
        root
    }

    fn lines_of<'a>(page: &'a str, name: &str) -> Vec<&'a str> {
        page.lines()
            .filter(|x| x.starts_with(&format!("{name}{{")) || x.starts_with(&format!("{name} ")))
            .collect()
    }

    /// enix v3's `x509_cert_error` and v4's per-source families on a lab node, sound then with
    /// a damaged certificate, a damaged kubeconfig and a missing required certificate: each
    /// failure has its reason, and the daemon's counter grows by one per failed file and scrape.
    #[test]
    fn sources_and_read_failures_as_enix_v3_and_v4_name_them() {
        let root = lab_node("sources");
        let now = SystemClock.now();
        let (page, failures) =
            certificate_read(&root, &inventory::take(&Node::discover(&root), now, 0), now);
        assert!(failures.is_empty(), "{failures:?}");
        let errors = lines_of(&page, "x509_cert_error");
        assert!(errors.len() >= 15, "{page}");
        assert!(errors.iter().all(|x| x.ends_with(" 0")), "{page}");
        for line in [
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki\"} 1\n",
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\"} 1\n",
            "x509_source_up{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/admin.conf\"} 1\n",
            "x509_source_bundles{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/admin.conf\"} 1\n",
            "x509_cert_error{filename=\"apiserver.crt\",filepath=\"/etc/kubernetes/pki/apiserver.crt\"} 0\n",
            "\nx509_read_errors 0\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        let pki = root.join("etc/kubernetes/pki");
        std::fs::write(pki.join("front-proxy-client.crt"), "garbage").unwrap();
        std::fs::write(root.join("etc/kubernetes/scheduler.conf"), "garbage").unwrap();
        std::fs::remove_file(pki.join("etcd/peer.crt")).unwrap();
        let shared = Shared::new(&root, SystemClock::shared());
        let _ = shared.page();
        let page = shared.page();
        for line in [
            "x509_cert_error{filename=\"front-proxy-client.crt\",filepath=\"/etc/kubernetes/pki/front-proxy-client.crt\"} 1\n",
            "x509_cert_error{filename=\"scheduler.conf\",filepath=\"/etc/kubernetes/scheduler.conf\"} 1\n",
            "x509_cert_error{filename=\"peer.crt\",filepath=\"/etc/kubernetes/pki/etcd/peer.crt\"} 1\n",
            "x509_source_up{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/scheduler.conf\"} 0\n",
            "x509_source_up{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\"} 1\n",
            "\nx509_read_errors 3\n",
            "x509_source_errors_total{source_kind=\"file\",source_name=\"/etc/kubernetes/pki\",reason=\"bad_pem\"} 2\n",
            "x509_source_errors_total{source_kind=\"kubeconfig\",source_name=\"/etc/kubernetes/scheduler.conf\",reason=\"decode_failed\"} 2\n",
            "x509_source_errors_total{source_kind=\"file\",source_name=\"/etc/kubernetes/pki/etcd\",reason=\"not_found\"} 2\n",
        ] {
            assert!(page.contains(line), "{line}\n{page}");
        }
        assert_eq!(
            lines_of(&page, "x509_source_errors_total").len(),
            3,
            "{page}"
        );
        assert_eq!(
            lines_of(&page, "x509_cert_error")
                .iter()
                .filter(|x| x.ends_with(" 1"))
                .count(),
            3,
            "{page}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The restarts owed are 0 for every component on a node that owes none; the due dates
    /// appear once the daemon's --within is known, one per renewable certificate (not the CAs).
    #[test]
    fn restarts_owed_and_renewal_due_dates() {
        let root = lab_node("due");
        let shared = Shared::new(&root, SystemClock::shared());
        let page = shared.page();
        let owed = lines_of(&page, "certrotor_restarts_owed");
        assert_eq!(owed.len(), 4, "{page}");
        assert!(owed.iter().all(|x| x.ends_with(" 0")), "{page}");
        assert!(
            !page.contains("certrotor_certificate_renewal_due"),
            "{page}"
        );
        shared.update(|c| c.schedule(Duration::from_secs(3600), 30 * 86_400));
        let page = shared.page();
        let due = lines_of(&page, "certrotor_certificate_renewal_due_timestamp_seconds");
        assert!(due.len() >= 10, "{page}");
        assert!(!due.iter().any(|x| x.contains("ca.crt")), "{page}");
        let now = SystemClock.now();
        let inv = inventory::take(&Node::discover(&root), now, 0);
        let apiserver = inv.record("apiserver").unwrap().not_after_unix.unwrap();
        let want = format!(
            "certrotor_certificate_renewal_due_timestamp_seconds{{name=\"apiserver\",filepath=\"/etc/kubernetes/pki/apiserver.crt\"}} {}\n",
            apiserver - 30 * 86_400
        );
        assert!(page.contains(&want), "{want}\n{page}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut o = String::new();
        sample(&mut o, "m", &[l("a", "x\"y\\z\nw")], "1");
        assert_eq!(o, "m{a=\"x\\\"y\\\\z\\nw\"} 1\n");
    }
}
