//! The public part of a private key file, read without decoding its private parts: all `check`
//! (and the inventory of a daemon, every cycle) needs to prove that a key belongs to its
//! certificate.
//!
//! An RSA key in PKCS#1 or PKCS#8 carries its public key first: the modulus and the exponent
//! are the first ~270 bytes of a 2048-bit key's ~1,190, in the first 6 (PKCS#1) or 7 (PKCS#8)
//! of its 25 lines of PEM.
//! In the shape kubeadm, Go, etcdadm and OpenSSL write (a `BEGIN` line, lines of 64 characters,
//! the `END` line), only those lines are decoded (constant-time, `base64ct`); the rest of the
//! text is checked to be base64 and the structure's outer length to agree with the text's, so a
//! truncated, padded or garbled file is still refused. The private exponent, primes and CRT
//! values are never decoded, so they are never in memory. Anything else (EC keys, whose public
//! point comes last; other line lengths; text before the key; an unusual structure) is read by
//! [`PrivateKey::read_pem`], which also words every refusal: this reader only ever answers
//! "the same public key the full reading finds", or hands the file over. A private part that
//! is damaged inside a well-formed text is found where the key is used: `renew --reuse-keys`
//! ([`PrivateKey::check_private_parts`]) or the component loading it.

use super::{Cert, KeyAlgorithm, KeyEncoding, PkiError, PrivateKey, RsaPublicKeyRef, bit_len, oid};
use der::asn1::UintRef;
use der::{Decode, Encode, ErrorKind, Header, Reader, SliceReader, Tag};

/// What a private key shows of itself without its private parts: the algorithm and the public
/// key a certificate for it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPublic {
    algorithm: KeyAlgorithm,
    public: Vec<u8>,
}

/// Characters per PEM line (RFC 7468; Go's `pem.Encode` and OpenSSL write them).
const LINE: usize = 64;

impl KeyPublic {
    /// The public part of the first private key in a PEM file, with the errors of
    /// [`PrivateKey::read_pem`].
    pub fn read_pem(bytes: &[u8]) -> Result<KeyPublic, PkiError> {
        match rsa_public_quickly(bytes) {
            Some(key) => Ok(key),
            None => PrivateKey::read_pem(bytes).map(|k| KeyPublic::of(&k)),
        }
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

/// The public part of an RSA key in the usual shape, or `None` to leave the file to the full
/// reading (see the module's documentation).
fn rsa_public_quickly(bytes: &[u8]) -> Option<KeyPublic> {
    if super::is_encrypted_key(bytes) {
        return None;
    }
    let (encoding, label): (_, &[u8]) = if bytes.starts_with(b"-----BEGIN RSA PRIVATE KEY-----\n") {
        (KeyEncoding::Pkcs1, b"RSA PRIVATE KEY")
    } else if bytes.starts_with(b"-----BEGIN PRIVATE KEY-----\n") {
        (KeyEncoding::Pkcs8, b"PRIVATE KEY")
    } else {
        return None;
    };
    // The body: full lines, then a last line of 4..=64 characters, then the END line (what
    // follows it is not read, as the full reading does not read it).
    let mut rest = &bytes[b"-----BEGIN -----\n".len() + label.len()..];
    let mut lines: Vec<&[u8]> = Vec::with_capacity(32);
    loop {
        // A full line is recognised by where its newline must be; only the last is searched.
        let len = if rest.get(LINE) == Some(&b'\n') {
            LINE
        } else {
            rest.iter().take(LINE).position(|&b| b == b'\n')?
        };
        let (line, after) = (&rest[..len], &rest[len + 1..]);
        if line.is_empty() || line.starts_with(b"-----") {
            return None;
        }
        lines.push(line);
        rest = after;
        if rest.starts_with(b"-----END ") {
            break;
        }
        if len != LINE {
            return None;
        }
    }
    let end = rest.strip_prefix(b"-----END ")?.strip_prefix(label)?;
    if !end.starts_with(b"-----") {
        return None;
    }
    let last = lines.pop()?;
    if last.len() % 4 != 0 || last.len() < 4 {
        return None;
    }
    // Every character but the final group's is in the alphabet (no padding before the end);
    // the final group is decoded, which checks its padding and its unused bits.
    let (last_body, last_group) = last.split_at(last.len() - 4);
    if !lines.iter().all(|l| in_alphabet(l)) || !in_alphabet(last_body) {
        return None;
    }
    let mut tail = zeroize::Zeroizing::new([0u8; 3]);
    let tail_len = certrotor_hot::base64_decode(last_group, &mut tail[..])
        .ok()?
        .len();
    let total = (LINE * lines.len() + last.len()) / 4 * 3 - 3 + tail_len;
    // The first lines, decoded one by one (a full line is 48 bytes): 6 hold a 2048-bit PKCS#1
    // key's public part, 7 a PKCS#8 one's, 24 an 8192-bit one's.
    let per_line = LINE / 4 * 3;
    let mut der = zeroize::Zeroizing::new(vec![0u8; per_line * lines.len().min(24)]);
    let mut decoded = 0;
    for want in [6, 7, 24] {
        let want = usize::min(want, lines.len());
        for (i, line) in lines.iter().enumerate().take(want).skip(decoded) {
            certrotor_hot::base64_decode(line, &mut der[i * per_line..(i + 1) * per_line]).ok()?;
        }
        decoded = want;
        match rsa_public_in_prefix(&der[..decoded * per_line], total, encoding) {
            Step::Done(key) => return Some(key),
            Step::NeedMore if decoded < lines.len() => continue,
            Step::NeedMore | Step::GiveUp => return None,
        }
    }
    None
}

/// Whether every byte is a base64 character (no padding), without a branch on any of them
/// (the text is a private key's): eight bytes at a time, each range test a carry into the
/// byte's high bit.
fn in_alphabet(text: &[u8]) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // With every byte of `y` below 0x80, the high bit of each byte of the sum is set where
    // that byte is `lo` or more (no carry crosses into the next byte).
    #[inline(always)]
    fn at_least(y: u64, lo: u8) -> u64 {
        y + (0x80 - u64::from(lo)) * ONES
    }
    #[inline(always)]
    fn within(y: u64, lo: u8, hi: u8) -> u64 {
        at_least(y, lo) & !at_least(y, hi + 1)
    }
    let mut bad = 0u64;
    let mut chunks = text.chunks_exact(8);
    for chunk in &mut chunks {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(chunk);
        let x = u64::from_le_bytes(bytes);
        let y = x & !HIGH;
        let ok = within(y, b'A', b'Z')
            | within(y, b'a', b'z')
            | within(y, b'0', b'9')
            | within(y, b'+', b'+')
            | within(y, b'/', b'/');
        // A byte with its own high bit set is never base64.
        bad |= !(ok & !x) & HIGH;
    }
    let mut bad_tail = false;
    for &c in chunks.remainder() {
        let ok = (c.wrapping_sub(b'A') < 26)
            | (c.wrapping_sub(b'a') < 26)
            | (c.wrapping_sub(b'0') < 10)
            | (c == b'+')
            | (c == b'/');
        bad_tail |= !ok;
    }
    bad == 0 && !bad_tail
}

enum Step {
    Done(KeyPublic),
    NeedMore,
    GiveUp,
}

/// The modulus and exponent from the first bytes of a PKCS#1 `RSAPrivateKey` or a PKCS#8
/// `PrivateKeyInfo` holding one whose whole encoding is `total` bytes long.
fn rsa_public_in_prefix(prefix: &[u8], total: usize, encoding: KeyEncoding) -> Step {
    let parsed = (|| -> der::Result<Option<(UintRef<'_>, UintRef<'_>)>> {
        let mut r = SliceReader::new(prefix)?;
        let outer = Header::decode(&mut r)?;
        if outer.tag != Tag::Sequence
            || usize::try_from((outer.encoded_len()? + outer.length)?)? != total
        {
            return Ok(None);
        }
        if encoding == KeyEncoding::Pkcs8 {
            if u8::decode(&mut r)? != 0 {
                return Ok(None);
            }
            let alg = pkcs8::AlgorithmIdentifierRef::decode(&mut r)?;
            let octets = Header::decode(&mut r)?;
            if alg.oid != oid::RSA_ENCRYPTION
                || octets.tag != Tag::OctetString
                || usize::try_from((r.position() + octets.length)?)? != total
            {
                return Ok(None);
            }
            let inner = Header::decode(&mut r)?;
            if inner.tag != Tag::Sequence || (inner.encoded_len()? + inner.length)? != octets.length
            {
                return Ok(None);
            }
        }
        if u8::decode(&mut r)? != 0 {
            return Ok(None);
        }
        Ok(Some((UintRef::decode(&mut r)?, UintRef::decode(&mut r)?)))
    })();
    let (n, e) = match parsed {
        Ok(Some(parts)) => parts,
        Ok(None) => return Step::GiveUp,
        Err(e) if matches!(e.kind(), ErrorKind::Incomplete { .. }) => return Step::NeedMore,
        Err(_) => return Step::GiveUp,
    };
    // The full reading's limits (`rsa_public_of`).
    let odd = |v: &[u8]| v.last().is_some_and(|b| b & 1 == 1);
    let (nb, eb) = (n.as_bytes(), e.as_bytes());
    if !odd(nb) || !odd(eb) || bit_len(eb) < 2 || !(2048..=8192).contains(&bit_len(nb)) {
        return Step::GiveUp;
    }
    match (RsaPublicKeyRef {
        modulus: n,
        exponent: e,
    })
    .to_der()
    {
        Ok(public) => Step::Done(KeyPublic {
            algorithm: KeyAlgorithm::Rsa(nb.len() as u32 * 8),
            public,
        }),
        Err(_) => Step::GiveUp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64ct::{Base64, Encoding as _};
    use rustls_pki_types::PrivateKeyDer;
    use rustls_pki_types::pem::PemObject;

    fn pems() -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for alg in [
            KeyAlgorithm::Rsa(2048),
            KeyAlgorithm::Rsa(3072),
            KeyAlgorithm::Rsa(4096),
            KeyAlgorithm::EcdsaP256,
            KeyAlgorithm::EcdsaP384,
        ] {
            let key = PrivateKey::generate(alg).unwrap();
            let rsa = matches!(alg, KeyAlgorithm::Rsa(_));
            let native = if rsa {
                KeyEncoding::Pkcs1
            } else {
                KeyEncoding::Sec1
            };
            for enc in [native, KeyEncoding::Pkcs8] {
                out.push((key.to_pem(enc).unwrap().0.clone(), rsa));
            }
        }
        out
    }

    /// Keys in the usual shape give the full reading's answer without it (RSA), or through it.
    #[test]
    fn the_public_part_is_the_full_readings() {
        for (pem, rsa) in pems() {
            let full = KeyPublic::of(&PrivateKey::read_pem(pem.as_bytes()).unwrap());
            assert_eq!(KeyPublic::read_pem(pem.as_bytes()).unwrap(), full);
            assert_eq!(
                rsa_public_quickly(pem.as_bytes()).is_some(),
                rsa,
                "{pem:.40}"
            );
            // Text after the END line is not read by either; CRLF lines, text before the key
            // and longer lines go to the full reading.
            let after = format!("{pem}junk\n");
            assert_eq!(KeyPublic::read_pem(after.as_bytes()).unwrap(), full);
            for other in [
                pem.replace('\n', "\r\n"),
                format!("comment\n{pem}"),
                pem.replacen('\n', "", 2).replacen("-----", "-----\n", 2),
            ] {
                assert!(rsa_public_quickly(other.as_bytes()).is_none());
                assert_eq!(
                    KeyPublic::read_pem(other.as_bytes()).ok(),
                    PrivateKey::read_pem(other.as_bytes())
                        .ok()
                        .map(|k| KeyPublic::of(&k))
                );
            }
        }
    }

    /// Every one-byte change, deletion and line break in an RSA key's text: the quick reading
    /// answers only what the full reading answers, except for damage in the private parts
    /// (past the decoded lines) that leaves the text well-formed, which the full reading's
    /// structural decoding refuses and `check_private_parts` refuses where the key is used.
    #[test]
    fn damaged_texts_get_the_full_readings_answer() {
        let key = PrivateKey::generate(KeyAlgorithm::Rsa(2048)).unwrap();
        for enc in [KeyEncoding::Pkcs1, KeyEncoding::Pkcs8] {
            let pem = key.to_pem(enc).unwrap().0.clone().into_bytes();
            // Where the private parts start in the text: the 4-character group holding the
            // first byte after the public exponent (65537, `02 03 01 00 01`).
            let der = PrivateKeyDer::from_pem_slice(&pem).unwrap();
            let der = der.secret_der();
            // The modulus with its leading zero (257 bytes), then the exponent (5 bytes).
            let modulus = &key.public_key_bits()[8..8 + 257];
            let at = der.windows(257).position(|w| w == modulus).unwrap() + 257 + 5;
            let group = at / 3 * 4;
            let private_start = pem.iter().position(|&b| b == b'\n').unwrap()
                + 1
                + group / LINE * (LINE + 1)
                + group % LINE;
            let (mut cases, mut quick_answers) = (0, 0);
            for i in 0..pem.len() {
                let mut variants = Vec::new();
                for b in [b'A', b'=', b'\n', b'-'] {
                    let mut v = pem.clone();
                    v[i] = if v[i] == b { b'B' } else { b };
                    variants.push(v);
                }
                let mut v = pem.clone();
                v.remove(i);
                variants.push(v);
                for v in variants {
                    cases += 1;
                    let full = PrivateKey::read_pem(&v).map(|k| KeyPublic::of(&k));
                    let Some(quick) = rsa_public_quickly(&v) else {
                        continue;
                    };
                    quick_answers += 1;
                    match full {
                        Ok(full) => assert_eq!(quick, full, "{enc:?} byte {i}"),
                        // The private parts' structure, past the public exponent: `renew` reads
                        // the keys it uses in full, so it refuses this key there.
                        Err(PkiError::BadKey { .. }) if i >= private_start => {}
                        Err(e) => {
                            panic!("{enc:?} byte {i}: quick answer where the full reading says {e}")
                        }
                    }
                }
            }
            // Most changes are refused, but a letter for a letter keeps the text well-formed:
            // the quick reading must have answered those, not handed every case over.
            assert!(cases > 5000);
            assert!(
                quick_answers > 1000,
                "{enc:?}: {quick_answers} quick answers"
            );
        }
    }

    /// The alphabet check agrees with the decoder on every byte, at every place in a word
    /// and in the tail.
    #[test]
    fn the_alphabet_is_base64s() {
        for c in 0..=255u8 {
            let group = [c, b'A', b'A', b'A'];
            let valid = c != b'=' && Base64::decode(group, &mut [0u8; 3]).is_ok();
            for at in 0..19 {
                let mut text = *b"Az09+/Zz/9+aBCyxQRs";
                text[at] = c;
                assert_eq!(in_alphabet(&text), valid, "{c:#x} at {at}");
            }
        }
        assert!(
            in_alphabet(b"")
                && in_alphabet(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        );
    }
}
