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
pub mod tls;

use std::fmt;

mod key_public;
pub use key_public::KeyPublic;
mod cert;
pub use cert::{
    Cert, CertFacts, eku_name, hex, key_usage_names, name_text, names_match, serial_hex,
    time_to_unix, unix_to_time,
};
mod key;
pub use key::{KeyAlgorithm, KeyEncoding, PrivateKey, SecretPem};
mod issuing;
pub use issuing::{
    Issuance, Profile, SanOrder, Signer, ca_key_usage, issue, kubeadm_subject, leaf_key_usage,
    random_serial,
};

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
/// Most certificates read from one trust bundle (a CA file during a rotation holds two).
pub const MAX_BUNDLE_CERTS: usize = 64;

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

    /// The error text of a reader's refusal, if it refused.
    fn refusal<T, E: std::fmt::Display>(read: Result<T, E>) -> Option<String> {
        read.err().map(|e| e.to_string())
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
        let manifest = crate::lab::manifests::control_plane(&ManifestParams::for_tests(0))
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
            // The error text of every reader that refuses the input.
            let texts: Vec<String> = [
                refusal(PrivateKey::from_pem(&input)),
                refusal(KeyPublic::read_pem(&input)),
                refusal(PrivateKey::read_pem(&input).and_then(|k| k.check_private_parts())),
                refusal(Cert::from_pem(&input)),
                refusal(Cert::from_der(&input)),
                refusal(Kubeconfig::parse(&input).and_then(|k| k.credentials())),
            ]
            .into_iter()
            .flatten()
            .collect();
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
#[cfg(test)]
mod tests;

/// Unit tests elsewhere: a self-signed ECDSA P-256 CA named `cn`, valid from `not_before` to
/// `not_after`, and its key.
#[cfg(test)]
pub(crate) fn test_ca(cn: &str, (not_before, not_after): (i64, i64)) -> (Cert, PrivateKey) {
    let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let profile = Profile::ca(kubeadm_subject(cn, &[]).unwrap(), vec![]);
    let window = Issuance {
        serial: 7,
        not_before,
        not_after,
    };
    let cert = issue(&profile, &key.spki().unwrap(), None, &key, window).unwrap();
    (cert, key)
}
