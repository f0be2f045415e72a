//! Certificates: parse a PEM or DER certificate, describe it (`check`'s facts, names written as x509-cert
//! does, key usages), and verify its signature against a CA.

use super::{KeyAlgorithm, PkiError, encode_err, oid};
use aws_lc_rs::signature as sig;
use der::asn1::{PrintableStringRef, Utf8StringRef};
use der::oid::ObjectIdentifier;
use der::pem::LineEnding;
use der::{Any, Decode, EncodePem};
use std::fmt;
use std::net::IpAddr;
use x509_cert::Certificate;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{KeyUsage, KeyUsages};
use x509_cert::name::Name;
use x509_cert::time::Time;

/// A parsed certificate together with its original DER bytes.
#[derive(Clone)]
pub struct Cert {
    /// The DER bytes exactly as read (used for fingerprints and signature checks).
    pub der: Vec<u8>,
    /// The decoded structure.
    pub x509: Certificate,
    /// Its public key parsed by the crypto library for the first signature algorithm it checked
    /// (`None` when the library refused it): a CA checks a dozen signatures in one run.
    pub(super) verifier: std::sync::OnceLock<Option<(usize, sig::ParsedPublicKey)>>,
}

impl fmt::Debug for Cert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cert({})", self.x509.tbs_certificate.subject)
    }
}

/// The human- and machine-readable facts `check` reports about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub subject: String,
    pub issuer: String,
    pub serial: String,
    pub not_before: i64,
    pub not_after: i64,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub key_usage: Vec<String>,
    pub ext_key_usage: Vec<String>,
    pub public_key: String,
    pub is_ca: bool,
}

impl Cert {
    /// Parses the first `CERTIFICATE` block of a PEM file.
    pub fn from_pem(bytes: &[u8]) -> Result<Cert, PkiError> {
        let first = certrotor_hot::first_certificate_pem(bytes);
        match first {
            None => Err(PkiError::NoPemBlock {
                wanted: "CERTIFICATE",
            }),
            Some(Err(e)) => Err(PkiError::BadPem {
                detail: pem_error_text(&e),
            }),
            Some(Ok(der)) => Cert::from_der(der.as_ref()),
        }
    }

    /// Parses every `CERTIFICATE` block of a PEM file (a trust bundle), in order, at most
    /// `max` of them: a bundle of more is refused, as is a block that does not parse.
    pub fn all_from_pem(bytes: &[u8], max: usize) -> Result<Vec<Cert>, PkiError> {
        let mut out = Vec::new();
        use rustls_pki_types::pem::PemObject;
        for der in rustls_pki_types::CertificateDer::pem_slice_iter(bytes) {
            if out.len() == max {
                return Err(PkiError::BadCertificate {
                    detail: format!("more than {max} certificates in one file"),
                });
            }
            let der = der.map_err(|e| PkiError::BadPem {
                detail: pem_error_text(&e),
            })?;
            out.push(Cert::from_der(der.as_ref())?);
        }
        if out.is_empty() {
            return Err(PkiError::NoPemBlock {
                wanted: "CERTIFICATE",
            });
        }
        Ok(out)
    }

    /// Parses DER bytes.
    pub fn from_der(der: &[u8]) -> Result<Cert, PkiError> {
        let x509 =
            certrotor_hot::certificate_from_der(der).map_err(|e| PkiError::BadCertificate {
                detail: e.to_string(),
            })?;
        Ok(Cert {
            der: der.to_vec(),
            x509,
            verifier: std::sync::OnceLock::new(),
        })
    }

    /// PEM text as Go's `pem.Encode` writes it (64-column base64, LF).
    pub fn to_pem(&self) -> Result<String, PkiError> {
        self.x509.to_pem(LineEnding::LF).map_err(encode_err)
    }

    /// notBefore as Unix seconds.
    pub fn not_before(&self) -> i64 {
        time_to_unix(&self.x509.tbs_certificate.validity.not_before)
    }

    /// notAfter as Unix seconds.
    pub fn not_after(&self) -> i64 {
        time_to_unix(&self.x509.tbs_certificate.validity.not_after)
    }

    /// The subject as RFC 4514 text (`CN=kube-apiserver`).
    pub fn subject(&self) -> String {
        name_text(&self.x509.tbs_certificate.subject)
    }

    /// The subject's values of one attribute (CN, O, …) in order, for the string types kubeadm
    /// and etcdadm write.
    pub fn subject_values(&self, attribute: ObjectIdentifier) -> Vec<String> {
        self.x509
            .tbs_certificate
            .subject
            .0
            .iter()
            .flat_map(|rdn| rdn.0.iter())
            .filter(|atv| atv.oid == attribute)
            .filter_map(|atv| common_attribute(atv).map(|(_, v)| v.to_string()))
            .collect()
    }

    /// SHA-256 of the DER, lower-case hex: what live verification compares.
    pub fn sha256_hex(&self) -> String {
        hex(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &self.der).as_ref())
    }

    /// Whether BasicConstraints says CA:TRUE.
    pub fn is_ca(&self) -> bool {
        matches!(certrotor_hot::basic_constraints(&self.x509.tbs_certificate), Ok(Some((_, bc))) if bc.ca)
    }

    /// The SubjectKeyIdentifier, if present.
    pub fn subject_key_id(&self) -> Option<Vec<u8>> {
        match certrotor_hot::subject_key_identifier(&self.x509.tbs_certificate) {
            Ok(Some((_, ski))) => Some(ski.0.as_bytes().to_vec()),
            _ => None,
        }
    }

    /// Subject alternative names other than DNS and IP (URI, email, otherName, ...), in
    /// certificate order: kept verbatim on renewal.
    pub fn other_sans(&self) -> Vec<GeneralName> {
        match certrotor_hot::subject_alt_name(&self.x509.tbs_certificate) {
            Ok(Some((_, san))) => san
                .0
                .into_iter()
                .filter(|n| !matches!(n, GeneralName::DnsName(_) | GeneralName::IpAddress(_)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// DNS and IP subject alternative names, in certificate order.
    pub fn sans(&self) -> (Vec<String>, Vec<IpAddr>) {
        let mut dns = Vec::new();
        let mut ips = Vec::new();
        if let Ok(Some((_, san))) = certrotor_hot::subject_alt_name(&self.x509.tbs_certificate) {
            for name in san.0 {
                match name {
                    GeneralName::DnsName(d) => dns.push(d.to_string()),
                    GeneralName::IpAddress(o) => {
                        if let Some(ip) = ip_from_bytes(o.as_bytes()) {
                            ips.push(ip);
                        }
                    }
                    _ => {}
                }
            }
        }
        (dns, ips)
    }

    /// Extended key usages as OIDs, in certificate order.
    pub fn ext_key_usage_oids(&self) -> Vec<ObjectIdentifier> {
        match certrotor_hot::extended_key_usage(&self.x509.tbs_certificate) {
            Ok(Some((_, eku))) => eku.0,
            _ => Vec::new(),
        }
    }

    /// The KeyUsage extension, if present.
    pub fn key_usage(&self) -> Option<KeyUsage> {
        match certrotor_hot::key_usage(&self.x509.tbs_certificate) {
            Ok(Some((_, ku))) => Some(ku),
            _ => None,
        }
    }

    /// The raw subjectPublicKey bits (RSAPublicKey DER, or an uncompressed EC point).
    pub fn public_key_bits(&self) -> &[u8] {
        self.x509
            .tbs_certificate
            .subject_public_key_info
            .subject_public_key
            .raw_bytes()
    }

    /// The public key algorithm and size, e.g. `RSA-2048` or `ECDSA-P256`.
    pub fn public_key_algorithm(&self) -> KeyAlgorithm {
        KeyAlgorithm::of_spki(&self.x509.tbs_certificate.subject_public_key_info)
    }

    /// Collects the facts `check` reports.
    pub fn facts(&self) -> CertFacts {
        let tbs = &self.x509.tbs_certificate;
        let (dns, ips) = self.sans();
        CertFacts {
            subject: name_text(&tbs.subject),
            issuer: name_text(&tbs.issuer),
            serial: serial_hex(tbs.serial_number.as_bytes()),
            not_before: self.not_before(),
            not_after: self.not_after(),
            dns_names: dns,
            ip_addresses: ips.iter().map(|i| i.to_string()).collect(),
            key_usage: self.key_usage().map(key_usage_names).unwrap_or_default(),
            ext_key_usage: self.ext_key_usage_oids().iter().map(eku_name).collect(),
            public_key: self.public_key_algorithm().to_string(),
            is_ca: self.is_ca(),
        }
    }

    /// Checks that `ca` signed this certificate: the issuer name matches the CA's subject and
    /// the signature verifies with the CA's public key.
    pub fn verify_signed_by(&self, ca: &Cert, ca_name: &str) -> Result<(), PkiError> {
        let not_signed = |detail: String| PkiError::NotSignedBy {
            ca: ca_name.to_string(),
            detail,
        };
        if !names_match(
            &self.x509.tbs_certificate.issuer,
            &ca.x509.tbs_certificate.subject,
        ) {
            return Err(not_signed(format!(
                "issuer '{}' differs from the CA subject '{}'",
                self.x509.tbs_certificate.issuer, ca.x509.tbs_certificate.subject
            )));
        }
        let tbs = tbs_bytes(&self.der).ok_or_else(|| not_signed("TBS bytes unreadable".into()))?;
        let index = verification_algorithm(
            &self.x509.signature_algorithm.oid,
            ca.public_key_algorithm(),
        )
        .ok_or_else(|| {
            not_signed(format!(
                "unsupported signature algorithm {} with a {} CA key",
                self.x509.signature_algorithm.oid,
                ca.public_key_algorithm()
            ))
        })?;
        let signature = self.x509.signature.raw_bytes();
        let algorithm = VERIFICATION_ALGORITHMS[index];
        let parsed = ca.verifier.get_or_init(|| {
            sig::ParsedPublicKey::new(algorithm, ca.public_key_bits())
                .ok()
                .map(|key| (index, key))
        });
        match parsed {
            Some((i, key)) if *i == index => key.verify_sig(tbs, signature),
            // Another algorithm than the first, or a key the library refused (which fails here
            // the same way).
            _ => {
                sig::UnparsedPublicKey::new(algorithm, ca.public_key_bits()).verify(tbs, signature)
            }
        }
        .map_err(|_| not_signed("the signature does not verify with the CA's public key".into()))
    }
}

/// RFC 5280 §7.1 name matching: the same attribute types in the same RDN structure, with
/// string values compared after case folding and white-space collapsing, whatever their string
/// type (PrintableString, UTF8String, ...). Byte-identical names always match.
pub fn names_match(a: &Name, b: &Name) -> bool {
    if a == b {
        return true;
    }
    let norm = |n: &Name| -> Option<Vec<Vec<(ObjectIdentifier, String)>>> {
        n.0.iter()
            .map(|rdn| {
                let mut v: Vec<(ObjectIdentifier, String)> = rdn
                    .0
                    .iter()
                    .map(|atv| Some((atv.oid, fold(&attribute_text(&atv.value)?))))
                    .collect::<Option<_>>()?;
                v.sort();
                Some(v)
            })
            .collect()
    };
    matches!((norm(a), norm(b)), (Some(x), Some(y)) if x == y)
}

/// The text of a directory string, whatever its ASN.1 string type.
fn attribute_text(value: &Any) -> Option<String> {
    use der::Tag;
    let bytes = value.value();
    match der::Tagged::tag(value) {
        Tag::PrintableString
        | Tag::Utf8String
        | Tag::Ia5String
        | Tag::TeletexString
        | Tag::VisibleString => std::str::from_utf8(bytes).ok().map(str::to_string),
        Tag::BmpString => {
            let units: Vec<u16> = bytes
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

fn fold(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Takes the TBSCertificate TLV bytes out of a certificate's DER, as signed (sliced with der's
/// reader, never re-encoded).
fn tbs_bytes(cert_der: &[u8]) -> Option<&[u8]> {
    use der::{Header, Reader, Tag};
    let mut reader = der::SliceReader::new(cert_der).ok()?;
    // Certificate ::= SEQUENCE { tbsCertificate TBSCertificate, ... }
    let certificate = Header::decode(&mut reader).ok()?;
    certificate.tag.assert_eq(Tag::Sequence).ok()?;
    reader
        .peek_header()
        .ok()?
        .tag
        .assert_eq(Tag::Sequence)
        .ok()?;
    reader.tlv_bytes().ok()
}

/// The signature algorithms certrotor verifies, by [`verification_algorithm`]'s index.
const VERIFICATION_ALGORITHMS: [&dyn sig::VerificationAlgorithm; 8] = [
    &sig::RSA_PKCS1_2048_8192_SHA256,
    &sig::RSA_PKCS1_2048_8192_SHA384,
    &sig::RSA_PKCS1_2048_8192_SHA512,
    &sig::ECDSA_P256_SHA256_ASN1,
    &sig::ECDSA_P256_SHA384_ASN1,
    &sig::ECDSA_P384_SHA256_ASN1,
    &sig::ECDSA_P384_SHA384_ASN1,
    &sig::ED25519,
];

/// The index in [`VERIFICATION_ALGORITHMS`] of a signature algorithm with a CA key.
fn verification_algorithm(signature_oid: &ObjectIdentifier, ca_key: KeyAlgorithm) -> Option<usize> {
    let s = *signature_oid;
    Some(match (s, ca_key) {
        (o, KeyAlgorithm::Rsa(_)) if o == oid::SHA256_WITH_RSA => 0,
        (o, KeyAlgorithm::Rsa(_)) if o == oid::SHA384_WITH_RSA => 1,
        (o, KeyAlgorithm::Rsa(_)) if o == oid::SHA512_WITH_RSA => 2,
        (o, KeyAlgorithm::EcdsaP256) if o == oid::ECDSA_WITH_SHA256 => 3,
        (o, KeyAlgorithm::EcdsaP256) if o == oid::ECDSA_WITH_SHA384 => 4,
        (o, KeyAlgorithm::EcdsaP384) if o == oid::ECDSA_WITH_SHA256 => 5,
        (o, KeyAlgorithm::EcdsaP384) if o == oid::ECDSA_WITH_SHA384 => 6,
        (o, KeyAlgorithm::Ed25519) if o == oid::ED25519 => 7,
        _ => return None,
    })
}

fn pem_error_text(e: &rustls_pki_types::pem::Error) -> String {
    // Never quote the input: a key whose line breaks were lost is one long "line", and the
    // parser's markers and lines would echo it whole.
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { .. } => "the PEM block is truncated or has lost its line breaks \
             (no END line found after the BEGIN line); restore the file with its original line \
             breaks"
            .into(),
        E::IllegalSectionStart { .. } => "malformed BEGIN line (was the PEM text pasted on one \
             line?); restore the file with its original line breaks"
            .into(),
        E::Base64Decode(_) => "the PEM body is not valid base64".into(),
        _ => "the PEM data cannot be read".into(),
    }
}

/// A name as RFC 4514 text, exactly as x509-cert's `Display` writes it. That `Display` looks each
/// attribute's short name up by scanning const-oid's whole name table (a tenth of a `check`'s
/// parsing time); the attributes kubeadm and etcdadm write (CN, O, OU, C, ST, L) with string
/// values are written here from a table, every other attribute by x509-cert itself.
pub fn name_text(name: &Name) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for (i, rdn) in name.0.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, atv) in rdn.0.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            match common_attribute(atv) {
                Some((key, value)) => {
                    out.push_str(key);
                    out.push('=');
                    escape_attribute_value(&mut out, value);
                }
                None => {
                    let _ = write!(out, "{atv}");
                }
            }
        }
    }
    out
}

/// The short names of the attributes in kubeadm's and etcdadm's names, as const-oid's
/// `shortest_name_by_oid` gives them, upper-cased (checked against it in a test).
pub(super) const COMMON_ATTRIBUTES: [(ObjectIdentifier, &str); 6] = [
    (oid::COMMON_NAME, "CN"),
    (oid::ORGANIZATION, "O"),
    (ObjectIdentifier::new_unwrap("2.5.4.11"), "OU"),
    (ObjectIdentifier::new_unwrap("2.5.4.6"), "C"),
    (ObjectIdentifier::new_unwrap("2.5.4.8"), "ST"),
    (ObjectIdentifier::new_unwrap("2.5.4.7"), "L"),
];

/// A common attribute's short name and string value (PrintableString or UTF8String).
fn common_attribute(atv: &AttributeTypeAndValue) -> Option<(&'static str, &str)> {
    use der::Tagged;
    let key = COMMON_ATTRIBUTES
        .iter()
        .find(|(o, _)| *o == atv.oid)
        .map(|(_, k)| *k)?;
    let value = match atv.value.tag() {
        der::Tag::PrintableString => PrintableStringRef::try_from(&atv.value).ok()?.as_str(),
        der::Tag::Utf8String => Utf8StringRef::try_from(&atv.value).ok()?.as_str(),
        _ => return None,
    };
    Some((key, value))
}

/// RFC 4514 escaping of an attribute value, as x509-cert's `Display` does it.
fn escape_attribute_value(out: &mut String, value: &str) {
    use std::fmt::Write as _;
    let mut chars = value.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || chars.peek().is_none() => out.push_str("\\ "),
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\x00'..='\x1f' | '\x7f' => {
                let _ = write!(out, "\\{:02x}", c as u8);
            }
            _ => out.push(c),
        }
    }
}

/// Converts an X.509 time to Unix seconds.
pub fn time_to_unix(t: &Time) -> i64 {
    t.to_unix_duration().as_secs() as i64
}

/// Converts Unix seconds to an X.509 time: UTCTime before 2050, GeneralizedTime after (RFC 5280).
pub fn unix_to_time(secs: i64) -> Result<Time, PkiError> {
    let secs = u64::try_from(secs).map_err(|_| PkiError::Encode {
        detail: "certificate times before 1970 are not supported".into(),
    })?;
    let duration = std::time::Duration::from_secs(secs);
    let dt = der::DateTime::from_unix_duration(duration).map_err(encode_err)?;
    if dt.year() < 2050 {
        Ok(Time::UtcTime(
            der::asn1::UtcTime::from_date_time(dt).map_err(encode_err)?,
        ))
    } else {
        Ok(Time::GeneralTime(
            der::asn1::GeneralizedTime::from_date_time(dt),
        ))
    }
}

/// Hex of a DER INTEGER's content with leading zero bytes removed, lower case.
pub fn serial_hex(bytes: &[u8]) -> String {
    let trimmed: &[u8] = match bytes.iter().position(|b| *b != 0) {
        Some(i) => &bytes[i..],
        None => &[0],
    };
    hex(trimmed)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    base16ct::lower::encode_string(bytes)
}

fn ip_from_bytes(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

/// RFC 5280 names of the KeyUsage bits that are set.
pub fn key_usage_names(ku: KeyUsage) -> Vec<String> {
    const NAMES: [(KeyUsages, &str); 9] = [
        (KeyUsages::DigitalSignature, "digitalSignature"),
        (KeyUsages::NonRepudiation, "contentCommitment"),
        (KeyUsages::KeyEncipherment, "keyEncipherment"),
        (KeyUsages::DataEncipherment, "dataEncipherment"),
        (KeyUsages::KeyAgreement, "keyAgreement"),
        (KeyUsages::KeyCertSign, "keyCertSign"),
        (KeyUsages::CRLSign, "cRLSign"),
        (KeyUsages::EncipherOnly, "encipherOnly"),
        (KeyUsages::DecipherOnly, "decipherOnly"),
    ];
    NAMES
        .iter()
        .filter(|(bit, _)| ku.0.contains(*bit))
        .map(|(_, n)| n.to_string())
        .collect()
}

/// The RFC 5280 short name of an extended key usage, or its dotted OID.
pub fn eku_name(o: &ObjectIdentifier) -> String {
    match o.to_string().as_str() {
        "1.3.6.1.5.5.7.3.1" => "serverAuth".into(),
        "1.3.6.1.5.5.7.3.2" => "clientAuth".into(),
        "1.3.6.1.5.5.7.3.3" => "codeSigning".into(),
        "1.3.6.1.5.5.7.3.4" => "emailProtection".into(),
        "1.3.6.1.5.5.7.3.8" => "timeStamping".into(),
        "1.3.6.1.5.5.7.3.9" => "OCSPSigning".into(),
        other => other.to_string(),
    }
}
