//! Unit tests of the pure core: the renewal plan, backup ids, restart sets, the daemon's
//! back-off and jitter. Pure inputs in, decisions out: no files, no processes.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::node::catalog::{Entry, Flavor, Kind};
use crate::node::inventory::{Inventory, Record, Status};
use crate::node::manifests::Component;
use crate::renew::{self, Policy, Reason};

const NOW: i64 = 1_800_000_000;
const DAY: i64 = 86_400;

fn entry(name: &str, kind: Kind, ca: Option<&str>, renewable: bool) -> Entry {
    Entry {
        name: name.into(),
        kind,
        path: format!("etc/kubernetes/pki/{name}.crt"),
        key_path: (kind != Kind::Kubeconfig).then(|| format!("etc/kubernetes/pki/{name}.key")),
        ca: ca.map(str::to_string),
        required: true,
        renewable,
        flavor: Flavor::Kubeadm,
        layout: "kubeadm",
        description: "test",
    }
}

fn record(e: &Entry, status: Status, residual: Option<i64>) -> Record {
    Record {
        not_before: Some(crate::sys::clock::rfc3339(NOW - 300 * DAY)),
        not_after: residual.map(|r| crate::sys::clock::rfc3339(NOW + r)),
        residual_seconds: residual,
        ca: e.ca.clone(),
        status,
        error: (status == Status::Invalid).then(|| "damaged".to_string()),
        not_after_unix: residual.map(|r| NOW + r),
        ..Record::blank(e)
    }
}

/// A node: the CA (valid 9 years more), `apiserver` due in 10 days, `front-proxy-client` fine
/// for 200 days, `admin.conf` expired, `etcd-server` in the state given.
fn inventory(etcd_status: Status) -> Inventory {
    let rows = [
        (
            entry("ca", Kind::Ca, None, false),
            Status::Ok,
            Some(9 * 365 * DAY),
        ),
        (
            entry("apiserver", Kind::Leaf, Some("ca"), true),
            Status::Ok,
            Some(10 * DAY),
        ),
        (
            entry("front-proxy-client", Kind::Leaf, Some("ca"), true),
            Status::Ok,
            Some(200 * DAY),
        ),
        (
            entry("admin.conf", Kind::Kubeconfig, Some("ca"), true),
            Status::Expired,
            Some(-DAY),
        ),
        (
            entry("etcd-server", Kind::Leaf, Some("ca"), true),
            etcd_status,
            (etcd_status != Status::Missing).then_some(300 * DAY),
        ),
    ];
    Inventory {
        root: "/node".into(),
        layouts: vec!["kubeadm".into()],
        generated_at: crate::sys::clock::rfc3339(NOW),
        warn_within_seconds: 30 * DAY,
        certificates: rows.iter().map(|(e, s, r)| record(e, *s, *r)).collect(),
        keys: vec![],
        entries: rows.iter().map(|(e, _, _)| e.clone()).collect(),
        detected: vec![],
        now: NOW,
    }
}

fn policy() -> Policy {
    Policy {
        within: 90 * DAY,
        all: false,
        names: vec![],
        reuse_keys: false,
        validity: 365 * DAY,
        allow_beyond_ca: false,
    }
}

/// The default policy for the certificates named `name` only (`--cert NAME`).
fn only(name: &str) -> Policy {
    Policy {
        names: vec![name.into()],
        ..policy()
    }
}

fn names(plan: &renew::Plan) -> Vec<(&str, Reason)> {
    plan.items
        .iter()
        .map(|i| (i.name.as_str(), i.reason))
        .collect()
}

#[test]
fn plan_renews_what_is_due_or_expired_and_says_why_the_rest_is_skipped() {
    let plan = renew::plan(&inventory(Status::Ok), &policy(), NOW).unwrap();
    assert_eq!(
        names(&plan),
        [("apiserver", Reason::Due), ("admin.conf", Reason::Expired)]
    );
    let skipped: Vec<&str> = plan.skipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(skipped, ["front-proxy-client", "etcd-server"]);
    assert_eq!(plan.not_before_unix, NOW - renew::BACKDATE);
    assert_eq!(plan.not_after_unix, NOW + 365 * DAY);
    assert!(!plan.reuse_keys);
}

#[test]
fn plan_all_and_named() {
    let all = renew::plan(
        &inventory(Status::Ok),
        &Policy {
            all: true,
            ..policy()
        },
        NOW,
    )
    .unwrap();
    assert_eq!(
        all.items.len(),
        4,
        "every renewable certificate, never the CA"
    );
    assert!(all.items.iter().all(|i| i.name != "ca"));
    let named = renew::plan(&inventory(Status::Ok), &only("front-proxy-client"), NOW).unwrap();
    assert_eq!(names(&named), [("front-proxy-client", Reason::Named)]);
}

#[test]
fn plan_refuses_cas_unknown_names_invalid_files_and_passing_the_ca() {
    let refuse = |inv: &Inventory, p: Policy, words: &str| {
        let e = renew::plan(inv, &p, NOW).unwrap_err().to_string();
        assert!(e.contains(words), "want '{words}' in: {e}");
    };
    let inv = inventory(Status::Ok);
    refuse(&inv, only("ca"), "certrotor never renews CAs");
    refuse(&inv, only("nope"), "no such certificate");
    refuse(
        &inventory(Status::Invalid),
        Policy {
            all: true,
            ..policy()
        },
        "etcd-server: damaged",
    );
    refuse(
        &inv,
        Policy {
            validity: 10 * 365 * DAY,
            ..policy()
        },
        "would pass CA 'ca' notAfter",
    );
    // --allow-beyond-ca lifts the last refusal.
    assert!(
        renew::plan(
            &inv,
            &Policy {
                validity: 10 * 365 * DAY,
                allow_beyond_ca: true,
                ..policy()
            },
            NOW
        )
        .is_ok()
    );
    // Nothing found at all.
    let mut empty = inventory(Status::Ok);
    empty.layouts.clear();
    refuse(&empty, policy(), "no kubeadm or etcdadm PKI found");
}

#[test]
fn plan_skips_a_missing_required_file_unless_named() {
    let plan = renew::plan(&inventory(Status::Missing), &policy(), NOW).unwrap();
    assert!(
        plan.skipped
            .iter()
            .any(|s| s.name == "etcd-server" && s.why == "missing")
    );
    let e = renew::plan(&inventory(Status::Missing), &only("etcd-server"), NOW).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn backup_ids_sort_in_creation_order_and_are_never_reused() {
    let id = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        crate::txn::next_backup_id("20261123T010203Z", &names)
    };
    assert_eq!(id(&[]), "20261123T010203Z");
    assert_eq!(id(&["20261122T000000Z"]), "20261123T010203Z");
    assert_eq!(id(&["20261123T010203Z"]), "20261123T010203Z-002");
    assert_eq!(
        id(&["20261123T010203Z", "20261123T010203Z-009"]),
        "20261123T010203Z-010"
    );
    // The highest suffix counts even when lower ones were pruned, and an incomplete backup
    // holds its id.
    assert_eq!(id(&["20261123T010203Z-004"]), "20261123T010203Z-005");
    assert_eq!(
        id(&[".incomplete-20261123T010203Z-002"]),
        "20261123T010203Z-003"
    );
    let (a, b) = ("20261123T010203Z-009", "20261123T010203Z-010");
    assert!(a < b, "padded suffixes sort");
    assert!("20261123T010203Z" < "20261123T010203Z-002");
}

#[test]
fn restart_sets_follow_which_files_each_component_reads() {
    let set = |names: &[&str]| {
        crate::restart::components_for(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(set(&[]), []);
    assert_eq!(
        set(&["apiserver", "front-proxy-client", "apiserver-etcd-client"]),
        [Component::KubeApiserver]
    );
    assert_eq!(
        set(&[
            "scheduler.conf",
            "etcd-peer",
            "admin.conf",
            "controller-manager.conf",
            "etcd-server",
            "apiserver-kubelet-client",
        ]),
        [
            Component::Etcd,
            Component::KubeApiserver,
            Component::KubeControllerManager,
            Component::KubeScheduler,
        ],
        "sorted, deduplicated, admin.conf restarts nothing"
    );
    assert_eq!(set(&["etcdadm-server@etcd"]), [Component::Etcd]);
    assert_eq!(set(&["ca", "sa", "kubelet.conf"]), []);
}

#[test]
fn jitter_stays_within_ten_percent_and_varies() {
    let d = Duration::from_secs(3600);
    let samples: Vec<Duration> = (0..200).map(|_| crate::pass::daemon::jitter(d)).collect();
    for s in &samples {
        assert!(
            *s >= d.mul_f64(0.9) && *s <= d.mul_f64(1.1),
            "{s:?} outside 3600s ± 10%"
        );
    }
    let distinct: std::collections::BTreeSet<_> = samples.iter().collect();
    assert!(distinct.len() > 50, "jitter does not vary: {distinct:?}");
}

#[test]
fn backoff_doubles_from_a_minute_and_is_capped_at_the_interval() {
    let hour = Duration::from_secs(3600);
    let around = |got: Duration, secs: f64| {
        let s = got.as_secs_f64();
        assert!(
            s >= secs * 0.9 - 1e-6 && s <= secs * 1.1 + 1e-6,
            "{got:?} is not {secs}s ± 10%"
        );
    };
    around(crate::pass::daemon::backoff(1, hour), 60.0);
    around(crate::pass::daemon::backoff(2, hour), 120.0);
    around(crate::pass::daemon::backoff(3, hour), 240.0);
    around(crate::pass::daemon::backoff(6, hour), 1920.0);
    around(crate::pass::daemon::backoff(7, hour), 3600.0);
    // No overflow, however many failures; a short interval caps at once.
    around(crate::pass::daemon::backoff(u32::MAX, hour), 3600.0);
    around(
        crate::pass::daemon::backoff(5, Duration::from_secs(90)),
        90.0,
    );
}
