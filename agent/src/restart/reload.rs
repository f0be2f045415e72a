//! Which component reloads which renewed file by itself, and so what a pass restarts.
//!
//! Every row names the proof: a test against the real binary (Debian's etcd 3.4, kube-apiserver
//! v1.20.2), or, where none runs here, the upstream code or issue that says so; a row without
//! a proof of live reload is a restart (restarting is always correct, only slower).
//!
//! | Component | File (catalog name) | Reloads by itself? | Proof |
//! |---|---|---|---|
//! | etcd | `etcd-server`, `etcdadm-server` | yes, on the next TLS handshake | `platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies` (and the bottlerocket twin) |
//! | etcd | `etcd-peer`, `etcdadm-peer` | yes, on the next peer handshake | the same (peer port serves the new file) and `cluster::etcd_peer_renewal_keeps_the_leader` (3 members, leader and term unchanged) |
//! | (none: the probe, etcdctl) | `etcd-healthcheck-client`, `etcdadm-etcdctl-etcd-client` | read per connection by the client | `platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies` (etcdctl with the new pair) |
//! | kube-apiserver | `apiserver` (serving) | yes, within about a minute (dynamic serving certificate controller) | `cluster::apiserver_serves_renewed_cert_without_restart` |
//! | kube-apiserver | `apiserver-etcd-client` | yes, at every new connection to etcd; open connections keep the pair they were opened with (etcd checks a client certificate at the handshake only) | `cluster::apiserver_serves_renewed_cert_without_restart` (a refused pair on disk is presented at the next reconnection) |
//! | kube-apiserver | `apiserver-kubelet-client` | not proven here: restart | upstream (client-go reloads it for new connections, kubernetes#79083; open connections keep the old one, kubernetes#114588); no real kubelet runs here |
//! | kube-apiserver | `front-proxy-client` | not proven here: restart | no aggregated API server runs here |
//! | kube-controller-manager | `controller-manager.conf` | no: embedded data, read at start | kubeconfig with `client-certificate-data` |
//! | kube-scheduler | `scheduler.conf` | no: embedded data, read at start | idem |
//!
//! After renewal, a component whose renewed files all reload is waited for (bounded by
//! `--reload-timeout`, 90 s by default: the apiserver re-reads its files about once a minute)
//! until its live probe serves the new certificate; one that reads a file it cannot reload, or
//! that did not reload within the bound, is restarted, and the reason is reported.

use std::time::Duration;

use crate::node::manifests::Component;

/// `--restart`: restart every component whose files changed (the behaviour before live
/// reload), or only what cannot reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RestartMode {
    /// Wait for live reload where the component reloads the file; restart the rest.
    #[default]
    Live,
    /// Restart every component that reads a renewed file.
    Always,
}

impl RestartMode {
    /// Parses `live|always`.
    pub fn parse(s: &str) -> Option<RestartMode> {
        match s {
            "live" => Some(RestartMode::Live),
            "always" => Some(RestartMode::Always),
            _ => None,
        }
    }
}

/// Default bound on the wait for a live reload.
pub const DEFAULT_RELOAD_TIMEOUT: Duration = Duration::from_secs(90);

/// Whether a component picks up a renewed file by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// It serves the new file without a restart (typically within `typical`).
    Live { typical: Duration },
    /// It must be restarted; `why` completes "restarted because <file> ...".
    Restart { why: &'static str },
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub component: Component,
    /// Catalog names (see `catalog::names`).
    pub files: &'static [&'static str],
    pub reload: Reload,
    /// The test or upstream reference that proves the row.
    pub proof: &'static str,
}

/// The reload table (see the module documentation).
pub const TABLE: &[Row] = &[
    Row {
        component: Component::Etcd,
        files: &["etcd-server", "etcdadm-server"],
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies",
    },
    Row {
        component: Component::Etcd,
        files: &["etcd-peer", "etcdadm-peer"],
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "cluster::etcd_peer_renewal_keeps_the_leader",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver"],
        reload: Reload::Live {
            typical: Duration::from_secs(60),
        },
        proof: "cluster::apiserver_serves_renewed_cert_without_restart",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver-etcd-client"],
        // Read at every new connection to etcd; open connections stay authenticated with the
        // pair they were opened with (etcd checks a client certificate at the handshake only).
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "cluster::apiserver_serves_renewed_cert_without_restart",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver-kubelet-client"],
        reload: Reload::Restart {
            why: "is not proven to reload (connections open to kubelets keep the old one)",
        },
        proof: "upstream: kubernetes#79083, kubernetes#114588",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["front-proxy-client"],
        reload: Reload::Restart {
            why: "is not proven to reload",
        },
        proof: "none here: no aggregated API server runs in the tests",
    },
    Row {
        component: Component::KubeControllerManager,
        files: &["controller-manager.conf"],
        reload: Reload::Restart {
            why: "cannot be reloaded (kubeconfig with embedded data, read at start)",
        },
        proof: "kubeconfig client-certificate-data",
    },
    Row {
        component: Component::KubeScheduler,
        files: &["scheduler.conf"],
        reload: Reload::Restart {
            why: "cannot be reloaded (kubeconfig with embedded data, read at start)",
        },
        proof: "kubeconfig client-certificate-data",
    },
];

/// How `component` takes the renewed file `cert_name` (a catalog name, `name@layout` allowed).
/// A pair the table does not list is a restart.
pub fn reload_of(component: Component, cert_name: &str) -> Reload {
    let base = cert_name.split('@').next().unwrap_or(cert_name);
    TABLE
        .iter()
        .find(|r| r.component == component && r.files.contains(&base))
        .map(|r| r.reload)
        .unwrap_or(Reload::Restart {
            why: "is not in the reload table",
        })
}

/// What a pass does with one component after renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Every renewed file it reads reloads: wait until it serves them.
    WaitLive,
    /// Restart it; the reason is printed ("restarted because ...").
    Restart { because: String },
}

/// Decides for `component`, which reads some of the renewed files `names`.
pub fn decide(component: Component, names: &[String], mode: RestartMode) -> Action {
    let read: Vec<&String> = names
        .iter()
        .filter(|n| Component::reading(n) == Some(component))
        .collect();
    if mode == RestartMode::Always {
        let files = read
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Action::Restart {
            because: format!("--restart always ({files} changed)"),
        };
    }
    let cannot: Vec<String> = read
        .iter()
        .filter_map(|n| match reload_of(component, n) {
            Reload::Restart { why } => Some(format!("{n} {why}")),
            Reload::Live { .. } => None,
        })
        .collect();
    if !cannot.is_empty() {
        return Action::Restart {
            because: cannot.join("; "),
        };
    }
    if read.is_empty() {
        return Action::Restart {
            because: "it reads a renewed file".into(),
        };
    }
    Action::WaitLive
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn decisions() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let all = s(&[
            "etcd-server",
            "etcd-peer",
            "etcd-healthcheck-client",
            "apiserver",
            "apiserver-etcd-client",
            "apiserver-kubelet-client",
        ]);
        assert_eq!(
            decide(Component::Etcd, &all, RestartMode::Live),
            Action::WaitLive
        );
        match decide(Component::KubeApiserver, &all, RestartMode::Live) {
            Action::Restart { because } => {
                assert!(
                    because.starts_with("apiserver-kubelet-client is not proven"),
                    "{because}"
                )
            }
            a => panic!("{a:?}"),
        }
        assert_eq!(
            decide(
                Component::KubeApiserver,
                &s(&["apiserver", "apiserver-etcd-client"]),
                RestartMode::Live
            ),
            Action::WaitLive
        );
        assert!(matches!(
            decide(Component::Etcd, &all, RestartMode::Always),
            Action::Restart { .. }
        ));
        assert!(matches!(
            decide(
                Component::KubeScheduler,
                &s(&["scheduler.conf"]),
                RestartMode::Live
            ),
            Action::Restart { .. }
        ));
        assert_eq!(RestartMode::parse("always"), Some(RestartMode::Always));
        assert_eq!(RestartMode::parse("sometimes"), None);
    }
}
