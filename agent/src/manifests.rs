//! Static pod manifests: the ones `lab init` writes (as kubeadm and etcdadm write them), and
//! reading a manifest back for what the restart step needs (the component, its endpoint).
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

/// What `lab init` needs to write manifests.
#[derive(Debug, Clone)]
pub struct ManifestParams<'a> {
    /// The kubeadm folder on the node (`/etc/kubernetes` or `/var/lib/kubeadm`).
    pub kubeadm_dir: &'a str,
    pub node_name: &'a str,
    pub advertise_address: IpAddr,
    /// Added to every standard port, so that lab nodes can run side by side.
    pub port_offset: u16,
    /// `https://host:port` of an external etcd, or `None` for stacked etcd.
    pub external_etcd: Option<String>,
    /// The etcd client certificate file name under `pki/` (Bottlerocket external etcd:
    /// `server-etcd-client.crt`).
    pub etcd_client_cert: &'a str,
}

fn url(ip: IpAddr, port: u16) -> String {
    format!("https://{}", crate::lab::socket_text(ip, port))
}

/// The images kubeadm v1.20.2 writes (`k8s.gcr.io`, etcd 3.4.13-0).
fn image(name: &str) -> String {
    match name {
        "etcd" => "k8s.gcr.io/etcd:3.4.13-0".into(),
        _ => format!("k8s.gcr.io/{name}:v1.20.2"),
    }
}

fn pod(name: &str, command: &[String], mounts: &[(&str, &str, &str)]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    component: {name}\n    tier: control-plane\n  name: {name}\n  namespace: kube-system\nspec:\n  containers:\n  - command:\n"
    );
    for c in command {
        y.push_str(&format!("    - {c}\n"));
    }
    y.push_str(&format!(
        "    image: {}\n    name: {name}\n    volumeMounts:\n",
        image(name)
    ));
    for (vol, _, mount) in mounts {
        y.push_str(&format!("    - mountPath: {mount}\n      name: {vol}\n"));
    }
    y.push_str("  hostNetwork: true\n  priority: 2000001000\n  priorityClassName: system-node-critical\n  volumes:\n");
    for (vol, host, _) in mounts {
        y.push_str(&format!(
            "  - hostPath:\n      path: {host}\n    name: {vol}\n"
        ));
    }
    y
}

/// The four control-plane manifests of a kubeadm node (three with external etcd), as
/// `(file name, YAML)`: the command lines kubeadm v1.20.2 writes
/// (`cmd/kubeadm/app/phases/controlplane/manifests.go`, `phases/etcd/local.go`), so that the
/// real binaries run them, plus `--secure-port` of the controller-manager and scheduler when the
/// lab shifts ports. Insecure ports are off (`--insecure-port=0`, `--port=0`), as kubeadm sets
/// them, so that lab nodes can run side by side.
pub fn control_plane(p: &ManifestParams<'_>) -> Vec<(String, String)> {
    let adv = p.advertise_address;
    let off = p.port_offset;
    let k = p.kubeadm_dir;
    let pki = "/etc/kubernetes/pki";
    let mut out = Vec::new();
    let etcd_servers = match &p.external_etcd {
        Some(u) => u.clone(),
        None => {
            let client = ports::ETCD_CLIENT + off;
            let peer = ports::ETCD_PEER + off;
            let mut listen = vec![url([127, 0, 0, 1].into(), client)];
            if !adv.is_loopback() {
                listen.push(url(adv, client));
            }
            let cmd: Vec<String> = vec![
                "etcd".into(),
                format!("--advertise-client-urls={}", url(adv, client)),
                format!("--cert-file={pki}/etcd/server.crt"),
                "--client-cert-auth=true".into(),
                "--data-dir=/var/lib/etcd".into(),
                format!("--initial-advertise-peer-urls={}", url(adv, peer)),
                format!("--initial-cluster={}={}", p.node_name, url(adv, peer)),
                format!("--key-file={pki}/etcd/server.key"),
                format!("--listen-client-urls={}", listen.join(",")),
                format!(
                    "--listen-metrics-urls=http://127.0.0.1:{}",
                    ports::ETCD_METRICS + off
                ),
                format!("--listen-peer-urls={}", url(adv, peer)),
                format!("--name={}", p.node_name),
                format!("--peer-cert-file={pki}/etcd/peer.crt"),
                "--peer-client-cert-auth=true".into(),
                format!("--peer-key-file={pki}/etcd/peer.key"),
                format!("--peer-trusted-ca-file={pki}/etcd/ca.crt"),
                "--snapshot-count=10000".into(),
                format!("--trusted-ca-file={pki}/etcd/ca.crt"),
            ];
            let host_pki = format!("{k}/pki/etcd");
            out.push((
                "etcd.yaml".to_string(),
                pod(
                    "etcd",
                    &cmd,
                    &[
                        ("etcd-certs", &host_pki, "/etc/kubernetes/pki/etcd"),
                        ("etcd-data", "/var/lib/etcd", "/var/lib/etcd"),
                    ],
                ),
            ));
            url([127, 0, 0, 1].into(), client)
        }
    };
    let api: Vec<String> = vec![
        "kube-apiserver".into(),
        format!("--advertise-address={adv}"),
        "--allow-privileged=true".into(),
        "--authorization-mode=Node,RBAC".into(),
        format!("--client-ca-file={pki}/ca.crt"),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--enable-bootstrap-token-auth=true".into(),
        format!("--etcd-cafile={pki}/etcd/ca.crt"),
        format!("--etcd-certfile={pki}/{}", p.etcd_client_cert),
        format!("--etcd-keyfile={pki}/apiserver-etcd-client.key"),
        format!("--etcd-servers={etcd_servers}"),
        "--insecure-port=0".into(),
        format!("--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt"),
        format!("--kubelet-client-key={pki}/apiserver-kubelet-client.key"),
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        format!("--proxy-client-cert-file={pki}/front-proxy-client.crt"),
        format!("--proxy-client-key-file={pki}/front-proxy-client.key"),
        "--requestheader-allowed-names=front-proxy-client".into(),
        format!("--requestheader-client-ca-file={pki}/front-proxy-ca.crt"),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        format!("--secure-port={}", ports::APISERVER + off),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={pki}/sa.pub"),
        format!("--service-account-signing-key-file={pki}/sa.key"),
        "--service-cluster-ip-range=10.96.0.0/12".into(),
        format!("--tls-cert-file={pki}/apiserver.crt"),
        format!("--tls-private-key-file={pki}/apiserver.key"),
    ];
    let host_pki = format!("{k}/pki");
    out.push((
        "kube-apiserver.yaml".into(),
        pod("kube-apiserver", &api, &[("k8s-certs", &host_pki, pki)]),
    ));
    for (name, conf, port) in [
        (
            "kube-controller-manager",
            "controller-manager.conf",
            ports::CONTROLLER_MANAGER + off,
        ),
        ("kube-scheduler", "scheduler.conf", ports::SCHEDULER + off),
    ] {
        let kubeconfig = format!("/etc/kubernetes/{conf}");
        let mut cmd: Vec<String> = vec![
            name.into(),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=true".into(),
            "--port=0".into(),
            format!("--secure-port={port}"),
        ];
        if name == "kube-controller-manager" {
            cmd.extend([
                format!("--client-ca-file={pki}/ca.crt"),
                "--cluster-name=kubernetes".into(),
                format!("--cluster-signing-cert-file={pki}/ca.crt"),
                format!("--cluster-signing-key-file={pki}/ca.key"),
                "--controllers=*,bootstrapsigner,tokencleaner".into(),
                format!("--requestheader-client-ca-file={pki}/front-proxy-ca.crt"),
                format!("--root-ca-file={pki}/ca.crt"),
                format!("--service-account-private-key-file={pki}/sa.key"),
                "--use-service-account-credentials=true".into(),
            ]);
        }
        // kubeadm writes the flags sorted by name.
        cmd[1..].sort();
        let host_conf = format!("{k}/{conf}");
        out.push((
            format!("{name}.yaml"),
            pod(
                name,
                &cmd,
                &[
                    ("kubeconfig", &host_conf, &kubeconfig),
                    ("k8s-certs", &host_pki, pki),
                ],
            ),
        ));
    }
    out
}

/// The etcd manifest of an etcdadm node run by the kubelet (`--init-system kubelet`).
pub fn etcdadm_etcd(
    etcd_pki_dir: &str,
    member: &str,
    ip: IpAddr,
    port_offset: u16,
) -> (String, String) {
    let client = ports::ETCD_CLIENT + port_offset;
    let peer = ports::ETCD_PEER + port_offset;
    let mut listen = vec![url([127, 0, 0, 1].into(), client)];
    if !ip.is_loopback() {
        listen.push(url(ip, client));
    }
    let pki = "/etc/etcd/pki";
    let cmd: Vec<String> = vec![
        "etcd".into(),
        format!("--advertise-client-urls={}", url(ip, client)),
        format!("--cert-file={pki}/server.crt"),
        "--client-cert-auth=true".into(),
        "--data-dir=/var/lib/etcd/data".into(),
        format!("--initial-advertise-peer-urls={}", url(ip, peer)),
        format!("--initial-cluster={member}={}", url(ip, peer)),
        format!("--key-file={pki}/server.key"),
        format!("--listen-client-urls={}", listen.join(",")),
        format!("--listen-peer-urls={}", url(ip, peer)),
        format!("--name={member}"),
        format!("--peer-cert-file={pki}/peer.crt"),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-key-file={pki}/peer.key"),
        format!("--peer-trusted-ca-file={pki}/ca.crt"),
        format!("--trusted-ca-file={pki}/ca.crt"),
    ];
    let host = format!("/{}", etcd_pki_dir.trim_start_matches('/'));
    (
        "etcd.yaml".into(),
        pod(
            "etcd",
            &cmd,
            &[
                ("etcd-certs", &host, pki),
                ("etcd-data", "/var/lib/etcd/data", "/var/lib/etcd/data"),
            ],
        ),
    )
}

/// A kube-vip-like static pod, as EKS Anywhere runs on control planes to hold the API VIP: it
/// mounts the admin kubeconfig (`admin.conf`; `super-admin.conf` on newer releases) as a
/// single-file hostPath. In the lab its command is the k8s-sim kube-vip stand-in (it reads the
/// kubeconfig at start and is healthy only while its client certificate reaches the apiserver);
/// its liveness probe is what certrotor verifies it by.
pub fn kube_vip(kubeadm_dir: &str, port_offset: u16) -> (String, String) {
    let port = ports::KUBE_VIP_HEALTH + port_offset;
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: kube-vip\n  namespace: kube-system\nspec:\n  \
         containers:\n  - command:\n    - kube-vip\n    - --kubeconfig=/etc/kubernetes/admin.conf\n    \
         - --bind-address=127.0.0.1\n    - --secure-port={port}\n    \
         image: ghcr.io/kube-vip/kube-vip:v0.8.9\n    livenessProbe:\n      httpGet:\n        \
         host: 127.0.0.1\n        path: /healthz\n        port: {port}\n        scheme: HTTPS\n    \
         name: kube-vip\n    volumeMounts:\n    - mountPath: /etc/kubernetes/admin.conf\n      \
         name: kubeconfig\n  hostNetwork: true\n  volumes:\n  - hostPath:\n      \
         path: {kubeadm_dir}/admin.conf\n      type: FileOrCreate\n    name: kubeconfig\n"
    );
    ("kube-vip.yaml".into(), yaml)
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
        crate::kubeconfig::check_yaml_shape(std::str::from_utf8(yaml).ok()?).ok()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_to_endpoints() {
        let p = ManifestParams {
            kubeadm_dir: "/var/lib/kubeadm",
            node_name: "cp-1",
            advertise_address: [10, 0, 0, 10].into(),
            port_offset: 100,
            external_etcd: None,
            etcd_client_cert: "apiserver-etcd-client.crt",
        };
        let m = control_plane(&p);
        assert_eq!(m.len(), 4);
        let pods: Vec<PodInfo> = m
            .iter()
            .map(|(_, y)| PodInfo::parse(y.as_bytes()).unwrap())
            .collect();
        let find = |c| pods.iter().find(|p| p.component() == Some(c)).unwrap();
        assert_eq!(
            find(Component::Etcd).endpoint(),
            Some("127.0.0.1:2479".parse().unwrap())
        );
        assert_eq!(
            find(Component::KubeApiserver).endpoint(),
            Some("10.0.0.10:6543".parse().unwrap())
        );
        assert_eq!(
            find(Component::KubeScheduler).endpoint(),
            Some("127.0.0.1:10359".parse().unwrap())
        );
        assert_eq!(
            find(Component::KubeApiserver).flag("etcd-servers"),
            Some("https://127.0.0.1:2479")
        );
        assert!(m[0].1.contains("path: /var/lib/kubeadm/pki/etcd"));
        assert_eq!(
            Component::reading("apiserver-etcd-client"),
            Some(Component::KubeApiserver)
        );
        assert_eq!(Component::reading("admin.conf"), None);
    }

    #[test]
    fn kube_vip_is_a_consumer_of_admin_conf() {
        let dir = std::env::temp_dir().join(format!("certrotor-kv-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("var/lib/kubeadm/pki")).unwrap();
        std::fs::write(dir.join("var/lib/kubeadm/admin.conf"), b"x").unwrap();
        let p = ManifestParams {
            kubeadm_dir: "/var/lib/kubeadm",
            node_name: "cp-1",
            advertise_address: [10, 0, 0, 10].into(),
            port_offset: 0,
            external_etcd: None,
            etcd_client_cert: "apiserver-etcd-client.crt",
        };
        let mut pods: Vec<(String, PodInfo)> = control_plane(&p)
            .into_iter()
            .chain([kube_vip("/var/lib/kubeadm", 0)])
            .map(|(f, y)| (f, PodInfo::parse(y.as_bytes()).unwrap()))
            .collect();
        let kv = &pods.last().unwrap().1;
        assert_eq!(kv.component(), None);
        assert_eq!(kv.host_paths, ["/var/lib/kubeadm/admin.conf"]);
        assert_eq!(
            kv.health,
            Some(("127.0.0.1:2112".parse().unwrap(), "/healthz".to_string()))
        );
        let renewed = vec![
            "var/lib/kubeadm/admin.conf".to_string(),
            "var/lib/kubeadm/pki/apiserver.crt".to_string(),
        ];
        let c = other_consumers(&dir, &pods, &renewed);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].pod, "kube-vip.yaml");
        assert!(c[0].single_file);
        // A pod mounting the folder holding a renewed file is a consumer too.
        pods[4].1.host_paths = vec!["/var/lib/kubeadm/pki".into()];
        let c = other_consumers(&dir, &pods, &renewed);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].file, "var/lib/kubeadm/pki/apiserver.crt");
        assert!(!c[0].single_file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
