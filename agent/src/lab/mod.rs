//! `certrotor lab init`: writes a realistic node root for demos, tests and benchmarks.
//!
//! The files follow kubeadm's and etcdadm's profiles field by field (`reference/pki-profiles.md`
//! §1–§5): names, subjects, SANs, usages, PEM encodings and modes. The certificates look as if
//! the cluster was created a year before they expire: CAs valid ten years from then, leaves
//! valid one year. This is not a CA: keys are made on the spot and nothing is protected.

pub mod demo;
pub mod manifests;

pub use manifests::KubeVipShape;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::node::kubeconfig::Kubeconfig;
use crate::pki::{
    self, Cert, Issuance, KeyAlgorithm, KeyEncoding, PrivateKey, Profile, SanOrder, Signer, oid,
};
use crate::sys::clock::YEAR;
use crate::sys::fsutil;

/// Which node layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabLayout {
    /// `/etc/kubernetes`, `/etc/etcd/pki`.
    Kubeadm,
    /// `/var/lib/kubeadm`, `/var/lib/etcd/pki` (EKS Anywhere on Bottlerocket).
    Bottlerocket,
}

/// Where etcd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// kubeadm's local etcd on the control-plane node.
    Stacked,
    /// etcdadm nodes; two node roots are written: `control-plane/` and `etcd/`.
    ExternalEtcd,
}

/// Options of `lab init`.
#[derive(Debug, Clone)]
pub struct LabOptions {
    pub layout: LabLayout,
    pub topology: Topology,
    /// Seconds from `now` until the leaves expire (negative: already expired).
    pub expires_in: i64,
    pub key_algorithm: KeyAlgorithm,
    pub node_name: String,
    pub advertise_address: IpAddr,
    pub cluster_name: String,
    /// Added to every standard port (manifests and kubeconfig URLs), so that lab nodes can run
    /// side by side on one machine.
    pub port_offset: u16,
    /// The Kubernetes version whose images the static pod manifests name
    /// ([`manifests::DEFAULT_KUBERNETES_VERSION`] by default).
    pub kubernetes_version: crate::node::manifests::Version,
    pub now: i64,
}

/// A failure while writing the lab node.
#[derive(Debug)]
pub struct LabError(pub String);

impl fmt::Display for LabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LabError {}

impl From<pki::PkiError> for LabError {
    fn from(e: pki::PkiError) -> Self {
        LabError(e.to_string())
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct LabSummary {
    /// The node roots (one, or `control-plane` and `etcd`).
    pub roots: Vec<PathBuf>,
    pub files: usize,
}

/// The service subnet's first address, kubeadm's default (10.96.0.0/12).
const SERVICE_IP: &str = "10.96.0.1";
/// kubeadm's default API server port.
const API_PORT: u16 = 6443;

/// Writes the lab node(s) under `dir`, which must be absent or empty.
pub fn init(dir: &Path, opts: &LabOptions) -> Result<LabSummary, LabError> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(LabError(format!(
            "'{}' exists and is not empty; lab init writes only into a new or empty folder",
            dir.display()
        )));
    }
    let mut w = Writer { files: 0 };
    let clock = LabClock::new(opts.now, opts.expires_in);
    let kdir = match opts.layout {
        LabLayout::Kubeadm => crate::node::catalog::paths::KUBEADM_DIR,
        LabLayout::Bottlerocket => crate::node::catalog::paths::BOTTLEROCKET_KUBEADM_DIR,
    };
    let etcd_dir = match opts.layout {
        LabLayout::Kubeadm => crate::node::catalog::paths::ETCDADM_PKI,
        LabLayout::Bottlerocket => crate::node::catalog::paths::BOTTLEROCKET_ETCD_PKI,
    };
    // The control plane's own CAs are the same in both topologies.
    let (cp, etcd_root) = match opts.topology {
        Topology::Stacked => (dir.to_path_buf(), None),
        Topology::ExternalEtcd => (dir.join("control-plane"), Some(dir.join("etcd"))),
    };
    let (ca, ca_key) = write_ca(
        &mut w,
        &cp,
        &format!("{kdir}/pki/ca"),
        "kubernetes",
        opts,
        &clock,
    )?;
    let (fp, fp_key) = write_ca(
        &mut w,
        &cp,
        &format!("{kdir}/pki/front-proxy-ca"),
        "front-proxy-ca",
        opts,
        &clock,
    )?;
    let roots = match etcd_root {
        None => {
            let (etcd, etcd_key) = write_ca(
                &mut w,
                &cp,
                &format!("{kdir}/pki/etcd/ca"),
                "etcd-ca",
                opts,
                &clock,
            )?;
            let cas = Cas {
                ca: (&ca, &ca_key),
                front_proxy: (&fp, &fp_key),
                etcd: Some((&etcd, &etcd_key)),
            };
            write_control_plane(&mut w, &cp, kdir, opts, &clock, &cas, true)?;
            vec![cp]
        }
        Some(etcd_root) => {
            // EKS Anywhere: the etcd CA comes from Cluster API, CN "kubernetes" like the others;
            // the control plane holds only its certificate, so it signs no etcd certificate.
            let (etcd, etcd_key) = write_ca(
                &mut w,
                &etcd_root,
                &format!("{etcd_dir}/ca"),
                "kubernetes",
                opts,
                &clock,
            )?;
            w.file(
                &cp,
                &format!("{kdir}/pki/etcd/ca.crt"),
                etcd.to_pem()?.as_bytes(),
                0o644,
            )?;
            let cas = Cas {
                ca: (&ca, &ca_key),
                front_proxy: (&fp, &fp_key),
                etcd: None,
            };
            write_control_plane(&mut w, &cp, kdir, opts, &clock, &cas, false)?;
            write_etcd_node(
                &mut w,
                &etcd_root,
                etcd_dir,
                &cp,
                kdir,
                opts,
                &clock,
                (&etcd, &etcd_key),
            )?;
            vec![cp, etcd_root]
        }
    };
    Ok(LabSummary {
        roots,
        files: w.files,
    })
}

/// The validity windows of a lab node.
struct LabClock {
    /// When the cluster was made: the CAs' notBefore + 5 minutes.
    birth: i64,
    leaf_not_after: i64,
}

impl LabClock {
    fn new(now: i64, expires_in: i64) -> LabClock {
        let leaf_not_after = now + expires_in;
        LabClock {
            birth: (leaf_not_after - YEAR).min(now),
            leaf_not_after,
        }
    }
    fn ca(&self) -> Issuance {
        Issuance {
            serial: 0,
            not_before: self.birth - 300,
            not_after: self.birth + 10 * YEAR,
        }
    }
    /// Leaves start with the CAs, as if issued when the cluster was made (kubeadm ≤ 1.30 and
    /// etcdadm backdate to the CA's notBefore; a year-old leaf looks the same either way).
    fn leaf(&self) -> Issuance {
        Issuance {
            serial: 0,
            not_before: self.birth - 300,
            not_after: self.leaf_not_after,
        }
    }
}

struct Cas<'a> {
    ca: (&'a Cert, &'a PrivateKey),
    front_proxy: (&'a Cert, &'a PrivateKey),
    etcd: Option<(&'a Cert, &'a PrivateKey)>,
}

struct Writer {
    files: usize,
}

impl Writer {
    fn file(&mut self, root: &Path, rel: &str, data: &[u8], mode: u32) -> Result<(), LabError> {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fsutil::create_dir_all_mode(parent, 0o755)
                .map_err(|e| LabError(format!("cannot create '{}': {e}", parent.display())))?;
        }
        fsutil::write_new(&path, data, mode, None)
            .map_err(|e| LabError(format!("cannot write '{}': {e}", path.display())))?;
        self.files += 1;
        Ok(())
    }

    fn pair(
        &mut self,
        root: &Path,
        base: &str,
        cert: &Cert,
        key: &PrivateKey,
    ) -> Result<(), LabError> {
        // kubeadm writes the key first, then the certificate.
        self.file(
            root,
            &format!("{base}.key"),
            key.to_pem(key.encoding)?.0.as_bytes(),
            0o600,
        )?;
        self.file(
            root,
            &format!("{base}.crt"),
            cert.to_pem()?.as_bytes(),
            0o644,
        )
    }
}

fn write_ca(
    w: &mut Writer,
    root: &Path,
    base: &str,
    cn: &str,
    opts: &LabOptions,
    clock: &LabClock,
) -> Result<(Cert, PrivateKey), LabError> {
    let key = PrivateKey::generate(opts.key_algorithm)?;
    let profile = Profile {
        subject: pki::kubeadm_subject(cn, &[])?,
        dns_names: vec![cn.to_string()],
        ip_addresses: vec![],
        other_sans: vec![],
        san_order: SanOrder::Kubeadm,
        key_usage: pki::ca_key_usage(),
        ext_key_usage: vec![],
        basic_constraints: Some(true),
        subject_key_id: true,
    };
    let issuance = Issuance {
        serial: pki::random_serial()?,
        ..clock.ca()
    };
    let cert = pki::issue(&profile, &key.spki()?, None, &key, issuance)?;
    w.pair(root, base, &cert, &key)?;
    Ok((cert, key))
}

/// A leaf to write: where, who, what for.
struct LeafSpec<'a> {
    base: String,
    cn: String,
    orgs: Vec<&'a str>,
    dns: Vec<String>,
    ips: Vec<IpAddr>,
    eku: Vec<der::oid::ObjectIdentifier>,
    etcdadm: bool,
}

fn issue_leaf(
    spec: &LeafSpec<'_>,
    signer: (&Cert, &PrivateKey),
    opts: &LabOptions,
    clock: &LabClock,
) -> Result<(Cert, PrivateKey), LabError> {
    // etcdadm always makes RSA-2048 keys.
    let algorithm = if spec.etcdadm {
        KeyAlgorithm::Rsa(2048)
    } else {
        opts.key_algorithm
    };
    let key = PrivateKey::generate(algorithm)?;
    let profile = Profile {
        subject: pki::kubeadm_subject(&spec.cn, &spec.orgs)?,
        dns_names: spec.dns.clone(),
        ip_addresses: spec.ips.clone(),
        other_sans: vec![],
        san_order: if spec.etcdadm {
            SanOrder::AsGiven
        } else {
            SanOrder::Kubeadm
        },
        key_usage: pki::leaf_key_usage(),
        ext_key_usage: spec.eku.clone(),
        basic_constraints: if spec.etcdadm { None } else { Some(false) },
        subject_key_id: false,
    };
    let issuance = Issuance {
        serial: pki::random_serial()?,
        ..clock.leaf()
    };
    let cert = pki::issue(
        &profile,
        &key.spki()?,
        Some(&Signer {
            cert: signer.0,
            key: signer.1,
        }),
        &key,
        issuance,
    )?;
    Ok((cert, key))
}

fn write_control_plane(
    w: &mut Writer,
    root: &Path,
    kdir: &str,
    opts: &LabOptions,
    clock: &LabClock,
    cas: &Cas<'_>,
    stacked: bool,
) -> Result<(), LabError> {
    let node = opts.node_name.as_str();
    let adv = opts.advertise_address;
    let loopback4: IpAddr = [127, 0, 0, 1].into();
    let loopback6: IpAddr = "::1".parse().map_err(|_| LabError("bad ::1".into()))?;
    let service_ip: IpAddr = SERVICE_IP
        .parse()
        .map_err(|_| LabError("bad service IP".into()))?;
    let pki_dir = format!("{kdir}/pki");
    let server = vec![oid::SERVER_AUTH];
    let client = vec![oid::CLIENT_AUTH];
    let both = vec![oid::SERVER_AUTH, oid::CLIENT_AUTH];
    let leaf = |base: &str,
                cn: &str,
                orgs: Vec<&'static str>,
                dns: Vec<String>,
                ips: Vec<IpAddr>,
                eku: &Vec<_>| LeafSpec {
        base: format!("{pki_dir}/{base}"),
        cn: cn.to_string(),
        orgs,
        dns,
        ips,
        eku: eku.clone(),
        etcdadm: false,
    };
    let apiserver_dns = vec![
        node.to_string(),
        "kubernetes".into(),
        "kubernetes.default".into(),
        "kubernetes.default.svc".into(),
        "kubernetes.default.svc.cluster.local".into(),
    ];
    let mut ca_signed = vec![
        leaf(
            "apiserver",
            "kube-apiserver",
            vec![],
            apiserver_dns,
            vec![service_ip, adv],
            &server,
        ),
        leaf(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            vec!["kubeadm:cluster-admins"],
            vec![],
            vec![],
            &client,
        ),
    ];
    let front = leaf(
        "front-proxy-client",
        "front-proxy-client",
        vec![],
        vec![],
        vec![],
        &client,
    );
    let mut etcd_signed = Vec::new();
    if stacked {
        let member_dns = vec![node.to_string(), "localhost".into()];
        let member_ips = vec![adv, loopback4, loopback6];
        etcd_signed.push(leaf(
            "etcd/server",
            node,
            vec![],
            member_dns.clone(),
            member_ips.clone(),
            &both,
        ));
        etcd_signed.push(leaf(
            "etcd/peer",
            node,
            vec![],
            member_dns,
            member_ips,
            &both,
        ));
        etcd_signed.push(leaf(
            "etcd/healthcheck-client",
            "kube-etcd-healthcheck-client",
            vec![],
            vec![],
            vec![],
            &client,
        ));
        etcd_signed.push(leaf(
            "apiserver-etcd-client",
            "kube-apiserver-etcd-client",
            vec![],
            vec![],
            vec![],
            &client,
        ));
    }
    for spec in ca_signed.drain(..) {
        let (cert, key) = issue_leaf(&spec, cas.ca, opts, clock)?;
        w.pair(root, &spec.base, &cert, &key)?;
    }
    let (cert, key) = issue_leaf(&front, cas.front_proxy, opts, clock)?;
    w.pair(root, &front.base, &cert, &key)?;
    if let Some(etcd_ca) = cas.etcd {
        for spec in &etcd_signed {
            let (cert, key) = issue_leaf(spec, etcd_ca, opts, clock)?;
            w.pair(root, &spec.base, &cert, &key)?;
        }
    }
    // Service-account key pair: kubeadm writes `RSA PRIVATE KEY` and a PKIX `PUBLIC KEY`.
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
    )?;

    // Kubeconfigs.
    let server_url = format!("https://{}", socket_text(adv, API_PORT + opts.port_offset));
    let ca_pem = cas.ca.0.to_pem()?;
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
        let spec = LeafSpec {
            base: String::new(),
            cn: cn.into(),
            orgs,
            dns: vec![],
            ips: vec![],
            eku: client.clone(),
            etcdadm: false,
        };
        let (cert, key) = issue_leaf(&spec, cas.ca, opts, clock)?;
        let kc = Kubeconfig::new_embedded(
            &opts.cluster_name,
            &server_url,
            cn,
            ca_pem.as_bytes(),
            cert.to_pem()?.as_bytes(),
            key.to_pem(key.encoding)?.0.as_bytes(),
        );
        let yaml = kc.to_yaml().map_err(|e| LabError(e.to_string()))?;
        w.file(root, &format!("{kdir}/{file}"), yaml.as_bytes(), 0o600)?;
    }
    // kubelet.conf points to the kubelet's own rotating client certificate.
    let node_cn = format!("system:node:{node}");
    let spec = LeafSpec {
        base: String::new(),
        cn: node_cn.clone(),
        orgs: vec!["system:nodes"],
        dns: vec![],
        ips: vec![],
        eku: client,
        etcdadm: false,
    };
    let (cert, key) = issue_leaf(&spec, cas.ca, opts, clock)?;
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
    .map_err(|e| LabError(format!("cannot link the kubelet client certificate: {e}")))?;
    // The kubelet's self-signed serving pair (it writes one at start when there is none, with
    // CN `<host>@<unix time>`; the real one is signed by a throw-away `<host>-ca@<time>` CA and
    // holds both certificates, which the lab leaves out: only its validity matters here).
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
    )?;
    let kubelet_conf = kubelet_kubeconfig(&opts.cluster_name, &server_url, ca_pem.as_bytes());
    w.file(
        root,
        &format!("{kdir}/kubelet.conf"),
        kubelet_conf.as_bytes(),
        0o600,
    )?;
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
        node_name: node,
        advertise_address: adv,
        port_offset: opts.port_offset,
        external_etcd,
        etcd_client_cert,
        kubernetes_version: opts.kubernetes_version,
    };
    for (file, yaml) in manifests::control_plane(&params) {
        w.file(
            root,
            &format!("{}/{file}", manifest_dir(opts.layout)),
            yaml.as_bytes(),
            0o600,
        )?;
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

#[allow(clippy::too_many_arguments)]
fn write_etcd_node(
    w: &mut Writer,
    root: &Path,
    etcd_dir: &str,
    cp_root: &Path,
    kdir: &str,
    opts: &LabOptions,
    clock: &LabClock,
    etcd_ca: (&Cert, &PrivateKey),
) -> Result<(), LabError> {
    let name = format!("{}-etcd", opts.node_name);
    let ip = opts.advertise_address;
    let loopback: IpAddr = [127, 0, 0, 1].into();
    let both = vec![oid::SERVER_AUTH, oid::CLIENT_AUTH];
    let client = vec![oid::CLIENT_AUTH];
    let spec = |file: &str,
                cn: String,
                orgs: Vec<&'static str>,
                dns: Vec<String>,
                ips: Vec<IpAddr>,
                eku: &Vec<_>| LeafSpec {
        base: format!("{etcd_dir}/{file}"),
        cn,
        orgs,
        dns,
        ips,
        eku: eku.clone(),
        etcdadm: true,
    };
    let specs = [
        spec(
            "server",
            name.clone(),
            vec![],
            vec![name.clone()],
            vec![ip, loopback],
            &both,
        ),
        spec(
            "peer",
            name.clone(),
            vec![],
            vec![name.clone()],
            vec![ip],
            &both,
        ),
        spec(
            "etcdctl-etcd-client",
            format!("{name}-etcdctl"),
            vec!["system:masters"],
            vec![],
            vec![],
            &client,
        ),
        spec(
            "apiserver-etcd-client",
            format!("{name}-kube-apiserver-etcd-client"),
            vec!["system:masters"],
            vec![],
            vec![],
            &client,
        ),
    ];
    let (file, yaml) = manifests::etcdadm_etcd(
        etcd_dir,
        &name,
        ip,
        opts.port_offset,
        opts.kubernetes_version,
    );
    w.file(
        root,
        &format!("{}/{file}", manifest_dir(opts.layout)),
        yaml.as_bytes(),
        0o600,
    )?;
    for s in &specs {
        let (cert, key) = issue_leaf(s, etcd_ca, opts, clock)?;
        w.pair(root, &s.base, &cert, &key)?;
        if s.base.ends_with("apiserver-etcd-client") {
            // The control plane holds a copy; Bottlerocket names the certificate differently.
            let cert_name = match opts.layout {
                LabLayout::Kubeadm => "apiserver-etcd-client.crt",
                LabLayout::Bottlerocket => "server-etcd-client.crt",
            };
            w.file(
                cp_root,
                &format!("{kdir}/pki/apiserver-etcd-client.key"),
                key.to_pem(KeyEncoding::Pkcs1)?.0.as_bytes(),
                0o600,
            )?;
            w.file(
                cp_root,
                &format!("{kdir}/pki/{cert_name}"),
                cert.to_pem()?.as_bytes(),
                0o644,
            )?;
        }
    }
    Ok(())
}

/// Adds kube-vip to a control-plane node written by [`init`] (an etcd-only node, without
/// admin.conf, gets none): as EKS Anywhere renders it, or the lab's probe-ful stand-in. The
/// node is an init node: from Kubernetes 1.29 on, EKS Anywhere's kube-vip there mounts
/// super-admin.conf (bottlerocket-bootstrap's `patchKubeVipManifest`, or the `sed` of the
/// kubeadm layouts), because admin.conf is bound to its role only once the apiserver is up.
pub fn add_kube_vip(
    root: &Path,
    layout: LabLayout,
    port_offset: u16,
    shape: KubeVipShape,
    kubernetes_version: crate::node::manifests::Version,
) -> Result<(), LabError> {
    let kdir = match layout {
        LabLayout::Kubeadm => crate::node::catalog::paths::KUBEADM_DIR,
        LabLayout::Bottlerocket => crate::node::catalog::paths::BOTTLEROCKET_KUBEADM_DIR,
    };
    if !root.join(kdir).join("admin.conf").is_file() {
        return Ok(());
    }
    let (file, yaml) = match shape {
        KubeVipShape::Probe => manifests::kube_vip_probe(&format!("/{kdir}"), port_offset),
        KubeVipShape::EksAnywhere => {
            let super_admin = kubernetes_version >= crate::node::manifests::Version::new(1, 29, 0);
            manifests::kube_vip_eks_anywhere(&manifests::KubeVipParams {
                bottlerocket: layout == LabLayout::Bottlerocket,
                kubeconfig: if super_admin {
                    "super-admin.conf"
                } else {
                    "admin.conf"
                },
                vip: manifests::LAB_VIP,
                port_offset,
            })
        }
    };
    let path = root.join(manifest_dir(layout)).join(file);
    crate::sys::fsutil::write_atomic(&path, yaml.as_bytes(), 0o600)
        .map_err(|e| LabError(format!("cannot write '{}': {e}", path.display())))
}

/// Where `lab init` writes static pod manifests: the kubelet's folder on a kubeadm host; on
/// Bottlerocket the manifests live in API settings, and EKS Anywhere keeps copies in
/// `/var/lib/kubeadm/manifests`, which tests load into the API emulator.
pub fn manifest_dir(layout: LabLayout) -> &'static str {
    match layout {
        LabLayout::Kubeadm => crate::node::catalog::paths::KUBEADM_MANIFESTS,
        LabLayout::Bottlerocket => crate::node::catalog::paths::BOTTLEROCKET_KUBEADM_MANIFESTS,
    }
}

/// `host:port` with IPv6 in brackets.
pub fn socket_text(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}
