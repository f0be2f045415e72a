//! Percent-encoding for URL query values, shared by the API client (encoding transaction names and
//! key lists) and the API server emulator (decoding them).
//!
//! Only what a query string needs: RFC 3986 unreserved characters pass through, every other byte
//! becomes `%XX`. Decoding follows `application/x-www-form-urlencoded` as actix's `web::Query`
//! (serde_urlencoded) does, so `+` decodes to a space.

/// Encodes `value` for use as one query parameter value (or name).
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

/// Decodes one form-encoded query component; `None` if a `%` escape is malformed or the result is
/// not UTF-8.
pub(crate) fn decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' => {
                let high = hex_value(*bytes.get(index + 1)?)?;
                let low = hex_value(*bytes.get(index + 2)?)?;
                out.push(high << 4 | low);
                index += 3;
            }
            b'+' => {
                out.push(b' ');
                index += 1;
            }
            other => {
                out.push(other);
                index += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Splits a raw query string into decoded `(name, value)` pairs; `None` if any part is malformed.
pub(crate) fn parse_query(query: &str) -> Option<Vec<(String, String)>> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(name)?, decode(value)?))
        })
        .collect()
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(raw: &str, encoded: &str) {
        assert_eq!(encode(raw), encoded);
        assert_eq!(decode(encoded).as_deref(), Some(raw));
    }

    #[test]
    fn round_trips() {
        check("certrotor-1a2b", "certrotor-1a2b");
        check("a b&c=d", "a%20b%26c%3Dd");
        check("settings.motd,settings.x", "settings.motd%2Csettings.x");
        check(
            "kubernetes.node-labels.\"my.label\"",
            "kubernetes.node-labels.%22my.label%22",
        );
        check("tx/ü", "tx%2F%C3%BC");
    }

    #[test]
    fn decodes_form_encoding() {
        assert_eq!(decode("a+b").as_deref(), Some("a b"));
        assert_eq!(decode("%zz"), None);
        assert_eq!(decode("%4"), None);
        assert_eq!(decode("%FF"), None);
    }

    #[test]
    fn parses_query() {
        let pairs = parse_query("tx=a%20b&keys=x,y&flag").expect("valid query");
        let expected = [("tx", "a b"), ("keys", "x,y"), ("flag", "")];
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(pairs, expected);
        assert_eq!(parse_query("a=%"), None);
    }
}
