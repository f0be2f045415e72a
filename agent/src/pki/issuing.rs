//! Issuing: sign a certificate from a [`Profile`] with a CA, writing extensions in the order
//! Go's `crypto/x509` does, so certificates look like the ones kubeadm writes.

use super::{Cert, PkiError, PrivateKey, encode_err, oid, unix_to_time};
use aws_lc_rs::rand::SecureRandom;
use der::asn1::{BitString, Ia5String, OctetString, PrintableStringRef, SetOfVec, Utf8StringRef};
use der::oid::ObjectIdentifier;
use der::{Any, Encode};
use std::net::IpAddr;
use x509_cert::Certificate;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::ext::Extension;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, KeyUsages,
    SubjectAltName, SubjectKeyIdentifier,
};
use x509_cert::name::{Name, RdnSequence, RelativeDistinguishedName};
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::SubjectPublicKeyInfoOwned;
use x509_cert::time::Validity;

/// Who signs: the CA certificate and its key.
pub struct Signer<'a> {
    pub cert: &'a Cert,
    pub key: &'a PrivateKey,
}

/// How SANs are written, following the tool whose output is being reproduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanOrder {
    /// kubeadm: DNS names de-duplicated and sorted, then IPs de-duplicated in first-seen order.
    Kubeadm,
    /// etcdadm: as given, no sorting or de-duplication.
    AsGiven,
}

/// Everything that makes up a certificate apart from its signer, key, serial and validity.
#[derive(Debug, Clone)]
pub struct Profile {
    /// The subject as DER-encodable name; kept verbatim on renewal.
    pub subject: Name,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// Every other SAN (URI, email, ...), written as given: email after the DNS names, the rest
    /// after the IP addresses, as Go's x509 orders them.
    pub other_sans: Vec<GeneralName>,
    pub san_order: SanOrder,
    /// KeyUsage bits (always written critical).
    pub key_usage: KeyUsage,
    pub ext_key_usage: Vec<ObjectIdentifier>,
    /// `None`: no BasicConstraints extension (etcdadm leaves). `Some(false)`: critical CA:FALSE
    /// (kubeadm leaves). `Some(true)`: critical CA:TRUE (CAs).
    pub basic_constraints: Option<bool>,
    /// Whether to write a SubjectKeyIdentifier (CAs only, as Go does).
    pub subject_key_id: bool,
}

impl Profile {
    /// A CA's profile as kubeadm makes it: critical CA:TRUE, the CA key usages, a subject key
    /// id, no extended key usage.
    pub fn ca(subject: Name, dns_names: Vec<String>) -> Profile {
        Profile {
            subject,
            dns_names,
            ip_addresses: vec![],
            other_sans: vec![],
            san_order: SanOrder::Kubeadm,
            key_usage: ca_key_usage(),
            ext_key_usage: vec![],
            basic_constraints: Some(true),
            subject_key_id: true,
        }
    }

    /// A client certificate's profile as kubeadm makes one: critical CA:FALSE, the leaf key
    /// usages, client auth, no SAN.
    pub fn client(subject: Name) -> Profile {
        Profile {
            subject,
            dns_names: vec![],
            ip_addresses: vec![],
            other_sans: vec![],
            san_order: SanOrder::Kubeadm,
            key_usage: leaf_key_usage(),
            ext_key_usage: vec![super::oid::CLIENT_AUTH],
            basic_constraints: Some(false),
            subject_key_id: false,
        }
    }
}

/// Validity and serial for one issued certificate.
#[derive(Debug, Clone, Copy)]
pub struct Issuance {
    pub serial: u64,
    pub not_before: i64,
    pub not_after: i64,
}

/// A random serial in [1, 2^63-1), as current kubeadm draws it.
pub fn random_serial() -> Result<u64, PkiError> {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    loop {
        let mut b = [0u8; 8];
        rng.fill(&mut b).map_err(|_| PkiError::Crypto {
            step: "draw a random serial",
        })?;
        let v = u64::from_be_bytes(b) & 0x7fff_ffff_ffff_ffff;
        if v != 0 && v != 0x7fff_ffff_ffff_ffff {
            return Ok(v);
        }
    }
}

/// Builds a subject the way Go's `pkix.Name` encodes `{Organization, CommonName}`: one RDN with
/// every O value, then one RDN with the CN; PrintableString where possible, else UTF8String.
pub fn kubeadm_subject(common_name: &str, organizations: &[&str]) -> Result<Name, PkiError> {
    let mut rdns = Vec::new();
    if !organizations.is_empty() {
        let mut set = SetOfVec::new();
        for o in organizations {
            set.insert(attribute(oid::ORGANIZATION, o)?)
                .map_err(encode_err)?;
        }
        rdns.push(RelativeDistinguishedName(set));
    }
    let mut cn = SetOfVec::new();
    cn.insert(attribute(oid::COMMON_NAME, common_name)?)
        .map_err(encode_err)?;
    rdns.push(RelativeDistinguishedName(cn));
    Ok(RdnSequence(rdns))
}

fn attribute(oid: ObjectIdentifier, value: &str) -> Result<AttributeTypeAndValue, PkiError> {
    let printable = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || " '()+,-./:=?".contains(c));
    let value = if printable {
        Any::encode_from(&PrintableStringRef::new(value).map_err(encode_err)?)
    } else {
        Any::encode_from(&Utf8StringRef::new(value).map_err(encode_err)?)
    }
    .map_err(encode_err)?;
    Ok(AttributeTypeAndValue { oid, value })
}

/// Issues a certificate for `public_key` with `profile`, signed by `signer` (or self-signed when
/// `signer` is `None`, with `self_key` signing).
pub fn issue(
    profile: &Profile,
    public_key: &SubjectPublicKeyInfoOwned,
    signer: Option<&Signer<'_>>,
    self_key: &PrivateKey,
    issuance: Issuance,
) -> Result<Cert, PkiError> {
    let signing_key = signer.map(|s| s.key).unwrap_or(self_key);
    let issuer = match signer {
        Some(s) => s.cert.x509.tbs_certificate.subject.clone(),
        None => profile.subject.clone(),
    };
    let extensions = extensions(profile, public_key, signer)?;
    let algorithm = signing_key.signature_algorithm();
    let tbs = x509_cert::TbsCertificate {
        version: x509_cert::Version::V3,
        serial_number: SerialNumber::new(&issuance.serial.to_be_bytes()).map_err(encode_err)?,
        signature: algorithm.clone(),
        issuer,
        validity: Validity {
            not_before: unix_to_time(issuance.not_before)?,
            not_after: unix_to_time(issuance.not_after)?,
        },
        subject: profile.subject.clone(),
        subject_public_key_info: public_key.clone(),
        issuer_unique_id: None,
        subject_unique_id: None,
        extensions: Some(extensions),
    };
    let tbs_der = tbs.to_der().map_err(encode_err)?;
    let signature = signing_key.sign(&tbs_der)?;
    let cert = Certificate {
        tbs_certificate: tbs,
        signature_algorithm: algorithm,
        signature: BitString::from_bytes(&signature).map_err(encode_err)?,
    };
    let der = cert.to_der().map_err(encode_err)?;
    Ok(Cert {
        der,
        x509: cert,
        verifier: std::sync::OnceLock::new(),
    })
}

/// The extensions of a new certificate, in the order Go's x509 writes them: key usage, extended
/// key usage, basic constraints, subject and authority key ids, subject alternative names.
fn extensions(
    profile: &Profile,
    public_key: &SubjectPublicKeyInfoOwned,
    signer: Option<&Signer<'_>>,
) -> Result<Vec<Extension>, PkiError> {
    let mut extensions = vec![extension(oid::KEY_USAGE, true, &profile.key_usage)?];
    if !profile.ext_key_usage.is_empty() {
        let eku = ExtendedKeyUsage(profile.ext_key_usage.clone());
        extensions.push(extension(oid::EXT_KEY_USAGE, false, &eku)?);
    }
    if let Some(ca) = profile.basic_constraints {
        let bc = BasicConstraints {
            ca,
            path_len_constraint: None,
        };
        extensions.push(extension(oid::BASIC_CONSTRAINTS, true, &bc)?);
    }
    if profile.subject_key_id {
        // Go: SHA-1 of the subjectPublicKey bits (RFC 5280 §4.2.1.2 method 1).
        let ski = aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
            public_key.subject_public_key.raw_bytes(),
        );
        let ski = SubjectKeyIdentifier(OctetString::new(ski.as_ref()).map_err(encode_err)?);
        extensions.push(extension(oid::SUBJECT_KEY_ID, false, &ski)?);
    }
    if let Some(ca_ski) = signer.and_then(|s| s.cert.subject_key_id()) {
        let aki = AuthorityKeyIdentifier {
            key_identifier: Some(OctetString::new(ca_ski).map_err(encode_err)?),
            ..Default::default()
        };
        extensions.push(extension(oid::AUTHORITY_KEY_ID, false, &aki)?);
    }
    let names = san_names(profile)?;
    if !names.is_empty() {
        extensions.push(extension(
            oid::SUBJECT_ALT_NAME,
            false,
            &SubjectAltName(names),
        )?);
    }
    Ok(extensions)
}

/// One extension holding `value`'s DER.
fn extension(
    id: ObjectIdentifier,
    critical: bool,
    value: &impl Encode,
) -> Result<Extension, PkiError> {
    Ok(Extension {
        extn_id: id,
        critical,
        extn_value: OctetString::new(value.to_der().map_err(encode_err)?).map_err(encode_err)?,
    })
}

fn san_names(profile: &Profile) -> Result<Vec<GeneralName>, PkiError> {
    let mut dns = profile.dns_names.clone();
    let mut ips = profile.ip_addresses.clone();
    if profile.san_order == SanOrder::Kubeadm {
        dns.sort();
        dns.dedup();
        let mut seen = Vec::new();
        ips.retain(|ip| {
            let fresh = !seen.contains(ip);
            seen.push(*ip);
            fresh
        });
    }
    let mut names = Vec::new();
    for d in dns {
        names.push(GeneralName::DnsName(
            Ia5String::new(&d).map_err(encode_err)?,
        ));
    }
    names.extend(
        profile
            .other_sans
            .iter()
            .filter(|n| matches!(n, GeneralName::Rfc822Name(_)))
            .cloned(),
    );
    for ip in ips {
        let bytes = match ip {
            IpAddr::V4(v4) => v4.octets().to_vec(),
            IpAddr::V6(v6) => v6.octets().to_vec(),
        };
        names.push(GeneralName::IpAddress(
            OctetString::new(bytes).map_err(encode_err)?,
        ));
    }
    names.extend(
        profile
            .other_sans
            .iter()
            .filter(|n| !matches!(n, GeneralName::Rfc822Name(_)))
            .cloned(),
    );
    Ok(names)
}

/// The KeyUsage kubeadm gives every leaf: digitalSignature and keyEncipherment.
pub fn leaf_key_usage() -> KeyUsage {
    KeyUsage(KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment)
}

/// The KeyUsage kubeadm gives CAs: leaf usages plus keyCertSign.
pub fn ca_key_usage() -> KeyUsage {
    KeyUsage(KeyUsages::DigitalSignature | KeyUsages::KeyEncipherment | KeyUsages::KeyCertSign)
}
