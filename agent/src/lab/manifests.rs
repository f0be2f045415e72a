//! The static pod manifests `lab init` writes, as kubeadm v1.20.2 and etcdadm write them (and a
//! kube-vip as EKS Anywhere runs it), so that the real binaries run them. Paths inside a
//! manifest are the container's (`/etc/kubernetes/pki/...`); `hostPath` volumes say where they
//! are on the node.

use std::net::IpAddr;

use crate::node::manifests::ports;

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
    format!("https://{}", super::socket_text(ip, port))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::manifests::{Component, PodInfo, other_consumers};

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
