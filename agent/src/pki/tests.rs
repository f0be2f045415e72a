//! Tests of the certificate, key and issuing code: names written as x509-cert does, keys read
//! and written back byte-for-byte, certificates issued as kubeadm issues them.

use super::cert::COMMON_ATTRIBUTES;
use super::key::RsaPrivateKeyRef;
use super::*;
use der::asn1::{Ia5String, PrintableStringRef, SetOfVec, Utf8StringRef};
use der::oid::ObjectIdentifier;
use der::pem::LineEnding;
use der::{Any, Decode, Encode};
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::name::{RdnSequence, RelativeDistinguishedName};

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
    let profile = Profile::ca(
        kubeadm_subject("kubernetes", &[]).unwrap(),
        vec!["kubernetes".into()],
    );
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
            dns_names: vec!["z".into(), "a".into(), "a".into()],
            ip_addresses: vec!["10.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
            ..Profile::client(kubeadm_subject("kube-apiserver-etcd-client", &["b", "a"]).unwrap())
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
    let damaged_pem = der::pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &damaged).unwrap();
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

/// A key whose RSA part `i` (value `v`) is damaged is refused by the quick check, in PKCS#1
/// and PKCS#8, naming the relation and not the value, and the library agrees.
fn refused_in_both_encodings(key: &PrivateKey, i: usize, damaged: &[u8], v: &[u8]) {
    let pkcs8 = pkcs8::PrivateKeyInfo::new(
        pkcs8::AlgorithmIdentifierRef {
            oid: oid::RSA_ENCRYPTION,
            parameters: Some(der::asn1::AnyRef::NULL),
        },
        damaged,
    )
    .to_der()
    .unwrap();
    for (label, der) in [("RSA PRIVATE KEY", damaged), ("PRIVATE KEY", &pkcs8[..])] {
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
        assert!(!detail.contains(&base16ct::lower::encode_string(v)[..16]));
        assert!(
            read.validate().is_err(),
            "field {i} {label}: the library agrees"
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
        refused_in_both_encodings(&key, i, &damaged, &v);
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
        der::pem::encode_string("RSA PRIVATE KEY", LineEnding::LF, &k.to_der().unwrap()).unwrap()
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
