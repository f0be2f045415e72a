//! Tests of the reload table and of the reload-or-restart decision: every file a component
//! reads has a row and rows do not overlap; versions from flags, then image tags; which
//! components reload live and which restart, and why (held-certificate margin, rollback).

use super::*;

#[test]
fn every_file_a_component_reads_is_in_the_table() {
    for name in [
        "etcd-server",
        "etcd-peer",
        "etcdadm-server",
        "etcdadm-peer",
        "apiserver",
        "apiserver-kubelet-client",
        "front-proxy-client",
        "apiserver-etcd-client",
        "controller-manager.conf",
        "scheduler.conf",
    ] {
        let c = Component::reading(name).unwrap();
        assert!(
            TABLE
                .iter()
                .any(|r| r.component == c && r.files.contains(&name)),
            "{name}"
        );
    }
}

/// No two rows of one file overlap in versions.
#[test]
fn rows_of_one_file_do_not_overlap() {
    for (i, a) in TABLE.iter().enumerate() {
        for b in &TABLE[i + 1..] {
            if a.component != b.component || !a.files.iter().any(|f| b.files.contains(f)) {
                continue;
            }
            let a_end = a.until.unwrap_or(Version::new(u32::MAX, 0, 0));
            let b_end = b.until.unwrap_or(Version::new(u32::MAX, 0, 0));
            assert!(a_end <= b.since || b_end <= a.since, "{a:?} / {b:?}");
        }
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn version(c: Component, v: Version) -> ComponentVersion {
    ComponentVersion {
        component: c,
        version: v,
        origin: Origin::ImageTag(format!("registry.k8s.io/{}:v{v}", c.name())),
    }
}

const NOW: i64 = 1_800_000_000;
const DAY: i64 = 24 * 3600;

fn ctx<'a>(v: Option<&'a ComponentVersion>, held: &'a [(String, i64)]) -> Context<'a> {
    Context {
        mode: RestartMode::Live,
        version: v,
        held,
        now: NOW,
        margin: DEFAULT_HELD_CERT_MARGIN,
    }
}

fn because(d: &Decision) -> &str {
    match &d.action {
        Action::Restart { because } => because,
        a => panic!("{a:?}"),
    }
}

/// A full leaf renewal: from 1.20 on, neither etcd nor kube-apiserver restarts; below, or
/// of unknown version, kube-apiserver does; the controller-manager and scheduler always.
#[test]
fn a_leaf_renewal_restarts_no_apiserver_from_1_20_on() {
    let all = s(&[
        "etcd-server",
        "etcd-peer",
        "etcd-healthcheck-client",
        "apiserver",
        "apiserver-etcd-client",
        "apiserver-kubelet-client",
        "front-proxy-client",
        "controller-manager.conf",
        "scheduler.conf",
    ]);
    let held: Vec<(String, i64)> = all.iter().map(|n| (n.clone(), NOW + 2 * DAY)).collect();
    let etcd = version(Component::Etcd, Version::new(3, 4, 13));
    let d = decide(Component::Etcd, &all, &ctx(Some(&etcd), &held));
    assert_eq!(d.action, Action::WaitLive);
    for v in [Version::new(1, 20, 2), Version::new(1, 26, 15)] {
        let api = version(Component::KubeApiserver, v);
        let d = decide(Component::KubeApiserver, &all, &ctx(Some(&api), &held));
        assert_eq!(d.action, Action::WaitLive, "{v}");
        assert_eq!(d.notes.len(), 2, "{d:?}");
        assert!(d.notes[0].contains("apiserver-kubelet-client"), "{d:?}");
        assert!(d.notes[0].contains("not restarted"), "{d:?}");
        assert!(d.notes[1].starts_with("front-proxy-client"), "{d:?}");
    }
    let api = version(Component::KubeApiserver, Version::new(1, 31, 4));
    let d = decide(Component::KubeApiserver, &all, &ctx(Some(&api), &held));
    assert_eq!(d.action, Action::WaitLive);
    assert_eq!(d.notes.len(), 1, "only front-proxy-client: {d:?}");
    // Held certificates do not matter from 1.27 on.
    let d = decide(Component::KubeApiserver, &all, &ctx(Some(&api), &[]));
    assert_eq!(d.action, Action::WaitLive);
    let old = version(Component::KubeApiserver, Version::new(1, 19, 16));
    let d = decide(Component::KubeApiserver, &all, &ctx(Some(&old), &held));
    assert!(
        because(&d).contains("from kube-apiserver 1.20.0 on, and this one is 1.19.16"),
        "{d:?}"
    );
    let d = decide(Component::KubeApiserver, &all, &ctx(None, &held));
    assert!(because(&d).contains("unknown"), "{d:?}");
    let d = decide(Component::Etcd, &all, &ctx(None, &held));
    assert!(because(&d).contains("version of etcd is unknown"), "{d:?}");
    for c in [Component::KubeControllerManager, Component::KubeScheduler] {
        // Whatever the version, known or not.
        let d = decide(c, &all, &ctx(None, &held));
        assert!(because(&d).contains(".conf cannot be reloaded"), "{d:?}");
    }
}

/// 1.20 – 1.26: the old apiserver-kubelet-client may stay on busy connections: restarted
/// when it expires within the margin, or when its expiry is unknown.
#[test]
fn the_held_kubelet_client_margin() {
    let names = s(&["apiserver-kubelet-client"]);
    let api = version(Component::KubeApiserver, Version::new(1, 20, 2));
    for (left, live) in [
        (2 * DAY, true),
        (DAY + 1, true),
        (DAY, false),
        (-DAY, false),
    ] {
        let held = vec![("apiserver-kubelet-client".to_string(), NOW + left)];
        let d = decide(Component::KubeApiserver, &names, &ctx(Some(&api), &held));
        if live {
            assert_eq!(d.action, Action::WaitLive, "{left}");
        } else {
            assert!(
                because(&d).contains("within the 24 h --held-cert-margin"),
                "{d:?}"
            );
        }
    }
    let d = decide(Component::KubeApiserver, &names, &ctx(Some(&api), &[]));
    assert!(because(&d).contains("expiry is unknown"), "{d:?}");
    let mut c = ctx(Some(&api), &[]);
    let held = vec![("apiserver-kubelet-client".to_string(), NOW + 2 * DAY)];
    c.held = &held;
    c.margin = Duration::from_secs(3 * DAY as u64);
    assert!(matches!(
        decide(Component::KubeApiserver, &names, &c).action,
        Action::Restart { .. }
    ));
}

#[test]
fn always_restarts_and_a_rollback_restarts_apiservers_before_1_27() {
    let names = s(&["apiserver", "apiserver-kubelet-client"]);
    let api = version(Component::KubeApiserver, Version::new(1, 31, 0));
    let mut c = ctx(Some(&api), &[]);
    c.mode = RestartMode::Always;
    assert!(because(&decide(Component::KubeApiserver, &names, &c)).starts_with("--restart always"));
    assert_eq!(
        restart_after_rollback(Component::KubeApiserver, &names, Some(&api)),
        None
    );
    let old = version(Component::KubeApiserver, Version::new(1, 26, 3));
    let why = restart_after_rollback(Component::KubeApiserver, &names, Some(&old)).unwrap();
    assert!(why.contains("1.26.3 (manifest image tag)"), "{why}");
    assert!(restart_after_rollback(Component::KubeApiserver, &names, None).is_some());
    assert_eq!(
        restart_after_rollback(Component::KubeApiserver, &s(&["apiserver"]), Some(&old)),
        None
    );
    assert_eq!(
        restart_after_rollback(Component::KubeScheduler, &names, Some(&old)),
        None
    );
    assert_eq!(RestartMode::parse("always"), Some(RestartMode::Always));
    assert_eq!(RestartMode::parse("sometimes"), None);
}

#[test]
fn versions_from_flags_then_image_tags() {
    let pod = |y: &str| PodInfo::parse(y.as_bytes()).unwrap();
    let api = pod(
        "metadata: {name: kube-apiserver}\nspec:\n  containers:\n  - command: [kube-apiserver]\n    image: public.ecr.aws/eks-distro/kubernetes/kube-apiserver:v1.31.4-eks-1-31-12\n",
    );
    let etcd = pod(
        "metadata: {name: etcd}\nspec:\n  containers:\n  - command: [etcd]\n    image: k8s.gcr.io/etcd:latest\n",
    );
    let pods = vec![("a".to_string(), api), ("e".to_string(), etcd)];
    let v = versions(&pods, &BTreeMap::new());
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].component, Component::KubeApiserver);
    assert_eq!(v[0].version, Version::new(1, 31, 4));
    let json = serde_json::to_string(&v[0]).unwrap();
    assert_eq!(
        json,
        r#"{"component":"kube-apiserver","version":"1.31.4","from":"image-tag","detail":"public.ecr.aws/eks-distro/kubernetes/kube-apiserver:v1.31.4-eks-1-31-12"}"#
    );
    let flags = BTreeMap::from([(Component::Etcd, Version::new(3, 5, 0))]);
    let v = versions(&pods, &flags);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].component, Component::Etcd);
    assert_eq!(v[0].origin, Origin::Flag);
}
