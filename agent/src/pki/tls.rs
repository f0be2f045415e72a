//! The TLS provider of every connection certrotor makes (kube-apiserver, etcd, the kubelet):
//! aws-lc's, with what Kubernetes' and etcd's Go servers need and nothing more. Key exchange:
//! P-256 and P-384 (every Go TLS server offers both; not X25519 or the post-quantum hybrids);
//! signatures: ECDSA P-256/P-384 and RSA (PKCS#1, PSS), what kubeadm's and etcdadm's keys make
//! (not Ed25519, P-521 or ML-DSA); client keys: RSA and ECDSA, what certrotor issues. Naming
//! them here, instead of `rustls::crypto::aws_lc_rs::default_provider()`, keeps aws-lc's other
//! algorithms out of the static binary.

use std::sync::Arc;

use rustls::SignatureScheme;
use rustls::crypto::aws_lc_rs::{cipher_suite, kx_group, sign};
use rustls::crypto::{
    CryptoProvider, GetRandomFailed, KeyProvider, SecureRandom, WebPkiSupportedAlgorithms,
};
use rustls::sign::SigningKey;
use rustls_pki_types::PrivateKeyDer;
use webpki::aws_lc_rs as algs;

/// The provider: TLS 1.3 and 1.2 AEAD suites, P-256/P-384, the algorithms above.
pub fn provider() -> CryptoProvider {
    CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ],
        kx_groups: vec![kx_group::SECP256R1, kx_group::SECP384R1],
        signature_verification_algorithms: ALGORITHMS,
        secure_random: &AwsLc,
        key_provider: &AwsLc,
    }
}

static ALGORITHMS: WebPkiSupportedAlgorithms = WebPkiSupportedAlgorithms {
    all: &[
        algs::ECDSA_P256_SHA256,
        algs::ECDSA_P256_SHA384,
        algs::ECDSA_P384_SHA256,
        algs::ECDSA_P384_SHA384,
        algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
        algs::RSA_PKCS1_2048_8192_SHA256,
        algs::RSA_PKCS1_2048_8192_SHA384,
        algs::RSA_PKCS1_2048_8192_SHA512,
    ],
    mapping: &[
        (
            SignatureScheme::ECDSA_NISTP384_SHA384,
            &[algs::ECDSA_P384_SHA384, algs::ECDSA_P256_SHA384],
        ),
        (
            SignatureScheme::ECDSA_NISTP256_SHA256,
            &[algs::ECDSA_P256_SHA256, algs::ECDSA_P384_SHA256],
        ),
        (
            SignatureScheme::RSA_PSS_SHA512,
            &[algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA384,
            &[algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA256,
            &[algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA512,
            &[algs::RSA_PKCS1_2048_8192_SHA512],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA384,
            &[algs::RSA_PKCS1_2048_8192_SHA384],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA256,
            &[algs::RSA_PKCS1_2048_8192_SHA256],
        ),
    ],
};

#[derive(Debug)]
struct AwsLc;

impl SecureRandom for AwsLc {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        use aws_lc_rs::rand::SecureRandom as _;
        aws_lc_rs::rand::SystemRandom::new()
            .fill(buf)
            .map_err(|_| GetRandomFailed)
    }
}

impl KeyProvider for AwsLc {
    fn load_private_key(
        &self,
        key_der: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, rustls::Error> {
        if let Ok(k) = sign::any_ecdsa_type(&key_der) {
            return Ok(k);
        }
        sign::RsaSigningKey::new(&key_der).map(|k| Arc::new(k) as Arc<dyn SigningKey>)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_scheme_offered_has_its_algorithms() {
        let p = super::provider();
        let algs = p.signature_verification_algorithms;
        assert!(algs.mapping.iter().all(|(_, a)| !a.is_empty()));
        assert_eq!(p.kx_groups.len(), 2);
        assert!(p.cipher_suites.iter().all(|s| {
            s.usable_for_signature_algorithm(rustls::SignatureAlgorithm::ECDSA)
                || s.usable_for_signature_algorithm(rustls::SignatureAlgorithm::RSA)
        }));
    }
}
