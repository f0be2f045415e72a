//! The control-plane node `lab init` writes: the kubernetes and front-proxy CAs' leaves (and
//! the etcd CA's on a stacked control plane), the service-account key pair, the kubeconfigs,
//! the kubelet's client and serving certificates, and the static pod manifests.

use std::net::IpAddr;
use std::path::Path;

use crate::lab::certs::{Cas, LabClock, LeafSpec, Writer, issue_leaf};
use crate::lab::{API_PORT, LabError, LabLayout, LabOptions, SERVICE_IP, manifests, socket_text};
use crate::node::kubeconfig::Kubeconfig;
use crate::pki::{self, Cert, Issuance, KeyAlgorithm, PrivateKey, Profile, SanOrder, oid};

pub(super) fn write_control_plane(
    w: &mut Writer,
    root: &Path,
    kdir: &str,
    opts: &LabOptions,
    clock: &LabClock,
    cas: &Cas<'_>,
    stacked: bool,
) -> Result<(), LabError> {
    let pki_dir = format!("{kdir}/pki");
    for spec in apiserver_leaves(&pki_dir, opts)? {
        let (cert, key) = issue_leaf(&spec, cas.ca, opts, clock)?;
        w.pair(root, &spec.base, &cert, &key)?;
    }
    let front = LeafSpec::client(
        format!("{pki_dir}/front-proxy-client"),
        "front-proxy-client",
        vec![],
        false,
    );
    let (cert, key) = issue_leaf(&front, cas.front_proxy, opts, clock)?;
    w.pair(root, &front.base, &cert, &key)?;
    if let Some(etcd_ca) = cas.etcd.filter(|_| stacked) {
        for spec in &stacked_etcd_leaves(&pki_dir, opts) {
            let (cert, key) = issue_leaf(spec, etcd_ca, opts, clock)?;
            w.pair(root, &spec.base, &cert, &key)?;
        }
    }
    write_service_account(w, root, &pki_dir, opts)?;
    let server_url = format!(
        "https://{}",
        socket_text(opts.advertise_address, API_PORT + opts.port_offset)
    );
    write_kubeconfigs(w, root, kdir, opts, clock, cas.ca, &server_url)?;
    write_kubelet_client(w, root, opts, clock, cas.ca)?;
    write_kubelet_serving(w, root, &opts.node_name, clock)?;
    // kubelet.conf points to the kubelet's own rotating client certificate.
    let ca_pem = cas.ca.0.to_pem()?;
    let kubelet_conf = kubelet_kubeconfig(&opts.cluster_name, &server_url, ca_pem.as_bytes());
    w.file(
        root,
        &format!("{kdir}/kubelet.conf"),
        kubelet_conf.as_bytes(),
        0o600,
    )?;
    write_control_plane_manifests(w, root, kdir, opts, stacked)
}

/// The kubernetes CA's leaves: the apiserver's serving and kubelet client certificates.
fn apiserver_leaves(pki_dir: &str, opts: &LabOptions) -> Result<Vec<LeafSpec<'static>>, LabError> {
    let service_ip: IpAddr = SERVICE_IP
        .parse()
        .map_err(|_| LabError("bad service IP".into()))?;
    let apiserver_dns = vec![
        opts.node_name.clone(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ];
    Ok(vec![
        LeafSpec::named(
            format!("{pki_dir}/apiserver"),
            "kube-apiserver",
            apiserver_dns,
            vec![service_ip, opts.advertise_address],
            &[oid::SERVER_AUTH],
            false,
        ),
        LeafSpec::client(
            format!("{pki_dir}/apiserver-kubelet-client"),
            "kube-apiserver-kubelet-client",
            vec!["kubeadm:cluster-admins"],
            false,
        ),
    ])
}

/// The etcd CA's leaves on a stacked control plane: the member's pair and the clients'.
fn stacked_etcd_leaves(pki_dir: &str, opts: &LabOptions) -> Vec<LeafSpec<'static>> {
    let node = opts.node_name.as_str();
    let member_dns = vec![node.to_string(), "localhost".into()];
    let member_ips = vec![
        opts.advertise_address,
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ];
    let both = [oid::SERVER_AUTH, oid::CLIENT_AUTH];
    vec![
        LeafSpec::named(
            format!("{pki_dir}/etcd/server"),
            node,
            member_dns.clone(),
            member_ips.clone(),
            &both,
            false,
        ),
        LeafSpec::named(
            format!("{pki_dir}/etcd/peer"),
            node,
            member_dns,
            member_ips,
            &both,
            false,
        ),
        LeafSpec::client(
            format!("{pki_dir}/etcd/healthcheck-client"),
            "kube-etcd-healthcheck-client",
            vec![],
            false,
        ),
        LeafSpec::client(
            format!("{pki_dir}/apiserver-etcd-client"),
            "kube-apiserver-etcd-client",
            vec![],
            false,
        ),
    ]
}

/// The service-account key pair: kubeadm writes `RSA PRIVATE KEY` and a PKIX `PUBLIC KEY`.
fn write_service_account(
    w: &mut Writer,
    root: &Path,
    pki_dir: &str,
    opts: &LabOptions,
) -> Result<(), LabError> {
    let sa_alg = match opts.key_algorithm {
        KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => opts.key_algorithm,
        _ => KeyAlgorithm::Rsa(2048),
    };
    let sa = PrivateKey::generate(sa_alg)?;
    w.file(
        root,
        &format!("{pki_dir}/sa.key"),
        sa.to_pem(sa.encoding)?.0.as_bytes(),
        0o600,
    )?;
    let sa_pub = der::Encode::to_der(&sa.spki()?).map_err(|e| LabError(e.to_string()))?;
    let sa_pub_pem = der::pem::encode_string("PUBLIC KEY", der::pem::LineEnding::LF, &sa_pub)
        .map_err(|e| LabError(e.to_string()))?;
    w.file(
        root,
        &format!("{pki_dir}/sa.pub"),
        sa_pub_pem.as_bytes(),
        0o600,
    )
}

/// The kubeconfigs with embedded credentials: admin, super-admin, controller-manager,
/// scheduler.
fn write_kubeconfigs(
    w: &mut Writer,
    root: &Path,
    kdir: &str,
    opts: &LabOptions,
    clock: &LabClock,
    ca: (&Cert, &PrivateKey),
    server_url: &str,
) -> Result<(), LabError> {
    let ca_pem = ca.0.to_pem()?;
    let kubeconfigs: [(&str, &str, Vec<&str>); 4] = [
        (
            "admin.conf",
            "kubernetes-admin",
            vec!["kubeadm:cluster-admins"],
        ),
        (
            "super-admin.conf",
            "kubernetes-super-admin",
            vec!["system:masters"],
        ),
        (
            "controller-manager.conf",
            "system:kube-controller-manager",
            vec![],
        ),
        ("scheduler.conf", "system:kube-scheduler", vec![]),
    ];
    for (file, cn, orgs) in kubeconfigs {
        let spec = LeafSpec::client(String::new(), cn, orgs, false);
        let (cert, key) = issue_leaf(&spec, ca, opts, clock)?;
        let kc = Kubeconfig::new_embedded(
            &opts.cluster_name,
            server_url,
            cn,
            ca_pem.as_bytes(),
            cert.to_pem()?.as_bytes(),
            key.to_pem(key.encoding)?.0.as_bytes(),
        );
        let yaml = kc.to_yaml().map_err(|e| LabError(e.to_string()))?;
        w.file(root, &format!("{kdir}/{file}"), yaml.as_bytes(), 0o600)?;
    }
    Ok(())
}

/// The kubelet's dated client bundle, and the link to it.
fn write_kubelet_client(
    w: &mut Writer,
    root: &Path,
    opts: &LabOptions,
    clock: &LabClock,
    ca: (&Cert, &PrivateKey),
) -> Result<(), LabError> {
    let node = opts.node_name.as_str();
    let spec = LeafSpec::client(
        String::new(),
        format!("system:node:{node}"),
        vec!["system:nodes"],
        false,
    );
    let (cert, key) = issue_leaf(&spec, ca, opts, clock)?;
    let (y, mo, d, h, mi, s) = crate::sys::clock::civil(opts.now);
    let dated = format!("kubelet-client-{y:04}-{mo:02}-{d:02}-{h:02}-{mi:02}-{s:02}.pem");
    let mut bundle = cert.to_pem()?;
    bundle.push_str(&key.to_pem(key.encoding)?.0);
    w.file(
        root,
        &format!("var/lib/kubelet/pki/{dated}"),
        bundle.as_bytes(),
        0o600,
    )?;
    std::os::unix::fs::symlink(
        format!("/var/lib/kubelet/pki/{dated}"),
        root.join("var/lib/kubelet/pki/kubelet-client-current.pem"),
    )
    .map_err(|e| LabError(format!("cannot link the kubelet client certificate: {e}")))
}

/// The kubelet's self-signed serving pair (it writes one at start when there is none, with
/// CN `<host>@<unix time>`; the real one is signed by a throw-away `<host>-ca@<time>` CA and
/// holds both certificates, which the lab leaves out: only its validity matters here).
fn write_kubelet_serving(
    w: &mut Writer,
    root: &Path,
    node: &str,
    clock: &LabClock,
) -> Result<(), LabError> {
    let serving_key = PrivateKey::generate(KeyAlgorithm::Rsa(2048))?;
    let serving = pki::issue(
        &Profile {
            subject: pki::kubeadm_subject(&format!("{node}@{}", clock.birth), &[])?,
            dns_names: vec![node.to_string()],
            ip_addresses: vec![],
            other_sans: vec![],
            san_order: SanOrder::Kubeadm,
            key_usage: pki::leaf_key_usage(),
            ext_key_usage: vec![pki::oid::SERVER_AUTH],
            basic_constraints: Some(false),
            subject_key_id: false,
        },
        &serving_key.spki()?,
        None,
        &serving_key,
        Issuance {
            serial: pki::random_serial()?,
            ..clock.leaf()
        },
    )?;
    w.file(
        root,
        crate::node::kubelet::SERVING_CERT,
        serving.to_pem()?.as_bytes(),
        0o644,
    )?;
    w.file(
        root,
        crate::node::kubelet::SERVING_KEY,
        serving_key.to_pem(serving_key.encoding)?.0.as_bytes(),
        0o600,
    )
}

/// The control plane's static-pod manifests.
fn write_control_plane_manifests(
    w: &mut Writer,
    root: &Path,
    kdir: &str,
    opts: &LabOptions,
    stacked: bool,
) -> Result<(), LabError> {
    let adv = opts.advertise_address;
    let kubeadm_dir = format!("/{kdir}");
    let etcd_client_cert = match (stacked, opts.layout) {
        (false, LabLayout::Bottlerocket) => "server-etcd-client.crt",
        _ => "apiserver-etcd-client.crt",
    };
    let external_etcd = (!stacked).then(|| {
        format!(
            "https://{}",
            socket_text(
                adv,
                crate::node::manifests::ports::ETCD_CLIENT + opts.port_offset
            )
        )
    });
    let params = manifests::ManifestParams {
        kubeadm_dir: &kubeadm_dir,
        node_name: &opts.node_name,
        advertise_address: adv,
        port_offset: opts.port_offset,
        external_etcd,
        etcd_client_cert,
        kubernetes_version: opts.kubernetes_version,
    };
    for (file, yaml) in manifests::control_plane(&params) {
        w.manifest(root, opts.layout, &file, &yaml)?;
    }
    Ok(())
}

fn kubelet_kubeconfig(cluster: &str, server: &str, ca_pem: &[u8]) -> String {
    format!(
        "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: {}\n    server: {server}\n  name: {cluster}\n\
         contexts:\n- context:\n    cluster: {cluster}\n    user: system:node\n  name: system:node@{cluster}\n\
         current-context: system:node@{cluster}\nkind: Config\npreferences: {{}}\nusers:\n- name: system:node\n  user:\n\
         \x20   client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n\
         \x20   client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n",
        crate::node::kubeconfig::base64_encode(ca_pem)
    )
}
