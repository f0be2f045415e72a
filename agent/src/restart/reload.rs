//! Which component reloads which renewed file by itself, from which version on, and so what a
//! pass restarts.
//!
//! Every row names the proof: a test against the real binary (Debian's etcd 3.4, kube-apiserver
//! v1.20.2), or, where none runs here, the upstream change that says so; a row holds for the
//! versions it names (the component's own: etcd's for etcd), and a file, version or component
//! without a row of live reload is a restart (restarting is always correct, only slower). The
//! version is read from the image tag of the component's static pod manifest (what the node
//! runs after a restart, [`crate::node::manifests::image_version`]), or given with
//! `--component-version` / `--kubernetes-version`; an unknown version restarts.
//!
//! | Component | File (catalog name) | Versions | Reloads by itself? | Proof |
//! |---|---|---|---|---|
//! | etcd | `etcd-server`, `etcdadm-server` | etcd ≥ 3.2 | yes, on the next TLS handshake | `platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies` (Debian's 3.4); etcd-io/etcd#7829 (3.2) |
//! | etcd | `etcd-peer`, `etcdadm-peer` | etcd ≥ 3.2 | yes, on the next peer handshake | `cluster::etcd_peer_renewal_keeps_the_leader` (3 members, leader and term unchanged) |
//! | kube-apiserver | `apiserver` (serving) | ≥ 1.20 | yes, within a minute (1.23+: at once, kubernetes#104102) | `cluster::apiserver_serves_renewed_cert_without_restart` |
//! | kube-apiserver | `apiserver-etcd-client` | ≥ 1.20 | yes, at every new connection to etcd; open connections keep theirs (etcd checks a client certificate at the handshake only) | `cluster::apiserver_serves_renewed_cert_without_restart` (a refused pair on disk is presented at the next reconnection) |
//! | kube-apiserver | `front-proxy-client` | ≥ 1.20 | yes, within a minute (1.23+: at once), on the next request proxied to an aggregated API server, over a new connection; nothing certrotor probes serves it | `platform::front_proxy_client_reloads_for_an_aggregated_api` (a real APIService; a refused pair and the old one back are picked up too) |
//! | kube-apiserver | `apiserver-kubelet-client` | 1.20 – 1.26 | for new connections to kubelets; a connection kept busy keeps the pair it was opened with, a refused one too: not restarted while the old certificate is valid beyond `--held-cert-margin` (24 h), restarted after a rollback | `platform::kubelet_client_pair_reloads_for_new_connections` |
//! | kube-apiserver | `apiserver-kubelet-client` | ≥ 1.27 | yes; a rotation closes the open connections (within 5 minutes) | kubernetes#115315 (v1.27.0; also v1.24.11, not relied on); new connections as above |
//! | kube-controller-manager | `controller-manager.conf` | every | no: embedded data, read at start | kubeconfig with `client-certificate-data` |
//! | kube-scheduler | `scheduler.conf` | every | no: embedded data, read at start | idem |
//!
//! Below 1.20 (or 3.2 for etcd) nothing is proven here: restart. Versions between 1.20 and the
//! next proven change are held to the 1.20.2 proof: the code concerned is unchanged or improved
//! in between (kubernetes#104102 in 1.23, #115315 in 1.27).
//!
//! After renewal, a component whose renewed files all reload is waited for (bounded by
//! `--reload-timeout`, 90 s by default: the apiserver re-reads its files about once a minute)
//! until its live probe serves the new certificate; one that reads a file it cannot reload, or
//! that did not reload within the bound, is restarted, and the reason is reported.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::node::catalog::names;
use crate::node::manifests::{Component, PodInfo, Version};

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

/// Default `--held-cert-margin`: kube-apiserver < 1.27 is restarted when the
/// apiserver-kubelet-client certificate it may still present on open connections expires
/// sooner than this.
pub const DEFAULT_HELD_CERT_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// What the reload decision is told besides the renewed files.
#[derive(Debug, Clone)]
pub struct ReloadOptions {
    /// `--component-version` and `--kubernetes-version`: versions that override the manifests'
    /// image tags.
    pub versions: BTreeMap<Component, Version>,
    /// `--held-cert-margin`.
    pub held_cert_margin: Duration,
}

impl Default for ReloadOptions {
    fn default() -> Self {
        ReloadOptions {
            versions: BTreeMap::new(),
            held_cert_margin: DEFAULT_HELD_CERT_MARGIN,
        }
    }
}

/// Where a component's version came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "from", content = "detail")]
pub enum Origin {
    /// The image tag of its static pod manifest (the image).
    ImageTag(String),
    /// `--component-version` or `--kubernetes-version`.
    Flag,
}

/// The version a component runs after a restart, and where it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentVersion {
    pub component: Component,
    pub version: Version,
    #[serde(flatten)]
    pub origin: Origin,
}

impl ComponentVersion {
    /// `1.20.2 (manifest image tag)`.
    fn describe(&self) -> String {
        match &self.origin {
            Origin::ImageTag(_) => format!("{} (manifest image tag)", self.version),
            Origin::Flag => format!("{} (given on the command line)", self.version),
        }
    }
}

/// The version of each of the four components: a flag first, else the image tag of its static
/// pod in `pods`; a component without either is left out (unknown).
pub fn versions(
    pods: &[(String, PodInfo)],
    overrides: &BTreeMap<Component, Version>,
) -> Vec<ComponentVersion> {
    let mut out = Vec::new();
    for c in Component::ALL {
        if let Some(v) = overrides.get(&c) {
            out.push(ComponentVersion {
                component: c,
                version: *v,
                origin: Origin::Flag,
            });
            continue;
        }
        let found = pods
            .iter()
            .find(|(_, p)| p.component() == Some(c))
            .and_then(|(_, p)| Some((p.version()?, p.image.clone()?)));
        if let Some((version, image)) = found {
            out.push(ComponentVersion {
                component: c,
                version,
                origin: Origin::ImageTag(image),
            });
        }
    }
    out
}

/// Whether a component picks up a renewed file by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// It serves the new file without a restart (typically within `typical`).
    Live { typical: Duration },
    /// It uses the new file without a restart (within `within`), but nothing certrotor probes
    /// presents it (front-proxy-client: the aggregator's client certificate).
    LiveUnobserved { within: Duration },
    /// New connections use the new file; a connection that stays open keeps the old one
    /// (kube-apiserver < 1.27's kubelet client pair): live while the old certificate stays
    /// valid beyond the margin, else a restart.
    LiveNewConnections,
    /// It must be restarted; `why` completes "restarted because <file> ...".
    Restart { why: &'static str },
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub component: Component,
    /// Catalog names (see `catalog::names`).
    pub files: &'static [&'static str],
    /// The first version (the component's own) the row holds for.
    pub since: Version,
    /// The first version it no longer holds for (a later row takes over); `None`: every later.
    pub until: Option<Version>,
    pub reload: Reload,
    /// The test or upstream reference that proves the row.
    pub proof: &'static str,
}

impl Row {
    fn holds_for(&self, v: Version) -> bool {
        v >= self.since && self.until.is_none_or(|u| v < u)
    }
}

const ANY: Version = Version::new(0, 0, 0);
/// The oldest kube-apiserver whose reloads are proven here (the tests' v1.20.2).
const APISERVER_PROVEN: Version = Version::new(1, 20, 0);
/// kubernetes#115315: kube-apiserver's kubelet client closes its connections on rotation.
const KUBELET_CLIENT_ROTATES: Version = Version::new(1, 27, 0);
/// etcd-io/etcd#7829: etcd reads its certificate files at every handshake.
const ETCD_RELOADS: Version = Version::new(3, 2, 0);
const KUBEADM_CONF: &str = "cannot be reloaded (kubeconfig with embedded data, read at start)";

/// The reload table (see the module documentation).
pub const TABLE: &[Row] = &[
    Row {
        component: Component::Etcd,
        files: &["etcd-server", "etcdadm-server"],
        since: ETCD_RELOADS,
        until: None,
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "platform::kubeadm_renews_reloads_etcd_live_restarts_the_rest_and_verifies",
    },
    Row {
        component: Component::Etcd,
        files: &["etcd-peer", "etcdadm-peer"],
        since: ETCD_RELOADS,
        until: None,
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "cluster::etcd_peer_renewal_keeps_the_leader",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver"],
        since: APISERVER_PROVEN,
        until: None,
        reload: Reload::Live {
            typical: Duration::from_secs(60),
        },
        proof: "cluster::apiserver_serves_renewed_cert_without_restart",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver-etcd-client"],
        since: APISERVER_PROVEN,
        until: None,
        // Read at every new connection to etcd; open connections stay authenticated with the
        // pair they were opened with (etcd checks a client certificate at the handshake only).
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "cluster::apiserver_serves_renewed_cert_without_restart",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["front-proxy-client"],
        since: APISERVER_PROVEN,
        until: None,
        reload: Reload::LiveUnobserved {
            within: Duration::from_secs(60),
        },
        proof: "platform::front_proxy_client_reloads_for_an_aggregated_api",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver-kubelet-client"],
        since: APISERVER_PROVEN,
        until: Some(KUBELET_CLIENT_ROTATES),
        reload: Reload::LiveNewConnections,
        proof: "platform::kubelet_client_pair_reloads_for_new_connections",
    },
    Row {
        component: Component::KubeApiserver,
        files: &["apiserver-kubelet-client"],
        since: KUBELET_CLIENT_ROTATES,
        until: None,
        reload: Reload::Live {
            typical: Duration::from_secs(0),
        },
        proof: "upstream: kubernetes#115315 (v1.27.0); new connections: \
                platform::kubelet_client_pair_reloads_for_new_connections",
    },
    Row {
        component: Component::KubeControllerManager,
        files: &["controller-manager.conf"],
        since: ANY,
        until: None,
        reload: Reload::Restart { why: KUBEADM_CONF },
        proof: "kubeconfig client-certificate-data",
    },
    Row {
        component: Component::KubeScheduler,
        files: &["scheduler.conf"],
        since: ANY,
        until: None,
        reload: Reload::Restart { why: KUBEADM_CONF },
        proof: "kubeconfig client-certificate-data",
    },
];

/// What a pass does with one component after renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Every renewed file it reads reloads: wait until it serves them.
    WaitLive,
    /// Restart it; the reason is printed ("restarted because ...").
    Restart { because: String },
}

/// An [`Action`] with the notes the pass report prints about it (what reloads without being
/// probed, what stays on open connections and until when).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub notes: Vec<String>,
}

/// What [`decide`] knows besides the renewed files.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub mode: RestartMode,
    /// The component's version; `None` when unknown.
    pub version: Option<&'a ComponentVersion>,
    /// The renewed certificates' previous NotAfter (Unix seconds), by catalog name.
    pub held: &'a [(String, i64)],
    /// Now (Unix seconds).
    pub now: i64,
    /// `--held-cert-margin`.
    pub margin: Duration,
}

/// Decides for `component`, which reads some of the renewed files `names`.
pub fn decide(component: Component, names: &[String], ctx: &Context<'_>) -> Decision {
    let read: Vec<&String> = names
        .iter()
        .filter(|n| Component::reading(n) == Some(component))
        .collect();
    let restart = |because: String| Decision {
        action: Action::Restart { because },
        notes: vec![],
    };
    if ctx.mode == RestartMode::Always {
        let files = read
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return restart(format!("--restart always ({files} changed)"));
    }
    if read.is_empty() {
        return restart("it reads a renewed file".into());
    }
    let mut cannot = Vec::new();
    let mut notes = Vec::new();
    for n in read {
        match file_decision(component, n, ctx) {
            Ok(Some(note)) => notes.push(note),
            Ok(None) => {}
            Err(why) => cannot.push(why),
        }
    }
    if cannot.is_empty() {
        Decision {
            action: Action::WaitLive,
            notes,
        }
    } else {
        restart(cannot.join("; "))
    }
}

/// One renewed file `n` read by `component`: `Ok` when it reloads (with a note for the
/// report, where there is something to say), `Err` with the reason to restart.
fn file_decision(
    component: Component,
    n: &str,
    ctx: &Context<'_>,
) -> Result<Option<String>, String> {
    let base = n.split('@').next().unwrap_or(n);
    let rows: Vec<&Row> = TABLE
        .iter()
        .filter(|r| r.component == component && r.files.contains(&base))
        .collect();
    if rows.is_empty() {
        return Err(format!("{n} is not in the reload table"));
    }
    if let Some(why) = rows.iter().find_map(|r| match r.reload {
        Reload::Restart { why } if r.since == ANY && r.until.is_none() => Some(why),
        _ => None,
    }) {
        return Err(format!("{n} {why}"));
    }
    let name = component.name();
    let Some(v) = ctx.version else {
        return Err(format!(
            "{n} is proven to reload only on known versions, and the version of {name} is \
             unknown (its image tag names none; give --component-version or \
             --kubernetes-version)"
        ));
    };
    let Some(row) = rows.iter().find(|r| r.holds_for(v.version)) else {
        let since = rows.iter().map(|r| r.since).min().unwrap_or(ANY);
        return Err(format!(
            "{n} is proven to reload from {name} {since} on, and this one is {}",
            v.describe()
        ));
    };
    match row.reload {
        Reload::Live { .. } => Ok(None),
        Reload::Restart { why } => Err(format!("{n} {why}")),
        Reload::LiveUnobserved { within } => Ok(Some(format!(
            "{n}: {name} {} takes it within {} s (1.23 and later: at once) for its next \
             request to an aggregated API server; nothing certrotor probes presents it",
            v.version,
            within.as_secs()
        ))),
        Reload::LiveNewConnections => {
            let held = ctx
                .held
                .iter()
                .find(|(h, _)| h.split('@').next() == Some(base))
                .map(|(_, t)| *t);
            let kept = format!(
                "{name} {} presents {n} on new connections to kubelets; a connection kept \
                 busy keeps the old certificate",
                v.version
            );
            let margin_h = ctx.margin.as_secs() / 3600;
            match held {
                Some(t)
                    if t - ctx.now > i64::try_from(ctx.margin.as_secs()).unwrap_or(i64::MAX) =>
                {
                    Ok(Some(format!(
                        "{kept}, valid until {} (beyond the {margin_h} h --held-cert-margin): \
                         not restarted",
                        crate::sys::clock::rfc3339(t)
                    )))
                }
                Some(t) => Err(format!(
                    "{kept}, which expires at {} (within the {margin_h} h --held-cert-margin)",
                    crate::sys::clock::rfc3339(t)
                )),
                None => Err(format!("{kept}, whose expiry is unknown")),
            }
        }
    }
}

/// After a rollback restored `names`: why `component` must be restarted although it reloads
/// them, or `None`. kube-apiserver before 1.27 keeps using the apiserver-kubelet-client pair a
/// connection to a kubelet was opened with while that connection stays busy, a refused pair
/// included (`platform::kubelet_client_pair_reloads_for_new_connections`).
pub fn restart_after_rollback(
    component: Component,
    names: &[String],
    version: Option<&ComponentVersion>,
) -> Option<String> {
    let restored = names
        .iter()
        .any(|n| n.split('@').next() == Some(names::APISERVER_KUBELET_CLIENT));
    if component != Component::KubeApiserver || !restored {
        return None;
    }
    match version {
        Some(v) if v.version >= KUBELET_CLIENT_ROTATES => None,
        Some(v) => Some(format!(
            "the rollback restored apiserver-kubelet-client, and kube-apiserver {} keeps the \
             renewed pair, refused or not, on connections to kubelets that stay busy",
            v.describe()
        )),
        None => Some(
            "the rollback restored apiserver-kubelet-client, and a kube-apiserver of unknown \
             version may keep the renewed pair on connections to kubelets that stay busy"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests;
