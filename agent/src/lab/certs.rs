//! How the lab makes and writes its certificates: the validity windows of a lab node
//! ([`LabClock`]), the CAs, the leaves described as [`LeafSpec`]s and issued in kubeadm's or
//! etcdadm's profile, and the [`Writer`] that puts every file under a node root with its mode
//! and counts them.

use std::net::IpAddr;
use std::path::Path;

use crate::lab::{LabError, LabLayout, LabOptions, manifest_dir};
use crate::pki::{self, Cert, Issuance, KeyAlgorithm, PrivateKey, Profile, SanOrder, Signer, oid};
use crate::sys::clock::YEAR;
use crate::sys::fsutil;

/// The validity windows of a lab node.
pub(super) struct LabClock {
    /// When the cluster was made: the CAs' notBefore + 5 minutes.
    pub(super) birth: i64,
    leaf_not_after: i64,
}

impl LabClock {
    pub(super) fn new(now: i64, expires_in: i64) -> LabClock {
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
    pub(super) fn leaf(&self) -> Issuance {
        Issuance {
            serial: 0,
            not_before: self.birth - 300,
            not_after: self.leaf_not_after,
        }
    }
}

pub(super) struct Cas<'a> {
    pub(super) ca: (&'a Cert, &'a PrivateKey),
    pub(super) front_proxy: (&'a Cert, &'a PrivateKey),
    pub(super) etcd: Option<(&'a Cert, &'a PrivateKey)>,
}

pub(super) struct Writer {
    pub(super) files: usize,
}

impl Writer {
    pub(super) fn file(
        &mut self,
        root: &Path,
        rel: &str,
        data: &[u8],
        mode: u32,
    ) -> Result<(), LabError> {
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

    /// A static-pod manifest, in the layout's manifest folder.
    pub(super) fn manifest(
        &mut self,
        root: &Path,
        layout: LabLayout,
        file: &str,
        yaml: &str,
    ) -> Result<(), LabError> {
        let rel = format!("{}/{file}", manifest_dir(layout));
        self.file(root, &rel, yaml.as_bytes(), 0o600)
    }

    pub(super) fn pair(
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

pub(super) fn write_ca(
    w: &mut Writer,
    root: &Path,
    base: &str,
    cn: &str,
    opts: &LabOptions,
    clock: &LabClock,
) -> Result<(Cert, PrivateKey), LabError> {
    let key = PrivateKey::generate(opts.key_algorithm)?;
    let profile = Profile::ca(pki::kubeadm_subject(cn, &[])?, vec![cn.to_string()]);
    let issuance = Issuance {
        serial: pki::random_serial()?,
        ..clock.ca()
    };
    let cert = pki::issue(&profile, &key.spki()?, None, &key, issuance)?;
    w.pair(root, base, &cert, &key)?;
    Ok((cert, key))
}

/// A leaf to write: where, who, what for.
pub(super) struct LeafSpec<'a> {
    pub(super) base: String,
    pub(super) cn: String,
    pub(super) orgs: Vec<&'a str>,
    pub(super) dns: Vec<String>,
    pub(super) ips: Vec<IpAddr>,
    pub(super) eku: Vec<der::oid::ObjectIdentifier>,
    pub(super) etcdadm: bool,
}

pub(super) fn issue_leaf(
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

impl<'a> LeafSpec<'a> {
    /// A client certificate (no names).
    pub(super) fn client(
        base: String,
        cn: impl Into<String>,
        orgs: Vec<&'a str>,
        etcdadm: bool,
    ) -> Self {
        LeafSpec {
            base,
            cn: cn.into(),
            orgs,
            dns: vec![],
            ips: vec![],
            eku: vec![oid::CLIENT_AUTH],
            etcdadm,
        }
    }

    /// A certificate with names, for `eku`.
    pub(super) fn named(
        base: String,
        cn: impl Into<String>,
        dns: Vec<String>,
        ips: Vec<IpAddr>,
        eku: &[der::oid::ObjectIdentifier],
        etcdadm: bool,
    ) -> Self {
        LeafSpec {
            base,
            cn: cn.into(),
            orgs: vec![],
            dns,
            ips,
            eku: eku.to_vec(),
            etcdadm,
        }
    }
}
