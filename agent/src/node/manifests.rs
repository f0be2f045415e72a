//! Static pod manifests read back for what the restart step needs: the component, its endpoint,
//! its flags, and the other static pods that mount a renewed file. (The ones `lab init` writes
//! are made in the lab stage, `lab::manifests`.)
//!
//! Paths inside a manifest are the container's (`/etc/kubernetes/pki/...`); `hostPath` volumes
//! say where they are on the node. On Bottlerocket (EKS Anywhere) `/var/lib/kubeadm/pki` is
//! mounted at `/etc/kubernetes/pki`, so the same command lines work on both layouts.

use std::net::{IpAddr, SocketAddr};

use serde_norway::Value;

/// Standard ports (kubeadm defaults).
pub mod ports {
    pub const ETCD_CLIENT: u16 = 2379;
    pub const ETCD_PEER: u16 = 2380;
    pub const ETCD_METRICS: u16 = 2381;
    pub const APISERVER: u16 = 6443;
    pub const CONTROLLER_MANAGER: u16 = 10257;
    pub const SCHEDULER: u16 = 10259;
    /// The lab's kube-vip stand-in's health port.
    pub const KUBE_VIP_HEALTH: u16 = 2112;
}

/// The control-plane components certrotor restarts, in restart order.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Component {
    Etcd,
    KubeApiserver,
    KubeControllerManager,
    KubeScheduler,
}

impl Component {
    /// All components, in restart order.
    pub const ALL: [Component; 4] = [
        Component::Etcd,
        Component::KubeApiserver,
        Component::KubeControllerManager,
        Component::KubeScheduler,
    ];

    /// The static pod and binary name.
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiserver => "kube-apiserver",
            Component::KubeControllerManager => "kube-controller-manager",
            Component::KubeScheduler => "kube-scheduler",
        }
    }

    /// Which component reads a certificate of this catalog name at start-up.
    pub fn reading(cert_name: &str) -> Option<Component> {
        let base = cert_name.split('@').next().unwrap_or(cert_name);
        match base {
            "etcd-server" | "etcd-peer" | "etcdadm-server" | "etcdadm-peer" => {
                Some(Component::Etcd)
            }
            "apiserver"
            | "apiserver-kubelet-client"
            | "front-proxy-client"
            | "apiserver-etcd-client" => Some(Component::KubeApiserver),
            "controller-manager.conf" => Some(Component::KubeControllerManager),
            "scheduler.conf" => Some(Component::KubeScheduler),
            _ => None,
        }
    }
}

/// A static pod (other than the four control-plane components, which the reload table covers)
/// that mounts a renewed file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Consumer {
    /// The static pod (Bottlerocket: its setting name; kubeadm: its manifest file).
    pub pod: String,
    /// The renewed file, relative to the node root.
    pub file: String,
    /// Mounted as a single file (a bind mount of the inode: a rename never reaches it).
    pub single_file: bool,
    /// What the pod sees, and what to do.
    pub reason: String,
}

/// The static pods in `pods` other than the four components whose hostPath volumes hold a
/// renewed file (`renewed`: paths relative to `root`): the volume is the file itself, or a
/// folder above it.
pub fn other_consumers(
    root: &std::path::Path,
    pods: &[(String, PodInfo)],
    renewed: &[String],
) -> Vec<Consumer> {
    let mut out = Vec::new();
    for (pod, info) in pods.iter().filter(|(_, i)| i.component().is_none()) {
        for file in renewed {
            let hit = info.host_paths.iter().find_map(|hp| {
                let hp = hp.trim_start_matches('/').trim_end_matches('/');
                if hp == file {
                    Some(true)
                } else if hp.is_empty() || file.starts_with(&format!("{hp}/")) {
                    Some(root.join(hp).is_file())
                } else {
                    None
                }
            });
            let Some(single_file) = hit else { continue };
            let reason = if single_file {
                format!(
                    "static pod '{pod}' mounts {file} as a single file: after the renewal's \
                     rename it keeps the old file until it is restarted"
                )
            } else {
                format!(
                    "static pod '{pod}' mounts the folder of {file}; whether it reloads the file \
                     is unknown"
                )
            };
            out.push(Consumer {
                pod: pod.clone(),
                file: file.clone(),
                single_file,
                reason,
            });
        }
    }
    out
}

/// A static pod manifest, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub name: String,
    /// The first container's command and args.
    pub argv: Vec<String>,
    /// The paths of its hostPath volumes (on the node).
    pub host_paths: Vec<String>,
    /// Its first container's HTTPS liveness (else readiness) probe: address and path.
    pub health: Option<(SocketAddr, String)>,
}

impl PodInfo {
    /// Parses a Pod manifest (YAML).
    pub fn parse(yaml: &[u8]) -> Option<PodInfo> {
        crate::node::kubeconfig::check_yaml_shape(std::str::from_utf8(yaml).ok()?).ok()?;
        let doc: Value = serde_norway::from_slice(yaml).ok()?;
        let name = doc.get("metadata")?.get("name")?.as_str()?.to_string();
        let container = doc.get("spec")?.get("containers")?.as_sequence()?.first()?;
        let mut argv = Vec::new();
        for key in ["command", "args"] {
            if let Some(list) = container.get(key).and_then(Value::as_sequence) {
                argv.extend(list.iter().filter_map(Value::as_str).map(str::to_string));
            }
        }
        let host_paths = doc
            .get("spec")?
            .get("volumes")
            .and_then(Value::as_sequence)
            .map(|v| {
                v.iter()
                    .filter_map(|vol| vol.get("hostPath")?.get("path")?.as_str())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let health = ["livenessProbe", "readinessProbe"].iter().find_map(|k| {
            let get = container.get(k)?.get("httpGet")?;
            if get.get("scheme").and_then(Value::as_str) != Some("HTTPS") {
                return None;
            }
            let port = u16::try_from(get.get("port")?.as_u64()?).ok()?;
            let ip: IpAddr = match get.get("host").and_then(Value::as_str) {
                Some(h) => h.parse().ok()?,
                None => IpAddr::from([127, 0, 0, 1]),
            };
            let path = get
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("/")
                .to_string();
            Some((SocketAddr::new(ip, port), path))
        });
        Some(PodInfo {
            name,
            argv,
            host_paths,
            health,
        })
    }

    /// The component this pod runs, by its binary or pod name.
    pub fn component(&self) -> Option<Component> {
        let binary = self
            .argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a))
            .unwrap_or("");
        Component::ALL.into_iter().find(|c| {
            binary == c.name()
                || self.name == c.name()
                || self.name.starts_with(&format!("{}-", c.name()))
        })
    }

    /// The value of `--flag` (`--flag=value` or `--flag value`).
    pub fn flag(&self, flag: &str) -> Option<&str> {
        let eq = format!("--{flag}=");
        let bare = format!("--{flag}");
        let mut it = self.argv.iter();
        while let Some(a) = it.next() {
            if let Some(v) = a.strip_prefix(&eq) {
                return Some(v);
            }
            if a == &bare {
                return it.next().map(String::as_str);
            }
        }
        None
    }

    /// The address certrotor probes for this component's health.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        match self.component()? {
            Component::Etcd => {
                let urls = self
                    .flag("listen-client-urls")
                    .or_else(|| self.flag("advertise-client-urls"))?;
                urls.split(',').find_map(parse_https_url)
            }
            Component::KubeApiserver => {
                let port = self
                    .flag("secure-port")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(ports::APISERVER);
                let ip: IpAddr = self
                    .flag("advertise-address")
                    .or_else(|| self.flag("bind-address"))
                    .and_then(|a| a.parse().ok())
                    .filter(|ip: &IpAddr| !ip.is_unspecified())
                    .unwrap_or(IpAddr::from([127, 0, 0, 1]));
                Some(SocketAddr::new(ip, port))
            }
            c @ (Component::KubeControllerManager | Component::KubeScheduler) => {
                let default = if c == Component::KubeScheduler {
                    ports::SCHEDULER
                } else {
                    ports::CONTROLLER_MANAGER
                };
                let port = self
                    .flag("secure-port")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(default);
                let ip: IpAddr = self
                    .flag("bind-address")
                    .and_then(|a| a.parse().ok())
                    .filter(|ip: &IpAddr| !ip.is_unspecified())
                    .unwrap_or(IpAddr::from([127, 0, 0, 1]));
                Some(SocketAddr::new(ip, port))
            }
        }
    }
}

/// `https://1.2.3.4:2379` → a socket address (IP literals only: no DNS lookups).
pub fn parse_https_url(url: &str) -> Option<SocketAddr> {
    let rest = url.trim().strip_prefix("https://")?;
    let host_port = rest.split('/').next()?;
    host_port.parse().ok()
}
