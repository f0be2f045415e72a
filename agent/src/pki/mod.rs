//! X.509 certificates and private keys: parse, describe, verify, and issue.
//!
//! Everything certrotor knows about certificate bytes lives here, so that inventory, the lab
//! generator and renewal share one reading of a certificate and one way of signing one.
//! Certificates are handled with the RustCrypto `x509-cert` types (which keep a TBS certificate
//! byte-faithful: multi-valued RDNs, string types, extension order); keys and signatures with
//! aws-lc-rs, which can also generate RSA keys (kubeadm makes a new key on every renewal).
//!
//! This module does no file I/O and reads no clock: times are passed in as Unix seconds.
//!
//! Implementation note: [`issue`] writes extensions in the order Go's `crypto/x509` does
//! (KeyUsage, ExtKeyUsage, BasicConstraints, SKI, AKI, SAN), so certificates look like the
//! ones kubeadm writes.

pub(crate) mod bignum;
pub mod go_pem;

use std::fmt;
use std::net::IpAddr;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SecureRandom;
use aws_lc_rs::signature::{self as sig, KeyPair as _};
use der::asn1::{BitString, Ia5String, OctetString, PrintableStringRef, SetOfVec, Utf8StringRef};
use der::oid::ObjectIdentifier;
use der::pem::LineEnding;
use der::{Any, Decode, Encode, EncodePem};
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
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
use x509_cert::time::{Time, Validity};

mod key_public;
pub use key_public::KeyPublic;

/// OIDs certrotor reads or writes.
pub mod oid {
    use der::oid::ObjectIdentifier as Oid;
    pub const RSA_ENCRYPTION: Oid = Oid::new_unwrap("1.2.840.113549.1.1.1");
    pub const SHA256_WITH_RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.11");
    pub const SHA384_WITH_RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.12");
    pub const SHA512_WITH_RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.13");
    pub const EC_PUBLIC_KEY: Oid = Oid::new_unwrap("1.2.840.10045.2.1");
    pub const ECDSA_WITH_SHA256: Oid = Oid::new_unwrap("1.2.840.10045.4.3.2");
    pub const ECDSA_WITH_SHA384: Oid = Oid::new_unwrap("1.2.840.10045.4.3.3");
    pub const SECP256R1: Oid = Oid::new_unwrap("1.2.840.10045.3.1.7");
    pub const SECP384R1: Oid = Oid::new_unwrap("1.3.132.0.34");
    pub const ED25519: Oid = Oid::new_unwrap("1.3.101.112");
    pub const COMMON_NAME: Oid = Oid::new_unwrap("2.5.4.3");
    pub const ORGANIZATION: Oid = Oid::new_unwrap("2.5.4.10");
    pub const SERVER_AUTH: Oid = Oid::new_unwrap("1.3.6.1.5.5.7.3.1");
    pub const CLIENT_AUTH: Oid = Oid::new_unwrap("1.3.6.1.5.5.7.3.2");
    pub const KEY_USAGE: Oid = Oid::new_unwrap("2.5.29.15");
    pub const EXT_KEY_USAGE: Oid = Oid::new_unwrap("2.5.29.37");
    pub const BASIC_CONSTRAINTS: Oid = Oid::new_unwrap("2.5.29.19");
    pub const SUBJECT_KEY_ID: Oid = Oid::new_unwrap("2.5.29.14");
    pub const AUTHORITY_KEY_ID: Oid = Oid::new_unwrap("2.5.29.35");
    pub const SUBJECT_ALT_NAME: Oid = Oid::new_unwrap("2.5.29.17");
}

/// Largest certificate or key file certrotor reads. Real ones are a few KiB; kubeconfigs with
/// embedded data tens of KiB. Anything bigger is refused without being read whole.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// What went wrong with certificate or key bytes. Messages say what failed and, where the input
/// is the operator's, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PkiError {
    /// The bytes hold no PEM block of the wanted kind.
    NoPemBlock { wanted: &'static str },
    /// A PEM block is damaged (truncated, bad base64, missing END line).
    BadPem { detail: String },
    /// The certificate's DER does not decode.
    BadCertificate { detail: String },
    /// The private key does not decode or is of an unsupported kind.
    BadKey { detail: String },
    /// The certificate was not signed by the given CA.
    NotSignedBy { ca: String, detail: String },
    /// Signing or key generation failed inside the crypto library.
    Crypto { step: &'static str },
    /// Encoding a structure failed.
    Encode { detail: String },
    /// The private key is protected by a passphrase.
    EncryptedKey,
}

impl fmt::Display for PkiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PkiError::NoPemBlock { wanted } => write!(f, "no PEM block of type {wanted} found"),
            PkiError::BadPem { detail } => write!(f, "damaged PEM data: {detail}"),
            PkiError::BadCertificate { detail } => {
                write!(f, "certificate does not decode as X.509 DER: {detail}")
            }
            PkiError::BadKey { detail } => write!(f, "private key cannot be used: {detail}"),
            PkiError::NotSignedBy { ca, detail } => {
                write!(f, "certificate is not signed by CA '{ca}': {detail}")
            }
            PkiError::Crypto { step } => write!(f, "crypto library failed to {step}"),
            PkiError::Encode { detail } => write!(f, "failed to encode DER: {detail}"),
            PkiError::EncryptedKey => f.write_str(
                "the private key is encrypted with a passphrase, which kubeadm never does and \
                 the components cannot read: decrypt it in place ('openssl pkey -in KEY -out \
                 KEY.new', then 'chmod 600 KEY.new && mv KEY.new KEY') or restore the \
                 unencrypted key from a backup ('certrotor backups')",
            ),
        }
    }
}

impl std::error::Error for PkiError {}

fn encode_err(e: der::Error) -> PkiError {
    PkiError::Encode {
        detail: e.to_string(),
    }
}

// === Certificates ===

/// A parsed certificate together with its original DER bytes.
#[derive(Clone)]
pub struct Cert {
    /// The DER bytes exactly as read (used for fingerprints and signature checks).
    pub der: Vec<u8>,
    /// The decoded structure.
    pub x509: Certificate,
    /// Its public key parsed by the crypto library for the first signature algorithm it checked
    /// (`None` when the library refused it): a CA checks a dozen signatures in one run.
    verifier: std::sync::OnceLock<Option<(usize, sig::ParsedPublicKey)>>,
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
const COMMON_ATTRIBUTES: [(ObjectIdentifier, &str); 6] = [
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

/// Whether PEM text holds a passphrase-protected private key: PKCS#8 `ENCRYPTED PRIVATE KEY`,
/// or OpenSSL's legacy `Proc-Type: 4,ENCRYPTED` header.
fn is_encrypted_key(bytes: &[u8]) -> bool {
    // A key file is ASCII: std's substring search on text compares 16 bytes at a time for
    // needles this short, where a byte-by-byte scan was a tenth of the cost of reading a key.
    const MARKERS: [&str; 2] = ["BEGIN ENCRYPTED PRIVATE KEY", "Proc-Type: 4,ENCRYPTED"];
    match std::str::from_utf8(bytes) {
        Ok(text) => MARKERS.iter().any(|m| text.contains(m)),
        Err(_) => MARKERS
            .iter()
            .any(|m| bytes.windows(m.len()).any(|w| w == m.as_bytes())),
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

// === Keys ===

/// A public key algorithm and size, written as `check` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlgorithm {
    /// RSA with the modulus size in bits.
    Rsa(u32),
    EcdsaP256,
    EcdsaP384,
    Ed25519,
    Unknown,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyAlgorithm::Rsa(bits) => write!(f, "RSA-{bits}"),
            KeyAlgorithm::EcdsaP256 => f.write_str("ECDSA-P256"),
            KeyAlgorithm::EcdsaP384 => f.write_str("ECDSA-P384"),
            KeyAlgorithm::Ed25519 => f.write_str("Ed25519"),
            KeyAlgorithm::Unknown => f.write_str("unknown"),
        }
    }
}

impl KeyAlgorithm {
    /// Reads the algorithm and size out of a SubjectPublicKeyInfo.
    pub fn of_spki(spki: &SubjectPublicKeyInfoOwned) -> KeyAlgorithm {
        let alg = spki.algorithm.oid;
        if alg == oid::RSA_ENCRYPTION {
            rsa_modulus_bits(spki.subject_public_key.raw_bytes())
                .map(KeyAlgorithm::Rsa)
                .unwrap_or(KeyAlgorithm::Unknown)
        } else if alg == oid::EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
            match curve {
                Some(c) if c == oid::SECP256R1 => KeyAlgorithm::EcdsaP256,
                Some(c) if c == oid::SECP384R1 => KeyAlgorithm::EcdsaP384,
                _ => KeyAlgorithm::Unknown,
            }
        } else if alg == oid::ED25519 {
            KeyAlgorithm::Ed25519
        } else {
            KeyAlgorithm::Unknown
        }
    }

    /// Parses `rsa-2048`, `RSA-3072`, `ecdsa-p256`, `ECDSA-P384`.
    pub fn parse(s: &str) -> Option<KeyAlgorithm> {
        match s.to_ascii_lowercase().as_str() {
            "rsa-2048" | "rsa2048" => Some(KeyAlgorithm::Rsa(2048)),
            "rsa-3072" | "rsa3072" => Some(KeyAlgorithm::Rsa(3072)),
            "rsa-4096" | "rsa4096" => Some(KeyAlgorithm::Rsa(4096)),
            "ecdsa-p256" | "ecdsa-p-256" => Some(KeyAlgorithm::EcdsaP256),
            "ecdsa-p384" | "ecdsa-p-384" => Some(KeyAlgorithm::EcdsaP384),
            _ => None,
        }
    }
}

/// Bits of the modulus in a DER RSAPublicKey.
fn rsa_modulus_bits(rsa_public_key: &[u8]) -> Option<u32> {
    #[derive(der::Sequence)]
    struct RsaPublicKey<'a> {
        modulus: der::asn1::UintRef<'a>,
        _exponent: der::asn1::UintRef<'a>,
    }
    let key = RsaPublicKey::from_der(rsa_public_key).ok()?;
    let m = key.modulus.as_bytes();
    let first = *m.first()?;
    Some((m.len() as u32 - 1) * 8 + (8 - first.leading_zeros()))
}

/// How a private key is stored in its PEM file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEncoding {
    /// `RSA PRIVATE KEY` (kubeadm's RSA format).
    Pkcs1,
    /// `EC PRIVATE KEY` (kubeadm's ECDSA format).
    Sec1,
    /// `PRIVATE KEY`.
    Pkcs8,
}

enum KeyInner {
    Rsa(aws_lc_rs::rsa::KeyPair),
    Ec(sig::EcdsaKeyPair, KeyAlgorithm),
}

/// A private key. Its `Debug` shows only the algorithm: key bytes never reach a log.
///
/// A key read from a file ([`PrivateKey::read_pem`]) is decoded structurally (every field of
/// the PKCS#1, SEC1 or PKCS#8 structure) and its public key taken from it, which is all `check`
/// needs to prove that a key belongs to its certificate. The crypto library's full consistency
/// check of the private parts (for RSA, `RSA_check_key`: ~0.25 ms per key, a third of a
/// `check`) runs when the key is first used to sign or re-encode, or when asked for
/// ([`PrivateKey::validate`], [`PrivateKey::from_pem`]).
pub struct PrivateKey {
    algorithm: KeyAlgorithm,
    /// The subjectPublicKey bits a certificate for this key carries.
    public: Vec<u8>,
    /// The encoding it was read in, kept when it is written back.
    pub encoding: KeyEncoding,
    /// The DER as read (in `encoding`), for a key read from a file; scrubbed when dropped.
    der: Option<zeroize::Zeroizing<Vec<u8>>>,
    /// The key in the crypto library, validated: set at once for a generated key, on first use
    /// for a key read from a file.
    pair: std::sync::OnceLock<Result<KeyInner, PkiError>>,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey({}, {:?})", self.algorithm(), self.encoding)
    }
}

/// PEM text of a private key. Its `Debug` and `Display` are redacted.
pub struct SecretPem(pub String);

impl fmt::Debug for SecretPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretPem(<redacted>)")
    }
}

impl Drop for SecretPem {
    fn drop(&mut self) {
        // Volatile writes (zeroize): the compiler cannot drop the scrub of a buffer about to
        // be freed.
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

/// PKCS#1 `RSAPrivateKey` (RFC 8017 A.1.2), two-prime.
#[derive(der::Sequence)]
struct RsaPrivateKeyRef<'a> {
    version: u8,
    modulus: der::asn1::UintRef<'a>,
    public_exponent: der::asn1::UintRef<'a>,
    private_exponent: der::asn1::UintRef<'a>,
    prime1: der::asn1::UintRef<'a>,
    prime2: der::asn1::UintRef<'a>,
    exponent1: der::asn1::UintRef<'a>,
    exponent2: der::asn1::UintRef<'a>,
    coefficient: der::asn1::UintRef<'a>,
}

/// PKCS#1 `RSAPublicKey`: the subjectPublicKey of an RSA certificate.
#[derive(der::Sequence)]
struct RsaPublicKeyRef<'a> {
    modulus: der::asn1::UintRef<'a>,
    exponent: der::asn1::UintRef<'a>,
}

fn bad_key(detail: String) -> PkiError {
    PkiError::BadKey { detail }
}

/// Bit length of a big-endian unsigned integer without leading zeros.
fn bit_len(be: &[u8]) -> u32 {
    match be.first() {
        None => 0,
        Some(first) => (be.len() as u32 - 1) * 8 + (8 - first.leading_zeros()),
    }
}

/// The algorithm and public key of a PKCS#1 RSA private key, with the limits aws-lc applies
/// when it loads one (two primes, a 2048..8192-bit modulus). Errors never quote key bytes.
fn rsa_public_of(pkcs1: &[u8]) -> Result<(KeyAlgorithm, Vec<u8>), PkiError> {
    let k = RsaPrivateKeyRef::from_der(pkcs1).map_err(|e| {
        bad_key(format!(
            "RSA key rejected (not a PKCS#1 RSAPrivateKey: {e})"
        ))
    })?;
    if k.version != 0 {
        return Err(bad_key(format!(
            "RSA key rejected (version {}: only two-prime keys are supported)",
            k.version
        )));
    }
    let n = k.modulus.as_bytes();
    let e = k.public_exponent.as_bytes();
    let odd = |v: &[u8]| v.last().is_some_and(|b| b & 1 == 1);
    let private = [
        k.private_exponent,
        k.prime1,
        k.prime2,
        k.exponent1,
        k.exponent2,
        k.coefficient,
    ];
    if !odd(n) || !odd(e) || bit_len(e) < 2 || private.iter().any(|v| v.as_bytes().is_empty()) {
        return Err(bad_key(
            "RSA key rejected (a modulus or exponent is even or zero)".into(),
        ));
    }
    match bit_len(n) {
        2048..=8192 => {}
        0..=2047 => return Err(bad_key("RSA key rejected (TooSmall)".into())),
        _ => return Err(bad_key("RSA key rejected (TooLarge)".into())),
    }
    let public = RsaPublicKeyRef {
        modulus: k.modulus,
        exponent: k.public_exponent,
    }
    .to_der()
    .map_err(encode_err)?;
    Ok((KeyAlgorithm::Rsa(n.len() as u32 * 8), public))
}

/// Which relation between an RSA key's parts fails, if any (see
/// [`PrivateKey::check_private_parts`]). The answer names the relation, never a value.
fn rsa_parts_agree(
    k: &RsaPrivateKeyRef<'_>,
) -> Result<Option<&'static str>, crate::pki::bignum::OutOfMemory> {
    use crate::pki::bignum::{Bn, Ctx};
    use std::cmp::Ordering::{Equal, Less};
    let ctx = Ctx::new()?;
    let bn = |v: der::asn1::UintRef<'_>| Bn::from_be(v.as_bytes());
    let (n, e, d) = (
        bn(k.modulus)?,
        bn(k.public_exponent)?,
        bn(k.private_exponent)?,
    );
    let (p, q) = (bn(k.prime1)?, bn(k.prime2)?);
    let (dp, dq, qinv) = (bn(k.exponent1)?, bn(k.exponent2)?, bn(k.coefficient)?);
    if p.at_most_one() || q.at_most_one() {
        return Ok(Some("a prime is 0 or 1"));
    }
    if Bn::mul(&p, &q, &ctx)?.cmp(&n) != Equal {
        return Ok(Some("the modulus is not the product of the primes"));
    }
    let (p1, q1) = (Bn::minus_one(&p)?, Bn::minus_one(&q)?);
    let de = Bn::mul(&d, &e, &ctx)?;
    if !Bn::rem(&de, &p1, &ctx)?.is_one() || !Bn::rem(&de, &q1, &ctx)?.is_one() {
        return Ok(Some("the private exponent does not invert the public one"));
    }
    if Bn::rem(&d, &p1, &ctx)?.cmp(&dp) != Equal || Bn::rem(&d, &q1, &ctx)?.cmp(&dq) != Equal {
        return Ok(Some("a CRT exponent is not the private exponent's residue"));
    }
    if qinv.cmp(&p) != Less || !Bn::rem(&Bn::mul(&qinv, &q, &ctx)?, &p, &ctx)?.is_one() {
        return Ok(Some("the CRT coefficient is not the inverse of q mod p"));
    }
    Ok(None)
}

/// The algorithm and public key of a SEC1 EC private key (`curve` from the PKCS#8 wrapper, if
/// any), when the structure carries the public point uncompressed (Go and OpenSSL write it);
/// `None` when the point has to be computed from the private scalar.
fn ec_public_of(
    sec1_der: &[u8],
    curve: Option<ObjectIdentifier>,
) -> Result<Option<(KeyAlgorithm, Vec<u8>)>, PkiError> {
    let k = sec1::EcPrivateKey::from_der(sec1_der)
        .map_err(|e| bad_key(format!("EC key rejected (not a SEC1 ECPrivateKey: {e})")))?;
    let named = k.parameters.and_then(|p| p.named_curve());
    let (alg, size) = match named.or(curve) {
        Some(c) if c == oid::SECP256R1 => (KeyAlgorithm::EcdsaP256, 32),
        Some(c) if c == oid::SECP384R1 => (KeyAlgorithm::EcdsaP384, 48),
        _ => {
            return Err(bad_key(
                "not an RSA, ECDSA P-256 or P-384 key (unsupported curve)".into(),
            ));
        }
    };
    if k.private_key.is_empty() || k.private_key.len() > size {
        return Err(bad_key(format!(
            "EC key rejected (a {alg} private key of {} bytes)",
            k.private_key.len()
        )));
    }
    Ok(match k.public_key {
        Some(p) if p.len() == 1 + 2 * size && p[0] == 4 => Some((alg, p.to_vec())),
        _ => None,
    })
}

impl PrivateKey {
    /// Parses the first private key block of a PEM file (PKCS#1, SEC1 or PKCS#8) and validates
    /// it fully in the crypto library: for a key that signs or is carried into a new
    /// certificate.
    pub fn from_pem(bytes: &[u8]) -> Result<PrivateKey, PkiError> {
        let key = PrivateKey::read_pem(bytes)?;
        key.validate()?;
        Ok(key)
    }

    /// Parses the first private key block of a PEM file (PKCS#1, SEC1 or PKCS#8): its structure
    /// and public key, which proves whether it belongs to a certificate. The private parts are
    /// checked on first use or by [`Self::validate`].
    pub fn read_pem(bytes: &[u8]) -> Result<PrivateKey, PkiError> {
        if is_encrypted_key(bytes) {
            return Err(PkiError::EncryptedKey);
        }
        // The block Go's `tls.X509KeyPair` would take, decoded by Go's rules (issue 30.4).
        let block = go_pem::private_key_block(bytes)?;
        let encoding = match block.label.as_str() {
            "RSA PRIVATE KEY" => KeyEncoding::Pkcs1,
            "EC PRIVATE KEY" => KeyEncoding::Sec1,
            "PRIVATE KEY" => KeyEncoding::Pkcs8,
            _ => return Err(bad_key("unsupported private key type".into())),
        };
        let der = block.der;
        let public = match encoding {
            KeyEncoding::Pkcs1 => Some(rsa_public_of(&der)?),
            KeyEncoding::Sec1 => ec_public_of(&der, None)?,
            KeyEncoding::Pkcs8 => {
                let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice())
                    .map_err(|e| bad_key(format!("not a PKCS#8 private key ({e})")))?;
                let alg = info.algorithm.oid;
                if alg == oid::RSA_ENCRYPTION {
                    Some(rsa_public_of(info.private_key)?)
                } else if alg == oid::EC_PUBLIC_KEY {
                    let curve = info.algorithm.parameters_oid().ok();
                    ec_public_of(info.private_key, curve)?
                } else if alg == oid::ED25519 {
                    return Err(bad_key(
                        "unsupported key type Ed25519: certrotor renews with RSA and ECDSA keys, \
                         as kubeadm does; renew this PKI with the tool that made it"
                            .into(),
                    ));
                } else {
                    return Err(bad_key(format!("unsupported private key type {alg}")));
                }
            }
        };
        let mut out = PrivateKey {
            algorithm: KeyAlgorithm::Unknown,
            public: Vec::new(),
            encoding,
            der: Some(der),
            pair: std::sync::OnceLock::new(),
        };
        match public {
            Some((algorithm, public)) => {
                out.algorithm = algorithm;
                out.public = public;
            }
            None => {
                // No public point in the file: the library computes it from the private key.
                let inner = out.load()?;
                (out.algorithm, out.public) = (inner_algorithm(&inner), inner_public(&inner));
                let _ = out.pair.set(Ok(inner));
            }
        }
        Ok(out)
    }

    /// Loads the key as read into the crypto library, which checks the private parts (RSA:
    /// `RSA_check_key`; EC: the scalar gives the public point).
    fn load(&self) -> Result<KeyInner, PkiError> {
        let Some(der) = &self.der else {
            return Err(PkiError::Crypto {
                step: "load a private key",
            });
        };
        let bad = |what: &str, e: aws_lc_rs::error::KeyRejected| {
            bad_key(format!("{what} key rejected ({e})"))
        };
        let rsa = matches!(self.algorithm, KeyAlgorithm::Rsa(_));
        let inner = match self.encoding {
            KeyEncoding::Pkcs1 => {
                KeyInner::Rsa(aws_lc_rs::rsa::KeyPair::from_der(der).map_err(|e| bad("RSA", e))?)
            }
            KeyEncoding::Pkcs8 if rsa => {
                KeyInner::Rsa(aws_lc_rs::rsa::KeyPair::from_pkcs8(der).map_err(|e| bad("RSA", e))?)
            }
            KeyEncoding::Sec1 | KeyEncoding::Pkcs8 => {
                let (pair, alg) = ec_from_der(der)?;
                KeyInner::Ec(pair, alg)
            }
        };
        // Read structurally first: the library must see the same public key.
        if self.algorithm != KeyAlgorithm::Unknown
            && (inner_algorithm(&inner) != self.algorithm || inner_public(&inner) != self.public)
        {
            return Err(bad_key(
                "the key's public part does not match its private part".into(),
            ));
        }
        Ok(inner)
    }

    /// The key in the crypto library, loaded and validated on first use.
    fn pair(&self) -> Result<&KeyInner, PkiError> {
        self.pair
            .get_or_init(|| self.load())
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Checks the private parts in the crypto library (once; later calls return the result).
    pub fn validate(&self) -> Result<(), PkiError> {
        self.pair().map(|_| ())
    }

    /// Checks that a key read from a file can serve the certificate it is carried into: for
    /// RSA, the checks Go's `crypto/rsa` makes when a component (apiserver, etcd) loads the key
    /// (n = p·q, d·e ≡ 1 mod p−1 and mod q−1) and the CRT values that OpenSSL-based readers use
    /// (dP = d mod p−1, dQ = d mod q−1, qInv·q ≡ 1 mod p, qInv < p), in aws-lc's big-number
    /// arithmetic ([`crate::pki::bignum`]): a few microseconds, where loading the key into the
    /// library (`RSA_check_key`, [`Self::validate`]) takes ~0.25 ms. Other keys, and keys made
    /// here, are validated by the library.
    pub fn check_private_parts(&self) -> Result<(), PkiError> {
        let (Some(der), KeyAlgorithm::Rsa(_)) = (&self.der, self.algorithm) else {
            return self.validate();
        };
        let pkcs1 = match self.encoding {
            KeyEncoding::Pkcs1 => der.as_slice(),
            KeyEncoding::Pkcs8 => {
                pkcs8::PrivateKeyInfo::try_from(der.as_slice())
                    .map_err(|e| bad_key(format!("not a PKCS#8 private key ({e})")))?
                    .private_key
            }
            KeyEncoding::Sec1 => return self.validate(),
        };
        let k = RsaPrivateKeyRef::from_der(pkcs1).map_err(|e| {
            bad_key(format!(
                "RSA key rejected (not a PKCS#1 RSAPrivateKey: {e})"
            ))
        })?;
        match rsa_parts_agree(&k) {
            Ok(None) => Ok(()),
            Ok(Some(what)) => Err(bad_key(format!(
                "RSA key rejected (InconsistentComponents: {what}); the file is damaged: \
                 renew without --reuse-keys to replace the key, or restore it from a backup"
            ))),
            Err(crate::pki::bignum::OutOfMemory) => Err(PkiError::Crypto {
                step: "check a private key",
            }),
        }
    }

    /// Generates a new key of the given algorithm, stored the way kubeadm stores it.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<PrivateKey, PkiError> {
        use aws_lc_rs::rsa::{KeyPair, KeySize};
        let fail = PkiError::Crypto {
            step: "generate a private key",
        };
        let rsa = |size| KeyPair::generate(size).map_err(|_| fail.clone());
        let ec = |alg| sig::EcdsaKeyPair::generate(alg).map_err(|_| fail.clone());
        let (inner, encoding) = match algorithm {
            KeyAlgorithm::Rsa(2048) => (KeyInner::Rsa(rsa(KeySize::Rsa2048)?), KeyEncoding::Pkcs1),
            KeyAlgorithm::Rsa(3072) => (KeyInner::Rsa(rsa(KeySize::Rsa3072)?), KeyEncoding::Pkcs1),
            KeyAlgorithm::Rsa(4096) => (KeyInner::Rsa(rsa(KeySize::Rsa4096)?), KeyEncoding::Pkcs1),
            KeyAlgorithm::EcdsaP256 => (
                KeyInner::Ec(ec(&sig::ECDSA_P256_SHA256_ASN1_SIGNING)?, algorithm),
                KeyEncoding::Sec1,
            ),
            KeyAlgorithm::EcdsaP384 => (
                KeyInner::Ec(ec(&sig::ECDSA_P384_SHA384_ASN1_SIGNING)?, algorithm),
                KeyEncoding::Sec1,
            ),
            other => {
                return Err(PkiError::BadKey {
                    detail: format!(
                        "cannot generate {other} keys (supported: RSA-2048/3072/4096, ECDSA-P256/P384)"
                    ),
                });
            }
        };
        Ok(PrivateKey {
            algorithm: inner_algorithm(&inner),
            public: inner_public(&inner),
            encoding,
            der: None,
            pair: std::sync::OnceLock::from(Ok(inner)),
        })
    }

    /// The key's algorithm and size.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The subjectPublicKey bits this key's certificate must carry.
    pub fn public_key_bits(&self) -> Vec<u8> {
        self.public.clone()
    }

    /// Whether this key belongs to the certificate: the same public key.
    pub fn matches(&self, cert: &Cert) -> bool {
        cert.public_key_algorithm() == self.algorithm() && cert.public_key_bits() == self.public
    }

    /// The SubjectPublicKeyInfo for a certificate carrying this key.
    pub fn spki(&self) -> Result<SubjectPublicKeyInfoOwned, PkiError> {
        let algorithm = match self.algorithm {
            KeyAlgorithm::Rsa(_) => AlgorithmIdentifierOwned {
                oid: oid::RSA_ENCRYPTION,
                parameters: Some(Any::null()),
            },
            alg => {
                let curve = if alg == KeyAlgorithm::EcdsaP384 {
                    oid::SECP384R1
                } else {
                    oid::SECP256R1
                };
                AlgorithmIdentifierOwned {
                    oid: oid::EC_PUBLIC_KEY,
                    parameters: Some(Any::encode_from(&curve).map_err(encode_err)?),
                }
            }
        };
        Ok(SubjectPublicKeyInfoOwned {
            algorithm,
            subject_public_key: BitString::from_bytes(&self.public).map_err(encode_err)?,
        })
    }

    /// The signature algorithm this key signs with: SHA-256 with RSA, ECDSA with the curve's hash.
    pub fn signature_algorithm(&self) -> AlgorithmIdentifierOwned {
        match self.algorithm {
            KeyAlgorithm::Rsa(_) => AlgorithmIdentifierOwned {
                oid: oid::SHA256_WITH_RSA,
                parameters: Some(Any::null()),
            },
            KeyAlgorithm::EcdsaP384 => AlgorithmIdentifierOwned {
                oid: oid::ECDSA_WITH_SHA384,
                parameters: None,
            },
            _ => AlgorithmIdentifierOwned {
                oid: oid::ECDSA_WITH_SHA256,
                parameters: None,
            },
        }
    }

    /// Signs `message` with [`Self::signature_algorithm`].
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, PkiError> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let fail = |_| PkiError::Crypto { step: "sign" };
        match self.pair()? {
            KeyInner::Rsa(k) => {
                let mut out = vec![0u8; k.public_modulus_len()];
                k.sign(&sig::RSA_PKCS1_SHA256, &rng, message, &mut out)
                    .map_err(fail)?;
                Ok(out)
            }
            KeyInner::Ec(k, _) => Ok(k.sign(&rng, message).map_err(fail)?.as_ref().to_vec()),
        }
    }

    /// PEM text in `encoding` (PKCS#1 or PKCS#8 for RSA; SEC1 or PKCS#8 for ECDSA). A key read
    /// from a file and written back in its own encoding keeps its bytes.
    pub fn to_pem(&self, encoding: KeyEncoding) -> Result<SecretPem, PkiError> {
        let label = |encoding| match (encoding, self.algorithm) {
            (KeyEncoding::Pkcs8, _) => "PRIVATE KEY",
            (_, KeyAlgorithm::Rsa(_)) => "RSA PRIVATE KEY",
            _ => "EC PRIVATE KEY",
        };
        let armor = |label: &str, der: &[u8]| {
            der::pem::encode_string(label, LineEnding::LF, der)
                .map(SecretPem)
                .map_err(|e| PkiError::Encode {
                    detail: e.to_string(),
                })
        };
        if let Some(der) = self.der.as_ref().filter(|_| encoding == self.encoding) {
            return armor(label(encoding), der);
        }
        let fail = |_| PkiError::Crypto {
            step: "serialize a private key",
        };
        let inner = self.pair()?;
        let pkcs8 = zeroize::Zeroizing::new(match inner {
            KeyInner::Rsa(k) => AsDer::<aws_lc_rs::encoding::Pkcs8V1Der>::as_der(k)
                .map_err(fail)?
                .as_ref()
                .to_vec(),
            KeyInner::Ec(k, _) => k.to_pkcs8v1().map_err(fail)?.as_ref().to_vec(),
        });
        let der = zeroize::Zeroizing::new(match (inner, encoding) {
            (_, KeyEncoding::Pkcs8) => pkcs8.to_vec(),
            (KeyInner::Rsa(_), _) => pkcs8::PrivateKeyInfo::try_from(pkcs8.as_slice())
                .map_err(|e| PkiError::Encode {
                    detail: e.to_string(),
                })?
                .private_key
                .to_vec(),
            (KeyInner::Ec(k, alg), _) => sec1_der(k, *alg)?,
        });
        armor(label(encoding), &der)
    }
}

fn inner_algorithm(inner: &KeyInner) -> KeyAlgorithm {
    match inner {
        KeyInner::Rsa(k) => KeyAlgorithm::Rsa((k.public_modulus_len() * 8) as u32),
        KeyInner::Ec(_, alg) => *alg,
    }
}

fn inner_public(inner: &KeyInner) -> Vec<u8> {
    match inner {
        KeyInner::Rsa(k) => k.public_key().as_ref().to_vec(),
        KeyInner::Ec(k, _) => k.public_key().as_ref().to_vec(),
    }
}

/// SEC1 `ECPrivateKey` with the named curve and public key, as Go's `MarshalECPrivateKey` writes.
fn sec1_der(k: &sig::EcdsaKeyPair, alg: KeyAlgorithm) -> Result<Vec<u8>, PkiError> {
    let fail = |_| PkiError::Crypto {
        step: "serialize an EC private key",
    };
    let raw =
        aws_lc_rs::encoding::AsBigEndian::<aws_lc_rs::encoding::EcPrivateKeyBin>::as_be_bytes(
            &k.private_key(),
        )
        .map_err(fail)?;
    let curve = if alg == KeyAlgorithm::EcdsaP384 {
        oid::SECP384R1
    } else {
        oid::SECP256R1
    };
    let public = k.public_key().as_ref().to_vec();
    let key = sec1::EcPrivateKey {
        private_key: raw.as_ref(),
        parameters: Some(sec1::EcParameters::NamedCurve(curve)),
        public_key: Some(&public),
    };
    key.to_der().map_err(encode_err)
}

fn ec_from_der(der: &[u8]) -> Result<(sig::EcdsaKeyPair, KeyAlgorithm), PkiError> {
    if let Ok(k) =
        sig::EcdsaKeyPair::from_private_key_der(&sig::ECDSA_P256_SHA256_ASN1_SIGNING, der)
    {
        return Ok((k, KeyAlgorithm::EcdsaP256));
    }
    match sig::EcdsaKeyPair::from_private_key_der(&sig::ECDSA_P384_SHA384_ASN1_SIGNING, der) {
        Ok(k) => Ok((k, KeyAlgorithm::EcdsaP384)),
        Err(e) => Err(PkiError::BadKey {
            detail: format!("not an RSA, ECDSA P-256 or P-384 key ({e})"),
        }),
    }
}

// === Issuing ===

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
    let mut extensions = Vec::new();
    let mut push = |id, critical, value: Vec<u8>| -> Result<(), PkiError> {
        extensions.push(Extension {
            extn_id: id,
            critical,
            extn_value: OctetString::new(value).map_err(encode_err)?,
        });
        Ok(())
    };
    push(
        oid::KEY_USAGE,
        true,
        profile.key_usage.to_der().map_err(encode_err)?,
    )?;
    if !profile.ext_key_usage.is_empty() {
        let eku = ExtendedKeyUsage(profile.ext_key_usage.clone());
        push(oid::EXT_KEY_USAGE, false, eku.to_der().map_err(encode_err)?)?;
    }
    if let Some(ca) = profile.basic_constraints {
        let bc = BasicConstraints {
            ca,
            path_len_constraint: None,
        };
        push(
            oid::BASIC_CONSTRAINTS,
            true,
            bc.to_der().map_err(encode_err)?,
        )?;
    }
    if profile.subject_key_id {
        // Go: SHA-1 of the subjectPublicKey bits (RFC 5280 §4.2.1.2 method 1).
        let ski = aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY,
            public_key.subject_public_key.raw_bytes(),
        );
        let ski = SubjectKeyIdentifier(OctetString::new(ski.as_ref()).map_err(encode_err)?);
        push(
            oid::SUBJECT_KEY_ID,
            false,
            ski.to_der().map_err(encode_err)?,
        )?;
    }
    if let Some(ca_ski) = signer.and_then(|s| s.cert.subject_key_id()) {
        let aki = AuthorityKeyIdentifier {
            key_identifier: Some(OctetString::new(ca_ski).map_err(encode_err)?),
            ..Default::default()
        };
        push(
            oid::AUTHORITY_KEY_ID,
            false,
            aki.to_der().map_err(encode_err)?,
        )?;
    }
    let names = san_names(profile)?;
    if !names.is_empty() {
        push(
            oid::SUBJECT_ALT_NAME,
            false,
            SubjectAltName(names).to_der().map_err(encode_err)?,
        )?;
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;

    /// `name_text` writes every name exactly as x509-cert's `Display`: the table's short names
    /// are const-oid's, escapes, multi-valued RDNs, other attributes and other string types.
    #[test]
    fn name_text_is_x509_cert_display() {
        use std::str::FromStr;
        for (o, key) in COMMON_ATTRIBUTES {
            // x509-cert's choice: the first of the shortest names.
            let short = der::oid::db::DB
                .find_names_for_oid(o)
                .min_by_key(|n| n.len())
                .unwrap();
            assert_eq!(short.to_ascii_uppercase(), key, "{o}");
        }
        let atv = |o: ObjectIdentifier, any: Any| AttributeTypeAndValue { oid: o, value: any };
        let printable = |v: &str| Any::encode_from(&PrintableStringRef::new(v).unwrap()).unwrap();
        let utf8 = |v: &str| Any::encode_from(&Utf8StringRef::new(v).unwrap()).unwrap();
        let ia5 = |v: &str| Any::encode_from(&Ia5String::new(v).unwrap()).unwrap();
        let rdn = |atvs: Vec<AttributeTypeAndValue>| {
            RelativeDistinguishedName(SetOfVec::try_from(atvs).unwrap())
        };
        let email = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.1");
        let unknown = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.99999.1");
        let mut names = vec![
            kubeadm_subject("kube-apiserver", &[]).unwrap(),
            kubeadm_subject(
                "kubernetes-admin",
                &["system:masters", "kubeadm:cluster-admins"],
            )
            .unwrap(),
            kubeadm_subject("system:node:cp-1", &["system:nodes"]).unwrap(),
            kubeadm_subject("naïve ünicode", &["a,b+c;d<e>f\\g\"h"]).unwrap(),
            RdnSequence(vec![]),
            RdnSequence(vec![rdn(vec![
                atv(oid::COMMON_NAME, utf8("#lead and trail ")),
                atv(oid::ORGANIZATION, printable(" x")),
            ])]),
            RdnSequence(vec![
                rdn(vec![atv(COMMON_ATTRIBUTES[3].0, printable("US"))]),
                rdn(vec![atv(COMMON_ATTRIBUTES[4].0, utf8("ctrl\u{1}\u{7f}"))]),
                rdn(vec![atv(COMMON_ATTRIBUTES[5].0, printable("Seattle"))]),
                rdn(vec![atv(COMMON_ATTRIBUTES[2].0, utf8("ops"))]),
                rdn(vec![atv(email, ia5("a@b.c"))]),
                rdn(vec![atv(oid::COMMON_NAME, ia5("ia5 cn"))]),
                rdn(vec![atv(unknown, utf8("x"))]),
                rdn(vec![atv(oid::COMMON_NAME, Any::encode_from(&7u8).unwrap())]),
            ]),
        ];
        names.push(RdnSequence::from_str("CN=etcd-ca,OU=a+OU=b,O=x\\,y").unwrap());
        for name in &names {
            assert_eq!(name_text(name), name.to_string());
        }
    }

    pub(super) fn ca_for_fuzz() -> (Cert, PrivateKey) {
        ca(KeyAlgorithm::EcdsaP256)
    }

    fn ca(alg: KeyAlgorithm) -> (Cert, PrivateKey) {
        let key = PrivateKey::generate(alg).unwrap();
        let profile = Profile {
            subject: kubeadm_subject("kubernetes", &[]).unwrap(),
            dns_names: vec!["kubernetes".into()],
            ip_addresses: vec![],
            other_sans: vec![],
            san_order: SanOrder::Kubeadm,
            key_usage: ca_key_usage(),
            ext_key_usage: vec![],
            basic_constraints: Some(true),
            subject_key_id: true,
        };
        let issuance = Issuance {
            serial: 7,
            not_before: 1_700_000_000,
            not_after: 2_000_000_000,
        };
        let cert = issue(&profile, &key.spki().unwrap(), None, &key, issuance).unwrap();
        (cert, key)
    }

    #[test]
    fn issues_and_verifies_rsa_and_ecdsa_leaves() {
        for alg in [
            KeyAlgorithm::Rsa(2048),
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
        ] {
            let (ca_cert, ca_key) = ca(alg);
            assert!(ca_cert.is_ca());
            ca_cert.verify_signed_by(&ca_cert, "ca").unwrap();
            let leaf_key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
            let profile = Profile {
                subject: kubeadm_subject("kube-apiserver-etcd-client", &["b", "a"]).unwrap(),
                dns_names: vec!["z".into(), "a".into(), "a".into()],
                ip_addresses: vec!["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                other_sans: vec![],
                san_order: SanOrder::Kubeadm,
                key_usage: leaf_key_usage(),
                ext_key_usage: vec![oid::CLIENT_AUTH],
                basic_constraints: Some(false),
                subject_key_id: false,
            };
            let signer = Signer {
                cert: &ca_cert,
                key: &ca_key,
            };
            let issuance = Issuance {
                serial: 42,
                not_before: 1_700_000_000,
                not_after: 1_800_000_000,
            };
            let leaf = issue(
                &profile,
                &leaf_key.spki().unwrap(),
                Some(&signer),
                &leaf_key,
                issuance,
            )
            .unwrap();
            leaf.verify_signed_by(&ca_cert, "ca").unwrap();
            assert!(leaf_key.matches(&leaf));
            assert!(!ca_key.matches(&leaf));
            let f = leaf.facts();
            assert_eq!(f.dns_names, vec!["a", "z"]);
            assert_eq!(f.ip_addresses, vec!["10.0.0.1", "::1"]);
            assert_eq!(f.serial, "2a");
            assert_eq!(f.not_after, 1_800_000_000);
            assert_eq!(f.ext_key_usage, vec!["clientAuth"]);
            assert_eq!(f.key_usage, vec!["digitalSignature", "keyEncipherment"]);
            assert!(!f.is_ca);
            // Round trip through PEM keeps the bytes.
            let again = Cert::from_pem(leaf.to_pem().unwrap().as_bytes()).unwrap();
            assert_eq!(again.der, leaf.der);
            // Another CA of the same name does not verify it.
            let (other_ca, _) = ca(alg);
            assert!(matches!(
                leaf.verify_signed_by(&other_ca, "ca"),
                Err(PkiError::NotSignedBy { .. })
            ));
        }
    }

    #[test]
    fn keys_round_trip_in_kubeadm_encodings() {
        for (alg, enc, label) in [
            (
                KeyAlgorithm::Rsa(2048),
                KeyEncoding::Pkcs1,
                "RSA PRIVATE KEY",
            ),
            (KeyAlgorithm::EcdsaP256, KeyEncoding::Sec1, "EC PRIVATE KEY"),
            (KeyAlgorithm::EcdsaP384, KeyEncoding::Pkcs8, "PRIVATE KEY"),
        ] {
            let key = PrivateKey::generate(alg).unwrap();
            let pem = key.to_pem(enc).unwrap();
            assert!(
                pem.0.starts_with(&format!("-----BEGIN {label}-----\n")),
                "{}",
                label
            );
            let back = PrivateKey::from_pem(pem.0.as_bytes()).unwrap();
            assert_eq!(back.algorithm(), alg);
            assert_eq!(back.encoding, enc);
            assert_eq!(back.public_key_bits(), key.public_key_bits());
            assert!(!format!("{back:?}").contains("BEGIN"));
        }
    }

    /// `read_pem` (what `check` uses) takes the public key from the structure without the crypto
    /// library's consistency check; it agrees with the library on every encoding, and the
    /// library's check still runs before a key signs or is carried into a certificate.
    #[test]
    fn keys_read_structurally_agree_with_the_library() {
        for (alg, enc) in [
            (KeyAlgorithm::Rsa(2048), KeyEncoding::Pkcs1),
            (KeyAlgorithm::Rsa(2048), KeyEncoding::Pkcs8),
            (KeyAlgorithm::EcdsaP256, KeyEncoding::Sec1),
            (KeyAlgorithm::EcdsaP256, KeyEncoding::Pkcs8),
            (KeyAlgorithm::EcdsaP384, KeyEncoding::Sec1),
            (KeyAlgorithm::EcdsaP384, KeyEncoding::Pkcs8),
        ] {
            let key = PrivateKey::generate(alg).unwrap();
            let pem = key.to_pem(enc).unwrap();
            let read = PrivateKey::read_pem(pem.0.as_bytes()).unwrap();
            assert!(read.pair.get().is_none(), "{alg} {enc:?}: not loaded yet");
            assert_eq!(read.algorithm(), alg);
            assert_eq!(read.encoding, enc);
            assert_eq!(
                read.public_key_bits(),
                key.public_key_bits(),
                "{alg} {enc:?}"
            );
            // Written back in its own encoding: the same bytes, without the library.
            assert_eq!(read.to_pem(enc).unwrap().0, pem.0);
            assert!(read.pair.get().is_none());
            read.validate().unwrap();
            let full = PrivateKey::from_pem(pem.0.as_bytes()).unwrap();
            assert_eq!(full.public_key_bits(), key.public_key_bits());
        }
    }

    /// A key whose structure is sound but whose private parts are damaged matches its
    /// certificate by public key, but never signs and is refused where it would be used.
    #[test]
    fn damaged_private_parts_are_caught_before_use() {
        let key = PrivateKey::generate(KeyAlgorithm::Rsa(2048)).unwrap();
        let pem = key.to_pem(KeyEncoding::Pkcs1).unwrap();
        let der = PrivateKeyDer::from_pem_slice(pem.0.as_bytes()).unwrap();
        let PrivateKeyDer::Pkcs1(pkcs1) = &der else {
            panic!("PKCS#1 expected")
        };
        let parts = RsaPrivateKeyRef::from_der(pkcs1.secret_pkcs1_der()).unwrap();
        let mut d = parts.private_exponent.as_bytes().to_vec();
        d[100] ^= 0x10;
        let damaged = RsaPrivateKeyRef {
            private_exponent: der::asn1::UintRef::new(&d).unwrap(),
            ..parts
        }
        .to_der()
        .unwrap();
        let damaged_pem =
            der::pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &damaged).unwrap();
        let read = PrivateKey::read_pem(damaged_pem.as_bytes()).unwrap();
        assert_eq!(read.public_key_bits(), key.public_key_bits());
        for err in [
            read.validate().unwrap_err(),
            read.sign(b"x").unwrap_err(),
            PrivateKey::from_pem(damaged_pem.as_bytes()).unwrap_err(),
        ] {
            assert!(
                matches!(&err, PkiError::BadKey { detail } if detail.contains("RSA key rejected")),
                "{err}"
            );
        }
    }

    /// The quick check of a reused RSA key's parts (aws-lc's big numbers, as Go checks a key it
    /// loads, plus the CRT values) accepts what the library accepts and refuses each damaged
    /// part the library refuses, in both encodings, naming the relation and no value.
    #[test]
    fn rsa_parts_checked_quickly_agree_with_the_library() {
        let key = PrivateKey::generate(KeyAlgorithm::Rsa(2048)).unwrap();
        for enc in [KeyEncoding::Pkcs1, KeyEncoding::Pkcs8] {
            let read = PrivateKey::read_pem(key.to_pem(enc).unwrap().0.as_bytes()).unwrap();
            read.check_private_parts().unwrap();
            assert!(
                read.pair.get().is_none(),
                "{enc:?}: checked without loading"
            );
            read.validate().unwrap();
        }
        let pem = key.to_pem(KeyEncoding::Pkcs1).unwrap();
        let der = PrivateKeyDer::from_pem_slice(pem.0.as_bytes()).unwrap();
        let PrivateKeyDer::Pkcs1(pkcs1) = &der else {
            panic!("PKCS#1 expected")
        };
        let parts = RsaPrivateKeyRef::from_der(pkcs1.secret_pkcs1_der()).unwrap();
        let fields = [
            parts.private_exponent,
            parts.prime1,
            parts.prime2,
            parts.exponent1,
            parts.exponent2,
            parts.coefficient,
        ];
        for (i, field) in fields.iter().enumerate() {
            let mut v = field.as_bytes().to_vec();
            let mid = v.len() / 2;
            v[mid] ^= 0x10;
            let mut f = fields;
            f[i] = der::asn1::UintRef::new(&v).unwrap();
            let damaged = RsaPrivateKeyRef {
                private_exponent: f[0],
                prime1: f[1],
                prime2: f[2],
                exponent1: f[3],
                exponent2: f[4],
                coefficient: f[5],
                ..parts
            }
            .to_der()
            .unwrap();
            let pkcs8 = pkcs8::PrivateKeyInfo::new(
                pkcs8::AlgorithmIdentifierRef {
                    oid: oid::RSA_ENCRYPTION,
                    parameters: Some(der::asn1::AnyRef::NULL),
                },
                &damaged,
            )
            .to_der()
            .unwrap();
            for (label, der) in [("RSA PRIVATE KEY", &damaged), ("PRIVATE KEY", &pkcs8)] {
                let text = der::pem::encode_string(label, LineEnding::LF, der).unwrap();
                let read = PrivateKey::read_pem(text.as_bytes()).unwrap();
                assert_eq!(read.public_key_bits(), key.public_key_bits());
                let err = read.check_private_parts().unwrap_err();
                let PkiError::BadKey { detail } = &err else {
                    panic!("field {i} {label}: {err}")
                };
                assert!(
                    detail.contains("RSA key rejected (InconsistentComponents: "),
                    "field {i} {label}: {detail}"
                );
                assert!(!detail.contains(&base16ct::lower::encode_string(&v)[..16]));
                assert!(
                    read.validate().is_err(),
                    "field {i} {label}: the library agrees"
                );
            }
        }
        // Primes swapped (the coefficient then inverts the wrong prime).
        let swapped = RsaPrivateKeyRef {
            prime1: parts.prime2,
            prime2: parts.prime1,
            exponent1: parts.exponent2,
            exponent2: parts.exponent1,
            ..parts
        }
        .to_der()
        .unwrap();
        let text = der::pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &swapped).unwrap();
        let read = PrivateKey::read_pem(text.as_bytes()).unwrap();
        assert!(read.check_private_parts().is_err());
        assert!(read.validate().is_err());
        // EC keys, and keys made here, go to the library.
        let ec = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        ec.check_private_parts().unwrap();
        let ec = PrivateKey::read_pem(ec.to_pem(KeyEncoding::Sec1).unwrap().0.as_bytes()).unwrap();
        ec.check_private_parts().unwrap();
        assert!(ec.pair.get().is_some());
    }

    /// Structural reading applies the library's limits: two primes, 2048..8192 bits.
    #[test]
    fn small_rsa_keys_are_refused_without_the_library() {
        // The textbook key n = 61 x 53.
        let u = |v: &'static [u8]| der::asn1::UintRef::new(v).unwrap();
        let tiny = RsaPrivateKeyRef {
            version: 0,
            modulus: u(&[0x0c, 0xa1]),
            public_exponent: u(&[17]),
            private_exponent: u(&[0x0a, 0xc1]),
            prime1: u(&[61]),
            prime2: u(&[53]),
            exponent1: u(&[53]),
            exponent2: u(&[49]),
            coefficient: u(&[38]),
        };
        let pem = |k: &RsaPrivateKeyRef| {
            der::pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &k.to_der().unwrap())
                .unwrap()
        };
        let err = PrivateKey::read_pem(pem(&tiny).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("TooSmall"), "{err}");
        let multi = RsaPrivateKeyRef { version: 1, ..tiny };
        let err = PrivateKey::read_pem(pem(&multi).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("two-prime"), "{err}");
    }

    /// A SEC1 key without its public point (optional in RFC 5915) gets it from the library.
    #[test]
    fn ec_key_without_public_point_is_completed_by_the_library() {
        let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let pem = key.to_pem(KeyEncoding::Sec1).unwrap();
        let der = PrivateKeyDer::from_pem_slice(pem.0.as_bytes()).unwrap();
        let PrivateKeyDer::Sec1(sec1_key) = &der else {
            panic!("SEC1 expected")
        };
        let full = sec1::EcPrivateKey::from_der(sec1_key.secret_sec1_der()).unwrap();
        let bare = sec1::EcPrivateKey {
            public_key: None,
            ..full
        }
        .to_der()
        .unwrap();
        let bare_pem = der::pem::encode_string("EC PRIVATE KEY", LineEnding::LF, &bare).unwrap();
        let read = PrivateKey::read_pem(bare_pem.as_bytes()).unwrap();
        assert_eq!(read.algorithm(), KeyAlgorithm::EcdsaP256);
        assert_eq!(read.public_key_bits(), key.public_key_bits());
    }

    #[test]
    fn damaged_pem_is_reported_precisely() {
        let (cert, _) = ca(KeyAlgorithm::EcdsaP256);
        let pem = cert.to_pem().unwrap();
        let truncated = &pem[..pem.len() / 2];
        assert!(matches!(
            Cert::from_pem(truncated.as_bytes()),
            Err(PkiError::BadPem { .. })
        ));
        assert!(matches!(
            Cert::from_pem(b"hello"),
            Err(PkiError::NoPemBlock { .. })
        ));
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            Cert::from_pem(garbage.as_bytes()),
            Err(PkiError::BadCertificate { .. })
        ));
        assert!(matches!(
            PrivateKey::from_pem(pem.as_bytes()),
            Err(PkiError::NoPemBlock { .. })
        ));
    }

    #[test]
    fn names_match_across_string_types() {
        let printable = kubeadm_subject("kubernetes", &[]).unwrap();
        let mut utf8 = printable.clone();
        let value = Any::encode_from(&Utf8StringRef::new("Kubernetes ").unwrap()).unwrap();
        utf8.0[0].0 = SetOfVec::try_from(vec![AttributeTypeAndValue {
            oid: oid::COMMON_NAME,
            value,
        }])
        .unwrap();
        assert_ne!(printable.to_der().unwrap(), utf8.to_der().unwrap());
        assert!(names_match(&printable, &utf8));
        assert!(!names_match(
            &printable,
            &kubeadm_subject("etcd-ca", &[]).unwrap()
        ));
        assert!(!names_match(
            &printable,
            &kubeadm_subject("kubernetes", &["x"]).unwrap()
        ));
    }

    #[test]
    fn subject_string_types_follow_go() {
        let name = kubeadm_subject("system:node:a_b", &["system:nodes"]).unwrap();
        let der = name.to_der().unwrap();
        // "system:node:a_b" has '_' -> UTF8String (tag 0x0c); "system:nodes" printable (0x13).
        assert!(der.windows(2).any(|w| w == [0x0c, 15]));
        assert!(der.windows(2).any(|w| w == [0x13, 12]));
        assert_eq!(name.to_string(), "CN=system:node:a_b,O=system:nodes");
    }
}

/// A seeded mutation fuzzer for the readers of untrusted bytes (PEM, DER, kubeconfig YAML,
/// static-pod manifests), run with a fixed budget in the normal test run (cargo-fuzz needs
/// nightly). Each input must be answered (never a panic) quickly, and no error text may quote
/// key material.
#[cfg(test)]
mod fuzz {
    use super::*;
    use crate::lab::manifests::ManifestParams;
    use crate::node::kubeconfig::Kubeconfig;
    use crate::node::manifests::PodInfo;

    /// xorshift64*: deterministic, so a failure names its seed and iteration.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            if n == 0 {
                0
            } else {
                (self.next() % n as u64) as usize
            }
        }
    }

    const TOKENS: [&[u8]; 14] = [
        b"[",
        b"{",
        b"- ",
        b"&a ",
        b"*a ",
        b"\n",
        b"-----BEGIN PRIVATE KEY-----\n",
        b"-----END CERTIFICATE-----",
        b"\x30\x82\xff\xff",
        b"\x00",
        b"'",
        b"\"",
        b": ",
        b"  ",
    ];

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + rng.below(8) {
            let at = rng.below(v.len() + 1);
            match rng.below(8) {
                0 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] ^= 1 << rng.below(8);
                }
                1 => {
                    let end = (at + rng.below(64)).min(v.len());
                    v.drain(at..end);
                }
                2 => {
                    let t = TOKENS[rng.below(TOKENS.len())];
                    let cap = if rng.below(4) == 0 { 20_000 } else { 4 };
                    let times = 1 + rng.below(cap);
                    let run: Vec<u8> = t.iter().copied().cycle().take(t.len() * times).collect();
                    v.splice(at..at, run);
                }
                3 => v.truncate(at),
                4 if !v.is_empty() => {
                    let from = rng.below(v.len());
                    let end = (from + rng.below(256)).min(v.len());
                    let chunk = v[from..end].to_vec();
                    v.splice(at..at, chunk);
                }
                5 => v.retain(|b| *b != b'\n'),
                6 => {
                    // A value that opens many collections at once: the parser's worst case.
                    let t = TOKENS[rng.below(5)];
                    let times = 1 + rng.below(50_000);
                    let mut doc = b"apiVersion: v1\nclusters: ".to_vec();
                    doc.extend(t.iter().copied().cycle().take(t.len() * times));
                    v = doc;
                }
                _ => {
                    let i = rng.below(v.len().max(1));
                    if i < v.len() {
                        v[i] = rng.next() as u8;
                    }
                }
            }
        }
        v.truncate(MAX_PEM_FILE_BYTES as usize);
        v
    }

    fn body_fragments(pem: &str) -> Vec<String> {
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        body.as_bytes()
            .chunks(20)
            .filter(|c| c.len() == 20)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect()
    }

    #[test]
    fn readers_of_untrusted_bytes_never_panic_or_echo_keys() {
        let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
        let key_pem = key.to_pem(KeyEncoding::Sec1).unwrap();
        let rsa = PrivateKey::generate(KeyAlgorithm::Rsa(2048)).unwrap();
        let rsa_pem = rsa.to_pem(KeyEncoding::Pkcs8).unwrap();
        let rsa_pkcs1 = rsa.to_pem(KeyEncoding::Pkcs1).unwrap();
        let (ca_cert, _) = tests_ca();
        let cert_pem = ca_cert.to_pem().unwrap();
        let kubeconfig = Kubeconfig::new_embedded(
            "kubernetes",
            "https://10.0.0.10:6443",
            "kubernetes-admin",
            cert_pem.as_bytes(),
            cert_pem.as_bytes(),
            key_pem.0.as_bytes(),
        )
        .to_yaml()
        .unwrap();
        let manifest = crate::lab::manifests::control_plane(&ManifestParams {
            kubeadm_dir: "/var/lib/kubeadm",
            node_name: "cp-1",
            advertise_address: [10, 0, 0, 10].into(),
            port_offset: 0,
            external_etcd: None,
            etcd_client_cert: "apiserver-etcd-client.crt",
            kubernetes_version: crate::lab::manifests::DEFAULT_KUBERNETES_VERSION,
        })
        .remove(0)
        .1;
        let secrets: Vec<String> = body_fragments(&key_pem.0)
            .into_iter()
            .chain(body_fragments(&rsa_pem.0))
            .chain(body_fragments(&rsa_pkcs1.0))
            .collect();
        let seeds: [&[u8]; 7] = [
            key_pem.0.as_bytes(),
            rsa_pem.0.as_bytes(),
            rsa_pkcs1.0.as_bytes(),
            cert_pem.as_bytes(),
            &ca_cert.der,
            kubeconfig.as_bytes(),
            manifest.as_bytes(),
        ];
        // A fixed amount of work (a seeded generator, a fixed number of inputs), never a time
        // budget: what a reader costs as its input grows is measured by agent/parser-growth.sh
        // (instructions, not seconds).
        let mut rng = Rng(0x5eed_cafe_f00d_d00d);
        for runs in 0..RUNS {
            let which = rng.below(seeds.len());
            let input = mutate(&mut rng, seeds[which]);
            let mut texts = Vec::new();
            if let Err(e) = PrivateKey::from_pem(&input) {
                texts.push(e.to_string());
            }
            if let Err(e) = KeyPublic::read_pem(&input) {
                texts.push(e.to_string());
            }
            if let Err(e) = PrivateKey::read_pem(&input).and_then(|k| k.check_private_parts()) {
                texts.push(e.to_string());
            }
            if let Err(e) = Cert::from_pem(&input) {
                texts.push(e.to_string());
            }
            if let Err(e) = Cert::from_der(&input) {
                texts.push(e.to_string());
            }
            if let Err(e) = Kubeconfig::parse(&input).and_then(|k| k.credentials()) {
                texts.push(e.to_string());
            }
            let _ = PodInfo::parse(&input);
            for text in &texts {
                for f in &secrets {
                    assert!(
                        !text.contains(f.as_str()),
                        "run {runs}: error quotes key: {text}"
                    );
                }
            }
        }
    }

    /// Inputs per run of the fuzz test.
    const RUNS: usize = 1500;

    fn tests_ca() -> (Cert, PrivateKey) {
        super::tests::ca_for_fuzz()
    }
}
