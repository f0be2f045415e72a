//! certrotor's hot parsing paths, in a crate of their own so that they are built at opt-level 3
//! while the rest of the binary is built for size (opt-level "z", ARCHITECTURE.md "Speed").
//!
//! The decoders certrotor calls on every certificate, key and kubeconfig are generic (der's
//! `Decode` over its reader, x509-cert's extensions, base64ct's alphabets): Rust builds a
//! generic function in the crate that names its type, so called from `certrotor` they were
//! built at "z" whatever the opt-level of the crate that defines them. Each function here names
//! the types, so that the code is built here, at 3: `check` −9% for +8 KB. Building all of
//! `certrotor` at 2 or 3 would make the static binary 5.1–5.4 MB, past its 4 MiB limit.
//!
//! Nothing here decides anything: each function is one call to the library it wraps, and
//! `certrotor` keeps every check and error message.

use der::Decode;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_cert::TbsCertificate;
use x509_cert::ext::pkix::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAltName, SubjectKeyIdentifier,
};

/// `Certificate::from_der`.
pub fn certificate_from_der(der: &[u8]) -> der::Result<x509_cert::Certificate> {
    x509_cert::Certificate::from_der(der)
}

/// The first `CERTIFICATE` block of a PEM text (rustls-pki-types).
pub fn first_certificate_pem(
    bytes: &[u8],
) -> Option<Result<CertificateDer<'static>, rustls_pki_types::pem::Error>> {
    CertificateDer::pem_slice_iter(bytes).next()
}

/// Padded standard base64 into `out`, in constant time (base64ct): key material.
pub fn base64_decode<'o>(text: &[u8], out: &'o mut [u8]) -> Result<&'o [u8], base64ct::Error> {
    <base64ct::Base64 as base64ct::Encoding>::decode(text, out)
}

/// An extension of a certificate, decoded: `TbsCertificate::get`, once per type certrotor
/// reads.
pub fn basic_constraints(tbs: &TbsCertificate) -> der::Result<Option<(bool, BasicConstraints)>> {
    tbs.get()
}

/// See [`basic_constraints`].
pub fn subject_key_identifier(
    tbs: &TbsCertificate,
) -> der::Result<Option<(bool, SubjectKeyIdentifier)>> {
    tbs.get()
}

/// See [`basic_constraints`].
pub fn subject_alt_name(tbs: &TbsCertificate) -> der::Result<Option<(bool, SubjectAltName)>> {
    tbs.get()
}

/// See [`basic_constraints`].
pub fn extended_key_usage(tbs: &TbsCertificate) -> der::Result<Option<(bool, ExtendedKeyUsage)>> {
    tbs.get()
}

/// See [`basic_constraints`].
pub fn key_usage(tbs: &TbsCertificate) -> der::Result<Option<(bool, KeyUsage)>> {
    tbs.get()
}
