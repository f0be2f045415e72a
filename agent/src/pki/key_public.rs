//! The public part of a private key file, once the key is known to be one the components load:
//! all `check` (and the inventory of a daemon, every cycle) needs to prove that a key belongs
//! to its certificate.
//!
//! Until issue 30.4 an RSA key in the usual shape was read from its first 6 or 7 lines only (the
//! modulus and exponent come first), its private parts never decoded. That called sound keys Go
//! refuses (`tls.X509KeyPair`, how kube-apiserver and etcd load a pair): damage past the public
//! part, CR-only line ends, text after the END line, padding errors. A key is now read whole,
//! by Go's PEM rules ([`super::go_pem`]), and its private parts checked
//! ([`PrivateKey::check_private_parts`]): for RSA in aws-lc's big-number arithmetic, a few
//! microseconds; for EC by loading the scalar, which must give the public point. The
//! differential test against Go is `agent/tests/hostile30.rs`
//! (`issue30_4_every_key_check_calls_sound_is_one_go_loads`).

use super::{Cert, KeyAlgorithm, PkiError, PrivateKey};

/// What a private key shows of itself: the algorithm and the public key a certificate for it
/// carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPublic {
    algorithm: KeyAlgorithm,
    public: Vec<u8>,
}

impl KeyPublic {
    /// The public part of the first private key in a PEM file, once the key is known to be one
    /// the components load: the block Go's `tls.X509KeyPair` takes, decoded by Go's rules
    /// ([`super::go_pem`]), its whole structure read, and its private parts consistent
    /// ([`PrivateKey::check_private_parts`]: for RSA the relations Go's `crypto/rsa` checks, in
    /// a few microseconds; for EC the scalar gives the public point). Errors are
    /// [`PrivateKey::read_pem`]'s and `check_private_parts`'.
    pub fn read_pem(bytes: &[u8]) -> Result<KeyPublic, PkiError> {
        let key = PrivateKey::read_pem(bytes)?;
        key.check_private_parts()?;
        Ok(KeyPublic::of(&key))
    }

    /// The public part of a key already read.
    pub fn of(key: &PrivateKey) -> KeyPublic {
        KeyPublic {
            algorithm: key.algorithm(),
            public: key.public.clone(),
        }
    }

    /// The key's algorithm and size.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The subjectPublicKey bits this key's certificate must carry.
    pub fn public_key_bits(&self) -> &[u8] {
        &self.public
    }

    /// Whether this key belongs to the certificate: the same public key.
    pub fn matches(&self, cert: &Cert) -> bool {
        cert.public_key_algorithm() == self.algorithm && cert.public_key_bits() == self.public
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::KeyEncoding;

    fn pems() -> Vec<String> {
        let mut out = Vec::new();
        for alg in [
            KeyAlgorithm::Rsa(2048),
            KeyAlgorithm::Rsa(3072),
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
        ] {
            let key = PrivateKey::generate(alg).unwrap();
            let native = if matches!(alg, KeyAlgorithm::Rsa(_)) {
                KeyEncoding::Pkcs1
            } else {
                KeyEncoding::Sec1
            };
            for enc in [native, KeyEncoding::Pkcs8] {
                out.push(key.to_pem(enc).unwrap().0.clone());
            }
        }
        out
    }

    /// Sound keys give the full reading's public part; every one-character change of the body
    /// is either the same key (a change the structure does not see, never a different key) or
    /// refused: damage past the public part included (issue 30.4).
    #[test]
    fn damage_anywhere_is_refused_or_reads_the_same_key() {
        for pem in pems() {
            let full = KeyPublic::of(&PrivateKey::read_pem(pem.as_bytes()).unwrap());
            assert_eq!(KeyPublic::read_pem(pem.as_bytes()).unwrap(), full);
            let bytes = pem.as_bytes();
            let body_start = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
            let body_end = pem.rfind("-----END").unwrap();
            let (mut refused, mut cases) = (0, 0);
            for i in (body_start..body_end).step_by(7) {
                if bytes[i] == b'\n' || bytes[i] == b'=' {
                    continue;
                }
                let mut v = bytes.to_vec();
                v[i] = if v[i] == b'A' { b'B' } else { b'A' };
                cases += 1;
                match KeyPublic::read_pem(&v) {
                    Ok(k) => assert_eq!(k, full, "byte {i}: another key"),
                    Err(_) => refused += 1,
                }
            }
            assert!(refused * 10 >= cases * 9, "{refused} of {cases} refused");
        }
    }
}
