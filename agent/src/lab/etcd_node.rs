//! The external etcd node `lab init` writes with `--topology external-etcd`: its CA (of which
//! the control plane keeps only the certificate), its etcdadm leaves and manifest, and the
//! control plane's copy of its apiserver-etcd-client pair.

use std::net::IpAddr;
use std::path::Path;

use crate::lab::certs::{LabClock, LeafSpec, Writer, issue_leaf, write_ca};
use crate::lab::{LabError, LabLayout, LabOptions, lab_dirs, manifests};
use crate::pki::{Cert, KeyEncoding, PrivateKey, oid};

/// EKS Anywhere: the etcd CA comes from Cluster API, CN "kubernetes" like the others; the
/// control plane (`cp`) holds only its certificate, so it signs no etcd certificate.
pub(super) fn write_external_etcd_ca(
    w: &mut Writer,
    cp: &Path,
    etcd_root: &Path,
    opts: &LabOptions,
    clock: &LabClock,
) -> Result<(Cert, PrivateKey), LabError> {
    let (kdir, etcd_dir) = lab_dirs(opts.layout);
    let (etcd, etcd_key) = write_ca(
        w,
        etcd_root,
        &format!("{etcd_dir}/ca"),
        "kubernetes",
        opts,
        clock,
    )?;
    w.file(
        cp,
        &format!("{kdir}/pki/etcd/ca.crt"),
        etcd.to_pem()?.as_bytes(),
        0o644,
    )?;
    Ok((etcd, etcd_key))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn write_etcd_node(
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
    let both = [oid::SERVER_AUTH, oid::CLIENT_AUTH];
    let base = |file: &str| format!("{etcd_dir}/{file}");
    let specs = [
        LeafSpec::named(
            base("server"),
            name.clone(),
            vec![name.clone()],
            vec![ip, IpAddr::from([127, 0, 0, 1])],
            &both,
            true,
        ),
        LeafSpec::named(
            base("peer"),
            name.clone(),
            vec![name.clone()],
            vec![ip],
            &both,
            true,
        ),
        LeafSpec::client(
            base("etcdctl-etcd-client"),
            format!("{name}-etcdctl"),
            vec!["system:masters"],
            true,
        ),
        LeafSpec::client(
            base("apiserver-etcd-client"),
            format!("{name}-kube-apiserver-etcd-client"),
            vec!["system:masters"],
            true,
        ),
    ];
    let (file, yaml) = manifests::etcdadm_etcd(
        etcd_dir,
        &name,
        ip,
        opts.port_offset,
        opts.kubernetes_version,
    );
    w.manifest(root, opts.layout, &file, &yaml)?;
    for s in &specs {
        let (cert, key) = issue_leaf(s, etcd_ca, opts, clock)?;
        w.pair(root, &s.base, &cert, &key)?;
        if s.base.ends_with("apiserver-etcd-client") {
            write_apiserver_etcd_client(w, cp_root, kdir, opts.layout, &cert, &key)?;
        }
    }
    Ok(())
}

/// The control plane's copy of the etcd node's apiserver-etcd-client pair; Bottlerocket names
/// the certificate differently.
fn write_apiserver_etcd_client(
    w: &mut Writer,
    cp_root: &Path,
    kdir: &str,
    layout: LabLayout,
    cert: &Cert,
    key: &PrivateKey,
) -> Result<(), LabError> {
    let cert_name = match layout {
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
    )
}
