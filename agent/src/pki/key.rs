//! Private keys: read PKCS#1, PKCS#8 and SEC1 keys (refusing encrypted ones), generate RSA and
//! ECDSA keys the way kubeadm does, sign, and write them back in their original encoding.

use super::{Cert, PkiError, encode_err, go_pem, oid};
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::signature::{self as sig, KeyPair as _};
use der::asn1::BitString;
use der::oid::ObjectIdentifier;
use der::pem::LineEnding;
use der::{Any, Decode, Encode};
use std::fmt;
use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

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

pub(super) enum KeyInner {
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
    pub(super) public: Vec<u8>,
    /// The encoding it was read in, kept when it is written back.
    pub encoding: KeyEncoding,
    /// The DER as read (in `encoding`), for a key read from a file; scrubbed when dropped.
    der: Option<zeroize::Zeroizing<Vec<u8>>>,
    /// The key in the crypto library, validated: set at once for a generated key, on first use
    /// for a key read from a file.
    pub(super) pair: std::sync::OnceLock<Result<KeyInner, PkiError>>,
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
pub(super) struct RsaPrivateKeyRef<'a> {
    pub(super) version: u8,
    pub(super) modulus: der::asn1::UintRef<'a>,
    pub(super) public_exponent: der::asn1::UintRef<'a>,
    pub(super) private_exponent: der::asn1::UintRef<'a>,
    pub(super) prime1: der::asn1::UintRef<'a>,
    pub(super) prime2: der::asn1::UintRef<'a>,
    pub(super) exponent1: der::asn1::UintRef<'a>,
    pub(super) exponent2: der::asn1::UintRef<'a>,
    pub(super) coefficient: der::asn1::UintRef<'a>,
}

/// PKCS#1 `RSAPublicKey`: the subjectPublicKey of an RSA certificate.
#[derive(der::Sequence)]
struct RsaPublicKeyRef<'a> {
    modulus: der::asn1::UintRef<'a>,
    exponent: der::asn1::UintRef<'a>,
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
