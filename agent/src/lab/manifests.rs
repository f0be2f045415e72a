//! The static pod manifests `lab init` writes, as kubeadm v1.20.2 and etcdadm write them (and
//! kube-vip as EKS Anywhere renders it), so that the real binaries run them. Paths inside a
//! manifest are the container's (`/etc/kubernetes/pki/...`); `hostPath` volumes say where they
//! are on the node.
//!
//! The images are those kubeadm writes for the Kubernetes version `lab init` is given (default
//! v1.20.2, the binaries the tests run), so that certrotor reads that version back from the
//! image tags; the command lines stay kubeadm v1.20.2's whatever the version, because the
//! binaries that run them are v1.20.2 (kubeadm 1.24 and later no longer write
//! `--insecure-port=0` and `--port=0`, which the lab needs to run nodes side by side).

use std::net::IpAddr;

use crate::node::manifests::{Version, ports};

/// The Kubernetes version `lab init` writes manifests for by default: the binaries the tests
/// run (`images/k8s/build.sh`).
pub const DEFAULT_KUBERNETES_VERSION: Version = Version::new(1, 20, 2);

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
    /// The Kubernetes version whose images the manifests name.
    pub kubernetes_version: Version,
}

fn url(ip: IpAddr, port: u16) -> String {
    format!("https://{}", super::socket_text(ip, port))
}

/// The image kubeadm writes for `name` in Kubernetes `v`: `k8s.gcr.io` before 1.25,
/// `registry.k8s.io` from 1.25 on (kubernetes#109938; patch releases of 1.22-1.24 from
/// December 2022 switched too, which the lab does not follow), etcd as kubeadm's
/// `SupportedEtcdVersion` lists it for that minor at its first release.
pub fn image(name: &str, v: Version) -> String {
    let registry = if v >= Version::new(1, 25, 0) {
        "registry.k8s.io"
    } else {
        "k8s.gcr.io"
    };
    match name {
        "etcd" => format!("{registry}/etcd:{}", etcd_tag(v)),
        _ => format!("{registry}/{name}:v{v}"),
    }
}

/// kubeadm's etcd image tag for Kubernetes `v` (`cmd/kubeadm/app/constants/constants.go`).
fn etcd_tag(v: Version) -> &'static str {
    match (v.major, v.minor) {
        (1, ..=21) => "3.4.13-0",
        (1, 22) => "3.5.0-0",
        (1, 23) => "3.5.1-0",
        (1, 24) => "3.5.3-0",
        (1, 25) => "3.5.4-0",
        (1, 26) => "3.5.6-0",
        (1, 27) => "3.5.7-0",
        (1, 28) => "3.5.9-0",
        (1, 29) => "3.5.10-0",
        (1, 30) => "3.5.12-0",
        (1, 31) => "3.5.15-0",
        (1, 32) => "3.5.16-0",
        (1, 33) => "3.5.21-0",
        _ => "3.6.4-0",
    }
}

fn pod(name: &str, v: Version, command: &[String], mounts: &[(&str, &str, &str)]) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    component: {name}\n    tier: control-plane\n  name: {name}\n  namespace: kube-system\nspec:\n  containers:\n  - command:\n"
    );
    for c in command {
        y.push_str(&format!("    - {c}\n"));
    }
    y.push_str(&format!(
        "    image: {}\n    name: {name}\n    volumeMounts:\n",
        image(name, v)
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
    let mut out = Vec::new();
    let etcd_servers = match &p.external_etcd {
        Some(u) => u.clone(),
        None => {
            let (manifest, servers) = stacked_etcd(p);
            out.push(manifest);
            servers
        }
    };
    out.push(kube_apiserver(p, &etcd_servers));
    out.extend(controller_manager_and_scheduler(p));
    out
}

/// A stacked control plane's etcd manifest, and the URL kube-apiserver reaches it at.
fn stacked_etcd(p: &ManifestParams<'_>) -> ((String, String), String) {
    let adv = p.advertise_address;
    let off = p.port_offset;
    let k = p.kubeadm_dir;
    let v = p.kubernetes_version;
    let pki = "/etc/kubernetes/pki";
    let client = ports::ETCD_CLIENT + off;
    let peer = ports::ETCD_PEER + off;
    let cmd = etcd_command(
        p.node_name,
        adv,
        (client, peer),
        &format!("{pki}/etcd"),
        "/var/lib/etcd",
        &[
            format!(
                "--listen-metrics-urls=http://127.0.0.1:{}",
                ports::ETCD_METRICS + off
            ),
            "--snapshot-count=10000".into(),
        ],
    );
    let host_pki = format!("{k}/pki/etcd");
    let manifest = (
        "etcd.yaml".to_string(),
        pod(
            "etcd",
            v,
            &cmd,
            &[
                ("etcd-certs", &host_pki, "/etc/kubernetes/pki/etcd"),
                ("etcd-data", "/var/lib/etcd", "/var/lib/etcd"),
            ],
        ),
    );
    (manifest, url([127, 0, 0, 1].into(), client))
}

/// kube-apiserver's manifest, reaching etcd at `etcd_servers`.
fn kube_apiserver(p: &ManifestParams<'_>, etcd_servers: &str) -> (String, String) {
    let adv = p.advertise_address;
    let off = p.port_offset;
    let v = p.kubernetes_version;
    let pki = "/etc/kubernetes/pki";
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
    let host_pki = format!("{}/pki", p.kubeadm_dir);
    (
        "kube-apiserver.yaml".into(),
        pod("kube-apiserver", v, &api, &[("k8s-certs", &host_pki, pki)]),
    )
}

/// The kube-controller-manager's and kube-scheduler's manifests.
fn controller_manager_and_scheduler(p: &ManifestParams<'_>) -> Vec<(String, String)> {
    let off = p.port_offset;
    let k = p.kubeadm_dir;
    let v = p.kubernetes_version;
    let pki = "/etc/kubernetes/pki";
    let host_pki = format!("{k}/pki");
    let mut out = Vec::new();
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
                v,
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

/// etcd's `--listen-client-urls`: loopback, and `ip` unless it is loopback.
fn listen_client_urls(ip: IpAddr, client: u16) -> String {
    let mut listen = vec![url([127, 0, 0, 1].into(), client)];
    if !ip.is_loopback() {
        listen.push(url(ip, client));
    }
    listen.join(",")
}

/// The command line of a one-member etcd at `ip` (`(client, peer)` ports) with its certificates
/// in `certs` and its data in `data_dir`: the flags kubeadm and etcdadm both write, and `extra`
/// ones, sorted by name as both tools write them.
fn etcd_command(
    member: &str,
    ip: IpAddr,
    (client, peer): (u16, u16),
    certs: &str,
    data_dir: &str,
    extra: &[String],
) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        format!("--advertise-client-urls={}", url(ip, client)),
        format!("--cert-file={certs}/server.crt"),
        "--client-cert-auth=true".into(),
        format!("--data-dir={data_dir}"),
        format!("--initial-advertise-peer-urls={}", url(ip, peer)),
        format!("--initial-cluster={member}={}", url(ip, peer)),
        format!("--key-file={certs}/server.key"),
        format!("--listen-client-urls={}", listen_client_urls(ip, client)),
        format!("--listen-peer-urls={}", url(ip, peer)),
        format!("--name={member}"),
        format!("--peer-cert-file={certs}/peer.crt"),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-key-file={certs}/peer.key"),
        format!("--peer-trusted-ca-file={certs}/ca.crt"),
        format!("--trusted-ca-file={certs}/ca.crt"),
    ];
    flags.extend_from_slice(extra);
    flags.sort();
    std::iter::once("etcd".to_string()).chain(flags).collect()
}

/// The etcd manifest of an etcdadm node run by the kubelet (`--init-system kubelet`).
pub fn etcdadm_etcd(
    etcd_pki_dir: &str,
    member: &str,
    ip: IpAddr,
    port_offset: u16,
    kubernetes_version: Version,
) -> (String, String) {
    let client = ports::ETCD_CLIENT + port_offset;
    let peer = ports::ETCD_PEER + port_offset;
    let pki = "/etc/etcd/pki";
    let cmd = etcd_command(member, ip, (client, peer), pki, "/var/lib/etcd/data", &[]);
    let host = format!("/{}", etcd_pki_dir.trim_start_matches('/'));
    (
        "etcd.yaml".into(),
        pod(
            "etcd",
            kubernetes_version,
            &cmd,
            &[
                ("etcd-certs", &host, pki),
                ("etcd-data", "/var/lib/etcd/data", "/var/lib/etcd/data"),
            ],
        ),
    )
}

/// Which kube-vip `lab init --kube-vip` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeVipShape {
    /// As EKS Anywhere renders it ([`kube_vip_eks_anywhere`]): no probe.
    EksAnywhere,
    /// The lab's earlier stand-in with an HTTPS liveness probe ([`kube_vip_probe`]).
    Probe,
}

/// The control-plane VIP of the lab's kube-vip: a documentation address (RFC 5737) that
/// nothing binds on the host.
pub const LAB_VIP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 10));

/// The image EKS Anywhere's Bottlerocket testdata names (a real rendered value).
pub const EKS_ANYWHERE_KUBE_VIP_IMAGE: &str =
    "public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0-eks-a-v0.19.0-dev-build.30";

/// What varies in EKS Anywhere's kube-vip manifest.
#[derive(Debug, Clone)]
pub struct KubeVipParams<'a> {
    /// Bottlerocket: the hostPath is under `/var/lib/kubeadm` with `type: File` (Cluster API's
    /// Bottlerocket bootstrap rewrites it); kubeadm (Ubuntu, RHEL): `/etc/kubernetes`, no type.
    pub bottlerocket: bool,
    /// `admin.conf`, or `super-admin.conf` on the init node of Kubernetes 1.29 and later.
    pub kubeconfig: &'a str,
    pub vip: IpAddr,
    /// Added to the API port; a non-zero offset also gives kube-vip its own metrics port
    /// (`prometheus_server`), so that lab nodes can run side by side.
    pub port_offset: u16,
}

/// kube-vip as EKS Anywhere runs it on a control plane, byte for byte: the pod
/// `pkg/clusterapi/kubevip.go` renders (aws/eks-anywhere), its hostPath rewritten by Cluster
/// API's Bottlerocket bootstrap (`patchKubeVipFile`, yaml.v2), as
/// `projects/aws/bottlerocket-bootstrap/pkg/kubeadm/testdata/manifests/kube-vip`
/// (aws/eks-anywhere-build-tooling) holds it. `args: [manager]` and no `command` (the image's
/// entrypoint), the admin kubeconfig mounted as a single file at `/etc/kubernetes/admin.conf`,
/// `NET_ADMIN`/`NET_RAW`, and no liveness or readiness probe. bottlerocket-bootstrap makes the
/// static-pods setting `kube-vip` of it (the file stem).
///
/// With `port_offset == 0` only the VIP and the kubeconfig file name differ from the testdata;
/// with an offset, the port and an added `prometheus_server` env entry (before `address`).
pub fn kube_vip_eks_anywhere(p: &KubeVipParams<'_>) -> (String, String) {
    let port = ports::APISERVER + p.port_offset;
    let metrics = if p.port_offset == 0 {
        String::new()
    } else {
        format!(
            "    - name: prometheus_server\n      value: :{}\n",
            ports::KUBE_VIP_METRICS + p.port_offset
        )
    };
    let volume = if p.bottlerocket {
        format!(
            "      path: /var/lib/kubeadm/{}\n      type: File\n",
            p.kubeconfig
        )
    } else {
        format!("      path: /etc/kubernetes/{}\n", p.kubeconfig)
    };
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  creationTimestamp: null\n  name: kube-vip\n  \
         namespace: kube-system\nspec:\n  containers:\n  - args:\n    - manager\n    env:\n    \
         - name: vip_arp\n      value: \"true\"\n    - name: port\n      value: \"{port}\"\n    \
         - name: vip_cidr\n      value: \"32\"\n    - name: cp_enable\n      value: \"true\"\n    \
         - name: cp_namespace\n      value: kube-system\n    - name: vip_ddns\n      \
         value: \"false\"\n    - name: vip_leaderelection\n      value: \"true\"\n    \
         - name: vip_leaseduration\n      value: \"15\"\n    - name: vip_renewdeadline\n      \
         value: \"10\"\n    - name: vip_retryperiod\n      value: \"2\"\n{metrics}    \
         - name: address\n      value: {vip}\n    image: {EKS_ANYWHERE_KUBE_VIP_IMAGE}\n    \
         imagePullPolicy: IfNotPresent\n    name: kube-vip\n    resources: {{}}\n    \
         securityContext:\n      capabilities:\n        add:\n        - NET_ADMIN\n        \
         - NET_RAW\n    volumeMounts:\n    - mountPath: /etc/kubernetes/admin.conf\n      \
         name: kubeconfig\n  hostNetwork: true\n  volumes:\n  - hostPath:\n{volume}    \
         name: kubeconfig\nstatus: {{}}\n",
        vip = p.vip,
    );
    ("kube-vip.yaml".into(), yaml)
}

/// The lab's probe-ful kube-vip stand-in (`lab init --kube-vip probe`): it mounts admin.conf
/// as a single file, as EKS Anywhere's does, but runs the k8s-sim kube-vip stand-in with a
/// command line and an HTTPS liveness probe (healthy only while its client certificate reaches
/// the apiserver), which certrotor verifies a restart by. Real kube-vip has no such probe.
pub fn kube_vip_probe(kubeadm_dir: &str, port_offset: u16) -> (String, String) {
    let port = ports::KUBE_VIP_METRICS + port_offset;
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

#[cfg(test)]
impl ManifestParams<'static> {
    /// The unit tests' stacked control plane: `cp-1` at 10.0.0.10 in `/var/lib/kubeadm`.
    pub(crate) fn for_tests(port_offset: u16) -> Self {
        ManifestParams {
            kubeadm_dir: "/var/lib/kubeadm",
            node_name: "cp-1",
            advertise_address: [10, 0, 0, 10].into(),
            port_offset,
            external_etcd: None,
            etcd_client_cert: "apiserver-etcd-client.crt",
            kubernetes_version: DEFAULT_KUBERNETES_VERSION,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::manifests::{Component, PodInfo, other_consumers};

    #[test]
    fn manifests_round_trip_to_endpoints() {
        let p = ManifestParams::for_tests(100);
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
        let p = ManifestParams::for_tests(0);
        let mut pods: Vec<(String, PodInfo)> = control_plane(&p)
            .into_iter()
            .chain([kube_vip_probe("/var/lib/kubeadm", 0)])
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

    /// The bytes of `projects/aws/bottlerocket-bootstrap/pkg/kubeadm/testdata/manifests/kube-vip`
    /// (aws/eks-anywhere-build-tooling @8cf6a5613c196ad54b2fd0e0723b953a89e83c5a), whose VIP
    /// is 105.16.99.106.
    const EKS_ANYWHERE_TESTDATA: &str = "apiVersion: v1
kind: Pod
metadata:
  creationTimestamp: null
  name: kube-vip
  namespace: kube-system
spec:
  containers:
  - args:
    - manager
    env:
    - name: vip_arp
      value: \"true\"
    - name: port
      value: \"6443\"
    - name: vip_cidr
      value: \"32\"
    - name: cp_enable
      value: \"true\"
    - name: cp_namespace
      value: kube-system
    - name: vip_ddns
      value: \"false\"
    - name: vip_leaderelection
      value: \"true\"
    - name: vip_leaseduration
      value: \"15\"
    - name: vip_renewdeadline
      value: \"10\"
    - name: vip_retryperiod
      value: \"2\"
    - name: address
      value: 105.16.99.106
    image: public.ecr.aws/l0g8r8j6/kube-vip/kube-vip:v0.7.0-eks-a-v0.19.0-dev-build.30
    imagePullPolicy: IfNotPresent
    name: kube-vip
    resources: {}
    securityContext:
      capabilities:
        add:
        - NET_ADMIN
        - NET_RAW
    volumeMounts:
    - mountPath: /etc/kubernetes/admin.conf
      name: kubeconfig
  hostNetwork: true
  volumes:
  - hostPath:
      path: /var/lib/kubeadm/admin.conf
      type: File
    name: kubeconfig
status: {}
";

    #[test]
    fn eks_anywhere_kube_vip_is_the_testdata_byte_for_byte() {
        let p = KubeVipParams {
            bottlerocket: true,
            kubeconfig: "admin.conf",
            vip: [105, 16, 99, 106].into(),
            port_offset: 0,
        };
        let (file, yaml) = kube_vip_eks_anywhere(&p);
        assert_eq!(file, "kube-vip.yaml");
        assert_eq!(yaml, EKS_ANYWHERE_TESTDATA);
        // The init node of 1.29 and later: bottlerocket-bootstrap's ReplaceAll of the path.
        let (_, yaml) = kube_vip_eks_anywhere(&KubeVipParams {
            kubeconfig: "super-admin.conf",
            ..p.clone()
        });
        assert_eq!(
            yaml,
            EKS_ANYWHERE_TESTDATA.replace(
                "path: /var/lib/kubeadm/admin.conf",
                "path: /var/lib/kubeadm/super-admin.conf"
            )
        );
        // kubeadm (Ubuntu): the path Cluster API's Bottlerocket bootstrap did not rewrite.
        let (_, yaml) = kube_vip_eks_anywhere(&KubeVipParams {
            bottlerocket: false,
            ..p.clone()
        });
        assert_eq!(
            yaml,
            EKS_ANYWHERE_TESTDATA.replace(
                "path: /var/lib/kubeadm/admin.conf\n      type: File\n",
                "path: /etc/kubernetes/admin.conf\n"
            )
        );
        // Side by side: the port and a metrics port of its own.
        let (_, yaml) = kube_vip_eks_anywhere(&KubeVipParams {
            port_offset: 100,
            ..p
        });
        assert_eq!(
            yaml,
            EKS_ANYWHERE_TESTDATA
                .replace("value: \"6443\"", "value: \"6543\"")
                .replace(
                    "    - name: address\n",
                    "    - name: prometheus_server\n      value: :2212\n    - name: address\n"
                )
        );
        // Read back: no component, no probe, a single-file mount, its environment.
        let info = PodInfo::parse(yaml.as_bytes()).unwrap();
        assert_eq!(info.component(), None);
        assert_eq!(info.health, None);
        assert_eq!(info.argv, ["manager"]);
        assert_eq!(info.host_paths, ["/var/lib/kubeadm/admin.conf"]);
        assert_eq!(info.image.as_deref(), Some(EKS_ANYWHERE_KUBE_VIP_IMAGE));
        assert!(info.env.contains(&("port".into(), "6543".into())));
        assert!(
            info.env
                .contains(&("address".into(), "105.16.99.106".into()))
        );
    }

    #[test]
    fn images_follow_the_kubernetes_version() {
        let v = |a, b, c| Version::new(a, b, c);
        assert_eq!(
            image("kube-apiserver", DEFAULT_KUBERNETES_VERSION),
            "k8s.gcr.io/kube-apiserver:v1.20.2"
        );
        assert_eq!(
            image("etcd", DEFAULT_KUBERNETES_VERSION),
            "k8s.gcr.io/etcd:3.4.13-0"
        );
        assert_eq!(
            image("kube-scheduler", v(1, 31, 4)),
            "registry.k8s.io/kube-scheduler:v1.31.4"
        );
        assert_eq!(image("etcd", v(1, 31, 4)), "registry.k8s.io/etcd:3.5.15-0");
        let p = ManifestParams {
            kubeadm_dir: "/etc/kubernetes",
            node_name: "cp-1",
            advertise_address: [127, 0, 0, 1].into(),
            port_offset: 0,
            external_etcd: None,
            etcd_client_cert: "apiserver-etcd-client.crt",
            kubernetes_version: v(1, 29, 1),
        };
        for (_, y) in control_plane(&p) {
            let info = PodInfo::parse(y.as_bytes()).unwrap();
            let want = match info.component() {
                Some(crate::node::manifests::Component::Etcd) => v(3, 5, 10),
                _ => v(1, 29, 1),
            };
            assert_eq!(info.version(), Some(want), "{y}");
        }
    }
}
