//! The private key block of a PEM file, found and decoded as Go finds and decodes it: kube-apiserver
//! and etcd load their pairs with `crypto/tls.X509KeyPair`, which takes the first block of
//! `encoding/pem.Decode` whose type is `PRIVATE KEY` or ends with ` PRIVATE KEY`. What `check`
//! calls a sound key must be one they load (issue 30.4), so a key file is read by Go's rules:
//!
//! - a line ends at LF (a CR before it, spaces and tabs at its end are dropped): a file whose
//!   lines end with CR only is one line, and holds no block;
//! - the BEGIN line is `-----BEGIN <type>-----`; lines holding a `:` right after it are headers;
//!   the END line is `-----END <type>-----` followed by nothing but spaces or tabs on its line;
//! - the body, without spaces, tabs, CRs and LFs, is standard base64 with its padding: exactly
//!   what the last group needs, at the end only (Go's `base64.StdEncoding`);
//! - a block that breaks a rule is skipped, and the search goes on after its BEGIN line.
//!
//! certrotor decodes the body in constant time (`base64ct`), which also refuses non-zero bits
//! in the last group that Go ignores: stricter than Go, never looser. When no block is found,
//! the error says why as far as the text shows it, and never quotes the text.

use super::PkiError;

/// The type (label) of a PEM block and its decoded bytes (scrubbed on drop).
pub struct Block {
    pub label: String,
    pub der: zeroize::Zeroizing<Vec<u8>>,
}

/// Go's `getLine`: the text up to the next LF (a CR before it and trailing spaces and tabs
/// removed), and what follows the LF.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut line, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    if let Some(l) = line.strip_suffix(b"\r") {
        line = l;
    }
    while let Some(l) = line.strip_suffix(b" ").or_else(|| line.strip_suffix(b"\t")) {
        line = l;
    }
    (line, rest)
}

/// The first `needle` in `haystack`; adds the bytes looked at to `work`.
fn find(haystack: &[u8], needle: &[u8], work: &mut usize) -> Option<usize> {
    let found = haystack.windows(needle.len()).position(|w| w == needle);
    *work += found.map_or(haystack.len(), |i| i + needle.len());
    found
}

/// The bytes of a block body as Go's `base64.StdEncoding` decodes them once spaces and tabs are
/// removed (it skips CR and LF itself), or `None` where Go refuses it. A character outside the
/// alphabet ends the look at once, so a body holding the next block's lines costs no more than
/// the text up to them.
fn decode_body(body: &[u8], work: &mut usize) -> Option<zeroize::Zeroizing<Vec<u8>>> {
    // Text of a key: classified without a branch on any byte, 64 at a time; only the block of
    // a first bad byte (in text that is no key) ends the look early.
    for (i, chunk) in body.chunks(64).enumerate() {
        let mut bad = false;
        for &c in chunk {
            let ok = (c.wrapping_sub(b'A') < 26)
                | (c.wrapping_sub(b'a') < 26)
                | (c.wrapping_sub(b'0') < 10)
                | (c == b'+')
                | (c == b'/')
                | (c == b'=')
                | (c == b' ')
                | (c == b'\t')
                | (c == b'\r')
                | (c == b'\n');
            bad |= !ok;
        }
        if bad {
            *work += ((i + 1) * 64).min(body.len());
            return None;
        }
    }
    *work += body.len();
    let compact: zeroize::Zeroizing<Vec<u8>> = zeroize::Zeroizing::new(
        body.iter()
            .copied()
            .filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
            .collect(),
    );
    // Padding: required, at the end only, one or two characters.
    if !compact.len().is_multiple_of(4) {
        return None;
    }
    let pads = compact.iter().rev().take_while(|&&b| b == b'=').count();
    if pads > 2 || compact[..compact.len() - pads].contains(&b'=') {
        return None;
    }
    let mut out = zeroize::Zeroizing::new(vec![0u8; compact.len() / 4 * 3]);
    // base64ct's decoder built at opt-level 3 (`certrotor-hot`): a key's ~1.6 KB of text.
    let n = certrotor_hot::base64_decode(&compact[..], &mut out[..])
        .ok()?
        .len();
    out.truncate(n);
    Some(out)
}

/// Go's `pem.Decode`: the next block in `data` and what follows it. Linear in the text, where
/// Go's own loop is not (it searches for an END line again from every BEGIN line): the next
/// END line found is remembered, since a search from any later point finds the same one.
fn decode<'d>(data: &'d [u8], work: &mut usize) -> Option<(Block, &'d [u8])> {
    const START: &[u8] = b"\n-----BEGIN ";
    const END: &[u8] = b"\n-----END ";
    // Offsets into `data`.
    let mut at = 0;
    // The first END at or after some earlier offset (`None`: not searched yet).
    let mut next_end: Option<Option<usize>> = None;
    loop {
        let rest = &data[at..];
        if rest.starts_with(&START[1..]) {
            at += START.len() - 1;
        } else if let Some(i) = find(rest, START, work) {
            at += i + START.len();
        } else {
            return None;
        }
        let (type_line, after_type) = get_line(&data[at..]);
        at = data.len() - after_type.len();
        let Some(label) = type_line.strip_suffix(b"-----") else {
            continue;
        };
        // Headers: lines holding a ':'.
        let mut headers = false;
        loop {
            if at == data.len() {
                return None;
            }
            let (line, next) = get_line(&data[at..]);
            if !line.contains(&b':') {
                break;
            }
            headers = true;
            at = data.len() - next.len();
        }
        let (end_index, trailer_index) = if !headers && data[at..].starts_with(&END[1..]) {
            (at, at + END.len() - 1)
        } else {
            let end = match next_end {
                Some(Some(e)) if e >= at => Some(e),
                Some(None) => None,
                _ => find(&data[at..], END, work).map(|i| at + i),
            };
            next_end = Some(end);
            match end {
                Some(i) => (i, i + END.len()),
                // No END line after this point: none after any later BEGIN either.
                None => return None,
            }
        };
        let trailer = &data[trailer_index..];
        let trailer_len = label.len() + 5;
        if trailer.len() < trailer_len {
            continue;
        }
        let (end_type, rest_of_end_line) = trailer.split_at(trailer_len);
        if !end_type.starts_with(label) || !end_type.ends_with(b"-----") {
            continue;
        }
        // The END line must end with only spaces or tabs.
        if !get_line(rest_of_end_line).0.is_empty() {
            continue;
        }
        let Some(der) = decode_body(&data[at..end_index], work) else {
            continue;
        };
        let (_, after) = get_line(&data[end_index + END.len() - 1..]);
        let label = String::from_utf8_lossy(label).into_owned();
        return Some((Block { label, der }, after));
    }
}

/// The first private key block of `data`, as `tls.X509KeyPair` picks it: the first block Go
/// decodes whose type is `PRIVATE KEY` or ends with ` PRIVATE KEY`. The error says why none was
/// found, without quoting the text.
pub fn private_key_block(data: &[u8]) -> Result<Block, PkiError> {
    private_key_block_counted(data).0
}

/// [`private_key_block`], with the bytes its searches and body checks examined.
fn private_key_block_counted(data: &[u8]) -> (Result<Block, PkiError>, usize) {
    let mut work = 0;
    let mut rest = data;
    while let Some((block, after)) = decode(rest, &mut work) {
        if block.label == "PRIVATE KEY" || block.label.ends_with(" PRIVATE KEY") {
            return (Ok(block), work);
        }
        rest = after;
    }
    (Err(why_no_block(data)), work)
}

/// Why no private key block could be decoded in `data`, as far as the text shows it.
fn why_no_block(data: &[u8]) -> PkiError {
    let bad = |detail: &str| PkiError::BadPem {
        detail: detail.into(),
    };
    // The BEGIN line of the first private key block the text names.
    let begin = find(data, b"PRIVATE KEY", &mut 0).and_then(|at| {
        let before = &data[..at];
        before
            .windows(11)
            .rposition(|w| w == b"-----BEGIN ")
            .filter(|b| !before[*b..].contains(&b'\n'))
    });
    let Some(begin) = begin else {
        return PkiError::NoPemBlock {
            wanted: "PRIVATE KEY",
        };
    };
    if data.contains(&b'\r') && !data.contains(&b'\n') {
        return bad(
            "its lines end with CR only; Go (kube-apiserver, etcd) reads lines ending with LF or \
             CRLF and finds no key in it: convert the line ends (e.g. with 'tr \"\\r\" \"\\n\"')",
        );
    }
    let (begin_line, _) = get_line(&data[begin..]);
    if !begin_line.ends_with(b"-----") || find(begin_line, b"-----END", &mut 0).is_some() {
        return bad(
            "malformed BEGIN line (was the PEM text pasted on one line?); restore the file with \
             its original line breaks",
        );
    }
    let Some(end) = find(&data[begin..], b"\n-----END ", &mut 0) else {
        return bad(
            "the PEM block is truncated or has lost its line breaks (no END line found after the \
             BEGIN line); restore the file with its original line breaks",
        );
    };
    let end_line = get_line(&data[begin + end + 1..]).0;
    if !end_line.ends_with(b"-----") {
        return bad(
            "text follows the END line on its line; Go (kube-apiserver, etcd) refuses the block: \
             remove it",
        );
    }
    bad(
        "the PEM body is not base64 as Go reads it (a character outside the alphabet, or padding \
         missing, misplaced or in excess); restore the file",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hostile texts that make Go's own loop quadratic (many BEGIN lines, no END line or one far
    /// away, bodies holding the next block's lines) are read in linear work: the bytes the
    /// searches and body checks examine stay within a few times the text's length (a quadratic
    /// reading examines ~50,000 times it here).
    #[test]
    fn many_begin_lines_are_read_in_linear_work() {
        for text in [
            "-----BEGIN A-----\n".repeat(50_000),
            format!("{}-----END B-----\n", "-----BEGIN A-----\n".repeat(50_000)),
            format!("{}-----END A-----\n", "-----BEGIN A-----\n".repeat(50_000)),
            format!(
                "{}-----END A-----\n",
                "-----BEGIN A-----\nk: v\n".repeat(30_000)
            ),
            format!(
                "{}\n",
                "-----BEGIN A-----\nAAAA\n-----END B-----\n".repeat(30_000)
            ),
        ] {
            let (result, work) = private_key_block_counted(text.as_bytes());
            assert!(result.is_err());
            assert!(
                work <= 8 * text.len(),
                "{work} bytes examined for a text of {}",
                text.len()
            );
        }
    }

    fn pem(label: &str, body: &str) -> String {
        format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n")
    }

    #[test]
    fn blocks_are_found_and_refused_as_go_finds_and_refuses_them() {
        // "foobar" and "fo" in base64.
        let ok = |text: &str| private_key_block(text.as_bytes()).map(|b| b.der.to_vec());
        assert_eq!(ok(&pem("RSA PRIVATE KEY", "Zm9vYmFy")).unwrap(), b"foobar");
        assert_eq!(ok(&pem("PRIVATE KEY", "Zm8=")).unwrap(), b"fo");
        // CRLF, spaces inside and after lines, text before and after: read.
        for text in [
            pem("EC PRIVATE KEY", "Zm9v\r\nYmFy").replace('\n', "\r\n"),
            pem("EC PRIVATE KEY", "Zm9v Ym\tFy  "),
            format!("comment\n{}junk\n", pem("EC PRIVATE KEY", "Zm9vYmFy")),
            pem("EC PRIVATE KEY", "Zm9vYmFy").replace(
                "-----END EC PRIVATE KEY-----",
                "-----END EC PRIVATE KEY-----  ",
            ),
            format!(
                "{}{}",
                pem("CERTIFICATE", "Y2VydA=="),
                pem("EC PRIVATE KEY", "Zm9vYmFy")
            ),
        ] {
            assert_eq!(ok(&text).unwrap(), b"foobar", "{text:?}");
        }
        // Refused, as Go refuses them.
        for (text, why) in [
            (
                pem("EC PRIVATE KEY", "Zm9vYmFy").replace('\n', "\r"),
                "CR only",
            ),
            (
                pem("EC PRIVATE KEY", "Zm9vYmFy").replace(
                    "-----END EC PRIVATE KEY-----",
                    "-----END EC PRIVATE KEY-----junk",
                ),
                "follows the END line",
            ),
            (pem("PRIVATE KEY", "Zm8"), "padding"),
            (pem("PRIVATE KEY", "Zm8=="), "padding"),
            (pem("PRIVATE KEY", "Zm8=Zm8="), "padding"),
            (pem("PRIVATE KEY", "Zm9v!mFy"), "alphabet"),
            (
                pem("PRIVATE KEY", "Zm9vYmFy").replace("-----END PRIVATE KEY-----\n", ""),
                "truncated",
            ),
            (pem("CERTIFICATE", "Y2VydA=="), "no PEM block"),
            (
                "-----BEGIN PRIVATE KEY----- Zm9vYmFy -----END PRIVATE KEY-----".into(),
                "one line",
            ),
        ] {
            let e = private_key_block(text.as_bytes())
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains(why)
                    || (why == "no PEM block" && e.contains("no PEM block"))
                    || (why == "one line" && e.contains("pasted on one line")),
                "{text:?}: {e}"
            );
            assert!(!e.contains("Zm9v"), "the error quotes the text: {e}");
        }
    }
}
