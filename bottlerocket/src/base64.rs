//! Standard base64 (RFC 4648 §4, with `=` padding), because static-pod manifests and other
//! Bottlerocket settings (`user-data`, `cluster-certificate`, `pki.*.data`) are base64 strings.
//!
//! A few dozen lines of std code instead of a dependency keeps the agent binary small. Decoding
//! accepts input with or without padding and rejects whitespace and the URL-safe alphabet, which
//! is what the API's `ValidBase64` type expects of a client (believed; see bottlerocket-api.md §2.1).

use std::fmt;

/// Encodes `data` as padded standard base64.
pub fn encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let bytes = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let group = u32::from(bytes[0]) << 16 | u32::from(bytes[1]) << 8 | u32::from(bytes[2]);
        for position in 0..4 {
            if position <= chunk.len() {
                let index = (group >> (18 - 6 * position)) & 0x3f;
                out.push(char::from(ALPHABET[index as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64; padding is optional but must be correct when present.
pub fn decode(text: &str) -> Result<Vec<u8>, DecodeError> {
    let trimmed = text.trim_end_matches('=');
    let padding = text.len() - trimmed.len();
    let mut out = Vec::with_capacity(trimmed.len() / 4 * 3 + 2);
    let mut group: u32 = 0;
    let mut bits = 0;
    for (offset, byte) in trimmed.bytes().enumerate() {
        let value = sextet(byte).ok_or(DecodeError::InvalidByte { offset, byte })?;
        group = group << 6 | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            // Truncation is the point: take the next whole byte off the accumulator.
            out.push((group >> bits) as u8);
            group &= (1 << bits) - 1;
        }
    }
    if padding > 2 || (padding > 0 && !text.len().is_multiple_of(4)) || trimmed.len() % 4 == 1 {
        return Err(DecodeError::InvalidLength);
    }
    if group != 0 {
        // Non-zero leftover bits mean the last character was not canonical.
        return Err(DecodeError::InvalidLastSymbol);
    }
    Ok(out)
}

/// Why a base64 string could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A byte outside the standard alphabet.
    InvalidByte {
        /// Offset of the byte in the input.
        offset: usize,
        /// The offending byte.
        byte: u8,
    },
    /// The length (or padding) cannot be valid base64.
    InvalidLength,
    /// The final symbol has bits set that no encoder would produce.
    InvalidLastSymbol,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidByte { offset, byte } => {
                write!(f, "Invalid byte {byte}, offset {offset}")
            }
            Self::InvalidLength => f.write_str("Encoded text cannot have a 6-bit remainder"),
            Self::InvalidLastSymbol => f.write_str("Invalid last symbol"),
        }
    }
}

impl std::error::Error for DecodeError {}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn sextet(byte: u8) -> Option<u8> {
    match byte {
        b'A'..=b'Z' => Some(byte - b'A'),
        b'a'..=b'z' => Some(byte - b'a' + 26),
        b'0'..=b'9' => Some(byte - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &[u8], encoded: &str) {
        assert_eq!(encode(raw), encoded);
        assert_eq!(decode(encoded).as_deref(), Ok(raw));
    }

    #[test]
    fn rfc4648_vectors() {
        check(b"", "");
        check(b"f", "Zg==");
        check(b"fo", "Zm8=");
        check(b"foo", "Zm9v");
        check(b"foob", "Zm9vYg==");
        check(b"fooba", "Zm9vYmE=");
        check(b"foobar", "Zm9vYmFy");
        check(&[0xfb, 0xff, 0xfe], "+//+");
    }

    #[test]
    fn unpadded_input_decodes() {
        assert_eq!(decode("Zm9vYg").as_deref(), Ok(&b"foob"[..]));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(
            decode("Zm9v!"),
            Err(DecodeError::InvalidByte {
                offset: 4,
                byte: b'!'
            })
        );
        assert_eq!(decode("Z"), Err(DecodeError::InvalidLength));
        assert_eq!(
            decode("Zm9=v"),
            Err(DecodeError::InvalidByte {
                offset: 3,
                byte: b'='
            })
        );
        assert_eq!(decode("Zm9vYg="), Err(DecodeError::InvalidLength));
        assert_eq!(decode("Zh=="), Err(DecodeError::InvalidLastSymbol));
        assert_eq!(
            decode("Zm 9v"),
            Err(DecodeError::InvalidByte {
                offset: 2,
                byte: b' '
            })
        );
    }
}
