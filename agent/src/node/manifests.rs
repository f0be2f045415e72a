//! Static pod manifests read back for what the restart step needs: the component, its endpoint,
//! its flags, its version (from the image tag), and the other static pods that mount a renewed
//! file. (The ones `lab init` writes are made in the lab stage, `lab::manifests`.)
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
    /// kube-vip's Prometheus metrics port (`prometheus_server`, plain HTTP); the lab's
    /// probe-ful kube-vip stand-in serves its HTTPS health there instead.
    pub const KUBE_VIP_METRICS: u16 = 2112;
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
/// folder above it. certrotor's own static pod (plain kubeadm nodes,
/// `bottlerocket/packaging/certrotor-static-pod.yaml`) mounts the folders it renews but is no
/// consumer: it reads every file afresh at each pass, and restarting it would end the pass
/// doing the restart.
pub fn other_consumers(
    root: &std::path::Path,
    pods: &[(String, PodInfo)],
    renewed: &[String],
) -> Vec<Consumer> {
    let mut out = Vec::new();
    for (pod, info) in pods
        .iter()
        .filter(|(_, i)| i.component().is_none() && !i.runs_certrotor())
    {
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
    /// Its first container's image, as written (`registry/repository:tag@digest`).
    pub image: Option<String>,
    /// Its first container's environment variables with a literal `value` (not `valueFrom`).
    pub env: Vec<(String, String)>,
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
        let image = container
            .get("image")
            .and_then(Value::as_str)
            .map(str::to_string);
        let env = container
            .get("env")
            .and_then(Value::as_sequence)
            .map(|list| {
                list.iter()
                    .filter_map(|e| {
                        let name = e.get("name")?.as_str()?;
                        let value = e.get("value")?.as_str()?;
                        Some((name.to_string(), value.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(PodInfo {
            name,
            argv,
            host_paths,
            health,
            image,
            env,
        })
    }

    /// The version the pod runs, from its image tag (see [`image_version`]): what the node
    /// runs after a restart, which is what a reload decision is about.
    pub fn version(&self) -> Option<Version> {
        image_version(self.image.as_deref()?)
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

    /// Whether this pod runs certrotor itself: its command is `certrotor` (any folder), or it
    /// has no command and its image's repository is named `certrotor`.
    pub fn runs_certrotor(&self) -> bool {
        let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
        if self.argv.first().is_some_and(|a| base(a) == "certrotor") {
            return true;
        }
        // A command of its own (a path) is another program, whatever the image.
        let own_command = self.argv.first().is_some_and(|a| a.contains('/'));
        let image_is_certrotor = self.image.as_deref().is_some_and(|i| {
            let repo = i.split('@').next().unwrap_or(i);
            // After the last '/', a ':' starts the tag (a registry's port comes before it).
            base(repo).split(':').next() == Some("certrotor")
        });
        !own_command && image_is_certrotor
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

/// A component version, `major.minor.patch` (Kubernetes `1.31.4`, etcd `3.5.16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Version {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses an image tag's version: one leading `v`, then `X.Y` or `X.Y.Z`; what follows
    /// (`-eks-1-31-12`, etcd's `-0`, `+build`) is ignored. A pre-release (`-alpha.N`,
    /// `-beta.N`, `-rc.N`) counts as the previous minor, `X.(Y-1).0`: a fix merged during a
    /// release cycle may be missing from its early pre-releases. `None` for anything else
    /// (`latest`, `3`, `v1.x`).
    pub fn parse_tag(tag: &str) -> Option<Version> {
        let text = tag.strip_prefix('v').unwrap_or(tag);
        let (numbers, rest) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
            Some(i) => text.split_at(i),
            None => (text, ""),
        };
        let numbers = numbers.trim_end_matches('.');
        let parts: Vec<&str> = numbers.split('.').collect();
        let num = |s: &str| -> Option<u32> {
            if s.is_empty() || s.len() > 9 {
                return None;
            }
            s.parse().ok()
        };
        let v = match parts.as_slice() {
            [a, b] => Version::new(num(a)?, num(b)?, 0),
            [a, b, c] => Version::new(num(a)?, num(b)?, num(c)?),
            _ => return None,
        };
        let lower = rest.to_ascii_lowercase();
        let pre = ["-alpha", "-beta", "-rc"]
            .iter()
            .any(|p| lower.starts_with(p));
        if pre {
            return v.minor.checked_sub(1).map(|m| Version::new(v.major, m, 0));
        }
        Some(v)
    }

    /// Parses a version given on the command line: `X.Y` or `X.Y.Z`, one leading `v` allowed,
    /// nothing after.
    pub fn parse_flag(text: &str) -> Option<Version> {
        let bare = text.strip_prefix('v').unwrap_or(text);
        if bare.is_empty() || !bare.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return None;
        }
        Version::parse_tag(bare)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl serde::Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The version in an image reference: the tag is the text after the last `:` when that `:`
/// comes after the last `/` (a registry port is not a tag), without a `@digest`; then
/// [`Version::parse_tag`]. `None` without a tag or with one that names no version.
///
/// `public.ecr.aws/eks-distro/kubernetes/kube-apiserver:v1.31.4-eks-1-31-12` → 1.31.4,
/// `k8s.gcr.io/etcd:3.4.13-0` → 3.4.13, `host:5000/x/kube-apiserver@sha256:…` → none.
pub fn image_version(image: &str) -> Option<Version> {
    let image = image.split('@').next()?;
    let after_slash = image.rfind('/').map_or(0, |i| i + 1);
    let colon = after_slash + image.get(after_slash..)?.rfind(':')?;
    Version::parse_tag(image.get(colon + 1..)?)
}

/// `https://1.2.3.4:2379` → a socket address (IP literals only: no DNS lookups).
pub fn parse_https_url(url: &str) -> Option<SocketAddr> {
    let rest = url.trim().strip_prefix("https://")?;
    let host_port = rest.split('/').next()?;
    host_port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_image_tags() {
        let v = |a, b, c| Some(Version::new(a, b, c));
        for (image, want) in [
            (
                "public.ecr.aws/eks-distro/kubernetes/kube-apiserver:v1.31.4-eks-1-31-12",
                v(1, 31, 4),
            ),
            ("registry.k8s.io/kube-apiserver:v1.30.2", v(1, 30, 2)),
            ("k8s.gcr.io/etcd:3.4.13-0", v(3, 4, 13)),
            (
                "public.ecr.aws/eks-distro/etcd-io/etcd:v3.5.16-eks-1-31-12",
                v(3, 5, 16),
            ),
            (
                "host:5000/x/kube-apiserver:v1.29.1@sha256:0123abcd",
                v(1, 29, 1),
            ),
            ("registry.k8s.io/kube-apiserver:v1.27", v(1, 27, 0)),
            // Pre-releases count as the previous minor.
            (
                "registry.k8s.io/kube-apiserver:v1.27.0-alpha.2",
                v(1, 26, 0),
            ),
            ("registry.k8s.io/kube-apiserver:v1.27.0-rc.1", v(1, 26, 0)),
            (
                "registry.k8s.io/kube-apiserver:v1.27.0+build.1",
                v(1, 27, 0),
            ),
            // No version: a registry port is no tag; latest; digests only; nonsense.
            ("host:5000/x/kube-apiserver", None),
            ("host:5000/x/kube-apiserver@sha256:0123abcd", None),
            ("registry.k8s.io/kube-apiserver:latest", None),
            ("registry.k8s.io/kube-apiserver:v1", None),
            ("registry.k8s.io/kube-apiserver:v1.x.3", None),
            ("registry.k8s.io/kube-apiserver:1.2.3.4", None),
            ("registry.k8s.io/kube-apiserver:v0.0-alpha.1", None),
            ("kube-apiserver:v1.20.2", v(1, 20, 2)),
            ("", None),
        ] {
            assert_eq!(image_version(image), want, "{image}");
        }
        assert!(Version::new(1, 26, 15) < Version::new(1, 27, 0));
        assert_eq!(Version::new(1, 31, 4).to_string(), "1.31.4");
        assert_eq!(Version::parse_flag("v1.31.4"), v(1, 31, 4));
        assert_eq!(Version::parse_flag("1.31.4-eks-1"), None);
        assert_eq!(Version::parse_flag("1.31.4.0"), None);
    }

    #[test]
    fn pod_image_and_literal_env() {
        let yaml = "metadata: {name: kube-vip}\nspec:\n  containers:\n  - args: [manager]\n    \
                    image: ghcr.io/kube-vip/kube-vip:v0.8.9\n    env:\n    - {name: port, value: \"6443\"}\n    \
                    - name: node\n      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}\n";
        let p = PodInfo::parse(yaml.as_bytes()).unwrap();
        assert_eq!(p.image.as_deref(), Some("ghcr.io/kube-vip/kube-vip:v0.8.9"));
        assert_eq!(p.env, [("port".to_string(), "6443".to_string())]);
        assert_eq!(p.version(), Some(Version::new(0, 8, 9)));
        assert_eq!(p.argv, ["manager"]);
    }

    /// The static pod certrotor ships for plain kubeadm nodes.
    const SHIPPED: &str = include_str!("../../../bottlerocket/packaging/certrotor-static-pod.yaml");

    fn pod(yaml: &str) -> PodInfo {
        PodInfo::parse(yaml.as_bytes()).unwrap()
    }

    #[test]
    fn certrotor_is_never_a_consumer_of_what_it_renews() {
        let own = pod(SHIPPED);
        assert!(own.runs_certrotor(), "{own:?}");
        assert_eq!(own.component(), None);
        assert_eq!(own.host_paths, ["/"]);
        let other = pod(
            "metadata: {name: watcher}\nspec:\n  containers:\n  - {image: registry.example.com/watcher:1, command: [/bin/watch]}\n  volumes:\n  - {name: h, hostPath: {path: /}}\n",
        );
        assert!(!other.runs_certrotor());
        let pods = vec![
            ("certrotor.yaml".to_string(), own),
            ("watcher.yaml".to_string(), other),
        ];
        let renewed = ["etc/kubernetes/pki/apiserver.crt".to_string()];
        let found = other_consumers(std::path::Path::new("/nonexistent"), &pods, &renewed);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pod, "watcher.yaml");
    }

    #[test]
    fn certrotor_is_known_by_its_command_or_its_image() {
        let with = |image: &str, command: &str| {
            pod(&format!(
                "metadata: {{name: x}}\nspec:\n  containers:\n  - {{image: '{image}', {command}}}\n"
            ))
            .runs_certrotor()
        };
        assert!(with("a/b:1", "command: [certrotor, daemon]"));
        assert!(with("registry:5000/certrotor:0.1.0", "args: [daemon]"));
        assert!(with(
            "registry.example.com/ops/certrotor@sha256:ab",
            "args: [daemon]"
        ));
        assert!(!with("registry:5000/certrotor-exporter:1", "args: [x]"));
        assert!(!with(
            "registry.example.com/certrotor:1",
            "command: [/bin/sh, -c, x]"
        ));
        assert!(!with("certrotor.example.com/tool:1", "args: [x]"));
    }
}
